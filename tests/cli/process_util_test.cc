// The CLI's process helpers (src/cli/util.cc): process paths, argv as a shell command line, the
// exit code in a terminal's close reason, and the output records that resume by offset without
// losing or repeating a byte.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/cli.h"

namespace agentbox::cli {
namespace {

TEST(CliProcessTarget, EncodesSessionAndRefAsSegments) {
  EXPECT_EQ(process_target("s1", "web"), "/v1/sessions/s1/processes/web");
  EXPECT_EQ(process_target("s1", "42"), "/v1/sessions/s1/processes/42");
  EXPECT_EQ(process_target("a b", "x/y"), "/v1/sessions/a%20b/processes/x%2Fy");
}

TEST(CliShellJoin, QuotesOnlyWhatTheShellWouldSplitOrExpand) {
  EXPECT_EQ(shell_join({"ls", "-la", "/workspace"}), "ls -la /workspace");
  EXPECT_EQ(shell_join({"echo", "a b", "$HOME", ""}), "echo 'a b' '$HOME' ''");
  EXPECT_EQ(shell_join({"echo", "it's"}), "echo 'it'\\''s'");
  EXPECT_EQ(shell_join({"sh", "-c", "exit 3"}), "sh -c 'exit 3'");
}

TEST(CliExitCodeOfClose, ExitAndSignalReasons) {
  EXPECT_EQ(exit_code_of_close("exit 0"), 0);
  EXPECT_EQ(exit_code_of_close("exit 3"), 3);
  EXPECT_EQ(exit_code_of_close("exit 255"), 255);
  EXPECT_EQ(exit_code_of_close("signal 9"), 137);
  EXPECT_EQ(exit_code_of_close("signal 15"), 143);
  for (const char* other :
       {"", "shutting down", "exit", "exit x", "exit -1", "exit 1000", "signal 200", "detach"}) {
    EXPECT_FALSE(exit_code_of_close(other)) << other;
  }
}

struct Seen {
  std::string out, err;
};

OutputRecords recorder(Seen* s) {
  return OutputRecords([s](std::string_view type, std::string_view data) {
    (type == "stderr" ? s->err : s->out).append(data);
    return true;
  });
}

TEST(CliOutputRecords, SplitsLinesAcrossChunksAndTracksTheOffset) {
  Seen s;
  OutputRecords r = recorder(&s);
  EXPECT_FALSE(r.next());
  std::string wire = R"({"type":"stdout","data":"abc","offset":0})"
                     "\n"
                     R"({"type":"stderr","data":"oops\n","offset":3})"
                     "\n"
                     R"({"type":"stdout","data":"def","offset":8})"
                     "\n"
                     R"({"type":"exit","exit_code":3,"signal":null,"offset":11})"
                     "\n";
  for (char c : wire) ASSERT_TRUE(r.feed(std::string_view(&c, 1)));  // byte by byte
  EXPECT_EQ(s.out, "abcdef");
  EXPECT_EQ(s.err, "oops\n");
  EXPECT_EQ(r.next(), 11u);
  ASSERT_TRUE(r.exit());
  EXPECT_EQ(r.exit()->exit_code, 3);
  EXPECT_FALSE(r.exit()->signal);
  EXPECT_TRUE(r.bad_line().empty());
}

TEST(CliOutputRecords, AReconnectThatOverlapsRepeatsNothing) {
  Seen s;
  OutputRecords r = recorder(&s);
  // The first connection drops in the middle of the second record's line.
  ASSERT_TRUE(r.feed(R"({"type":"stdout","data":"hello ","offset":0})"
                     "\n"
                     R"({"type":"stdout","data":"wor)"));
  r.connection_ended();
  EXPECT_EQ(s.out, "hello ");
  ASSERT_EQ(r.next(), 6u);
  // A server that answers from an earlier offset (a coarser record): only the new bytes pass.
  ASSERT_TRUE(r.feed(R"({"type":"stdout","data":"lo world","offset":3})"
                     "\n"
                     R"({"type":"stdout","data":"world","offset":6})"
                     "\n"
                     R"({"type":"stdout","data":"!","offset":11})"
                     "\n"));
  EXPECT_EQ(s.out, "hello world!");
  EXPECT_EQ(r.next(), 12u);
}

TEST(CliOutputRecords, ASinkThatRefusesStopsAndBadLinesAreKept) {
  int calls = 0;
  OutputRecords r([&calls](std::string_view, std::string_view) {
    ++calls;
    return false;
  });
  EXPECT_FALSE(r.feed(R"({"type":"stdout","data":"a","offset":0})"
                      "\n"
                      R"({"type":"stdout","data":"b","offset":1})"
                      "\n"));
  EXPECT_EQ(calls, 1);
  Seen s;
  OutputRecords bad = recorder(&s);
  EXPECT_TRUE(bad.feed("<html>proxy error</html>\n"));
  EXPECT_EQ(bad.bad_line(), "<html>proxy error</html>");
}

}  // namespace
}  // namespace agentbox::cli
