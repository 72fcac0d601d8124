#include "session/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/unique_fd.h"

namespace agentbox::session {
namespace {

using json = nlohmann::json;

// Bumped when the table layout changes; open() refuses a database from a newer daemon.
// 1: sessions. 2: + processes (managed process specs); a version 1 database gains the table at
// open (CREATE TABLE IF NOT EXISTS), nothing else changes.
constexpr int kSchemaVersion = 2;

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS sessions (
  id            TEXT PRIMARY KEY,
  tenant        TEXT NOT NULL,
  backend       TEXT NOT NULL,
  uid           INTEGER NOT NULL UNIQUE,
  spec          TEXT NOT NULL,
  state         TEXT NOT NULL,
  workspace     TEXT NOT NULL,
  box_uid       INTEGER,
  created_at    INTEGER NOT NULL,
  last_used_at  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS processes (
  session_id    TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  key           TEXT NOT NULL,
  spec          TEXT NOT NULL,
  PRIMARY KEY (session_id, key)
) WITHOUT ROWID;
)sql";

// Finalizes a statement on every path out of a function.
struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
};

json encode_map(const std::map<std::string, std::string>& m) {
  json j = json::object();
  for (const auto& [k, v] : m) j[k] = v;
  return j;
}

std::map<std::string, std::string> decode_map(const json& j) {
  std::map<std::string, std::string> m;
  if (!j.is_object()) return m;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_string()) m[it.key()] = it->get<std::string>();
  }
  return m;
}

template <typename T>
void put_opt(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

template <typename T>
void get_opt(const json& j, const char* key, std::optional<T>& out) {
  auto it = j.find(key);
  if (it != j.end() && it->is_number_unsigned()) out = it->get<T>();
}

void bind_text(sqlite3_stmt* s, int col, std::string_view text) {
  sqlite3_bind_text(s, col, text.data(), static_cast<int>(text.size()), SQLITE_STATIC);
}

std::string text_column(sqlite3_stmt* s, int col) {
  const unsigned char* t = sqlite3_column_text(s, col);
  return t ? std::string(reinterpret_cast<const char*>(t),
                         static_cast<std::size_t>(sqlite3_column_bytes(s, col)))
           : std::string();
}

}  // namespace

