#pragma once
// Runs a blocking call (file-system syscalls, fsync, SessionManager work) on the worker pool and
// resumes the awaiting coroutine on its own executor with the result. The mechanism is the
// sandbox module's (sandbox/blocking.h), which the backends use for their own blocking steps.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/thread_pool.hpp>
#include <type_traits>
#include <utility>

#include "sandbox/blocking.h"

namespace agentbox::server::detail {

namespace asio = boost::asio;

// fn() must return a Result<T> or Status.
template <typename Fn>
asio::awaitable<std::invoke_result_t<Fn&>> run_blocking(asio::thread_pool* pool, Fn fn) {
  return sandbox::run_blocking(asio::any_io_executor(pool->get_executor()), std::move(fn));
}

}  // namespace agentbox::server::detail
