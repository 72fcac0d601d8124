#include "session/template_manager.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <filesystem>
#include <future>

#include "common/log.h"
#include "common/text_codec.h"
#include "linux/overlay.h"
#include "linux/quota_disk.h"
#include "linux/state_file.h"
#include "net/policy.h"
#include "sandbox/installers.h"
#include "sandbox/rooted_fs.h"
#include "session/build_disk.h"
#include "session/build_records.h"
#include "session/internal/template_build.h"
#include "session/internal/template_state.h"
#include "workspace/tree.h"

namespace agentbox::session {

namespace asio = boost::asio;
using Clock = std::chrono::system_clock;

namespace {

constexpr std::size_t kMaxLogLines = 20000;
constexpr std::size_t kMaxLineBytes = 4096;
// Finished builds kept (in memory and in data_dir/build_records) per template.
constexpr std::size_t kMaxBuildsKept = 32;

Status mkdir_mode(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
    return fail_errno(errno, "mkdir(" + path + ")");
  }
  if (::chmod(path.c_str(), mode) != 0) return fail_errno(errno, "chmod(" + path + ")");
  return {};
}

// Removes data_dir/<dir>/<name> without following a link in it.
Status remove_under(const std::string& dir, const std::string& name) {
  UniqueFd root(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) {
    if (errno == ENOENT) return {};
    return fail_errno(errno, "open(" + dir + ")");
  }
  sandbox::RootedFs fs(std::move(root), sandbox::RootMode::kBeneath);
  auto st = fs.remove_all(name);
  if (!st && st.error().code != Code::kNotFound) return st;
  return {};
}

}  // namespace

std::string_view build_state_name(BuildState s) {
  switch (s) {
    case BuildState::kRunning: return "running";
    case BuildState::kSucceeded: return "succeeded";
    case BuildState::kFailed: return "failed";
  }
  return "";
}

// The loop every build's box calls run on: one for the manager's life, as the network loop is
// for sessions' execs. An exec's strand wraps the loop it was started on, and the box's control
// thread may still post to it after the call returned (a late exit report, a kill): a loop made
// per call and destroyed on return made such a post a use-after-free (a daemon segfault).
struct TemplateManager::Loop {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::thread thread{[this] { io.run(); }};
  ~Loop() {
    work.reset();
    io.stop();
    if (thread.joinable()) thread.join();
  }
};

TemplateManager::TemplateManager(Config config) : config_(std::move(config)) {}

Result<std::shared_ptr<TemplateManager>> TemplateManager::open(Config config) {
  if (!config.backend) return fail(Code::kInvalid, "templates: no backend for builds");
  std::shared_ptr<TemplateManager> tm(new TemplateManager(std::move(config)));
  tm->loop_ = std::make_unique<Loop>();
  const std::string& d = tm->config_.data_dir;
  for (const char* sub : {"/templates", "/snapshots", "/builds", "/layers", "/build_records"}) {
    AB_TRY(mkdir_mode(d + sub, 0700));
  }
  // A build the daemon did not finish (a crash, kill -9) left its workspace: never a snapshot.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(d + "/builds", ec)) {
    spdlog::warn("templates: removing the unfinished build {}", e.path().filename().string());
    (void)detach_build_disk(e.path().string() + "/ws");  // its capped disk (limits.disk_mb)
    (void)remove_under(d + "/builds", e.path().filename().string());
  }
  AB_TRY(tm->load());
  // The builds of earlier runs answer GET .../builds/{id} (and its log) again.
  for (BuildRecord& r : load_build_records(tm->records_dir())) {
    auto b = std::make_shared<Build>();
    b->info = std::move(r.info);
    b->log = std::move(r.log);
    tm->builds_[b->info.id] = std::move(b);
  }
  std::set<std::string> names;
  for (const auto& [id, b] : tm->builds_) names.insert(b->info.template_name);
  for (const std::string& n : names) tm->prune_builds_locked(n);
  return tm;
}

void TemplateManager::shutdown() {
  // A running build dies with the daemon, as it would on a crash: its box is stopped (the step
  // fails at once, not when its command ends) and its workspace is removed; never a snapshot.
  // Before the network loop stops: the boxes report their commands' ends on it.
  std::vector<std::shared_ptr<sandbox::Sandbox>> boxes;
  std::vector<std::thread> threads;
  {
    std::lock_guard lk(mu_);
    closing_ = true;
    for (const auto& [id, b] : builds_) {
      if (b->box) boxes.push_back(b->box);
    }
    threads.swap(threads_);
  }
  for (const auto& box : boxes) box->shutdown();
  for (std::thread& t : threads) t.join();
}