std::int64_t to_unix_ms(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

std::chrono::system_clock::time_point from_unix_ms(std::int64_t ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

std::string encode_spec(const SessionSpec& spec) {
  json j;
  j["backend"] = spec.backend;
  j["template"] = spec.template_name;
  if (!spec.snapshot.empty()) {
    j["snapshot"] = spec.snapshot;
    j["template_version"] = spec.template_version;
  }
  if (!spec.runner.empty()) j["runner"] = spec.runner;
  if (!spec.image_digest.empty()) {
    // API.md "Images": the image the root is made of, kept for the session's life.
    j["image"] = {{"ref", spec.image_ref},
                  {"digest", spec.image_digest},
                  {"read_only_rootfs", spec.read_only_rootfs}};
  }
  json mounts = json::array();
  for (const MountSpec& m : spec.mounts) {
    mounts.push_back({{"host_path", m.host_path}, {"mount_path", m.mount_path}, {"mode", m.mode}});
  }
  j["mounts"] = std::move(mounts);
  if (!spec.primary.host_path.empty()) {
    j["primary"] = {{"host_path", spec.primary.host_path},
                    {"mount_path", spec.primary.mount_path},
                    {"mode", spec.primary.mode}};
  }
  j["skills"] = encode_map(spec.skills);
  j["read_only_skills"] = spec.read_only_skills;
  j["env"] = encode_map(spec.env);
  j["labels"] = encode_map(spec.labels);
  json limits = json::object();
  put_opt(limits, "memory_mb", spec.limits.memory_mb);
  put_opt(limits, "cpu_percent", spec.limits.cpu_percent);
  put_opt(limits, "max_pids", spec.limits.max_pids);
  put_opt(limits, "disk_mb", spec.limits.disk_mb);
  put_opt(limits, "max_open_files", spec.limits.max_open_files);
  put_opt(limits, "cpu_time_sec", spec.limits.cpu_time_sec);
  put_opt(limits, "tmp_mb", spec.limits.tmp_mb);
  j["limits"] = std::move(limits);
  j["network"] = {{"mode", spec.network.mode}, {"allow", spec.network.allow}};
  if (spec.ttl_sec) j["ttl_sec"] = *spec.ttl_sec;
  // Process output never lands here, but names and env values may be any bytes.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<SessionSpec> decode_spec(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return fail(Code::kInternal, "spec is not a JSON object");
  SessionSpec spec;
  auto str = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  spec.backend = str("backend");
  spec.template_name = str("template");
  spec.snapshot = str("snapshot");
  spec.template_version = j.value("template_version", std::uint64_t{0});
  spec.runner = str("runner");
  if (auto it = j.find("image"); it != j.end() && it->is_object()) {
    spec.image_ref = it->value("ref", "");
    spec.image_digest = it->value("digest", "");
    spec.read_only_rootfs = it->value("read_only_rootfs", true);
  }
  if (auto it = j.find("mounts"); it != j.end() && it->is_array()) {
    for (const json& m : *it) {
      if (!m.is_object()) continue;
      MountSpec ms;
      ms.host_path = m.value("host_path", "");
      ms.mount_path = m.value("mount_path", "");
      ms.mode = m.value("mode", "rw");
      spec.mounts.push_back(std::move(ms));
    }
  }
  if (auto it = j.find("primary"); it != j.end() && it->is_object()) {
    spec.primary.host_path = it->value("host_path", "");
    spec.primary.mount_path = it->value("mount_path", "");
    spec.primary.mode = it->value("mode", "rw");
  }
  if (auto it = j.find("skills"); it != j.end()) spec.skills = decode_map(*it);
  if (auto it = j.find("read_only_skills"); it != j.end() && it->is_array()) {
    for (const json& n : *it) {
      if (n.is_string()) spec.read_only_skills.insert(n.get<std::string>());
    }
  } else {
    // Stored before skills could be rw: they were all read-only, and stay so.
    for (const auto& [name, dir] : spec.skills) spec.read_only_skills.insert(name);
  }
  if (auto it = j.find("env"); it != j.end()) spec.env = decode_map(*it);
  if (auto it = j.find("labels"); it != j.end()) spec.labels = decode_map(*it);
  if (auto it = j.find("limits"); it != j.end() && it->is_object()) {
    get_opt(*it, "memory_mb", spec.limits.memory_mb);
    get_opt(*it, "cpu_percent", spec.limits.cpu_percent);
    get_opt(*it, "max_pids", spec.limits.max_pids);
    get_opt(*it, "disk_mb", spec.limits.disk_mb);
    get_opt(*it, "max_open_files", spec.limits.max_open_files);
    get_opt(*it, "cpu_time_sec", spec.limits.cpu_time_sec);
    get_opt(*it, "tmp_mb", spec.limits.tmp_mb);
  }
  if (auto it = j.find("network"); it != j.end() && it->is_object()) {
    spec.network.mode = it->value("mode", "none");
    if (auto a = it->find("allow"); a != it->end() && a->is_array()) {
      for (const json& s : *a) {
        if (s.is_string()) spec.network.allow.push_back(s.get<std::string>());
      }
    }
  }
  if (auto it = j.find("ttl_sec"); it != j.end() && it->is_number_integer()) {
    spec.ttl_sec = it->get<std::int64_t>();
  }
  return spec;
}

std::string encode_process_spec(const sandbox::ProcessSpec& spec) {
  json j;
  j["key"] = spec.key;
  if (!spec.argv.empty()) {
    j["argv"] = spec.argv;
  } else {
    j["command"] = spec.command;
  }
  j["cwd"] = spec.cwd;
  j["env"] = encode_map(spec.env);
  j["tag"] = spec.tag;
  j["stdin"] = spec.stdin_open;
  if (spec.pty) j["pty"] = {{"cols", spec.pty->cols}, {"rows", spec.pty->rows}};
  j["restart"] = std::string(sandbox::restart_name(spec.restart));
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<sandbox::ProcessSpec> decode_process_spec(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return fail(Code::kInternal, "process spec is not a JSON object");
  }
  sandbox::ProcessSpec spec;
  auto str = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  spec.key = str("key");
  spec.command = str("command");
  if (auto it = j.find("argv"); it != j.end() && it->is_array()) {
    for (const json& a : *it) {
      if (a.is_string()) spec.argv.push_back(a.get<std::string>());
    }
  }
  spec.cwd = str("cwd");
  if (auto it = j.find("env"); it != j.end()) spec.env = decode_map(*it);
  spec.tag = str("tag");
  if (auto it = j.find("stdin"); it != j.end() && it->is_boolean()) {
    spec.stdin_open = it->get<bool>();
  }
  if (auto it = j.find("pty"); it != j.end() && it->is_object()) {
    sandbox::PtySize p;
    p.cols = it->value("cols", std::uint16_t{80});
    p.rows = it->value("rows", std::uint16_t{24});
    spec.pty = p;
  }
  const std::string restart = str("restart");
  if (restart == "on-failure") {
    spec.restart = sandbox::ProcessSpec::Restart::kOnFailure;
  } else if (restart == "always") {
    spec.restart = sandbox::ProcessSpec::Restart::kAlways;
  } else {
    return fail(Code::kInternal, "process spec: restart '" + restart + "' is not managed");
  }
  if (spec.key.empty() || (spec.argv.empty() && spec.command.empty())) {
    return fail(Code::kInternal, "process spec: no key or no command");
  }
  return spec;
}

Store::Store(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

Store::~Store() {
  sqlite3_close_v2(db_);
}

Error Store::sql_error_locked(std::string_view what) const {
  return Error::make(Code::kInternal,
                     std::string(what) + " (" + path_ + "): " + sqlite3_errmsg(db_));
}

Status Store::exec_locked(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return fail(Code::kInternal, "sqlite (" + path_ + "): " + msg + " in: " + sql);
  }
  return {};
}

Result<sqlite3_stmt*> Store::prepare_locked(const char* sql) {
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &s, nullptr) != SQLITE_OK) {
    return std::unexpected(sql_error_locked(std::string("prepare: ") + sql));
  }
  return s;
}

