// Side-by-side benchmarks (`make bench`): every figure is printed next to its baseline measured
// in the same run, as medians and ratios, because the machine is shared and noisy.
//
//   agentbox-bench --daemon build/bin/agentboxd [--backend host|ns] [--section ...]
//
// Sections:
//   exec      exec round trip of /bin/true through HTTP keep-alive vs a bare posix_spawn (and,
//             for ns, vs bwrap --unshare-all and seed 001's unshare+setpriv)
//   files     256 MiB upload and download through the API vs cat to/from local disk, and vs
//             the same bytes over raw loopback TCP (the ceiling of the medium)
//   sessions  new session -> first exec completes, 100 sessions, p50/p99
//   idle      1,000 idle sessions: memory per session (init RSS + cgroup usage), daemon RSS
//   rate      execs/s across 100 sessions vs the bare posix_spawn rate, on all cores
//   lifecycle suspend + resume round trip; daemon restart with 1,000 sessions in the database
//             (time to ready) vs an empty one; exec latency with persistence on vs off
//   attach    process start -> first output byte through the pty route's WebSocket vs
//             `script -qc` and a local pty running the same command, p50/p99
//   keys      keystroke -> echo round trip on a pty (pty route running /bin/sh) vs a local pty of
//             the same shell, p50/p99
//   procs     1,000 idle background processes across 100 sessions: daemon RSS, daemon CPU over
//             10 s idle and its thread count, vs the same sessions without processes
//   ab        exec round trip and execs/s of --daemon vs --ab-daemon (e.g. the build before a
//             change), interleaved (not in `make bench`)
//   network   (ns) 256 MiB download through a box's allowlist proxy vs the same download on
//             the host directly; connection setup through the proxy (CONNECT -> 200) vs a direct
//             TCP connect; box start (create -> first exec) with network none / allowlist /
//             open. Runs in a network namespace of its own (nothing left on the host).
//   e2b       the stock e2b SDK (tests/node/e2b_bench.mjs): commands.run("true") vs the native
//             /v1 exec of the same command (/bin/bash -l -c true) and of /bin/true from the same
//             Node process; Sandbox.create() -> first command, p50/p99
//   cluster   three nodes on one etcd: exec and a download through a forwarding node vs on the
//             owner, create -> first exec vs one daemon, creates/s, etcd writes per create
//             (cluster_section.cc)

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pty.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_daemon.h"
#include "bench_report.h"
#include "client/client.h"
#include "cluster_section.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using agentbox::client::Client;
using agentbox::client::ClientOptions;
using tcp = boost::asio::ip::tcp;

using bench::create_session;
using bench::Daemon;
using bench::die;
using bench::exec_true;
using bench::make_client;
using bench::median;
using bench::ms_since;
using bench::percentile;
using bench::ratio_note;
using bench::row;
using bench::row_m;
using bench::spawn_wait;

std::vector<double> time_spawns(const std::vector<std::string>& args, int n) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    if (spawn_wait(args) != 0) return {};
    out.push_back(ms_since(t0));
  }
  return out;
}

// A "Vm...:" field of /proc/PID/status, KiB (-1 if absent).
long status_kib(pid_t pid, const std::string& field) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field, 0) == 0) return std::strtol(line.c_str() + field.size(), nullptr, 10);
  }
  return -1;
}
long rss_kib(pid_t pid) {
  return status_kib(pid, "VmRSS:");
}

void section_exec(const Daemon& d, const std::string& backend, int n) {
  std::printf("\n[exec] round trip of /bin/true, %d iterations, medians\n", n);
  Client c = make_client(d);
  create_session(c, "bench-exec");
  for (int i = 0; i < 20; ++i) exec_true(c, "bench-exec");  // warm: box up, connection open
  // Interleaved, one exec then one bare spawn: the machine's noise hits both alike.
  std::vector<double> api, bare;
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    if (!exec_true(c, "bench-exec")) die("exec /bin/true failed");
    api.push_back(ms_since(t0));
    t0 = Clock::now();
    if (spawn_wait({"/bin/true"}) != 0) die("/bin/true failed");
    bare.push_back(ms_since(t0));
  }
  double m_api = median(api), m_bare = median(bare);
  row_m("bare posix_spawn /bin/true", bare, "ms");
  row_m(("agentbox exec via HTTP keep-alive (" + backend + ")").c_str(), api, "ms",
        ratio_note(m_api / m_bare, backend == "host" ? "<= 1.3" : "<= 1.5"));

  if (backend != "ns") return;
  // bubblewrap with every namespace unshared and a minimal read-only system, per command.
  std::vector<std::string> bwrap = {"bwrap",     "--unshare-all", "--die-with-parent",
                                    "--ro-bind", "/usr",          "/usr",
                                    "--symlink", "usr/bin",       "/bin",
                                    "--symlink", "usr/lib",       "/lib",
                                    "--symlink", "usr/lib64",     "/lib64",
                                    "--proc",    "/proc",         "--dev",
                                    "/dev",      "--tmpfs",       "/tmp",
                                    "/bin/true"};
  // Interleaved with execs again, and the ratio taken against those execs.
  std::vector<double> bw, api_bw;
  for (int i = 0; i < std::max(20, n / 5); ++i) {
    auto one = time_spawns(bwrap, 1);
    if (one.empty()) {
      bw.clear();
      break;
    }
    bw.push_back(one.front());
    auto t0 = Clock::now();
    if (!exec_true(c, "bench-exec")) die("exec /bin/true failed");
    api_bw.push_back(ms_since(t0));
  }
  if (bw.empty()) {
    row("bwrap --unshare-all ... /bin/true", 0, "ms", "FAILED to run");
  } else {
    double m_bw = median(bw);
    row_m("bwrap --unshare-all ... /bin/true", bw, "ms",
          ratio_note(m_bw / median(api_bw), ">= 5 (bwrap / agentbox)"));
    row_m("  agentbox exec, interleaved with bwrap", api_bw, "ms");
  }
  // Seed 001's way: a mount+pid namespace and setpriv to the agent's uid, per command.
  std::vector<std::string> seed = {"unshare",       "--mount",        "--pid",
                                   "--fork",        "setpriv",        "--reuid=12345",
                                   "--regid=12345", "--clear-groups", "/bin/true"};
  auto sd = time_spawns(seed, std::max(20, n / 5));
  if (!sd.empty()) {
    double m_sd = median(sd);
    row_m("unshare --mount --pid --fork setpriv ... /bin/true", sd, "ms",
          ratio_note(m_sd / m_api, "(seed 001 / agentbox)"));
  }
}

// The medium's ceiling for [files]: the same bytes over a plain loopback TCP connection, no
// HTTP and no daemon. A receiver thread and a sender (this thread), with the syscalls the
// agentbox client and daemon use for the same work: `from` empty, the sender writes 1 MiB at a
// time from memory; else it sendfile(2)s the (page-cached) file `from`. `to` empty, the
// receiver reads 1 MiB at a time and discards; else it writes `to` and fsyncs it, as the
// daemon's atomic writer does. Returns the wall time in ms
// from the first byte sent to the receiver done.
double raw_tcp_ms(std::uint64_t size, const fs::path& from, const fs::path& to) {
  constexpr std::size_t kChunk = 1u << 20;
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof addr;
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(lfd, 1) != 0 || ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) {
    die("raw TCP baseline: cannot listen on loopback");
  }
  std::atomic<bool> rx_ok{false};
  std::thread rx([&] {
    int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    int out = to.empty() ? -1 : ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    std::vector<char> buf(kChunk);
    std::uint64_t got = 0;
    bool ok = to.empty() || out >= 0;
    while (ok && got < size) {
      ssize_t n = ::read(c, buf.data(), buf.size());
      if (n <= 0) break;
      got += static_cast<std::uint64_t>(n);
      if (out >= 0 && ::write(out, buf.data(), static_cast<std::size_t>(n)) != n) ok = false;
    }
    if (out >= 0) {
      ok = ok && ::fsync(out) == 0;
      ::close(out);
    }
    ::close(c);
    rx_ok = ok && got == size;
  });
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0 || ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    die("raw TCP baseline: cannot connect");
  }
  int in = from.empty() ? -1 : ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  std::vector<char> buf(kChunk, 'x');
  auto t0 = Clock::now();
  std::uint64_t sent = 0;
  while (sent < size) {
    std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, size - sent));
    if (in >= 0) {
      ssize_t r = ::sendfile(s, in, nullptr, want);
      if (r <= 0) break;
      sent += static_cast<std::uint64_t>(r);
      continue;
    }
    std::size_t off = 0;
    while (off < want) {
      ssize_t w = ::write(s, buf.data() + off, want - off);
      if (w <= 0) break;
      off += static_cast<std::size_t>(w);
    }
    if (off < want) break;
    sent += want;
  }
  ::close(s);
  rx.join();
  double ms = ms_since(t0);
  if (in >= 0) ::close(in);
  ::close(lfd);
  if (!rx_ok || sent != size) die("raw TCP baseline: transfer failed");
  return ms;
}