TemplateManager::~TemplateManager() {
  shutdown();
  loop_.reset();  // after every build: their calls ran on it
}

Status TemplateManager::load() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(config_.data_dir + "/templates", ec)) {
    if (e.path().extension() != ".json") continue;
    std::string text;
    {
      UniqueFd fd(::open(e.path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
      if (!fd) continue;
      char buf[65536];
      for (ssize_t r; (r = ::read(fd.get(), buf, sizeof buf)) > 0;) text.append(buf, r);
    }
    auto t = decode_template_state(text);
    if (!t) {
      spdlog::error("templates: {}: {}", e.path().string(), t.error().message);
      continue;
    }
    std::string name = t->tmpl.name;
    templates_[name] = std::move(*t);
  }
  return {};
}

Status TemplateManager::save_locked(const TemplateInfo& t) {
  return linux::write_state_file(config_.data_dir + "/templates/" + t.tmpl.name + ".json",
                                 encode_template_state(t));
}

Result<std::pair<TemplateInfo, bool>> TemplateManager::put(std::string_view yaml) {
  auto parsed = workspace::parse_template(yaml);
  if (!parsed) return std::unexpected(parsed.error());
  if (config_.backend->isolated()) {
    AB_TRY(workspace::check_host_paths(parsed->tmpl, config_.readonly_dirs));
  }
  AB_TRY(check_image(parsed->tmpl));
  std::lock_guard lk(mu_);
  auto it = templates_.find(parsed->tmpl.name);
  bool is_new = it == templates_.end();
  TemplateInfo t = is_new ? TemplateInfo{} : it->second;
  auto now = Clock::now();
  if (is_new) t.created_at = now;
  t.updated_at = now;
  t.tmpl = std::move(parsed->tmpl);
  t.warnings = std::move(parsed->warnings);
  AB_TRY(save_locked(t));
  templates_[t.tmpl.name] = t;
  return std::pair{std::move(t), is_new};
}

Result<TemplateInfo> TemplateManager::get(const std::string& name) {
  AB_TRY(workspace::validate_template_name(name));
  std::lock_guard lk(mu_);
  auto it = templates_.find(name);
  if (it == templates_.end()) return fail(Code::kNotFound, "no such template: " + name);
  return it->second;
}

std::vector<TemplateInfo> TemplateManager::list() {
  std::lock_guard lk(mu_);
  std::vector<TemplateInfo> out;
  for (const auto& [n, t] : templates_) out.push_back(t);
  return out;
}

std::set<std::string> TemplateManager::in_use() {
  std::lock_guard lk(in_use_mu_);
  return in_use_ ? in_use_() : std::set<std::string>{};
}

Status TemplateManager::remove(const std::string& name) {
  AB_TRY(workspace::validate_template_name(name));
  std::set<std::string> used = in_use();  // before mu_: it takes the session manager's lock
  {
    std::lock_guard lk(mu_);
    auto it = templates_.find(name);
    if (it == templates_.end()) return fail(Code::kNotFound, "no such template: " + name);
    for (const auto& [id, b] : builds_) {
      if (b->info.template_name == name && b->info.state == BuildState::kRunning) {
        return fail(Code::kExists, "template " + name + ": build " + id + " is running");
      }
    }
    for (const SnapshotInfo& s : it->second.snapshots) {
      if (used.count(s.id)) {
        return fail(Code::kExists, "template " + name + ": snapshot version " +
                                       std::to_string(s.version) + " is in use by a session");
      }
    }
    std::string path = config_.data_dir + "/templates/" + name + ".json";
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return fail_errno(errno, "unlink(" + path + ")");
    templates_.erase(it);
  }
  gc(used);
  return {};
}

Result<TemplateInfo> TemplateManager::rollback(const std::string& name, std::uint64_t version) {
  AB_TRY(workspace::validate_template_name(name));
  std::lock_guard lk(mu_);
  auto it = templates_.find(name);
  if (it == templates_.end()) return fail(Code::kNotFound, "no such template: " + name);
  bool found = false;
  for (const SnapshotInfo& s : it->second.snapshots) found = found || s.version == version;
  if (!found) {
    return fail(Code::kNotFound,
                "template " + name + " has no snapshot version " + std::to_string(version));
  }
  TemplateInfo t = it->second;
  t.current = version;
  t.updated_at = Clock::now();
  AB_TRY(save_locked(t));
  it->second = t;
  return t;
}

void TemplateManager::gc(const std::set<std::string>& used) {
  std::set<std::string> keep = used;
  {
    std::lock_guard lk(mu_);
    std::set<std::string> layers;
    for (const auto& [n, t] : templates_) {
      for (const SnapshotInfo& s : t.snapshots) keep.insert(s.id), layers.insert(s.root_layer);
    }
    gc_root_layers(layers);
  }
  std::error_code ec;
  const std::string dir = config_.data_dir + "/snapshots";
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string id = e.path().filename().string();
    if (keep.count(id)) continue;
    spdlog::info("templates: removing unused snapshot {}", id);
    if (auto st = remove_under(dir, id); !st) {
      spdlog::warn("templates: removing snapshot {}: {}", id, st.error().message);
    }
  }
}