namespace {

// The first column of the one row `sql` returns ("" when none).
std::string pragma_text(sqlite3* db, const char* sql, int col = 0) {
  Stmt q;
  if (sqlite3_prepare_v2(db, sql, -1, &q.s, nullptr) != SQLITE_OK) return "";
  return sqlite3_step(q.s) == SQLITE_ROW ? text_column(q.s, col) : "";
}

// Logs what opening recovered from the write-ahead log (`wal_bytes` big) of an unclean stop.
// The frames recovered are moved into the database file now (the WAL is emptied) and the result
// integrity checked: a recovered database is one SQLite vouches for, or the operator is told not.
void report_recovery(sqlite3* db, const std::string& path, std::int64_t wal_bytes) {
  const std::int64_t frames =
      std::atoll(pragma_text(db, "PRAGMA wal_checkpoint(TRUNCATE);", 1).c_str());
  const std::int64_t page_size = std::atoll(pragma_text(db, "PRAGMA page_size;").c_str());
  const std::string integrity = pragma_text(db, "PRAGMA quick_check;");
  // A WAL is a 32-byte header and frames of a 24-byte header plus a page.
  const std::int64_t used = frames > 0 ? 32 + frames * (24 + page_size) : 0;
  spdlog::warn(
      "state: {} was not closed cleanly: recovered {} committed pages from its write-ahead log "
      "({} bytes), {} bytes after the last intact commit discarded; integrity check: {}",
      path, frames, wal_bytes, std::max<std::int64_t>(0, wal_bytes - used), integrity);
}

}  // namespace