void section_files(const Daemon& d, std::uint64_t mb, int rounds) {
  std::printf("\n[files] %llu MiB upload and download, MB/s, medians of %d rounds\n",
              static_cast<unsigned long long>(mb), rounds);
  const std::uint64_t size = mb << 20;
  fs::path src = d.dir() / "src.bin";
  {
    // Incompressible-ish content; page-cached before every measurement alike.
    std::ofstream f(src, std::ios::binary);
    std::vector<char> buf(1 << 20);
    std::uint64_t x = 88172645463325252ull;
    for (std::uint64_t i = 0; i < mb; ++i) {
      for (auto& ch : buf) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ch = static_cast<char>(x);
      }
      f.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    }
  }
  auto mbps = [&](double ms) { return static_cast<double>(mb) / (ms / 1000.0); };
  // Baselines, each measured in every round next to the API transfers:
  //  - cat to local disk (with the fsync the daemon also does) and from local disk (page cache
  //    to /dev/null): what the issue's target is written against;
  //  - the same bytes over raw loopback TCP, file -> socket -> file (+fsync), and file ->
  //    socket -> discarded: the ceiling of the medium the API runs on, with the same disk work;
  //  - raw loopback TCP memory to memory: the medium alone.
  fs::path dst = d.dir() / "dst.bin";
  std::vector<double> cat_up, cat_down, api_up, api_down, tcp_up, tcp_down, tcp_mem;
  Client c = make_client(d);
  create_session(c, "bench-files");
  for (int round = 0; round < rounds; ++round) {
    auto t0 = Clock::now();
    spawn_wait(
        {"sh", "-c",
         "cat '" + src.string() + "' > '" + dst.string() + "' && sync '" + dst.string() + "'"});
    cat_up.push_back(ms_since(t0));
    t0 = Clock::now();
    spawn_wait({"sh", "-c", "cat '" + dst.string() + "' > /dev/null"});
    cat_down.push_back(ms_since(t0));
    fs::remove(dst);

    tcp_up.push_back(raw_tcp_ms(size, src, dst));
    fs::remove(dst);
    tcp_down.push_back(raw_tcp_ms(size, src, {}));
    tcp_mem.push_back(raw_tcp_ms(size, {}, {}));

    int fd = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
    t0 = Clock::now();
    // As `agentbox cp` uploads a local file: sendfile from the file.
    auto r =
        c.upload_file("PUT", "/v1/sessions/bench-files/files?path=/workspace/big.bin", fd, size);
    api_up.push_back(ms_since(t0));
    ::close(fd);
    if (!r || r->status != 200) die("upload failed: " + (r ? r->body : r.error().message));
    std::uint64_t got = 0;
    t0 = Clock::now();
    auto g = c.request_stream("GET", "/v1/sessions/bench-files/files?path=/workspace/big.bin", "",
                              [&got](std::string_view chunk) {
                                got += chunk.size();
                                return true;
                              });
    api_down.push_back(ms_since(t0));
    if (!g || g->status != 200 || got != size) die("download failed");
  }
  long daemon_rss = rss_kib(d.pid());
  double up = mbps(median(api_up)), down = mbps(median(api_down));
  double cup = mbps(median(cat_up)), cdown = mbps(median(cat_down));
  double tup = mbps(median(tcp_up)), tdown = mbps(median(tcp_down));
  double tmem = mbps(median(tcp_mem));
  char vs_tcp[64];
  row("cat to local disk (+fsync)", cup, "MB/s");
  row("raw loopback TCP, file -> socket -> file (+fsync)", tup, "MB/s");
  std::snprintf(vs_tcp, sizeof vs_tcp, ", %.2f of raw TCP", up / tup);
  row("agentbox upload (PUT, atomic, fsynced)", up, "MB/s",
      ratio_note(up / cup, ">= 0.8") + vs_tcp);
  row("cat from local disk (page cache -> /dev/null)", cdown, "MB/s");
  row("raw loopback TCP, file -> socket -> discarded", tdown, "MB/s");
  std::snprintf(vs_tcp, sizeof vs_tcp, ", %.2f of raw TCP", down / tdown);
  row("agentbox download (GET)", down, "MB/s", ratio_note(down / cdown, ">= 0.8") + vs_tcp);
  row("raw loopback TCP, memory -> memory (the medium)", tmem, "MB/s");
  row("daemon RSS after the transfers", static_cast<double>(daemon_rss) / 1024.0, "MiB",
      "(target < 64 MiB)");
}

// This daemon's box inits (defined below with the idle section): its sessions' and its pool's.
std::vector<pid_t> box_inits_of(pid_t daemon);

// Waits (up to 10 s) until the daemon's box inits have not changed in number for 300 ms: its
// pool is full (agentboxd --pool).
void wait_inits_settled(pid_t daemon) {
  std::size_t last = box_inits_of(daemon).size();
  int same = 0;
  for (int i = 0; i < 1000 && same < 30; ++i) {
    usleep(10000);
    std::size_t now = box_inits_of(daemon).size();
    same = now == last ? same + 1 : 0;
    last = now;
  }
}

// New session -> its first exec, `n` sessions one after the other, on a daemon of its own with
// `--pool pool`. `refilled`: before each create, wait (up to 5 s, not timed) until the pool is
// full again: sessions arriving slower than the pool refills. Otherwise back to back.
std::vector<double> time_creates(const std::string& bin, const std::string& backend, int n,
                                 int pool, bool refilled) {
  Daemon d(bin, backend, {"--pool", std::to_string(pool)});
  Client c = make_client(d);
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    if (refilled && pool > 0) {
      for (int w = 0; w < 5000 && static_cast<int>(box_inits_of(d.pid()).size()) < i + pool; ++w) {
        usleep(1000);
      }
    }
    std::string id = "bench-new-" + std::to_string(i);
    auto t0 = Clock::now();
    create_session(c, id);
    if (!exec_true(c, id)) die("first exec failed in " + id);
    t.push_back(ms_since(t0));
  }
  for (int i = 0; i < n; ++i) c.request("DELETE", "/v1/sessions/bench-new-" + std::to_string(i));
  return t;
}

void section_sessions(const std::string& bin, const std::string& backend, int n, int pool) {
  std::printf("\n[sessions] new session -> first exec completes, %d sessions, p50 (p99)\n", n);
  auto off = time_creates(bin, backend, n, 0, false);
  row_m("pool off (--pool 0): create -> first exec", off, "ms", "(target p50 <= 15 ms)");
  if (backend != "ns") return;
  auto on = time_creates(bin, backend, n, pool, true);
  row_m(("pool on (--pool " + std::to_string(pool) + "), refilled between creates").c_str(), on,
        "ms",
        "(target p50 <= 5, p99 <= 15 ms), pool off / on " +
            std::to_string(median(off) / median(on)).substr(0, 4) + "x");
  auto burst = time_creates(bin, backend, n, pool, false);
  row_m(("pool on (--pool " + std::to_string(pool) + "), back to back").c_str(), burst, "ms",
        "(the first " + std::to_string(pool) + " warm, then as fast as the pool refills)");
}

// Bytes of regular files under `dir` (apparent sizes); 0 when it is missing.
std::uintmax_t tree_bytes(const fs::path& dir) {
  std::uintmax_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  }
  return n;
}

// POST /v1/templates/<name>/build?wait=true; dies unless the build made a snapshot. Its id.
std::string build_template(Client& c, const std::string& name, const std::string& yaml) {
  auto put = c.request("POST", "/v1/templates", yaml, "application/yaml");
  if (!put || put->status / 100 != 2)
    die("template " + name + ": " + (put ? put->body : put.error().message));
  auto b = c.request("POST", "/v1/templates/" + name + "/build?wait=true", "{}");
  if (!b || b->status != 201) die("build of " + name + ": " + (b ? b->body : b.error().message));
  auto j = nlohmann::json::parse(b->body, nullptr, false);
  return j.is_object() ? j["snapshot"].value("id", "") : "";
}