void TemplateManager::set_in_use(std::function<std::set<std::string>()> fn) {
  {
    std::lock_guard lk(in_use_mu_);
    in_use_ = std::move(fn);
    if (!in_use_) return;
  }
  gc(in_use());
}

// ---- builds -------------------------------------------------------------------------------

Result<BuildInfo> TemplateManager::start_build(const std::string& name, BuildAs as) {
  AB_TRY(workspace::validate_template_name(name));
  std::optional<workspace::Template> given;
  if (!as.yaml.empty()) {
    auto parsed = workspace::parse_template(as.yaml);
    if (!parsed) return std::unexpected(parsed.error());
    if (parsed->tmpl.name != name) {
      return fail(Code::kInvalid, "a build of template " + name + " from the YAML of template " +
                                      parsed->tmpl.name);
    }
    given = std::move(parsed->tmpl);
  }
  std::lock_guard lk(mu_);
  if (closing_) return fail(Code::kUnavailable, "daemon is shutting down");
  auto it = templates_.find(name);
  if (it == templates_.end()) return fail(Code::kNotFound, "no such template: " + name);
  const workspace::Template& tmpl = given ? *given : it->second.tmpl;
  if (config_.backend->isolated()) {
    AB_TRY(workspace::check_host_paths(tmpl, config_.readonly_dirs));
  }
  AB_TRY(check_image(tmpl));
  for (const auto& [id, b] : builds_) {
    if (b->info.template_name == name && b->info.state == BuildState::kRunning) {
      return fail(Code::kExists, "template " + name + ": build " + id + " is running");
    }
  }
  auto b = std::make_shared<Build>();
  b->info.id = random_hex(8);
  b->info.template_name = name;
  b->info.started_at = Clock::now();
  b->info.step = "start";
  b->as_version = as.version;
  b->info.version = as.version;  // known from the start when the catalog gave it (else 0)
  builds_[b->info.id] = b;
  if (auto st = save_build_record(records_dir(), b->info, {}); !st) {
    builds_.erase(b->info.id);
    return std::unexpected(st.error());
  }
  prune_builds_locked(name);
  threads_.emplace_back([this, b, tmpl] { run_build(b, tmpl); });
  return b->info;
}

Result<BuildInfo> TemplateManager::build(const std::string& name, const std::string& build_id) {
  std::lock_guard lk(mu_);
  auto it = builds_.find(build_id);
  if (it == builds_.end() || it->second->info.template_name != name) {
    return fail(Code::kNotFound, "template " + name + " has no build " + build_id);
  }
  return it->second->info;
}

Result<BuildInfo> TemplateManager::wait_build(const std::string& name,
                                              const std::string& build_id) {
  std::unique_lock lk(mu_);
  auto it = builds_.find(build_id);
  if (it == builds_.end() || it->second->info.template_name != name) {
    return fail(Code::kNotFound, "template " + name + " has no build " + build_id);
  }
  std::shared_ptr<Build> b = it->second;
  cv_.wait(lk, [&] { return b->info.state != BuildState::kRunning; });
  return b->info;
}

Result<TemplateManager::LogChunk> TemplateManager::build_log(const std::string& name,
                                                             const std::string& build_id,
                                                             std::size_t from,
                                                             std::chrono::milliseconds wait) {
  std::unique_lock lk(mu_);
  auto it = builds_.find(build_id);
  if (it == builds_.end() || it->second->info.template_name != name) {
    return fail(Code::kNotFound, "template " + name + " has no build " + build_id);
  }
  std::shared_ptr<Build> b = it->second;
  cv_.wait_for(lk, wait,
               [&] { return b->log.size() > from || b->info.state != BuildState::kRunning; });
  LogChunk out;
  for (std::size_t i = from; i < b->log.size(); ++i) out.lines.push_back(b->log[i]);
  out.ended = b->info.state != BuildState::kRunning;
  return out;
}

