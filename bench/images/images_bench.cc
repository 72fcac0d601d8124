// `make bench SECTION=images` (issue 21 targets), side by side with its baselines, on a loopback
// docker-registry with images this program builds (tests/support/registry.h) and a real agentboxd
// on the ns backend (tests/integration/daemon.h):
//   - pull of a ~100 MiB image (POST /v1/images: fetch, verify, unpack) vs `skopeo copy` of the
//     same reference into an OCI layout alone, medians of interleaved rounds (goal <= 1.2x);
//   - a second image sharing the first one's layers: the bytes the registry served for it
//     (its /proc io counter) vs its own new layer and its whole size;
//   - create -> first exec (/bin/true) of a session on the pulled image vs one on the host root,
//     p50/p99 (goals <= 20 ms and <= 1.2x);
//   - disk a new session on the image takes (its rootfs dir and data dir growth) beyond what it
//     writes itself.
//
//   agentbox-bench-images --daemon build/bin/agentboxd [--mb 100] [--rounds 5] [--sessions 30]

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../bench_report.h"
#include "client/client.h"
#include "integration/daemon.h"
#include "support/registry.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
namespace fs = std::filesystem;
using agentbox::Daemon;
using agentbox::client::Client;
using namespace agentbox::testing;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "agentbox-bench-images: %s\n", msg.c_str());
  std::exit(1);
}

std::string random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    std::uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  return out;
}

// Bytes this process's docker-registry child has written (sockets included): what it served.
long long registry_wchar() {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream st(e.path() / "stat");
    std::string line;
    if (!std::getline(st, line)) continue;
    auto close = line.rfind(')');
    auto open = line.find('(');
    if (open == std::string::npos || close == std::string::npos) continue;
    if (line.substr(open + 1, close - open - 1) != "docker-registry") continue;
    long long ppid = std::atoll(line.c_str() + close + 4);  // ") S <ppid>"
    if (ppid != ::getpid()) continue;
    std::ifstream io(e.path() / "io");
    while (std::getline(io, line)) {
      if (line.rfind("wchar:", 0) == 0) return std::atoll(line.c_str() + 6);
    }
  }
  die("no docker-registry child found");
}

// Disk blocks under `path`, bytes (no link followed).
std::uint64_t disk_bytes(const fs::path& path) {
  std::uint64_t total = 0;
  std::error_code ec;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) total += static_cast<std::uint64_t>(st.st_blocks) * 512;
  if (!fs::is_directory(fs::symlink_status(path, ec))) return total;
  for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (::lstat(it->path().c_str(), &st) == 0) {
      total += static_cast<std::uint64_t>(st.st_blocks) * 512;
    }
  }
  return total;
}

agentbox::client::Response must(agentbox::Result<agentbox::client::Response> r, int want,
                                const std::string& what) {
  if (!r) die(what + ": " + r.error().message);
  if (r->status != want) die(what + ": " + std::to_string(r->status) + " " + r->body);
  return *r;
}

struct Images {
  std::string a, b;  // references: the ~mb MiB image, and it plus one small layer
  double a_mib = 0, b_new_mib = 0, b_mib = 0;
};

