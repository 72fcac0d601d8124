// Preparing host binds in the daemon (linux/host_binds.h, linux/idmap.h): the checks and the
// errors a user sees before any box is touched. Runs as root; never skips.
#include "linux/host_binds.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "linux/idmap.h"
#include "support/support.h"

namespace agentbox::linux {
namespace {

constexpr uid_t kUid = 61235;

TEST(HostBinds, ReadWriteOfAForeignDirIsIdmappedAndReadOnlyIsNot) {
  testing::TempDir dir("agentbox-hostbinds");
  auto rw = prepare_bind({dir.path(), "/data/x", false, "mounts[0]"}, kUid, kUid);
  ASSERT_TRUE(rw) << rw.error().message;
  EXPECT_TRUE(rw->idmapped);
  EXPECT_TRUE(rw->is_dir);
  EXPECT_TRUE(rw->tree.valid());
  auto ro = prepare_bind({dir.path(), "/data/x", true}, kUid, kUid);
  ASSERT_TRUE(ro) << ro.error().message;
  EXPECT_FALSE(ro->idmapped);
  // A dir the session user owns already needs no idmap.
  ASSERT_EQ(::chown(dir.path().c_str(), kUid, kUid), 0);
  auto own = prepare_bind({dir.path(), "/data/x", false}, kUid, kUid);
  ASSERT_TRUE(own) << own.error().message;
  EXPECT_FALSE(own->idmapped);
}

TEST(HostBinds, AFilesystemWithoutIdmapSupportIsAClearErrorNotAReadOnlyMount) {
  // sysfs cannot be idmapped: a rw bind fails naming the bind, the filesystem and the ways out.
  auto rw = prepare_bind({"/sys/kernel", "/data/k", false, "skills.k"}, kUid, kUid);
  ASSERT_FALSE(rw);
  EXPECT_EQ(rw.error().code, Code::kInvalid);
  const std::string& m = rw.error().message;
  EXPECT_NE(m.find("skills.k"), std::string::npos) << m;
  EXPECT_NE(m.find("sysfs"), std::string::npos) << m;
  EXPECT_NE(m.find("idmapped"), std::string::npos) << m;
  EXPECT_NE(m.find("\"ro\""), std::string::npos) << m;
}

TEST(HostBinds, BadBindsNameThemselves) {
  auto missing = prepare_bind({"/no/such/dir", "/data/x", true, "mounts[2]"}, kUid, kUid);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Code::kNotFound);
  EXPECT_NE(missing.error().message.find("mounts[2]"), std::string::npos);
  auto system = prepare_bind({"/usr", "/etc/x", true, "mounts[0].mount_path"}, kUid, kUid);
  ASSERT_FALSE(system);
  EXPECT_EQ(system.error().code, Code::kInvalid);
  EXPECT_NE(system.error().message.find("mounts[0].mount_path"), std::string::npos);
  auto relative = prepare_bind({"usr", "/data/x", true}, kUid, kUid);
  ASSERT_FALSE(relative);
  EXPECT_EQ(relative.error().code, Code::kInvalid);
}

TEST(Idmap, TheNamespaceMapsExactlyTheOwnerToTheSessionUser) {
  auto ns = make_idmap_userns({1000, 1001, kUid, kUid + 1});
  ASSERT_TRUE(ns) << ns.error().message;
  // The helper child is gone (reaped): only the fd keeps the namespace.
  const std::string link = "/proc/self/fd/" + std::to_string(ns->get());
  char buf[64] = {};
  ASSERT_GT(::readlink(link.c_str(), buf, sizeof buf - 1), 0);
  EXPECT_EQ(std::string(buf).rfind("user:[", 0), 0u) << buf;
}

}  // namespace
}  // namespace agentbox::linux
