#include "support/etcd.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <stdexcept>
#include <thread>

namespace agentbox::testing {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int free_tcp_port(const std::string& host) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("bind " + host + ":0 failed");
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

namespace {

// GET `path` over HTTP/1.0; the whole reply, "" on failure.
std::string http_get(const std::string& host, int port, const std::string& path,
                     std::chrono::milliseconds timeout) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      auto deadline = Clock::now() + timeout;
      char buf[4096];
      while (Clock::now() < deadline) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) break;
        out.append(buf, static_cast<std::size_t>(n));
      }
    }
  }
  ::close(fd);
  return out;
}

pid_t spawn(const std::vector<std::string>& argv, const std::string& log_file) {
  int log_fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) throw std::runtime_error("open " + log_file + " failed");
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execvp(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(log_fd);
  return pid;
}

void kill_and_reap(pid_t* pid) {
  if (*pid <= 0) return;
  ::kill(*pid, SIGKILL);
  int ws = 0;
  ::waitpid(*pid, &ws, 0);
  *pid = -1;
}

}  // namespace

// Runs argv to its end (output to `log_file`): throws naming it unless it exits 0.
void run_or_throw(const std::vector<std::string>& argv, const std::string& log_file) {
  pid_t pid = spawn(argv, log_file);
  int ws = 0;
  ::waitpid(pid, &ws, 0);
  if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    throw std::runtime_error(argv[0] + " " + argv[1] + " failed:\n" + slurp(log_file));
  }
}

EtcdCluster::EtcdCluster(int members, bool tls) : tls_(tls) {
  if (members != 1 && members != 3) throw std::runtime_error("EtcdCluster: 1 or 3 members");
  // 127.0.0.(40 + pid % 150): another test binary running at the same time most likely has
  // another address; the ports are free ones anyway.
  const int base = 40 + static_cast<int>(::getpid() % 150);
  for (int i = 0; i < members; ++i) {
    Member m;
    m.name = "m" + std::to_string(i);
    m.host = "127.0.0." + std::to_string(base + i);
    m.client_port = free_tcp_port(m.host);
    m.peer_port = free_tcp_port(m.host);
    m.data_dir = dir_ / (m.name + ".etcd");
    m.log_file = dir_ / (m.name + ".log");
    initial_cluster_ +=
        (i ? "," : "") + m.name + "=http://" + m.host + ":" + std::to_string(m.peer_port);
    members_.push_back(std::move(m));
  }
  if (tls_) make_certificates();
  std::vector<int> all;
  for (int i = 0; i < members; ++i) {
    start(i, /*fresh=*/true);
    all.push_back(i);
  }
  try {
    wait_healthy(all);
  } catch (...) {
    for (auto& m : members_) kill_and_reap(&m.pid);
    throw;
  }
}

EtcdCluster::~EtcdCluster() {
  for (auto& m : members_) kill_and_reap(&m.pid);
}

// A CA, a server certificate for every member's address (serverAuth and clientAuth: the
// members' gateway dials its own gRPC port with it), a client certificate (clientAuth), and a
// second CA that signs nothing. P-256 keys, valid for two days.
void EtcdCluster::make_certificates() {
  const std::string log = dir_ / "openssl.log";
  auto key_and_csr = [&](const std::string& name, const std::string& cn) {
    run_or_throw({"openssl", "req", "-new", "-newkey", "ec", "-pkeyopt",
                  "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", dir_ / (name + ".key"),
                  "-out", dir_ / (name + ".csr"), "-subj", "/CN=" + cn},
                 log);
  };
  for (const std::string ca : {"ca", "other-ca"}) {
    run_or_throw({"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                  "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", dir_ / (ca + ".key"), "-out",
                  dir_ / (ca + ".pem"), "-days", "2", "-subj", "/CN=agentbox test " + ca},
                 log);
  }
  std::string sans = "subjectAltName=";
  for (std::size_t i = 0; i < members_.size(); ++i) {
    sans += (i ? ",IP:" : "IP:") + members_[i].host;
  }
  spit(dir_ / "server.ext", sans + "\nextendedKeyUsage=serverAuth,clientAuth\n");
  spit(dir_ / "client.ext", "extendedKeyUsage=clientAuth\n");
  key_and_csr("server", "etcd");
  key_and_csr("client", "agentboxd");
  for (const std::string name : {"server", "client"}) {
    run_or_throw({"openssl", "x509", "-req", "-in", dir_ / (name + ".csr"), "-CA", dir_ / "ca.pem",
                  "-CAkey", dir_ / "ca.key", "-CAcreateserial", "-out", dir_ / (name + ".pem"),
                  "-days", "2", "-extfile", dir_ / (name + ".ext")},
                 log);
  }
}

