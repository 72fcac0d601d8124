#pragma once
// Owning file descriptor, after Android's unique_fd: no implicit int, close never retried.
// Every fd we create is born O_CLOEXEC inside a UniqueFd on the same line.

#include <utility>

namespace agentbox {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Gives up ownership without closing.
  [[nodiscard]] int release() { return std::exchange(fd_, -1); }
  // Closes the fd held (if any) and takes `fd`. errno is the same afterwards.
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A pipe, both ends O_CLOEXEC.
struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

}  // namespace agentbox
