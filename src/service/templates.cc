#include "service/templates.h"

#include "service/blocking.h"

namespace agentbox::service {

using session::BuildInfo;
using session::TemplateInfo;
using session::TemplateManager;

Status Templates::check_enabled() const {
  if (!tm_) return fail(Code::kNotSupported, "templates are not enabled on this daemon");
  return {};
}

Status Templates::check(const std::string& name) const {
  AB_TRY(check_enabled());
  return workspace::validate_template_name(name);
}

asio::awaitable<Result<std::pair<TemplateInfo, bool>>> Templates::put(Origin origin,
                                                                      std::string yaml) {
  AB_CO_TRY(check_enabled());
  auto tm = tm_;
  auto job = on_pool(d_.pool, [tm, yaml = std::move(yaml)] { return tm->put(yaml); });
  auto r = co_await std::move(job);
  if (r) {
    d_.bus->emit("template.push", origin, "",
                 Fields{{"template", r->first.tmpl.name},
                        {"version", r->first.tmpl.version},
                        {"created", r->second}});
  }
  co_return r;
}

asio::awaitable<Result<std::vector<TemplateInfo>>> Templates::list(Origin origin) {
  (void)origin;
  AB_CO_TRY(check_enabled());
  auto tm = tm_;
  auto job = on_pool(d_.pool, [tm]() -> Result<std::vector<TemplateInfo>> { return tm->list(); });
  co_return co_await std::move(job);
}

asio::awaitable<Result<TemplateInfo>> Templates::get(Origin origin, std::string name) {
  (void)origin;
  AB_CO_TRY(check(name));
  auto tm = tm_;
  auto job = on_pool(d_.pool, [tm, name] { return tm->get(name); });
  co_return co_await std::move(job);
}

asio::awaitable<Status> Templates::remove(Origin origin, std::string name) {
  AB_CO_TRY(check(name));
  auto tm = tm_;
  auto job = on_pool(d_.pool, [tm, name] { return tm->remove(name); });
  auto r = co_await std::move(job);
  if (r) d_.bus->emit("template.delete", origin, "", Fields{{"template", name}});
  co_return r;
}

asio::awaitable<Result<TemplateInfo>> Templates::rollback(Origin origin, std::string name,
                                                          std::uint64_t version) {
  AB_CO_TRY(check(name));
  auto tm = tm_;
  auto job = on_pool(d_.pool, [tm, name, version] { return tm->rollback(name, version); });
  auto r = co_await std::move(job);
  if (r) {
    d_.bus->emit("template.rollback", origin, "",
                 Fields{{"template", name}, {"snapshot_version", version}});
  }
  co_return r;
}

asio::awaitable<Result<BuildInfo>> Templates::start_build(Origin origin, std::string name) {
  AB_CO_TRY(check(name));
  auto tm = tm_;
  auto job = on_pool(d_.pool, [tm, name] { return tm->start_build(name); });
  auto r = co_await std::move(job);
  if (r) {
    d_.bus->emit("template.build", origin, "", Fields{{"template", name}, {"build_id", r->id}});
  }
  co_return r;
}

asio::awaitable<Result<BuildInfo>> Templates::build(Origin origin, std::string name,
                                                    std::string build_id) {
  (void)origin;
  AB_CO_TRY(check(name));
  auto tm = tm_;
  auto job = on_pool(d_.pool, [tm, name, build_id] { return tm->build(name, build_id); });
  co_return co_await std::move(job);
}

asio::awaitable<Result<BuildInfo>> Templates::wait_build(Origin origin, std::string name,
                                                         std::string build_id) {
  AB_CO_TRY(check(name));
  auto tm = tm_;
  for (;;) {
    auto job = on_pool(d_.pool, [tm, name, build_id] {
      return tm->build_log(name, build_id, SIZE_MAX, std::chrono::milliseconds(500));
    });
    auto chunk = co_await std::move(job);
    if (!chunk) co_return std::unexpected(chunk.error());
    if (chunk->ended) break;
  }
  co_return co_await build(std::move(origin), std::move(name), std::move(build_id));
}

asio::awaitable<Result<TemplateManager::LogChunk>> Templates::build_log(
    Origin origin, std::string name, std::string build_id, std::size_t from,
    std::chrono::milliseconds wait) {
  (void)origin;
  AB_CO_TRY(check(name));
  auto tm = tm_;
  auto job = on_pool(d_.pool, [tm, name, build_id, from, wait] {
    return tm->build_log(name, build_id, from, wait);
  });
  co_return co_await std::move(job);
}

}  // namespace agentbox::service
