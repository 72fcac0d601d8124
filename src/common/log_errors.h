#pragma once
// The completion handler of every co_spawn whose result nobody awaits: Asio's `detached` would
// lose the exception the coroutine ends with. `what` names the coroutine in the log line (a
// string literal):
//   asio::co_spawn(ex, pump(c), LogErrors{"proxy pump"});

#include <exception>
#include <string_view>

namespace agentbox {

// Logs "<what> ended by an exception: ..." at error level; nothing for a null one.
void log_exception(std::string_view what, std::exception_ptr e);

struct LogErrors {
  std::string_view what;
  template <typename... Result>
  void operator()(std::exception_ptr e, Result&&...) const {
    log_exception(what, e);
  }
};

}  // namespace agentbox
