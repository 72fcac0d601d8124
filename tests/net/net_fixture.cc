#include "net/net_fixture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "net/netns.h"

namespace agentbox::net::testing {
namespace {

void die(const std::string& what) {
  throw std::runtime_error(what + ": " + strerror(errno));
}

sockaddr_in loopback(uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return sa;
}

uint16_t port_of(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  return ntohs(sa.sin_port);
}

UniqueFd listen_loopback(int backlog) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa = loopback(0);
  if (!fd || bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      listen(fd.get(), backlog) != 0) {
    die("listen on 127.0.0.1");
  }
  return fd;
}

// Runs `fn` on a thread that has joined `netns`.
template <typename F>
void in_netns(int netns, F fn) {
  std::thread t([&] {
    if (setns(netns, CLONE_NEWNET) != 0) return;
    fn();
  });
  t.join();
}

constexpr char kServer[] = R"PY(
import http.server, socketserver, ssl, sys, threading
name, log, certdir, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lock = threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *a): pass
    def handle_one(self):
        with lock, open(log, 'a') as f:
            f.write('%s %s Host=%s\n' % (self.command, self.path, self.headers.get('Host')))
        n = int(self.headers.get('Content-Length') or 0)
        if n: self.rfile.read(n)
        if self.path.startswith('/big?n='):
            size = int(self.path[7:])
            self.send_response(200)
            self.send_header('Content-Length', str(size))
            self.end_headers()
            chunk = b'x' * 65536
            while size > 0:
                self.wfile.write(chunk[:min(size, 65536)]); size -= 65536
            return
        body = ('%s got %s %s Host=%s\n' % (name, self.command, self.path, self.headers.get('Host'))).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_HEAD = handle_one
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 1024
s = S(('127.0.0.1', port), H)
if certdir:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certdir + '/cert.pem', certdir + '/key.pem')
    s.socket = ctx.wrap_socket(s.socket, server_side=True)
open(log + '.port.tmp', 'w').write(str(s.server_address[1]))
import os; os.rename(log + '.port.tmp', log + '.port')
s.serve_forever()
)PY";

}  // namespace

TestNetns::TestNetns() {
  std::thread t([this] {
    if (unshare(CLONE_NEWNET) != 0) return;
    UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    ifreq ifr{};
    strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    if (ioctl(s.get(), SIOCGIFFLAGS, &ifr) != 0) return;
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s.get(), SIOCSIFFLAGS, &ifr) != 0) return;
    fd_ = UniqueFd(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  });
  t.join();
  if (!fd_) die("make a network namespace");
}

UniqueFd connect_in_netns(int netns, uint16_t port) {
  auto v = connect_many_in_netns(netns, port, 1);
  return v.empty() ? UniqueFd() : std::move(v[0]);
}

std::vector<UniqueFd> connect_many_in_netns(int netns, uint16_t port, size_t n) {
  std::vector<UniqueFd> out;
  in_netns(netns, [&] {
    for (size_t i = 0; i < n; ++i) {
      UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_in sa = loopback(port);
      if (!fd || connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) return;
      out.push_back(std::move(fd));
    }
  });
  return out;
}

std::string read_some(int fd, size_t max) {
  std::string out;
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 20'000) <= 0) return out;
  out.resize(max);
  ssize_t n = read(fd, out.data(), max);
  out.resize(n > 0 ? n : 0);
  return out;
}

std::string roundtrip(int fd, const std::string& request, size_t max) {
  if (!request.empty() &&
      send(fd, request.data(), request.size(), MSG_NOSIGNAL) != ssize_t(request.size())) {
    return "send failed";
  }
  std::string out;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (out.size() < max && std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    char buf[65536];
    ssize_t n = read(fd, buf, std::min(sizeof buf, max - out.size()));
    if (n <= 0) break;
    out.append(buf, n);
  }
  return out;
}

