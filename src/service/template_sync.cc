#include "service/template_sync.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>

#include "common/clock.h"
#include "common/log.h"
#include "service/blocking.h"
#include "service/deps.h"
#include "session/store.h"

namespace agentbox::service {
namespace {

using cluster::TemplateRecord;
using cluster::TemplateVersion;
using session::BuildInfo;
using session::SnapshotInfo;
using session::TemplateInfo;
using session::TemplateManager;

constexpr char kKind[] = "templates";

// A fresh record for a template pushed anew after a delete: no versions, and numbers go on from
// the old ones (a node's snapshot of the old template is never taken for the new one's).
TemplateRecord fresh_record(const TemplateRecord& old) {
  TemplateRecord r;
  r.last_version = old.highest();
  return r;
}

bool has_version(const TemplateInfo& t, std::uint64_t v) {
  for (const SnapshotInfo& s : t.snapshots) {
    if (s.version == v) return true;
  }
  return false;
}

Error build_failed(const std::string& name, const BuildInfo& b) {
  return Error::make(Code::kExists, "template " + name + " version " + std::to_string(b.version) +
                                        " could not be built on this node: build " + b.id +
                                        " failed (" + b.error + "); its log: GET /v1/templates/" +
                                        name + "/builds/" + b.id + "/log");
}

}  // namespace

TemplateCatalog::TemplateCatalog(cluster::Cluster* cl, std::shared_ptr<TemplateManager> tm)
    : cl_(cl), tm_(std::move(tm)) {
  tm_->set_on_build_end(
      [this](const BuildInfo& b, const std::optional<SnapshotInfo>& si) { on_build_end(b, si); });
}

Result<TemplateRecord> TemplateCatalog::update(const std::string& name,
                                               const std::function<Status(TemplateRecord&)>& fn) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    auto raw = cl_->read_record(kKind, name);
    if (!raw) return std::unexpected(raw.error());
    TemplateRecord r = cluster::parse_template_record(*raw);
    AB_TRY(fn(r));
    const std::string next = cluster::encode_template_record(r);
    if (next == *raw) return r;
    auto swapped = cl_->swap_record(kKind, name, *raw, next);
    if (!swapped) return std::unexpected(swapped.error());
    if (*swapped) return r;
  }
  return fail(Code::kUnavailable,
              "the catalog record of template " + name + " kept changing: try again");
}

void TemplateCatalog::enter_local() {
  for (const TemplateInfo& t : tm_->list()) {
    const std::string name = t.tmpl.name;
    auto r = update(name, [&](TemplateRecord& rec) -> Status {
      if (rec.stored) return {};  // the catalog's stands (a tombstone too)
      rec.yaml = t.tmpl.source;
      rec.current = t.current;
      for (const SnapshotInfo& s : t.snapshots) {
        rec.versions[s.version] =
            TemplateVersion{true, cl_->node(), s.build_id, t.tmpl.source,
                            s.id, s.bytes,     s.files,    session::to_unix_ms(s.created_at)};
      }
      return {};
    });
    if (!r) {
      spdlog::warn("templates: {} not entered into the catalog yet: {}", name, r.error().message);
      return;
    }
  }
  entered_ = true;
}

void TemplateCatalog::sync_one(const std::string& name) {
  std::optional<std::string> raw = cl_->record(kKind, name);
  if (!raw) return;
  const TemplateRecord rec = cluster::parse_template_record(*raw);
  if (!rec.stored) return;
  auto local = tm_->get(name);
  if (rec.deleted) {
    if (!local) return;
    if (auto st = tm_->remove(name); !st) {
      spdlog::debug("templates: {} deleted in the cluster, kept here for now: {}", name,
                    st.error().message);
    } else {
      spdlog::info("templates: {} deleted in the cluster: removed here", name);
    }
    return;
  }
  if (rec.yaml.empty()) return;
  if (!local || local->tmpl.source != rec.yaml) {
    auto put = tm_->put(rec.yaml);
    if (!put) {
      spdlog::warn("templates: {} from the catalog cannot be kept here: {}", name,
                   put.error().message);
      return;
    }
    local = put->first;
  }
  if (rec.current != 0 && local->current != rec.current && has_version(*local, rec.current)) {
    (void)tm_->rollback(name, rec.current);
  }
}

void TemplateCatalog::sync() {
  {
    std::lock_guard lk(mu_);
    if (!entered_) enter_local();
  }
  for (const auto& [name, raw] : cl_->records(kKind)) sync_one(name);
}

Status TemplateCatalog::pushed(const std::string& name, const std::string& yaml) {
  auto r = update(name, [&](TemplateRecord& rec) -> Status {
    if (rec.deleted) rec = fresh_record(rec);
    rec.yaml = yaml;
    return {};
  });
  if (!r) return std::unexpected(r.error());
  return {};
}

