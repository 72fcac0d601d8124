// The dashboard as a person uses it, in Debian's chromium (headless) driven by puppeteer-core
// (tests/node/ui_browser.mjs) against a real agentboxd with a token: log in (a wrong token is
// refused), see sessions appear live, create one, run `echo hi` in its terminal, upload a file
// by drag and drop and find it through the API, edit it, follow a process log, suspend and
// resume, filter, destroy with a confirmation, push a bad and a good template and build it with
// its log, the operations page; and the browser-side security of SECURITY.md T13: the policy
// blocks an inline script, a file name with markup stays text, the token is in no URL (every
// request and WebSocket the page made is checked), no cookie, nothing in localStorage.
// Screenshots of every main page go to <build>/ui-screenshots.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "integration/daemon.h"
#include "support/support.h"

namespace agentbox {
namespace {

constexpr char kToken[] = "ui-browser-token-0123456789abcdef";

// Runs `cmd` through the shell; its stdout and stderr, and its exit status in *status.
std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return "popen failed";
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), p)) out += buf.data();
  *status = ::pclose(p);
  return out;
}

TEST(DashboardBrowser, APersonDrivesTheDashboardInChromium) {
  const std::string node_dir = AGENTBOX_NODE_DIR;
  ASSERT_TRUE(std::filesystem::exists(node_dir + "/node_modules/puppeteer-core/package.json"))
      << "run scripts/bootstrap (npm ci in tests/node)";
  ASSERT_TRUE(std::filesystem::exists("/usr/bin/chromium")) << "run scripts/bootstrap (chromium)";
  // ns: the template build runs in a box, and the terminal is a real isolated shell.
  Daemon d({"--backend", "ns", "--token", kToken});
  const std::string shots = AGENTBOX_SCREENSHOTS;
  std::filesystem::remove_all(shots);  // no screenshot of an earlier run passes for this one
  std::filesystem::create_directories(shots);
  // chromium's profile goes to the fixture's temp dir (removed with it), never /tmp.
  int status = 0;
  std::string out = run("cd " + node_dir + " && TMPDIR=" + d.temp_dir() + " HOME=" + d.temp_dir() +
                            " node ui_browser.mjs " + d.url() + " " + kToken + " " + shots,
                        &status);
  std::cout << out;
  EXPECT_EQ(status, 0) << out << "\n--- daemon log tail ---\n"
                       << d.log().substr(d.log().size() > 4000 ? d.log().size() - 4000 : 0);
  // SECURITY.md T13: the token is in no log line (the daemon's, the audit log).
  EXPECT_THAT(d.log(), ::testing::Not(::testing::HasSubstr(kToken)));
  const std::string audit = testing::slurp(d.data_dir() + "/audit.log");
  EXPECT_THAT(audit, ::testing::HasSubstr("ui-s1")) << "the run was audited";
  EXPECT_THAT(audit, ::testing::Not(::testing::HasSubstr(kToken)));
  for (const char* page : {"login", "sessions", "sessions-phone", "terminal", "files", "processes",
                           "settings", "health", "templates", "operations"}) {
    EXPECT_TRUE(std::filesystem::exists(shots + "/" + page + ".png")) << page;
  }
}

// The list with 1,000 sessions: all of them counted, only the rows in view in the DOM
// (tests/node/ui_many_sessions.mjs; it prints how long the list took, a figure, not a bar).
TEST(DashboardBrowser, AThousandSessionsShowVirtualised) {
  const std::string node_dir = AGENTBOX_NODE_DIR;
  ASSERT_TRUE(std::filesystem::exists(node_dir + "/node_modules/puppeteer-core/package.json"));
  Daemon d({"--token", kToken});  // host: a thousand sessions without a thousand boxes
  const std::string shots = AGENTBOX_SCREENSHOTS;
  std::filesystem::create_directories(shots);
  int status = 0;
  std::string out = run("cd " + node_dir + " && TMPDIR=" + d.temp_dir() + " HOME=" + d.temp_dir() +
                            " node ui_many_sessions.mjs " + d.url() + " " + kToken + " " + shots,
                        &status);
  std::cout << out;
  EXPECT_EQ(status, 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("ok a thousand sessions"));
}

}  // namespace
}  // namespace agentbox
