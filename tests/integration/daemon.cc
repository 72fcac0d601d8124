#include "integration/daemon.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "common/unique_fd.h"

namespace agentbox {
namespace {

using Clock = std::chrono::steady_clock;

bool has_flag(const std::vector<std::string>& args, const std::string& flag) {
  return std::any_of(args.begin(), args.end(), [&](const std::string& a) {
    return a == flag || a.rfind(flag + "=", 0) == 0;
  });
}

std::string flag_value(const std::vector<std::string>& args, const std::string& flag) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind(flag + "=", 0) == 0) return args[i].substr(flag.size() + 1);
  }
  return {};
}

int decode_status(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return -1;
}

// fork+exec of `argv` with stdout and stderr to `log_fd`. The child dies with this process.
pid_t spawn(const std::vector<std::string>& argv, int log_fd) {
  // Everything the child touches is prepared before fork (only async-signal-safe calls after).
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // the test process died before prctl
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  return pid;
}

// Waits up to `timeout` for `pid`; returns its decoded status or nullopt if still running.
std::optional<int> wait_for(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    int ws = 0;
    pid_t r = waitpid(pid, &ws, WNOHANG);
    if (r == pid) return decode_status(ws);
    if (r < 0) return -1;
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Sends `sig` to child `pid` and reaps it (SIGKILL after 15 s); its status is kept in `status`
// (later calls return it).
int stop_child(pid_t pid, int sig, std::optional<int>* status) {
  if (*status) return **status;
  if (pid <= 0) return -1;
  kill(pid, sig);
  auto st = wait_for(pid, std::chrono::seconds(15));
  if (!st) {
    kill(pid, SIGKILL);
    st = wait_for(pid, std::chrono::seconds(15));
  }
  *status = st.value_or(-1);
  return **status;
}

}  // namespace

std::string Daemon::binary() {
  const char* dir = std::getenv("AGENTBOX_BIN_DIR");
  if (dir && *dir) return std::string(dir) + "/agentboxd";
  // Test executables live in <build>/tests, the binaries in <build>/bin.
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) return (self.parent_path().parent_path() / "bin" / "agentboxd").string();
  return "build/bin/agentboxd";
}