// [templates] (issue 13): a session on a snapshot of 10,000 files / 500 MB -> its first exec,
// vs `cp -a` of the same tree (seed 004's way of making a workspace) and vs a session without a
// template; the disk a new session uses; a small template's build vs the same steps by hand.
void section_templates(const Daemon& d, int n, int cp_rounds) {
  std::printf("\n[templates] sessions on a 10,000-file / 500 MB snapshot, %d sessions\n", n);
  Client c = make_client(d);
  auto tb = Clock::now();
  // 10,000 files of 52,429 bytes of random data (nothing compresses or deduplicates).
  std::string snap = build_template(
      c, "bench-big",
      "name: bench-big\nsetup:\n  - mkdir data && cd data && head -c 524290000 /dev/urandom | "
      "split -b 52429 -a 5 -d - f\n");
  row("build of the 500 MB template", ms_since(tb) / 1000.0, "s");
  const fs::path snap_dir = d.dir() / "data" / "snapshots" / snap;

  std::vector<double> tmpl, plain, cp;
  for (int i = 0; i < n; ++i) {
    std::string id = "bench-tmpl-" + std::to_string(i);
    auto t0 = Clock::now();
    auto r = c.request("POST", "/v1/sessions",
                       nlohmann::json{{"id", id}, {"template", "bench-big"}}.dump());
    if (!r || r->status != 201) die("session on template: " + (r ? r->body : r.error().message));
    if (!exec_true(c, id)) die("first exec failed in " + id);
    tmpl.push_back(ms_since(t0));
  }
  for (int i = 0; i < n; ++i) {
    std::string id = "bench-plain-" + std::to_string(i);
    auto t0 = Clock::now();
    create_session(c, id);
    if (!exec_true(c, id)) die("first exec failed in " + id);
    plain.push_back(ms_since(t0));
  }
  for (int i = 0; i < cp_rounds; ++i) {
    fs::path dst = d.dir() / ("cp-" + std::to_string(i));
    auto t0 = Clock::now();
    if (spawn_wait({"cp", "-a", snap_dir.string(), dst.string()}) != 0) die("cp -a failed");
    cp.push_back(ms_since(t0));
    fs::remove_all(dst);
  }
  // What the sessions' own layers hold: one small write each in the first.
  std::uintmax_t layers = 0;
  for (int i = 0; i < n; ++i) {
    layers += tree_bytes(d.dir() / "data" / "layers" / ("bench-tmpl-" + std::to_string(i)));
  }
  const double p50 = percentile(tmpl, 0.5);
  row("template session: create -> first exec p50", p50, "ms", "(target <= 20 ms)");
  row("template session: create -> first exec p99", percentile(tmpl, 0.99), "ms");
  row("plain session: create -> first exec p50", percentile(plain, 0.5), "ms");
  row("plain session: create -> first exec p99", percentile(plain, 0.99), "ms");
  const double cp50 = median(cp);
  row("cp -a of the snapshot (median)", cp50, "ms");
  row("cp -a / template session p50", cp50 / p50, "x", ratio_note(cp50 / p50, ">= 100x"));
  row("disk per new template session", static_cast<double>(layers) / n / 1024.0, "KiB",
      "(its own writes only; the snapshot is " + std::to_string(tree_bytes(snap_dir) >> 20) +
          " MiB)");
  for (int i = 0; i < n; ++i) {
    c.request("DELETE", "/v1/sessions/bench-tmpl-" + std::to_string(i));
    c.request("DELETE", "/v1/sessions/bench-plain-" + std::to_string(i));
  }
  c.request("DELETE", "/v1/templates/bench-big");

  // A small template: two files and three setup lines, built vs done by hand in a session.
  const char* steps[] = {"mkdir -p lib && echo 'x = 1' > lib/x.py", "seq 1 1000 > numbers",
                         "ls -R > listing"};
  std::string yaml = "name: bench-small\nfiles:\n  a.txt: hello\n  conf/b.json: '{}'\nsetup:\n";
  for (const char* s : steps) yaml += std::string("  - \"") + s + "\"\n";
  std::vector<double> built, by_hand;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    build_template(c, "bench-small", yaml);
    built.push_back(ms_since(t0));
    std::string id = "bench-hand-" + std::to_string(i);
    t0 = Clock::now();
    create_session(c, id);
    c.request("PUT", "/v1/sessions/" + id + "/files?path=a.txt", "hello",
              "application/octet-stream");
    c.request("PUT", "/v1/sessions/" + id + "/files?path=conf/b.json&mkdirs=true", "{}",
              "application/octet-stream");
    for (const char* s : steps) {
      auto r =
          c.request("POST", "/v1/sessions/" + id + "/exec", nlohmann::json{{"command", s}}.dump());
      if (!r || r->status != 200) die("by-hand step failed");
    }
    by_hand.push_back(ms_since(t0));
    c.request("DELETE", "/v1/sessions/" + id);
  }
  row_m("small template build (median of 5)", built, "ms");
  row_m("same steps by hand in a new session", by_hand, "ms",
        "(build / by hand " + std::to_string(median(built) / median(by_hand)).substr(0, 4) + "x)");
  c.request("DELETE", "/v1/templates/bench-small");
}

// The parent pid field of /proc/<pid>/stat (-1 if unreadable).
pid_t ppid_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  auto rp = stat.rfind(')');
  if (rp == std::string::npos) return -1;
  std::istringstream rest(stat.substr(rp + 2));
  char state;
  long ppid = -1;
  rest >> state >> ppid;
  return static_cast<pid_t>(ppid);
}

// This daemon's box inits: processes named agentbox-init whose parent is the daemon (it clones
// them), so boxes of other daemons on the machine are not counted.
std::vector<pid_t> box_inits_of(pid_t daemon) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream f(e.path() / "comm");
    std::string comm;
    if (f && std::getline(f, comm) && comm == "agentbox-init") {
      pid_t pid = std::stoi(name);
      if (ppid_of(pid) == daemon) out.push_back(pid);
    }
  }
  return out;
}

// Memory charged to the box cgroup of an init (bytes), -1 if not found. The box cgroup is read
// from the init's /proc/<pid>/cgroup, wherever the daemon put it (its parent is named after its
// runtime dir, "agentbox-<hash>"): v1, the init's memory cgroup; v2, the parent of the init's
// leaf (<box>/init).
long long box_cgroup_usage_bytes(pid_t init) {
  std::ifstream f("/proc/" + std::to_string(init) + "/cgroup");
  std::string v1, v2;
  for (std::string line; std::getline(f, line);) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string ctl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::istringstream ctls(ctl);
    for (std::string c; std::getline(ctls, c, ',');) {
      if (c == "memory") v1 = path;
    }
    if (ctl.empty()) v2 = path;
  }
  std::vector<std::string> candidates;
  if (!v1.empty()) candidates.push_back("/sys/fs/cgroup/memory" + v1 + "/memory.usage_in_bytes");
  if (!v2.empty() && v2.size() > 5 && v2.compare(v2.size() - 5, 5, "/init") == 0) {
    const std::string box = v2.substr(0, v2.size() - 5);
    candidates.push_back("/sys/fs/cgroup" + box + "/memory.current");
    candidates.push_back("/sys/fs/cgroup/unified" + box + "/memory.current");
  }
  for (const auto& p : candidates) {
    std::ifstream u(p);
    long long v;
    if (u >> v) return v;
  }
  return -1;
}

void section_idle(const Daemon& d, const std::string& backend, int n) {
  std::printf("\n[idle] %d live idle sessions\n", n);
  Client c = make_client(d);
  long base_rss = rss_kib(d.pid());
  // Boxes of earlier sections (still up) are not this section's. With a pool (agentboxd
  // --pool P), the P boxes ready now go to the first sessions and P new ones are ready after
  // the loop: still n new inits, each an idle box.
  wait_inits_settled(d.pid());
  std::vector<pid_t> earlier = box_inits_of(d.pid());
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    std::string id = "bench-idle-" + std::to_string(i);
    create_session(c, id);
    if (!exec_true(c, id)) die("exec failed in " + id);
  }
  double secs = ms_since(t0) / 1000.0;
  std::this_thread::sleep_for(std::chrono::seconds(1));
  wait_inits_settled(d.pid());
  long init_kib = 0;
  long long cg_bytes = 0;
  int inits = 0, cgroups = 0;
  for (pid_t init : box_inits_of(d.pid())) {
    if (std::find(earlier.begin(), earlier.end(), init) != earlier.end()) continue;
    long r = rss_kib(init);
    if (r > 0) init_kib += r, ++inits;
    long long u = box_cgroup_usage_bytes(init);
    if (u >= 0) cg_bytes += u, ++cgroups;
  }
  long rss = rss_kib(d.pid());
  row("sessions created (with one exec each)", n, "", "in " + std::to_string(secs) + " s");
  if (backend == "ns") {
    // Each session has a box: its init and its cgroup must both be found, or the per-session
    // figure below would silently leave a part out.
    if (inits != n)
      die("found " + std::to_string(inits) + " box inits of the daemon, want " + std::to_string(n));
    if (cgroups != n)
      die("found the memory cgroup of " + std::to_string(cgroups) + " of " + std::to_string(n) +
          " boxes");
    row("init processes found", inits, "");
    row("box cgroups found", cgroups, "");
    row("  init RSS per session", static_cast<double>(init_kib) / inits / 1024.0, "MiB");
    row("  cgroup usage per session", static_cast<double>(cg_bytes) / cgroups / (1 << 20), "MiB");
  }
  double per = 0;
  if (inits > 0) per += static_cast<double>(init_kib) * 1024.0 / inits;
  if (cgroups > 0) per += static_cast<double>(cg_bytes) / cgroups;
  row("memory per session (init RSS + cgroup usage)", per / (1 << 20), "MiB", "(target <= 2 MiB)");
  row("daemon RSS", static_cast<double>(rss) / 1024.0, "MiB",
      "(+" + std::to_string((rss - base_rss) / 1024) + " MiB over idle)");
  for (int i = 0; i < n; ++i) c.request("DELETE", "/v1/sessions/bench-idle-" + std::to_string(i));
}

