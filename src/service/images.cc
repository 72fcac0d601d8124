#include "service/images.h"

#include <boost/asio/post.hpp>

#include "common/log.h"
#include "service/blocking.h"
#include "session/template_manager.h"

namespace agentbox::service {

void PullWatch::add(const image::PullProgress& p) {
  {
    std::lock_guard lk(mu_);
    progress_.push_back(p);
  }
  cv_.notify_all();
}

void PullWatch::finish(Result<image::Image> r) {
  {
    std::lock_guard lk(mu_);
    result_ = std::move(r);
  }
  cv_.notify_all();
}

PullWatch::Seen PullWatch::wait(std::size_t from, std::chrono::milliseconds wait) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, wait, [&] { return progress_.size() > from || result_.has_value(); });
  Seen s;
  if (progress_.size() > from) s.progress.assign(progress_.begin() + from, progress_.end());
  s.result = result_;
  return s;
}

namespace {

Fields pull_fields(const std::string& ref, const Result<image::Image>& r) {
  Fields f{{"ref", ref}};
  if (r) {
    f.emplace_back("digest", r->digest);
  } else {
    f.emplace_back("error", std::string(code_name(r.error().code)));
  }
  return f;
}

}  // namespace

Status Images::check_enabled() const {
  if (!store_) return fail(Code::kNotSupported, "images are not enabled on this daemon");
  return {};
}

asio::awaitable<Result<image::Image>> Images::pull(Origin origin, std::string ref) {
  AB_CO_TRY(check_enabled());
  auto store = store_;
  auto job = on_pool(d_.pool, [store, ref] { return store->pull(ref, {}); });
  auto r = co_await std::move(job);
  d_.bus->emit("image.pull", origin, "", pull_fields(ref, r));
  co_return r;
}

Status Images::start_pull(Origin origin, std::string ref, std::shared_ptr<PullWatch> watch) {
  AB_TRY(check_enabled());
  auto store = store_;
  OpBus* bus = d_.bus;
  asio::post(*d_.pool, [store, bus, origin = std::move(origin), ref = std::move(ref), watch] {
    auto r = store->pull(ref, [&](const image::PullProgress& p) { watch->add(p); });
    bus->emit("image.pull", origin, "", pull_fields(ref, r));
    watch->finish(std::move(r));
  });
  return {};
}

asio::awaitable<Result<std::vector<image::Image>>> Images::list(Origin origin) {
  (void)origin;
  AB_CO_TRY(check_enabled());
  auto store = store_;
  auto job =
      on_pool(d_.pool, [store]() -> Result<std::vector<image::Image>> { return store->list(); });
  co_return co_await std::move(job);
}

asio::awaitable<Result<image::Image>> Images::get(Origin origin, std::string ref_or_digest) {
  (void)origin;
  AB_CO_TRY(check_enabled());
  auto store = store_;
  auto job = on_pool(d_.pool, [store, ref_or_digest] { return store->get(ref_or_digest); });
  co_return co_await std::move(job);
}

asio::awaitable<Status> Images::remove(Origin origin, std::string digest) {
  AB_CO_TRY(check_enabled());
  if (!image::is_digest(digest)) {
    co_return fail(Code::kInvalid,
                   "'" + digest + "' is not an image digest (sha256:<64 hex>); delete by digest");
  }
  auto store = store_;
  session::SessionManager* sm = d_.sessions;
  auto job = on_pool(d_.pool, [store, sm, digest]() -> Status {
    AB_TRY(store->get(digest));
    for (const auto& s : sm->list(session::Caller::daemon())) {
      if (s.spec.image_digest == digest) {
        return fail(Code::kExists, "image " + digest + " is used by session " + s.id);
      }
    }
    if (const auto& templates = sm->config().templates) {
      if (std::string t = templates->image_user(digest); !t.empty()) {
        return fail(Code::kExists, "image " + digest + " is used by template " + t);
      }
    }
    return store->remove(digest);
  });
  auto r = co_await std::move(job);
  if (r) d_.bus->emit("image.remove", origin, "", Fields{{"digest", digest}});
  co_return r;
}

}  // namespace agentbox::service
