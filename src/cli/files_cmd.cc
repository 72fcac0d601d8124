// agentbox cp | ls | cat | rm | mkdir | stat | mv: files of a session's box, streamed both ways
// (a file is never held in memory whole).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "common/unique_fd.h"

namespace agentbox::cli {
namespace {

using json = nlohmann::json;

constexpr char kWorkspace[] = "/workspace";

bool ok(const client::Response& r) {
  return r.status >= 200 && r.status < 300;
}

std::string base_name(std::string_view p) {
  while (p.size() > 1 && p.back() == '/') p.remove_suffix(1);
  auto slash = p.rfind('/');
  return std::string(slash == std::string_view::npos ? p : p.substr(slash + 1));
}

std::string dir_name(const std::string& p) {
  auto slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string join(std::string dir, std::string_view name) {
  if (dir.empty() || dir.back() != '/') dir += '/';
  return dir + std::string(name);
}

std::string files_target(const RemotePath& rp, std::string_view route) {
  return session_target(rp.session) + std::string(route) + "?path=" + client::url_encode(rp.path);
}

// What the server's stat says about a path; nullopt when it does not exist.
struct RemoteStat {
  bool is_dir = false;
  std::uint64_t size = 0;
  std::uint32_t mode = 0;
};

// Reads a mode that may come as a number (st_mode) or an octal string ("0644").
std::uint32_t mode_of(const json& j) {
  auto it = j.find("mode");
  if (it == j.end()) return 0;
  if (it->is_number_unsigned() || it->is_number_integer()) return it->get<std::uint32_t>();
  if (it->is_string()) {
    return static_cast<std::uint32_t>(std::strtoul(it->get<std::string>().c_str(), nullptr, 8));
  }
  return 0;
}

bool bool_of(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

std::uint64_t size_of(const json& j) {
  auto it = j.find("size");
  return it != j.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
}

// The outcome of a stat: the file's attributes, nothing (404 ENOENT: the file, or the session,
// does not exist), or an exit code when an error has been reported.
struct StatOutcome {
  std::optional<RemoteStat> stat;
  std::optional<int> exit;
};

StatOutcome remote_stat(client::Client& c, const RemotePath& rp, bool missing_is_error) {
  auto r = c.request("GET", files_target(rp, "/stat"));
  if (!r) return {std::nullopt, report(r.error())};
  if (!ok(*r)) {
    auto e = client::api_error(*r);
    if (!missing_is_error && r->status == 404 && e && e->code == "ENOENT") return {};
    return {std::nullopt, report(*r)};
  }
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return {std::nullopt, report(Error::make(Code::kInternal, "stat reply is not a JSON object"))};
  }
  return {RemoteStat{bool_of(j, "is_dir"), size_of(j), mode_of(j)}, std::nullopt};
}

// Local bytes to upload: a regular file as is, anything else (a pipe on stdin) spooled to an
// unlinked temp file first, since an upload needs its size up front.
struct LocalSource {
  UniqueFd owned;
  int fd = -1;
  std::uint64_t size = 0;
  std::optional<std::uint32_t> mode;  // permission bits of a local file
};

Result<LocalSource> open_source(const std::string& local) {
  LocalSource src;
  if (local == "-") {
    src.fd = STDIN_FILENO;
  } else {
    src.owned = UniqueFd(::open(local.c_str(), O_RDONLY | O_CLOEXEC));
    if (!src.owned) return fail_errno(errno, "open(" + local + ")");
    src.fd = src.owned.get();
  }
  struct stat st {};
  if (::fstat(src.fd, &st) != 0) return fail_errno(errno, "stat(" + local + ")");
  if (S_ISDIR(st.st_mode)) {
    return fail(Code::kIsDir, local + " is a directory (cp copies single files)");
  }
  if (S_ISREG(st.st_mode)) {
    src.size = static_cast<std::uint64_t>(st.st_size);
    if (local != "-") src.mode = st.st_mode & 0777;
    return src;
  }
  const char* tmpdir = std::getenv("TMPDIR");
  std::string dir = tmpdir && *tmpdir ? tmpdir : "/tmp";
  UniqueFd spool(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!spool) return fail_errno(errno, "open(O_TMPFILE in " + dir + ")");
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(src.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "read(" + local + ")");
    if (n == 0) break;
    if (!write_all(spool.get(), std::string_view(buf, static_cast<std::size_t>(n)))) {
      return fail_errno(errno, "write(spool file in " + dir + ")");
    }
    src.size += static_cast<std::uint64_t>(n);
  }
  if (::lseek(spool.get(), 0, SEEK_SET) != 0) return fail_errno(errno, "lseek(spool file)");
  src.owned = std::move(spool);
  src.fd = src.owned.get();
  return src;
}

int upload(const Globals& g, const std::string& local, RemotePath dst, bool parents) {
  auto src = open_source(local);
  if (!src) return report(src.error());
  client::Client c(g.options());
  if (dst.path.empty()) dst.path = std::string(kWorkspace) + "/";
  // Into a directory (named so by a trailing '/', or one that exists): keep the local name.
  bool into_dir = dst.path.back() == '/';
  if (!into_dir) {
    // A missing target (or session: then the PUT below names it) is simply written.
    auto st = remote_stat(c, dst, /*missing_is_error=*/false);
    if (st.exit) return *st.exit;
    into_dir = st.stat && st.stat->is_dir;
  }
  if (into_dir) {
    if (local == "-") return usage("cp: the target is a directory; name the file to write");
    dst.path = join(dst.path, base_name(local));
  }

  std::string target = files_target(dst, "/files");
  if (parents) target += "&mkdirs=true";
  if (src->mode) {
    char m[8];
    std::snprintf(m, sizeof m, "%04o", *src->mode);
    target += std::string("&mode=") + m;
  }
  Progress progress(base_name(dst.path), src->size);
  // open_source always yields a regular file (a pipe is spooled first): sendfile can read it.
  auto r = c.upload_file("PUT", target, src->fd, src->size,
                         [&progress](std::uint64_t sent) { progress.update(sent); });
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  progress.finish();
  return kExitOk;
}

// The local end of a download: stdout, or a temp file next to the target renamed over it once
// complete, so an interrupted copy never leaves a half-written target.
class LocalSink {
 public:
  static Result<LocalSink> open(const std::string& target) {
    LocalSink s;
    if (target == "-") {
      s.fd_ = STDOUT_FILENO;
      return s;
    }
    s.target_ = target;
    s.temp_ = join(dir_name(target), "." + base_name(target) + ".agentbox-XXXXXX");
    s.owned_ = UniqueFd(::mkostemp(s.temp_.data(), O_CLOEXEC));
    if (!s.owned_) return fail_errno(errno, "create temp file for " + target);
    s.fd_ = s.owned_.get();
    return s;
  }
  LocalSink() = default;
  LocalSink(LocalSink&& o) noexcept
      : owned_(std::move(o.owned_)),
        fd_(o.fd_),
        target_(std::move(o.target_)),
        temp_(std::exchange(o.temp_, {})) {}
  LocalSink& operator=(LocalSink&&) = delete;
  ~LocalSink() {
    if (!temp_.empty()) ::unlink(temp_.c_str());
  }