Result<std::unique_ptr<Store>> Store::open(const std::string& path) {
  // SECURITY: the specs hold session env values (tokens, keys): 0600, daemon only. SQLite
  // would create it 0644, and gives its -wal and -shm files the database file's mode.
  {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd) return fail_errno(errno, "open state database " + path);
    if (::fchmod(fd.get(), 0600) != 0) return fail_errno(errno, "chmod(" + path + ")");
  }
  // A write-ahead log at open: the last daemon stopped without closing the database (kill -9,
  // a crash, power loss). SQLite replays the frames of every commit whose checksums hold and
  // drops the rest (a torn tail); what that came to is logged below.
  struct stat wal_st;
  const std::int64_t wal_bytes =
      ::stat((path + "-wal").c_str(), &wal_st) == 0 ? static_cast<std::int64_t>(wal_st.st_size)
                                                     : 0;
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);
    return fail(Code::kInternal, "open state database " + path + ": " + msg);
  }
  std::unique_ptr<Store> store(new Store(db, path));
  std::lock_guard lk(store->mu_);
  // WAL: readers never block the writer, and a commit is one append + fsync. synchronous=FULL
  // fsyncs the WAL at every commit, so a state change is durable when put() returns (kill -9
  // and power loss alike).
  for (const char* sql : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;",
                          "PRAGMA foreign_keys=ON;", kSchema}) {
    if (auto st = store->exec_locked(sql); !st) return std::unexpected(st.error());
  }
  sqlite3_busy_timeout(db, 5000);
  // The schema version lives in the database header (user_version).
  Stmt v;
  auto p = store->prepare_locked("PRAGMA user_version;");
  if (!p) return std::unexpected(p.error());
  v.s = *p;
  int version = sqlite3_step(v.s) == SQLITE_ROW ? sqlite3_column_int(v.s, 0) : 0;
  if (version > kSchemaVersion) {
    return fail(Code::kInternal, "state database " + path + " has schema version " +
                                     std::to_string(version) + ", newer than this daemon's " +
                                     std::to_string(kSchemaVersion));
  }
  if (version < kSchemaVersion) {
    std::string sql = "PRAGMA user_version=" + std::to_string(kSchemaVersion) + ";";
    if (auto st = store->exec_locked(sql.c_str()); !st) return std::unexpected(st.error());
  }
  if (wal_bytes > 0) report_recovery(db, path, wal_bytes);
  return store;
}

Result<std::vector<StoredSession>> Store::load() {
  std::lock_guard lk(mu_);
  Stmt q;
  auto p = prepare_locked(
      "SELECT id, tenant, backend, uid, spec, state, workspace, box_uid, created_at, "
      "last_used_at FROM sessions ORDER BY id;");
  if (!p) return std::unexpected(p.error());
  q.s = *p;
  std::vector<StoredSession> out;
  int rc;
  while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
    StoredSession s;
    SessionInfo& i = s.info;
    i.id = text_column(q.s, 0);
    i.tenant = text_column(q.s, 1);
    i.backend = text_column(q.s, 2);
    s.uid = static_cast<uid_t>(sqlite3_column_int64(q.s, 3));
    auto spec = decode_spec(text_column(q.s, 4));
    if (!spec) {
      return fail(Code::kInternal,
                  "state database " + path_ + ": session " + i.id + ": " + spec.error().message);
    }
    i.spec = std::move(*spec);
    i.state = text_column(q.s, 5) == "running" ? State::kRunning : State::kSuspended;
    i.workspace = text_column(q.s, 6);
    if (sqlite3_column_type(q.s, 7) != SQLITE_NULL) {
      i.uid = static_cast<uid_t>(sqlite3_column_int64(q.s, 7));
    }
    i.created_at = from_unix_ms(sqlite3_column_int64(q.s, 8));
    i.last_used_at = from_unix_ms(sqlite3_column_int64(q.s, 9));
    out.push_back(std::move(s));
  }
  if (rc != SQLITE_DONE) return std::unexpected(sql_error_locked("load sessions"));
  Stmt pq;
  auto pp = prepare_locked("SELECT session_id, key, spec FROM processes ORDER BY session_id, key;");
  if (!pp) return std::unexpected(pp.error());
  pq.s = *pp;
  while ((rc = sqlite3_step(pq.s)) == SQLITE_ROW) {
    const std::string id = text_column(pq.s, 0);
    auto spec = decode_process_spec(text_column(pq.s, 2));
    if (!spec) {
      return fail(Code::kInternal, "state database " + path_ + ": session " + id + ": process " +
                                       text_column(pq.s, 1) + ": " + spec.error().message);
    }
    auto it = std::lower_bound(
        out.begin(), out.end(), id,
        [](const StoredSession& s, const std::string& v) { return s.info.id < v; });
    if (it != out.end() && it->info.id == id) it->managed.push_back(std::move(*spec));
  }
  if (rc != SQLITE_DONE) return std::unexpected(sql_error_locked("load processes"));
  return out;
}

