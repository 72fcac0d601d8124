#pragma once
// One box: a process tree in its own mount, pid, ipc, uts, net and cgroup namespaces, whose pid 1
// is agentbox-init (linux/init/). Box::create() clones the box's first process, which runs the
// setup steps (box.cc: one flat, ordered list) and then execs the init; afterwards the daemon
// talks to the init over the control socket (linux/init_protocol.h).
//
//   daemon thread                          box child (new namespaces, still the daemon's binary)
//   socketpair(SEQPACKET), clone3  ---->   PDEATHSIG; wait for Go
//   cgroup.add_process(pid); send Go --->  cgroup ns, filesystem, pivot_root, hostname, lo,
//                                          rlimits, oom_score_adj, fds, caps, no_new_privs,
//                                          seccomp (last), execveat(agentbox-init)
//   wait for Hello  <---------------------  init: Hello     (or SetupError{step, errno} + _exit)
//
// Lifetime: the box dies when its Box is destroyed (SIGKILL to the init through the pidfd: the
// kernel then kills every process of the pid namespace), when the control socket's daemon end is
// closed (the init exits), and when the THREAD that called create() exits (PR_SET_PDEATHSIG is
// per creating thread): call create() from a thread that lives as long as its boxes (the ns
// backend has a dedicated one).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "linux/cgroup.h"
#include "linux/init_protocol.h"
#include "linux/mounts.h"
#include "linux/rlimits.h"
#include "linux/seccomp_policy.h"

namespace agentbox::linux {

// The setup steps of the box child, in order; a SetupError names one (and step_name() spells it).
enum class BoxStep : std::uint32_t {
  kSignals = 1,     // reset signal dispositions, unblock, setsid
  kDeathSignal,     // PR_SET_PDEATHSIG
  kWaitGo,          // wait until the daemon has moved us into the box cgroup
  kCgroupNs,        // unshare(CLONE_NEWCGROUP): the box cgroup becomes the ns root
  kMountPrivate,    // no mount propagation to or from the host
  kRootFs,          // the root tmpfs, attached to the runtime mountpoint
  kMountPlan,       // the box filesystem (mounts.h); detail = failed op index
  kPivotRoot,       // pivot_root into the new root
  kDetachOldRoot,   // umount2(old root, MNT_DETACH)
  kRootReadOnly,    // "/" read-only
  kHostname,        // sethostname
  kLoopback,        // bring `lo` up
  kRlimits,         // nofile, fsize, core
  kOomScoreAdj,     // make the box the OOM killer's preferred victim, not the daemon
  kFds,             // /dev/null on 0-2, control socket on kControlFd, close the rest
  kCapabilities,    // keep only kInitCapabilities
  kNoNewPrivs,      // PR_SET_NO_NEW_PRIVS
  kSeccomp,         // the filter, last
  kExecInit,        // execveat(agentbox-init)
};
std::string_view box_step_name(BoxStep step);

struct BoxSpec {
  std::string key;               // for messages
  // An empty host directory the box's root tmpfs is attached to inside the box's own mount
  // namespace (the host never sees the mount). Many boxes may share it.
  std::string root_mountpoint;
  // An image root (linux/image_root.h: a detached overlay mount, borrowed) instead of the fresh
  // tmpfs; root_writable leaves "/" writable (read_only_rootfs false), else it is made read-only
  // like the tmpfs root.
  int root_tree = -1;
  bool root_writable = false;
  int init_fd = -1;              // agentbox-init, opened by the caller (O_PATH is enough); borrowed
  const MountPlan* fs = nullptr;  // borrowed for the duration of create()
  const SeccompProgram* seccomp = nullptr;  // borrowed; required
  Cgroup* cgroup = nullptr;      // borrowed; the box's cgroup, joined before any setup
  BoxRlimits rlimits;
  std::string hostname = "agentbox";
  int init_oom_score_adj = 100;  // the init's; commands get a higher one (see NsBackendOptions)
  std::uint64_t root_tmpfs_bytes = 1ull << 20;  // the root tmpfs holds only dirs and /etc files
  // false: step kRootReadOnly is left to the daemon (a pooled box, sandbox/ns_pool.h, whose
  // /etc identity files and mountpoints are written when it is bound to a session, before any
  // command runs; host_binds.h attach_session then makes "/" read-only exactly as this would).
  bool root_read_only = true;
  std::chrono::milliseconds start_timeout{10000};
};

class Box {
 public:
  // Blocking: returns once the init has said Hello. Errors name the failed step (and for the
  // filesystem, the failed mount operation). See the thread caveat above.
  [[nodiscard]] static Result<std::unique_ptr<Box>> create(const BoxSpec& spec);