Images build_images(LocalRegistry& reg, const TempDir& dir, std::uint64_t mb) {
  const std::size_t half = static_cast<std::size_t>(mb) << 19;  // mb/2 MiB per big layer
  TestImage a;
  a.layers.push_back(busybox_rootfs("agentbox-bench-images"));
  a.layers.push_back({LayerEntry::dir("opt"), LayerEntry::file("opt/big1", random_bytes(half, 1))});
  a.layers.push_back({LayerEntry::dir("opt"), LayerEntry::file("opt/big2", random_bytes(half, 2))});
  a.env = {"PATH=/bin:/usr/bin"};
  write_oci_layout(dir / "a", a, "1");
  reg.push(dir / "a", "1", "bench/a:1");
  TestImage b = a;
  b.layers.push_back(
      {LayerEntry::dir("opt"), LayerEntry::file("opt/new", random_bytes(4 << 20, 3))});
  write_oci_layout(dir / "b", b, "1");
  reg.push(dir / "b", "1", "bench/b:1");
  Images out;
  out.a = reg.host() + "/bench/a:1";
  out.b = reg.host() + "/bench/b:1";
  auto blobs = [](const fs::path& layout) {
    double n = 0;
    for (const auto& e : fs::directory_iterator(layout / "blobs/sha256")) n += fs::file_size(e);
    return n / (1 << 20);
  };
  out.a_mib = blobs(dir / "a");
  out.b_mib = blobs(dir / "b");
  out.b_new_mib = 4;
  return out;
}

void section_pull(Client& c, const std::string& registry_host, const Images& img, int rounds,
                  const TempDir& dir) {
  std::vector<double> ours, skopeo;
  for (int i = 0; i < rounds; ++i) {
    const std::string into = dir / ("skopeo-" + std::to_string(i));
    const std::string cmd = "skopeo copy --quiet --src-tls-verify=false --src-no-creds docker://" +
                            img.a + " oci:" + into + ":1 >/dev/null 2>&1";
    auto t0 = Clock::now();
    if (std::system(cmd.c_str()) != 0) die("skopeo copy failed: " + cmd);
    skopeo.push_back(ms_since(t0));
    fs::remove_all(into);

    t0 = Clock::now();
    auto r = must(c.request("POST", "/v1/images", json{{"ref", img.a}}.dump()), 201, "pull");
    ours.push_back(ms_since(t0));
    const std::string digest = json::parse(r.body).value("digest", "");
    must(c.request("DELETE", "/v1/images/" + digest), 200, "delete image");
  }
  (void)registry_host;
  char note[128];
  std::snprintf(note, sizeof note, "%.1f MiB image from the loopback registry", img.a_mib);
  bench::row_m("skopeo copy docker:// -> oci: alone (baseline)", skopeo, "ms", note);
  const double ratio = bench::median(ours) / bench::median(skopeo);
  std::snprintf(note, sizeof note, "ratio %.2f vs skopeo alone (goal <= 1.2)", ratio);
  bench::row_m("POST /v1/images (fetch, verify, unpack)", ours, "ms", note);
}

void section_shared(Client& c, const Images& img) {
  must(c.request("POST", "/v1/images", json{{"ref", img.a}}.dump()), 201, "pull a");
  const long long before = registry_wchar();
  auto t0 = Clock::now();
  must(c.request("POST", "/v1/images", json{{"ref", img.b}}.dump()), 201, "pull b");
  const double ms = ms_since(t0);
  const double served = static_cast<double>(registry_wchar() - before) / (1 << 20);
  char note[160];
  std::snprintf(note, sizeof note, "image %.1f MiB, its new layer %.1f MiB; took %.0f ms",
                img.b_mib, img.b_new_mib, ms);
  bench::row("second image sharing the base: MiB the registry served", served, "MiB", note);
}

// Create -> first exec completes, then delete (not timed), `n` times each, interleaved.
void section_start(Client& c, const Images& img, int n) {
  std::vector<double> on_image, on_host;
  const std::string exec = R"({"argv":["/bin/true"]})";
  for (int i = 0; i < n; ++i) {
    for (bool image : {true, false}) {
      const std::string id = (image ? "img-" : "host-") + std::to_string(i);
      json body = {{"id", id}};
      if (image) body["image"] = img.a;
      auto t0 = Clock::now();
      must(c.request("POST", "/v1/sessions", body.dump()), 201, "create " + id);
      auto r = must(c.request("POST", "/v1/sessions/" + id + "/exec", exec), 200, "exec " + id);
      (image ? on_image : on_host).push_back(ms_since(t0));
      if (r.body.find("\"exit_code\":0") == std::string::npos) die("exec failed: " + r.body);
      must(c.request("DELETE", "/v1/sessions/" + id), 200, "delete " + id);
    }
  }
  bench::row_m("create -> first exec, host root (baseline)", on_host, "ms");
  char note[96];
  std::snprintf(note, sizeof note, "ratio %.2f (goals: p50 <= 20 ms, <= 1.2x)",
                bench::median(on_image) / bench::median(on_host));
  bench::row_m("create -> first exec, on the pulled image", on_image, "ms", note);
}

