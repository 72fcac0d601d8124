// Seed 002's primary mount over /workspace (API.md "Live changes to a session") against the real
// daemon, on host and ns: a session's host_path with mount_path /workspace (the default) is its
// workspace. rw: what the agent writes is in the host dir, owned by the dir's owner (ns: through
// an idmapped mount, as the session user); ro: the box cannot write it (ns; the host backend
// cannot enforce it and says so); none: the session has its own workspace. Suspend/resume and a
// daemon restart keep it; delete never removes the host dir; an archive is 409; disk_mb is 400;
// a dir outside the allowed mount roots is 403.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;

uid_t owner_uid(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_uid;
}

std::string real(const std::string& path) {
  return fs::canonical(path).string();
}

class HostPathApi : public ::testing::Test {
 protected:
  HostPathApi()
      : roots_("agentbox-hostpath"),
        allowed_(roots_.path() + "/allowed"),
        dir_(allowed_ + "/proj"),
        d_({"--allow-mount-root", allowed_}),
        api_(d_) {}

  void SetUp() override {
    fs::create_directories(dir_);
    std::ofstream(dir_ + "/old.txt") << "old\n";
    ::chmod(dir_.c_str(), 0755);
    ::chmod((dir_ + "/old.txt").c_str(), 0644);
    if (ns()) {
      // Another user's dir: on ns the agent writes in it as the session user, and the host
      // sees the dir owner's files.
      ASSERT_EQ(::chown(dir_.c_str(), 4242, 4343), 0);
      ASSERT_EQ(::chown((dir_ + "/old.txt").c_str(), 4242, 4343), 0);
    }
  }

  static bool ns() { return test_backend() == "ns"; }
  // The workspace path as commands see it.
  std::string ws() const { return ns() ? "/workspace" : real(dir_); }

  ApiReply create(const std::string& id, json extra = json::object()) {
    json body = {{"id", id}, {"host_path", dir_}};
    for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
    return api_.post("/v1/sessions", body);
  }

  TempDir roots_;
  std::string allowed_;
  std::string dir_;
  Daemon d_;
  Api api_;
};

TEST_F(HostPathApi, ARwHostDirIsTheWorkspaceAndOutlivesTheSession) {
  auto r = create("rw");
  ASSERT_EQ(r.status, 201) << r;
  EXPECT_EQ(r.body["host_path"], dir_) << r;
  EXPECT_EQ(r.body["host_path_mode"], "rw") << r;
  EXPECT_EQ(r.body["mount_path"], "/workspace") << r;
  EXPECT_EQ(r.body["workspace"], ws()) << r;
  // No workspace of the daemon's own.
  EXPECT_FALSE(fs::exists(d_.data_dir() + "/workspaces/rw"));

  // The default cwd is the host dir; what the agent writes is there, the dir owner's.
  auto x = api_.sh("rw", "cat old.txt && echo new > new.txt && mkdir sub && echo s > sub/f");
  ASSERT_EQ(x.body["exit_code"], 0) << x;
  EXPECT_EQ(x.body["stdout"], "old\n") << x;
  EXPECT_EQ(read_host_file(dir_ + "/new.txt"), "new\n");
  EXPECT_EQ(read_host_file(dir_ + "/sub/f"), "s\n");
  const uid_t want = ns() ? 4242 : ::geteuid();
  EXPECT_EQ(owner_uid(dir_ + "/new.txt"), want);
  EXPECT_EQ(owner_uid(dir_ + "/sub"), want);
  EXPECT_EQ(owner_uid(dir_), want);  // nothing chowned
  if (ns()) {
    // ... written as the session user.
    const int uid = api_.get("/v1/sessions/rw").body["uid"].get<int>();
    EXPECT_EQ(api_.sh("rw", "id -u").body["stdout"], std::to_string(uid) + "\n");
  }
  // The file API reads and writes the same dir.
  auto put = api_.put(files_target("rw", ws() + "/api.txt"), "via api\n");
  ASSERT_EQ(put.status / 100, 2) << put;
  EXPECT_EQ(read_host_file(dir_ + "/api.txt"), "via api\n");
  EXPECT_EQ(owner_uid(dir_ + "/api.txt"), want);
  EXPECT_EQ(api_.get(files_target("rw", ws() + "/old.txt")).raw, "old\n");

  // Suspend and resume keep it.
  ASSERT_EQ(api_.call("POST", "/v1/sessions/rw/suspend").status, 200);
  x = api_.sh("rw", "cat new.txt && echo again >> new.txt");
  EXPECT_EQ(x.body["stdout"], "new\n") << x;
  EXPECT_EQ(read_host_file(dir_ + "/new.txt"), "new\nagain\n");

  // An archive is refused naming why, and changes nothing.
  auto arch = api_.del("/v1/sessions/rw?archive=true");
  EXPECT_EQ(arch.status, 409) << arch;
  EXPECT_EQ(arch.code(), "EEXIST") << arch;
  EXPECT_NE(arch.message().find("host_path"), std::string::npos) << arch;
  EXPECT_EQ(api_.get("/v1/sessions/rw").status, 200);
  EXPECT_EQ(api_.sh("rw", "cat old.txt").body["stdout"], "old\n");

  // Delete leaves the host dir and every file in it.
  ASSERT_EQ(api_.del("/v1/sessions/rw").status, 200);
  EXPECT_EQ(api_.get("/v1/sessions/rw").status, 404);
  EXPECT_EQ(read_host_file(dir_ + "/old.txt"), "old\n");
  EXPECT_EQ(read_host_file(dir_ + "/new.txt"), "new\nagain\n");
  EXPECT_EQ(read_host_file(dir_ + "/sub/f"), "s\n");
  EXPECT_EQ(read_host_file(dir_ + "/api.txt"), "via api\n");
}

