// agentbox-probe: the attacker. Copied into a box's workspace and run there by the security suite
// (tests/security/), one attack per invocation. Each attack prints one line:
//   "ALLOWED"            the kernel let it through (an escape, for anything the suite forbids)
//   "DENIED <ERRNO>"     refused, with the errno name
// and exits 0, so the test asserts on the exact outcome. Killed by SIGSYS = refused by seccomp.
// Deliberately C and statically linked: it must run in a box that sees only the host's /usr.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/bpf.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

static int report(long rc) {
  if (rc >= 0) {
    printf("ALLOWED\n");
  } else {
    printf("DENIED %s\n", strerrorname_np(errno) ? strerrorname_np(errno) : "?");
  }
  return 0;
}

// A syscall with junk arguments: if the filter lets it through, the kernel fails it with EFAULT or
// EINVAL and nothing happens; if the filter denies it, we see EPERM/ENOSYS.
static int raw(long nr) {
  long rc = syscall(nr, (long)-1, (long)-1, (long)-1, (long)-1, (long)-1, (long)-1);
  if (rc < 0 && (errno == EFAULT || errno == EINVAL || errno == EBADF || errno == ENOENT ||
                 errno == ESRCH)) {
    printf("ALLOWED %s\n", strerrorname_np(errno));  // reached the kernel's own checks
    return 0;
  }
  return report(rc);
}

static int open_pty(void) {
  int m = posix_openpt(O_RDWR | O_NOCTTY);
  if (m < 0) return -1;
  grantpt(m);
  unlockpt(m);
  return open(ptsname(m), O_RDWR | O_NOCTTY);
}

