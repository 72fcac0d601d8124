#include "server/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "support/support.h"

namespace agentbox::server {
namespace {

ParseOutcome parse(std::vector<std::string> args, std::string* err_text = nullptr) {
  args.insert(args.begin(), "agentboxd");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  auto r = parse_daemon_args(static_cast<int>(argv.size()), argv.data(), out, err);
  if (err_text) *err_text = err.str() + out.str();
  return r;
}

TEST(Config, Defaults) {
  auto r = parse({});
  ASSERT_TRUE(r.config);
  EXPECT_EQ(r.config->listen, "127.0.0.1:9090");
  EXPECT_EQ(r.config->data_dir, "./.agentbox");
  EXPECT_EQ(r.config->backend, "ns");  // isolated unless the operator says otherwise
  EXPECT_EQ(r.config->max_file_mb, 500u);
  EXPECT_TRUE(r.config->tokens.empty());
  EXPECT_TRUE(validate_config(*r.config).has_value());
}

TEST(Config, FlagsAndRepeatableTokens) {
  auto r = parse({"--listen", "127.0.0.1:0", "--token", "a", "--token", "b", "--shared-dirs",
                  "tpl:/srv/tpl,docs/:/srv/docs", "--max-file-mb", "7", "--ready-file", "/tmp/r",
                  "--backend", "host", "--backend", "ns"});
  ASSERT_TRUE(r.config);
  EXPECT_EQ(r.config->tokens, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(r.config->shared_dirs.size(), 2u);
  EXPECT_EQ(r.config->shared_dirs[1].prefix, "docs");
  EXPECT_EQ(r.config->shared_dirs[1].host_path, "/srv/docs");
  EXPECT_EQ(r.config->max_file_mb, 7u);
  EXPECT_EQ(r.config->ready_file, "/tmp/r");
  EXPECT_EQ(r.config->backend, "ns");  // the last one wins
}

TEST(Config, BadFlagsExitNonZero) {
  std::string err;
  EXPECT_FALSE(parse({"--bogus"}, &err).config);
  EXPECT_NE(parse({"--bogus"}).exit_code, 0);
  auto bad_shared = parse({"--shared-dirs", "nocolon"}, &err);
  EXPECT_FALSE(bad_shared.config);
  EXPECT_EQ(bad_shared.exit_code, 2);
  EXPECT_NE(err.find("prefix:"), std::string::npos) << err;
  auto help = parse({"--help"}, &err);
  EXPECT_FALSE(help.config);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(err.find("--listen"), std::string::npos);
}

// The help reads as the defaults are: persistence is on unless --no-persist.
TEST(Config, PersistIsOnByDefaultAndTheHelpSaysSo) {
  EXPECT_TRUE(parse({}).config->persist);
  EXPECT_FALSE(parse({"--no-persist"}).config->persist);
  EXPECT_TRUE(parse({"--persist"}).config->persist);
  EXPECT_FALSE(parse({"--persist", "--no-persist"}).config);
  std::string help;
  parse({"--help"}, &help);
  EXPECT_EQ(help.find("{false}"), std::string::npos) << help;
  EXPECT_NE(help.find("on by default"), std::string::npos) << help;
  EXPECT_NE(help.find("--no-persist"), std::string::npos) << help;
}

TEST(Config, GlobalSkillsAndAgentsDirsMustBeExistingDirs) {
  auto r = parse({"--global-skills-dir", "/usr", "--agents-dir", "/usr/share"});
  ASSERT_TRUE(r.config);
  EXPECT_EQ(r.config->global_skills_dir, "/usr");
  EXPECT_EQ(r.config->agents_dir, "/usr/share");
  std::string err;
  auto missing = parse({"--global-skills-dir", "/no/such/dir"}, &err);
  EXPECT_FALSE(missing.config);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(err.find("global_skills_dir"), std::string::npos) << err;
  auto relative = parse({"--agents-dir", "usr"}, &err);
  EXPECT_EQ(relative.exit_code, 2);
  EXPECT_NE(err.find("agents_dir"), std::string::npos) << err;
}

// TLS to etcd: https:// endpoints take a CA file and a client certificate with its key; the
// files must be readable, the certificate and key go together, and none is taken with http://.
TEST(Config, EtcdTlsFilesAreCheckedAndOnlyWithHttps) {
  agentbox::testing::TempDir dir("agentbox-config-tls");
  for (const char* f : {"ca.pem", "c.pem", "c.key", "secret"})
    agentbox::testing::spit(dir / f, "x\n");
  const std::vector<std::string> cluster = {"--cluster-etcd",        "https://127.0.0.1:2379",
                                            "--advertise-url",       "http://127.0.0.1:9090",
                                            "--cluster-secret-file", dir / "secret"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = cluster;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  auto good = parse(with({"--cluster-etcd-ca", dir / "ca.pem", "--cluster-etcd-cert", dir / "c.pem",
                          "--cluster-etcd-key", dir / "c.key"}));
  ASSERT_TRUE(good.config);
  EXPECT_EQ(good.config->cluster.etcd_ca_file, dir / "ca.pem");
  EXPECT_EQ(good.config->cluster.etcd_cert_file, dir / "c.pem");
  EXPECT_EQ(good.config->cluster.etcd_key_file, dir / "c.key");
  EXPECT_TRUE(validate_config(*good.config).has_value());
  // The system's CAs when none is named.
  auto system_ca = parse(cluster);
  ASSERT_TRUE(system_ca.config);
  EXPECT_TRUE(validate_config(*system_ca.config).has_value());

  struct Case {
    std::vector<std::string> args;
    std::string says;
  } bad[] = {
      {with({"--cluster-etcd-ca", dir / "missing.pem"}), "cluster.etcd_ca_file"},
      {with({"--cluster-etcd-cert", dir / "c.pem"}), "go together"},
      {{"--cluster-etcd", "http://127.0.0.1:2379", "--advertise-url", "http://127.0.0.1:9090",
        "--cluster-secret-file", dir / "secret", "--cluster-etcd-ca", dir / "ca.pem"},
       "endpoints are http://"},
      {{"--cluster-etcd", "https://127.0.0.1:2379", "--advertise-url", "https://127.0.0.1:9090",
        "--cluster-secret-file", dir / "secret"},
       "cluster.advertise"},
  };
  for (const auto& c : bad) {
    auto r = parse(c.args);
    ASSERT_TRUE(r.config);
    auto st = validate_config(*r.config);
    ASSERT_FALSE(st.has_value()) << c.says;
    EXPECT_NE(st.error().message.find(c.says), std::string::npos) << st.error().message;
  }
}

TEST(Config, YamlFileWithFlagsOverriding) {
  char path[] = "/tmp/agentbox-config-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << "listen: 127.0.0.1:7000\ndata_dir: /var/lib/x\nbackend: host\n"
                         "tokens: [t1, t2]\nshared_dirs: {tpl: /srv/tpl}\nmax_file_mb: 3\n"
                         "log_level: warn\nallowed_mount_roots: [/srv]\n";
  auto r = parse({"--config", path, "--listen", "127.0.0.1:0", "--token", "flag"});
  ASSERT_TRUE(r.config);
  EXPECT_EQ(r.config->listen, "127.0.0.1:0");
  EXPECT_EQ(r.config->tokens, std::vector<std::string>{"flag"});
  EXPECT_EQ(r.config->data_dir, "/var/lib/x");
  EXPECT_EQ(r.config->max_file_mb, 3u);
  EXPECT_EQ(r.config->log_level, "warn");
  ASSERT_EQ(r.config->shared_dirs.size(), 1u);
  EXPECT_EQ(r.config->shared_dirs[0].prefix, "tpl");
  EXPECT_EQ(r.config->allowed_mount_roots, std::vector<std::string>{"/srv"});

  std::ofstream(path) << "max_file_mb: lots\n";
  std::string err;
  auto bad = parse({"--config", path}, &err);
  EXPECT_FALSE(bad.config);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(err.find(path), std::string::npos) << err;
  unlink(path);
  EXPECT_FALSE(parse({"--config", "/nonexistent/agentboxd.yaml"}).config);
}

TEST(Config, ListenParsing) {
  auto v4 = parse_listen("127.0.0.1:9090");
  ASSERT_TRUE(v4);
  EXPECT_EQ(v4->first, "127.0.0.1");
  EXPECT_EQ(v4->second, 9090);
  auto v6 = parse_listen("[::1]:0");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->first, "::1");
  EXPECT_EQ(v6->second, 0);
  EXPECT_EQ(parse_listen("localhost:80").value().first, "127.0.0.1");
  for (const char* bad : {"", "9090", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:x",
                          "example.com:80", "[::1:80", "[::1]80"}) {
    EXPECT_FALSE(parse_listen(bad).has_value()) << bad;
  }
}

TEST(Config, NonLoopbackNeedsAToken) {
  EXPECT_TRUE(is_loopback_address("127.0.0.1"));
  EXPECT_TRUE(is_loopback_address("127.1.2.3"));
  EXPECT_TRUE(is_loopback_address("::1"));
  EXPECT_TRUE(is_loopback_address("::ffff:127.0.0.1"));
  EXPECT_FALSE(is_loopback_address("0.0.0.0"));
  EXPECT_FALSE(is_loopback_address("::"));
  EXPECT_FALSE(is_loopback_address("10.0.0.1"));

  DaemonConfig c;
  c.listen = "0.0.0.0:9090";
  auto st = validate_config(c);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("token"), std::string::npos);
  c.tokens = {"t"};
  EXPECT_TRUE(validate_config(c).has_value());
  c.tokens = {""};
  EXPECT_FALSE(validate_config(c).has_value());
  c = DaemonConfig{};
  c.max_file_mb = 0;
  EXPECT_FALSE(validate_config(c).has_value());
}

TEST(Config, SharedDirs) {
  auto d = parse_shared_dirs("site-templates:/mnt/shared-readonly/site-templates");
  ASSERT_TRUE(d);
  ASSERT_EQ(d->size(), 1u);
  EXPECT_EQ((*d)[0].prefix, "site-templates");
  EXPECT_EQ((*d)[0].host_path, "/mnt/shared-readonly/site-templates");
  EXPECT_TRUE(parse_shared_dirs("").value().empty());
  EXPECT_FALSE(parse_shared_dirs("a:relative").has_value());
  EXPECT_FALSE(parse_shared_dirs(":/x").has_value());
  EXPECT_FALSE(parse_shared_dirs("../a:/x").has_value());
}

}  // namespace
}  // namespace agentbox::server

