// SECURITY.md T3: the filesystem, from commands in the box and through the file API.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "security/box_fixture.h"

namespace agentbox::security {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
namespace fs = std::filesystem;

MATCHER(Refused, "") { return arg.rfind("DENIED", 0) == 0 || arg.rfind("KILLED", 0) == 0; }

// A host dir outside every box, with a file whose content must never change.
struct Canary {
  Canary() {
    dir = fs::temp_directory_path() / ("agentbox-canary-" + std::to_string(getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "canary") << "canary\n";
  }
  ~Canary() { fs::remove_all(dir); }
  bool intact() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
    return n == 1 && slurp((dir / "canary").string()) == "canary\n";
  }
  fs::path dir;
};

std::string q(const std::string& s) { return client::url_encode(s); }

class FilesystemTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { a_ = new Box(shared_daemon(), "t3-fs"); }
  int get_status(const std::string& path) {
    auto r = a_->client().request("GET", "/v1/sessions/t3-fs/files?path=" + q(path));
    return r ? r->status : 0;
  }
  int put_status(const std::string& path, const std::string& body = "pwned\n") {
    auto r = a_->client().request("PUT", "/v1/sessions/t3-fs/files?path=" + q(path), body,
                                  "application/octet-stream");
    return r ? r->status : 0;
  }
  static Box* a_;
};
Box* FilesystemTest::a_;

TEST_F(FilesystemTest, SystemIsReadOnlyWorkspaceAndTmpWritable) {
  EXPECT_THAT(a_->probe("write", {"/x"}), AnyOf("DENIED EROFS", "DENIED EACCES"));
  EXPECT_THAT(a_->probe("write", {"/usr/bin/x"}), AnyOf("DENIED EROFS", "DENIED EACCES"));
  EXPECT_THAT(a_->probe("write", {"/etc/passwd"}), AnyOf("DENIED EROFS", "DENIED EACCES"));
  EXPECT_EQ(a_->probe("write", {"/workspace/ok"}), "ALLOWED");
  EXPECT_EQ(a_->probe("write", {"/tmp/ok"}), "ALLOWED");
  // And through the file API: the box's read-only mounts hold there too.
  EXPECT_EQ(put_status("/etc/passwd"), 403);
  EXPECT_EQ(put_status("/usr/bin/x"), 403);
  EXPECT_EQ(put_status("/tmp/api-ok"), 200);
  EXPECT_EQ(a_->sh("cat /tmp/api-ok").value("stdout", ""), "pwned\n");
}

TEST_F(FilesystemTest, AnotherSessionsWorkspaceIsUnreachable) {
  Box b(shared_daemon(), "t3-other");
  ASSERT_EQ(b.sh("echo secret > /workspace/marker-of-b").value("exit_code", -1), 0);
  auto r = a_->sh("find / -name marker-of-b 2>/dev/null; ls /proc/*/root/workspace 2>/dev/null;"
                  " cat /workspace/../../workspaces/t3-other/marker-of-b 2>&1; true");
  EXPECT_THAT(r.value("stdout", ""), Not(HasSubstr("secret")));
  EXPECT_THAT(r.value("stdout", ""), Not(HasSubstr("marker-of-b\n")));
  // The host data dir is not visible at all.
  EXPECT_NE(a_->sh("ls " + shared_daemon().data_dir()).value("exit_code", 0), 0);
  for (const char* p : {"/home", "/root", "/var", "/run", "/boot"}) {
    EXPECT_NE(a_->sh(std::string("ls -A ") + p + " | grep -q .").value("exit_code", 0), 0) << p;
  }
}