namespace {

// Streams a step's output into the build log, a line at a time.
class LogSink : public sandbox::OutputSink {
 public:
  explicit LogSink(std::function<void(int, std::string)> fn) : fn_(std::move(fn)) {}
  asio::awaitable<bool> on_output(sandbox::StreamKind kind, std::string data) override {
    fn_(kind == sandbox::StreamKind::kStdout ? 0 : 1, std::move(data));
    co_return true;
  }

 private:
  std::function<void(int, std::string)> fn_;
};

// Runs a box coroutine on `io` (the manager's loop) and waits for it on this (build) thread.
template <typename T>
Result<T> run_sync(asio::io_context& io, asio::awaitable<Result<T>> aw) {
  std::promise<Result<T>> done;
  std::future<Result<T>> result = done.get_future();
  asio::co_spawn(io, std::move(aw), [&done](std::exception_ptr e, Result<T> r) {
    done.set_value(e ? fail(Code::kInternal, "box call failed") : std::move(r));
  });
  return result.get();
}

// The first line a command printed, or an error.
Result<std::string> first_line(asio::io_context& io, sandbox::Sandbox& box,
                               const std::string& cmd) {
  sandbox::ExecSpec es;
  es.argv = {"/bin/sh", "-c", cmd};
  es.cwd = box.workspace();
  es.timeout = std::chrono::seconds(60);
  auto r = run_sync(io, box.exec(std::move(es), nullptr));
  if (!r) return std::unexpected(r.error());
  if (r->exit_code != 0)
    return fail(Code::kInvalid, "`" + cmd + "` exited " + std::to_string(r->exit_code));
  return r->stdout_data.substr(0, r->stdout_data.find('\n'));
}

// "3.12" asks for 3.12.x: `have` equals `want` or continues it after a dot.
bool version_matches(const std::string& have, const std::string& want) {
  return have == want ||
         (have.rfind(want, 0) == 0 && have.size() > want.size() && have[want.size()] == '.');
}

}  // namespace

