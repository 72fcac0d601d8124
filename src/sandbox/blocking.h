#pragma once
// Runs a blocking call (a directory walk, fsync, cgroup file I/O) on an executor meant for
// blocking work (the daemon's worker pool) and resumes the awaiting coroutine on its own
// executor with the result, so the network thread never stalls on the file system. Written as a
// plain initiating function (no coroutine lambda: g++ 12 miscompiles those).
//
// Without a pool (an empty executor: unit tests, tools) the call runs on the awaiting
// coroutine's own executor, still asynchronously (posted), so both paths behave alike.
// The call cannot be cancelled once posted; it always completes.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "common/error.h"

namespace agentbox::sandbox {

namespace detail {

template <typename R>
struct BlockingInitiation {
  boost::asio::any_io_executor pool;

  template <typename Handler, typename Fn>
  void operator()(Handler&& handler, Fn fn) const {
    namespace asio = boost::asio;
    auto ex = asio::get_associated_executor(handler);
    auto work = asio::make_work_guard(ex);
    auto job = [h = std::forward<Handler>(handler), fn = std::move(fn), ex,
                work = std::move(work)]() mutable {
      R r = call(fn);
      asio::dispatch(
          ex, [h = std::move(h), r = std::move(r)]() mutable { std::move(h)(std::move(r)); });
    };
    if (pool) {
      asio::post(pool, std::move(job));
    } else {
      asio::post(ex, std::move(job));
    }
  }

  // A throwing call (std::bad_alloc, a library bug) becomes EINTERNAL instead of killing the
  // pool thread.
  template <typename Fn>
  static R call(Fn& fn) {
    try {
      return fn();
    } catch (const std::exception& e) {
      return R(std::unexpected(
          Error::make(Code::kInternal, std::string("internal error: ") + e.what())));
    } catch (...) {
      return R(std::unexpected(Error::make(Code::kInternal, "internal error")));
    }
  }
};

}  // namespace detail

// fn() must return a Result<T> or Status. `pool` may be empty (see above).
template <typename Fn>
boost::asio::awaitable<std::invoke_result_t<Fn&>> run_blocking(boost::asio::any_io_executor pool,
                                                               Fn fn) {
  using R = std::invoke_result_t<Fn&>;
  return boost::asio::async_initiate<const boost::asio::use_awaitable_t<>&, void(R)>(
      detail::BlockingInitiation<R>{std::move(pool)}, boost::asio::use_awaitable, std::move(fn));
}

}  // namespace agentbox::sandbox