void EtcdCluster::start(int i, bool fresh) {
  Member& m = members_[static_cast<std::size_t>(i)];
  if (m.pid > 0) return;
  const std::string client = scheme() + m.host + ":" + std::to_string(m.client_port);
  const std::string peer = "http://" + m.host + ":" + std::to_string(m.peer_port);
  std::vector<std::string> argv = {"etcd", "--name", m.name, "--data-dir", m.data_dir,
                                   "--listen-client-urls", client, "--advertise-client-urls",
                                   client, "--listen-peer-urls", peer,
                                   "--initial-advertise-peer-urls", peer, "--initial-cluster",
                                   initial_cluster_, "--initial-cluster-token", "agentbox-test",
                                   "--initial-cluster-state", fresh ? "new" : "existing",
                                   // Fast elections on loopback (defaults: 100 / 1000 ms).
                                   "--heartbeat-interval", "50", "--election-timeout", "500",
                                   "--logger", "zap", "--log-level", "warn"};
  if (tls_) {
    for (const std::string& a :
         {std::string("--cert-file"), dir_ / "server.pem", std::string("--key-file"),
          dir_ / "server.key", std::string("--trusted-ca-file"), ca_file(),
          std::string("--client-cert-auth")}) {
      argv.push_back(a);
    }
  }
  m.pid = spawn(argv, m.log_file);
}

