// SECURITY.md for an image root (API.md "Images"): a box whose "/" is an OCI image. The image
// is hostile input: its setuid-root binary must give nothing (the root is nosuid and commands
// run with no_new_privs; on disk the file is not even root's), and /proc and /sys are as on the
// host root (the box's own /proc with its read-only parts, no /sys of the host).

#include <sys/stat.h>

#include <filesystem>

#include "integration/api_test_util.h"
#include "support/registry.h"

namespace agentbox::testing {
namespace {

TEST(ImageRootEscape, SetuidBinariesOfTheImageGainNothingAndProcSysAreMasked) {
  LocalRegistry registry;
  TempDir dir("agentbox-t11");
  TestImage img;
  auto root = busybox_rootfs("t11");
  // The escape suite's probe (static), setuid root in the image.
  const std::string probe = slurp(AGENTBOX_PROBE);
  ASSERT_FALSE(probe.empty()) << AGENTBOX_PROBE;
  root.push_back(LayerEntry::file("bin/suid-probe", probe, 04755));
  root.push_back(LayerEntry::dir("sys"));
  root.push_back(LayerEntry::dir("proc"));
  img.layers.push_back(root);
  write_oci_layout(dir / "oci", img, "1");
  registry.push(dir / "oci", "1", "t11/suid:1");
  spit(dir / "config.yaml", "registries:\n  \"" + registry.host() + "\":\n    insecure: true\n");

  Daemon d({"--backend", "ns", "--config", dir / "config.yaml"});
  Api api(d);
  auto made = api.post("/v1/sessions", {{"id", "t11"}, {"image", registry.host() + "/t11/suid:1"}});
  ASSERT_EQ(made.status, 201) << made;
  const std::string uid = std::to_string(made.body.value("uid", 0));
  auto sh = [&](const std::string& cmd) {
    auto r = api.sh("t11", cmd);
    EXPECT_EQ(r.status, 200) << r;
    return r.body.value("stdout", "") + r.body.value("stderr", "");
  };
  // The bit is there and root owns the file, as the image says ...
  EXPECT_EQ(sh("stat -c %a:%u /bin/suid-probe"), "4755:0\n");
  // ... and running it changes nothing: not root, effectively either.
  EXPECT_EQ(sh("/bin/suid-probe setuid_file"), "euid=" + uid + "\n");
  // On disk the image's root-owned setuid file belongs to the layer id range, not to host root.
  bool found = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(d.data_dir() + "/images")) {
    if (e.path().filename() != "suid-probe") continue;
    struct stat st;
    ASSERT_EQ(::lstat(e.path().c_str(), &st), 0);
    EXPECT_NE(st.st_uid, 0u) << e.path();
    found = true;
  }
  EXPECT_TRUE(found);
  // /proc is the box's own (pid 1 is the box's init) with its sensitive parts read-only; no
  // host /sys.
  EXPECT_EQ(
      sh("(echo 1 > /proc/sys/kernel/core_pattern) 2>/dev/null && echo wrote || echo refused"),
      "refused\n");
  EXPECT_EQ(sh("ls /sys | wc -l"), "0\n");
  EXPECT_EQ(sh("test -r /proc/1/cmdline && echo own-proc"), "own-proc\n");
  EXPECT_EQ(api.del("/v1/sessions/t11").status, 200);
}

}  // namespace
}  // namespace agentbox::testing