Status TemplateCatalog::removed(const std::string& name) {
  auto r = update(name, [](TemplateRecord& rec) -> Status {
    rec = fresh_record(rec);
    rec.deleted = true;
    return {};
  });
  if (!r) return std::unexpected(r.error());
  return {};
}

Result<TemplateManager::BuildAs> TemplateCatalog::reserve(const std::string& name) {
  TemplateManager::BuildAs as;
  std::uint64_t local_max = 0;
  if (auto t = tm_->get(name)) {
    for (const SnapshotInfo& s : t->snapshots) local_max = std::max(local_max, s.version);
    as.yaml = t->tmpl.source;
  }
  auto r = update(name, [&](TemplateRecord& rec) -> Status {
    if (rec.deleted) rec = fresh_record(rec);
    if (rec.yaml.empty()) rec.yaml = as.yaml;
    as.yaml = rec.yaml;
    as.version = std::max(local_max, rec.highest()) + 1;
    rec.versions[as.version] = TemplateVersion{false, cl_->node(), "", as.yaml};
    return {};
  });
  if (!r) return std::unexpected(r.error());
  return as;
}

void TemplateCatalog::started(const std::string& name, std::uint64_t version,
                              const std::string& build_id) {
  const std::string where = cluster::encode_build_record(cl_->node(), name);
  if (auto r = cl_->swap_record("builds", build_id, "", where); !r) {
    spdlog::warn("templates: build {} not recorded in the catalog: {}", build_id,
                 r.error().message);
  }
  if (version == 0) return;
  auto r = update(name, [&](TemplateRecord& rec) -> Status {
    auto it = rec.versions.find(version);
    if (it != rec.versions.end() && !it->second.built) it->second.build_id = build_id;
    return {};
  });
  if (!r) spdlog::warn("templates: {} build {}: {}", name, build_id, r.error().message);
}

void TemplateCatalog::unreserve(const std::string& name, std::uint64_t version) {
  auto r = update(name, [&](TemplateRecord& rec) -> Status {
    auto it = rec.versions.find(version);
    if (it != rec.versions.end() && !it->second.built && it->second.node == cl_->node()) {
      rec.versions.erase(it);
    }
    return {};
  });
  if (!r) {
    spdlog::warn("templates: {} version {} stays reserved: {}", name, version, r.error().message);
  }
}

void TemplateCatalog::on_build_end(const BuildInfo& b, const std::optional<SnapshotInfo>& si) {
  // Only a build that reserved its version (reserve) changes the record: one that made a version
  // the record has already (prepare) adds nothing the cluster does not know. It is found by its
  // number (BuildInfo::version is the reserved one from the start): a build that ends at once
  // may end before started() has written its id into the record.
  if (b.version == 0) return;
  auto r = update(b.template_name, [&](TemplateRecord& rec) -> Status {
    auto it = rec.versions.find(b.version);
    if (it == rec.versions.end()) return {};
    TemplateVersion& v = it->second;
    if (v.built || v.node != cl_->node() || (!v.build_id.empty() && v.build_id != b.id)) return {};
    if (!si) {
      rec.versions.erase(it);
      return {};
    }
    v.built = true;
    v.build_id = b.id;
    v.snapshot = si->id;
    v.bytes = si->bytes;
    v.files = si->files;
    v.created_ms = session::to_unix_ms(si->created_at);
    rec.current = b.version;
    return {};
  });
  if (!r) {
    spdlog::error("templates: {} build {} ended but the catalog was not told: {}", b.template_name,
                  b.id, r.error().message);
  }
}

Status TemplateCatalog::rollback(const std::string& name, std::uint64_t version) {
  auto r = update(name, [&](TemplateRecord& rec) -> Status {
    if (!rec.stored || rec.deleted || rec.yaml.empty()) {
      return fail(Code::kNotFound, "no such template: " + name);
    }
    if (!rec.built(version)) {
      return fail(Code::kNotFound,
                  "template " + name + " has no snapshot version " + std::to_string(version));
    }
    rec.current = version;
    return {};
  });
  if (!r) return std::unexpected(r.error());
  if (auto t = tm_->get(name); t && has_version(*t, version)) {
    AB_TRY(tm_->rollback(name, version));
  }
  return {};
}