void EtcdCluster::wait_healthy(const std::vector<int>& which) {
  auto deadline = Clock::now() + std::chrono::seconds(20);
  for (int i : which) {
    for (;;) {
      if (healthy(i, std::chrono::milliseconds(500))) break;
      const Member& m = members_[static_cast<std::size_t>(i)];
      int ws = 0;
      if (m.pid > 0 && ::waitpid(m.pid, &ws, WNOHANG) == m.pid) {
        members_[static_cast<std::size_t>(i)].pid = -1;
        throw std::runtime_error("etcd member " + m.name + " exited:\n" + logs());
      }
      if (Clock::now() > deadline) {
        throw std::runtime_error("etcd did not become healthy within 20 s:\n" + logs());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

bool EtcdCluster::healthy(int i, std::chrono::milliseconds limit) const {
  const Member& m = members_[static_cast<std::size_t>(i)];
  if (tls_) {  // curl speaks the TLS (with the client certificate etcd asks for)
    const std::string out = dir_ / ("health-" + m.name);
    const std::string secs = std::to_string(std::max<long>(1, (limit.count() + 999) / 1000));
    pid_t pid = spawn({"curl", "-s", "-m", secs, "--cacert", ca_file(), "--cert",
                       client_cert_file(), "--key", client_key_file(), "-o", out,
                       scheme() + m.host + ":" + std::to_string(m.client_port) + "/health"},
                      dir_ / "curl.log");
    int ws = 0;
    ::waitpid(pid, &ws, 0);
    return slurp(out).find("\"health\":\"true\"") != std::string::npos;
  }
  std::string r = http_get(m.host, m.client_port, "/health", limit);
  return r.find("\"health\":\"true\"") != std::string::npos;
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (const auto& m : members_) {
    out.push_back(scheme() + m.host + ":" + std::to_string(m.client_port));
  }
  return out;
}

std::string EtcdCluster::endpoints_csv() const {
  std::string out;
  for (const auto& e : endpoints()) out += (out.empty() ? "" : ",") + e;
  return out;
}

void EtcdCluster::kill(int i) {
  kill_and_reap(&members_[static_cast<std::size_t>(i)].pid);
}

void EtcdCluster::restart(int i) {
  start(i, /*fresh=*/false);
  wait_healthy({i});
}

void EtcdCluster::kill_all() {
  for (int i = 0; i < size(); ++i) kill(i);
}

void EtcdCluster::restart_all() {
  std::vector<int> all;
  for (int i = 0; i < size(); ++i) {
    start(i, /*fresh=*/false);
    all.push_back(i);
  }
  wait_healthy(all);
}

std::string EtcdCluster::logs() const {
  std::string out;
  for (const auto& m : members_) {
    std::string log = slurp(m.log_file);
    if (log.size() > 3000) log = log.substr(log.size() - 3000);
    out += "--- " + m.name + " (" + m.host + ")\n" + log + "\n";
  }
  return out;
}

RoundRobin::RoundRobin(const std::vector<std::string>& backends) {
  port_ = free_tcp_port("127.0.0.1");
  std::string servers;
  for (const auto& b : backends) servers += "    server " + b + ";\n";
  const std::string conf = dir_ / "nginx.conf";
  spit(conf,
       // One process, no workers: SIGKILL ends all of it.
       "master_process off;\n"
       "error_log " +
           (dir_ / "error.log") +
           " warn;\n"
           "pid " +
           (dir_ / "nginx.pid") +
           ";\n"
           "events { worker_connections 1024; }\n"
           "http {\n"
           "  access_log off;\n"
           "  client_body_temp_path " +
           (dir_ / "body") +
           ";\n"
           "  proxy_temp_path " +
           (dir_ / "proxy") +
           ";\n"
           "  fastcgi_temp_path " +
           (dir_ / "fastcgi") +
           ";\n"
           "  uwsgi_temp_path " +
           (dir_ / "uwsgi") +
           ";\n"
           "  scgi_temp_path " +
           (dir_ / "scgi") +
           ";\n"
           "  map $http_upgrade $connection_upgrade { default upgrade; '' close; }\n"
           "  upstream nodes {\n" +
           servers +
           "  }\n"
           "  server {\n"
           "    listen 127.0.0.1:" +
           std::to_string(port_) +
           ";\n"
           "    client_max_body_size 0;\n"
           "    location / {\n"
           "      proxy_pass http://nodes;\n"
           "      proxy_http_version 1.1;\n"
           "      proxy_set_header Upgrade $http_upgrade;\n"
           "      proxy_set_header Connection $connection_upgrade;\n"
           "      proxy_set_header Host $http_host;\n"
           "      proxy_buffering off;\n"
           "      proxy_request_buffering off;\n"
           "      proxy_read_timeout 600s;\n"
           "      proxy_next_upstream off;\n"
           "    }\n"
           "  }\n"
           "}\n");
  pid_ = spawn({"/usr/sbin/nginx", "-p", dir_.path(), "-c", conf, "-g", "daemon off;"},
               dir_ / "stderr.log");
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (http_get("127.0.0.1", port_, "/healthz", std::chrono::milliseconds(500)).empty()) {
    int ws = 0;
    if (::waitpid(pid_, &ws, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("nginx exited:\n" + log());
    }
    if (Clock::now() > deadline) {
      kill_and_reap(&pid_);
      throw std::runtime_error("nginx did not answer within 10 s:\n" + log());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

RoundRobin::~RoundRobin() {
  kill_and_reap(&pid_);
}

std::string RoundRobin::log() const {
  return slurp(dir_ / "stderr.log") + slurp(dir_ / "error.log");
}

}  // namespace agentbox::testing
