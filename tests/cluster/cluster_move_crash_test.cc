// kill -9 of a session's owner at points through POST /v1/sessions/{id}/move (issue 26's faults,
// issue 20's "all or nothing"): once the owner starts again, the session is on exactly one of
// the two nodes, whole, served through every node, and neither node keeps a journal or an
// archive of the move.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cluster/cluster_fixture.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;

class ClusterMoveCrash : public ClusterFixture {};

// Whether `dir` holds no entry whose name starts with `id` (absent counts as empty).
bool nothing_of(const std::string& dir, const std::string& id) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind(id, 0) == 0) return false;
  }
  return true;
}

// What of session `id` a node's move dirs hold, for a failure's message.
std::string left_of(const std::string& data_dir, const std::string& id) {
  std::string out;
  std::error_code ec;
  for (const char* d : {"/moving", "/archives", "/incoming"}) {
    for (const auto& e : fs::directory_iterator(data_dir + d, ec)) {
      if (e.path().filename().string().rfind(id, 0) == 0) out += " " + e.path().string();
    }
  }
  return out;
}

TEST_F(ClusterMoveCrash, AKillOfTheOwnerDuringAMoveLeavesTheSessionWholeOnOneNode) {
  const std::vector<int> delays_ms = {0, 40, 120, 250, 500, 900};
  int moved = 0, stayed = 0;
  for (std::size_t k = 0; k < delays_ms.size(); ++k) {
    const std::string id = "mk" + std::to_string(k);
    create_on(1, id, "n1");
    // 20 MiB in 40 files: the archive and its transfer take a moment.
    auto made = api(node(1)).sh(
        id,
        "mkdir d && for i in $(seq 40); do head -c 524288 /dev/urandom > d/f$i; done; "
        "cat d/* | md5sum");
    ASSERT_EQ(made.status, 200) << made;
    const std::string sum = made.body["stdout"];
    {
      client::Client c(node(1).daemon->options(kToken));
      std::thread t([&c, id] {
        (void)c.request("POST", "/v1/sessions/" + id + "/move", R"({"node":"n2"})");
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(delays_ms[k]));
      node(1).daemon->stop(SIGKILL);
      t.join();
    }
    start(node(1));
    ApiReply r;
    EXPECT_TRUE(eventually(
        [&] {
          r = api(node(3)).sh(id, "cat d/* | md5sum");
          return r.status == 200 && r.body["stdout"] == sum;
        },
        30))
        << "kill after " << delays_ms[k] << " ms: " << r;
    const bool on1 = fs::exists(node(1).data->path() + "/workspaces/" + id);
    const bool on2 = fs::exists(node(2).data->path() + "/workspaces/" + id);
    EXPECT_NE(on1, on2) << "kill after " << delays_ms[k] << " ms\nn2:\n"
                        << node(2).daemon->log() << "\nn1:\n"
                        << node(1).daemon->log();
    (on2 ? moved : stayed)++;
    for (int via : {1, 2, 3}) {
      auto g = api(node(via)).get("/v1/sessions/" + id);
      EXPECT_EQ(g.status, 200) << via << ": " << g;
      EXPECT_EQ(g.body["node"], on2 ? "n2" : "n1") << via << ": " << g;
    }
    EXPECT_TRUE(eventually(
        [&] {
          return nothing_of(node(1).data->path() + "/moving", id) &&
                 nothing_of(node(1).data->path() + "/archives", id) &&
                 nothing_of(node(2).data->path() + "/archives", id) &&
                 nothing_of(node(2).data->path() + "/incoming", id);
        },
        10))
        << "kill after " << delays_ms[k]
        << " ms: a journal, a mark or an archive stays:" << left_of(node(1).data->path(), id)
        << left_of(node(2).data->path(), id);
  }
  std::printf("of %zu kills: %d moves had finished, %d were undone\n", delays_ms.size(), moved,
              stayed);
}

}  // namespace
}  // namespace agentbox::testing