  int fd() const { return fd_; }

  Status commit(std::optional<std::uint32_t> mode) {
    if (temp_.empty()) return {};
    // Like cp: a new file gets the source's permission bits (minus the umask).
    mode_t mask = ::umask(0);
    ::umask(mask);
    if (mode && ::fchmod(fd_, *mode & 0777 & ~mask) != 0) {
      return fail_errno(errno, "chmod(" + target_ + ")");
    }
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      return fail_errno(errno, "rename(" + temp_ + ", " + target_ + ")");
    }
    temp_.clear();
    return {};
  }

 private:
  UniqueFd owned_;
  int fd_ = -1;
  std::string target_;
  std::string temp_;  // removed by the destructor unless committed
};

int download(const Globals& g, const RemotePath& src, std::string local) {
  if (src.path.empty()) return usage("cp: name the file to copy (SESSION:PATH)");
  client::Client c(g.options());
  auto st = remote_stat(c, src, /*missing_is_error=*/true);
  if (st.exit) return *st.exit;
  if (st.stat->is_dir) {
    return report(Error::make(Code::kIsDir, src.path + " is a directory (cp copies single files)"));
  }
  if (local != "-") {
    struct stat lst {};
    if (::stat(local.c_str(), &lst) == 0 && S_ISDIR(lst.st_mode)) {
      local = join(local, base_name(src.path));
    }
  }
  auto sink = LocalSink::open(local);
  if (!sink) return report(sink.error());
  std::signal(SIGPIPE, SIG_IGN);

  Progress progress(base_name(src.path), st.stat->size);
  std::uint64_t got = 0;
  std::optional<Error> write_error;
  int fd = sink->fd();
  auto r = c.request_stream("GET", files_target(src, "/files"), {}, [&](std::string_view chunk) {
    if (!write_all(fd, chunk)) {
      write_error = Error::from_errno(errno, "write(" + local + ")");
      return false;
    }
    got += chunk.size();
    progress.update(got);
    return true;
  });
  if (write_error) return report(*write_error);
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  if (auto it = r->headers.find("content-length"); it != r->headers.end()) {
    if (it->second != std::to_string(got)) {
      return report(Error::make(Code::kUnavailable, "download of " + src.path + " ended after " +
                                                        std::to_string(got) + " of " + it->second +
                                                        " bytes"));
    }
  }
  if (auto c2 = sink->commit(st.stat->mode & 0777); !c2) return report(c2.error());
  progress.finish();
  return kExitOk;
}

std::string mode_string(std::uint32_t mode, bool is_dir) {
  std::string s = is_dir ? "d" : S_ISLNK(mode) ? "l" : "-";
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) s += (mode & (0400u >> i)) ? rwx[i] : '-';
  return s;
}