// Execs/s of `body` run by `threads` threads for `seconds`.
template <typename Body>
double rate_for(unsigned threads, double seconds, Body body) {
  std::atomic<long> done{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] { body(t, done, stop); });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : ts) th.join();
  return static_cast<double>(done) / seconds;
}

void section_rate(const Daemon& d, int sessions, double seconds) {
  const unsigned threads = std::max(2u, std::thread::hardware_concurrency()) * 2;
  std::printf("\n[rate] execs/s across %d sessions, %u client threads, %.0f s each, alternating\n",
              sessions, threads, seconds);
  {
    Client c = make_client(d);
    for (int i = 0; i < sessions; ++i) create_session(c, "bench-rate-" + std::to_string(i));
  }
  // Alternating 1 s slices of each (medians): the machine's noise hits both alike.
  std::vector<double> bares, apis;
  for (int slice = 0; slice < std::max(1, static_cast<int>(seconds)); ++slice) {
    bares.push_back(
        rate_for(threads, 1.0, [](unsigned, std::atomic<long>& done, std::atomic<bool>& stop) {
          while (!stop) {
            if (spawn_wait({"/bin/true"}) == 0) ++done;
          }
        }));
    apis.push_back(
        rate_for(threads, 1.0, [&](unsigned t, std::atomic<long>& done, std::atomic<bool>& stop) {
          Client c = make_client(d);
          for (unsigned i = t; !stop; i += threads) {
            if (exec_true(c, "bench-rate-" + std::to_string(i % static_cast<unsigned>(sessions)))) {
              ++done;
            }
          }
        }));
  }
  const double bare = median(bares), api = median(apis);
  row("bare posix_spawn /bin/true (median of 1 s slices)", bare, "/s");
  row("agentbox exec across sessions (median of 1 s slices)", api, "/s",
      ratio_note(api / bare, ">= 0.7"));
  Client c = make_client(d);
  for (int i = 0; i < sessions; ++i)
    c.request("DELETE", "/v1/sessions/bench-rate-" + std::to_string(i));
}

void post_ok(Client& c, const std::string& target) {
  auto r = c.request("POST", target, "{}");
  if (!r || r->status != 200) die("POST " + target + ": " + (r ? r->body : r.error().message));
}

void section_lifecycle(const std::string& bin, const std::string& backend, int n_sessions,
                       int iters) {
  std::printf("\n[lifecycle] suspend/resume, restart with %d sessions, cost of persistence\n",
              n_sessions);
  {
    Daemon d(bin, backend, {});
    Client c = make_client(d);
    create_session(c, "bench-life");
    exec_true(c, "bench-life");
    std::vector<double> suspend, resume;
    for (int i = 0; i < iters; ++i) {
      auto t0 = Clock::now();
      post_ok(c, "/v1/sessions/bench-life/suspend");
      suspend.push_back(ms_since(t0));
      t0 = Clock::now();
      if (!exec_true(c, "bench-life")) die("exec after suspend failed");  // resumes, then runs
      resume.push_back(ms_since(t0));
    }
    row_m("suspend (box down, processes gone)", suspend, "ms");
    row_m("resume + first exec of /bin/true", resume, "ms");
    row("suspend + resume round trip", median(suspend) + median(resume), "ms");
  }
  {
    // Persistence on (the default) vs off, the same exec interleaved in blocks so that the
    // machine's noise hits both alike.
    Daemon on(bin, backend, {});
    Daemon off(bin, backend, {"--no-persist"});
    Client con = make_client(on), coff = make_client(off);
    create_session(con, "p");
    create_session(coff, "p");
    for (int i = 0; i < 20; ++i) exec_true(con, "p"), exec_true(coff, "p");
    std::vector<double> t_on, t_off;
    for (int block = 0; block < 10; ++block) {
      for (int i = 0; i < iters; ++i) {
        auto t0 = Clock::now();
        if (!exec_true(con, "p")) die("exec failed");
        t_on.push_back(ms_since(t0));
      }
      for (int i = 0; i < iters; ++i) {
        auto t0 = Clock::now();
        if (!exec_true(coff, "p")) die("exec failed");
        t_off.push_back(ms_since(t0));
      }
    }
    row_m("exec /bin/true, persistence off (--no-persist)", t_off, "ms");
    row_m("exec /bin/true, persistence on (SQLite)", t_on, "ms",
          ratio_note(median(t_on) / median(t_off), "<= 1.05"));
  }
  {
    // Time to ready: an empty data dir vs one holding n_sessions sessions.
    fs::path dir =
        fs::temp_directory_path() / ("agentbox-bench-restart-" + std::to_string(getpid()));
    fs::remove_all(dir);
    double empty_ms;
    {
      Daemon d(bin, backend, {}, dir);
      empty_ms = d.ready_ms();
      Client c = make_client(d);
      for (int i = 0; i < n_sessions; ++i) {
        create_session(c, "r" + std::to_string(i));
        // Keep the box count low: a suspended session is all the restart has to load.
        post_ok(c, "/v1/sessions/r" + std::to_string(i) + "/suspend");
      }
    }
    std::vector<double> full;
    for (int i = 0; i < 5; ++i) {
      Daemon d(bin, backend, {}, dir);
      full.push_back(d.ready_ms());
      if (i == 0) {
        Client c = make_client(d);
        auto r = c.request("GET", "/v1/sessions");
        if (!r || r->status != 200) die("list sessions after the restart failed");
        auto listed = nlohmann::json::parse(r->body, nullptr, false);
        const std::size_t n =
            listed.is_object() ? listed.value("sessions", nlohmann::json::array()).size() : 0;
        if (n != static_cast<std::size_t>(n_sessions)) {
          die("restart brought back " + std::to_string(n) + " sessions, not " +
              std::to_string(n_sessions));
        }
      }
    }
    std::vector<double> empty;
    empty.push_back(empty_ms);
    fs::path dir0 = dir.string() + "-empty";
    for (int i = 0; i < 4; ++i) {
      fs::remove_all(dir0);
      Daemon d(bin, backend, {}, dir0);
      empty.push_back(d.ready_ms());
    }
    row_m("daemon start to ready, empty data dir", empty, "ms");
    row(("daemon start to ready, " + std::to_string(n_sessions) + " sessions in state.db").c_str(),
        median(full), "ms", "all listed after the restart");
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::remove_all(dir0, ec);
  }
}

// ---- Processes and terminals (issue 11): attach, keystrokes, idle processes ---------------------

// A synchronous WebSocket client for the attach and pty routes (Boost.Beast): connected when
// made, so that a measurement can start at the upgrade request.
class BenchWs {
 public:
  explicit BenchWs(const std::string& url) : ws_(io_) {
    std::string hp = url.substr(url.find("://") + 3);
    const std::size_t colon = hp.rfind(':');
    host_ = hp;
    tcp::resolver resolver(io_);
    boost::system::error_code ec;
    auto eps = resolver.resolve(hp.substr(0, colon), hp.substr(colon + 1), ec);
    if (!ec) boost::asio::connect(ws_.next_layer(), eps, ec);
    if (ec) die("WebSocket: connect to " + hp + ": " + ec.message());
    ws_.next_layer().set_option(tcp::no_delay(true), ec);
  }
  // The upgrade (101) on `target`; dies on a refusal.
  void handshake(const std::string& target) {
    boost::beast::websocket::response_type res;
    boost::system::error_code ec;
    ws_.handshake(res, host_, target, ec);
    if (ec)
      die("WebSocket " + target + ": " + ec.message() + " (HTTP " +
          std::to_string(res.result_int()) + ")");
  }
  // The next message's bytes; false once the socket is closed (or failed).
  bool read(std::string* out) {
    boost::beast::flat_buffer buf;
    boost::system::error_code ec;
    ws_.read(buf, ec);
    if (ec) return false;
    *out = boost::beast::buffers_to_string(buf.data());
    return true;
  }
  void write_binary(std::string_view data) {
    ws_.binary(true);
    boost::system::error_code ec;
    ws_.write(boost::asio::buffer(data.data(), data.size()), ec);
    if (ec) die("WebSocket write: " + ec.message());
  }
  // Reads until `want` has come (in any framing), dropping what came before it and it.
  void read_until(std::string& pending, std::string_view want) {
    for (;;) {
      std::size_t at = pending.find(want);
      if (at != std::string::npos) {
        pending.erase(0, at + want.size());
        return;
      }
      std::string more;
      if (!read(&more)) die("WebSocket closed while waiting for terminal output");
      pending += more;
    }
  }
  // Reads until the server closes (the process ended).
  void drain() {
    std::string ignored;
    while (read(&ignored)) {
    }
  }

 private:
  boost::asio::io_context io_;
  boost::beast::websocket::stream<tcp::socket> ws_;
  std::string host_;
};

// A local pty running argv as its controlling terminal, started the cheapest way (posix_spawn:
// a vfork-style clone, as the box's init does): a new session, then the slave opened as stdin,
// which makes it the controlling terminal.
struct LocalPty {
  int master = -1;
  pid_t pid = -1;

