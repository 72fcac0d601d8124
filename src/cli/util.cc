#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <utility>

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

const char kExitCodesHelp[] =
    "Exit codes (the same for every command):\n"
    "  0   success\n"
    "  1   any other error (a value the server refused, local I/O)\n"
    "  2   usage: a bad command line; nothing was sent\n"
    "  3   not found (ENOENT): no such session, file or directory\n"
    "  4   auth (EUNAUTHORIZED): the token is missing or wrong\n"
    "  5   unreachable: no reply from the server (connect refused, timeout), EUNAVAILABLE;\n"
    "      `wait` when the timeout passes\n"
    "  6   quota (EQUOTA) or size cap (ETOOBIG)\n"
    "  7   conflict: EEXIST, ENOTEMPTY, ENOTDIR, EISDIR\n"
    "  8   permission denied (EACCES): path escapes the box, read-only, mount not allowed\n"
    "  9   not supported by this server (ENOTSUP / 501, 422, a route it does not have)\n"
    "  10  server error (EINTERNAL, other 5xx)\n"
    "  11  health/repair: the session is unhealthy\n"
    "  exec, shell, attach: the command's own exit code; 128+N when killed by signal N;\n"
    "      exec: 124 on --timeout; attach: 0 when detached (Ctrl-])\n";

int exit_code_for(Code code) {
  switch (code) {
    case Code::kInvalid: return kExitError;
    case Code::kUnauthorized: return kExitAuth;
    case Code::kAccess: return kExitDenied;
    case Code::kNotFound: return kExitNotFound;
    case Code::kExists:
    case Code::kNotDir:
    case Code::kIsDir:
    case Code::kNotEmpty: return kExitConflict;
    case Code::kTooBig:
    case Code::kQuota: return kExitQuota;
    case Code::kTimedOut:
    case Code::kUnavailable:
    case Code::kUpstream: return kExitUnreachable;
    case Code::kImage: return kExitNotSupported;
    case Code::kInternal: return kExitServerError;
    case Code::kNotSupported: return kExitNotSupported;
  }
  return kExitError;
}

int exit_code_for(std::string_view api_code, int http_status, std::string_view message) {
  if (http_status == 422 || http_status == 501 || api_code == "ENOTSUP") return kExitNotSupported;
  if (http_status == 404 && message.starts_with("no such route")) return kExitNotSupported;
  static constexpr std::pair<std::string_view, Code> kCodes[] = {
      {"EINVAL", Code::kInvalid},     {"EUNAUTHORIZED", Code::kUnauthorized},
      {"EACCES", Code::kAccess},      {"ENOENT", Code::kNotFound},
      {"EEXIST", Code::kExists},      {"ENOTDIR", Code::kNotDir},
      {"EISDIR", Code::kIsDir},       {"ENOTEMPTY", Code::kNotEmpty},
      {"ETOOBIG", Code::kTooBig},     {"EQUOTA", Code::kQuota},
      {"ETIMEDOUT", Code::kTimedOut}, {"EUNAVAILABLE", Code::kUnavailable},
      {"EINTERNAL", Code::kInternal}, {"ENOTSUP", Code::kNotSupported},
  };
  for (const auto& [name, code] : kCodes) {
    if (name == api_code) return exit_code_for(code);
  }
  // A code this CLI does not know (a newer server, a proxy): the status says the class.
  switch (http_status) {
    case 401: return kExitAuth;
    case 403: return kExitDenied;
    case 404: return kExitNotFound;
    case 409: return kExitConflict;
    case 413:
    case 429: return kExitQuota;
    case 502:
    case 503:
    case 504: return kExitUnreachable;
    default: break;
  }
  return http_status >= 500 ? kExitServerError : kExitError;
}

int report(const Error& e) {
  std::cerr << "agentbox: " << code_name(e.code) << ": " << e.message << std::endl;
  return exit_code_for(e.code);
}

int report(const client::Response& r) {
  if (auto e = client::api_error(r)) {
    int code = exit_code_for(e->code, r.status, e->message);
    std::cerr << "agentbox: " << e->code << ": " << e->message;
    if (code == kExitNotSupported && e->code != "ENOTSUP") {
      std::cerr << " (HTTP " << r.status << ": not supported by this server)";
    }
    std::cerr << std::endl;
    return code;
  }
  // Not our error shape (a proxy in between?): show what there is, one line.
  std::string body = r.body.substr(0, 200);
  for (char& c : body) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::cerr << "agentbox: HTTP " << r.status << (body.empty() ? "" : ": ") << body << std::endl;
  return exit_code_for("", r.status);
}

int usage(std::string_view message) {
  std::cerr << "agentbox: " << message << "\nRun with --help for more information." << std::endl;
  return kExitUsage;
}

namespace {

std::string path_segment(std::string_view s) {
  std::string seg;
  for (char c : client::url_encode(s)) {
    if (c == '/') {
      seg += "%2F";  // url_encode keeps '/', which is legal in a query but not in one segment
    } else {
      seg += c;
    }
  }
  return seg;
}

}  // namespace

std::string session_target(std::string_view id) {
  return "/v1/sessions/" + path_segment(id);
}

std::string process_target(std::string_view session, std::string_view ref) {
  return session_target(session) + "/processes/" + path_segment(ref);
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    bool plain = !a.empty() && a.find_first_not_of(
                                   "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrs"
                                   "tuvwxyz0123456789_-./=:,@%+") == std::string::npos;
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char c : a) {
      if (c == '\'') {
        out += "'\\''";
      } else {
        out += c;
      }
    }
    out += '\'';
  }
  return out;
}