RunResult run_in_netns(int netns, const std::vector<std::string>& argv, uid_t uid) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) die("pipe");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls from here (the parent has threads).
    if (setns(netns, CLONE_NEWNET) != 0) _exit(126);
    if (uid != 0 && (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0))
      _exit(125);
    dup2(out[1], 1);
    dup2(err[1], 2);
    alarm(60);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  RunResult r;
  pollfd p[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_count = 2;
  while (open_count > 0) {
    if (poll(p, 2, -1) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[65536];
      ssize_t n = read(p[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(p[i].fd);
        p[i].fd = -1;
        --open_count;
      } else {
        (i == 0 ? r.out : r.err).append(buf, n);
      }
    }
  }
  int st = 0;
  waitpid(pid, &st, 0);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/agentbox-net-XXXXXX";
  if (!mkdtemp(tmpl)) die("mkdtemp");
  path_ = tmpl;
}
TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void make_cert(const std::string& dir, const std::vector<std::string>& names) {
  std::string san = "subjectAltName=";
  for (size_t i = 0; i < names.size(); ++i) san += (i ? ",DNS:" : "DNS:") + names[i];
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=" + names[0] + " -addext " +
      san + " -keyout " + dir + "/key.pem -out " + dir + "/cert.pem >/dev/null 2>&1";
  if (system(cmd.c_str()) != 0) throw std::runtime_error("openssl req failed");
}

LocalServer::LocalServer(std::string name, const std::string& cert_dir, uint16_t port) {
  const std::string log = dir_.path() + "/log";
  { std::ofstream(log).flush(); }
  const std::string p = std::to_string(port);
  pid_ = fork();
  if (pid_ == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    execlp("python3", "python3", "-c", kServer, name.c_str(), log.c_str(), cert_dir.c_str(),
           p.c_str(), nullptr);
    _exit(127);
  }
  // The server writes its port to log.port once it listens (python may start slowly on a loaded
  // machine: wait up to a minute).
  for (int i = 0; i < 6000 && port_ == 0; ++i) {
    std::ifstream f(log + ".port");
    int p = 0;
    if (f >> p)
      port_ = static_cast<uint16_t>(p);
    else
      usleep(10'000);
  }
  if (port_ == 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    throw std::runtime_error("local server did not start");
  }
}

LocalServer::~LocalServer() {
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

std::string LocalServer::log() const {
  std::ifstream f(dir_.path() + "/log");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

BlackholeServer::BlackholeServer()
    : listener_(listen_loopback(0)), port_(port_of(listener_.get())) {
  for (int i = 0; i < 2; ++i) {
    UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    sockaddr_in sa = loopback(port_);
    connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    fillers_.push_back(std::move(fd));
  }
  usleep(100'000);  // let the fillers' handshakes complete and fill the queue
}

SilentServer::SilentServer(int backlog)
    : listener_(listen_loopback(backlog)), port_(port_of(listener_.get())) {}

ProxyHarness::ProxyHarness(std::vector<std::string> allow, std::map<std::string, std::string> hosts,
                           ProxyLimits limits) {
  auto policy = Policy::parse(allow);
  if (!policy) throw std::runtime_error(policy.error().message);
  std::vector<std::pair<std::string, std::string>> hv(hosts.begin(), hosts.end());
  auto h = parse_hosts(hv);
  if (!h) throw std::runtime_error(h.error().message);
  auto cfg = std::make_shared<NetworkConfig>();
  cfg->hosts = *h;
  auto fd = listen_in_netns(ns_.fd(), kProxyAddress, kProxyPort);
  if (!fd) throw std::runtime_error(fd.error().message);
  ProxyHooks hooks;
  hooks.on_deny = [this](const DenyEvent& e) {
    std::lock_guard lk(mu_);
    denials_.push_back(e);
  };
  auto p = Proxy::create(io_, std::move(*fd), std::make_shared<const Policy>(*policy), cfg, limits,
                         std::move(hooks));
  if (!p) throw std::runtime_error(p.error().message);
  proxy_ = *p;
  proxy_->start();
  thread_ = std::thread([this] { io_.run(); });
}

ProxyHarness::~ProxyHarness() {
  proxy_->stop();
  io_.stop();
  thread_.join();
}

std::vector<DenyEvent> ProxyHarness::denials() {
  std::lock_guard lk(mu_);
  return denials_;
}

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

}  // namespace agentbox::net::testing