namespace agentbox::server {
namespace {

std::string temp_yaml(const std::string& text) {
  char path[] = "/tmp/agentbox-config-test-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return "";
  close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(ConfigTenants, YamlTenantsQuotasAndAuditSize) {
  std::string path = temp_yaml(
      "tenants:\n"
      "  - {name: a, tokens: [ta1, ta2], max_sessions: 10}\n"
      "  - name: ops\n    tokens: tops\n    admin: true\n"
      "max_running_boxes: 50\naudit_max_mb: 8\n");
  auto r = parse({"--config", path, "--token", "plain"});
  unlink(path.c_str());
  ASSERT_TRUE(r.config);
  ASSERT_EQ(r.config->tenants.size(), 2u);
  EXPECT_EQ(r.config->tenants[0].name, "a");
  EXPECT_EQ(r.config->tenants[0].tokens, (std::vector<std::string>{"ta1", "ta2"}));
  EXPECT_FALSE(r.config->tenants[0].admin);
  EXPECT_EQ(r.config->tenants[0].max_sessions, 10u);
  EXPECT_EQ(r.config->tenants[1].tokens, std::vector<std::string>{"tops"});
  EXPECT_TRUE(r.config->tenants[1].admin);
  EXPECT_EQ(r.config->max_running_boxes, 50u);
  EXPECT_EQ(r.config->audit_max_mb, 8u);
  ASSERT_TRUE(validate_config(*r.config).has_value());
  // Plain tokens are one more tenant, "default", not an admin.
  auto all = effective_tenants(*r.config);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[2].name, "default");
  EXPECT_EQ(all[2].tokens, std::vector<std::string>{"plain"});
  EXPECT_FALSE(all[2].admin);
  // Flags win over the file.
  auto flags = parse({"--max-running-boxes", "3", "--audit-max-mb", "2"});
  ASSERT_TRUE(flags.config);
  EXPECT_EQ(flags.config->max_running_boxes, 3u);
  EXPECT_EQ(flags.config->audit_max_mb, 2u);
  EXPECT_EQ(parse({}).config->audit_max_mb, 64u);
  EXPECT_EQ(parse({}).config->ws_ping_sec, 30u);
  EXPECT_EQ(parse({"--ws-ping-sec", "5"}).config->ws_ping_sec, 5u);
  DaemonConfig silent;
  silent.ws_ping_sec = 0;
  auto st = validate_config(silent);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("--ws-ping-sec"), std::string::npos) << st.error().message;
  EXPECT_TRUE(effective_tenants(*parse({}).config).empty());
}

TEST(ConfigTenants, ValidationNamesTheProblemAndNeverTheToken) {
  auto check = [](DaemonConfig c, const std::string& needle) {
    auto st = validate_config(c);
    ASSERT_FALSE(st.has_value()) << needle;
    EXPECT_NE(st.error().message.find(needle), std::string::npos) << st.error().message;
    EXPECT_EQ(st.error().message.find("s3cret"), std::string::npos) << st.error().message;
  };
  DaemonConfig c;
  c.tenants = {{"a", {"s3cret"}, false, 0}, {"b", {"s3cret"}, false, 0}};
  check(c, "token is configured twice");
  c.tenants = {{"a", {"s3cret"}, false, 0}};
  c.tokens = {"s3cret"};
  check(c, "token is configured twice");
  c.tokens.clear();
  c.tenants = {{"a", {"x1"}, false, 0}, {"a", {"x2"}, false, 0}};
  check(c, "configured twice");
  c.tenants = {{"", {"x1"}, false, 0}};
  check(c, "tenant name");
  c.tenants = {{"a b", {"x1"}, false, 0}};
  check(c, "tenant name");
  c.tenants = {{"a", {}, false, 0}};
  check(c, "no tokens");
  c.tenants = {{"a", {""}, false, 0}};
  check(c, "empty token");
  c.tenants = {{"default", {"x1"}, false, 0}};
  c.tokens = {"x2"};
  check(c, "'default'");
  // Tenant tokens count as tokens for a non-loopback listen address.
  c.tokens.clear();
  c.tenants = {{"a", {"x1"}, false, 0}};
  c.listen = "0.0.0.0:9090";
  EXPECT_TRUE(validate_config(c).has_value());
  c.tenants.clear();
  EXPECT_FALSE(validate_config(c).has_value());
}

}  // namespace
}  // namespace agentbox::server