TEST_F(FilesystemTest, FileApiRefusesEscapesAndBadPaths) {
  Canary c;
  for (const char* p : {"../../etc/shadow", "/workspace/../../etc/shadow", "a/../../x",
                        "../../../../../../etc/passwd"}) {
    // ".." is clamped at the box's root, as the kernel does for a command in the box: a path
    // either names a file of the box (the box's own /etc/passwd, never the host's) or fails.
    auto r = a_->client().request("GET", "/v1/sessions/t3-fs/files?path=" + q(p));
    ASSERT_TRUE(r);
    if (r->status == 200) {
      EXPECT_EQ(r->body, a_->sh("cat /etc/passwd").value("stdout", "")) << p;
    } else {
      EXPECT_TRUE(r->status == 403 || r->status == 404) << p << " -> " << r->status;
    }
    int w = put_status(std::string(p) + "-w");
    EXPECT_TRUE(w == 403 || w == 404) << p << " PUT -> " << w;
  }
  EXPECT_EQ(get_status(std::string("/workspace/a\0b", 14)), 400);
  EXPECT_EQ(get_status(std::string(5000, 'a')), 413);
  // Backslashes are refused outright (400): they are no separator on Linux, but a Windows-minded
  // client or a proxy might make them one.
  EXPECT_EQ(get_status("..\\..\\etc\\passwd"), 400);
  EXPECT_EQ(put_status(c.dir.string() + "/x"), 404);  // host paths mean nothing in the box
  EXPECT_TRUE(c.intact());
}

TEST_F(FilesystemTest, PlantedSymlinksResolveInsideTheBoxOnly) {
  std::string host_shadow = slurp("/etc/shadow");
  ASSERT_EQ(a_->sh("ln -sf /etc/shadow /workspace/s1; ln -sfn / /workspace/s2;"
                   " ln -sf /proc/self/root/etc/passwd /workspace/m1;"
                   " ln -sf /proc/1/cwd /workspace/m2")
                .value("exit_code", -1),
            0);
  auto r = a_->client().request("GET", "/v1/sessions/t3-fs/files?path=/workspace/s1");
  ASSERT_TRUE(r);
  if (r->status == 200) {
    EXPECT_NE(r->body, host_shadow);
  }
  // s2 -> "/" is the box's root: the file API reads the box's synthetic passwd (the one a
  // command sees), never the host's.
  r = a_->client().request("GET", "/v1/sessions/t3-fs/files?path=/workspace/s2/etc/passwd");
  ASSERT_TRUE(r);
  if (r->status == 200) {
    EXPECT_EQ(r->body, a_->sh("cat /etc/passwd").value("stdout", "")) << "not the box's passwd";
    EXPECT_NE(r->body, slurp("/etc/passwd"));
  }
  // Magic links are refused outright: 403, or 404 where the box's /proc has no such entry for
  // the daemon (its /proc/self does not exist in the box's pid namespace).
  int m1 = get_status("/workspace/m1");
  EXPECT_TRUE(m1 == 403 || m1 == 404) << m1;
  EXPECT_EQ(put_status("/workspace/m2/x"), 403);
  // Writing "through" a final symlink replaces the link, never its target.
  Canary c;
  ASSERT_EQ(a_->sh("ln -sfn /etc/hostname /workspace/s3").value("exit_code", -1), 0);
  EXPECT_EQ(put_status("/workspace/s3", "new\n"), 200);
  EXPECT_EQ(a_->sh("cat /workspace/s3; test -L /workspace/s3 || echo regular").value("stdout", ""),
            "new\nregular\n");
  EXPECT_TRUE(c.intact());
}

TEST_F(FilesystemTest, SymlinkExchangeRaceStaysInside) {
  Canary c;
  // In the box: swap a real dir and a symlink to / as fast as possible, for a few seconds.
  ASSERT_EQ(a_->sh("mkdir -p /workspace/race/d && ln -sfn / /workspace/race/l").value("exit_code", -1), 0);
  std::thread swapper([&] {
    a_->exec({"python3", "-c",
              "import ctypes,os,time\n"
              "libc=ctypes.CDLL(None,use_errno=True)\n"
              "end=time.time()+3\n"
              "while time.time()<end:\n"
              "  libc.renameat2(-100,b'/workspace/race/d',-100,b'/workspace/race/l',2)\n"},
             20);
  });
  client::Client cl(shared_daemon().options(kSuiteToken));
  int ok = 0;
  for (int i = 0; i < 300; ++i) {
    auto r = cl.request("PUT", "/v1/sessions/t3-fs/files?path=/workspace/race/d/f" + std::to_string(i % 5),
                        "x", "application/octet-stream");
    if (r && r->status == 200) ++ok;
  }
  swapper.join();
  EXPECT_GT(ok, 0);
  EXPECT_TRUE(c.intact());
  // Whatever landed outside /workspace/race/d landed in the box's own tmpfs root (read-only: so
  // nowhere) — never on the host.
  EXPECT_FALSE(fs::exists("/f0"));
}