TEST_F(HostPathApi, ARoHostDirCannotBeWrittenFromTheBox) {
  auto r = create("ro", {{"host_path_mode", "ro"}});
  if (!ns()) {
    // Host commands run with the daemon's rights: nothing could make the dir read-only.
    EXPECT_EQ(r.status, 501) << r;
    EXPECT_EQ(r.code(), "ENOTSUP") << r;
    EXPECT_NE(r.message().find("host_path_mode"), std::string::npos) << r;
    EXPECT_EQ(api_.get("/v1/sessions/ro").status, 404);
    return;
  }
  ASSERT_EQ(r.status, 201) << r;
  EXPECT_EQ(r.body["host_path_mode"], "ro") << r;
  auto x = api_.sh("ro", "cat /workspace/old.txt; touch /workspace/x 2>&1; echo rc=$?");
  const std::string out = x.body["stdout"].get<std::string>();
  EXPECT_TRUE(out.starts_with("old\n")) << x;
  EXPECT_NE(out.find("Read-only file system"), std::string::npos) << x;
  EXPECT_NE(out.find("rc=1"), std::string::npos) << x;
  auto put = api_.put(files_target("ro", "/workspace/api.txt"), "no\n");
  EXPECT_EQ(put.status, 403) << put;
  EXPECT_EQ(put.code(), "EACCES") << put;
  EXPECT_FALSE(fs::exists(dir_ + "/x"));
  EXPECT_FALSE(fs::exists(dir_ + "/api.txt"));
  ASSERT_EQ(api_.del("/v1/sessions/ro").status, 200);
  EXPECT_EQ(read_host_file(dir_ + "/old.txt"), "old\n");
}