namespace agentbox::server {
namespace {

// default_limits: what a session's unset limits become, validated like a request's limits.
TEST(ConfigDefaultLimits, BuiltInUnlessTheFileSetsThem) {
  auto plain = parse({});
  ASSERT_TRUE(plain.config);
  EXPECT_EQ(plain.config->default_limits.memory_mb, sandbox::kDefaultMemoryMb);
  EXPECT_EQ(plain.config->default_limits.cpu_percent, sandbox::kDefaultCpuPercent);
  EXPECT_EQ(plain.config->default_limits.max_pids, sandbox::kDefaultMaxPids);
  EXPECT_EQ(plain.config->default_limits.max_open_files, sandbox::kDefaultOpenFiles);
  EXPECT_FALSE(plain.config->default_limits.disk_mb.has_value());

  std::string path = temp_yaml(
      "default_limits:\n  memory_mb: 300\n  max_pids: 64\n"
      "  disk_mb: 128\n");
  auto r = parse({"--config", path});
  unlink(path.c_str());
  ASSERT_TRUE(r.config);
  EXPECT_EQ(r.config->default_limits.memory_mb, 300u);
  EXPECT_EQ(r.config->default_limits.max_pids, 64u);
  EXPECT_EQ(r.config->default_limits.disk_mb, 128u);
  // The keys not given keep the built-in defaults.
  EXPECT_EQ(r.config->default_limits.cpu_percent, sandbox::kDefaultCpuPercent);
  EXPECT_EQ(r.config->default_limits.max_open_files, sandbox::kDefaultOpenFiles);
  // tmp_mb is not fixed by the defaults: each session derives it from its own memory_mb.
  EXPECT_FALSE(r.config->default_limits.tmp_mb.has_value());
  EXPECT_FALSE(r.config->default_limits.cpu_time_sec.has_value());
}

TEST(ConfigDefaultLimits, ZeroDiskAndCpuTimeMeanNone) {
  std::string path = temp_yaml(
      "default_limits:\n  disk_mb: 0\n  cpu_time_sec: 0\n"
      "  tmp_mb: 100\n");
  auto r = parse({"--config", path});
  unlink(path.c_str());
  ASSERT_TRUE(r.config);
  EXPECT_FALSE(r.config->default_limits.disk_mb.has_value());
  EXPECT_FALSE(r.config->default_limits.cpu_time_sec.has_value());
  EXPECT_EQ(r.config->default_limits.tmp_mb, 100u);

  std::string set = temp_yaml("default_limits:\n  disk_mb: 64\n  cpu_time_sec: 30\n");
  auto s = parse({"--config", set});
  unlink(set.c_str());
  ASSERT_TRUE(s.config);
  EXPECT_EQ(s.config->default_limits.disk_mb, 64u);
  EXPECT_EQ(s.config->default_limits.cpu_time_sec, 30u);
}

TEST(ConfigDefaultLimits, BadValuesNameTheKey) {
  struct Case {
    const char* yaml;
    const char* needle;
  };
  for (const Case& c : {
           Case{"default_limits:\n  memory_mb: 1\n", "'default_limits.memory_mb' must be between"},
           Case{"default_limits:\n  max_pids: 0\n", "'default_limits.max_pids'"},
           Case{"default_limits:\n  cpu_percent: lots\n", "'default_limits.cpu_percent'"},
           Case{"default_limits:\n  memory_mb: -5\n", "'default_limits.memory_mb'"},
           Case{"default_limits:\n  memroy_mb: 512\n", "unknown key 'memroy_mb'"},
           Case{"default_limits:\n  tmp_mb: 0\n", "'default_limits.tmp_mb'"},
           Case{"default_limits:\n  cpu_time_sec: 1000000000\n", "'default_limits.cpu_time_sec'"},
           // /tmp may take at most half of the memory it lives in.
           Case{"default_limits:\n  memory_mb: 64\n  tmp_mb: 40\n", "'default_limits.tmp_mb'"},
           Case{"default_limits:\n  tmp_mb: 300\n", "'default_limits.tmp_mb'"},
           Case{"default_limits: 512\n", "default_limits must be a mapping"},
       }) {
    std::string path = temp_yaml(c.yaml);
    std::string err;
    auto r = parse({"--config", path}, &err);
    unlink(path.c_str());
    EXPECT_FALSE(r.config) << c.yaml;
    EXPECT_EQ(r.exit_code, 2) << c.yaml;
    EXPECT_NE(err.find(c.needle), std::string::npos) << c.yaml << " -> " << err;
  }
}

// Seed 001's toolbox-server command line.
TEST(ConfigSeedFlags, TheSeedCommandLine) {
  std::string err;
  auto r = parse({"--port", "9090", "--workdir", "/mnt/workspace/", "--multi-agent", "--shell",
                  "/bin/sh", "--shared-dirs", "site-templates:/srv/t", "--toolchain-path",
                  "/opt/toolchain/bin", "--shared-readonly"},
                 &err);
  ASSERT_TRUE(r.config) << err;
  const DaemonConfig& c = *r.config;
  EXPECT_EQ(c.listen, "0.0.0.0:9090");
  EXPECT_EQ(c.backend, "ns");
  EXPECT_EQ(c.seed.workdir, "/mnt/workspace");
  EXPECT_EQ(c.seed.shell, "/bin/sh");
  EXPECT_EQ(c.seed.toolchain_path, "/opt/toolchain/bin");
  ASSERT_EQ(c.shared_dirs.size(), 1u);
  EXPECT_EQ(c.shared_dirs[0].prefix, "site-templates");
  // No token on all interfaces: the seed's trust model, allowed, loudly.
  EXPECT_TRUE(c.seed.open_without_token);
  EXPECT_TRUE(validate_config(c).has_value());
  ASSERT_EQ(c.seed.warnings.size(), 2u);  // --shared-readonly, and the open port
  EXPECT_NE(c.seed.warnings[0].find("--shared-readonly"), std::string::npos);
  EXPECT_NE(c.seed.warnings[1].find("WITHOUT a token"), std::string::npos);

  // With a token it is the ordinary rule, and no warning about it.
  auto tok = parse({"--port", "9090", "--multi-agent", "--token", "t"});
  ASSERT_TRUE(tok.config);
  EXPECT_FALSE(tok.config->seed.open_without_token);
  EXPECT_TRUE(tok.config->seed.warnings.empty());
  // The default shell is bash (the seed's), for seed routes only.
  auto def = parse({});
  ASSERT_TRUE(def.config);
  EXPECT_EQ(def.config->seed.shell, ::access("/bin/bash", X_OK) == 0 ? "/bin/bash" : "/bin/sh");
  EXPECT_TRUE(def.config->seed.workdir.empty());
  // Without the seed's flags a non-loopback listen still needs a token.
  auto plain = parse({"--listen", "0.0.0.0:9090", "--multi-agent"});
  ASSERT_TRUE(plain.config);
  EXPECT_FALSE(validate_config(*plain.config).has_value());
}

TEST(ConfigSeedFlags, UnisolatedOnlyWithAnExplicitHostBackend) {
  std::string err;
  auto no_iso = parse({"--port", "9090"}, &err);
  EXPECT_FALSE(no_iso.config);
  EXPECT_EQ(no_iso.exit_code, 2);
  EXPECT_NE(err.find("--multi-agent"), std::string::npos) << err;
  EXPECT_NE(err.find("--backend host"), std::string::npos) << err;
  auto host = parse({"--port", "9090", "--backend", "host", "--token", "t"}, &err);
  ASSERT_TRUE(host.config) << err;
  EXPECT_EQ(host.config->backend, "host");
  EXPECT_FALSE(host.config->seed.open_without_token);  // unisolated never goes without a token
  EXPECT_TRUE(validate_config(*host.config).has_value());
  auto both = parse({"--multi-agent", "--backend", "host"}, &err);
  EXPECT_FALSE(both.config);
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(err.find("--multi-agent"), std::string::npos) << err;
}

TEST(ConfigSeedFlags, BadValuesNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  for (const Case& c : std::vector<Case>{
           {{"--port", "70000", "--multi-agent"}, "--port"},
           {{"--port", "x", "--multi-agent"}, "--port"},
           {{"--shell", "bash"}, "--shell"},
           {{"--shell", "/nonexistent/bash"}, "--shell"},
           {{"--workdir", "/"}, "--workdir"},
           {{"--workdir", "/etc/passwd"}, "--workdir"},
           {{"--toolchain-path", "relative/bin"}, "--toolchain-path"},
           {{"--toolchain-path", "/a=b"}, "--toolchain-path"},
       }) {
    std::string err;
    auto r = parse(c.args, &err);
    EXPECT_FALSE(r.config) << c.args[1];
    EXPECT_EQ(r.exit_code, 2) << c.args[1];
    EXPECT_NE(err.find(c.names), std::string::npos) << c.args[1] << ": " << err;
  }
}

TEST(ConfigSeedFlags, EnvFallbacks) {
  ::setenv("TOOLCHAIN_PATH", "/opt/a/bin:/opt/b/bin", 1);
  ::setenv("SHARED_DIRS", "tpl:/srv/tpl", 1);
  auto r = parse({});
  auto flag = parse({"--toolchain-path", "/x/bin"});
  ::unsetenv("TOOLCHAIN_PATH");
  ::unsetenv("SHARED_DIRS");
  ASSERT_TRUE(r.config);
  EXPECT_EQ(r.config->seed.toolchain_path, "/opt/a/bin:/opt/b/bin");
  ASSERT_EQ(r.config->shared_dirs.size(), 1u);
  EXPECT_EQ(r.config->shared_dirs[0].prefix, "tpl");
  ASSERT_TRUE(flag.config);
  EXPECT_EQ(flag.config->seed.toolchain_path, "/x/bin");  // the flag wins
}

TEST(ConfigSeedFlags, ReadonlyDirs) {
  agentbox::testing::TempDir tmp("agentbox-cfg");  // removed however the test ends
  const std::string dir = tmp.path();
  std::string file = dir + "/c.yaml";
  { std::ofstream(file) << "readonly_dirs: [" << dir << "]\n"; }
  auto r = parse({"--config", file});
  ASSERT_TRUE(r.config);
  EXPECT_EQ(effective_readonly_dirs(*r.config), std::vector<std::string>{dir});
  { std::ofstream(file) << "readonly_dirs: []\n"; }
  auto none = parse({"--config", file});
  ASSERT_TRUE(none.config);
  EXPECT_TRUE(effective_readonly_dirs(*none.config).empty());
  for (const std::string& bad : std::vector<std::string>{
           "[relative]", "[/nonexistent-agentbox-dir]", "[" + dir + "/]", "/opt"}) {
    { std::ofstream(file) << "readonly_dirs: " << bad << "\n"; }
    std::string err;
    auto b = parse({"--config", file}, &err);
    EXPECT_FALSE(b.config) << bad;
    EXPECT_EQ(b.exit_code, 2) << bad;
    EXPECT_NE(err.find("readonly_dirs"), std::string::npos) << bad << ": " << err;
  }
  auto def = parse({});
  ASSERT_TRUE(def.config);
  std::error_code ec;
  EXPECT_EQ(effective_readonly_dirs(*def.config), std::filesystem::is_directory("/opt", ec)
                                                      ? std::vector<std::string>{"/opt"}
                                                      : std::vector<std::string>{});
  std::filesystem::remove_all(dir, ec);
}

// Seed 001's mode (--multi-agent or --workdir) adds /mnt/shared-readonly when the host has it,
// to whatever readonly_dirs are; other daemons never get it.
TEST(ConfigSeedFlags, SharedReadonlyIsInTheSeedsBoxesWhenTheHostHasIt) {
  auto has = [](std::set<std::string> dirs) {
    return [dirs](const std::string& d) { return dirs.count(d) > 0; };
  };
  auto seed = parse({"--multi-agent"});
  ASSERT_TRUE(seed.config);
  EXPECT_EQ(effective_readonly_dirs(*seed.config, has({"/opt", "/mnt/shared-readonly"})),
            (std::vector<std::string>{"/opt", "/mnt/shared-readonly"}));
  EXPECT_EQ(effective_readonly_dirs(*seed.config, has({"/opt"})),
            (std::vector<std::string>{"/opt"}));
  auto wd = parse({"--workdir", "/mnt/workspace"});
  ASSERT_TRUE(wd.config);
  EXPECT_EQ(effective_readonly_dirs(*wd.config, has({"/mnt/shared-readonly"})),
            (std::vector<std::string>{"/mnt/shared-readonly"}));
  auto plain = parse({});
  ASSERT_TRUE(plain.config);
  EXPECT_EQ(effective_readonly_dirs(*plain.config, has({"/opt", "/mnt/shared-readonly"})),
            (std::vector<std::string>{"/opt"}));
}

// --shared-readonly as old command lines pass it: bare, with a path, or PATH after '='; always
// a no-op with a deprecation warning naming it. The config's `shell` is --shell.
TEST(ConfigSeedFlags, SharedReadonlyValueFormsAndTheConfigShell) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--shared-readonly"},
        std::vector<std::string>{"--shared-readonly", "/mnt/shared-readonly", "--multi-agent"},
        std::vector<std::string>{"--shared-readonly=/mnt/shared-readonly"}}) {
    std::string err;
    auto r = parse(args, &err);
    ASSERT_TRUE(r.config) << args[0] << ": " << err;
    EXPECT_TRUE(r.config->seed.shared_readonly);
    ASSERT_FALSE(r.config->seed.warnings.empty());
    EXPECT_NE(r.config->seed.warnings[0].find("deprecated"), std::string::npos);
  }
  auto spaced = parse({"--shared-readonly", "/mnt/shared-readonly", "--multi-agent"});
  ASSERT_TRUE(spaced.config);
  EXPECT_TRUE(spaced.config->seed.multi_agent) << "the path is the flag's, not a positional";
  EXPECT_EQ(spaced.config->seed.shared_readonly_value, "/mnt/shared-readonly");

  agentbox::testing::TempDir tmp("agentbox-cfg");  // removed however the test ends
  const std::string dir = tmp.path();
  std::ofstream(dir + "/c.yaml") << "shell: /bin/sh\n";
  auto cfg = parse({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(cfg.config);
  EXPECT_EQ(cfg.config->seed.shell, "/bin/sh");
  EXPECT_TRUE(cfg.config->seed.shell_given);
  auto flag_wins = parse({"--config", dir + "/c.yaml", "--shell", "/bin/bash"});
  ASSERT_TRUE(flag_wins.config);
  EXPECT_EQ(flag_wins.config->seed.shell, "/bin/bash");
  std::ofstream(dir + "/c.yaml") << "shell: /nonexistent/sh\n";
  std::string err;
  EXPECT_FALSE(parse({"--config", dir + "/c.yaml"}, &err).config);
  EXPECT_NE(err.find("/nonexistent/sh"), std::string::npos) << err;
  EXPECT_FALSE(parse({}).config->seed.shell_given);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// network: hosts (name -> address, canonicalised) and allow_private; bad entries name themselves.
TEST(ConfigNetwork, HostsAndAllowPrivate) {
  auto plain = parse({});
  ASSERT_TRUE(plain.config);
  EXPECT_TRUE(plain.config->network.hosts.empty());
  EXPECT_FALSE(plain.config->network.allow_private);

  std::string path = temp_yaml(
      "network:\n  hosts:\n    PKGS.Example.test.: 127.0.0.1\n    v6.example.test: \"::1\"\n"
      "  allow_private: true\n");
  auto r = parse({"--config", path});
  unlink(path.c_str());
  ASSERT_TRUE(r.config);
  ASSERT_EQ(r.config->network.hosts.size(), 2u);
  EXPECT_EQ(r.config->network.hosts.at("pkgs.example.test").to_string(), "127.0.0.1");
  EXPECT_EQ(r.config->network.hosts.at("v6.example.test").to_string(), "::1");
  EXPECT_TRUE(r.config->network.allow_private);

  struct Case {
    const char* yaml;
    const char* needle;
  };
  for (const Case& c : {
           Case{"network:\n  hosts:\n    a.test: not-an-ip\n", "not-an-ip"},
           Case{"network:\n  hosts:\n    \"bad name\": 127.0.0.1\n", "bad name"},
           Case{"network:\n  hots: {}\n", "unknown key 'hots'"},
           Case{"network:\n  hosts: [a]\n", "network.hosts must be a mapping"},
           Case{"network: 1\n", "network must be a mapping"},
       }) {
    std::string p = temp_yaml(c.yaml);
    std::string err;
    auto bad = parse({"--config", p}, &err);
    unlink(p.c_str());
    EXPECT_FALSE(bad.config) << c.yaml;
    EXPECT_NE(err.find(c.needle), std::string::npos) << c.yaml << " -> " << err;
  }
}

}  // namespace
}  // namespace agentbox::server

