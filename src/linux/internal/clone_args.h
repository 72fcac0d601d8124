#pragma once
// The kernel's struct clone_args for clone3(2) (v2, with cgroup), spelled out: <linux/sched.h>
// clashes with glibc's <sched.h>. Passed with `sizeof`; the fields a caller leaves zero are the
// kernel's defaults.

#include <cstdint>

namespace agentbox::linux::detail {

struct CloneArgs {
  std::uint64_t flags;
  std::uint64_t pidfd;
  std::uint64_t child_tid;
  std::uint64_t parent_tid;
  std::uint64_t exit_signal;
  std::uint64_t stack;
  std::uint64_t stack_size;
  std::uint64_t tls;
  std::uint64_t set_tid;
  std::uint64_t set_tid_size;
  std::uint64_t cgroup;
};

}  // namespace agentbox::linux::detail
