// Templates across nodes (API.md "Cluster", service/template_sync.h): definitions and versions
// live in the catalog; a node builds a version's snapshot the first time a session on it needs
// one, from the YAML of that version, and a build's log is read through any node.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cluster/cluster_fixture.h"

namespace agentbox::testing {
namespace {

class ClusterTemplates : public ClusterFixture {
 protected:
  ApiReply push(int via, const std::string& yaml) {
    return api(node(via)).call("POST", "/v1/templates", yaml, "application/yaml");
  }
  ApiReply build(int via, const std::string& name) {
    return api(node(via)).call("POST", "/v1/templates/" + name + "/build?wait=true", "");
  }
  // Session `id` on template `ref`, placed on node `on` through node `via`.
  ApiReply session_on(int via, const std::string& id, const std::string& ref,
                      const std::string& on) {
    return api(node(via)).post("/v1/sessions", {{"id", id}, {"template", ref}, {"node", on}});
  }
  std::string cat(int via, const std::string& id, const std::string& file) {
    auto r = api(node(via)).sh(id, "cat " + file);
    return r.status == 200 ? r.body["stdout"].get<std::string>() : r.raw;
  }
  // The build id of template `name`'s snapshot `version` as node `on` shows it.
  std::string build_of(int on, const std::string& name, int version) {
    auto t = api(node(on)).get("/v1/templates/" + name);
    for (const auto& s : t.body["snapshots"]) {
      if (s["version"] == version) return s["build_id"];
    }
    return "";
  }
};

TEST_F(ClusterTemplates, APushBuildAndRollbackHoldOnEveryNodeAndNodesBuildTheirOwnSnapshots) {
  const std::string v1 = "name: ct\nfiles:\n  a.txt: one\nsetup:\n  - echo setup ran > made.txt\n";
  ASSERT_EQ(push(1, v1).status, 201);
  // Seen through the other nodes (their catalog caches follow by watch).
  for (int i : {2, 3}) {
    ASSERT_TRUE(eventually([&] { return api(node(i)).get("/v1/templates/ct").status == 200; }, 5))
        << i;
    auto t = api(node(i)).get("/v1/templates/ct");
    EXPECT_TRUE(t.body["current_version"].is_null()) << t;
  }
  auto b1 = build(1, "ct");
  ASSERT_EQ(b1.status, 201) << b1;
  EXPECT_EQ(b1.body["snapshot"]["version"], 1) << b1;
  const std::string n1_build = b1.body["build_id"];
  ASSERT_TRUE(eventually(
      [&] { return api(node(3)).get("/v1/templates/ct").body["current_version"] == 1; }, 5));
  // Built on n1 only: n3 has no snapshot of it yet, but shows version 1 (n1's figures).
  EXPECT_EQ(build_of(3, "ct", 1), n1_build);
  // n1's build, read through n3 (forwarded to n1, where it ran).
  auto info = api(node(3)).get("/v1/templates/ct/builds/" + n1_build);
  ASSERT_EQ(info.status, 200) << info;
  EXPECT_EQ(info.body["state"], "succeeded") << info;

  // A session on n2 makes n2 build version 1 first (the create waits), from v1's YAML.
  auto s1 = session_on(3, "ct-a", "ct", "n2");
  ASSERT_EQ(s1.status, 201) << s1;
  EXPECT_EQ(cat(1, "ct-a", "a.txt made.txt"), "onesetup ran\n");
  EXPECT_EQ(s1.body["template"], "ct") << s1;
  const std::string n2_build = build_of(2, "ct", 1);
  ASSERT_FALSE(n2_build.empty());
  EXPECT_NE(n2_build, n1_build);  // its own build, of the same version
  auto log = api(node(1)).get("/v1/templates/ct/builds/" + n2_build + "/log");
  ASSERT_EQ(log.status, 200) << log;
  EXPECT_NE(log.raw.find("setup[0]"), std::string::npos) << log.raw;
  EXPECT_NE(log.raw.find("version 1"), std::string::npos) << log.raw;

  // A new definition pushed and built through n3: version 2 of the cluster (n3 had none).
  ASSERT_EQ(push(3, "name: ct\nfiles:\n  a.txt: two\n").status, 200);
  auto b2 = build(3, "ct");
  ASSERT_EQ(b2.status, 201) << b2;
  EXPECT_EQ(b2.body["snapshot"]["version"], 2) << b2;
  ASSERT_TRUE(eventually(
      [&] { return api(node(1)).get("/v1/templates/ct").body["current_version"] == 2; }, 5));
  auto t1 = api(node(1)).get("/v1/templates/ct");
  ASSERT_EQ(t1.body["snapshots"].size(), 2u) << t1;
  auto snaps = api(node(2)).get("/v1/templates/ct/snapshots");
  ASSERT_EQ(snaps.body["snapshots"].size(), 2u) << snaps;
  EXPECT_EQ(snaps.body["snapshots"][1]["current"], true) << snaps;

  // n1 has version 1 only: a session there builds version 2 (a.txt "two", no setup).
  ASSERT_EQ(session_on(2, "ct-b", "ct", "n1").status, 201);
  EXPECT_EQ(cat(2, "ct-b", "a.txt"), "two");
  // An older version by name: n3 builds version 1 from version 1's YAML, not the current one.
  ASSERT_EQ(session_on(1, "ct-c", "ct@1", "n3").status, 201);
  EXPECT_EQ(cat(1, "ct-c", "a.txt made.txt"), "onesetup ran\n");

  // Rollback through n2: version 1 is current everywhere; a new session on n1 gets it.
  auto rb = api(node(2)).post("/v1/templates/ct/rollback", {{"version", 1}});
  ASSERT_EQ(rb.status, 200) << rb;
  EXPECT_EQ(rb.body["current_version"], 1) << rb;
  ASSERT_TRUE(eventually(
      [&] { return api(node(1)).get("/v1/templates/ct").body["current_version"] == 1; }, 5));
  ASSERT_EQ(session_on(3, "ct-d", "ct", "n1").status, 201);
  EXPECT_EQ(cat(3, "ct-d", "a.txt"), "one");
  EXPECT_EQ(api(node(1)).post("/v1/templates/ct/rollback", {{"version", 9}}).status, 404);

  // Delete: refused where a session uses it; once they are gone, gone from every node.
  EXPECT_EQ(api(node(1)).del("/v1/templates/ct").status, 409);
  for (const char* id : {"ct-a", "ct-b", "ct-c", "ct-d"}) {
    ASSERT_EQ(api(node(2)).del(std::string("/v1/sessions/") + id).status, 200) << id;
  }
  ASSERT_EQ(api(node(1)).del("/v1/templates/ct").status, 200);
  for (int i : {2, 3}) {
    ASSERT_TRUE(eventually([&] { return api(node(i)).get("/v1/templates/ct").status == 404; }, 5))
        << i;
    auto list = api(node(i)).get("/v1/templates");
    EXPECT_TRUE(list.body["templates"].empty()) << list;
  }
  // And its snapshots went with it on the nodes that built one.
  for (auto& n : nodes_) {
    bool empty = true;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(n.data->path() + "/snapshots", ec)) {
      (void)e;
      empty = false;
    }
    EXPECT_TRUE(empty) << n.name;
  }
}

TEST_F(ClusterTemplates, AVersionThatFailsToBuildOnANodeIsAClearErrorWithItsLogThroughAnyNode) {
  // The setup reads a file that exists while n1 builds, and is gone when n2 builds on demand.
  const std::string marker = dir_ / "marker";
  spit(marker, "present\n");
  ASSERT_EQ(push(1, "name: flaky\nsetup:\n  - cat " + marker + " > seen.txt\n").status, 201);
  ASSERT_EQ(build(1, "flaky").status, 201);
  std::filesystem::remove(marker);
  ASSERT_TRUE(eventually(
      [&] { return api(node(2)).get("/v1/templates/flaky").body["current_version"] == 1; }, 5));
  auto s = session_on(3, "fl", "flaky", "n2");
  ASSERT_EQ(s.status, 409) << s;
  const std::string msg = s.body["error"]["message"];
  EXPECT_NE(msg.find("could not be built on this node"), std::string::npos) << msg;
  const auto at = msg.find("/builds/");
  ASSERT_NE(at, std::string::npos) << msg;
  const std::string id = msg.substr(at + 8, msg.find("/log", at) - at - 8);
  auto log = api(node(1)).get("/v1/templates/flaky/builds/" + id + "/log");
  ASSERT_EQ(log.status, 200) << log;
  EXPECT_NE(log.raw.find("failed"), std::string::npos) << log.raw;
  // No session was made, on any node; the version stays the cluster's current.
  EXPECT_EQ(api(node(1)).get("/v1/sessions/fl").status, 404);
  EXPECT_EQ(api(node(3)).get("/v1/templates/flaky").body["current_version"], 1);
}

}  // namespace
}  // namespace agentbox::testing
