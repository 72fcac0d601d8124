#pragma once
// The image store's operations (API.md "Images"): pull, list, inspect, remove. The work is
// image/store.h on the worker pool; a removal is refused (EEXIST) while a session uses the image.
// Pull and remove emit "image.pull" / "image.remove".

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "image/store.h"
#include "service/deps.h"
#include "service/origin.h"

namespace agentbox::service {

// A pull in progress, watched by a surface that streams its progress (NDJSON). Thread-safe.
class PullWatch {
 public:
  void add(const image::PullProgress& p);
  void finish(Result<image::Image> r);
  struct Seen {
    std::vector<image::PullProgress> progress;   // past `from`
    std::optional<Result<image::Image>> result;  // set once the pull ended
  };
  // Waits up to `wait` for progress past `from` or the end.
  Seen wait(std::size_t from, std::chrono::milliseconds wait);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<image::PullProgress> progress_;
  std::optional<Result<image::Image>> result_;
};

class Images {
 public:
  // `store` null: images are not enabled (every call is ENOTSUP).
  Images(Deps deps, std::shared_ptr<image::ImageStore> store)
      : d_(deps), store_(std::move(store)) {}

  bool enabled() const { return store_ != nullptr; }
  const std::shared_ptr<image::ImageStore>& store() const { return store_; }

  asio::awaitable<Result<image::Image>> pull(Origin origin, std::string ref);
  // Starts a pull on the pool and returns at once; `watch` gets its progress and its end.
  Status start_pull(Origin origin, std::string ref, std::shared_ptr<PullWatch> watch);
  asio::awaitable<Result<std::vector<image::Image>>> list(Origin origin);
  asio::awaitable<Result<image::Image>> get(Origin origin, std::string ref_or_digest);
  asio::awaitable<Status> remove(Origin origin, std::string digest);

 private:
  Status check_enabled() const;

  Deps d_;
  std::shared_ptr<image::ImageStore> store_;
};

}  // namespace agentbox::service
