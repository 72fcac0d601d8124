// SECURITY.md T7: identity. Two sessions never share a uid; a session keeps its uid.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstdint>
#include <map>
#include <set>

#include "common/fnv.h"
#include "security/box_fixture.h"

namespace agentbox::security {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(IdentityTest, SessionsNeverShareAUid) {
  std::set<uid_t> uids;
  for (int i = 0; i < 40; ++i) {
    Box b(shared_daemon(), "t7-uid-" + std::to_string(i));
    EXPECT_GE(b.uid(), 10000u);
    EXPECT_LT(b.uid(), 70000u);
    EXPECT_TRUE(uids.insert(b.uid()).second) << "uid " << b.uid() << " shared";
    EXPECT_EQ(b.sh("id -u").value("stdout", ""), std::to_string(b.uid()) + "\n");
  }
}

TEST(IdentityTest, WorkspaceFilesBelongToTheSessionUid) {
  Box b(shared_daemon(), "t7-owner");
  auto r = b.client().request("PUT", "/v1/sessions/t7-owner/files?path=/workspace/api.txt", "x",
                              "application/octet-stream");
  ASSERT_TRUE(r && r->status == 200);
  ASSERT_EQ(b.sh("echo y > /workspace/cmd.txt").value("exit_code", -1), 0);
  EXPECT_EQ(b.sh("stat -c %u /workspace/api.txt /workspace/cmd.txt /workspace").value("stdout", ""),
            std::to_string(b.uid()) + "\n" + std::to_string(b.uid()) + "\n" +
                std::to_string(b.uid()) + "\n");
}

// The first uid probe of seed 001 (DESIGN.md "Identity"): FNV-1 32 of the id (Go's
// hash/fnv.New32, what the seed's toolbox-server uses), % 60000 + 10000.
uid_t first_uid_probe(const std::string& id) {
  return static_cast<uid_t>(fnv1_32(id) % 60000u + 10000u);
}

// Two ids whose first probes collide (found by search: FNV is deterministic), so the second one
// created gets the next uid.
std::pair<std::string, std::string> colliding_ids() {
  std::map<uid_t, std::string> seen;
  for (int i = 0;; ++i) {
    std::string id = "t7-c" + std::to_string(i);
    auto [it, fresh] = seen.emplace(first_uid_probe(id), id);
    if (!fresh) return {it->second, id};
  }
}

// A restart must not reshuffle uids: the allocation (with its collision resolution) is stored.
// Created A then B, B got the probe after A's; after a restart B comes back first and must not
// take A's uid, and A must not get another one (its workspace files are owned by its uid).
TEST(IdentityTest, CollidingSessionsKeepTheirUidsAcrossARestartInAnyOrder) {
  auto [ida, idb] = colliding_ids();
  ASSERT_EQ(first_uid_probe(ida), first_uid_probe(idb));
  testing::TempDir dir("agentbox-t7-data");
  const std::string data_dir = dir.path();
  uid_t ua, ub;
  {
    Daemon d({"--backend", "ns", "--data-dir", data_dir});
    Box a(d, ida);
    Box b(d, idb);
    ua = a.uid();
    ub = b.uid();
    EXPECT_EQ(ua, first_uid_probe(ida));
    EXPECT_NE(ua, ub);
    ASSERT_EQ(b.sh("echo b > /workspace/owned").value("exit_code", -1), 0);
    d.stop(SIGTERM);
  }
  {
    Daemon again({"--backend", "ns", "--data-dir", data_dir});
    Box b(again, idb);  // reverse order: B first
    Box a(again, ida);
    EXPECT_EQ(b.uid(), ub) << "B's uid changed across the restart";
    EXPECT_EQ(a.uid(), ua) << "A's uid changed across the restart";
    EXPECT_NE(a.uid(), b.uid());
    EXPECT_EQ(b.sh("id -u; stat -c %u /workspace/owned").value("stdout", ""),
              std::to_string(ub) + "\n" + std::to_string(ub) + "\n");
    EXPECT_EQ(a.sh("id -u").value("stdout", ""), std::to_string(ua) + "\n");
  }
}

constexpr char kTokenA[] = "t7-token-a-0123456789";
constexpr char kTokenB[] = "t7-token-b-0123456789";

// SECURITY.md T7: tenant B, knowing A's session id, gets exactly what a missing session gets:
// 404, on reads, commands and file writes, and nothing happens in A's box.
TEST(IdentityTest, AnotherTenantsSessionIdIs404AndTouchesNothing) {
  testing::TempDir dir("agentbox-t7-tenants");
  const std::string config = dir / "tenants.yaml";
  ASSERT_TRUE(testing::spit(config, std::string("tenants:\n") + "  - {name: a, tokens: [" +
                                        kTokenA + "]}\n" + "  - {name: b, tokens: [" + kTokenB +
                                        "]}\n"));
  {
    Daemon d({"--backend", "ns", "--config", config});
    Box a(d, "t7-tenant-a", json::object(), kTokenA);
    ASSERT_EQ(a.sh("echo secret > /workspace/secret").value("exit_code", -1), 0);
    client::Client b(d.options(kTokenB));
    const std::string base = "/v1/sessions/t7-tenant-a";
    struct Call {
      const char* method;
      std::string target;
      std::string body;
    };
    const std::vector<Call> calls = {
        {"GET", base, ""},
        {"GET", base + "/files?path=/workspace/secret", ""},
        {"GET", base + "/dir?path=/workspace", ""},
        {"PUT", base + "/files?path=/workspace/pwned", "pwned"},
        {"POST", base + "/exec", R"({"argv":["/bin/sh","-c","echo pwned > /workspace/pwned2"]})"},
        {"DELETE", base + "/files?path=/workspace/secret", ""},
        {"DELETE", base, ""},
    };
    for (const auto& c : calls) {
      auto r = b.request(
          c.method, c.target, c.body,
          c.method == std::string("PUT") ? "application/octet-stream" : "application/json");
      ASSERT_TRUE(r) << c.method << " " << c.target;
      EXPECT_EQ(r->status, 404) << c.method << " " << c.target << ": " << r->body;
      EXPECT_THAT(r->body, Not(HasSubstr("secret\n"))) << c.method << " " << c.target;
    }
    // A missing session answers the same.
    auto missing = b.request("GET", "/v1/sessions/t7-no-such-session");
    ASSERT_TRUE(missing);
    EXPECT_EQ(missing->status, 404);
    // A's box is untouched and alive.
    EXPECT_EQ(a.sh("cat /workspace/secret; ls -A /workspace").value("stdout", ""),
              "secret\n.probe\nsecret\n");
  }
}

}  // namespace
}  // namespace agentbox::security
