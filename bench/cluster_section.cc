// `make bench --section cluster` (issue 20): three agentboxd nodes on one etcd, on this machine,
// beside the same work on the owner node or on one daemon without a cluster:
//   exec /bin/true through a node that forwards vs on the owner   (goal <= 1.2x + 0.5 ms)
//   a large download through a forwarding node vs from the owner   (goal >= 0.8x)
//   create -> first exec through the cluster vs one daemon         (goal <= 1.3x)
//   placement throughput, creates/s on three nodes vs one          (goal >= 2x)
//   etcd writes per create (the store's revision; heartbeats of an idle window subtracted)
// All three nodes share this machine's cores, so throughput across them measures the software's
// overhead, not the scale-out a cluster of separate machines gives.

#include "cluster_section.h"

#include <atomic>
#include <deque>
#include <memory>
#include <thread>

#include "bench_daemon.h"
#include "bench_report.h"
#include "support/etcd.h"
#include "support/support.h"

namespace bench {
namespace {

// etcd's current revision (one per write transaction), through its JSON gateway.
std::int64_t etcd_revision(const std::string& endpoint) {
  Client c(ClientOptions{.server = endpoint});
  auto r = c.request("POST", "/v3/kv/range", R"({"key":"AA=="})");  // key "\0": none
  if (!r || r->status != 200) die("etcd range: " + (r ? r->body : r.error().message));
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("header")) die("etcd range: " + r->body);
  return std::stoll(j["header"].value("revision", "0"));
}

void create_on(Client& c, const std::string& id, const std::string& node) {
  nlohmann::json body = {{"id", id}};
  if (!node.empty()) body["node"] = node;
  auto r = c.request("POST", "/v1/sessions", body.dump());
  if (!r || r->status != 201) die("create " + id + ": " + (r ? r->body : r.error().message));
}

std::vector<double> time_execs(Client& c, const std::string& id, int n) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    if (!exec_true(c, id)) die("exec in " + id + " failed");
    out.push_back(ms_since(t0));
  }
  return out;
}

// MB/s of downloading `path` of session `id`, the median of `rounds`.
double download_mbps(Client& c, const std::string& id, const std::string& path, std::uint64_t bytes,
                     int rounds) {
  std::vector<double> rates;
  for (int i = 0; i < rounds; ++i) {
    std::uint64_t got = 0;
    auto t0 = Clock::now();
    auto r = c.request_stream("GET", "/v1/sessions/" + id + "/files?path=" + path, "",
                              [&](std::string_view chunk) {
                                got += chunk.size();
                                return true;
                              });
    const double ms = ms_since(t0);
    if (!r || r->status != 200 || got != bytes) {
      die("download of " + path + ": " + (r ? r->body : r.error().message) + " (" +
          std::to_string(got) + " of " + std::to_string(bytes) + " bytes)");
    }
    rates.push_back(static_cast<double>(bytes) / 1e6 / (ms / 1000.0));
  }
  return median(rates);
}

// Creates of `total` new ids spread over `clients` (one thread each, round robin): creates/s.
double creates_per_second(std::vector<Client*> clients, const std::string& prefix, int total) {
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < clients.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = next++; i < total && !failed; i = next++) {
        nlohmann::json body = {{"id", prefix + std::to_string(i)}};
        auto r = clients[t]->request("POST", "/v1/sessions", body.dump());
        if (!r || r->status != 201) {
          std::fprintf(stderr, "create: %s\n", r ? r->body.c_str() : r.error().message.c_str());
          failed = true;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  if (failed) die("creates failed");
  return total / (ms_since(t0) / 1000.0);
}

}  // namespace

