#pragma once
// The wire between agentboxd (ns backend, linux/box.h, sandbox/ns_backend.cc) and agentbox-init
// (linux/init/), the pid 1 of every box.
//
// Transport: one AF_UNIX SOCK_SEQPACKET socketpair per box. The init inherits its end at
// kControlFd. SEQPACKET keeps message boundaries and makes every send atomic, so the init and
// the command children it forks may all write to the same socket without framing or locks.
// Both ends run on the same machine from the same build, so messages are plain structs in host
// byte order; every message starts with a MsgType and the version is checked once, in Hello.
//
// Conversation:
//   daemon -> box child   kGo            the box child is in its cgroup; go on with the setup
//   box child -> daemon   SetupError     a setup step failed (the child then _exit(127)s)
//   init -> daemon        Hello          the box is up (setup done, init exec'd)
//   daemon -> init        ExecRequest    + SCM_RIGHTS [stdin?] stdout stderr go
//   command -> daemon     ChildReady     sent by the forked command child itself, BEFORE it execs:
//                                        the daemon's end has SO_PASSCRED, so the kernel attaches
//                                        the sender's pid translated into the daemon's pid
//                                        namespace (the host pid). The daemon moves that pid into
//                                        the exec's cgroup, then writes one byte into the "go"
//                                        pipe; the child blocks on that pipe until then, so
//                                        nothing it starts can escape the per-exec cgroup.
//   init -> daemon        Exited         the command's leader was reaped (wait status)
//   daemon -> init        Signal         send a signal to a running command's leader (by request
//                                        id). The init is the only one that knows, race-free,
//                                        whether that pid is still the command's: it has not
//                                        reaped it yet. An id it does not know (ended) is ignored.
//
// pty (kExecPty): the daemon opens a pty in the box's own devpts (/dev/pts of the box, through
// the box root) and sends its slave as stdin, stdout and stderr; the child makes it its
// controlling terminal (setsid + TIOCSCTTY) before it execs.
//
// Self-join (kExecSelfJoin, cgroup v1): instead of the go pipe the request carries the exec
// cgroup's `tasks` files, opened for writing by the daemon. The forked child writes "0" (itself)
// into each, then sends ChildReady and execs without waiting. Moving oneself as a single thread
// skips the kernel's global cgroup_threadgroup_rwsem, whose write side waits for an RCU grace
// period (~10 ms measured here) when the daemon moves a whole process by pid. Permission is the
// opener's (the daemon, root). The child aborts (exit 127) if any write fails: a command never
// runs outside its exec cgroup. A ChildReady that arrives after kill_tree() makes the daemon
// kill the cgroup again, so a kill racing the start still reaches the command.
//
// Background processes a command leaves behind are reparented to the init and reaped silently.
// When the daemon's end closes, the init exits, and with pid 1 gone the kernel kills the whole
// box.

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace agentbox::linux::initproto {

inline constexpr std::uint32_t kVersion = 4;

// The init's end of the control socket. The init's exec'd argv[0] is kInitName.
inline constexpr int kControlFd = 3;
inline constexpr char kInitName[] = "agentbox-init";

// argv + env + cwd of one request, NUL-terminated strings back to back. Linux caps one argv or
// env string at 128 KiB (MAX_ARG_STRLEN) and all of them at ~2 MiB; this is our own cap.
inline constexpr std::size_t kMaxPayloadBytes = 512 * 1024;
inline constexpr std::size_t kMaxStrings = 16384;

enum class MsgType : std::uint32_t {
  kGo = 1,
  kSetupError = 2,
  kHello = 3,
  kExecRequest = 4,
  kChildReady = 5,
  kExited = 6,
  kSignal = 7,
};

struct Go {
  MsgType type = MsgType::kGo;
};

struct SetupError {
  MsgType type = MsgType::kSetupError;
  std::uint32_t step = 0;     // box.cc's Step
  std::uint32_t detail = 0;   // e.g. the index of the failing mount operation
  std::int32_t err = 0;       // errno
};

struct Hello {
  MsgType type = MsgType::kHello;
  std::uint32_t version = kVersion;
};

inline constexpr std::uint32_t kExecHasStdin = 1u << 0;  // fds: stdin stdout stderr go
// fds: [stdin] stdout stderr, then join_fds cgroup `tasks` files instead of the go pipe.
inline constexpr std::uint32_t kExecSelfJoin = 1u << 1;
inline constexpr std::uint32_t kMaxJoinFds = 4;  // one per v1 hierarchy the box uses
// stdin, stdout and stderr (all three sent, kExecHasStdin set too) are a pty slave that becomes
// the command's controlling terminal.
inline constexpr std::uint32_t kExecPty = 1u << 2;

struct ExecRequest {
  MsgType type = MsgType::kExecRequest;
  std::uint32_t flags = 0;
  std::uint64_t id = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::int32_t oom_score_adj = 0;
  std::uint32_t argc = 0;  // >= 1
  std::uint32_t envc = 0;
  std::uint32_t payload_bytes = 0;
  std::uint32_t join_fds = 0;  // with kExecSelfJoin: how many `tasks` fds follow stdio
  // RLIMIT_CPU of the command (API.md limits.cpu_time_sec): SIGXCPU at this many CPU seconds,
  // SIGKILL one second later (linux/rlimits.h apply_cpu_time_limit). 0 = no limit.
  std::uint32_t cpu_time_sec = 0;
  // Followed by payload_bytes: argc argv strings, envc "K=V" strings, then the cwd, each
  // NUL-terminated.
};

struct ChildReady {
  MsgType type = MsgType::kChildReady;
  std::int32_t box_pid = 0;  // the command's pid inside the box (informational)
  std::uint64_t id = 0;
};

struct Exited {
  MsgType type = MsgType::kExited;
  std::int32_t status = 0;  // wait(2) status
  std::uint64_t id = 0;
  // User + system CPU time of the leader (and of the children it waited for), from wait4(2):
  // tells a SIGKILL at the RLIMIT_CPU hard limit from any other SIGKILL.
  std::uint64_t cpu_usec = 0;
};

struct Signal {
  MsgType type = MsgType::kSignal;
  std::int32_t signo = 0;
  std::uint64_t id = 0;  // the ExecRequest's
};

// Fds per ExecRequest: stdin (optional; without one the command gets /dev/null), stdout,
// stderr, then the go pipe or up to kMaxJoinFds cgroup files.
inline constexpr int kMaxExecFds = 3 + static_cast<int>(kMaxJoinFds);

template <typename T>
inline constexpr bool kWireSafe = std::is_standard_layout_v<T> && std::is_trivially_copyable_v<T>;
static_assert(kWireSafe<Go> && kWireSafe<SetupError> && kWireSafe<Hello> &&
              kWireSafe<ExecRequest> && kWireSafe<ChildReady> && kWireSafe<Exited> && kWireSafe<Signal>);

}  // namespace agentbox::linux::initproto
