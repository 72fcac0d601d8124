// AuditLog: JSON lines, appended whole from many threads, rotated by size keeping 3 old files.

#include "server/audit.h"

#include "session/session_manager.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace agentbox::server {
namespace {

namespace fs = std::filesystem;

class AuditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/agentbox-audit-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/audit.log";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Every line of `file` parsed; fails the test on a torn line.
  std::vector<nlohmann::json> lines(const std::string& file) {
    std::ifstream f(file);
    std::vector<nlohmann::json> out;
    std::string line;
    while (std::getline(f, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << file << ": " << line;
      out.push_back(std::move(j));
    }
    return out;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(AuditTest, WritesOneObjectPerLineWithTheCommonFields) {
  auto log = AuditLog::open(path_, 1 << 20);
  ASSERT_TRUE(log.has_value()) << log.error().message;
  (*log)->record("exec", "t1", "s1", {{"command", "ls \xff"}, {"exit_code", 0}});
  (*log)->record("session.create", "t2", "s2");
  auto ls = lines(path_);
  ASSERT_EQ(ls.size(), 2u);
  EXPECT_EQ(ls[0]["event"], "exec");
  EXPECT_EQ(ls[0]["tenant"], "t1");
  EXPECT_EQ(ls[0]["session"], "s1");
  EXPECT_EQ(ls[0]["exit_code"], 0);
  EXPECT_EQ(ls[0]["command"], "ls \xEF\xBF\xBD");  // invalid UTF-8 replaced, not dropped
  EXPECT_TRUE(ls[0]["time"].get<std::string>().ends_with("Z"));
  EXPECT_EQ(ls[1]["event"], "session.create");
  struct stat st;
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(AuditTest, AppendsToAnExistingLog) {
  std::ofstream(path_) << "{\"event\":\"old\"}\n";
  {
    auto log = AuditLog::open(path_, 1 << 20);
    ASSERT_TRUE(log.has_value());
    (*log)->record("new", "t", "s");
  }
  auto ls = lines(path_);
  ASSERT_EQ(ls.size(), 2u);
  EXPECT_EQ(ls[0]["event"], "old");
  EXPECT_EQ(ls[1]["event"], "new");
}

TEST_F(AuditTest, RotatesBySizeKeepingThreeOldFiles) {
  auto log = AuditLog::open(path_, 2000);
  ASSERT_TRUE(log.has_value());
  for (int i = 0; i < 200; ++i) {
    (*log)->record("exec", "t", "s", {{"i", i}, {"pad", std::string(50, 'x')}});
  }
  for (const char* suffix : {"", ".1", ".2", ".3"}) {
    SCOPED_TRACE(suffix);
    ASSERT_TRUE(fs::exists(path_ + suffix));
    EXPECT_LE(fs::file_size(path_ + suffix), 2000u + 200u);  // at most one line over
  }
  EXPECT_FALSE(fs::exists(path_ + ".4"));
  // The newest lines are in audit.log, older ones in .1, .2, .3, in order, none torn.
  std::vector<int> seen;
  for (const char* suffix : {".3", ".2", ".1", ""}) {
    for (const auto& l : lines(path_ + suffix)) seen.push_back(l["i"]);
  }
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), 199);
  for (std::size_t k = 1; k < seen.size(); ++k) EXPECT_EQ(seen[k], seen[k - 1] + 1);
}

TEST_F(AuditTest, ConcurrentWritersNeverTearALine) {
  auto log = AuditLog::open(path_, 64 << 20);
  ASSERT_TRUE(log.has_value());
  AuditLog* l = log->get();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([l, t] {
      for (int i = 0; i < 500; ++i) {
        l->record("file.put", "t" + std::to_string(t), "s",
                  {{"path", std::string(300, 'a' + t)}, {"size", i}});
      }
    });
  }
  for (auto& th : threads) th.join();
  auto ls = lines(path_);
  EXPECT_EQ(ls.size(), 2000u);
  for (const auto& j : ls) {
    std::string tenant = j["tenant"];
    EXPECT_EQ(j["path"], std::string(300, 'a' + (tenant[1] - '0')));
  }
}

// Session lifecycle events become the audit lines the API documents: the acting tenant (the
// owner when the daemon acted), "by":"agentboxd" and the reason for the reaper and eviction,
// the archive for restores and archived destroys.
TEST_F(AuditTest, SessionEventsBecomeTheDocumentedLines) {
  using session::EventCause;
  using session::EventKind;
  auto log = AuditLog::open(path_, 1 << 20);
  ASSERT_TRUE(log.has_value()) << log.error().message;
  session::SessionInfo s;
  s.id = "s1";
  s.tenant = "owner";
  auto rec = [&](EventKind k, EventCause c, std::string_view actor, std::string_view detail) {
    record_session_event(**log, session::SessionEvent{k, c, s, actor, detail});
  };
  rec(EventKind::kCreated, EventCause::kApi, "ops", "");
  rec(EventKind::kSuspended, EventCause::kReaper, "", "idle for 5 s (ttl_sec)");
  rec(EventKind::kSuspended, EventCause::kEviction, "", "evicted");
  rec(EventKind::kResumed, EventCause::kApi, "owner", "");
  rec(EventKind::kDestroyed, EventCause::kApi, "owner", "/d/archives/s1.tar.zst");
  rec(EventKind::kCreated, EventCause::kRestore, "owner", "/d/archives/s1.tar.zst");
  rec(EventKind::kDestroyed, EventCause::kReaper, "", "idle");
  auto ls = lines(path_);
  ASSERT_EQ(ls.size(), 8u);
  std::vector<std::string> events;
  for (const auto& l : ls) {
    events.push_back(l["event"]);
    EXPECT_EQ(l["session"], "s1");
  }
  EXPECT_EQ(events, (std::vector<std::string>{"session.create", "session.suspend",
                                              "session.suspend", "session.resume",
                                              "session.archive", "session.destroy",
                                              "session.restore", "session.destroy"}));
  EXPECT_EQ(ls[0]["tenant"], "ops");
  EXPECT_FALSE(ls[0].contains("by"));
  EXPECT_EQ(ls[1]["tenant"], "owner");
  EXPECT_EQ(ls[1]["by"], "agentboxd");
  EXPECT_EQ(ls[1]["reason"], "idle for 5 s (ttl_sec)");
  EXPECT_EQ(ls[2]["by"], "agentboxd");
  EXPECT_EQ(ls[4]["archive"], "/d/archives/s1.tar.zst");
  EXPECT_EQ(ls[5]["archive"], "/d/archives/s1.tar.zst");
  EXPECT_EQ(ls[6]["archive"], "/d/archives/s1.tar.zst");
  EXPECT_EQ(ls[7]["by"], "agentboxd");
  EXPECT_EQ(ls[7]["reason"], "idle");
}

}  // namespace
}  // namespace agentbox::server
