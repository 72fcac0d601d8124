// The SQLite store on its own: what goes in comes out, durably, and the database refuses what it
// must (a uid held twice, a schema from a newer daemon).

#include "session/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

namespace agentbox::session {
namespace {

namespace fs = std::filesystem;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/store_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string db() const { return dir_ + "/state.db"; }
  std::string dir_;
};

StoredSession sample(std::string id, uid_t uid) {
  StoredSession s;
  s.uid = uid;
  SessionInfo& i = s.info;
  i.id = std::move(id);
  i.tenant = "team-a";
  i.backend = "ns";
  i.spec.backend = "ns";
  i.spec.mounts = {{"/srv/data", "/data", "ro"}};
  i.spec.skills = {{"web", "/srv/skills/web"}};
  i.spec.env = {{"K", "V\xff"}};  // env values may be any bytes but NUL
  i.spec.labels = {{"team", "a"}};
  i.spec.limits.memory_mb = 256;
  i.spec.limits.max_pids = 64;
  i.spec.network.mode = "allowlist";
  i.spec.network.allow = {"example.org"};
  i.spec.ttl_sec = 0;
  i.state = State::kRunning;
  i.workspace = "/workspace";
  i.uid = uid;
  i.created_at = from_unix_ms(1700000000123);
  i.last_used_at = from_unix_ms(1700000000456);
  return s;
}

TEST_F(StoreTest, WhatIsPutIsLoadedBackAfterReopening) {
  {
    auto st = Store::open(db());
    ASSERT_TRUE(st) << st.error().message;
    ASSERT_TRUE((*st)->put(sample("b", 20001)));
    ASSERT_TRUE((*st)->put(sample("a", 20000)));
    StoredSession host = sample("h", 20002);
    host.info.backend = "host";
    host.info.uid.reset();
    host.info.spec.primary = {"/srv/proj", "/workspace", "ro"};  // seed 002's host_path
    ASSERT_TRUE((*st)->put(host));
    ASSERT_TRUE((*st)->touch({{"a", 1800000000000}, {"missing", 1}}));
  }
  auto st = Store::open(db());
  ASSERT_TRUE(st);
  auto rows = (*st)->load();
  ASSERT_TRUE(rows) << rows.error().message;
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].uid, 20000u);
  const SessionInfo& a = (*rows)[0].info;
  EXPECT_EQ(a.id, "a");
  EXPECT_EQ(a.tenant, "team-a");
  EXPECT_EQ(a.uid, 20000u);
  EXPECT_EQ(a.state, State::kRunning);
  EXPECT_EQ(to_unix_ms(a.last_used_at), 1800000000000);
  EXPECT_EQ(to_unix_ms(a.created_at), 1700000000123);
  EXPECT_EQ(a.spec.mounts.size(), 1u);
  EXPECT_EQ(a.spec.mounts[0].mode, "ro");
  EXPECT_EQ(a.spec.skills.at("web"), "/srv/skills/web");
  EXPECT_EQ(a.spec.limits.memory_mb, 256u);
  EXPECT_EQ(a.spec.limits.max_pids, 64u);
  EXPECT_FALSE(a.spec.limits.cpu_percent);
  EXPECT_EQ(a.spec.network.mode, "allowlist");
  EXPECT_EQ(a.spec.network.allow, std::vector<std::string>{"example.org"});
  EXPECT_EQ(a.spec.ttl_sec, 0);
  EXPECT_EQ(a.spec.env.at("K"), "V\xEF\xBF\xBD");  // invalid UTF-8 stored replaced, not lost
  EXPECT_EQ((*rows)[1].info.id, "b");
  EXPECT_EQ((*rows)[2].info.id, "h");
  EXPECT_FALSE((*rows)[2].info.uid);
  EXPECT_EQ((*rows)[2].info.spec.primary.host_path, "/srv/proj");
  EXPECT_EQ((*rows)[2].info.spec.primary.mount_path, "/workspace");
  EXPECT_EQ((*rows)[2].info.spec.primary.mode, "ro");
  EXPECT_TRUE(a.spec.primary.host_path.empty());

  ASSERT_TRUE((*st)->erase("b"));
  ASSERT_TRUE((*st)->erase("b"));  // absent is fine
  EXPECT_EQ((*st)->load()->size(), 2u);
}

