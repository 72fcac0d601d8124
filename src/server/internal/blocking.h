#pragma once
// Runs a blocking call (file-system syscalls, fsync, SessionManager work) on the worker pool and
// resumes the awaiting coroutine on its own executor with the result. Written as a plain
// initiating function (no coroutine lambda: g++ 12 miscompiles those).

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <exception>
#include <type_traits>
#include <utility>

#include "common/error.h"

namespace agentbox::server::detail {

namespace asio = boost::asio;

template <typename R>
struct BlockingInitiation {
  asio::thread_pool* pool;

  template <typename Handler, typename Fn>
  void operator()(Handler&& handler, Fn fn) const {
    auto ex = asio::get_associated_executor(handler);
    auto work = asio::make_work_guard(ex);
    asio::post(*pool, [h = std::forward<Handler>(handler), fn = std::move(fn), ex,
                       work = std::move(work)]() mutable {
      R r = call(fn);
      asio::dispatch(ex, [h = std::move(h), r = std::move(r)]() mutable {
        std::move(h)(std::move(r));
      });
    });
  }

  // A throwing call (std::bad_alloc, a library bug) becomes EINTERNAL instead of killing the
  // pool thread.
  template <typename Fn>
  static R call(Fn& fn) {
    try {
      return fn();
    } catch (const std::exception& e) {
      return R(std::unexpected(Error::make(Code::kInternal, std::string("internal error: ") +
                                                                e.what())));
    } catch (...) {
      return R(std::unexpected(Error::make(Code::kInternal, "internal error")));
    }
  }
};

// fn() must return a Result<T> or Status.
template <typename Fn>
asio::awaitable<std::invoke_result_t<Fn&>> run_blocking(asio::thread_pool* pool, Fn fn) {
  using R = std::invoke_result_t<Fn&>;
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(R)>(
      BlockingInitiation<R>{pool}, asio::use_awaitable, std::move(fn));
}

}  // namespace agentbox::server::detail
