// kill -9 of agentboxd at random points of a restore and of a delete with archive, and a torn
// state.db write-ahead log (issue 26). After each, the next start cleans what was left: no
// half-restored or half-deleted session is ever served, no unfinished archive lies in the
// archives dir, and the daemon says what it recovered from the WAL.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "faults/fault_util.h"

namespace agentbox::testing {
namespace {

constexpr int kFiles = 1500;

// A daemon on `data` (host backend), made again after each kill.
std::unique_ptr<Daemon> start(const std::string& data) {
  return std::make_unique<Daemon>(
      std::vector<std::string>{"--data-dir", data, "--backend", "host"});
}

// kFiles files of random bytes (so the archive is as big as the tree) in session `id`.
void fill(Api& api, const std::string& id) {
  api.create(id);
  auto r = api.sh(id, "head -c " + std::to_string(kFiles * 16384) +
                          " /dev/urandom | split -b 16384 -a 4 - f; ls | wc -l");
  ASSERT_EQ(r.body.value("stdout", ""), std::to_string(kFiles) + "\n") << r;
}

// The number of files session `id` shows, -1 when it does not exist.
int files_of(Api& api, const std::string& id) {
  if (api.get("/v1/sessions/" + id).status == 404) return -1;
  auto r = api.sh(id, "ls | wc -l");
  return std::stoi(r.body.value("stdout", "-2"));
}

// Sends `method target body` from another thread and kills the daemon with SIGKILL after
// `delay`; returns once the request ended (its reply, if any, is not looked at).
void kill_during(Daemon& d, std::string method, std::string target, std::string body,
                 std::chrono::milliseconds delay) {
  client::Client c(d.options());
  std::thread t([&c, method, target, body] { (void)c.request(method, target, body); });
  std::this_thread::sleep_for(delay);
  d.stop(SIGKILL);
  t.join();
}

TEST(CrashRecovery, KillDuringRestoreNeverLeavesAHalfRestoredSession) {
  TempDir t("agentbox-faults");
  const std::string data = t / "data";
  auto d = start(data);
  std::string archive;
  std::chrono::milliseconds restore_took{};
  {
    Api api(*d);
    fill(api, "src");
    auto del = api.del("/v1/sessions/src?archive=true");
    ASSERT_EQ(del.status, 200) << del;
    archive = del.body.value("archive", "");
    const auto t0 = std::chrono::steady_clock::now();
    auto r = api.post("/v1/sessions/probe/restore", {{"archive", archive}});
    ASSERT_EQ(r.status, 201) << r;
    restore_took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - t0);
    ASSERT_EQ(files_of(api, "probe"), kFiles);
  }
  std::mt19937 rng(std::random_device{}());
  int interrupted = 0;
  for (int round = 0; round < 5; ++round) {
    const std::string id = "r" + std::to_string(round);
    std::uniform_int_distribution<long> at(0, restore_took.count());
    kill_during(*d, "POST", "/v1/sessions/" + id + "/restore", json{{"archive", archive}}.dump(),
                std::chrono::milliseconds(at(rng)));
    d = start(data);
    Api api(*d);
    const int n = files_of(api, id);
    // All or nothing: the whole tree, or no session and no workspace of it.
    if (n != kFiles) {
      ++interrupted;
      EXPECT_EQ(n, -1) << "round " << round << ": a half-restored session is served";
      EXPECT_FALSE(std::filesystem::exists(d->workspace_dir(id))) << "round " << round;
      // A later create of that id starts empty (nothing adopted).
      api.create(id);
      EXPECT_EQ(files_of(api, id), 0) << "round " << round;
    }
    EXPECT_TRUE(names_in(data + "/restoring").empty()) << "round " << round;
  }
  std::printf("restore took %lld ms; %d of 5 kills landed inside it\n",
              static_cast<long long>(restore_took.count()), interrupted);
  EXPECT_EQ(d->stop(), 0);
}

TEST(CrashRecovery, KillDuringArchivingDeleteLeavesTheSessionOrTheArchiveWhole) {
  TempDir t("agentbox-faults");
  const std::string data = t / "data";
  auto d = start(data);
  std::chrono::milliseconds delete_took{};
  {
    Api api(*d);
    fill(api, "probe");
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(api.del("/v1/sessions/probe?archive=true").status, 200);
    delete_took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - t0);
  }
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 3; ++round) {
    const std::string id = "a" + std::to_string(round);
    {
      Api api(*d);
      fill(api, id);
    }
    std::uniform_int_distribution<long> at(0, delete_took.count());
    kill_during(*d, "DELETE", "/v1/sessions/" + id + "?archive=true", "",
                std::chrono::milliseconds(at(rng)));
    d = start(data);
    Api api(*d);
    // No unfinished archive is left, whatever the kill hit.
    for (const std::string& name : names_in(data + "/archives")) {
      EXPECT_EQ(name.find(".tmp-"), std::string::npos) << "round " << round << ": " << name;
    }
    const int n = files_of(api, id);
    if (n == -1) {
      // The delete counts as done: its archive is complete and restores the whole tree.
      std::string archive;
      for (const std::string& name : names_in(data + "/archives")) {
        if (name.starts_with(id + "-") && name.ends_with(".tar.zst")) archive = name;
      }
      ASSERT_FALSE(archive.empty()) << "round " << round << ": deleted without its archive";
      auto r = api.post("/v1/sessions/back" + std::to_string(round) + "/restore",
                        {{"archive", archive}});
      ASSERT_EQ(r.status, 201) << r;
      EXPECT_EQ(files_of(api, "back" + std::to_string(round)), kFiles) << "round " << round;
      EXPECT_FALSE(std::filesystem::exists(d->workspace_dir(id))) << "round " << round;
    } else {
      EXPECT_EQ(n, kFiles) << "round " << round << ": a half-deleted session is served";
    }
    EXPECT_TRUE(names_in(data + "/destroying").empty()) << "round " << round;
  }
  EXPECT_EQ(d->stop(), 0);
}

