#include "image/internal/fetch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/unique_fd.h"
#include "linux/sys.h"

extern char** environ;

namespace agentbox::image::detail {
namespace {

Result<std::string> read_secret(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) return fail(Code::kInvalid, "registries: " + what + " " + path + " cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string base64(const std::string& in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) |
                       (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out += kAlphabet[(v >> k) & 63];
  }
  if (i < in.size()) {
    unsigned v = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// The last non-empty line of skopeo's stderr, without its log prefix.
std::string reason_of(const std::string& err) {
  std::string s = err;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  auto nl = s.rfind('\n');
  if (nl != std::string::npos) s = s.substr(nl + 1);
  if (auto p = s.find("msg=\""); p != std::string::npos) {
    s = s.substr(p + 5);
    if (!s.empty() && s.back() == '"') s.pop_back();
  }
  if (s.size() > 600) s = s.substr(0, 600) + "...";
  return s;
}

}  // namespace

Status skopeo_copy(const StoreConfig& cfg, const std::string& host, const std::string& ref,
                   const std::string& oci_dir, const std::string& work_dir) {
  std::vector<std::string> args = {cfg.skopeo, "--insecure-policy", "copy",
                                   "--quiet",  "--retry-times",     "0"};
  auto it = cfg.registries.find(host);
  bool creds = false;
  if (it != cfg.registries.end()) {
    const RegistryAuth& r = it->second;
    if (r.insecure) args.push_back("--src-tls-verify=false");
    if (!r.ca_file.empty()) {
      // skopeo takes a directory of *.crt files.
      const std::string certs = work_dir + "/certs";
      if (::mkdir(certs.c_str(), 0700) != 0) return fail_errno(errno, "mkdir(" + certs + ")");
      if (::symlink(r.ca_file.c_str(), (certs + "/ca.crt").c_str()) != 0) {
        return fail_errno(errno, "symlink(" + certs + "/ca.crt)");
      }
      args.push_back("--src-cert-dir");
      args.push_back(certs);
    }
    if (!r.username.empty() && !r.password_file.empty()) {
      // SECURITY: in an auth file of the pull's own (0600, under the store's 0700 dir), not on
      // skopeo's command line, which any local user can read in /proc.
      auto pw = AB_TRY(read_secret(r.password_file, "password_file"));
      const std::string auth = work_dir + "/auth.json";
      UniqueFd fd(::open(auth.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!fd) return fail_errno(errno, "open(" + auth + ")");
      const std::string text = "{\"auths\": {\"" + host + "\": {\"auth\": \"" +
                               base64(r.username + ":" + pw) + "\"}}}\n";
      if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
        return fail_errno(errno, "write(" + auth + ")");
      }
      args.push_back("--src-authfile");
      args.push_back(auth);
      creds = true;
    } else if (!r.token_file.empty()) {
      auto tok = AB_TRY(read_secret(r.token_file, "token_file"));
      args.push_back("--src-registry-token");
      args.push_back(tok);
      creds = true;
    }
  }
  if (!creds) args.push_back("--src-no-creds");
  args.push_back("docker://" + ref);
  args.push_back("oci:" + oci_dir);

  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto pipe = linux::sys::pipe(true);
  if (!pipe) return std::unexpected(std::move(pipe.error()));
  UniqueFd rd = std::move(pipe->read), wr = std::move(pipe->write);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  int err = ::posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  wr.reset();
  if (err != 0) {
    return fail(Code::kUnavailable, "cannot run " + cfg.skopeo +
                                        " (install skopeo): " + std::string(std::strerror(err)));
  }
  const auto deadline = std::chrono::steady_clock::now() + cfg.pull_timeout;
  std::string out;
  bool timed_out = false;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{rd.get(), POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    ssize_t got = ::read(rd.get(), buf, sizeof buf);
    if (got > 0) {
      if (out.size() < 65536) out.append(buf, static_cast<std::size_t>(got));
      continue;
    }
    if (got == 0 || errno != EINTR) break;
  }
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return fail(Code::kUpstream, "registry " + host + ": pull of " + ref + " took over " +
                                     std::to_string(cfg.pull_timeout.count()) + " s");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  const std::string reason = reason_of(out);
  // skopeo verifies each blob as it copies it: "Digest did not match, expected sha256:..., got
  // sha256:...".
  if (out.find("did not match") != std::string::npos ||
      out.find("digest mismatch") != std::string::npos) {
    std::string blob;
    if (auto p = out.find("expected sha256:"); p != std::string::npos) {
      blob = out.substr(p + 9, 71);
    }
    return fail(Code::kImage, "image " + ref + ": blob " + (blob.empty() ? "?" : blob) +
                                  " does not match its digest (" + reason + ")");
  }
  return fail(Code::kUpstream,
              "registry " + host + " refused or failed the pull of " + ref + ": " + reason);
}

}  // namespace agentbox::image::detail