  // Kills and reaps the init (and so the whole box) if still alive.
  ~Box();
  Box(const Box&) = delete;
  Box& operator=(const Box&) = delete;

  pid_t init_pid() const { return pid_; }  // as the host sees it
  int pidfd() const { return pidfd_.get(); }
  // The daemon's end of the control socket: SOCK_SEQPACKET, O_CLOEXEC, blocking, SO_PASSCRED set.
  int control_fd() const { return control_.get(); }

  // SIGKILL to the init (the kernel then kills the whole pid namespace) and reap it. Idempotent.
  // Returns the init's wait status (or the one seen by an earlier call).
  int kill_and_reap();

 private:
  Box(pid_t pid, UniqueFd pidfd, UniqueFd control)
      : pid_(pid), pidfd_(std::move(pidfd)), control_(std::move(control)) {}

  pid_t pid_;
  UniqueFd pidfd_;
  UniqueFd control_;
  int status_ = 0;
  bool reaped_ = false;
};

// ---- Talking to a box's init (init_protocol.h) ---------------------------------------------------

struct ExecCommand {
  std::uint64_t id = 0;
  std::vector<std::string> argv;  // argv[0] is looked up in the command's PATH
  std::vector<std::string> env;   // "K=V"
  std::string cwd;                // in-box path
  uid_t uid = 0;                  // never 0 (the init refuses)
  gid_t gid = 0;
  int oom_score_adj = 0;          // written for the command before it execs; 0 = inherit
  // > 0: the request carries this many cgroup `tasks` fds the child joins itself with
  // (initproto kExecSelfJoin) instead of the go pipe.
  std::uint32_t self_join_fds = 0;
  // stdin/stdout/stderr are one pty slave (sent three times) that becomes the controlling
  // terminal (initproto kExecPty); implies has_stdin.
  bool pty = false;
  std::uint32_t cpu_time_sec = 0;  // RLIMIT_CPU for the command (initproto); 0 = none
};

// The ExecRequest message for `cmd`. kTooBig past initproto::kMaxPayloadBytes; kInvalid for an
// empty argv or strings with NUL bytes.
[[nodiscard]] Result<std::string> encode_exec_request(const ExecCommand& cmd, bool has_stdin);

// One sendmsg of `msg` with `fds` attached (SCM_RIGHTS). Returns 0 or an errno (EAGAIN when
// `dont_wait` and the init's queue is full: nothing was sent).
int send_exec_request(int control_fd, std::string_view msg, const int* fds, int nfds,
                      bool dont_wait) noexcept;

// Asks the init to send `signo` to the leader of request `id` if it is still running (initproto
// Signal). Returns 0 or an errno (EAGAIN: the init's queue is full, nothing was sent).
int send_signal_request(int control_fd, std::uint64_t id, int signo) noexcept;

struct BoxMessage {
  initproto::MsgType type{};
  std::uint64_t id = 0;      // kChildReady, kExited
  int status = 0;            // kExited: wait status
  std::uint64_t cpu_usec = 0;  // kExited: CPU time of the leader (initproto Exited)
  pid_t box_pid = 0;         // kChildReady: the command's pid inside the box
  pid_t sender_pid = 0;      // the sender as the daemon sees it (SO_PASSCRED); 0 if unknown
  uid_t sender_uid = 0;
};

// One message from the box. Returns 1 (message in *out), 0 (EOF: the init is gone) or -1 with
// errno (EAGAIN when `dont_wait` and nothing is queued; EBADMSG for a malformed message, which
// is dropped). Fds sent along (never by a well-behaved init) are closed.
int recv_box_message(int control_fd, bool dont_wait, BoxMessage* out) noexcept;

}  // namespace agentbox::linux
