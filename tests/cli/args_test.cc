// How the CLI reads its arguments (src/cli/util.cc): --mount HOST:BOX[:ro|rw], repeatable
// K=V flags, and `agentbox wait`'s target from its argument, seed 001's WAIT_FOR_SIDECAR
// variables or --server.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/cli.h"

namespace agentbox::cli {
namespace {

TEST(CliParseMount, HostBoxAndMode) {
  auto rw = parse_mount("/srv/data:/data");
  ASSERT_TRUE(rw);
  EXPECT_EQ(rw->host_path, "/srv/data");
  EXPECT_EQ(rw->mount_path, "/data");
  EXPECT_EQ(rw->mode, "rw");  // the default
  auto ro = parse_mount("/srv/data:/workspace/data:ro");
  ASSERT_TRUE(ro);
  EXPECT_EQ(ro->mount_path, "/workspace/data");
  EXPECT_EQ(ro->mode, "ro");
}

TEST(CliParseMount, MalformedNamesTheArgument) {
  for (const char* bad : {"/srv/data", ":/data", "/srv:", "/srv::ro", "/a:/b:rx"}) {
    auto m = parse_mount(bad);
    ASSERT_FALSE(m) << bad;
    EXPECT_EQ(m.error().code, Code::kInvalid);
    EXPECT_NE(m.error().message.find(std::string("--mount ") + bad), std::string::npos)
        << m.error().message;
  }
  EXPECT_NE(parse_mount("/a:/b:rx").error().message.find("ro or rw, not rx"), std::string::npos);
}

TEST(CliParsePairs, KeyEqualsValue) {
  auto p = parse_pairs({"web=/srv/skills/web", "x=a=b", "empty="}, "--skill");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->at("web"), "/srv/skills/web");
  EXPECT_EQ(p->at("x"), "a=b");  // only the first '=' splits
  EXPECT_EQ(p->at("empty"), "");
  auto bad = parse_pairs({"novalue"}, "--skill");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("--skill: expected KEY=VALUE, got \"novalue\""),
            std::string::npos);
  EXPECT_FALSE(parse_pairs({"=v"}, "--env"));
}

const std::string kServer = "http://127.0.0.1:9090";

TEST(CliWaitTarget, ArgumentThenEnvironmentThenServer) {
  auto arg = resolve_wait_target("http://10.0.0.5:7000", std::nullopt, "sidecar.test:9090", nullptr,
                                 kServer);
  ASSERT_TRUE(arg);
  EXPECT_EQ(arg->base_url, "http://10.0.0.5:7000");
  auto env = resolve_wait_target("", std::nullopt, "sidecar.test:9090", nullptr, kServer);
  ASSERT_TRUE(env);
  EXPECT_EQ(env->base_url, "http://sidecar.test:9090");  // seed 001 writes host:port
  auto server = resolve_wait_target("", std::nullopt, "", nullptr, kServer);
  ASSERT_TRUE(server);
  EXPECT_EQ(server->base_url, kServer);
  auto none = resolve_wait_target("", std::nullopt, nullptr, nullptr, kServer);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->base_url, kServer);
}

TEST(CliWaitTarget, HealthzAndTrailingSlashesAreDropped) {
  for (const char* url : {"localhost:9090/healthz", "http://localhost:9090/healthz/",
                          "http://localhost:9090/", "localhost:9090"}) {
    auto t = resolve_wait_target(url, std::nullopt, nullptr, nullptr, kServer);
    ASSERT_TRUE(t) << url;
    EXPECT_EQ(t->base_url, "http://localhost:9090") << url;
  }
}

TEST(CliWaitTarget, BadUrlNamesWhereItCameFrom) {
  auto https = resolve_wait_target("https://x.test:1", std::nullopt, nullptr, nullptr, kServer);
  ASSERT_FALSE(https);
  EXPECT_NE(https.error().message.find("URL https://x.test:1"), std::string::npos);
  auto path = resolve_wait_target("", std::nullopt, "h.test:1/other", nullptr, kServer);
  ASSERT_FALSE(path);
  EXPECT_NE(path.error().message.find("WAIT_FOR_SIDECAR http://h.test:1/other"), std::string::npos)
      << path.error().message;
}

TEST(CliWaitTarget, TimeoutFromFlagThenEnvironmentThenSixty) {
  auto dflt = resolve_wait_target("", std::nullopt, nullptr, nullptr, kServer);
  ASSERT_TRUE(dflt);
  EXPECT_EQ(dflt->timeout_sec, 60u);
  auto env = resolve_wait_target("", std::nullopt, nullptr, "5", kServer);
  ASSERT_TRUE(env);
  EXPECT_EQ(env->timeout_sec, 5u);
  auto flag = resolve_wait_target("", 0u, nullptr, "5", kServer);
  ASSERT_TRUE(flag);
  EXPECT_EQ(flag->timeout_sec, 0u);  // the flag wins; 0 = one attempt
  auto empty_env = resolve_wait_target("", std::nullopt, nullptr, "", kServer);
  ASSERT_TRUE(empty_env);
  EXPECT_EQ(empty_env->timeout_sec, 60u);
  for (const char* bad : {"-1", "1.5", "soon", "10000000000"}) {
    auto t = resolve_wait_target("", std::nullopt, nullptr, bad, kServer);
    ASSERT_FALSE(t) << bad;
    EXPECT_NE(t.error().message.find(std::string("WAIT_FOR_SIDECAR_TIMEOUT=") + bad),
              std::string::npos)
        << t.error().message;
  }
}

}  // namespace
}  // namespace agentbox::cli