TEST_F(StoreTest, TheDatabaseIsReadableByTheDaemonOnly) {
  auto st = Store::open(db());
  ASSERT_TRUE(st);
  ASSERT_TRUE((*st)->put(sample("secret-env", 40000)));
  for (const std::string& f : {db(), db() + "-wal"}) {
    struct stat sb;
    ASSERT_EQ(::stat(f.c_str(), &sb), 0) << f;
    EXPECT_EQ(sb.st_mode & 0777, 0600u) << f;
  }
  // A database left world-readable by an older daemon is tightened on open.
  st->reset();
  ASSERT_EQ(::chmod(db().c_str(), 0644), 0);
  ASSERT_TRUE(Store::open(db()));
  struct stat sb;
  ASSERT_EQ(::stat(db().c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
}

TEST_F(StoreTest, AUidIsNeverHeldByTwoSessions) {
  auto st = Store::open(db());
  ASSERT_TRUE(st);
  ASSERT_TRUE((*st)->put(sample("a", 30000)));
  auto clash = (*st)->put(sample("b", 30000));
  ASSERT_FALSE(clash);
  EXPECT_NE(clash.error().message.find("store session b"), std::string::npos)
      << clash.error().message;
  EXPECT_EQ((*st)->load()->size(), 1u);
}

TEST_F(StoreTest, ADatabaseFromANewerDaemonIsRefusedNamingTheVersion) {
  { ASSERT_TRUE(Store::open(db())); }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db().c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "PRAGMA user_version=99;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(raw);
  auto st = Store::open(db());
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("99"), std::string::npos) << st.error().message;
}

sandbox::ProcessSpec managed_spec(std::string key) {
  sandbox::ProcessSpec p;
  p.key = std::move(key);
  p.tag = "mcp";
  p.argv = {"node", "server.js"};
  p.cwd = "/workspace/app";
  p.env = {{"TOKEN", "t\xff"}};
  p.stdin_open = true;
  p.pty = sandbox::PtySize{100, 30};
  p.restart = sandbox::ProcessSpec::Restart::kOnFailure;
  return p;
}

TEST_F(StoreTest, ManagedProcessSpecsComeBackAndGoWithTheirSession) {
  {
    auto st = Store::open(db());
    ASSERT_TRUE(st) << st.error().message;
    ASSERT_TRUE((*st)->put(sample("a", 20000)));
    ASSERT_TRUE((*st)->put(sample("b", 20001)));
    ASSERT_TRUE((*st)->put_process("a", managed_spec("mcp")));
    ASSERT_TRUE((*st)->put_process("a", managed_spec("m2")));
    ASSERT_TRUE((*st)->put_process("b", managed_spec("mcp")));
    ASSERT_TRUE((*st)->erase_process("a", "m2"));
    EXPECT_FALSE((*st)->put_process("nosuch", managed_spec("x")));  // the session must exist
  }
  auto st = Store::open(db());
  ASSERT_TRUE(st);
  auto rows = (*st)->load();
  ASSERT_TRUE(rows) << rows.error().message;
  ASSERT_EQ(rows->size(), 2u);
  ASSERT_EQ((*rows)[0].managed.size(), 1u);
  const sandbox::ProcessSpec& p = (*rows)[0].managed[0];
  EXPECT_EQ(p.key, "mcp");
  EXPECT_EQ(p.tag, "mcp");
  EXPECT_EQ(p.argv, (std::vector<std::string>{"node", "server.js"}));
  EXPECT_EQ(p.cwd, "/workspace/app");
  EXPECT_EQ(p.env.at("TOKEN").substr(0, 1), "t");
  EXPECT_TRUE(p.stdin_open);
  ASSERT_TRUE(p.pty.has_value());
  EXPECT_EQ(p.pty->cols, 100);
  EXPECT_EQ(p.restart, sandbox::ProcessSpec::Restart::kOnFailure);
  // Deleting a session deletes its processes.
  ASSERT_TRUE((*st)->erase("b"));
  ASSERT_TRUE((*st)->put(sample("b", 20001)));
  rows = (*st)->load();
  ASSERT_TRUE(rows);
  EXPECT_TRUE((*rows)[1].managed.empty());
}

TEST_F(StoreTest, ASchemaOneDatabaseGainsTheProcessesTable) {
  // What a daemon before managed processes wrote: the sessions table, user_version 1.
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(db().c_str(), &raw), SQLITE_OK);
    const char* v1 =
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, backend TEXT NOT NULL,"
        " uid INTEGER NOT NULL UNIQUE, spec TEXT NOT NULL, state TEXT NOT NULL,"
        " workspace TEXT NOT NULL, box_uid INTEGER, created_at INTEGER NOT NULL,"
        " last_used_at INTEGER NOT NULL) WITHOUT ROWID;"
        "INSERT INTO sessions VALUES ('old', 'default', 'ns', 20000, '{}', 'suspended',"
        " '/workspace', NULL, 1, 2);"
        "PRAGMA user_version=1;";
    ASSERT_EQ(sqlite3_exec(raw, v1, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(raw);
  }
  auto st = Store::open(db());
  ASSERT_TRUE(st) << st.error().message;
  ASSERT_TRUE((*st)->put_process("old", managed_spec("mcp")));
  auto rows = (*st)->load();
  ASSERT_TRUE(rows) << rows.error().message;
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].info.id, "old");
  EXPECT_EQ((*rows)[0].managed.size(), 1u);
}

TEST_F(StoreTest, AnUnopenableDatabaseNamesThePath) {
  auto st = Store::open(dir_ + "/no/such/dir/state.db");
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find(dir_ + "/no/such/dir/state.db"), std::string::npos);
}

}  // namespace
}  // namespace agentbox::session
