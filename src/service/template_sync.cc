#include "service/template_sync.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/log.h"
#include "service/blocking.h"
#include "service/deps.h"

namespace agentbox::service {
namespace {

using json = nlohmann::json;
using session::BuildInfo;
using session::SnapshotInfo;
using session::TemplateInfo;
using session::TemplateManager;

constexpr char kKind[] = "templates";

json parse_record(const std::string& raw) {
  json j = raw.empty() ? json::object() : json::parse(raw, nullptr, false);
  if (!j.is_object()) j = json::object();
  if (!j.contains("versions") || !j["versions"].is_object()) j["versions"] = json::object();
  return j;
}

// A version's key in "versions" ("3"), 0 when it is not one.
std::uint64_t version_key(const std::string& k) {
  std::uint64_t v = 0;
  for (char c : k) {
    if (c < '0' || c > '9' || v > UINT64_MAX / 10 - 1) return 0;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

// The highest version number the record ever gave (a deleted template's included: a number is
// never given twice under one name, so a node's snapshot of an older template of that name is
// never taken for a newer one's).
std::uint64_t last_version(const json& j) {
  auto it = j.find("last_version");
  std::uint64_t v = it != j.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
  for (const auto& [k, x] : j["versions"].items()) v = std::max(v, version_key(k));
  return v;
}

// A fresh record for a template pushed anew (after a delete): no versions, numbers go on.
json fresh_record(const json& old) {
  json j = parse_record("");
  j["last_version"] = last_version(old);
  return j;
}

bool tombstone(const json& j) {
  return j.value("deleted", false);
}

std::uint64_t current_of(const json& j) {
  auto it = j.find("current");
  return it != j.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
}

// The record's version `v` when it is built, else nullptr.
const json* built_version(const json& j, std::uint64_t v) {
  auto it = j["versions"].find(std::to_string(v));
  if (it == j["versions"].end() || !it->is_object() || it->value("state", "") != "built") {
    return nullptr;
  }
  return &*it;
}

std::int64_t ms_of(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
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

Result<std::string> TemplateCatalog::update(const std::string& name,
                                            const std::function<Status(json&)>& fn) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    auto raw = cl_->read_record(kKind, name);
    if (!raw) return std::unexpected(raw.error());
    json j = parse_record(*raw);
    AB_TRY(fn(j));
    const std::string next = j.dump();
    if (next == *raw) return next;
    auto swapped = cl_->swap_record(kKind, name, *raw, next);
    if (!swapped) return std::unexpected(swapped.error());
    if (*swapped) return next;
  }
  return fail(Code::kUnavailable,
              "the catalog record of template " + name + " kept changing: try again");
}

void TemplateCatalog::enter_local() {
  for (const TemplateInfo& t : tm_->list()) {
    const std::string name = t.tmpl.name;
    auto r = update(name, [&](json& j) -> Status {
      if (j.contains("yaml") || tombstone(j)) return {};  // the catalog's stands
      j["yaml"] = t.tmpl.source;
      j["current"] = t.current;
      for (const SnapshotInfo& s : t.snapshots) {
        j["versions"][std::to_string(s.version)] = {
            {"state", "built"},       {"node", cl_->node()},
            {"build_id", s.build_id}, {"yaml", t.tmpl.source},
            {"snapshot", s.id},       {"bytes", s.bytes},
            {"files", s.files},       {"created_ms", ms_of(s.created_at)}};
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
  json j = parse_record(*raw);
  auto local = tm_->get(name);
  if (tombstone(j)) {
    if (!local) return;
    if (auto st = tm_->remove(name); !st) {
      spdlog::debug("templates: {} deleted in the cluster, kept here for now: {}", name,
                    st.error().message);
    } else {
      spdlog::info("templates: {} deleted in the cluster: removed here", name);
    }
    return;
  }
  const std::string yaml = j.value("yaml", "");
  if (yaml.empty()) return;
  if (!local || local->tmpl.source != yaml) {
    auto put = tm_->put(yaml);
    if (!put) {
      spdlog::warn("templates: {} from the catalog cannot be kept here: {}", name,
                   put.error().message);
      return;
    }
    local = put->first;
  }
  const std::uint64_t cur = current_of(j);
  if (cur != 0 && local->current != cur && has_version(*local, cur)) {
    (void)tm_->rollback(name, cur);
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
  auto r = update(name, [&](json& j) -> Status {
    if (tombstone(j)) j = fresh_record(j);
    j["yaml"] = yaml;
    return {};
  });
  if (!r) return std::unexpected(r.error());
  return {};
}

Status TemplateCatalog::removed(const std::string& name) {
  auto r = update(name, [](json& j) -> Status {
    j = json{{"deleted", true}, {"versions", json::object()}, {"last_version", last_version(j)}};
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
  auto r = update(name, [&](json& j) -> Status {
    if (tombstone(j)) j = fresh_record(j);
    if (!j.contains("yaml") || !j["yaml"].is_string()) j["yaml"] = as.yaml;
    as.yaml = j["yaml"].get<std::string>();
    as.version = std::max(local_max, last_version(j)) + 1;
    j["versions"][std::to_string(as.version)] = {
        {"state", "building"}, {"node", cl_->node()}, {"build_id", ""}, {"yaml", as.yaml}};
    return {};
  });
  if (!r) return std::unexpected(r.error());
  return as;
}

void TemplateCatalog::started(const std::string& name, std::uint64_t version,
                              const std::string& build_id) {
  const json where = {{"node", cl_->node()}, {"template", name}};
  if (auto r = cl_->swap_record("builds", build_id, "", where.dump()); !r) {
    spdlog::warn("templates: build {} not recorded in the catalog: {}", build_id,
                 r.error().message);
  }
  if (version == 0) return;
  auto r = update(name, [&](json& j) -> Status {
    auto it = j["versions"].find(std::to_string(version));
    if (it != j["versions"].end() && it->value("state", "") == "building") {
      (*it)["build_id"] = build_id;
    }
    return {};
  });
  if (!r) spdlog::warn("templates: {} build {}: {}", name, build_id, r.error().message);
}

void TemplateCatalog::unreserve(const std::string& name, std::uint64_t version) {
  auto r = update(name, [&](json& j) -> Status {
    auto it = j["versions"].find(std::to_string(version));
    if (it != j["versions"].end() && it->value("state", "") == "building" &&
        it->value("node", "") == cl_->node()) {
      j["versions"].erase(it);
    }
    return {};
  });
  if (!r)
    spdlog::warn("templates: {} version {} stays reserved: {}", name, version, r.error().message);
}

void TemplateCatalog::on_build_end(const BuildInfo& b, const std::optional<SnapshotInfo>& si) {
  // Only a build that reserved its version (reserve/started) changes the record: one that made
  // a version the record has already (prepare) adds nothing the cluster does not know.
  auto r = update(b.template_name, [&](json& j) -> Status {
    for (auto it = j["versions"].begin(); it != j["versions"].end(); ++it) {
      if (!it->is_object() || it->value("state", "") != "building" ||
          it->value("build_id", "") != b.id) {
        continue;
      }
      if (!si) {
        j["versions"].erase(it);
        return {};
      }
      (*it)["state"] = "built";
      (*it)["snapshot"] = si->id;
      (*it)["bytes"] = si->bytes;
      (*it)["files"] = si->files;
      (*it)["created_ms"] = ms_of(si->created_at);
      j["current"] = si->version;
      return {};
    }
    return {};
  });
  if (!r) {
    spdlog::error("templates: {} build {} ended but the catalog was not told: {}", b.template_name,
                  b.id, r.error().message);
  }
}

Status TemplateCatalog::rollback(const std::string& name, std::uint64_t version) {
  auto r = update(name, [&](json& j) -> Status {
    if (tombstone(j) || !j.contains("yaml")) {
      return fail(Code::kNotFound, "no such template: " + name);
    }
    if (!built_version(j, version)) {
      return fail(Code::kNotFound,
                  "template " + name + " has no snapshot version " + std::to_string(version));
    }
    j["current"] = version;
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
  json j = parse_record(*raw);
  if (tombstone(j)) return std::nullopt;
  std::vector<SnapshotInfo> all;
  for (const auto& [k, x] : j["versions"].items()) {
    if (!x.is_object() || x.value("state", "") != "built") continue;
    const std::uint64_t v = version_key(k);
    if (v == 0) continue;
    bool here = false;
    for (const SnapshotInfo& s : t.snapshots) {
      if (s.version == v) all.push_back(s), here = true;
    }
    if (here) continue;
    SnapshotInfo s;
    s.version = v;
    s.id = x.value("snapshot", "");
    s.bytes = x.value("bytes", std::uint64_t{0});
    s.files = x.value("files", std::uint64_t{0});
    s.build_id = x.value("build_id", "");
    s.created_at =
        std::chrono::system_clock::time_point(std::chrono::milliseconds(x.value("created_ms", 0L)));
    all.push_back(std::move(s));
  }
  std::sort(all.begin(), all.end(),
            [](const SnapshotInfo& a, const SnapshotInfo& c) { return a.version < c.version; });
  t.snapshots = std::move(all);
  t.current = current_of(j);
  return t;
}

std::string TemplateCatalog::build_node(const std::string& build_id) const {
  std::optional<std::string> raw = cl_->record("builds", build_id);
  if (!raw) return "";
  json j = json::parse(*raw, nullptr, false);
  if (!j.is_object()) return "";
  const std::string node = j.value("node", "");
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
  json j = parse_record(*raw);
  if (tombstone(j)) return std::optional<std::string>();
  sync_one(name);
  const std::uint64_t want = parsed->version.value_or(current_of(j));
  if (want == 0) return std::optional<std::string>();
  auto local = tm_->get(name);
  if (!local) return std::optional<std::string>();
  if (has_version(*local, want)) {
    // The record's current is this node's current (a build here may have moved it).
    const std::uint64_t cur = current_of(j);
    if (cur != 0 && local->current != cur && has_version(*local, cur)) {
      AB_TRY(tm_->rollback(name, cur));
    }
    return std::optional<std::string>();
  }
  const json* v = built_version(j, want);
  if (v == nullptr) return std::optional<std::string>();  // "no snapshot version"
  TemplateManager::BuildAs as{want, v->value("yaml", "")};
  auto b = tm_->start_build(name, as);
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