TEST_F(HostPathApi, ModeNoneMountsNothingAndTheSessionHasItsOwnWorkspace) {
  auto r = create("none", {{"host_path_mode", "none"}});
  ASSERT_EQ(r.status, 201) << r;
  EXPECT_EQ(r.body["host_path"], dir_) << r;
  EXPECT_EQ(r.body["host_path_mode"], "none") << r;
  auto x = api_.sh("none", "ls; echo mine > mine.txt");
  EXPECT_EQ(x.body["stdout"], "") << x;  // not the host dir's old.txt
  EXPECT_FALSE(fs::exists(dir_ + "/mine.txt"));
  EXPECT_EQ(read_host_file(d_.workspace_dir("none") + "/mine.txt"), "mine\n");
  // A session without a host_path shows nulls.
  api_.create("plain");
  auto plain = api_.get("/v1/sessions/plain");
  EXPECT_TRUE(plain.body["host_path"].is_null()) << plain;
  EXPECT_TRUE(plain.body["host_path_mode"].is_null()) << plain;
  EXPECT_TRUE(plain.body["mount_path"].is_null()) << plain;
}

TEST_F(HostPathApi, DiskMbOutsideTheRootsAndAMissingDirAreRefusedNamingThem) {
  auto disk = create("d", {{"limits", {{"disk_mb", 64}}}});
  EXPECT_EQ(disk.status, 400) << disk;
  EXPECT_EQ(disk.code(), "EINVAL") << disk;
  EXPECT_NE(disk.message().find("disk_mb"), std::string::npos) << disk;

  TempDir elsewhere("agentbox-hostpath-out");
  auto out = api_.post("/v1/sessions", {{"id", "o"}, {"host_path", elsewhere.path()}});
  EXPECT_EQ(out.status, 403) << out;
  EXPECT_EQ(out.code(), "EACCES") << out;
  EXPECT_NE(out.message().find("host_path"), std::string::npos) << out;

  auto missing = api_.post("/v1/sessions", {{"id", "m"}, {"host_path", allowed_ + "/nope"}});
  EXPECT_EQ(missing.status, 404) << missing;

  // A re-create must name the same host dir.
  ASSERT_EQ(create("same").status, 201);
  EXPECT_EQ(create("same").status, 200);
  fs::create_directories(allowed_ + "/other");
  auto other = api_.post("/v1/sessions", {{"id", "same"}, {"host_path", allowed_ + "/other"}});
  EXPECT_EQ(other.status, 409) << other;
  EXPECT_NE(other.message().find("host_path"), std::string::npos) << other;

  for (const char* id : {"d", "o", "m"})
    EXPECT_EQ(api_.get(std::string("/v1/sessions/") + id).status, 404);
  // Nothing was left of the refused ones, and the dir is untouched.
  EXPECT_EQ(read_host_file(dir_ + "/old.txt"), "old\n");
}

TEST(HostPathRestart, ADaemonRestartKeepsTheHostDirAsTheWorkspace) {
  TempDir roots("agentbox-hostpath");
  const std::string allowed = roots.path() + "/allowed";
  const std::string dir = allowed + "/proj";
  fs::create_directories(dir);
  const std::string data = roots.path() + "/data";
  const std::string ws = test_backend() == "ns" ? "/workspace" : real(dir);
  {
    Daemon d({"--allow-mount-root", allowed, "--data-dir", data});
    Api api(d);
    auto r = api.post("/v1/sessions", {{"id", "k"}, {"host_path", dir}});
    ASSERT_EQ(r.status, 201) << r;
    EXPECT_EQ(api.sh("k", "echo one > one.txt").body["exit_code"], 0);
    d.stop();
  }
  Daemon d2({"--allow-mount-root", allowed, "--data-dir", data});
  Api api2(d2);
  auto got = api2.get("/v1/sessions/k");
  EXPECT_EQ(got.body["host_path"], dir) << got;
  EXPECT_EQ(got.body["mount_path"], "/workspace") << got;
  auto x = api2.sh("k", "pwd && cat one.txt && echo two > two.txt");
  EXPECT_EQ(x.body["stdout"], ws + "\none\n") << x;
  EXPECT_EQ(read_host_file(dir + "/two.txt"), "two\n");
  ASSERT_EQ(api2.del("/v1/sessions/k").status, 200);
  EXPECT_EQ(read_host_file(dir + "/one.txt"), "one\n");
}

}  // namespace
}  // namespace agentbox::testing
