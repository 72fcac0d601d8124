// `agentbox doctor`'s conclusions (cli/doctor.h evaluate()) from made-up hosts: what a user is
// told is missing, the fix, and whether the exit code says the default backend cannot run.
// The real command on this host is tests/integration/doctor_test.cc.
#include "cli/doctor.h"

#include <gtest/gtest.h>

#include <fstream>

#include "support/support.h"

namespace agentbox::cli::doctor {
namespace {

// A host that can run everything.
HostFacts good_host() {
  HostFacts h;
  h.kernel_release = "6.1.0-13-amd64";
  h.kernel_major = 6;
  h.kernel_minor = 1;
  h.root = true;
  h.max_user_namespaces = 15000;
  h.clone3 = h.openat2 = h.mount_setattr = h.seccomp = h.overlayfs = true;
  h.cgroup2_root = "/sys/fs/cgroup";
  h.cgroup2_controllers = {"cpuset", "cpu", "io", "memory", "pids"};
  h.nft_path = "/usr/sbin/nft";
  h.nft_works = true;
  h.data_dir_exists = true;
  h.data_dir_checked = "/var/lib/agentbox";
  h.data_dir_writable = true;
  h.free_bytes = 50ull << 30;
  h.fs_type = "ext4";
  h.init_path = "/usr/bin/agentbox-init";
  h.init_ok = true;
  return h;
}

const Finding* find(const Report& r, const std::string& name) {
  for (const auto& f : r.findings) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

TEST(Doctor, GoodHostPassesAndSaysSo) {
  Report r = evaluate(Target{}, good_host(), std::nullopt, {});
  EXPECT_EQ(r.exit_code, 0);
  for (const auto& f : r.findings) EXPECT_EQ(f.level, Level::kOk) << f.name << ": " << f.detail;
  EXPECT_NE(format_report(r).find("this host can run agentboxd"), std::string::npos);
}

TEST(Doctor, OldKernelFailsWithTheFeatureAndTheFix) {
  HostFacts h = good_host();
  h.kernel_release = "5.2.0";
  h.kernel_major = 5;
  h.kernel_minor = 2;
  h.clone3 = h.openat2 = h.mount_setattr = false;
  Report r = evaluate(Target{}, h, std::nullopt, {});
  EXPECT_EQ(r.exit_code, 1);
  const Finding* c = find(r, "clone3");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->level, Level::kFail);
  EXPECT_NE(c->fix.find("5.3"), std::string::npos) << c->fix;
  EXPECT_EQ(find(r, "idmapped mounts")->level, Level::kWarn);
  std::string text = format_report(r);
  EXPECT_NE(text.find("FAIL  openat2"), std::string::npos) << text;
  EXPECT_NE(text.find("fix: upgrade"), std::string::npos) << text;
}

TEST(Doctor, TheHostBackendDoesNotNeedTheKernelFeatures) {
  HostFacts h = good_host();
  h.root = false;
  h.clone3 = h.seccomp = false;
  h.init_ok = false;
  Target t;
  t.backend = "host";
  Report r = evaluate(t, h, std::nullopt, {});
  EXPECT_EQ(r.exit_code, 0) << format_report(r);
  EXPECT_EQ(find(r, "privileges"), nullptr);
  EXPECT_EQ(find(r, "clone3")->level, Level::kFail);  // still reported
}

TEST(Doctor, NotRootFailsWithTheWaysOut) {
  HostFacts h = good_host();
  h.root = false;
  Report r = evaluate(Target{}, h, std::nullopt, {});
  EXPECT_EQ(r.exit_code, 1);
  const Finding* p = find(r, "privileges");
  ASSERT_TRUE(p);
  EXPECT_NE(p->fix.find("systemctl start agentboxd"), std::string::npos);
  EXPECT_NE(p->fix.find("--backend host"), std::string::npos);
}

TEST(Doctor, CgroupsV1HybridIsEnoughAndNoneIsNot) {
  HostFacts h = good_host();
  h.cgroup2_root = "/sys/fs/cgroup/unified";  // this machine's layout: empty v2, full v1
  h.cgroup2_controllers = {};
  h.cgroup1_controllers = {"memory", "cpu", "pids", "freezer"};
  Report r = evaluate(Target{}, h, std::nullopt, {});
  EXPECT_EQ(find(r, "cgroups")->level, Level::kOk);
  EXPECT_NE(find(r, "cgroups")->detail.find("v1"), std::string::npos);

  h.cgroup1_controllers = {"memory", "cpu"};
  h.cgroup2_root = "/sys/fs/cgroup";
  h.cgroup2_controllers = {"cpu", "memory"};
  r = evaluate(Target{}, h, std::nullopt, {});
  const Finding* c = find(r, "cgroups");
  EXPECT_EQ(c->level, Level::kFail);
  EXPECT_NE(c->detail.find("pids"), std::string::npos) << c->detail;
  EXPECT_NE(c->fix.find("cgroup2"), std::string::npos);
  EXPECT_EQ(r.exit_code, 1);
}

TEST(Doctor, CgroupV2InAContainersOwnNamespaceNeedsTheProcessesInALeaf) {
  HostFacts h = good_host();
  h.cgroup2_nested = true;  // cgroup.type exists: not the hierarchy's root
  h.cgroup2_root_procs = 3;
  h.cgroup2_subtree = {};
  Report r = evaluate(Target{}, h, std::nullopt, {});
  const Finding* d = find(r, "cgroup delegation");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->level, Level::kFail);
  EXPECT_NE(d->detail.find("no-internal-process"), std::string::npos) << d->detail;
  EXPECT_NE(d->fix.find("--cgroupns=host"), std::string::npos) << d->fix;
  EXPECT_EQ(r.exit_code, 1);