Daemon::Daemon(std::vector<std::string> extra_args) {
  data_dir_ = has_flag(extra_args, "--data-dir") ? flag_value(extra_args, "--data-dir")
                                                 : temp_ / "data";
  ready_file_ = temp_ / "ready";
  log_file_ = temp_ / "daemon.log";

  std::vector<std::string> argv = {binary()};
  auto add_default = [&](const std::string& flag, const std::string& value) {
    if (!has_flag(extra_args, flag)) {
      argv.push_back(flag);
      argv.push_back(value);
    }
  };
  // Seed 001's --port P listens on 0.0.0.0:P itself; --multi-agent picks the ns backend.
  if (!has_flag(extra_args, "--port")) add_default("--listen", "127.0.0.1:0");
  add_default("--data-dir", data_dir_);
  // AGENTBOX_TEST_BACKEND=ns runs a suite against isolated boxes (tests/CMakeLists.txt registers
  // the API suites a second time that way); host otherwise.
  const char* backend = std::getenv("AGENTBOX_TEST_BACKEND");
  std::string test_backend = backend != nullptr && *backend != '\0' ? backend : "host";
  // AGENTBOX_TEST_BACKEND=remote (a third time): sessions without a backend go to the runner
  // started below; the daemon's own backend (templates, /readyz) stays host. A daemon the test
  // configures itself (--backend, seed 001's --multi-agent) is left as it is.
  const bool remote = test_backend == "remote" && !has_flag(extra_args, "--backend") &&
                      !has_flag(extra_args, "--multi-agent") &&
                      !has_flag(extra_args, "--default-runner");
  if (test_backend == "remote") test_backend = "host";
  if (!has_flag(extra_args, "--multi-agent")) add_default("--backend", test_backend);
  const std::string runner_user = "agentbox-test";
  const std::string runner_token = "agentbox-test-runner-token";
  if (remote) {
    argv.insert(argv.end(), {"--runner-token", runner_user + "=" + runner_token,
                             "--default-runner", runner_user});
  }
  // AGENTBOX_TEST_POOL=N: the ns backend's warm pool (--pool N) unless the test sets --pool
  // itself; unset, the daemon's default (on: the API suites and the escape suite run pooled,
  // tests/security/CMakeLists.txt registers a set again as "fresh/" with 0).
  if (const char* pool = std::getenv("AGENTBOX_TEST_POOL"); pool != nullptr && *pool != '\0') {
    add_default("--pool", pool);
  }
  add_default("--log-level", "debug");
  argv.push_back("--ready-file");
  argv.push_back(ready_file_);
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());

  UniqueFd log_fd(open(log_file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!log_fd) throw std::runtime_error("open " + log_file_);
  pid_ = spawn(argv, log_fd.get());

  // Up to 60 s: a sanitizer build on a busy 2-core machine starts slowly.
  auto deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    std::string ready = testing::slurp(ready_file_);
    if (!ready.empty() && ready.back() == '\n') {
      host_port_ = ready.substr(0, ready.size() - 1);
      // Listening on all interfaces (--port): reach it over loopback.
      if (host_port_.starts_with("0.0.0.0:")) host_port_ = "127.0.0.1" + host_port_.substr(7);
      if (remote) start_runner(runner_user, runner_token);
      return;
    }
    if (auto st = wait_for(pid_, std::chrono::milliseconds(20))) {
      exit_status_ = *st;
      std::string msg = "agentboxd exited with status " + std::to_string(*st) +
                        " before listening; log:\n" + log();
      throw std::runtime_error(msg);
    }
    if (Clock::now() >= deadline) {
      std::string msg = "agentboxd did not write its ready file in 60 s; log:\n" + log();
      stop(SIGKILL);
      throw std::runtime_error(msg);
    }
  }
}

