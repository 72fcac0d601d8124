// The CLI's helpers (src/cli/util.cc): how `agentbox cp` tells SESSION:PATH from a local path,
// how sizes and the progress bar read, and that the bar shows on a terminal and nowhere else.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "cli/cli.h"
#include "common/unique_fd.h"

namespace agentbox::cli {
namespace {

TEST(ParseRemote, SessionColonPathIsRemote) {
  auto r = parse_remote("box:/workspace/a.txt");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->session, "box");
  EXPECT_EQ(r->path, "/workspace/a.txt");

  auto rel = parse_remote("s-1.x_y:out/b.bin");
  ASSERT_TRUE(rel);
  EXPECT_EQ(rel->session, "s-1.x_y");
  EXPECT_EQ(rel->path, "out/b.bin");

  // "SESSION:" names the workspace; only the first ':' splits.
  auto empty = parse_remote("box:");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->session, "box");
  EXPECT_EQ(empty->path, "");
  auto colons = parse_remote("box:a:b");
  ASSERT_TRUE(colons);
  EXPECT_EQ(colons->session, "box");
  EXPECT_EQ(colons->path, "a:b");
}

TEST(ParseRemote, LocalPathsStayLocal) {
  // No ':' at all, a leading ':', or a '/' before the ':' (session ids have no '/'): as scp.
  EXPECT_FALSE(parse_remote("a.txt"));
  EXPECT_FALSE(parse_remote(":x"));
  EXPECT_FALSE(parse_remote("./a:b"));
  EXPECT_FALSE(parse_remote("/tmp/a:b"));
  EXPECT_FALSE(parse_remote("dir/sub:file"));
  EXPECT_FALSE(parse_remote("-"));
  EXPECT_FALSE(parse_remote(""));
}

TEST(HumanBytes, UnitsAndRounding) {
  EXPECT_EQ(human_bytes(0), "0 B");
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(1023), "1023 B");
  EXPECT_EQ(human_bytes(1024), "1.0 KiB");
  EXPECT_EQ(human_bytes(1536), "1.5 KiB");
  EXPECT_EQ(human_bytes(12ull << 20), "12.0 MiB");
  EXPECT_EQ(human_bytes((1ull << 30) + (1ull << 29)), "1.5 GiB");
  EXPECT_EQ(human_bytes(5ull << 40), "5.0 TiB");
  // TiB is the largest unit: bigger counts grow the number, not the unit.
  EXPECT_EQ(human_bytes(2048ull << 40), "2048.0 TiB");
}

TEST(SessionTarget, IdIsOnePercentEncodedSegment) {
  EXPECT_EQ(session_target("box"), "/v1/sessions/box");
  EXPECT_EQ(session_target("a.b_c-d~"), "/v1/sessions/a.b_c-d~");
  EXPECT_EQ(session_target("a b"), "/v1/sessions/a%20b");
  // A '/' must not open a new path segment (it would name another route).
  EXPECT_EQ(session_target("x/../y"), "/v1/sessions/x%2F..%2Fy");
}

TEST(ParsePairs, KeyValueArguments) {
  auto p = parse_pairs({"A=1", "B=x=y", "C="}, "--env");
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(p->size(), 3u);
  EXPECT_EQ(p->at("A"), "1");
  EXPECT_EQ(p->at("B"), "x=y");  // only the first '=' splits
  EXPECT_EQ(p->at("C"), "");
  EXPECT_TRUE(parse_pairs({}, "--env")->empty());
}

TEST(ParsePairs, ErrorsNameTheFlagAndTheArgument) {
  auto no_eq = parse_pairs({"A=1", "JUSTKEY"}, "--label");
  ASSERT_FALSE(no_eq);
  EXPECT_EQ(no_eq.error().code, Code::kInvalid);
  EXPECT_NE(no_eq.error().message.find("--label"), std::string::npos) << no_eq.error().message;
  EXPECT_NE(no_eq.error().message.find("JUSTKEY"), std::string::npos) << no_eq.error().message;
  auto no_key = parse_pairs({"=v"}, "--env");
  ASSERT_FALSE(no_key);
  EXPECT_NE(no_key.error().message.find("--env"), std::string::npos);
}