std::string time_string(const json& j) {
  auto it = j.find("mod_time");
  if (it == j.end()) return "-";
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_number()) return "-";
  // A number: seconds, or nanoseconds when too large to be seconds.
  double v = it->get<double>();
  std::time_t t = static_cast<std::time_t>(v > 1e12 ? v / 1e9 : v);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

// SESSION:PATH for commands that need both.
std::optional<RemotePath> need_remote(const std::string& arg) {
  auto rp = parse_remote(arg);
  if (!rp || rp->path.empty()) return std::nullopt;
  return rp;
}

}  // namespace

int cp(const Globals& g, const std::string& from, const std::string& to, bool parents) {
  auto rfrom = parse_remote(from);
  auto rto = parse_remote(to);
  if (rfrom && rto) return usage("cp: copying between two sessions is not supported");
  if (!rfrom && !rto) return usage("cp: one side must be SESSION:PATH");
  if (rto) return upload(g, from, *rto, parents);
  return download(g, *rfrom, to);
}

int ls(const Globals& g, const std::string& target, bool long_format) {
  RemotePath rp;
  if (auto parsed = parse_remote(target)) {
    rp = *parsed;
  } else if (target.find('/') == std::string::npos && !target.empty()) {
    rp.session = target;  // a bare SESSION lists its workspace
  } else {
    return usage("ls: expected SESSION or SESSION:PATH");
  }
  if (rp.path.empty()) rp.path = kWorkspace;

  client::Client c(g.options());
  auto r = c.request("GET", files_target(rp, "/dir"));
  if (!r) return report(r.error());
  std::vector<json> entries;
  if (ok(*r)) {
    json j = json::parse(r->body, nullptr, false);
    auto it = j.is_object() ? j.find("entries") : j.end();
    if (j.is_discarded() || !j.is_object() || it == j.end() || !it->is_array()) {
      return report(Error::make(Code::kInternal, "dir reply has no \"entries\" array"));
    }
    for (const json& e : *it) {
      if (e.is_object()) entries.push_back(e);
    }
  } else if (auto e = client::api_error(*r); e && e->code == "ENOTDIR") {
    // Like ls(1): a file lists as itself.
    auto s = c.request("GET", files_target(rp, "/stat"));
    if (!s) return report(s.error());
    if (!ok(*s)) return report(*s);
    json j = json::parse(s->body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return report(Error::make(Code::kInternal, "stat reply is not a JSON object"));
    }
    j["name"] = rp.path;
    entries.push_back(j);
  } else {
    return report(*r);
  }

  if (entries.empty()) {
    // Say so (on stderr: stdout stays a clean, empty listing for scripts).
    std::cerr << "(empty)" << std::endl;
    return kExitOk;
  }
  for (const json& e : entries) {
    auto name_it = e.find("name");
    std::string name =
        name_it != e.end() && name_it->is_string() ? name_it->get<std::string>() : "?";
    bool is_dir = bool_of(e, "is_dir");
    if (long_format) {
      char size[24];
      std::snprintf(size, sizeof size, "%10llu", static_cast<unsigned long long>(size_of(e)));
      std::cout << mode_string(mode_of(e), is_dir) << ' ' << size << ' ' << time_string(e) << ' '
                << name << (is_dir ? "/" : "") << '\n';
    } else {
      std::cout << name << (is_dir ? "/" : "") << '\n';
    }
  }
  return kExitOk;
}