  // Once they are in a leaf and the controllers are handed down (the entrypoint ran), or at
  // the hierarchy's real root (exempt from the rule), all is well.
  h.cgroup2_subtree = {"cpu", "memory", "pids"};
  EXPECT_EQ(find(evaluate(Target{}, h, std::nullopt, {}), "cgroup delegation"), nullptr);
  h.cgroup2_subtree = {};
  h.cgroup2_nested = false;
  EXPECT_EQ(find(evaluate(Target{}, h, std::nullopt, {}), "cgroup delegation"), nullptr);
  // The host backend makes no cgroups: reported, not blocking.
  h.cgroup2_nested = true;
  Target host;
  host.backend = "host";
  EXPECT_EQ(evaluate(host, h, std::nullopt, {}).exit_code, 0);
}

TEST(Doctor, DataDirFileSystemAndSpace) {
  HostFacts h = good_host();
  h.fs_type = "overlayfs";  // e.g. a container's root without a volume
  Report r = evaluate(Target{}, h, std::nullopt, {});
  EXPECT_EQ(find(r, "data dir")->level, Level::kFail);
  EXPECT_NE(find(r, "data dir")->fix.find("volume"), std::string::npos);
  EXPECT_EQ(r.exit_code, 1);

  h = good_host();
  h.fs_type = "proc";  // --data-dir /proc/x
  r = evaluate(Target{}, h, std::nullopt, {});
  EXPECT_EQ(find(r, "data dir")->level, Level::kFail);
  EXPECT_NE(find(r, "data dir")->fix.find("on a disk"), std::string::npos);

  h = good_host();
  h.free_bytes = 1ull << 30;
  r = evaluate(Target{}, h, std::nullopt, {});
  EXPECT_EQ(find(r, "data dir")->level, Level::kWarn);
  EXPECT_EQ(r.exit_code, 0);

  h.free_bytes = 10ull << 20;
  r = evaluate(Target{}, h, std::nullopt, {});
  EXPECT_EQ(find(r, "data dir")->level, Level::kFail);
  EXPECT_EQ(r.exit_code, 1);
}

TEST(Doctor, MissingNftablesOnlyWarns) {
  HostFacts h = good_host();
  h.nft_path.clear();
  h.nft_works = false;
  Report r = evaluate(Target{}, h, std::nullopt, {});
  EXPECT_EQ(find(r, "nftables")->level, Level::kWarn);
  EXPECT_NE(find(r, "nftables")->fix.find("apt-get install nftables"), std::string::npos);
  EXPECT_EQ(r.exit_code, 0);
}

TEST(Doctor, DaemonAnswers) {
  HttpProbe down{"http://127.0.0.1:9090/readyz", 0, "", "connection refused"};
  Report r = evaluate(Target{}, good_host(), down, {});
  EXPECT_EQ(find(r, "daemon")->level, Level::kWarn);
  EXPECT_EQ(r.exit_code, 0);

  HttpProbe unusable{"http://127.0.0.1:9090/readyz", 503,
                     R"j({"error":{"code":"EUNAVAILABLE","message":"backend ns is not usable: )j"
                     R"j(clone3 (Linux 5.3+)"}})j",
                     ""};
  r = evaluate(Target{}, good_host(), unusable, {});
  EXPECT_EQ(find(r, "daemon")->level, Level::kFail);
  EXPECT_NE(find(r, "daemon")->detail.find("clone3"), std::string::npos);
  EXPECT_EQ(r.exit_code, 1);
}

TEST(Doctor, ClusterModeNeedsEveryEtcd) {
  Target t;
  t.etcd = {"http://10.0.0.1:2379", "http://10.0.0.2:2379"};
  std::vector<HttpProbe> etcd{{"http://10.0.0.1:2379/health", 200, R"({"health":"true"})", ""},
                              {"http://10.0.0.2:2379/health", 0, "", "timed out"}};
  Report r = evaluate(t, good_host(), std::nullopt, etcd);
  EXPECT_EQ(r.exit_code, 1);
  std::string text = format_report(r);
  EXPECT_NE(text.find("ok    etcd: http://10.0.0.1:2379/health: healthy"), std::string::npos)
      << text;
  EXPECT_NE(text.find("FAIL  etcd: http://10.0.0.2:2379/health: no answer"), std::string::npos)
      << text;
}

TEST(Doctor, ReadsTheDaemonsConfig) {
  Target t;
  auto err = load_target(std::string(AGENTBOX_SOURCE_TREE) + "/deploy/debian/agentboxd.yaml", &t);
  ASSERT_FALSE(err) << *err;
  EXPECT_EQ(t.data_dir, "/var/lib/agentbox");
  EXPECT_EQ(t.backend, "ns");
  EXPECT_EQ(server_of_listen(t.listen), "http://127.0.0.1:9090");
  EXPECT_TRUE(t.etcd.empty());

  agentbox::testing::TempDir dir("agentbox-doctor");
  std::ofstream(dir / "c.yaml") << "listen: 0.0.0.0:8080\ntokens: [tok]\n"
                                   "cluster:\n  etcd: http://a:2379,http://b:2379\n";
  Target c;
  ASSERT_FALSE(load_target(dir / "c.yaml", &c));
  EXPECT_EQ(server_of_listen(c.listen), "http://127.0.0.1:8080");
  EXPECT_EQ(c.token, "tok");
  EXPECT_EQ(c.etcd, (std::vector<std::string>{"http://a:2379", "http://b:2379"}));

  std::ofstream(dir / "bad.yaml") << "listen: [\n";
  Target b;
  auto bad = load_target(dir / "bad.yaml", &b);
  ASSERT_TRUE(bad);
  EXPECT_NE(bad->find("bad.yaml"), std::string::npos);
}

}  // namespace
}  // namespace agentbox::cli::doctor
