#include "support/registry.h"

#include <archive.h>
#include <archive_entry.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

namespace agentbox::testing {
namespace {

using json = nlohmann::json;

std::string host_arch() {
  utsname u{};
  ::uname(&u);
  std::string m = u.machine;
  if (m == "x86_64") return "amd64";
  if (m == "aarch64") return "arm64";
  return m;
}

// Runs argv to completion; its stdout+stderr in *out. Returns the exit code (-1: signal).
int run(const std::vector<std::string>& args, std::string* out) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::dup2(p[1], 1);
    ::dup2(p[1], 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    _exit(127);
  }
  ::close(p[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof buf)) > 0) out->append(buf, static_cast<std::size_t>(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("no free port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

bool port_open(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

la_ssize_t append_cb(struct archive*, void* ctx, const void* buf, size_t n) {
  static_cast<std::string*>(ctx)->append(static_cast<const char*>(buf), n);
  return static_cast<la_ssize_t>(n);
}

// The tar (no compression when !gzip) of `entries`.
std::string write_tar(const std::vector<LayerEntry>& entries, bool gzip) {
  std::string out;
  struct archive* a = archive_write_new();
  if (gzip) {
    archive_write_add_filter_gzip(a);
    // No time in the gzip header: the same entries make the same blob (and digest) every time,
    // as a registry's shared base layers are.
    archive_write_set_filter_option(a, "gzip", "timestamp", nullptr);
  }
  archive_write_set_format_pax_restricted(a);
  archive_write_set_bytes_in_last_block(a, 1);
  archive_write_open(a, &out, nullptr, append_cb, nullptr);
  for (const auto& e : entries) {
    archive_entry* en = archive_entry_new();
    archive_entry_set_pathname(en, e.path.c_str());
    archive_entry_set_uid(en, e.uid);
    archive_entry_set_gid(en, e.gid);
    archive_entry_set_mtime(en, 1700000000, 0);
    switch (e.kind) {
      case LayerEntry::Kind::kFile:
        archive_entry_set_filetype(en, AE_IFREG);
        archive_entry_set_perm(en, e.mode);
        archive_entry_set_size(en, static_cast<la_int64_t>(e.data.size()));
        break;
      case LayerEntry::Kind::kDir:
        archive_entry_set_filetype(en, AE_IFDIR);
        archive_entry_set_perm(en, e.mode);
        break;
      case LayerEntry::Kind::kSymlink:
        archive_entry_set_filetype(en, AE_IFLNK);
        archive_entry_set_perm(en, 0777);
        archive_entry_set_symlink(en, e.data.c_str());
        break;
      case LayerEntry::Kind::kHardlink:
        archive_entry_set_filetype(en, AE_IFREG);
        archive_entry_set_perm(en, e.mode);
        archive_entry_set_hardlink(en, e.data.c_str());
        break;
      case LayerEntry::Kind::kCharDev:
        archive_entry_set_filetype(en, AE_IFCHR);
        archive_entry_set_perm(en, e.mode);
        archive_entry_set_rdevmajor(en, 1);
        archive_entry_set_rdevminor(en, 3);
        break;
    }
    archive_write_header(a, en);
    if (e.kind == LayerEntry::Kind::kFile && !e.data.empty()) {
      archive_write_data(a, e.data.data(), e.data.size());
    }
    archive_entry_free(en);
  }
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

void write_file(const std::string& path, const std::string& data) {
  if (!spit(path, data)) throw std::runtime_error("cannot write " + path);
}

std::string put_blob(const std::string& dir, const std::string& data) {
  std::string d = sha256_digest(data);
  write_file(dir + "/blobs/sha256/" + d.substr(7), data);
  return d;
}

}  // namespace

std::string sha256_digest(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (unsigned i = 0; i < len; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}

std::vector<LayerEntry> busybox_rootfs(const std::string& os_id) {
  std::string busybox = slurp("/bin/busybox");
  if (busybox.empty()) throw std::runtime_error("/bin/busybox missing (install busybox-static)");
  std::vector<LayerEntry> r = {LayerEntry::dir("bin"), LayerEntry::dir("etc"),
                               LayerEntry::dir("tmp", 01777), LayerEntry::dir("usr"),
                               LayerEntry::dir("usr/bin")};
  r.push_back(LayerEntry::file("bin/busybox", busybox, 0755));
  for (const char* applet :
       {"sh", "ls", "cat", "id", "echo", "env", "touch", "rm", "mkdir", "stat", "chmod", "test",
        "pwd", "sleep", "true", "grep", "wc", "readlink", "head"}) {
    r.push_back(LayerEntry::symlink(std::string("bin/") + applet, "/bin/busybox"));
  }
  r.push_back(LayerEntry::file("etc/os-release", "ID=" + os_id + "\nNAME=\"" + os_id + "\"\n"));
  r.push_back(LayerEntry::file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"));
  return r;
}

BuiltLayer build_layer(const std::vector<LayerEntry>& entries) {
  BuiltLayer l;
  l.blob = write_tar(entries, true);
  l.digest = sha256_digest(l.blob);
  l.diff_id = sha256_digest(write_tar(entries, false));
  return l;
}

std::string write_oci_layout(const std::string& dir, const TestImage& img, const std::string& tag) {
  std::filesystem::create_directories(dir + "/blobs/sha256");
  write_file(dir + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
  json layers = json::array();
  json diff_ids = json::array();
  for (const auto& entries : img.layers) {
    BuiltLayer l = build_layer(entries);
    put_blob(dir, l.blob);
    layers.push_back({{"mediaType", "application/vnd.oci.image.layer.v1.tar+gzip"},
                      {"digest", l.digest},
                      {"size", l.blob.size()}});
    diff_ids.push_back(l.diff_id);
  }
  json config = {{"architecture", img.architecture.empty() ? host_arch() : img.architecture},
                 {"os", "linux"},
                 {"config", {{"Env", img.env}, {"WorkingDir", "/"}}},
                 {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}}};
  const std::string cfg = config.dump();
  const std::string cfg_digest = put_blob(dir, cfg);
  json manifest = {{"schemaVersion", 2},
                   {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                   {"config",
                    {{"mediaType", "application/vnd.oci.image.config.v1+json"},
                     {"digest", cfg_digest},
                     {"size", cfg.size()}}},
                   {"layers", layers}};
  const std::string m = manifest.dump();
  const std::string m_digest = put_blob(dir, m);
  json index = {{"schemaVersion", 2},
                {"manifests",
                 {{{"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                   {"digest", m_digest},
                   {"size", m.size()},
                   {"annotations", {{"org.opencontainers.image.ref.name", tag}}}}}}};
  write_file(dir + "/index.json", index.dump());
  return m_digest;
}

LocalRegistry::LocalRegistry(Options opts) : opts_(std::move(opts)) {
  const int port = free_port();
  host_ = "127.0.0.1:" + std::to_string(port);
  std::string auth;
  if (!opts_.user.empty()) {
    std::string out;
    if (run({"htpasswd", "-Bbn", opts_.user, opts_.password}, &out) != 0) {
      throw std::runtime_error("htpasswd failed: " + out);
    }
    write_file(dir_ / "htpasswd", out);
    auth = "auth:\n  htpasswd:\n    realm: agentbox-test\n    path: " + (dir_ / "htpasswd") + "\n";
  }
  write_file(dir_ / "config.yml",
             "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
             "storage:\n  filesystem:\n    rootdirectory: " +
                 (dir_ / "storage") + "\n  delete:\n    enabled: true\nhttp:\n  addr: " + host_ +
                 "\n" + auth);
  const std::string log = dir_ / "registry.log";
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const std::string cfg = dir_ / "config.yml";
    ::execlp("docker-registry", "docker-registry", "serve", cfg.c_str(), nullptr);
    _exit(127);
  }
  for (int i = 0; i < 200; ++i) {
    if (port_open(port)) return;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("docker-registry exited: " + slurp(log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  stop();
  throw std::runtime_error("docker-registry did not listen on " + host_);
}

LocalRegistry::~LocalRegistry() {
  stop();
}

void LocalRegistry::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string LocalRegistry::blob_path(const std::string& digest) const {
  const std::string hex = digest.substr(7);
  return dir_ /
         ("storage/docker/registry/v2/blobs/sha256/" + hex.substr(0, 2) + "/" + hex + "/data");
}

void LocalRegistry::push(const std::string& oci_dir, const std::string& tag,
                         const std::string& repo_tag) const {
  std::vector<std::string> args = {"skopeo", "--insecure-policy", "copy", "--quiet",
                                   "--dest-tls-verify=false"};
  if (!opts_.user.empty()) {
    args.push_back("--dest-creds");
    args.push_back(opts_.user + ":" + opts_.password);
  }
  args.push_back("oci:" + oci_dir + ":" + tag);
  args.push_back("docker://" + host_ + "/" + repo_tag);
  std::string out;
  if (run(args, &out) != 0) throw std::runtime_error("skopeo push failed: " + out);
}

}  // namespace agentbox::testing