void section_cluster(const std::string& bin, const std::string& backend, int iterations,
                     std::uint64_t file_mb, int sessions) {
  agentbox::testing::EtcdCluster etcd(1);
  agentbox::testing::TempDir dir("agentbox-bench-cluster");
  agentbox::testing::spit(dir / "secret", "a-bench-cluster-secret-of-some-length\n");
  agentbox::testing::spit(dir / "agentboxd.yaml",
                          "cluster:\n  etcd: [" + etcd.endpoints()[0] +
                              "]\n  lease_sec: 10\n  secret_file: " + (dir / "secret") + "\n");
  std::vector<std::unique_ptr<Daemon>> nodes;
  for (int i = 1; i <= 3; ++i) {
    const int port = agentbox::testing::free_tcp_port("127.0.0.1");
    const std::string addr = "127.0.0.1:" + std::to_string(port);
    const std::string name = "n" + std::to_string(i);
    nodes.push_back(std::make_unique<Daemon>(
        bin, backend,
        std::vector<std::string>{"--config", dir / "agentboxd.yaml", "--node-name", name,
                                 "--advertise-url", "http://" + addr},
        fs::path{}, addr));
  }
  std::deque<Client> cs;  // Client neither copies nor moves
  for (const auto& n : nodes) cs.emplace_back(ClientOptions{.server = n->url()});
  for (int i = 0; i < 200; ++i) {
    auto r = cs[0].request("GET", "/v1/cluster");
    auto j = r ? nlohmann::json::parse(r->body, nullptr, false) : nlohmann::json();
    int up = 0;
    if (j.is_object() && j["nodes"].is_array()) {
      for (const auto& n : j["nodes"]) up += n.value("state", "") == "up";
    }
    if (up == 3) break;
    if (i == 199) die("the three nodes did not see each other");
    usleep(50 * 1000);
  }

  // 1. exec on the owner (n1) vs through n2.
  create_on(cs[0], "bench-owned", "n1");
  time_execs(cs[1], "bench-owned", 20);  // warm both paths (the forwarder's connection)
  time_execs(cs[0], "bench-owned", 20);
  std::vector<double> owner, fwd;
  for (int i = 0; i < iterations; i += 50) {  // interleaved rounds: noise hits both alike
    auto a = time_execs(cs[0], "bench-owned", 50);
    auto b = time_execs(cs[1], "bench-owned", 50);
    owner.insert(owner.end(), a.begin(), a.end());
    fwd.insert(fwd.end(), b.begin(), b.end());
  }
  row_m("exec /bin/true on the owner node", owner, "ms");
  const double goal = 1.2 * median(owner) + 0.5;
  char note[96];
  std::snprintf(note, sizeof note, "ratio %.2f, +%.3f ms (target <= %.3f ms)",
                median(fwd) / median(owner), median(fwd) - median(owner), goal);
  row_m("exec /bin/true through a forwarding node", fwd, "ms", note);

  // 2. A download of file_mb MiB.
  const std::uint64_t bytes = file_mb << 20;
  {
    auto r = cs[0].request(
        "POST", "/v1/sessions/bench-owned/exec",
        nlohmann::json{
            {"argv", {"sh", "-c", "head -c " + std::to_string(bytes) + " /dev/urandom > big.bin"}}}
            .dump());
    if (!r || r->status != 200) die("writing big.bin: " + (r ? r->body : r.error().message));
  }
  const double own_mbps = download_mbps(cs[0], "bench-owned", "big.bin", bytes, 3);
  const double fwd_mbps = download_mbps(cs[1], "bench-owned", "big.bin", bytes, 3);
  row(("download " + std::to_string(file_mb) + " MiB from the owner").c_str(), own_mbps, "MB/s");
  row(("download " + std::to_string(file_mb) + " MiB through a forwarding node").c_str(), fwd_mbps,
      "MB/s", ratio_note(fwd_mbps / own_mbps, ">= 0.8"));

  // 3. create -> first exec: through the cluster (placed anywhere, asked of n1) vs one daemon.
  Daemon single(bin, backend, {});
  Client one = make_client(single);
  std::vector<double> through, alone;
  for (int i = 0; i < sessions; ++i) {
    const std::string a = "bench-c-" + std::to_string(i), b = "bench-s-" + std::to_string(i);
    auto t0 = Clock::now();
    create_on(cs[0], a, "");
    if (!exec_true(cs[0], a)) die("first exec in " + a);
    through.push_back(ms_since(t0));
    t0 = Clock::now();
    create_on(one, b, "");
    if (!exec_true(one, b)) die("first exec in " + b);
    alone.push_back(ms_since(t0));
  }
  row_m("create -> first exec, one daemon", alone, "ms");
  row_m("create -> first exec through the cluster", through, "ms",
        ratio_note(median(through) / median(alone), "<= 1.3"));

  // 4. Placement throughput: three clients on three nodes vs three clients on one daemon.
  std::deque<Client> more;
  for (int i = 0; i < 3; ++i) more.emplace_back(ClientOptions{.server = single.url()});
  const int total = sessions * 3;
  const double one_rate = creates_per_second({&more[0], &more[1], &more[2]}, "bench-r1-", total);
  const std::int64_t rev0 = etcd_revision(etcd.endpoints()[0]);
  auto t0 = Clock::now();
  const double three_rate = creates_per_second({&cs[0], &cs[1], &cs[2]}, "bench-r3-", total);
  const double window_ms = ms_since(t0);
  const std::int64_t writes = etcd_revision(etcd.endpoints()[0]) - rev0;
  // The idle rate of writes (heartbeats) over a window as long, subtracted.
  const std::int64_t idle0 = etcd_revision(etcd.endpoints()[0]);
  usleep(static_cast<useconds_t>(window_ms * 1000));
  const std::int64_t idle = etcd_revision(etcd.endpoints()[0]) - idle0;
  row("creates/s, one daemon (3 clients)", one_rate, "/s");
  row("creates/s, three nodes (3 clients, one per node)", three_rate, "/s",
      ratio_note(three_rate / one_rate, ">= 2 (on separate machines)"));
  row("etcd writes per create", static_cast<double>(writes - idle) / total, "",
      "target 1 (" + std::to_string(writes) + " writes, " + std::to_string(idle) +
          " in an idle window as long)");
}

}  // namespace bench
