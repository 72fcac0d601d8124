// The data dir's filesystem fills up (issue 26): agentboxd on a 32 MiB loop-mounted ext4. Writes
// and creates fail with the quota error that names ENOSPC's "No space left on device" (API.md:
// EQUOTA, 429), the daemon keeps serving, state.db stays sound, nothing acknowledged is lost, and
// once space is freed the same requests succeed.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "faults/fault_util.h"

namespace agentbox::testing {
namespace {

TEST(DiskFull, WritesAndCreatesFailNamedTheDaemonRecoversWhenSpaceReturns) {
  LoopFs fs(32);
  const std::string data = fs.mount_point() + "/data";
  {
    Daemon d({"--data-dir", data, "--backend", "host"});
    Api api(d);
    api.create("keep");
    ASSERT_EQ(api.put(files_target("keep", "small.txt"), "acknowledged").status, 200);

    // Fill it: 2 MiB files until one is refused.
    const std::string chunk(2u << 20, 'x');
    std::vector<std::string> written;
    ApiReply refused;
    for (int i = 0; i < 40; ++i) {
      const std::string name = "fill" + std::to_string(i);
      auto r = api.put(files_target("keep", name), chunk);
      if (r.status != 200) {
        refused = r;
        break;
      }
      written.push_back(name);
    }
    ASSERT_NE(refused.status, 0) << "32 MiB never filled up";
    EXPECT_EQ(refused.status, 429) << refused;
    EXPECT_EQ(refused.code(), "EQUOTA") << refused;
    EXPECT_NE(refused.message().find("No space left on device"), std::string::npos) << refused;

    // A create needs a directory and a state row: refused the same way, and not half-made.
    auto made = api.post("/v1/sessions", {{"id", "late"}});
    if (made.status != 200 && made.status != 201) {
      EXPECT_EQ(made.status, 429) << made;
      EXPECT_EQ(made.code(), "EQUOTA") << made;
      EXPECT_EQ(api.get("/v1/sessions/late").status, 404);
    }
    // Still serving, and what it acknowledged is there, byte for byte.
    EXPECT_EQ(api.get("/healthz").status, 200);
    EXPECT_EQ(api.get(files_target("keep", "small.txt")).raw, "acknowledged");
    for (const std::string& name : written) {
      EXPECT_EQ(api.get(files_target("keep", name)).raw.size(), chunk.size()) << name;
    }
    EXPECT_EQ(db_integrity(data + "/state.db"), "ok");

    // Space returns: the same requests succeed.
    for (const std::string& name : written) {
      ASSERT_EQ(api.del(files_target("keep", name)).status, 200) << name;
    }
    EXPECT_EQ(api.put(files_target("keep", "after.txt"), chunk).status, 200);
    if (made.status != 200 && made.status != 201) api.create("late");
    EXPECT_EQ(api.sh("late", "echo ok").body.value("stdout", ""), "ok\n");
    EXPECT_EQ(d.stop(), 0) << d.log();
  }
  // Everything acknowledged survives a restart on the same filesystem.
  Daemon again({"--data-dir", data, "--backend", "host"});
  Api api(again);
  EXPECT_EQ(api.get(files_target("keep", "small.txt")).raw, "acknowledged");
  EXPECT_EQ(api.get("/v1/sessions/late").status, 200);
  EXPECT_EQ(db_integrity(data + "/state.db"), "ok");
}

}  // namespace
}  // namespace agentbox::testing