TEST(WriteAll, WritesEverythingThroughAFullPipe) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd rd(p[0]);
  UniqueFd wr(p[1]);
  std::string data(1u << 20, 'x');  // far more than a pipe holds: short writes happen
  for (std::size_t i = 0; i < data.size(); i += 4096) data[i] = static_cast<char>('a' + i % 26);
  std::string got;
  std::thread reader([&] {
    char buf[65536];
    ssize_t n;
    while ((n = ::read(rd.get(), buf, sizeof buf)) > 0)
      got.append(buf, static_cast<std::size_t>(n));
  });
  EXPECT_TRUE(write_all(wr.get(), data));
  wr.reset();
  reader.join();
  EXPECT_EQ(got, data);
}

TEST(WriteAll, FailsOnABadDescriptor) {
  errno = 0;
  EXPECT_FALSE(write_all(-1, "x"));
  EXPECT_EQ(errno, EBADF);
  EXPECT_TRUE(write_all(-1, ""));  // nothing to write is not an error
}

TEST(ProgressLine, BarPercentSizesAndRate) {
  const std::uint64_t total = 3ull << 20;
  EXPECT_EQ(progress_line("a.bin", 0, total, 0, false),
            "a.bin [>                             ]   0% 0 B / 3.0 MiB  0 B/s");
  EXPECT_EQ(progress_line("a.bin", total / 2, total, 1u << 20, false),
            "a.bin [===============>              ]  50% 1.5 MiB / 3.0 MiB  1.0 MiB/s");
  EXPECT_EQ(progress_line("a.bin", total, total, 2u << 20, true),
            "a.bin [==============================] 100% 3.0 MiB / 3.0 MiB  2.0 MiB/s");
  // More than announced (the file grew) stays at 100%; an empty total is done.
  EXPECT_NE(progress_line("x", 2 * total, total, 0, false).find("] 100% "), std::string::npos);
  EXPECT_NE(progress_line("x", 0, 0, 0, true).find("] 100% "), std::string::npos);
}

TEST(ProgressLine, OnlyTransfersOverOneMiBWantABar) {
  EXPECT_FALSE(wants_progress(0));
  EXPECT_FALSE(wants_progress(1u << 20));
  EXPECT_TRUE(wants_progress((1u << 20) + 1));
}

// Runs `fn` with stderr redirected to `fd`, then restores it.
template <typename Fn>
void with_stderr(int fd, Fn fn) {
  std::fflush(stderr);
  UniqueFd saved(::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 0));
  ASSERT_TRUE(saved.valid());
  ASSERT_EQ(::dup2(fd, STDERR_FILENO), STDERR_FILENO);
  fn();
  std::fflush(stderr);
  ::dup2(saved.get(), STDERR_FILENO);
}

// Everything readable on `fd` within a short while.
std::string drain(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) break;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

void run_transfer(std::uint64_t total) {
  Progress p("big.bin", total);
  for (std::uint64_t done = 0; done <= total; done += total / 4) p.update(done);
  p.finish();
}

TEST(Progress, DrawsOnATerminal) {
  int master = -1, slave = -1;
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, nullptr), 0) << std::strerror(errno);
  UniqueFd m(master);
  UniqueFd s(slave);
  with_stderr(s.get(), [] { run_transfer(5ull << 20); });
  std::string shown = drain(m.get());
  EXPECT_NE(shown.find("big.bin ["), std::string::npos) << shown;
  EXPECT_NE(shown.find("] 100% 5.0 MiB / 5.0 MiB"), std::string::npos) << shown;
  EXPECT_NE(shown.find('\r'), std::string::npos) << "redrawn in place";
}

TEST(Progress, SilentWhenStderrIsNotATerminalOrTheFileIsSmall) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
  UniqueFd rd(p[0]);
  UniqueFd wr(p[1]);
  with_stderr(wr.get(), [] { run_transfer(5ull << 20); });
  EXPECT_EQ(drain(rd.get()), "");

  int master = -1, slave = -1;
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  UniqueFd m(master);
  UniqueFd s(slave);
  with_stderr(s.get(), [] { run_transfer(1u << 20); });  // 1 MiB: not over the threshold
  EXPECT_EQ(drain(m.get()), "");
}

}  // namespace
}  // namespace agentbox::cli
