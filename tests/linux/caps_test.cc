// Capability dropping and the switch to the session user, in forked children (each test changes
// its own credentials only).
#include "linux/caps.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "common/unique_fd.h"

namespace agentbox::linux {
namespace {

// /proc/self/status as key -> value ("CapEff" -> "0000000000000000").
std::map<std::string, std::string> proc_status(const char* path = "/proc/self/status") {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto v = line.substr(colon + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    out[line.substr(0, colon)] = v;
  }
  return out;
}

std::string hex16(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Runs fn in a forked child; the child's failures come back through a pipe.
class Child {
 public:
  explicit Child(int fd) : fd_(fd) {}
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    failed_ = true;
    std::string line = what + "\n";
    (void)!::write(fd_, line.data(), line.size());
  }
  void expect_eq(const std::string& got, const std::string& want, const std::string& what) {
    expect(got == want, what + ": got \"" + got + "\", want \"" + want + "\"");
  }
  bool failed() const { return failed_; }

 private:
  int fd_;
  bool failed_ = false;
};

std::string run_child(const std::function<void(Child&)>& fn) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return "pipe2 failed";
  UniqueFd rd(fds[0]), wr(fds[1]);
  pid_t pid = ::fork();
  if (pid == 0) {
    rd.reset();
    Child c(wr.get());
    fn(c);
    ::_exit(c.failed() ? 1 : 0);
  }
  wr.reset();
  std::string failure;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(rd.get(), buf, sizeof buf)) > 0)
    failure.append(buf, static_cast<std::size_t>(n));
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    failure += "child status " + std::to_string(status);
  }
  return failure;
}

void expect_caps(Child& c, const std::map<std::string, std::string>& st, std::uint64_t eff,
                 std::uint64_t bnd, const std::string& who) {
  c.expect_eq(st.at("CapInh"), hex16(0), who + " CapInh");
  c.expect_eq(st.at("CapPrm"), hex16(eff), who + " CapPrm");
  c.expect_eq(st.at("CapEff"), hex16(eff), who + " CapEff");
  c.expect_eq(st.at("CapBnd"), hex16(bnd), who + " CapBnd");
  c.expect_eq(st.at("CapAmb"), hex16(0), who + " CapAmb");
}

TEST(Caps, DropAllEmptiesEverySetAndRootGainsNothingAtExec) {
  ASSERT_EQ(::geteuid(), 0u) << "privileged test: run as root";
  const std::string failure = run_child([](Child& c) {
    c.expect(drop_all_capabilities() == 0, "drop_all_capabilities");
    expect_caps(c, proc_status(), 0, 0, "after drop");
    // Still uid 0: a fresh exec must not regain anything (permitted = bounding set).
    int p[2];
    c.expect(::pipe(p) == 0, "pipe");
    pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(p[1], 1);
      ::execl("/bin/cat", "cat", "/proc/self/status", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(p[1]);
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(p[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
    ::waitpid(pid, nullptr, 0);
    for (const char* key : {"CapPrm:\t", "CapEff:\t", "CapBnd:\t", "CapAmb:\t"}) {
      c.expect(text.find(std::string(key) + hex16(0)) != std::string::npos,
               std::string("exec'd root process ") + key + " not 0");
    }
    // A privileged operation is refused: creating a namespace needs CAP_SYS_ADMIN.
    c.expect(::unshare(CLONE_NEWUTS) == -1 && errno == EPERM, "unshare(CLONE_NEWUTS)");
    // Idempotent, even though CAP_SETPCAP is gone now.
    c.expect(drop_all_capabilities() == 0, "second drop_all_capabilities");
  });
  EXPECT_EQ(failure, "");
}

TEST(Caps, KeepOnlyKeepsExactlyTheInitSet) {
  const std::string failure = run_child([](Child& c) {
    c.expect(keep_only_capabilities(kInitCapabilities) == 0, "keep_only_capabilities");
    expect_caps(c, proc_status(), kInitCapabilities, kInitCapabilities, "init");
    c.expect(::unshare(CLONE_NEWUTS) == -1 && errno == EPERM, "CAP_SYS_ADMIN is gone");
  });
  EXPECT_EQ(failure, "");
}

TEST(Caps, InitChildBecomesSessionUserWithNothingLeft) {
  constexpr uid_t kUid = 61234;
  constexpr gid_t kGid = 61235;
  const std::string failure = run_child([](Child& c) {
    // The box's init: keeps only what starting commands needs...
    c.expect(keep_only_capabilities(kInitCapabilities) == 0, "init keep_only");
    // ...and each command's child switches identity and drops the rest.
    int p[2];
    c.expect(::pipe(p) == 0, "pipe");
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      int err = switch_user_and_drop_capabilities(kUid, kGid);
      if (err == 0) err = set_no_new_privs();
      if (err == 0 && ::syscall(SYS_setresuid, 0, 0, 0) == 0) err = -1;
      if (err == 0 && ::syscall(SYS_setgroups, 0, nullptr) == 0) err = -2;
      (void)!::write(p[1], &err, sizeof err);
      ::dup2(p[1], 1);
      ::execl("/bin/cat", "cat", "/proc/self/status", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(p[1]);
    int err = -3;
    c.expect(::read(p[0], &err, sizeof err) == sizeof err, "read result");
    c.expect(err == 0,
             "switch_user_and_drop_capabilities / setresuid(0) refused: " + std::to_string(err));
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(p[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
    int status = 0;
    ::waitpid(pid, &status, 0);
    c.expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "cat exited 0");
    auto has = [&](const std::string& s) { return text.find(s) != std::string::npos; };
    c.expect(has("Uid:\t61234\t61234\t61234\t61234\n"), "Uid line in\n" + text);
    c.expect(has("Gid:\t61235\t61235\t61235\t61235\n"), "Gid line");
    // The kernel prints each group followed by a space; none leaves "Groups:\t \n".
    c.expect(has("Groups:\t \n"), "no supplementary groups");
    c.expect(has("NoNewPrivs:\t1\n"), "NoNewPrivs");
    for (const char* key : {"CapInh:\t", "CapPrm:\t", "CapEff:\t", "CapBnd:\t", "CapAmb:\t"}) {
      c.expect(has(std::string(key) + hex16(0)), std::string("command ") + key + " not 0");
    }
  });
  EXPECT_EQ(failure, "");
}

TEST(Caps, SwitchUserRefusesRoot) {
  const std::string failure = run_child([](Child& c) {
    c.expect(switch_user_and_drop_capabilities(0, 1000) == EINVAL, "uid 0");
    c.expect(switch_user_and_drop_capabilities(1000, 0) == EINVAL, "gid 0");
    c.expect(::getuid() == 0, "still root: nothing was changed");
  });
  EXPECT_EQ(failure, "");
}

TEST(Caps, SwitchUserWithoutCapabilitiesFails) {
  const std::string failure = run_child([](Child& c) {
    c.expect(drop_all_capabilities() == 0, "drop_all");
    c.expect(switch_user_and_drop_capabilities(61234, 61234) == EPERM,
             "setgroups without CAP_SETGID -> EPERM");
  });
  EXPECT_EQ(failure, "");
}

TEST(Caps, NoNewPrivs) {
  const std::string failure = run_child([](Child& c) {
    c.expect_eq(proc_status().at("NoNewPrivs"), "0", "before");
    c.expect(set_no_new_privs() == 0, "set_no_new_privs");
    c.expect_eq(proc_status().at("NoNewPrivs"), "1", "after");
  });
  EXPECT_EQ(failure, "");
}

}  // namespace
}  // namespace agentbox::linux
