// Upgrades (issue 23): this daemon opens a data dir written by an older release and serves its
// sessions. Released state schemas: 1 (sessions; agentbox before managed processes) and 2
// (+ processes, now). The schema-1 data dir is made as that release left it: a session made by
// a daemon, then its state.db put back into the version-1 shape (no processes table, the
// session spec in version 1's JSON: only the keys that release wrote, user_version 1).
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>

#include <set>
#include <string>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

// Rewrites state.db as release 1 (schema 1) would have written it.
void downgrade_to_schema_one(const std::string& db) {
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
  std::vector<std::pair<std::string, std::string>> specs;
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw, "SELECT id, spec FROM sessions", -1, &q, nullptr), SQLITE_OK);
  while (sqlite3_step(q) == SQLITE_ROW) {
    specs.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(q, 0)),
                       reinterpret_cast<const char*>(sqlite3_column_text(q, 1)));
  }
  sqlite3_finalize(q);
  // Version 1's encode_spec: these keys only, and these limits.
  const std::set<std::string> v1_keys{"backend", "template", "mounts",  "skills", "env",
                                      "labels",  "limits",   "network", "ttl_sec"};
  const std::set<std::string> v1_limits{"memory_mb", "cpu_percent", "max_pids", "disk_mb",
                                        "max_open_files"};
  for (auto& [id, text] : specs) {
    json spec = json::parse(text);
    json old = json::object();
    for (auto it = spec.begin(); it != spec.end(); ++it) {
      if (v1_keys.count(it.key())) old[it.key()] = it.value();
    }
    json limits = json::object();
    for (auto it = old["limits"].begin(); it != old["limits"].end(); ++it) {
      if (v1_limits.count(it.key())) limits[it.key()] = it.value();
    }
    old["limits"] = limits;
    old["network"] = {{"mode", spec["network"].value("mode", "none")},
                      {"allow", spec["network"].value("allow", json::array())}};
    sqlite3_stmt* u = nullptr;
    ASSERT_EQ(
        sqlite3_prepare_v2(raw, "UPDATE sessions SET spec = ?1 WHERE id = ?2", -1, &u, nullptr),
        SQLITE_OK);
    const std::string dumped = old.dump();
    sqlite3_bind_text(u, 1, dumped.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(u, 2, id.c_str(), -1, SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(u), SQLITE_DONE);
    sqlite3_finalize(u);
  }
  ASSERT_EQ(
      sqlite3_exec(raw, "DROP TABLE processes; PRAGMA user_version=1;", nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(raw);
}

int user_version(const std::string& db) {
  sqlite3* raw = nullptr;
  if (sqlite3_open(db.c_str(), &raw) != SQLITE_OK) return -1;
  sqlite3_stmt* q = nullptr;
  int v = -1;
  if (sqlite3_prepare_v2(raw, "PRAGMA user_version", -1, &q, nullptr) == SQLITE_OK &&
      sqlite3_step(q) == SQLITE_ROW) {
    v = sqlite3_column_int(q, 0);
  }
  sqlite3_finalize(q);
  sqlite3_close(raw);
  return v;
}

TEST(Upgrade, ASchemaOneDataDirIsServedAndMigrated) {
  TempDir tmp("agentbox-upgrade");
  const std::string data = tmp.path() + "/data";
  json uid;  // null on the host backend
  {
    Daemon d({"--data-dir", data});
    Api api(d);
    auto c = api.post("/v1/sessions", {{"id", "old"},
                                       {"env", {{"GREETING", "hello"}}},
                                       {"labels", {{"team", "a"}}},
                                       {"limits", {{"memory_mb", 300}}},
                                       {"ttl_sec", 600}});
    ASSERT_EQ(c.status, 201) << c;
    uid = c.body["uid"];
    ASSERT_EQ(api.put(files_target("old", "notes.txt"), "written by release 1").status, 200);
    EXPECT_EQ(d.stop(SIGTERM), 0);
  }
  const std::string db = data + "/state.db";
  downgrade_to_schema_one(db);
  if (HasFatalFailure()) return;
  ASSERT_EQ(user_version(db), 1);

  Daemon d({"--data-dir", data});
  Api api(d);
  auto s = api.get("/v1/sessions/old");
  ASSERT_EQ(s.status, 200) << s << "\n" << d.log();
  EXPECT_EQ(s.body["uid"], uid);
  EXPECT_EQ(s.body["labels"]["team"], "a");
  EXPECT_EQ(s.body["limits"]["memory_mb"], 300);
  EXPECT_EQ(s.body["ttl_sec"], 600);
  auto r = api.sh("old", "cat notes.txt; echo; echo $GREETING");
  EXPECT_EQ(r.body["stdout"], "written by release 1\nhello\n") << r;
  // What schema 2 added works on the old session: a managed process is kept in the new table.
  auto p = api.post("/v1/sessions/old/processes",
                    {{"command", "exec sleep 600"}, {"tag", "srv"}, {"restart", "always"}});
  EXPECT_EQ(p.status, 201) << p;
  EXPECT_EQ(user_version(db), 2);
  ASSERT_EQ(api.del("/v1/sessions/old/processes/srv").status, 200);
}

}  // namespace
}  // namespace agentbox::testing