  explicit LocalPty(const std::vector<std::string>& args) {
    int slave = -1;
    char name[128];
    if (::openpty(&master, &slave, name, nullptr, nullptr) != 0) die("openpty failed");
    ::fcntl(master, F_SETFD, FD_CLOEXEC);
    ::close(slave);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, name, O_RDWR, 0);
    posix_spawn_file_actions_adddup2(&fa, 0, 1);
    posix_spawn_file_actions_adddup2(&fa, 0, 2);
    int rc = posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) die("cannot start " + args[0] + " on a pty");
  }
  ~LocalPty() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    ::close(master);
  }
  // Some bytes (blocking); empty at the end (EIO once no slave is left).
  std::string read_some() {
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(master, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
    }
  }
  void write_all(std::string_view s) {
    if (::write(master, s.data(), s.size()) != static_cast<ssize_t>(s.size())) die("pty write");
  }
  void read_until(std::string& pending, std::string_view want) {
    for (;;) {
      std::size_t at = pending.find(want);
      if (at != std::string::npos) {
        pending.erase(0, at + want.size());
        return;
      }
      std::string more = read_some();
      if (more.empty()) die("local pty closed while waiting for output");
      pending += more;
    }
  }
  // Until the end, then reaps the child.
  void drain_and_wait() {
    while (!read_some().empty()) {
    }
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

// From spawning argv (stdout a pipe, stdin /dev/null) to its first output byte, in ms; the rest
// is then read and the child reaped.
double first_byte_ms(const std::vector<std::string>& args) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) die("pipe failed");
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  // `script` runs $SHELL: the same /bin/sh as the box's pty route and the local pty.
  std::vector<std::string> env_s = {"SHELL=/bin/sh", "PATH=/usr/bin:/bin", "TERM=xterm-256color"};
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid;
  auto t0 = Clock::now();
  int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(p[1]);
  if (rc != 0) die("cannot run " + args[0]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof buf)) < 0 && errno == EINTR) {
  }
  double ms = ms_since(t0);
  if (n <= 0) die(args[0] + " printed nothing");
  while (::read(p[0], buf, sizeof buf) > 0) {
  }
  ::close(p[0]);
  ::waitpid(pid, nullptr, 0);
  return ms;
}

void row_p(const char* what, const std::vector<double>& v, const std::string& note = "") {
  row_m(what, v, "ms", note);
}

// (a) process start -> first output byte: the pty route (start + attach in one upgrade) in a
// warm ns session vs `script -qc` and a local pty running the same command, interleaved.
void section_attach(const Daemon& d, int n) {
  std::printf(
      "\n[attach] process start -> first output byte of `echo hi` on a pty, %d runs, "
      "p50 (p99)\n",
      n);
  Client c = make_client(d);
  create_session(c, "bench-attach");
  for (int i = 0; i < 5; ++i) exec_true(c, "bench-attach");
  const std::string target = "/v1/sessions/bench-attach/pty?command=echo%20hi";
  std::vector<double> api, scr, local;
  for (int i = 0; i < n + 3; ++i) {
    BenchWs ws(d.url());  // the TCP connection is not part of the figure
    auto t0 = Clock::now();
    ws.handshake(target);
    std::string first;
    if (!ws.read(&first) || first.empty()) die("pty route: no output from `echo hi`");
    double a = ms_since(t0);
    ws.drain();
    double s = first_byte_ms({"script", "-qc", "echo hi", "/dev/null"});
    double l;
    {
      auto t1 = Clock::now();
      LocalPty pty({"/bin/sh", "-c", "echo hi"});
      if (pty.read_some().empty()) die("local pty: no output");
      l = ms_since(t1);
      pty.drain_and_wait();
    }
    if (i < 3) continue;  // warm-up
    api.push_back(a), scr.push_back(s), local.push_back(l);
  }
  row_p("script -qc 'echo hi' (host)", scr);
  row_p("local pty: openpty + posix_spawn /bin/sh -c 'echo hi'", local);
  char note[96];
  std::snprintf(note, sizeof note, "ratio %.2f to script, %.2f to the local pty",
                median(api) / median(scr), median(api) / median(local));
  row_p("agentbox pty route (upgrade -> first frame, ns)", api, note);
}

// (b) keystroke -> echo on a pty: the pty route running /bin/sh vs a local pty of the same shell,
// interleaved key by key. A key is 'a' (echo "a"), each followed by an untimed DEL (echo "\b \b")
// so the line stays empty.
void section_keys(const Daemon& d, int n) {
  std::printf(
      "\n[keys] keystroke -> echo round trip on a pty running /bin/sh, %d keys, p50 "
      "(p99)\n",
      n);
  Client c = make_client(d);
  create_session(c, "bench-keys");
  exec_true(c, "bench-keys");
  BenchWs ws(d.url());
  ws.handshake("/v1/sessions/bench-keys/pty?command=exec%20/bin/sh");
  LocalPty local({"/bin/sh"});
  std::string ws_pending, local_pending;
  std::vector<double> api, loc;
  for (int i = 0; i < n + 10; ++i) {
    auto t0 = Clock::now();
    ws.write_binary("a");
    ws.read_until(ws_pending, "a");
    double a = ms_since(t0);
    ws.write_binary("\x7f");
    ws.read_until(ws_pending, "\b \b");
    t0 = Clock::now();
    local.write_all("a");
    local.read_until(local_pending, "a");
    double l = ms_since(t0);
    local.write_all("\x7f");
    local.read_until(local_pending, "\b \b");
    if (i < 10) continue;  // warm-up (and the prompts)
    api.push_back(a), loc.push_back(l);
  }
  // Both shells exit; the pty route's socket then closes (1000, "exit 0").
  ws.write_binary("exit\n");
  ws.drain();
  local.write_all("exit\n");
  local.drain_and_wait();
  row_p("local pty of /bin/sh: write a key, read its echo", loc);
  row_p("agentbox pty route (ns): binary frame -> echo frame", api,
        ratio_note(median(api) / median(loc), "(agentbox / local pty)"));
}

