#include "service/templates.h"

#include "service/blocking.h"
#include "service/template_sync.h"

namespace agentbox::service {

using session::BuildInfo;
using session::TemplateInfo;
using session::TemplateManager;

namespace {

// Cluster mode: this node's copy of template `name` as the cluster sees it (ENOENT when it was
// deleted in the cluster, though a session here keeps the copy).
Result<TemplateInfo> cluster_view(TemplateManager& tm, const TemplateCatalog& tc,
                                  const std::string& name) {
  auto t = tm.get(name);
  if (!t) return t;
  auto v = tc.view(std::move(*t));
  if (!v) return fail(Code::kNotFound, "no such template: " + name);
  return std::move(*v);
}

}  // namespace

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
  TemplateCatalog* tc = d_.templates;
  cluster::Cluster* cl = d_.cluster;
  auto job = on_pool(
      d_.pool, [tm, tc, cl, yaml = std::move(yaml)]() -> Result<std::pair<TemplateInfo, bool>> {
        // In a cluster the push holds on every node or is refused: not stored here alone.
        if (tc != nullptr && !cl->etcd_healthy()) {
          return fail(Code::kUnavailable,
                      "the catalog (etcd) cannot be reached, so a template push would hold on this "
                      "node only: try again when it is back");
        }
        if (tc != nullptr) tc->sync();
        auto r = tm->put(yaml);
        if (!r || tc == nullptr) return r;
        if (auto st = tc->pushed(r->first.tmpl.name, r->first.tmpl.source); !st) {
          return fail(st.error().code, "template " + r->first.tmpl.name +
                                           " is stored on this node but not in the catalog, so "
                                           "other nodes do not see it: " +
                                           st.error().message + " (push it again)");
        }
        if (auto v = tc->view(r->first)) r->first = std::move(*v);
        return r;
      });
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
  TemplateCatalog* tc = d_.templates;
  auto job = on_pool(d_.pool, [tm, tc]() -> Result<std::vector<TemplateInfo>> {
    if (tc == nullptr) return tm->list();
    tc->sync();
    std::vector<TemplateInfo> out;
    for (TemplateInfo& t : tm->list()) {
      if (auto v = tc->view(std::move(t))) out.push_back(std::move(*v));
    }
    return out;
  });
  co_return co_await std::move(job);
}

asio::awaitable<Result<TemplateInfo>> Templates::get(Origin origin, std::string name) {
  (void)origin;
  AB_CO_TRY(check(name));
  auto tm = tm_;
  TemplateCatalog* tc = d_.templates;
  auto job = on_pool(d_.pool, [tm, tc, name]() -> Result<TemplateInfo> {
    if (tc == nullptr) return tm->get(name);
    tc->sync_one(name);
    return cluster_view(*tm, *tc, name);
  });
  co_return co_await std::move(job);
}

asio::awaitable<Status> Templates::remove(Origin origin, std::string name) {
  AB_CO_TRY(check(name));
  auto tm = tm_;
  TemplateCatalog* tc = d_.templates;
  auto job = on_pool(d_.pool, [tm, tc, name]() -> Status {
    if (tc != nullptr) tc->sync_one(name);
    AB_TRY(tm->remove(name));
    // Sessions on other nodes keep their copy until they are gone (TemplateCatalog::sync).
    if (tc != nullptr) return tc->removed(name);
    return {};
  });
  auto r = co_await std::move(job);
  if (r) d_.bus->emit("template.delete", origin, "", Fields{{"template", name}});
  co_return r;
}

asio::awaitable<Result<TemplateInfo>> Templates::rollback(Origin origin, std::string name,
                                                          std::uint64_t version) {
  AB_CO_TRY(check(name));
  auto tm = tm_;
  TemplateCatalog* tc = d_.templates;
  auto job = on_pool(d_.pool, [tm, tc, name, version]() -> Result<TemplateInfo> {
    if (tc == nullptr) return tm->rollback(name, version);
    tc->sync_one(name);
    AB_TRY(tm->get(name));  // ENOENT for a template unknown here as in the catalog
    AB_TRY(tc->rollback(name, version));
    return cluster_view(*tm, *tc, name);
  });
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
  TemplateCatalog* tc = d_.templates;
  auto job = on_pool(d_.pool, [tm, tc, name]() -> Result<BuildInfo> {
    if (tc == nullptr) return tm->start_build(name);
    tc->sync_one(name);
    AB_TRY(tm->get(name));
    // The version number is the cluster's: reserved before the build, so no other node makes
    // another snapshot of that number meanwhile.
    auto as = tc->reserve(name);
    if (!as) return std::unexpected(as.error());
    auto b = tm->start_build(name, *as);
    if (!b) {
      tc->unreserve(name, as->version);
      return b;
    }
    tc->started(name, as->version, b->id);
    return b;
  });
  auto r = co_await std::move(job);
  if (r) {
    d_.bus->emit("template.build", origin, "", Fields{{"template", name}, {"build_id", r->id}});
  }
  co_return r;
}

std::string Templates::build_node(const std::string& build_id) const {
  return d_.templates == nullptr ? std::string() : d_.templates->build_node(build_id);
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
