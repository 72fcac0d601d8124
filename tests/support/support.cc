#include "support/support.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace agentbox::testing {

namespace fs = std::filesystem;

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp(" + tmpl + ") failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  // Mounts beneath the dir (a test that failed halfway), deepest first.
  std::ifstream mounts("/proc/self/mounts");
  std::vector<std::string> under;
  std::string dev, target, rest;
  while (mounts >> dev >> target && std::getline(mounts, rest)) {
    if (target == path_ || target.rfind(path_ + "/", 0) == 0) under.push_back(target);
  }
  for (auto it = under.rbegin(); it != under.rend(); ++it) ::umount2(it->c_str(), MNT_DETACH);
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool spit(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
  return static_cast<bool>(out.flush());
}

bool process_dead(pid_t pid) {
  if (::kill(pid, 0) < 0 && errno == ESRCH) return true;
  std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  auto close_paren = stat.rfind(')');
  return close_paren == std::string::npos ||
         (close_paren + 2 < stat.size() && stat[close_paren + 2] == 'Z');
}

bool wait_dead(pid_t pid, std::chrono::milliseconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (process_dead(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return process_dead(pid);
}

void Child::expect(bool ok, const std::string& what) {
  if (ok) return;
  failed_ = true;
  std::string line = what + "\n";
  (void)!::write(fd_, line.data(), line.size());
}

void Child::expect_eq(const std::string& got, const std::string& want, const std::string& what) {
  expect(got == want, what + ": got \"" + got + "\", want \"" + want + "\"");
}

ChildOutcome run_in_child(const std::function<void(Child&)>& fn) {
  ChildOutcome out;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    out.failure = "pipe2 failed";
    return out;
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    out.failure = "fork failed";
    return out;
  }
  if (pid == 0) {
    ::close(fds[0]);
    Child c(fds[1]);
    fn(c);
    ::_exit(c.failed() ? 1 : 0);
  }
  ::close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.failure.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  ::waitpid(pid, &out.status, 0);
  return out;
}

std::string run_child(const std::function<void(Child&)>& fn) {
  ChildOutcome o = run_in_child(fn);
  if (!WIFEXITED(o.status) || WEXITSTATUS(o.status) != 0) {
    o.failure += "child status " + std::to_string(o.status);
  }
  return o.failure;
}

}  // namespace agentbox::testing
