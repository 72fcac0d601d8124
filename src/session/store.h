#pragma once
// Durable session state (shared/DESIGN.md "Sessions": "State lives in SQLite under the data
// dir"): one row a session in data_dir/state.db (and one a managed process of it, whose spec
// brings it back after a suspend or a restart) (WAL, synchronous=FULL), holding its spec,
// state, tenant, uid (the uid allocation: UNIQUE, so two sessions can never share one) and
// times. Every put/erase is one transaction that is on disk when it returns; last-used times
// come in batches (touch) so an exec never waits for a disk write.
//
// Thread-safe: one connection behind a mutex. The spec is stored as a JSON document of this
// module's own making (a storage format, not the wire; parsed only from our own file).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "session/session_manager.h"

struct sqlite3;
struct sqlite3_stmt;

namespace agentbox::session {

// A session's row: what the API shows of it (times kept to the millisecond), and the uid
// allocated to it (info.uid is the uid commands run as, none on the host backend).
struct StoredSession {
  SessionInfo info;
  uid_t uid = 0;
  // Its managed processes (API.md "Processes and terminals"), by ProcessSpec::key.
  std::vector<sandbox::ProcessSpec> managed;
};

// The database's time unit: milliseconds since the Unix epoch.
std::int64_t to_unix_ms(std::chrono::system_clock::time_point t);
std::chrono::system_clock::time_point from_unix_ms(std::int64_t ms);

class Store {
 public:
  // Opens (creating if missing) the database at `path`. Errors name the step and the file.
  static Result<std::unique_ptr<Store>> open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Every stored session, sorted by id. A row that cannot be decoded is an error naming it.
  Result<std::vector<StoredSession>> load();
  // Inserts or updates the row of s.id, durably; a uid held by another row is an error.
  Status put(const StoredSession& s);
  // Deletes the row of `id` (absent is fine), durably.
  Status erase(const std::string& id);
  // Stores (inserts or replaces) the spec of a managed process of session `id` under spec.key,
  // durably; the session's row must exist. Rows go with their session's (erase).
  Status put_process(const std::string& id, const sandbox::ProcessSpec& spec);
  // Deletes one (absent is fine), durably.
  Status erase_process(const std::string& id, const std::string& key);
  // Updates last_used_at of existing rows, all in one transaction.
  Status touch(const std::vector<std::pair<std::string, std::int64_t>>& used);

  const std::string& path() const { return path_; }

 private:
  Store(sqlite3* db, std::string path);
  Status exec_locked(const char* sql);
  Error sql_error_locked(std::string_view what) const;
  Result<sqlite3_stmt*> prepare_locked(const char* sql);

  sqlite3* db_;
  std::string path_;
  std::mutex mu_;
};

// The stored form of a spec (exposed for tests).
std::string encode_spec(const SessionSpec& spec);
Result<SessionSpec> decode_spec(std::string_view text);
std::string encode_process_spec(const sandbox::ProcessSpec& spec);
Result<sandbox::ProcessSpec> decode_process_spec(std::string_view text);

}  // namespace agentbox::session
