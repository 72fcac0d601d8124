// SECURITY.md T2: privileges and syscalls.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>

#include "security/box_fixture.h"

namespace agentbox::security {
namespace {

using ::testing::AnyOf;
using ::testing::StartsWith;

class SyscallTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { a_ = new Box(shared_daemon(), "t2-syscalls"); }
  static Box* a_;
};
Box* SyscallTest::a_;

// Refused: by seccomp (EPERM/ENOSYS), by the kernel for lack of privilege, or the probe was
// killed (SIGSYS). Anything but ALLOWED.
MATCHER(Refused, "") { return arg.rfind("DENIED", 0) == 0 || arg.rfind("KILLED", 0) == 0; }

TEST_F(SyscallTest, SetuidBinaryInTheWorkspaceDoesNotGainRoot) {
  // A setuid-root copy planted from the host: nosuid on /workspace and no_new_privs.
  std::string p = a_->workspace_host() + "/suid-probe";
  std::filesystem::copy_file(AGENTBOX_PROBE, p, std::filesystem::copy_options::overwrite_existing);
  ASSERT_EQ(chown(p.c_str(), 0, 0), 0);
  ASSERT_EQ(chmod(p.c_str(), 04755), 0);
  auto r = a_->exec({"/workspace/suid-probe", "setuid_file"});
  EXPECT_EQ(r.value("stdout", ""), "euid=" + std::to_string(a_->uid()) + "\n") << r.dump();
}

TEST_F(SyscallTest, SetuidSetgroupsAndRawSocketsFail) {
  EXPECT_EQ(a_->probe("setuid0"), "DENIED EPERM");
  EXPECT_EQ(a_->probe("setgroups"), "DENIED EPERM");
  EXPECT_EQ(a_->probe("raw_socket"), "DENIED EPERM");
}

TEST_F(SyscallTest, NewNamespacesAndMountApiAreDenied) {
  for (int flag : {CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWIPC,
                   CLONE_NEWUTS, CLONE_NEWCGROUP, 0x80 /* CLONE_NEWTIME */}) {
    EXPECT_THAT(a_->probe("unshare", {std::to_string(flag)}), Refused()) << "unshare " << flag;
  }
  EXPECT_THAT(a_->probe("clone_newuser"), Refused());
  EXPECT_EQ(a_->probe("clone3"), "DENIED ENOSYS");  // so libc falls back to clone(2)
  EXPECT_THAT(a_->probe("setns"), Refused());
  EXPECT_THAT(a_->probe("mount"), Refused());
  EXPECT_THAT(a_->probe("umount"), Refused());
  EXPECT_THAT(a_->probe("pivot_root"), Refused());
  EXPECT_THAT(a_->probe("chroot"), Refused());
  for (long nr : {SYS_open_tree, SYS_move_mount, SYS_fsopen, SYS_fsconfig, SYS_fsmount,
                  SYS_fspick, SYS_mount_setattr}) {
    EXPECT_THAT(a_->probe("syscall", {std::to_string(nr)}), Refused()) << "syscall " << nr;
  }
}

TEST_F(SyscallTest, KernelAttackSurfaceIsDenied) {
  EXPECT_THAT(a_->probe("keyctl"), Refused());
  EXPECT_THAT(a_->probe("add_key"), Refused());
  EXPECT_THAT(a_->probe("syscall", {std::to_string(SYS_request_key)}), Refused());
  EXPECT_THAT(a_->probe("bpf"), Refused());
  EXPECT_THAT(a_->probe("perf_event_open"), Refused());
  EXPECT_THAT(a_->probe("userfaultfd"), Refused());
  EXPECT_THAT(a_->probe("io_uring_setup"), Refused());
  for (long nr : {SYS_io_uring_enter, SYS_io_uring_register}) {
    EXPECT_THAT(a_->probe("syscall", {std::to_string(nr)}), Refused()) << nr;
  }
}

TEST_F(SyscallTest, AdministrativeSyscallsAreDeniedEvenWithBadPointers) {
  for (long nr : {SYS_init_module, SYS_finit_module, SYS_delete_module, SYS_kexec_load,
                  SYS_kexec_file_load, SYS_reboot, SYS_swapon, SYS_swapoff, SYS_syslog, SYS_acct,
                  SYS_quotactl, SYS_iopl, SYS_ioperm, SYS_open_by_handle_at,
                  SYS_name_to_handle_at, SYS_kcmp, SYS_pidfd_getfd}) {
    EXPECT_THAT(a_->probe("syscall", {std::to_string(nr)}), Refused()) << "syscall " << nr;
  }
}

TEST_F(SyscallTest, ForeignAbisAreBlocked) {
  EXPECT_THAT(a_->probe("int80"), Refused());
  EXPECT_THAT(a_->probe("x32"), Refused());
}

TEST_F(SyscallTest, OnlyUnixAndInetSocketFamilies) {
  EXPECT_EQ(a_->probe("socket", {"1"}), "ALLOWED");   // AF_UNIX
  EXPECT_EQ(a_->probe("socket", {"2"}), "ALLOWED");   // AF_INET
  EXPECT_EQ(a_->probe("socket", {"10"}), "ALLOWED");  // AF_INET6
  for (int fam : {16 /*NETLINK*/, 17 /*PACKET*/, 15 /*KEY*/, 38 /*ALG*/, 40 /*VSOCK*/,
                  31 /*BLUETOOTH*/, 4 /*IPX*/, 5 /*APPLETALK*/}) {
    EXPECT_THAT(a_->probe("socket", {std::to_string(fam)}), Refused()) << "family " << fam;
  }
}

}  // namespace
}  // namespace agentbox::security
