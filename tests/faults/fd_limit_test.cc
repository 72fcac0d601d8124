// agentboxd with its fd limit lowered to 256 (prlimit on the running daemon) under 600
// connections at once (issue 26): connections past the budget wait or are refused, nothing
// crashes, and once the crowd is gone every request is served again.

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "faults/fault_util.h"

namespace agentbox::testing {
namespace {

int open_fds(pid_t pid) {
  return static_cast<int>(names_in("/proc/" + std::to_string(pid) + "/fd").size());
}

TEST(FdLimit, ManyConnectionsPastTheLimitNoCrashAndTheDaemonRecovers) {
  // The test holds 600 sockets itself.
  rlimit mine{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &mine), 0);
  rlimit raised{std::max<rlim_t>(mine.rlim_cur, 4096), std::max<rlim_t>(mine.rlim_max, 4096)};
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &raised), 0);

  Daemon d({"--backend", "host"});
  Api api(d);
  api.create("s");
  const rlimit low{256, 256};
  ASSERT_EQ(::prlimit(d.pid(), RLIMIT_NOFILE, &low, nullptr), 0);

  // 600 clients connect and each sends a request; the daemon cannot hold them all.
  std::vector<std::unique_ptr<RawConnection>> crowd;
  for (int i = 0; i < 600; ++i) {
    try {
      crowd.push_back(std::make_unique<RawConnection>(d.host_port()));
    } catch (const std::exception&) {
      continue;  // refused: allowed
    }
    crowd.back()->send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  EXPECT_GT(crowd.size(), 256u);
  // Some are served while the crowd stands (the daemon keeps going within its budget).
  int served = 0;
  for (int i = 0; i < 20 && i < static_cast<int>(crowd.size()); ++i) {
    if (http_status_of(crowd[i]->read_response(std::chrono::seconds(10))) == 200) ++served;
  }
  EXPECT_GT(served, 0);
  EXPECT_TRUE(d.running()) << d.log();
  // The fault was real: the daemon ran out of descriptors (and said so).
  EXPECT_TRUE(eventually([&] { return d.log().find("Too many open files") != std::string::npos; }))
      << d.log().substr(0, 4000);

  crowd.clear();  // they leave
  // Served again, and the fds of the crowd are given back.
  EXPECT_TRUE(eventually(
      [&] {
        try {
          RawConnection c(d.host_port());
          c.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
          return http_status_of(c.read_response(std::chrono::seconds(5))) == 200;
        } catch (const std::exception&) {
          return false;
        }
      },
      30))
      << d.log().substr(d.log().size() > 4000 ? d.log().size() - 4000 : 0);
  EXPECT_EQ(api.sh("s", "echo ok").body.value("stdout", ""), "ok\n");
  EXPECT_TRUE(eventually([&] { return open_fds(d.pid()) < 64; }, 30)) << open_fds(d.pid());
  EXPECT_TRUE(d.running());
  EXPECT_EQ(d.stop(), 0);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &mine), 0);
}

}  // namespace
}  // namespace agentbox::testing
