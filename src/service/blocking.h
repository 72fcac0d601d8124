#pragma once
// The pool hop of service/: runs a blocking call on the daemon's worker pool and resumes the
// awaiting coroutine on its own executor (sandbox/blocking.h is the mechanism).

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/thread_pool.hpp>
#include <type_traits>
#include <utility>

#include "sandbox/blocking.h"

namespace agentbox::service {

// fn() must return a Result<T> or Status. A null pool runs it posted on the caller's executor.
template <typename Fn>
boost::asio::awaitable<std::invoke_result_t<Fn&>> on_pool(boost::asio::thread_pool* pool, Fn fn) {
  return sandbox::run_blocking(
      pool ? boost::asio::any_io_executor(pool->get_executor()) : boost::asio::any_io_executor(),
      std::move(fn));
}

}  // namespace agentbox::service