std::optional<int> exit_code_of_close(std::string_view reason) {
  int base = 0;
  if (reason.starts_with("exit ")) {
    reason.remove_prefix(5);
  } else if (reason.starts_with("signal ")) {
    reason.remove_prefix(7);
    base = 128;
  } else {
    return std::nullopt;
  }
  if (reason.empty() || reason.size() > 3 ||
      reason.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  int n = std::stoi(std::string(reason));
  if (base + n > 255) return std::nullopt;
  return base + n;
}

bool OutputRecords::feed(std::string_view chunk) {
  pending_.append(chunk);
  std::size_t start = 0;
  bool go_on = true;
  for (;;) {
    std::size_t nl = pending_.find('\n', start);
    if (nl == std::string::npos) break;
    go_on = line(std::string_view(pending_).substr(start, nl - start));
    start = nl + 1;
    if (!go_on) break;
  }
  pending_.erase(0, start);
  return go_on;
}

bool OutputRecords::line(std::string_view l) {
  if (l.empty()) return true;
  auto j = nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
  auto type = j.is_object() ? j.find("type") : j.end();
  auto offset = j.is_object() ? j.find("offset") : j.end();
  if (!j.is_object() || type == j.end() || !type->is_string()) {
    bad_line_ = std::string(l.substr(0, 200));
    return true;
  }
  const std::string& t = type->get_ref<const std::string&>();
  if (t == "exit") {
    Exit e;
    if (auto c = j.find("exit_code"); c != j.end() && c->is_number_integer()) {
      e.exit_code = c->get<int>();
    }
    if (auto sg = j.find("signal"); sg != j.end() && sg->is_number_integer()) {
      e.signal = sg->get<int>();
    }
    exit_ = e;
    return true;
  }
  auto data = j.find("data");
  if (data == j.end() || !data->is_string() || offset == j.end() || !offset->is_number_unsigned()) {
    bad_line_ = std::string(l.substr(0, 200));
    return true;
  }
  std::string_view bytes = data->get_ref<const std::string&>();
  std::uint64_t at = offset->get<std::uint64_t>();
  const std::uint64_t end = at + bytes.size();
  // Bytes before next_ were passed on already (a reconnect that asked for them again).
  if (next_ && at < *next_) {
    if (end <= *next_) return true;
    bytes.remove_prefix(static_cast<std::size_t>(*next_ - at));
  }
  next_ = end;
  if (bytes.empty()) return true;
  return sink_(t, bytes);
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

Result<MountSpec> parse_mount(const std::string& spec) {
  auto first = spec.find(':');
  if (first == std::string::npos) {
    return fail(Code::kInvalid, "--mount " + spec + ": expected HOST:BOX[:ro|rw]");
  }
  MountSpec m{spec.substr(0, first), spec.substr(first + 1), "rw"};
  if (auto last = m.mount_path.rfind(':'); last != std::string::npos) {
    std::string tail = m.mount_path.substr(last + 1);
    if (tail != "ro" && tail != "rw") {
      return fail(Code::kInvalid, "--mount " + spec + ": mode must be ro or rw, not " + tail);
    }
    m.mode = tail;
    m.mount_path.resize(last);
  }
  if (m.host_path.empty() || m.mount_path.empty()) {
    return fail(Code::kInvalid, "--mount " + spec + ": expected HOST:BOX[:ro|rw]");
  }
  return m;
}

Result<MountSpec> parse_host_path(const std::string& spec) {
  MountSpec m{spec, "/workspace", "rw"};
  if (auto last = spec.rfind(':'); last != std::string::npos) {
    std::string tail = spec.substr(last + 1);
    if (tail != "ro" && tail != "rw") {
      return fail(Code::kInvalid, "--host-path " + spec + ": mode must be ro or rw, not " + tail);
    }
    m.mode = tail;
    m.host_path.resize(last);
  }
  if (m.host_path.empty() || m.host_path.front() != '/') {
    return fail(Code::kInvalid, "--host-path " + spec + ": expected an absolute DIR[:ro|rw]");
  }
  return m;
}

Result<WaitTarget> resolve_wait_target(const std::string& url_arg,
                                       std::optional<std::uint32_t> timeout_arg,
                                       const char* env_url, const char* env_timeout,
                                       const std::string& server) {
  WaitTarget t;
  std::string what = "URL";
  std::string url = url_arg;
  if (url.empty() && env_url != nullptr && *env_url != '\0') {
    url = env_url;
    what = "WAIT_FOR_SIDECAR";
  }
  if (url.empty()) {
    url = server;
    what = "--server";
  }
  if (url.find("://") == std::string::npos) url = "http://" + url;
  while (url.size() > 1 && url.back() == '/') url.pop_back();
  if (url.ends_with("/healthz")) url.resize(url.size() - 8);
  if (!url.starts_with("http://") || url.size() == 7 || url.find('/', 7) != std::string::npos) {
    return fail(Code::kInvalid, what + " " + url + ": expected [http://]HOST:PORT[/healthz]");
  }
  t.base_url = url;

  if (timeout_arg) {
    t.timeout_sec = *timeout_arg;
  } else if (env_timeout != nullptr && *env_timeout != '\0') {
    std::string_view v = env_timeout;
    if (v.size() > 9 || v.find_first_not_of("0123456789") != std::string_view::npos) {
      return fail(Code::kInvalid, "WAIT_FOR_SIDECAR_TIMEOUT=" + std::string(v) +
                                      ": expected whole seconds (0 to 999999999)");
    }
    t.timeout_sec = static_cast<std::uint32_t>(std::stoul(std::string(v)));
  } else {
    t.timeout_sec = kDefaultWaitSec;
  }
  return t;
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

void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    std::cout << line << '\n';
  }
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
