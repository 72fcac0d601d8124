#pragma once
// What many tests need, written once: temp dirs that clean up, whole-file reads, process
// helpers, and a forked-child harness for privileged tests (a child that unshares, drops
// capabilities or installs seccomp must not do it to the test process itself).

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>

namespace agentbox::testing {

// A fresh directory under /tmp (`/tmp/<prefix>-XXXXXX`), removed with everything in it when the
// object goes. Mounts left under it are detached first, so a failed test leaves no mount either.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "agentbox-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // path() + "/" + rel
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

// The whole file, or "" when it cannot be read.
std::string slurp(const std::string& path);
// Writes (truncating) `data` to `path`; false on error.
bool spit(const std::string& path, const std::string& data);

// Whether `pid` has ended: gone, or a zombie nobody reaped yet.
bool process_dead(pid_t pid);
// Polls process_dead until it holds or `limit` passes; returns the last answer.
bool wait_dead(pid_t pid, std::chrono::milliseconds limit);

// The forked-child harness. `fn` runs in a child process; its failed expectations travel back
// through a pipe and are returned as text ("" when every expectation held and the child exited
// 0). The child ends with _exit, never returning into the test framework.
class Child {
 public:
  explicit Child(int fd) : fd_(fd) {}
  void expect(bool ok, const std::string& what);
  void expect_eq(const std::string& got, const std::string& want, const std::string& what);
  bool failed() const { return failed_; }

 private:
  int fd_;
  bool failed_ = false;
};

struct ChildOutcome {
  int status = -1;      // waitpid status
  std::string failure;  // the child's failed expectations, one a line
};
ChildOutcome run_in_child(const std::function<void(Child&)>& fn);
// "" when the child held every expectation and exited 0, else what went wrong.
std::string run_child(const std::function<void(Child&)>& fn);

}  // namespace agentbox::testing