void Daemon::start_runner(const std::string& user, const std::string& token) {
  std::string ws = temp_ / "runner-ws";
  std::filesystem::create_directories(ws);
  std::string runner_log = temp_ / "runner.log";
  try {
    runner_ = std::make_unique<RunnerProcess>(host_port_, user, token, ws, runner_log);
  } catch (...) {
    stop(SIGKILL);
    throw;
  }
  // runners.cc logs this once the hub hands the connection out (sessions may use it then).
  const std::string registered = "runner " + user + " registered";
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (log().find(registered) == std::string::npos) {
    if (Clock::now() >= deadline || !running()) {
      std::string msg = "agentbox-runner did not register in 60 s; runner log:\n" +
                        testing::slurp(runner_log) + "\ndaemon log:\n" + log();
      runner_.reset();
      stop(SIGKILL);
      throw std::runtime_error(msg);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Daemon::~Daemon() {
  runner_.reset();  // before the daemon: a runner left alone keeps redialing it
  stop(SIGTERM);    // temp_ goes after this
}

std::string RunnerProcess::binary() {
  return (std::filesystem::path(Daemon::binary()).parent_path() / "agentbox-runner").string();
}

RunnerProcess::RunnerProcess(const std::string& host_port, const std::string& user,
                             const std::string& token, const std::string& workspace,
                             const std::string& log_file, std::vector<std::string> extra_args) {
  std::string bin = binary();
  if (!std::filesystem::exists(bin)) throw std::runtime_error("no runner binary " + bin);
  UniqueFd log_fd(open(log_file.empty() ? "/dev/null" : log_file.c_str(),
                       O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!log_fd) throw std::runtime_error("open " + log_file);
  std::vector<std::string> argv = {bin,         "--server",    "ws://" + host_port + "/ws/" + user,
                                   "--token",   token,         "--workspace",
                                   workspace,   "--backoff-base-ms", "100"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  pid_ = spawn(argv, log_fd.get());
}

RunnerProcess::~RunnerProcess() {
  stop(SIGTERM);
}

int RunnerProcess::stop(int sig) {
  return stop_child(pid_, sig, &exit_status_);
}

std::string Daemon::workspace_dir(const std::string& id) const {
  if (runner_) return temp_ / "runner-ws";
  return data_dir_ + "/workspaces/" + id;
}

std::string Daemon::url() const {
  return "http://" + host_port_;
}

client::ClientOptions Daemon::options(std::string token) const {
  client::ClientOptions o;
  o.server = url();
  o.token = std::move(token);
  o.timeout = std::chrono::seconds(120);
  return o;
}

int Daemon::stop(int sig) {
  return stop_child(pid_, sig, &exit_status_);
}

std::string Daemon::log() const {
  return testing::slurp(log_file_);
}

int Daemon::run_to_exit(const std::vector<std::string>& args, std::string* output,
                        int timeout_sec) {
  char tmpl[] = "/tmp/agentbox-run-XXXXXX";
  int raw = mkostemp(tmpl, O_CLOEXEC);
  if (raw < 0) throw std::runtime_error("mkostemp failed");
  UniqueFd log_fd(raw);
  std::vector<std::string> argv = {binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  pid_t pid = spawn(argv, log_fd.get());
  auto st = wait_for(pid, std::chrono::seconds(timeout_sec));
  if (!st) {
    kill(pid, SIGKILL);
    wait_for(pid, std::chrono::seconds(15));
    st = -1;
  }
  if (output) *output = testing::slurp(tmpl);
  unlink(tmpl);
  return *st;
}

RawConnection::RawConnection(const std::string& host_port) {
  auto colon = host_port.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("bad address " + host_port);
  std::string host = host_port.substr(0, colon);
  if (host == "0.0.0.0") host = "127.0.0.1";
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    throw std::runtime_error("bad address " + host_port);
  }
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error("socket failed");
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("connect " + host_port + " failed");
  }
}

RawConnection::~RawConnection() {
  close();
}

void RawConnection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool RawConnection::send(std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

namespace {

// Reads what is available within the deadline; false on EOF, error or timeout.
bool read_some(int fd, std::string* out, Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return false;
  pollfd p{fd, POLLIN, 0};
  int r = ::poll(&p, 1, static_cast<int>(left.count()));
  if (r <= 0) return false;
  char buf[65536];
  ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  if (n <= 0) return false;
  out->append(buf, static_cast<std::size_t>(n));
  return true;
}

}  // namespace

std::string RawConnection::read_response(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::string data = std::move(pending_);
  pending_.clear();
  std::size_t header_end = std::string::npos;
  while ((header_end = data.find("\r\n\r\n")) == std::string::npos) {
    if (!read_some(fd_, &data, deadline)) return data;
  }
  std::size_t body_len = 0;
  std::string lower = data.substr(0, header_end);
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  auto cl = lower.find("content-length:");
  if (cl != std::string::npos) body_len = std::stoul(lower.substr(cl + 15));
  while (data.size() < header_end + 4 + body_len) {
    if (!read_some(fd_, &data, deadline)) break;
  }
  // A pipelined reply may have arrived in the same read: keep it for the next call.
  if (data.size() > header_end + 4 + body_len) {
    pending_ = data.substr(header_end + 4 + body_len);
    data.resize(header_end + 4 + body_len);
  }
  return data;
}

std::string RawConnection::read_until_close(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::string data;
  while (read_some(fd_, &data, deadline)) {
  }
  return data;
}

int http_status_of(std::string_view raw) {
  if (raw.size() < 12 || raw.substr(0, 5) != "HTTP/") return -1;
  auto sp = raw.find(' ');
  if (sp == std::string_view::npos || sp + 4 > raw.size()) return -1;
  return std::atoi(std::string(raw.substr(sp + 1, 3)).c_str());
}

bool process_alive(pid_t pid) {
  std::string stat = testing::slurp("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return false;
  auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace agentbox
