#include "net/open_egress.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/ip/address_v4.hpp>
#include <cerrno>
#include <fstream>
#include <mutex>

#include "common/unique_fd.h"

namespace agentbox::net {
namespace {

constexpr char kHostTable[] = "agentbox_open";
constexpr char kIfPrefix[] = "abo";

// The first of `dirs`/`name` that is executable, or "".
std::string find_tool(const char* name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    std::string p = std::string(dir) + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

const std::string& ip_tool() {
  static const std::string p = find_tool("ip");
  return p;
}
const std::string& nft_tool() {
  static const std::string p = find_tool("nft");
  return p;
}

Status tools_present() {
  if (ip_tool().empty()) {
    return fail(Code::kUnavailable, "network.mode \"open\" needs `ip` (Debian package iproute2)");
  }
  if (nft_tool().empty()) {
    return fail(Code::kUnavailable, "network.mode \"open\" needs `nft` (Debian package nftables)");
  }
  return {};
}

std::string v4_string(uint32_t a) {
  return boost::asio::ip::address_v4(a).to_string();
}

// Where the next box's index search starts (the claim itself is the interface name).
std::atomic<uint32_t> g_next_index{0};

}  // namespace

Result<std::string> run_tool(const std::vector<std::string>& argv, const std::string& input,
                             int netns_fd) {
  if (argv.empty()) return fail(Code::kInvalid, "run_tool: empty argv");
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return fail_errno(errno, "pipe2");
  UniqueFd in_r(in[0]), in_w(in[1]);
  if (::pipe2(out, O_CLOEXEC) != 0) return fail_errno(errno, "pipe2");
  UniqueFd out_r(out[0]), out_w(out[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  char* const envp[] = {const_cast<char*>("PATH=/usr/sbin:/usr/bin:/sbin:/bin"), nullptr};
  const pid_t pid = ::fork();
  if (pid < 0) return fail_errno(errno, "fork(" + argv[0] + ")");
  if (pid == 0) {
    // Only async-signal-safe calls from here on.
    if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) ::_exit(126);
    if (::dup2(in_r.get(), 0) < 0 || ::dup2(out_w.get(), 1) < 0 || ::dup2(out_w.get(), 2) < 0) {
      ::_exit(126);
    }
    ::execve(args[0], args.data(), envp);
    ::_exit(127);
  }
  in_r.reset();
  out_w.reset();
  size_t off = 0;
  while (off < input.size()) {
    const ssize_t n = ::write(in_w.get(), input.data() + off, input.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  in_w.reset();
  std::string output;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(out_r.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output.size() < 64 * 1024) output.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string what = argv[0];
    for (size_t i = 1; i < argv.size(); ++i) what += " " + argv[i];
    const std::string how = WIFEXITED(status)
                                ? "exited " + std::to_string(WEXITSTATUS(status))
                                : "died of signal " + std::to_string(WTERMSIG(status));
    while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
    return fail(Code::kInternal, what + " " + how + (output.empty() ? "" : ": " + output));
  }
  return output;
}

std::string box_ruleset(const NetworkConfig& config) {
  std::string r =
      "table inet agentbox\n"
      "delete table inet agentbox\n"
      "table inet agentbox {\n"
      "  chain output {\n"
      "    type filter hook output priority filter; policy accept;\n"
      "    oifname \"lo\" accept\n";
  const std::string reject = " reject with icmpx type admin-prohibited\n";
  r += "    ip daddr " + v4_string(config.open_subnet) + "/" + std::to_string(config.open_prefix) +
       reject;
  for (const std::string& cidr : refused_v4_cidrs(config.allow_private)) {
    r += "    ip daddr " + cidr + reject;
  }
  r += "    meta nfproto ipv6" + reject;
  r += "  }\n}\n";
  return r;
}

Status ensure_host_rules() {
  static std::mutex mu;
  static bool done = false;
  std::lock_guard lk(mu);
  if (done) return {};
  if (auto st = tools_present(); !st) return st;
  {
    std::ifstream in("/proc/sys/net/ipv4/ip_forward");
    int v = 0;
    in >> v;
    if (v != 1) {
      std::ofstream fwd("/proc/sys/net/ipv4/ip_forward");
      fwd << "1" << std::flush;
      if (!fwd) {
        return fail(Code::kUnavailable,
                    "network.mode \"open\": cannot turn on net.ipv4.ip_forward (needs root)");
      }
      spdlog::warn(
          "network open mode: turned on net.ipv4.ip_forward; the {} nftables table forwards "
          "only replies into boxes",
          kHostTable);
    }
  }
  const std::string t = std::string("inet ") + kHostTable;
  const std::string rules =
      "table " + t + "\n" + "delete table " + t + "\n" + "table " + t +
      " {\n"
      "  chain input {\n"
      "    type filter hook input priority filter; policy accept;\n"
      "    iifname \"abo*\" reject with icmpx type admin-prohibited\n"
      "  }\n"
      "  chain forward {\n"
      "    type filter hook forward priority filter; policy accept;\n"
      "    iifname \"abo*\" oifname \"abo*\" reject with icmpx type admin-prohibited\n"
      "    oifname \"abo*\" ct state established,related accept\n"
      "    oifname \"abo*\" drop\n"
      "  }\n"
      "  chain postrouting {\n"
      "    type nat hook postrouting priority srcnat; policy accept;\n"
      "    iifname \"abo*\" oifname != \"abo*\" masquerade\n"
      "  }\n"
      "}\n";
  auto r = run_tool({nft_tool(), "-f", "-"}, rules);
  if (!r)
    return fail(Code::kUnavailable, "network.mode \"open\": host rules: " + r.error().message);
  done = true;
  return {};
}

Result<std::unique_ptr<OpenEgress>> OpenEgress::start(pid_t box_pid, const NetworkConfig& config) {
  if (auto st = ensure_host_rules(); !st) return std::unexpected(st.error());
  const std::string ns_path = "/proc/" + std::to_string(box_pid) + "/ns/net";
  UniqueFd ns(::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns) return fail_errno(errno, "open(" + ns_path + ")");

  const uint32_t slots = uint32_t(1) << (32 - config.open_prefix - 2);  // a /30 each
  std::unique_ptr<OpenEgress> eg(new OpenEgress);
  bool claimed = false;
  for (uint32_t tries = 0; tries < slots && !claimed; ++tries) {
    const uint32_t n = g_next_index.fetch_add(1) % slots;
    const std::string name = kIfPrefix + std::to_string(n);
    if (::if_nametoindex(name.c_str()) != 0) continue;  // held by another box
    const uint32_t base = config.open_subnet + 4 * n;
    const std::string gw = v4_string(base + 1), addr = v4_string(base + 2);
    // One batch: the pair (its box end moved into the box's netns at once), then our side.
    const std::string batch = "link add " + name + " type veth peer name eth0 netns " +
                              std::to_string(box_pid) + "\naddr add " + gw + "/30 dev " + name +
                              "\nlink set " + name + " up\n";
    auto r = run_tool({ip_tool(), "-batch", "-"}, batch);
    if (!r) {
      if (r.error().message.find("File exists") != std::string::npos) continue;  // lost a race
      (void)run_tool({ip_tool(), "link", "del", name}, "");
      return fail(Code::kUnavailable, "network.mode \"open\": " + r.error().message);
    }
    eg->ifname_ = name;
    eg->gateway_ = gw;
    eg->box_address_ = addr;
    claimed = true;
  }
  if (!claimed) {
    return fail(Code::kUnavailable, "network.mode \"open\": every address of open_subnet " +
                                        v4_string(config.open_subnet) + "/" +
                                        std::to_string(config.open_prefix) + " is taken");
  }
  const std::string inside = "link set lo up\naddr add " + eg->box_address_ +
                             "/30 dev eth0\nlink set eth0 up\nroute add default via " +
                             eg->gateway_ + "\n";
  // The filter first: the route out exists only once the filter is in place.
  if (auto r = run_tool({nft_tool(), "-f", "-"}, box_ruleset(config), ns.get()); !r) {
    return fail(Code::kUnavailable, "network.mode \"open\": box filter: " + r.error().message);
  }
  if (auto r = run_tool({ip_tool(), "-batch", "-"}, inside, ns.get()); !r) {
    return fail(Code::kUnavailable, "network.mode \"open\": box side: " + r.error().message);
  }
  return eg;
}

void OpenEgress::stop() {
  if (stopped_ || ifname_.empty()) return;
  stopped_ = true;
  // Gone already when the box's netns went first: nothing to report then.
  if (::if_nametoindex(ifname_.c_str()) == 0) return;
  if (auto r = run_tool({ip_tool(), "link", "del", ifname_}, ""); !r) {
    if (::if_nametoindex(ifname_.c_str()) != 0) {
      spdlog::warn("network open mode: deleting {}: {}", ifname_, r.error().message);
    }
  }
}

Status OpenEgress::stop_and_cut(pid_t box_pid) {
  stop();
  if (box_address_.empty()) return {};
  static const std::string ss = find_tool("ss");
  if (ss.empty()) {
    return fail(Code::kUnavailable, "cutting the open connections needs `ss` (iproute2)");
  }
  const std::string ns_path = "/proc/" + std::to_string(box_pid) + "/ns/net";
  UniqueFd ns(::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns) return fail_errno(errno, "open(" + ns_path + ")");
  auto r = run_tool({ss, "-K", "-a", "-t", "-u", "-n", "src", box_address_}, "", ns.get());
  if (!r) return std::unexpected(r.error());
  return {};
}

OpenEgress::~OpenEgress() {
  stop();
}

}  // namespace agentbox::net