int cat(const Globals& g, const std::string& target) {
  auto rp = need_remote(target);
  if (!rp) return usage("cat: expected SESSION:PATH");
  std::signal(SIGPIPE, SIG_IGN);
  client::Client c(g.options());
  bool closed = false;
  auto r = c.request_stream("GET", files_target(*rp, "/files"), {}, [&](std::string_view chunk) {
    if (!write_all(STDOUT_FILENO, chunk)) {
      closed = true;
      return false;
    }
    return true;
  });
  if (closed)
    return errno == EPIPE ? 128 + SIGPIPE : report(Error::from_errno(errno, "write(stdout)"));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  return kExitOk;
}

int rm(const Globals& g, const std::string& target, bool recursive) {
  auto rp = need_remote(target);
  if (!rp) return usage("rm: expected SESSION:PATH");
  client::Client c(g.options());
  auto r = c.request("DELETE", files_target(*rp, "/files") + (recursive ? "&recursive=true" : ""));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  return kExitOk;
}

int mkdir(const Globals& g, const std::string& target) {
  auto rp = need_remote(target);
  if (!rp) return usage("mkdir: expected SESSION:PATH");
  client::Client c(g.options());
  json body = {{"path", rp->path}};
  auto r = c.request("POST", session_target(rp->session) + "/mkdir",
                     body.dump(-1, ' ', false, json::error_handler_t::replace));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  return kExitOk;
}

int stat(const Globals& g, const std::string& target, bool as_json) {
  auto rp = need_remote(target);
  if (!rp) return usage("stat: expected SESSION:PATH");
  client::Client c(g.options());
  auto r = c.request("GET", files_target(*rp, "/stat"));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return report(Error::make(Code::kInternal, "stat reply is not a JSON object"));
  }
  if (as_json) {
    std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << '\n';
    return kExitOk;
  }
  auto str = [&j](const char* key, const std::string& fallback) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
  };
  bool is_dir = bool_of(j, "is_dir");
  bool is_link = bool_of(j, "is_symlink");
  std::uint32_t mode = mode_of(j);
  std::uint64_t size = size_of(j);
  char octal[8];
  std::snprintf(octal, sizeof octal, "%04o", mode & 07777);
  std::cout << "path:     " << str("path", rp->path) << '\n'
            << "type:     "
            << (is_dir    ? "directory"
                : is_link ? "symbolic link"
                          : "regular file")
            << '\n'
            << "size:     " << size << (size >= 1024 ? " (" + human_bytes(size) + ")" : "") << '\n'
            << "mode:     " << octal << " (" << mode_string(mode, is_dir) << ")\n"
            << "modified: " << time_string(j) << '\n';
  return kExitOk;
}

int mv(const Globals& g, const std::string& from, const std::string& to) {
  auto src = need_remote(from);
  if (!src) return usage("mv: expected SESSION:FROM [SESSION:]TO");
  RemotePath dst{src->session, to};
  if (auto parsed = parse_remote(to)) {
    if (parsed->session != src->session) {
      return usage("mv: both paths must be in the same session (" + src->session + " vs " +
                   parsed->session + ")");
    }
    dst = *parsed;
  }
  if (dst.path.empty()) return usage("mv: name the destination path");
  client::Client c(g.options());
  // Into a directory (named so by a trailing '/', or one that exists): keep the name, as mv(1).
  bool into_dir = dst.path.back() == '/';
  if (!into_dir) {
    auto st = remote_stat(c, dst, /*missing_is_error=*/false);
    if (st.exit) return *st.exit;
    into_dir = st.stat && st.stat->is_dir;
  }
  if (into_dir) dst.path = join(dst.path, base_name(src->path));
  json body = {{"from", src->path}, {"to", dst.path}};
  auto r = c.request("POST", session_target(src->session) + "/rename",
                     body.dump(-1, ' ', false, json::error_handler_t::replace));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  return kExitOk;
}

}  // namespace agentbox::cli
