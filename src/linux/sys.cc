#include "linux/sys.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <string_view>

namespace agentbox::linux::sys {

namespace {

constexpr std::size_t kDirBufBytes = 32 * 1024;

}  // namespace

Result<UniqueFd> openat2(int dirfd, const std::string& path, std::uint64_t flags,
                         std::uint64_t resolve, const std::string& what) {
  UniqueFd fd(openat2_raw(dirfd, path.empty() ? "." : path.c_str(), flags, resolve));
  if (fd) return fd;
  const int err = errno;
  const std::string w = what.empty() ? "open(" + path + ")" : what;
  if (err == EAGAIN) {
    return std::unexpected(Error{Code::kAccess, err,
                                 w + ": path kept changing while it was resolved (gave up after " +
                                     std::to_string(kOpenat2Attempts) + " attempts)"});
  }
  return fail_errno(err, w);
}

Result<Pipe> pipe(bool above_stdio) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return fail_errno(errno, "pipe2");
  Pipe p{UniqueFd(fds[0]), UniqueFd(fds[1])};
  if (!above_stdio) return p;
  for (UniqueFd* end : {&p.read, &p.write}) {
    if (end->get() > STDERR_FILENO) continue;
    UniqueFd moved(::fcntl(end->get(), F_DUPFD_CLOEXEC, STDERR_FILENO + 1));
    if (!moved) return fail_errno(errno, "fcntl(F_DUPFD_CLOEXEC)");
    *end = std::move(moved);
  }
  return p;
}

Result<std::vector<DirEntry>> read_dir(int dirfd, const std::string& shown,
                                       std::size_t max_entries) {
  // SECURITY: "." of the directory itself, never a path: nothing is followed.
  UniqueFd dir(::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return fail_errno(errno, "readdir(" + shown + ")");
  std::vector<DirEntry> entries;
  auto buf = std::make_unique<std::byte[]>(kDirBufBytes);
  for (;;) {
    const ssize_t n = ::getdents64(dir.get(), buf.get(), kDirBufBytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "readdir(" + shown + ")");
    if (n == 0) break;
    for (ssize_t off = 0; off < n;) {
      const auto* d = reinterpret_cast<const struct dirent64*>(buf.get() + off);
      off += d->d_reclen;
      const std::string_view name = d->d_name;
      if (name == "." || name == "..") continue;
      if (entries.size() >= max_entries) {
        return fail(Code::kTooBig, "readdir(" + shown + "): more than " +
                                       std::to_string(max_entries) + " entries");
      }
      entries.push_back(DirEntry{std::string(name), d->d_type});
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  return entries;
}

Result<std::vector<std::string>> list_names(int dirfd, const std::string& shown) {
  auto entries = AB_TRY(read_dir(dirfd, shown));
  std::vector<std::string> names;
  names.reserve(entries.size());
  for (DirEntry& e : entries) names.push_back(std::move(e.name));
  return names;
}

}  // namespace agentbox::linux::sys