static int flood(long bytes) {
  static char buf[65536];
  memset(buf, 'x', sizeof buf);
  while (bytes > 0) {
    ssize_t n = write(1, buf, bytes < (long)sizeof buf ? (size_t)bytes : sizeof buf);
    if (n <= 0) return 1;
    bytes -= n;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: agentbox-probe ATTACK [ARGS]\n");
    return 2;
  }
  const char* a = argv[1];
  const char* arg = argc > 2 ? argv[2] : "";
  setvbuf(stdout, NULL, _IONBF, 0);

  // --- T1 processes, namespaces, terminal
  if (!strcmp(a, "kill")) return report(kill(atoi(arg), 0));
  if (!strcmp(a, "ptrace")) return report(syscall(SYS_ptrace, PTRACE_ATTACH, atoi(arg), 0, 0));
  if (!strcmp(a, "process_vm_writev")) {
    char b[8] = {0};
    struct iovec l = {b, sizeof b}, r = {(void*)0x400000, sizeof b};
    return report(process_vm_writev(atoi(arg), &l, 1, &r, 1, 0));
  }
  if (!strcmp(a, "proc_mem_write")) return report(open("/proc/1/mem", O_RDWR));
  if (!strcmp(a, "tiocsti") || !strcmp(a, "tiocsti_high") || !strcmp(a, "tioclinux")) {
    int fd = open_pty();
    if (fd < 0) {
      printf("NOPTY %s\n", strerrorname_np(errno));
      return 0;
    }
    char c = 'x';
    unsigned long cmd = !strcmp(a, "tioclinux") ? TIOCLINUX : TIOCSTI;
    if (!strcmp(a, "tiocsti_high")) cmd |= 0x100000000UL;  // CVE-2019-10063: only low 32 bits count
    return report(syscall(SYS_ioctl, fd, cmd, &c));
  }
  if (!strcmp(a, "sethostname")) return report(sethostname("evil", 4));
  if (!strcmp(a, "abstract_connect")) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(arg);
    memcpy(sa.sun_path + 1, arg, n);  // leading NUL: abstract namespace
    return report(connect(s, (struct sockaddr*)&sa, (socklen_t)(sizeof(sa_family_t) + 1 + n)));
  }
  if (!strcmp(a, "orphan")) {
    // setsid + double fork + ignore SIGTERM: the classic way to outlive a timeout.
    if (fork() == 0) {
      setsid();
      if (fork() == 0) {
        signal(SIGTERM, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        FILE* f = fopen(arg, "w");
        if (f) fprintf(f, "%d\n", getpid()), fclose(f);
        for (;;) pause();
      }
      _exit(0);
    }
    wait(NULL);
    for (;;) pause();  // the leader hangs too, so the exec times out
  }
  if (!strcmp(a, "kill_all")) return report(kill(-1, SIGKILL));
  if (!strcmp(a, "cgroup_procs_write")) {
    int fd = open(arg, O_WRONLY);
    if (fd < 0) return report(-1);
    return report(write(fd, "1", 1));
  }

  // --- T6 network: "connect ADDR PORT" (TCP, IPv4) and "udp ADDR PORT" (one datagram)
  if (!strcmp(a, "connect") || !strcmp(a, "udp")) {
    const int udp = !strcmp(a, "udp");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
    if (inet_pton(AF_INET, arg, &sa.sin_addr) != 1) {
      printf("BADADDR\n");
      return 0;
    }
    int s = socket(AF_INET, (udp ? SOCK_DGRAM : SOCK_STREAM) | SOCK_CLOEXEC, 0);
    if (s < 0) return report(-1);
    if (udp) return report(sendto(s, "x", 1, 0, (struct sockaddr*)&sa, sizeof sa));
    return report(connect(s, (struct sockaddr*)&sa, sizeof sa));
  }

  // --- T2 privileges and syscalls
  if (!strcmp(a, "setuid0")) return report(setuid(0));
  if (!strcmp(a, "setgroups")) {
    gid_t g = 0;
    return report(setgroups(1, &g));
  }
  if (!strcmp(a, "raw_socket")) return report(socket(AF_INET, SOCK_RAW, IPPROTO_ICMP));
  if (!strcmp(a, "socket")) return report(socket(atoi(arg), SOCK_DGRAM, 0));
  if (!strcmp(a, "socket_stream")) return report(socket(atoi(arg), SOCK_STREAM, 0));
  if (!strcmp(a, "unshare")) return report(unshare((int)strtol(arg, NULL, 0)));
  if (!strcmp(a, "clone_newuser")) {
    // Raw clone with CLONE_NEWUSER: a child that exists would _exit at once.
    long rc = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
    if (rc == 0) _exit(0);
    if (rc > 0) waitpid((pid_t)rc, NULL, 0);
    return report(rc);
  }
  if (!strcmp(a, "clone3")) return report(syscall(SYS_clone3, NULL, 0));
  if (!strcmp(a, "setns")) return report(setns(open("/proc/1/ns/mnt", O_RDONLY), 0));
  if (!strcmp(a, "mount")) return report(mount("none", "/tmp", "tmpfs", 0, NULL));
  if (!strcmp(a, "mount_cgroup")) {
    mkdir("/tmp/cg", 0700);
    return report(mount("cgroup", "/tmp/cg", "cgroup", 0, "memory"));
  }
  if (!strcmp(a, "umount")) return report(umount2("/workspace", MNT_DETACH));
  if (!strcmp(a, "pivot_root")) return report(syscall(SYS_pivot_root, "/tmp", "/tmp"));
  if (!strcmp(a, "chroot")) return report(chroot("/tmp"));
  if (!strcmp(a, "syscall")) return raw(strtol(arg, NULL, 0));
  if (!strcmp(a, "keyctl")) return report(syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, -3, 0));
  if (!strcmp(a, "add_key")) return report(syscall(SYS_add_key, "user", "x", "y", 1, -3));
  if (!strcmp(a, "bpf")) {
    union bpf_attr at;
    memset(&at, 0, sizeof at);
    return report(syscall(SYS_bpf, BPF_PROG_LOAD, &at, sizeof at));
  }
  if (!strcmp(a, "perf_event_open")) {
    struct perf_event_attr pa;
    memset(&pa, 0, sizeof pa);
    pa.size = sizeof pa;
    pa.type = PERF_TYPE_SOFTWARE;
    pa.config = PERF_COUNT_SW_CPU_CLOCK;
    return report(syscall(SYS_perf_event_open, &pa, 0, -1, -1, 0));
  }
  if (!strcmp(a, "userfaultfd")) return report(syscall(SYS_userfaultfd, 0));
  if (!strcmp(a, "io_uring_setup")) {
    char params[120];
    memset(params, 0, sizeof params);
    return report(syscall(SYS_io_uring_setup, 1, params));
  }
  if (!strcmp(a, "int80")) {
    // i386 ABI: getuid (24) through int $0x80. Allowed would return our uid.
    long rc;
    __asm__ volatile("int $0x80" : "=a"(rc) : "a"(24L) : "memory");
    if (rc >= 0) {
      printf("ALLOWED\n");
    } else {
      errno = (int)-rc;
      report(-1);
    }
    return 0;
  }
  if (!strcmp(a, "x32")) {
    // x32 ABI: the native number with bit 30 set (getuid).
    return report(syscall(0x40000000L | SYS_getuid));
  }

  // --- T3 filesystem
  if (!strcmp(a, "write")) {
    int fd = open(arg, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return report(-1);
    return report(write(fd, "pwned\n", 6));
  }
  if (!strcmp(a, "read")) {
    int fd = open(arg, O_RDONLY);
    if (fd < 0) return report(-1);
    char b[16];
    return report(read(fd, b, sizeof b));
  }
  if (!strcmp(a, "link")) return report(link(arg, argv[3]));
  if (!strcmp(a, "mknod")) return report(mknod(arg, S_IFCHR | 0666, makedev(1, 3)));
  if (!strcmp(a, "setuid_file")) {
    // The suite makes a setuid-root copy of this probe from the host; inside it must not gain root.
    printf("euid=%d\n", (int)geteuid());
    return 0;
  }

  // --- T4 resource exhaustion
  if (!strcmp(a, "alloc")) {
    long mb = atol(arg);
    for (long i = 0; i < mb; ++i) {
      char* p = malloc(1 << 20);
      if (!p) return report(-1);
      memset(p, 1, 1 << 20);
    }
    printf("ALLOCATED\n");
    return 0;
  }
  if (!strcmp(a, "fork_bomb")) {
    int made = 0, failed_errno = 0;
    for (int i = 0; i < 100000; ++i) {
      pid_t p = fork();
      if (p == 0) {
        pause();
        _exit(0);
      }
      if (p < 0) {
        failed_errno = errno;
        break;
      }
      ++made;
    }
    printf("FORKED %d %s\n", made, failed_errno ? strerrorname_np(failed_errno) : "none");
    fflush(stdout);  // stdout is a pipe: flush before the group signal below
    signal(SIGTERM, SIG_IGN);  // the children (forked before this) keep the default: they die
    kill(0, SIGTERM);
    return 0;
  }
  if (!strcmp(a, "fds")) {
    int n = 0;
    while (open("/dev/null", O_RDONLY) >= 0) ++n;
    printf("OPENED %d %s\n", n, strerrorname_np(errno));
    return 0;
  }
  if (!strcmp(a, "fsize")) {
    signal(SIGXFSZ, SIG_IGN);
    int fd = open(arg, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return report(-1);
    static char buf[1 << 20];
    for (long i = 0; i < atol(argv[3]); ++i) {
      if (write(fd, buf, sizeof buf) < 0) return report(-1);
    }
    printf("ALLOWED\n");
    return 0;
  }
  if (!strcmp(a, "files")) {
    long n = 0;
    char name[64];
    for (;; ++n) {
      snprintf(name, sizeof name, "%s/f%ld", arg, n);
      int fd = open(name, O_WRONLY | O_CREAT, 0644);
      if (fd < 0) break;
      close(fd);
    }
    printf("CREATED %ld %s\n", n, strerrorname_np(errno));
    return 0;
  }
  if (!strcmp(a, "flood")) return flood(atol(arg));
  if (!strcmp(a, "core")) {
    struct rlimit r;
    getrlimit(RLIMIT_CORE, &r);
    printf("core_limit=%ld\n", (long)r.rlim_cur);
    fflush(stdout);
    abort();
  }

  fprintf(stderr, "agentbox-probe: unknown attack %s\n", a);
  return 2;
}
