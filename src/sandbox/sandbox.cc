#include "sandbox/sandbox.h"

#include <unistd.h>

#include <cerrno>

namespace agentbox::sandbox {

std::vector<std::pair<std::string, std::uint64_t>> set_limits(const Limits& l) {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  auto add = [&](const char* name, const auto& v) {
    if (v) out.emplace_back(name, static_cast<std::uint64_t>(*v));
  };
  add("memory_mb", l.memory_mb);
  add("cpu_percent", l.cpu_percent);
  add("max_pids", l.max_pids);
  add("disk_mb", l.disk_mb);
  add("max_open_files", l.max_open_files);
  add("cpu_time_sec", l.cpu_time_sec);
  add("tmp_mb", l.tmp_mb);
  return out;
}

Result<std::string> Sandbox::read_file(const std::string& path, std::uint64_t max_bytes) {
  auto r = open_file(path);
  if (!r) return std::unexpected(r.error());
  if (r->size > max_bytes) {
    return fail(Code::kTooBig, path + ": " + std::to_string(r->size) + " bytes, over the " +
                                   std::to_string(max_bytes) + "-byte limit");
  }
  std::string out;
  out.resize(r->size);
  std::size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(r->fd.get(), out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "read(" + path + ")");
    if (n == 0) break;  // shrank under us: return what is there
    got += static_cast<std::size_t>(n);
  }
  out.resize(got);
  return out;
}

Result<std::uint64_t> Sandbox::write_file(const std::string& path, std::string_view data,
                                          WriteOptions opts) {
  auto w = create_file(path, opts);
  if (!w) return std::unexpected(w.error());
  if (auto s = (*w)->write(data); !s) return std::unexpected(s.error());
  return (*w)->commit();
}

}  // namespace agentbox::sandbox