std::optional<TemplateInfo> TemplateCatalog::view(TemplateInfo t) const {
  std::optional<std::string> raw = cl_->record(kKind, t.tmpl.name);
  if (!raw) return t;
  const TemplateRecord rec = cluster::parse_template_record(*raw);
  if (!rec.stored) return t;
  if (rec.deleted) return std::nullopt;
  std::vector<SnapshotInfo> all;
  for (const auto& [v, x] : rec.versions) {
    if (!x.built) continue;
    bool here = false;
    for (const SnapshotInfo& s : t.snapshots) {
      if (s.version == v) all.push_back(s), here = true;
    }
    if (here) continue;
    SnapshotInfo s;
    s.version = v;
    s.id = x.snapshot;
    s.bytes = x.bytes;
    s.files = x.files;
    s.build_id = x.build_id;
    s.created_at = std::chrono::system_clock::time_point(std::chrono::milliseconds(x.created_ms));
    all.push_back(std::move(s));
  }
  t.snapshots = std::move(all);  // by version (the record's map is ordered)
  t.current = rec.current;
  return t;
}

std::string TemplateCatalog::build_node(const std::string& build_id) const {
  std::optional<std::string> raw = cl_->record("builds", build_id);
  if (!raw) return "";
  const std::string node = cluster::parse_build_node(*raw);
  return node == cl_->node() ? "" : node;
}

Result<std::optional<std::string>> TemplateCatalog::prepare(const std::string& ref) {
  auto parsed = workspace::parse_template_ref(ref);
  if (!parsed) return std::optional<std::string>();  // the session manager says what is wrong
  const std::string name = parsed->name;
  std::optional<std::string> raw = cl_->record(kKind, name);
  if (!raw) {
    // Pushed on another node a moment ago (the watch has not told us yet)?
    auto read = cl_->read_record(kKind, name);
    if (read && !read->empty()) raw = *read;
  }
  if (!raw) return std::optional<std::string>();
  const TemplateRecord rec = cluster::parse_template_record(*raw);
  if (!rec.stored || rec.deleted) return std::optional<std::string>();
  sync_one(name);
  const std::uint64_t want = parsed->version.value_or(rec.current);
  if (want == 0) return std::optional<std::string>();
  auto local = tm_->get(name);
  if (!local) return std::optional<std::string>();
  if (has_version(*local, want)) {
    // The record's current is this node's current (a build here may have moved it).
    if (rec.current != 0 && local->current != rec.current && has_version(*local, rec.current)) {
      AB_TRY(tm_->rollback(name, rec.current));
    }
    return std::optional<std::string>();
  }
  const TemplateVersion* v = rec.built(want);
  if (v == nullptr) return std::optional<std::string>();  // "no snapshot version"
  auto b = tm_->start_build(name, TemplateManager::BuildAs{want, v->yaml});
  if (!b) {
    if (b.error().code == Code::kExists) return std::optional<std::string>(std::string());
    return std::unexpected(b.error());
  }
  spdlog::info("templates: {} version {} is not built on this node: building it (build {})", name,
               want, b->id);
  started(name, 0, b->id);
  return std::optional<std::string>(b->id);
}

Result<std::optional<BuildInfo>> TemplateCatalog::build_turn(const std::string& name,
                                                             const std::string& build_id) {
  auto chunk = tm_->build_log(name, build_id, SIZE_MAX, std::chrono::milliseconds(500));
  if (!chunk) return std::unexpected(chunk.error());
  if (!chunk->ended) return std::optional<BuildInfo>();
  auto b = tm_->build(name, build_id);
  if (!b) return std::unexpected(b.error());
  return std::optional<BuildInfo>(*b);
}

asio::awaitable<Status> template_ready(Deps d, std::string ref) {
  TemplateCatalog* tc = d.templates;
  if (tc == nullptr || ref.empty()) co_return Status{};
  auto parsed = workspace::parse_template_ref(ref);
  if (!parsed) co_return Status{};
  const std::string name = parsed->name;
  // A template's build may take minutes: the session waits, in turns that hold no pool thread.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::hours(1);
  while (std::chrono::steady_clock::now() < give_up) {
    auto job = on_pool(d.pool, [tc, ref] { return tc->prepare(ref); });
    auto need = co_await std::move(job);
    if (!need) co_return std::unexpected(need.error());
    if (!*need) co_return Status{};
    const std::string build_id = **need;
    if (build_id.empty()) {  // another build of it runs here: ask again in a moment
      asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(500));
      co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      continue;
    }
    for (;;) {
      auto turn = on_pool(d.pool, [tc, name, build_id] { return tc->build_turn(name, build_id); });
      auto ended = co_await std::move(turn);
      if (!ended) co_return std::unexpected(ended.error());
      if (!*ended) continue;
      if ((*ended)->state != session::BuildState::kSucceeded) {
        co_return std::unexpected(build_failed(name, **ended));
      }
      break;
    }
  }
  co_return fail(Code::kTimedOut, "template " + ref + " was not ready on this node within an hour");
}

}  // namespace agentbox::service