TEST_F(FilesystemTest, HardLinksMknodAndPlantedDevicesFail) {
  EXPECT_THAT(a_->probe("link", {"/etc/passwd", "/workspace/hl"}), Refused());
  EXPECT_THAT(a_->probe("mknod", {"/workspace/null2"}), Refused());
  std::string dev = a_->workspace_host() + "/planted-mem";
  ASSERT_EQ(mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 1)), 0);  // /dev/mem
  EXPECT_THAT(a_->probe("read", {"/workspace/planted-mem"}), Refused());
  unlink(dev.c_str());
}

TEST_F(FilesystemTest, FileApiOnFifoSocketAndDeviceLinksDoesNotHang) {
  ASSERT_EQ(a_->sh("mkfifo /workspace/fifo; ln -sf /dev/zero /workspace/zero").value("exit_code", -1), 0);
  auto t0 = std::chrono::steady_clock::now();
  int s1 = get_status("/workspace/fifo");
  int s2 = get_status("/workspace/zero");
  EXPECT_GE(s1, 400);
  EXPECT_GE(s2, 400);
  EXPECT_LT(s1, 500);
  EXPECT_LT(s2, 500);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST_F(FilesystemTest, FileApiOnAUnixSocketFailsAtOnceWithAClearError) {
  // A live listener on a unix socket in the workspace (left running in the background): opening
  // it must neither block nor connect; the API names the problem.
  ASSERT_EQ(a_->exec({"/bin/sh", "-c",
                      "python3 -c 'import socket,time\n"
                      "s=socket.socket(socket.AF_UNIX);s.bind(\"/workspace/sock\");s.listen(1)\n"
                      "time.sleep(600)' >/dev/null 2>&1 & "
                      "for i in $(seq 100); do test -S /workspace/sock && exit 0; sleep 0.05; done;"
                      " exit 1"})
                .value("exit_code", -1),
            0);
  auto t0 = std::chrono::steady_clock::now();
  auto r = a_->client().request("GET", "/v1/sessions/t3-fs/files?path=/workspace/sock");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_THAT(r->body, HasSubstr("/workspace/sock"));
  EXPECT_THAT(r->body, HasSubstr("not a regular file"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // The socket is still a socket: the failed read did not touch it.
  EXPECT_EQ(a_->sh("test -S /workspace/sock && echo socket").value("stdout", ""), "socket\n");
}

TEST_F(FilesystemTest, MagicLinkToTheDaemonsCwdIsRefused) {
  // The daemon's cwd on the host is the canary: a file API call that followed
  // /proc/<daemon's host pid>/cwd on the host would read or write there.
  const pid_t daemon = shared_daemon().pid();
  std::error_code ec;
  const fs::path cwd = fs::read_symlink("/proc/" + std::to_string(daemon) + "/cwd", ec);
  ASSERT_FALSE(ec) << ec.message();
  const std::string canary_name = "agentbox-canary-" + std::to_string(getpid());
  std::ofstream(cwd / canary_name) << "canary\n";
  const std::string link = "/proc/" + std::to_string(daemon) + "/cwd";
  ASSERT_EQ(a_->sh("ln -sfn " + link + " /workspace/dcwd").value("exit_code", -1), 0);
  // In the box, /proc is the box's own: the daemon's host pid names no process of the box (else
  // the link would be a magic link into one of the box's own processes, refused just the same).
  const bool in_box =
      a_->sh("test -e /proc/" + std::to_string(daemon) + " && echo yes").value("stdout", "") ==
      "yes\n";
  const int want = in_box ? 403 : 404;
  EXPECT_EQ(get_status("/workspace/dcwd/" + canary_name), want);
  EXPECT_EQ(put_status("/workspace/dcwd/" + canary_name, "pwned\n"), want);
  EXPECT_EQ(put_status("/workspace/dcwd/new-" + canary_name, "pwned\n"), want);
  // Through a magic link the box surely has (pid 1 is the box's init): refused, 403.
  ASSERT_EQ(a_->sh("ln -sfn /proc/1/cwd /workspace/icwd").value("exit_code", -1), 0);
  EXPECT_EQ(get_status("/workspace/icwd/" + canary_name), 403);
  EXPECT_EQ(put_status("/workspace/icwd/" + canary_name, "pwned\n"), 403);
  // The canary is intact and nothing new appeared next to it.
  EXPECT_EQ(slurp((cwd / canary_name).string()), "canary\n");
  EXPECT_FALSE(fs::exists(cwd / ("new-" + canary_name)));
  fs::remove(cwd / canary_name, ec);
}

TEST_F(FilesystemTest, ProcSysAndKernelFilesAreProtected) {
  EXPECT_THAT(a_->probe("write", {"/proc/sysrq-trigger"}), Refused());
  EXPECT_THAT(a_->probe("write", {"/proc/sys/kernel/hostname"}), Refused());
  EXPECT_THAT(a_->probe("write", {"/sys/kernel/uevent_helper"}), Refused());
  EXPECT_THAT(a_->probe("read", {"/proc/kcore"}), Refused());
  EXPECT_THAT(a_->probe("mount_cgroup"), Refused());  // CVE-2022-0492 needs this first
  EXPECT_THAT(a_->probe("write", {"/proc/self/exe"}), Refused());
  EXPECT_THAT(a_->probe("write", {"/proc/1/exe"}), Refused());
  EXPECT_EQ(a_->sh("readlink /proc/self/cwd").value("stdout", ""), "/workspace\n");
}

TEST_F(FilesystemTest, HostileNamesAndHugeDirectoriesKeepTheDaemonUp) {
  auto r = a_->exec({"python3", "-c",
                     "import os\n"
                     "os.makedirs('/workspace/names', exist_ok=True)\n"
                     "for n in [b'new\\nline', b'bad\\xff\\xfeutf8', b'x'*255]:\n"
                     "  open(b'/workspace/names/'+n,'w').close()\n"
                     "p='/workspace/deep'\n"
                     "os.makedirs(p, exist_ok=True)\n"
                     "fd=os.open(p, os.O_RDONLY)\n"
                     "for i in range(10000):\n"
                     "  os.mkdir('d', dir_fd=fd); nfd=os.open('d', os.O_RDONLY, dir_fd=fd); os.close(fd); fd=nfd\n"
                     "os.makedirs('/workspace/many', exist_ok=True)\n"
                     "for i in range(120000): open('/workspace/many/%d'%i,'w').close()\n"},
                    120);
  ASSERT_EQ(r.value("exit_code", -1), 0) << r.dump();
  auto names = a_->client().request("GET", "/v1/sessions/t3-fs/dir?path=/workspace/names");
  ASSERT_TRUE(names);
  EXPECT_EQ(names->status, 200);
  auto many = a_->client().request("GET", "/v1/sessions/t3-fs/dir?path=/workspace/many");
  ASSERT_TRUE(many);
  EXPECT_TRUE(many->status == 200 || many->status == 413) << many->status;
  auto del = a_->client().request("DELETE", "/v1/sessions/t3-fs/files?path=/workspace/deep&recursive=true");
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 200) << del->body;
  auto h = a_->client().request("GET", "/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

}  // namespace
}  // namespace agentbox::security