void TemplateManager::run_build(std::shared_ptr<Build> b, workspace::Template tmpl) {
  auto log = [&](std::string line) {
    std::lock_guard lk(mu_);
    if (b->log.size() < kMaxLogLines) b->log.push_back(std::move(line));
    cv_.notify_all();
  };
  auto output = [&](int stream, std::string data) {
    std::lock_guard lk(mu_);
    std::string& part = b->partial[stream];
    part += data;
    std::size_t nl;
    while ((nl = part.find('\n')) != std::string::npos || part.size() > kMaxLineBytes) {
      std::size_t cut = nl == std::string::npos ? kMaxLineBytes : nl;
      if (b->log.size() < kMaxLogLines) {
        b->log.push_back((stream ? "stderr: " : "") + part.substr(0, cut));
      }
      part.erase(0, nl == std::string::npos ? cut : cut + 1);
    }
    cv_.notify_all();
  };
  auto flush = [&] {
    for (int s = 0; s < 2; ++s) {
      if (!b->partial[s].empty()) output(s, "\n");
    }
  };
  auto step = [&](const std::string& s) {
    {
      std::lock_guard lk(mu_);
      b->info.step = s;
    }
    log("==> " + s);
  };
  const std::string builds = config_.data_dir + "/builds";
  const std::string dir = builds + "/" + b->info.id;
  const std::string ws = dir + "/ws";
  std::shared_ptr<sandbox::Sandbox> box;
  std::string step_detail;            // why a step that exited non-zero ended
  SnapshotInfo on_image;              // `image:`: its image and root layer, and what the box
  std::vector<std::string> box_made;  // made in the root's upper dir as it started

  auto run = [&]() -> Result<std::pair<SnapshotInfo, int>> {
    step("workspace");
    AB_TRY(mkdir_mode(dir, 0700));
    AB_TRY(mkdir_mode(ws, 0700));
    // An isolated backend builds as the build user (who then owns the snapshot on disk); one
    // that is not runs everything as the daemon, which owns it.
    const uid_t owner = config_.backend->isolated() ? config_.build_uid : ::geteuid();
    if (::chown(ws.c_str(), owner, owner) != 0) {
      return fail_errno(errno, "chown(" + ws + ")");
    }
    if (tmpl.limits.disk_mb) {
      // limits.disk_mb: the build writes into a disk of that size (ENOSPC past it).
      step("disk " + std::to_string(*tmpl.limits.disk_mb) + " MiB");
      AB_TRY(attach_build_disk(ws, *tmpl.limits.disk_mb, owner));
    }
    sandbox::BoxConfig cfg;
    cfg.key = "build-" + b->info.id;
    cfg.workspace_dir = ws;
    cfg.limits = config_.default_limits;
    const workspace::TemplateLimits& tl = tmpl.limits;
    if (tl.memory_mb) cfg.limits.memory_mb = *tl.memory_mb;
    if (tl.cpu_percent) cfg.limits.cpu_percent = static_cast<std::uint32_t>(*tl.cpu_percent);
    if (tl.max_pids) cfg.limits.max_pids = static_cast<std::uint32_t>(*tl.max_pids);
    if (tl.max_open_files)
      cfg.limits.max_open_files = static_cast<std::uint32_t>(*tl.max_open_files);
    if (tl.cpu_time_sec) cfg.limits.cpu_time_sec = static_cast<std::uint32_t>(*tl.cpu_time_sec);
    if (tl.tmp_mb) cfg.limits.tmp_mb = *tl.tmp_mb;
    cfg.limits.disk_mb.reset();
    cfg.env = tmpl.env;
    if (!tmpl.image.empty()) step("image " + tmpl.image);
    AB_TRY(image_build_root(tmpl, dir, owner, &cfg, &on_image));
    cfg.uid = owner;
    cfg.gid = owner;
    // As in sessions: a --shared-dirs prefix at /shared/<prefix>, a readonly_dirs entry as is.
    for (sandbox::BindMount m : config_.shared_dirs) {
      if (m.box_path.empty() || m.box_path.front() != '/') m.box_path = "/shared/" + m.box_path;
      m.read_only = true;
      if (m.what.empty()) m.what = "shared dir " + m.host_path;
      cfg.mounts.push_back(std::move(m));
    }
    // SECURITY: the build has the template's network policy and nothing more.
    if (tmpl.network == "allowlist") {
      auto policy = net::Policy::parse(tmpl.allow);
      if (!policy) return std::unexpected(policy.error());
      cfg.egress_policy = std::make_shared<const net::Policy>(std::move(*policy));
    } else if (tmpl.network == "open") {
      cfg.open_network = true;
    }
    step("box (network " + tmpl.network + ")");
    auto made = config_.backend->create(std::move(cfg));
    if (!made) return std::unexpected(made.error());
    box = std::shared_ptr<sandbox::Sandbox>(std::move(*made));
    box_made = build_root_entries(dir);
    {
      std::lock_guard lk(mu_);
      b->box = box;
      if (closing_) return fail(Code::kUnavailable, "the daemon is shutting down");
    }

    step("files (" + std::to_string(tmpl.files.size()) + ")");
    for (const auto& [path, content] : tmpl.files) {
      sandbox::WriteOptions wo;
      wo.mkdirs = true;
      auto w = box->create_file(box->workspace() + "/" + path, wo);
      if (!w) {
        return fail(w.error().code, "files." + path + ": " + w.error().message);
      }
      AB_TRY((*w)->write(content));
      auto c = (*w)->commit();
      if (!c) return fail(c.error().code, "files." + path + ": " + c.error().message);
      log("wrote " + path + " (" + std::to_string(content.size()) + " bytes)");
    }

    // Seed 004's dependencies, with the installers sessions use (sandbox/installers.h): a
    // venv and pyproject.toml, node_modules and package.json, recorded for repair and rebuilds.
    auto log_result = [&](const sandbox::InstallResult& ir) {
      output(0, ir.stdout_data);
      output(1, ir.stderr_data);
      flush();
    };
    if (tmpl.python.present && !tmpl.python.version.empty()) {
      step("python.version " + tmpl.python.version);
      auto have = first_line(loop_->io, *box,
                             "python3 -c 'import sys; print(\"%d.%d.%d\" % sys.version_info[:3])'");
      if (!have) return fail(Code::kInvalid, "python.version: " + have.error().message);
      if (!version_matches(*have, tmpl.python.version)) {
        return fail(Code::kInvalid, "python.version: " + tmpl.python.version +
                                        " asked for, the box has Python " + *have);
      }
    }
    if (tmpl.python.present && !tmpl.python.dependencies.empty()) {
      step("python.dependencies (" + std::to_string(tmpl.python.dependencies.size()) + ")");
      sandbox::InstallRequest req;
      req.manager = sandbox::PackageManager::kPip;
      req.packages = tmpl.python.dependencies;
      req.python.index_url = tmpl.python.index_url;
      req.python.find_links = tmpl.python.find_links;
      // Under network "none" no index can be reached: only the find_links are looked in.
      req.python.no_index =
          tmpl.network == "none" && req.python.index_url.empty() && !req.python.find_links.empty();
      req.timeout = config_.step_timeout;
      if (auto st = sandbox::validate_install(req); !st) {
        return fail(Code::kInvalid, "python.dependencies: " + st.error().message);
      }
      auto r = run_sync(loop_->io, sandbox::install_packages(*box, std::move(req)));
      if (!r) return fail(r.error().code, "python.dependencies: " + r.error().message);
      log_result(*r);
      if (r->exit_code != 0) {
        return fail(Code::kInvalid, "python.dependencies: " + r->error);
      }
    }
    if (tmpl.nodejs.present && !tmpl.nodejs.version.empty()) {
      step("nodejs.version " + tmpl.nodejs.version);
      auto have = first_line(loop_->io, *box, "node --version");
      if (!have) return fail(Code::kInvalid, "nodejs.version: " + have.error().message);
      std::string v = have->size() > 1 && (*have)[0] == 'v' ? have->substr(1) : *have;
      if (!version_matches(v, tmpl.nodejs.version)) {
        return fail(Code::kInvalid,
                    "nodejs.version: " + tmpl.nodejs.version + " asked for, the box has Node " + v);
      }
    }
    if (tmpl.nodejs.present && !tmpl.nodejs.dependencies.empty()) {
      step("nodejs.dependencies (" + std::to_string(tmpl.nodejs.dependencies.size()) + ")");
      sandbox::InstallRequest req;
      req.manager = sandbox::PackageManager::kNpm;
      for (const auto& [name, spec] : tmpl.nodejs.dependencies) {
        // A local tarball or directory is installed as the path itself.
        req.packages.push_back(spec.empty()          ? name
                               : spec.front() == '/' ? spec
                                                     : name + "@" + spec);
      }
      req.timeout = config_.step_timeout;
      if (auto st = sandbox::validate_install(req); !st) {
        return fail(Code::kInvalid, "nodejs.dependencies: " + st.error().message);
      }
      auto r = run_sync(loop_->io, sandbox::install_packages(*box, std::move(req)));
      if (!r) return fail(r.error().code, "nodejs.dependencies: " + r.error().message);
      log_result(*r);
      if (r->exit_code != 0) {
        return fail(Code::kInvalid, "nodejs.dependencies: " + r->error);
      }
    }

    LogSink sink(output);
    for (std::size_t i = 0; i < tmpl.setup.size(); ++i) {
      std::string name = "setup[" + std::to_string(i) + "]";
      step(name + ": " + tmpl.setup[i]);
      sandbox::ExecSpec es;
      es.argv = {tmpl.shell, "-c", tmpl.setup[i]};
      es.cwd = box->workspace();
      es.timeout = config_.step_timeout;
      es.max_output_bytes = 64u << 20;
      auto r = run_sync(loop_->io, box->exec(std::move(es), &sink));
      flush();
      if (!r) return fail(r.error().code, name + ": " + r.error().message);
      if (r->exit_code != 0) {
        std::string why =
            r->timed_out ? " (timed out)"
            : r->killed_by != sandbox::KilledBy::kNone
                ? " (killed: " + std::string(sandbox::killed_by_name(r->killed_by)) + ")"
                : std::string();
        step_detail = why;
        return std::pair{SnapshotInfo{}, r->exit_code == 0 ? 1 : r->exit_code};
      }
    }
    // Seed 004's marker: the workspace was configured completely.
    AB_TRY(sandbox::write_configured_marker(*box));
    box->shutdown();
    box.reset();

    step("freeze");
    on_image.root_layer = AB_TRY(keep_build_root(dir, box_made, b->info.id));
    std::string frozen = ws;
    if (tmpl.limits.disk_mb) {
      // Off the capped disk, onto the data dir's file system where snapshots live.
      frozen = dir + "/frozen";
      AB_TRY(copy_build_tree(ws, frozen, owner));
      AB_TRY(detach_build_disk(ws));
    }
    UniqueFd wsfd(::open(frozen.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!wsfd) return fail_errno(errno, "open(" + frozen + ")");
    auto stats = workspace::hash_tree(wsfd.get());
    if (!stats) return std::unexpected(stats.error());
    if (::syncfs(wsfd.get()) != 0) return fail_errno(errno, "syncfs(" + frozen + ")");
    std::string target = snapshot_path(stats->hash);
    if (::rename(frozen.c_str(), target.c_str()) != 0) {
      if (errno != EEXIST && errno != ENOTEMPTY) return fail_errno(errno, "rename(" + frozen + ")");
      log("same content as snapshot " + stats->hash + ": reused");
    }
    SnapshotInfo si = on_image;
    si.id = stats->hash;
    si.bytes = stats->bytes;
    si.files = stats->files;
    si.created_at = Clock::now();
    si.build_id = b->info.id;
    si.health = tmpl.health;
    si.env = tmpl.env;
    return std::pair{si, 0};
  };

  auto result = run();
  if (box) box->shutdown();
  box.reset();
  {
    std::lock_guard lk(mu_);
    b->box.reset();
  }
  std::string failed;
  int exit_code = 0;
  SnapshotInfo si;
  if (!result) {
    failed = result.error().message;
    exit_code = -1;
  } else if (result->second != 0) {
    exit_code = result->second;
    std::lock_guard lk(mu_);
    failed = b->info.step + " exited " + std::to_string(exit_code) + step_detail;
  } else {
    si = result->first;
    std::lock_guard lk(mu_);
    auto it = templates_.find(b->info.template_name);
    if (it == templates_.end()) {
      failed = "the template was removed during the build";
    } else {
      TemplateInfo t = it->second;
      std::uint64_t v = 0;
      for (const SnapshotInfo& s : t.snapshots) v = std::max(v, s.version);
      si.version = b->as_version != 0 ? b->as_version : v + 1;
      // A version the catalog gave (cluster mode) replaces one of that number made here before.
      std::erase_if(t.snapshots, [&](const SnapshotInfo& s) { return s.version == si.version; });
      t.snapshots.push_back(si);
      std::sort(t.snapshots.begin(), t.snapshots.end(),
                [](const SnapshotInfo& a, const SnapshotInfo& c) { return a.version < c.version; });
      t.current = si.version;
      t.updated_at = Clock::now();
      if (auto st = save_locked(t); !st) {
        failed = "recording the snapshot: " + st.error().message;
      } else {
        it->second = std::move(t);
      }
    }
  }
  if (tmpl.limits.disk_mb) {
    if (auto st = detach_build_disk(ws); !st) {
      spdlog::warn("template build {}: detaching its disk: {}", b->info.id, st.error().message);
    }
  }
  (void)remove_under(builds, b->info.id);
  // Told before the build shows as ended, so that whoever waited for it (?wait=true) finds what
  // the hook records (the cluster's catalog) done.
  if (on_build_end_) {
    BuildInfo ended;
    {
      std::lock_guard lk(mu_);
      ended = b->info;
    }
    ended.exit_code = exit_code;
    ended.ended_at = Clock::now();
    ended.state = failed.empty() ? BuildState::kSucceeded : BuildState::kFailed;
    if (failed.empty()) ended.snapshot = si.id, ended.version = si.version;
    ended.error = failed;
    on_build_end_(ended, failed.empty() ? std::optional<SnapshotInfo>(si) : std::nullopt);
  }
  {
    std::lock_guard lk(mu_);
    b->info.ended_at = Clock::now();
    b->info.exit_code = exit_code;
    if (failed.empty()) {
      b->info.state = BuildState::kSucceeded;
      b->info.snapshot = si.id;
      b->info.version = si.version;
      b->log.push_back("==> snapshot " + si.id + " version " + std::to_string(si.version) + " (" +
                       std::to_string(si.files) + " files, " + std::to_string(si.bytes) +
                       " bytes)");
    } else {
      b->info.state = BuildState::kFailed;
      b->info.error = failed;
      b->log.push_back("==> failed: " + failed);
    }
    if (auto st = save_build_record(records_dir(), b->info, b->log); !st) {
      spdlog::warn("template {} build {}: keeping its record: {}", b->info.template_name,
                   b->info.id, st.error().message);
    }
    cv_.notify_all();
  }
  spdlog::info("template {} build {}: {}", b->info.template_name, b->info.id,
               failed.empty() ? "snapshot " + si.id : "failed: " + failed);
  if (!failed.empty() && result && result->second == 0 && !si.id.empty()) gc(in_use());
}

void TemplateManager::prune_builds_locked(const std::string& name) {
  std::vector<std::shared_ptr<Build>> done;
  for (const auto& [id, b] : builds_) {
    if (b->info.template_name == name && b->info.state != BuildState::kRunning) done.push_back(b);
  }
  if (done.size() <= kMaxBuildsKept) return;
  std::sort(done.begin(), done.end(),
            [](const auto& a, const auto& b) { return a->info.started_at < b->info.started_at; });
  for (std::size_t i = 0; i + kMaxBuildsKept < done.size(); ++i) {
    remove_build_record(records_dir(), done[i]->info.id);
    builds_.erase(done[i]->info.id);
  }
}

// ---- sessions -----------------------------------------------------------------------------

Result<ResolvedTemplate> TemplateManager::resolve(const std::string& ref) {
  auto r = workspace::parse_template_ref(ref);
  if (!r) return std::unexpected(r.error());
  std::lock_guard lk(mu_);
  auto it = templates_.find(r->name);
  if (it == templates_.end()) return fail(Code::kNotFound, "no such template: " + r->name);
  std::uint64_t want = r->version.value_or(it->second.current);
  if (want == 0) {
    return fail(Code::kExists, "template " + r->name + " has no built snapshot (build it first)");
  }
  for (const SnapshotInfo& s : it->second.snapshots) {
    if (s.version == want) return ResolvedTemplate{s.id, s.version, s.image_ref, s.image_digest};
  }
  return fail(Code::kNotFound,
              "template " + r->name + " has no snapshot version " + std::to_string(want));
}

std::map<std::string, std::string> TemplateManager::session_env(const std::string& ref,
                                                                std::uint64_t version) {
  auto r = workspace::parse_template_ref(ref);
  if (!r) return {};
  std::lock_guard lk(mu_);
  auto it = templates_.find(r->name);
  if (it == templates_.end()) return {};
  for (const SnapshotInfo& s : it->second.snapshots) {
    if (s.version == version) return s.env;
  }
  return it->second.tmpl.env;
}

Status TemplateManager::mount_session(const std::string& id, const std::string& snapshot,
                                      const std::string& workspace_path, uid_t uid, gid_t gid,
                                      std::uint64_t disk_mb) {
  if (linux::is_overlay(workspace_path)) return {};
  const std::string layer = config_.data_dir + "/layers/" + id;
  AB_TRY(mkdir_mode(layer, 0700));
  if (disk_mb) {
    // The layer dir becomes the root of the session's capped disk (mounted again after a
    // daemon restart: attach is idempotent and keeps the image's bytes).
    linux::QuotaDiskSpec disk;
    disk.image_path = layer + ".img";
    disk.mountpoint = layer;
    disk.bytes = disk_mb << 20;
    disk.uid = ::geteuid();
    disk.gid = ::getegid();
    AB_TRY(linux::attach_quota_disk(disk));
    AB_TRY(mkdir_mode(layer, 0700));  // the disk's root
  }
  AB_TRY(mkdir_mode(layer + "/upper", 0700));
  AB_TRY(mkdir_mode(layer + "/work", 0700));
  if (::chown((layer + "/upper").c_str(), uid, gid) != 0) {
    return fail_errno(errno, "chown(" + layer + "/upper)");
  }
  linux::OverlaySpec spec;
  spec.lower = snapshot_path(snapshot);
  spec.upper = layer + "/upper";
  spec.work = layer + "/work";
  spec.target = workspace_path;
  struct stat st {};
  if (::stat(spec.lower.c_str(), &st) != 0) {
    return fail_errno(errno, "snapshot " + snapshot + " of session " + id);
  }
  if (st.st_uid != uid || st.st_gid != gid) {
    spec.lower_idmap = linux::IdMap{st.st_uid, st.st_gid, uid, gid};
  }
  return linux::mount_overlay(spec);
}

Status TemplateManager::unmount_session(const std::string& workspace_path, const std::string& id) {
  AB_TRY(linux::unmount_overlay(workspace_path));
  if (id.empty()) return {};
  return linux::unmount_quota_disk(config_.data_dir + "/layers/" + id);
}

Status TemplateManager::drop_session(const std::string& id, const std::string& workspace_path) {
  AB_TRY(linux::unmount_overlay(workspace_path));
  // A capped layer (limits.disk_mb): unmount it and delete its image first.
  const std::string layer = config_.data_dir + "/layers/" + id;
  if (auto st = linux::detach_quota_disk(layer, layer + ".img");
      !st && st.error().code != Code::kNotFound) {
    return st;
  }
  return remove_under(config_.data_dir + "/layers", id);
}

}  // namespace agentbox::session