TEST(CrashRecovery, TornWalTheDaemonStartsAndSaysWhatItRecovered) {
  TempDir t("agentbox-faults");
  const std::string data = t / "data";
  auto d = start(data);
  {
    Api api(*d);
    for (const char* id : {"a", "b", "c", "d"}) api.create(id);
  }
  ASSERT_EQ(d->stop(SIGKILL), 128 + SIGKILL);
  const std::string wal = data + "/state.db-wal";
  struct stat st {};
  ASSERT_EQ(::stat(wal.c_str(), &st), 0) << "no WAL after kill -9";
  ASSERT_GT(st.st_size, 4096 + 1000);
  // Torn: the last frame cut in the middle (as a write interrupted by power loss leaves it).
  ASSERT_EQ(::truncate(wal.c_str(), st.st_size - 1000), 0);

  d = start(data);
  const std::string log = d->log();
  EXPECT_NE(log.find("was not closed cleanly: recovered"), std::string::npos) << log;
  EXPECT_NE(log.find("bytes after the last intact commit discarded; integrity check: ok"),
            std::string::npos)
      << log;
  Api api(*d);
  // The first commits were whole: their sessions are there and work.
  EXPECT_EQ(api.sh("a", "echo ok").body.value("stdout", ""), "ok\n");
  auto list = api.get("/v1/sessions");
  ASSERT_EQ(list.status, 200) << list;
  EXPECT_EQ(db_integrity(data + "/state.db"), "ok");
  // And a clean stop leaves nothing to recover: the next start says nothing of it.
  EXPECT_EQ(d->stop(), 0);
  d = start(data);
  EXPECT_EQ(d->log().find("was not closed cleanly"), std::string::npos) << d->log();
  EXPECT_EQ(d->stop(), 0);
}

}  // namespace
}  // namespace agentbox::testing