Status Store::put_process(const std::string& id, const sandbox::ProcessSpec& spec) {
  const std::string text = encode_process_spec(spec);
  std::lock_guard lk(mu_);
  Stmt q;
  auto p = prepare_locked(
      "INSERT INTO processes (session_id, key, spec) VALUES (?1, ?2, ?3) "
      "ON CONFLICT(session_id, key) DO UPDATE SET spec = excluded.spec;");
  if (!p) return std::unexpected(p.error());
  q.s = *p;
  bind_text(q.s, 1, id);
  bind_text(q.s, 2, spec.key);
  bind_text(q.s, 3, text);
  if (sqlite3_step(q.s) != SQLITE_DONE) {
    return std::unexpected(sql_error_locked("store process " + spec.key + " of session " + id));
  }
  return {};
}

Status Store::erase_process(const std::string& id, const std::string& key) {
  std::lock_guard lk(mu_);
  Stmt q;
  auto p = prepare_locked("DELETE FROM processes WHERE session_id = ?1 AND key = ?2;");
  if (!p) return std::unexpected(p.error());
  q.s = *p;
  bind_text(q.s, 1, id);
  bind_text(q.s, 2, key);
  if (sqlite3_step(q.s) != SQLITE_DONE) {
    return std::unexpected(sql_error_locked("delete process " + key + " of session " + id));
  }
  return {};
}

Status Store::put(const StoredSession& s) {
  const SessionInfo& i = s.info;
  const std::string spec = encode_spec(i.spec);
  std::lock_guard lk(mu_);
  Stmt q;
  auto p = prepare_locked(
      // An upsert on id only: a uid another row holds is a constraint error, never a silent
      // replacement of that row (which INSERT OR REPLACE would do).
      "INSERT INTO sessions (id, tenant, backend, uid, spec, state, workspace, box_uid, "
      "created_at, last_used_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) "
      "ON CONFLICT(id) DO UPDATE SET tenant = excluded.tenant, backend = excluded.backend, "
      "uid = excluded.uid, spec = excluded.spec, state = excluded.state, "
      "workspace = excluded.workspace, box_uid = excluded.box_uid, "
      "created_at = excluded.created_at, last_used_at = excluded.last_used_at;");
  if (!p) return std::unexpected(p.error());
  q.s = *p;
  bind_text(q.s, 1, i.id);
  bind_text(q.s, 2, i.tenant);
  bind_text(q.s, 3, i.backend);
  sqlite3_bind_int64(q.s, 4, s.uid);
  bind_text(q.s, 5, spec);
  bind_text(q.s, 6, state_name(i.state));
  bind_text(q.s, 7, i.workspace);
  if (i.uid) {
    sqlite3_bind_int64(q.s, 8, *i.uid);
  } else {
    sqlite3_bind_null(q.s, 8);
  }
  sqlite3_bind_int64(q.s, 9, to_unix_ms(i.created_at));
  sqlite3_bind_int64(q.s, 10, to_unix_ms(i.last_used_at));
  if (sqlite3_step(q.s) != SQLITE_DONE) {
    return std::unexpected(sql_error_locked("store session " + i.id));
  }
  return {};
}

Status Store::erase(const std::string& id) {
  std::lock_guard lk(mu_);
  Stmt q;
  auto p = prepare_locked("DELETE FROM sessions WHERE id = ?1;");
  if (!p) return std::unexpected(p.error());
  q.s = *p;
  bind_text(q.s, 1, id);
  if (sqlite3_step(q.s) != SQLITE_DONE) {
    return std::unexpected(sql_error_locked("delete session " + id));
  }
  return {};
}

Status Store::touch(const std::vector<std::pair<std::string, std::int64_t>>& used) {
  if (used.empty()) return {};
  std::lock_guard lk(mu_);
  if (auto st = exec_locked("BEGIN IMMEDIATE;"); !st) return st;
  Stmt q;
  auto p = prepare_locked("UPDATE sessions SET last_used_at = ?2 WHERE id = ?1;");
  if (!p) {
    (void)exec_locked("ROLLBACK;");
    return std::unexpected(p.error());
  }
  q.s = *p;
  for (const auto& [id, ms] : used) {
    bind_text(q.s, 1, id);
    sqlite3_bind_int64(q.s, 2, ms);
    if (sqlite3_step(q.s) != SQLITE_DONE) {
      Error e = sql_error_locked("touch session " + id);
      (void)exec_locked("ROLLBACK;");
      return std::unexpected(std::move(e));
    }
    sqlite3_reset(q.s);
  }
  return exec_locked("COMMIT;");
}

}  // namespace agentbox::session
