#pragma once
// Real etcd members for the cluster tests, and nginx in front of nodes (RoundRobin) (Debian's
// etcd-server, `etcd` on PATH): 1 or 3 members, each on its own 127.0.0.x address with free ports
// and a temp data dir, started by the constructor (which returns once every member answers /health)
// and killed (SIGKILL), with their data dirs removed, by the destructor. A member can be killed and
// started again on its data dir (kill / restart). Members die with the test process
// (PR_SET_PDEATHSIG).

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "support/support.h"

namespace agentbox::testing {

// A TCP port nothing listens on at `host` (an IPv4 literal) now: bound to 0, then released.
int free_tcp_port(const std::string& host);

class EtcdCluster {
 public:
  // `members` 1 or 3. Throws std::runtime_error (with the members' log tails) when they do not
  // come up within 20 s. `tls`: the members serve https:// only and want a client certificate
  // (--client-cert-auth), all signed by a CA made for the test (openssl).
  explicit EtcdCluster(int members = 1, bool tls = false);
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // With tls: the CA (PEM) of the members' certificates, a client certificate and its key that
  // etcd takes, and a CA that signed none of them.
  std::string ca_file() const { return dir_ / "ca.pem"; }
  std::string client_cert_file() const { return dir_ / "client.pem"; }
  std::string client_key_file() const { return dir_ / "client.key"; }
  std::string other_ca_file() const { return dir_ / "other-ca.pem"; }

  // "http(s)://127.0.0.x:PORT" of every member.
  std::vector<std::string> endpoints() const;
  // The same, comma-separated (the daemon's --cluster-etcd).
  std::string endpoints_csv() const;
  int size() const { return static_cast<int>(members_.size()); }

  // SIGKILL of member i (its data dir stays); restart(i) starts it again on it and waits until
  // the cluster answers. Both idempotent.
  void kill(int i);
  void restart(int i);
  void kill_all();
  void restart_all();
  // Whether member i answers /health with true within `limit`.
  bool healthy(int i, std::chrono::milliseconds limit) const;

  // The members' logs (for failure messages).
  std::string logs() const;

 private:
  struct Member {
    std::string name;
    std::string host;
    int client_port = 0;
    int peer_port = 0;
    std::string data_dir;
    std::string log_file;
    pid_t pid = -1;
  };
  void start(int i, bool fresh);
  void make_certificates();
  std::string scheme() const { return tls_ ? "https://" : "http://"; }
  void wait_healthy(const std::vector<int>& which);

  TempDir dir_{"agentbox-etcd"};
  bool tls_ = false;
  std::vector<Member> members_;
  std::string initial_cluster_;
};

// nginx (Debian's nginx-light, /usr/sbin/nginx) on a free 127.0.0.1 port, round-robin over
// `backends` ("127.0.0.1:PORT"): requests and replies unbuffered (streams pass as they come),
// WebSocket upgrades passed on, one upstream connection per request. Started by the
// constructor (which returns once it answers), killed with its temp dir by the destructor; it
// dies with the test process too.
class RoundRobin {
 public:
  explicit RoundRobin(const std::vector<std::string>& backends);
  ~RoundRobin();
  RoundRobin(const RoundRobin&) = delete;
  RoundRobin& operator=(const RoundRobin&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const;

 private:
  TempDir dir_{"agentbox-nginx"};
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace agentbox::testing