namespace agentbox::server {
namespace {

// langbot: {control_token, tenant, trusted_instance} (LangBot's Box runtime): YAML, flags over
// it, and the checks (token length, a tenant that exists, an instance id of LangBot's form).
TEST(ConfigLangbot, YamlFlagsAndValidation) {
  const std::string token(32, 'k');
  std::string path = temp_yaml(
      "tenants:\n  - {name: lb, tokens: [t1]}\n"
      "langbot:\n  control_token: " +
      token + "\n  tenant: lb\n  trusted_instance: inst-1\n");
  auto r = parse({"--config", path});
  ASSERT_TRUE(r.config);
  EXPECT_EQ(r.config->langbot.control_token, token);
  EXPECT_EQ(r.config->langbot.tenant, "lb");
  EXPECT_EQ(r.config->langbot.trusted_instance, "inst-1");
  EXPECT_TRUE(validate_config(*r.config).has_value());
  auto flags = parse({"--config", path, "--langbot-trusted-instance", "inst-2"});
  ASSERT_TRUE(flags.config);
  EXPECT_EQ(flags.config->langbot.trusted_instance, "inst-2");
  unlink(path.c_str());

  std::string bad = temp_yaml("langbot:\n  token: x\n");
  std::string err;
  EXPECT_FALSE(parse({"--config", bad}, &err).config);
  EXPECT_NE(err.find("langbot: unknown key 'token'"), std::string::npos) << err;
  unlink(bad.c_str());

  auto check = [](DaemonConfig c, const std::string& needle) {
    auto st = validate_config(c);
    ASSERT_FALSE(st.has_value()) << needle;
    EXPECT_NE(st.error().message.find(needle), std::string::npos) << st.error().message;
  };
  DaemonConfig c;
  c.langbot.control_token = "short";
  check(c, "langbot.control_token");
  c.langbot.control_token = std::string(31, 'a') + " b";
  check(c, "no whitespace");
  c.langbot.control_token = token;
  c.langbot.tenant = "nobody";
  check(c, "langbot.tenant 'nobody'");
  c.langbot.tenant.clear();
  c.langbot.trusted_instance = "-x";
  check(c, "langbot.trusted_instance");
  c.langbot.trusted_instance = "inst:1.a_b";
  EXPECT_TRUE(validate_config(c).has_value());
}

// --default-runner / config default_runner: must be one of the runner users.
TEST(ConfigRunners, DefaultRunnerMustBeARunnerUser) {
  auto r = parse({"--runner-token", "alice=s3cret", "--default-runner", "alice"});
  ASSERT_TRUE(r.config);
  EXPECT_EQ(r.config->default_runner, "alice");
  EXPECT_TRUE(validate_config(*r.config).has_value());
  auto bad = parse({"--runner-token", "alice=s3cret", "--default-runner", "bob"});
  ASSERT_TRUE(bad.config);
  auto st = validate_config(*bad.config);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("default_runner 'bob' is not a runner user"), std::string::npos)
      << st.error().message;
  EXPECT_EQ(st.error().message.find("s3cret"), std::string::npos) << st.error().message;
  EXPECT_TRUE(validate_config(*parse({}).config).has_value());  // none: nothing to check
}

}  // namespace
}  // namespace agentbox::server
