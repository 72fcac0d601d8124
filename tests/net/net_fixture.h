#pragma once
// Test support for net/: a network namespace the test makes (only `lo`, no route out: the box
// side), sockets and commands inside it, local HTTP/HTTPS servers on the host's loopback, and a
// running egress proxy whose listener lives in that namespace at 127.0.0.1:3128.

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "net/proxy.h"

namespace agentbox::net::testing {

// A fresh network namespace with `lo` up, kept alive by the fd; gone when the fd closes.
class TestNetns {
 public:
  TestNetns();
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
};

// A blocking TCP socket created in `netns` and connected to 127.0.0.1:`port` there (the box's
// view). Invalid fd on failure.
UniqueFd connect_in_netns(int netns, uint16_t port);
// `n` of them at once (one helper thread); stops at the first failure.
std::vector<UniqueFd> connect_many_in_netns(int netns, uint16_t port, size_t n);

// Sends `request`, reads until EOF (or `max` bytes; 20 s at most) and returns what came back.
std::string roundtrip(int fd, const std::string& request, size_t max = 1 << 20);
std::string read_some(int fd, size_t max = 65536);

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};
// Runs argv (execvp) in `netns` with a 60 s limit; as `uid`/gid with no capabilities when
// `uid` is not 0 (the box's session user).
RunResult run_in_netns(int netns, const std::vector<std::string>& argv, uid_t uid = 0);

// A directory under /tmp, removed with everything in it.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A Python HTTP(S) server on 127.0.0.1:<ephemeral>. Every response body is
// "<name> got <METHOD> <path> Host=<Host header>\n" (GET /big?n=N: N bytes of 'x'); each request
// is also appended as a line to log().
class LocalServer {
 public:
  // `cert_dir` non-empty: HTTPS with cert.pem/key.pem from there.
  // `port` 0: an ephemeral one.
  explicit LocalServer(std::string name, const std::string& cert_dir = "", uint16_t port = 0);
  ~LocalServer();
  uint16_t port() const { return port_; }
  std::string log() const;

 private:
  TempDir dir_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

// Writes a self-signed cert.pem/key.pem for `names` (subjectAltName DNS) into `dir`.
void make_cert(const std::string& dir, const std::vector<std::string>& names);

// A TCP listener on 127.0.0.1 that never accepts: with backlog 0 and two fillers queued, further
// SYNs are dropped, so a connect to it never completes.
class BlackholeServer {
 public:
  BlackholeServer();
  uint16_t port() const { return port_; }

 private:
  UniqueFd listener_;
  std::vector<UniqueFd> fillers_;
  uint16_t port_ = 0;
};

// A listener that accepts (in the kernel's queue) and never answers.
class SilentServer {
 public:
  explicit SilentServer(int backlog = 4096);
  uint16_t port() const { return port_; }

 private:
  UniqueFd listener_;
  uint16_t port_ = 0;
};

// A proxy serving `netns` at 127.0.0.1:3128 on its own io_context thread.
class ProxyHarness {
 public:
  ProxyHarness(std::vector<std::string> allow, std::map<std::string, std::string> hosts,
               ProxyLimits limits = {});
  ~ProxyHarness();
  Proxy& proxy() { return *proxy_; }
  int netns() const { return ns_.fd(); }
  std::vector<DenyEvent> denials();

 private:
  TestNetns ns_;
  boost::asio::io_context io_;
  std::shared_ptr<Proxy> proxy_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<DenyEvent> denials_;
};

// Number of open fds of this process.
size_t open_fds();

}  // namespace agentbox::net::testing