void section_disk(Client& c, const Daemon& d, const Images& img, int n) {
  const fs::path data = d.data_dir();
  const std::uint64_t before = disk_bytes(data);
  std::vector<double> rootfs;
  for (int i = 0; i < n; ++i) {
    const std::string id = "disk-" + std::to_string(i);
    must(c.request("POST", "/v1/sessions", json{{"id", id}, {"image", img.a}}.dump()), 201,
         "create " + id);
    must(c.request("POST", "/v1/sessions/" + id + "/exec", R"({"argv":["/bin/true"]})"), 200,
         "exec " + id);
    rootfs.push_back(static_cast<double>(disk_bytes(data / "rootfs" / id)) / 1024);
  }
  const double per = static_cast<double>(disk_bytes(data) - before) / 1024 / n;
  bench::row("disk per new session on the image, its rootfs dir", bench::median(rootfs), "KiB",
             "mountpoints + /etc identity files in its upper dir; the image's layers are shared");
  bench::row("disk per new session on the image, all of the data dir", per, "KiB",
             "rootfs, workspace dir, state database rows");
  for (int i = 0; i < n; ++i) c.request("DELETE", "/v1/sessions/disk-" + std::to_string(i));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"agentbox image benchmarks (issue 21), side by side with their baselines"};
  std::string daemon = "build/bin/agentboxd";
  std::uint64_t mb = 100;
  int rounds = 5, sessions = 30, disk_sessions = 10;
  std::string json_out;
  app.add_option("--daemon", daemon, "agentboxd binary");
  app.add_option("--mb", mb, "size of the pulled image, MiB (two layers of half each)");
  app.add_option("--rounds", rounds, "pulls timed (each vs a skopeo copy)");
  app.add_option("--sessions", sessions, "create -> first exec runs of each kind");
  app.add_option("--disk-sessions", disk_sessions, "sessions measured for disk use");
  app.add_option("--json", json_out, "also write every figure to this file (JSON)");
  CLI11_PARSE(app, argc, argv);
  ::setenv("AGENTBOX_BIN_DIR", fs::absolute(daemon).parent_path().c_str(), 1);
  try {
    LocalRegistry reg;
    TempDir dir("agentbox-bench-images");
    std::printf("agentbox-bench-images: building a %llu MiB image and pushing it to %s ...\n",
                static_cast<unsigned long long>(mb), reg.host().c_str());
    std::fflush(stdout);
    const Images img = build_images(reg, dir, mb);
    spit(dir / "config.yaml", "registries:\n  \"" + reg.host() + "\":\n    insecure: true\n");
    Daemon d({"--backend", "ns", "--config", dir / "config.yaml"});
    Client c(d.options());
    bench::report().section = "images";
    std::printf("agentbox-bench-images: daemon %s\n", d.url().c_str());
    section_pull(c, reg.host(), img, rounds, dir);
    section_shared(c, img);
    section_start(c, img, sessions);
    section_disk(c, d, img, disk_sessions);
  } catch (const std::exception& e) {
    die(e.what());
  }
  if (!json_out.empty()) {
    json meta = {{"backend", "ns"}, {"sections", {"images"}}};
    meta["time"] = static_cast<long long>(std::time(nullptr));
    if (!bench::write_json(json_out, meta)) die("cannot write " + json_out);
  }
  return 0;
}