struct CpuSample {
  long ticks = 0;  // utime + stime
  Clock::time_point at;
};
CpuSample cpu_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  CpuSample s;
  s.at = Clock::now();
  auto rp = stat.rfind(')');
  if (rp == std::string::npos) return s;
  std::istringstream rest(stat.substr(rp + 2));
  std::string field;
  // Fields 3.. of stat(5): utime and stime are the 14th and 15th.
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) s.ticks += std::stol(field);
  }
  return s;
}
int threads_of(pid_t pid) {
  int n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec);
       !ec && it != fs::directory_iterator(); ++it) {
    ++n;
  }
  return n;
}
// The daemon's CPU time (ms) over `seconds` of doing nothing asked by a client.
double idle_cpu_ms(pid_t pid, double seconds) {
  CpuSample a = cpu_of(pid);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  CpuSample b = cpu_of(pid);
  return static_cast<double>(b.ticks - a.ticks) * 1000.0 /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// (c) 1,000 idle background processes (`sleep 3600`) across 100 sessions: the daemon's RSS, its
// CPU while they idle, and its thread count, each next to the same daemon with the same
// sessions (boxes up) and no process.
void section_procs(const Daemon& d, int sessions, int total, double idle_seconds) {
  const int per = std::max(1, total / sessions);
  std::printf("\n[procs] %d idle background processes (sleep 3600) across %d sessions\n",
              per * sessions, sessions);
  auto id_of = [](int i) { return "bench-procs-" + std::to_string(i); };
  {
    Client c = make_client(d);
    for (int i = 0; i < sessions; ++i) {
      create_session(c, id_of(i));
      if (!exec_true(c, id_of(i))) die("exec failed in " + id_of(i));
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const long rss0 = rss_kib(d.pid());
  const int threads0 = threads_of(d.pid());
  const double cpu0 = idle_cpu_ms(d.pid(), idle_seconds);

  auto t0 = Clock::now();
  std::atomic<int> failed{0};
  std::vector<std::thread> ts;
  const int nthreads = 4;
  for (int t = 0; t < nthreads; ++t) {
    ts.emplace_back([&, t] {
      Client c = make_client(d);
      static const std::string body = R"({"argv":["sleep","3600"]})";
      for (int i = t; i < sessions; i += nthreads) {
        for (int k = 0; k < per; ++k) {
          auto r = c.request("POST", "/v1/sessions/" + id_of(i) + "/processes", body);
          if (!r || r->status != 201) {
            if (failed++ == 0) {
              std::fprintf(stderr, "start failed: %s\n",
                           r ? r->body.c_str() : r.error().message.c_str());
            }
          }
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  const double start_s = ms_since(t0) / 1000.0;
  if (failed > 0) die(std::to_string(failed.load()) + " process starts failed");
  // Every one of them is running (listed as such by its session).
  int running = 0;
  {
    Client c = make_client(d);
    for (int i = 0; i < sessions; ++i) {
      auto r = c.request("GET", "/v1/sessions/" + id_of(i) + "/processes");
      if (!r || r->status != 200) die("list processes of " + id_of(i));
      auto j = nlohmann::json::parse(r->body, nullptr, false);
      for (const auto& p : j.value("processes", nlohmann::json::array())) {
        if (p.value("state", "") == "running") ++running;
      }
    }
  }
  if (running != per * sessions) {
    die(std::to_string(running) + " processes running, want " + std::to_string(per * sessions));
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const long rss1 = rss_kib(d.pid());
  const int threads1 = threads_of(d.pid());
  const double cpu1 = idle_cpu_ms(d.pid(), idle_seconds);

  row("processes started and listed running", running, "",
      "in " + std::to_string(start_s).substr(0, 5) + " s");
  row("daemon RSS, the sessions without processes", static_cast<double>(rss0) / 1024.0, "MiB");
  char note[128];
  std::snprintf(note, sizeof note, "+%.1f MiB, %.1f KiB per process",
                static_cast<double>(rss1 - rss0) / 1024.0,
                static_cast<double>(rss1 - rss0) / running);
  row("daemon RSS with the processes", static_cast<double>(rss1) / 1024.0, "MiB", note);
  std::snprintf(note, sizeof note, "over %.0f s: %.2f%% of a core", idle_seconds,
                cpu0 / (idle_seconds * 10.0));
  row("daemon CPU idle, the sessions without processes", cpu0, "ms", note);
  std::snprintf(note, sizeof note, "over %.0f s: %.2f%% of a core", idle_seconds,
                cpu1 / (idle_seconds * 10.0));
  row("daemon CPU idle with the processes", cpu1, "ms", note);
  row("daemon threads, the sessions without processes", threads0, "");
  row("daemon threads with the processes", threads1, "",
      threads1 <= threads0 ? "no thread per process" : "MORE THREADS: a thread per process?");
  Client c = make_client(d);
  for (int i = 0; i < sessions; ++i) c.request("DELETE", "/v1/sessions/" + id_of(i));
  if (threads1 > threads0 + 2) die("the daemon grew threads with its processes");
}

// [ab] The same exec figures for two daemon binaries (A: --ab-daemon, e.g. the build before a
// change; B: --daemon), interleaved exec by exec and slice by slice so that a noisy machine hits
// both alike: the way to tell whether a change to the exec path regressed.
void section_ab(const Daemon& b, const std::string& a_bin, const std::string& backend, int n,
                int sessions, double seconds) {
  Daemon a(a_bin, backend, {});
  std::printf(
      "\n[ab] A = %s, B = %s: exec round trip (%d each, interleaved) and execs/s "
      "across %d sessions (1 s slices, alternating)\n",
      a_bin.c_str(), b.bin().c_str(), n, sessions);
  Client ca = make_client(a), cb = make_client(b);
  create_session(ca, "bench-ab");
  create_session(cb, "bench-ab");
  for (int i = 0; i < 20; ++i) exec_true(ca, "bench-ab"), exec_true(cb, "bench-ab");
  std::vector<double> ta, tb, bare;
  auto timed_exec = [](Client& c, std::vector<double>& out) {
    auto t0 = Clock::now();
    if (!exec_true(c, "bench-ab")) die("exec failed");
    out.push_back(ms_since(t0));
  };
  for (int i = 0; i < n; ++i) {
    // Which goes first alternates: neither is always the one right after the bare spawn.
    if (i % 2 == 0) {
      timed_exec(ca, ta), timed_exec(cb, tb);
    } else {
      timed_exec(cb, tb), timed_exec(ca, ta);
    }
    auto t0 = Clock::now();
    if (spawn_wait({"/bin/true"}) != 0) die("/bin/true failed");
    bare.push_back(ms_since(t0));
  }
  row_p("bare posix_spawn /bin/true", bare);
  row_p("A: exec via HTTP keep-alive", ta, ratio_note(median(ta) / median(bare), "A / bare"));
  row_p("B: exec via HTTP keep-alive", tb,
        ratio_note(median(tb) / median(bare), "B / bare") + ", B/A " +
            std::to_string(median(tb) / median(ta)).substr(0, 4));

  for (int i = 0; i < sessions; ++i) {
    create_session(ca, "bench-abr-" + std::to_string(i));
    create_session(cb, "bench-abr-" + std::to_string(i));
  }
  const unsigned threads = std::max(2u, std::thread::hardware_concurrency()) * 2;
  auto api = [&](const Daemon& d) {
    return [&d, sessions, threads](unsigned t, std::atomic<long>& done, std::atomic<bool>& stop) {
      Client c = make_client(d);
      for (unsigned i = t; !stop; i += threads) {
        if (exec_true(c, "bench-abr-" + std::to_string(i % static_cast<unsigned>(sessions)))) {
          ++done;
        }
      }
    };
  };
  auto spawn = [](unsigned, std::atomic<long>& done, std::atomic<bool>& stop) {
    while (!stop) {
      if (spawn_wait({"/bin/true"}) == 0) ++done;
    }
  };
  std::vector<double> ra, rb, rbare;
  for (int s = 0; s < std::max(1, static_cast<int>(seconds)); ++s) {
    if (s % 2 == 0) {
      ra.push_back(rate_for(threads, 1.0, api(a)));
      rb.push_back(rate_for(threads, 1.0, api(b)));
    } else {
      rb.push_back(rate_for(threads, 1.0, api(b)));
      ra.push_back(rate_for(threads, 1.0, api(a)));
    }
    rbare.push_back(rate_for(threads, 1.0, spawn));
  }
  row("bare posix_spawn /bin/true, median of 1 s slices", median(rbare), "/s");
  row("A: execs/s across sessions", median(ra), "/s",
      ratio_note(median(ra) / median(rbare), ">= 0.7"));
  row("B: execs/s across sessions", median(rb), "/s",
      ratio_note(median(rb) / median(rbare), ">= 0.7") + ", B/A " +
          std::to_string(median(rb) / median(ra)).substr(0, 4));
  for (int i = 0; i < sessions; ++i) {
    ca.request("DELETE", "/v1/sessions/bench-abr-" + std::to_string(i));
    cb.request("DELETE", "/v1/sessions/bench-abr-" + std::to_string(i));
  }
}

}  // namespace

// ---- network (issue 12) -------------------------------------------------------------------------

// A minimal HTTP/1.0 server on 127.0.0.1:<ephemeral> for the network section: any GET answers
// `bytes` bytes; a connection that sends no request is just closed.
class BulkServer {
 public:
  explicit BulkServer(std::uint64_t bytes) : bytes_(bytes) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 512) != 0) {
      die("network: bulk server cannot listen");
    }
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~BulkServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  void serve() {
    // Shared with the connection threads, which may outlive this loop.
    auto buf = std::make_shared<const std::vector<char>>(1 << 20, 'x');
    while (!stop_) {
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::thread([c, buf, n = bytes_] {
        std::string head;
        char in[4096];
        while (head.find("\r\n\r\n") == std::string::npos && head.size() < 65536) {
          ssize_t k = ::read(c, in, sizeof in);
          if (k <= 0) break;
          head.append(in, static_cast<std::size_t>(k));
        }
        if (head.find("\r\n\r\n") != std::string::npos) {
          std::string h = "HTTP/1.0 200 OK\r\nContent-Length: " + std::to_string(n) +
                          "\r\nConnection: close\r\n\r\n";
          bool ok = ::send(c, h.data(), h.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(h.size());
          for (std::uint64_t left = n; ok && left > 0;) {
            ssize_t k =
                ::send(c, buf->data(), std::min<std::uint64_t>(left, buf->size()), MSG_NOSIGNAL);
            if (k <= 0) break;
            left -= static_cast<std::uint64_t>(k);
          }
        }
        ::close(c);
      }).detach();
    }
  }
  int fd_ = -1;
  int port_ = 0;
  std::uint64_t bytes_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// stdout of `cmd` run by /bin/sh (the host side of the network section).
std::string host_output(const std::string& cmd) {
  std::string out;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char b[4096];
    std::size_t n;
    while ((n = std::fread(b, 1, sizeof b, f)) > 0) out.append(b, n);
    ::pclose(f);
  }
  return out;
}

// stdout of argv run in box `id` (dies on an API error).
std::string box_output(Client& c, const std::string& id, const std::vector<std::string>& argv) {
  nlohmann::json body = {{"argv", argv}, {"timeout_sec", 300}};
  auto r = c.request("POST", "/v1/sessions/" + id + "/exec", body.dump());
  if (!r || r->status != 200)
    die("network: exec in " + id + ": " + (r ? r->body : r.error().message));
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  return j.is_object() ? j.value("stdout", "") : "";
}

void create_session_network(Client& c, const std::string& id, const nlohmann::json& network) {
  nlohmann::json body = {{"id", id}, {"network", network}};
  auto r = c.request("POST", "/v1/sessions", body.dump());
  if (!r || (r->status != 201 && r->status != 200)) {
    die("create session " + id + ": " + (r ? r->body : r.error().message));
  }
}

// Connection setup, `n` times, medians in ms: with `proxy`, connect to 127.0.0.1:3128 and send
// CONNECT host:port until the proxy's 200; without, a TCP connect to host:port.
std::string setup_script(int n, bool proxy, const std::string& host, int port) {
  return "import socket,time,statistics\n"
         "t=[]\n"
         "for i in range(" +
         std::to_string(n) +
         "):\n"
         "  a=time.perf_counter()\n" +
         (proxy ? "  s=socket.create_connection(('127.0.0.1',3128))\n"
                  "  s.sendall(b'CONNECT " +
                      host + ":" + std::to_string(port) +
                      " HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
                      "  d=b''\n"
                      "  while b'\\r\\n\\r\\n' not in d: d+=s.recv(1024)\n"
                      "  assert d.startswith(b'HTTP/1.1 200')\n"
                : "  s=socket.create_connection(('" + host + "'," + std::to_string(port) + "))\n") +
         "  t.append((time.perf_counter()-a)*1000); s.close()\n"
         "print(statistics.median(t))\n";
}

void network_section_body(const std::string& bin, int starts) {
  const std::uint64_t kBytes = 256ull << 20;
  BulkServer server(kBytes);
  const std::string port = std::to_string(server.port());
  fs::path cfg_dir = fs::temp_directory_path() / ("agentbox-bench-net-" + std::to_string(getpid()));
  fs::create_directories(cfg_dir);
  const std::string cfg = (cfg_dir / "agentboxd.yaml").string();
  std::ofstream(cfg) << "network:\n  hosts:\n    dl.example.test: 127.0.0.1\n";
  {
    Daemon d(bin, "ns", {"--config", cfg});
    Client c = make_client(d);
    const nlohmann::json al = {{"mode", "allowlist"}, {"allow", {"dl.example.test:" + port}}};
    create_session_network(c, "bench-net-al", al);

    std::printf("\n[network] 256 MiB download, 3 rounds, medians (curl's own timing)\n");
    const std::string curl_w = "-s -o /dev/null -w '%{speed_download}'";
    std::vector<double> direct, proxied;
    for (int i = 0; i < 3; ++i) {
      direct.push_back(
          std::atof(host_output("curl " + curl_w + " http://127.0.0.1:" + port + "/big").c_str()) /
          1e6);
      proxied.push_back(
          std::atof(box_output(
                        c, "bench-net-al",
                        {"sh", "-c", "curl " + curl_w + " http://dl.example.test:" + port + "/big"})
                        .c_str()) /
          1e6);
    }
    row("host curl, direct (baseline)", median(direct), "MB/s");
    row("box curl through the allowlist proxy", median(proxied), "MB/s",
        ratio_note(median(proxied) / median(direct), ">= 0.8"));

    std::printf("\n[network] connection setup, 200 connections, median\n");
    const double d_ms = std::atof(
        host_output("python3 -c \"" + setup_script(200, false, "127.0.0.1", server.port()) + "\"")
            .c_str());
    const double p_ms = std::atof(
        box_output(c, "bench-net-al",
                   {"python3", "-c", setup_script(200, true, "dl.example.test", server.port())})
            .c_str());
    row("TCP connect on the host, direct (baseline)", d_ms, "ms");
    row("box CONNECT through the proxy until 200", p_ms, "ms",
        ratio_note(d_ms > 0 ? p_ms / d_ms : 0, "(proxy / direct)"));

    std::printf("\n[network] box start: create -> first exec, %d sessions per mode, median\n",
                starts);
    double none_ms = 0;
    for (const char* mode : {"none", "allowlist", "open"}) {
      std::vector<double> t;
      for (int i = 0; i < starts; ++i) {
        const std::string id = std::string("bench-start-") + mode + "-" + std::to_string(i);
        nlohmann::json nw = {{"mode", mode}};
        if (std::string(mode) == "allowlist") nw["allow"] = {"dl.example.test"};
        auto t0 = Clock::now();
        create_session_network(c, id, nw);
        if (!exec_true(c, id)) die("first exec failed in " + id);
        t.push_back(ms_since(t0));
        c.request("DELETE", "/v1/sessions/" + id);
      }
      const double m = median(t);
      if (std::string(mode) == "none") {
        none_ms = m;
        row("mode none (baseline)", m, "ms");
      } else {
        row((std::string("mode ") + mode).c_str(), m, "ms", ratio_note(m / none_ms, "(vs none)"));
      }
    }
  }
  std::error_code ec;
  fs::remove_all(cfg_dir, ec);
}

// In a child process with a network namespace of its own (`lo` up): the open mode's veths, nft
// tables and ip_forward switch stay there and vanish with it.
void section_network(const std::string& bin, int starts) {
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid < 0) die("network: fork");
  if (pid == 0) {
    if (::unshare(CLONE_NEWNET) != 0) die("network: unshare(CLONE_NEWNET) needs root");
    int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    ::ioctl(s, SIOCGIFFLAGS, &ifr);
    ifr.ifr_flags |= IFF_UP;
    ::ioctl(s, SIOCSIFFLAGS, &ifr);
    ::close(s);
    network_section_body(bin, starts);
    std::fflush(stdout);
    ::_exit(0);
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("network section failed");
}

// ---- runners (issue 14): daemon -> agentbox-runner on loopback ----------------------------------

long hwm_kib(pid_t pid) {
  return status_kib(pid, "VmHWM:");
}

pid_t start_runner(const std::string& bin, const std::string& url, const std::string& token,
                   const fs::path& ws) {
  fs::create_directories(ws);
  return bench::spawn_stdout_quiet(
      {bin, "--server", url, "--token", token, "--workspace", ws.string(), "--log-level", "error"});
}

int connected_runners(Client& c) {
  auto r = c.request("GET", "/v1/runners");
  if (!r || r->status != 200) return 0;
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  int n = 0;
  if (j.is_object() && j["runners"].is_array()) {
    for (const auto& x : j["runners"]) n += x.value("connected", false) ? 1 : 0;
  }
  return n;
}

std::vector<double> time_execs(Client& c, const std::string& id, int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    if (!exec_true(c, id)) die("exec /bin/true on " + id + " failed");
    v.push_back(ms_since(t0));
  }
  return v;
}

void section_runners(const std::string& bin, int n, std::uint64_t mb, int count) {
  std::printf(
      "\n[runners] daemon -> agentbox-runner on loopback (xbot's protocol + version 3: "
      "process streams, binary chunks over 4 MiB)\n");
  const std::string runner_bin = (fs::path(bin).parent_path() / "agentbox-runner").string();
  if (!fs::exists(runner_bin)) die("no " + runner_bin);
  std::vector<std::string> extra;
  for (int i = 0; i < count; ++i) {
    extra.push_back("--runner-token");
    extra.push_back("r" + std::to_string(i) + "=tok" + std::to_string(i));
  }
  Daemon d(bin, "host", extra);
  const std::string ws_url = "ws://" + d.url().substr(7) + "/ws/";
  std::vector<pid_t> runners;
  struct Stop {
    std::vector<pid_t>* p;
    ~Stop() {
      for (pid_t x : *p) kill(x, SIGTERM);
      for (pid_t x : *p) waitpid(x, nullptr, 0);
    }
  } stop{&runners};
  runners.push_back(start_runner(runner_bin, ws_url + "r0", "tok0", d.dir() / "ws0"));
  Client c = make_client(d);
  for (int i = 0; i < 10000 && connected_runners(c) < 1; ++i) usleep(1000);
  if (connected_runners(c) < 1) die("agentbox-runner did not register");
  create_session(c, "bench-host");
  nlohmann::json body = {{"id", "bench-remote"}, {"runner", "r0"}};
  auto cr = c.request("POST", "/v1/sessions", body.dump());
  if (!cr || cr->status != 201) die("remote session: " + (cr ? cr->body : cr.error().message));
  for (int i = 0; i < 20; ++i) {
    exec_true(c, "bench-host");
    exec_true(c, "bench-remote");
  }
  std::vector<double> host, remote;
  for (int i = 0; i < n; ++i) {  // interleaved: the noise hits both alike
    auto h = time_execs(c, "bench-host", 1);
    auto r = time_execs(c, "bench-remote", 1);
    host.push_back(h[0]);
    remote.push_back(r[0]);
  }
  double mh = median(host), mr = median(remote);
  std::printf("  exec /bin/true, %d iterations, medians\n", n);
  row("host backend session (HTTP -> spawn)", mh, "ms");
  row("remote session (HTTP -> daemon -> runner -> spawn)", mr, "ms",
      ratio_note(mr / mh, "<= 1.5"));

  // Many runners connected: the daemon's memory per connection and routing time.
  long rss0 = rss_kib(d.pid());
  for (int i = 1; i < count; ++i) {
    runners.push_back(start_runner(runner_bin, ws_url + "r" + std::to_string(i),
                                   "tok" + std::to_string(i),
                                   d.dir() / ("ws" + std::to_string(i))));
  }
  for (int i = 0; i < 600 && connected_runners(c) < count; ++i) usleep(100000);
  int connected = connected_runners(c);
  long rss1 = rss_kib(d.pid());
  std::printf("  %d runners connected\n", connected);
  row("daemon RSS with them", static_cast<double>(rss1) / 1024.0, "MiB",
      "(+" + std::to_string((rss1 - rss0) / std::max(1, connected - 1)) + " KiB per runner)");
  nlohmann::json last = {{"id", "bench-last"}, {"runner", "r" + std::to_string(count - 1)}};
  auto cl = c.request("POST", "/v1/sessions", last.dump());
  if (!cl || cl->status != 201) die("session on the last runner failed");
  for (int i = 0; i < 20; ++i) exec_true(c, "bench-last");
  std::vector<double> first_r, last_r;
  for (int i = 0; i < n / 2; ++i) {
    first_r.push_back(time_execs(c, "bench-remote", 1)[0]);
    last_r.push_back(time_execs(c, "bench-last", 1)[0]);
  }
  row_m("exec /bin/true on runner r0 with all connected", first_r, "ms",
        ratio_note(median(first_r) / mr, "~1 (vs one runner)"));
  row_m("exec /bin/true on the last runner registered", last_r, "ms");
  // Files: over 4 MiB in 1 MiB binary chunks each way (docs/runner-protocol.md version 2).
  const std::uint64_t size = mb << 20;
  std::string data(size, '\0');
  std::uint64_t x = 88172645463325252ull;
  for (auto& ch : data) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ch = static_cast<char>(x);
  }
  auto t0 = Clock::now();
  auto up = c.request("PUT", "/v1/sessions/bench-remote/files?path=big.bin", data,
                      "application/octet-stream");
  double up_ms = ms_since(t0);
  if (!up || up->status != 200) die("remote upload: " + (up ? up->body : up.error().message));
  std::uint64_t got = 0;
  t0 = Clock::now();
  auto g = c.request_stream("GET", "/v1/sessions/bench-remote/files?path=big.bin", "",
                            [&got](std::string_view chunk) {
                              got += chunk.size();
                              return true;
                            });
  double down_ms = ms_since(t0);
  if (!g || g->status != 200 || got != size) die("remote download failed");
  double tcp =
      median({raw_tcp_ms(size, {}, {}), raw_tcp_ms(size, {}, {}), raw_tcp_ms(size, {}, {})});
  auto mbps = [&](double ms) { return static_cast<double>(mb) / (ms / 1000.0); };
  std::printf("  %llu MiB file through a remote session, MB/s\n",
              static_cast<unsigned long long>(mb));
  row("raw loopback TCP, memory -> memory", mbps(tcp), "MB/s");
  row("upload (PUT -> daemon -> runner -> disk)", mbps(up_ms), "MB/s",
      ratio_note(tcp / up_ms, ">= 0.5"));
  row("download (runner -> daemon -> GET)", mbps(down_ms), "MB/s",
      ratio_note(tcp / down_ms, ">= 0.5"));
  row("daemon peak RSS (VmHWM)", static_cast<double>(hwm_kib(d.pid())) / 1024.0, "MiB");
  row("runner r0 peak RSS (VmHWM)", static_cast<double>(hwm_kib(runners[0])) / 1024.0, "MiB");
}

// The E2B dialect through the stock `e2b` SDK (tests/node/e2b_bench.mjs, which also times the
// native /v1 exec from the same Node process so both sides pay the same client runtime).
void section_e2b(const Daemon& d, int runs, int creates) {
  std::printf(
      "\n[e2b] stock e2b SDK vs native /v1 exec (same Node client), %d runs, "
      "%d creates, p50 (p99)\n",
      runs, creates);
  std::string cmd = std::string("cd ") + AGENTBOX_NODE_DIR + " && node e2b_bench.mjs " + d.url() +
                    " " + std::to_string(runs) + " " + std::to_string(creates);
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) die("e2b: cannot run node");
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (::pclose(p) != 0) die("e2b: the node bench failed: " + out);
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded()) die("e2b: bad output: " + out);
  auto v = [&](const char* k) { return j[k].get<std::vector<double>>(); };
  auto sdk = v("sdk_run"), bash = v("native_bash"), tru = v("native_true"), cf = v("create_first");
  auto ncf = v("native_create_first");
  row_p("native /v1 exec argv /bin/true", tru);
  row_p("native /v1 exec /bin/bash -l -c true (what the SDK runs)", bash);
  row_p("e2b commands.run(\"true\")", sdk,
        ratio_note(median(sdk) / median(bash), "<= 1.3 vs the same command native") + ", " +
            std::to_string(median(sdk) / median(tru)).substr(0, 4) + "x vs /bin/true");
  row_p("native POST /v1/sessions -> first exec of /bin/bash -l -c true", ncf);
  row_p("Sandbox.create() -> first commands.run(\"true\")", cf,
        "(target p50 <= 20 ms), " + std::to_string(median(cf) / median(ncf)).substr(0, 4) +
            "x the native");
}

int main(int argc, char** argv) {
  CLI::App app{"agentbox benchmarks, side by side with their baselines"};
  std::string daemon = "build/bin/agentboxd", backend = "host";
  std::vector<std::string> sections = {"exec", "files"};
  int iterations = 500, sessions = 100, idle = 1000;
  std::uint64_t file_mb = 256;
  int file_rounds = 5;
  double rate_seconds = 5;
  int procs = 1000, keys = 300, attaches = 100;
  double idle_seconds = 10;
  std::string ab_daemon;
  app.add_option("--daemon", daemon, "agentboxd binary");
  app.add_option("--backend", backend, "backend to measure");
  app.add_option(
         "--section", sections,
         "exec files sessions idle rate lifecycle attach keys procs ab network e2b templates "
         "runners")
      ->delimiter(',');
  int net_starts = 20;
  app.add_option("--net-starts", net_starts, "box starts per network mode (network section)");
  app.add_option("--iterations", iterations);
  app.add_option("--sessions", sessions);
  app.add_option("--idle", idle);
  app.add_option("--file-mb", file_mb);
  app.add_option("--file-rounds", file_rounds, "rounds of the files section (medians)");
  app.add_option("--rate-seconds", rate_seconds);
  app.add_option("--procs", procs, "idle background processes of the procs section");
  app.add_option("--idle-seconds", idle_seconds, "how long the procs section measures idle CPU");
  app.add_option("--keys", keys, "keystrokes of the keys section");
  app.add_option("--attaches", attaches, "runs of the attach section");
  std::uint64_t runner_file_mb = 32;
  int runner_count = 100;
  app.add_option("--runner-file-mb", runner_file_mb, "runners section: file size, MiB");
  app.add_option("--runners", runner_count, "runners section: runners connected at once");
  app.add_option("--ab-daemon", ab_daemon, "section ab: the agentboxd to compare --daemon with");
  int e2b_runs = 300, e2b_creates = 50;
  app.add_option("--e2b-runs", e2b_runs, "commands.run calls of the e2b section");
  app.add_option("--e2b-creates", e2b_creates, "Sandbox.create calls of the e2b section");
  int pool = 4;
  app.add_option("--pool", pool, "sessions section: the pool size of its pool-on runs");
  std::string json_out;
  app.add_option("--json", json_out, "also write every figure to this file (JSON)");
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);

  Daemon d(daemon, backend, {});
  std::printf("agentbox-bench: backend %s, daemon %s\n", backend.c_str(), d.url().c_str());
  for (const auto& s : sections) {
    bench::report().section = s;
    if (s == "exec")
      section_exec(d, backend, iterations);
    else if (s == "files")
      section_files(d, file_mb, file_rounds);
    else if (s == "sessions")
      section_sessions(daemon, backend, sessions, pool);
    else if (s == "idle")
      section_idle(d, backend, idle);
    else if (s == "rate")
      section_rate(d, sessions, rate_seconds);
    else if (s == "lifecycle")
      section_lifecycle(daemon, backend, idle, 30);
    else if (s == "attach")
      section_attach(d, attaches);
    else if (s == "keys")
      section_keys(d, keys);
    else if (s == "procs")
      section_procs(d, sessions, procs, idle_seconds);
    else if (s == "ab" && !ab_daemon.empty())
      section_ab(d, ab_daemon, backend, iterations, sessions, rate_seconds);
    else if (s == "ab")
      die("section ab needs --ab-daemon");
    else if (s == "network")
      section_network(daemon, net_starts);
    else if (s == "runners")
      section_runners(daemon, iterations, runner_file_mb, runner_count);
    else if (s == "e2b")
      section_e2b(d, e2b_runs, e2b_creates);
    else if (s == "cluster")
      bench::section_cluster(daemon, backend, iterations, file_mb, sessions);
    else if (s == "templates")
      section_templates(d, sessions > 50 ? 50 : sessions, 3);
    else
      die("unknown section " + s);
    std::fflush(stdout);
  }
  if (!json_out.empty()) {
    nlohmann::json meta = {{"backend", backend}, {"sections", sections}};
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    meta["host"] = host;
    meta["cores"] = std::thread::hardware_concurrency();
    meta["time"] = static_cast<long long>(std::time(nullptr));
    if (!bench::write_json(json_out, meta)) die("cannot write " + json_out);
  }
  return 0;
}
