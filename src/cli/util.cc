#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli/cli.h"

namespace agentbox::cli {
namespace {

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr std::uint64_t kProgressMinBytes = 1 << 20;
constexpr std::int64_t kRedrawMs = 100;

}  // namespace

client::ClientOptions Globals::options() const {
  client::ClientOptions o;
  o.server = server;
  o.token = token;
  return o;
}

int report(const Error& e) {
  std::cerr << "agentbox: " << code_name(e.code) << ": " << e.message << std::endl;
  return kExitError;
}

int report(const client::Response& r) {
  if (auto e = client::api_error(r)) {
    std::cerr << "agentbox: " << e->code << ": " << e->message << std::endl;
    return kExitError;
  }
  // Not our error shape (a proxy in between?): show what there is, one line.
  std::string body = r.body.substr(0, 200);
  for (char& c : body) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::cerr << "agentbox: HTTP " << r.status << (body.empty() ? "" : ": ") << body << std::endl;
  return kExitError;
}

int usage(std::string_view message) {
  std::cerr << "agentbox: " << message << "\nRun with --help for more information." << std::endl;
  return kExitUsage;
}

std::string session_target(std::string_view id) {
  std::string seg;
  for (char c : client::url_encode(id)) {
    if (c == '/') {
      seg += "%2F";  // url_encode keeps '/', which is legal in a query but not in one segment
    } else {
      seg += c;
    }
  }
  return "/v1/sessions/" + seg;
}

Result<std::map<std::string, std::string>> parse_pairs(const std::vector<std::string>& args,
                                                       std::string_view flag) {
  std::map<std::string, std::string> out;
  for (const std::string& a : args) {
    auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0) {
      return fail(Code::kInvalid, std::string(flag) + ": expected KEY=VALUE, got \"" + a + "\"");
    }
    out[a.substr(0, eq)] = a.substr(eq + 1);
  }
  return out;
}

std::optional<RemotePath> parse_remote(std::string_view arg) {
  auto colon = arg.find(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  if (arg.substr(0, colon).find('/') != std::string_view::npos) return std::nullopt;
  return RemotePath{std::string(arg.substr(0, colon)), std::string(arg.substr(colon + 1))};
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

std::string human_bytes(std::uint64_t n) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (n < 1024) return std::to_string(n) + " B";
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

bool wants_progress(std::uint64_t total) {
  return total > kProgressMinBytes;
}

std::string progress_line(std::string_view label, std::uint64_t done, std::uint64_t total,
                          std::uint64_t bytes_per_sec, bool final) {
  constexpr int kWidth = 30;
  double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  if (frac > 1) frac = 1;
  int fill = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<std::size_t>(fill), '=');
  if (fill < kWidth) bar += final ? '=' : '>';
  bar.resize(kWidth, ' ');
  char pct[8];
  std::snprintf(pct, sizeof pct, "%3d%%", static_cast<int>(frac * 100));
  std::string line(label);
  line += " [" + bar + "] " + pct + " " + human_bytes(done) + " / " + human_bytes(total) + "  " +
          human_bytes(bytes_per_sec) + "/s";
  return line;
}

Progress::Progress(std::string label, std::uint64_t total)
    : label_(std::move(label)), total_(total) {
  active_ = wants_progress(total_) && ::isatty(STDERR_FILENO) == 1;
  start_ms_ = now_ms();
}

Progress::~Progress() {
  // An interrupted transfer still ends the bar's line, so the error message starts clean.
  if (active_ && !finished_ && done_ > 0) std::fputs("\n", stderr);
}

void Progress::update(std::uint64_t done) {
  done_ = done;
  if (!active_) return;
  std::int64_t t = now_ms();
  if (t - last_draw_ms_ < kRedrawMs) return;
  last_draw_ms_ = t;
  draw(false);
}

void Progress::finish() {
  if (!active_ || finished_) return;
  draw(true);
  std::fputs("\n", stderr);
  finished_ = true;
}

void Progress::draw(bool final) {
  double secs = static_cast<double>(now_ms() - start_ms_) / 1000.0;
  std::uint64_t rate = secs > 0 ? static_cast<std::uint64_t>(static_cast<double>(done_) / secs) : 0;
  std::string line = progress_line(label_, done_, total_, rate, final);
  std::fprintf(stderr, "\r%s\x1b[K", line.c_str());
  std::fflush(stderr);
}

}  // namespace agentbox::cli
