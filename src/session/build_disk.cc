#include "session/build_disk.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/unique_fd.h"
#include "linux/quota_disk.h"
#include "workspace/archive.h"

namespace agentbox::session {

namespace {

std::string image_of(const std::string& ws) {
  return ws + ".img";
}

}  // namespace

Status attach_build_disk(const std::string& ws, std::uint64_t disk_mb, uid_t owner) {
  linux::QuotaDiskSpec disk;
  disk.image_path = image_of(ws);
  disk.mountpoint = ws;
  disk.bytes = disk_mb << 20;
  disk.uid = owner;
  disk.gid = owner;
  return linux::attach_quota_disk(disk);
}

Status copy_build_tree(const std::string& ws, const std::string& out, uid_t owner) {
  // Through an archive in the build's dir: the same tree walk (and the same safe extraction)
  // as a session's archive and restore.
  const std::string dir = ws.substr(0, ws.rfind('/'));
  const std::string name = "frozen.tar.zst";
  UniqueFd wsfd(::open(ws.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!wsfd) return fail_errno(errno, "open(" + ws + ")");
  UniqueFd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dirfd) return fail_errno(errno, "open(" + dir + ")");
  (void)::unlinkat(dirfd.get(), name.c_str(), 0);
  auto written = workspace::write_archive(wsfd.get(), dirfd.get(), name, "the build workspace");
  if (!written) return std::unexpected(written.error());
  if (::mkdir(out.c_str(), 0700) != 0) return fail_errno(errno, "mkdir(" + out + ")");
  if (::chown(out.c_str(), owner, owner) != 0) return fail_errno(errno, "chown(" + out + ")");
  UniqueFd afd(::openat(dirfd.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!afd) return fail_errno(errno, "open(" + dir + "/" + name + ")");
  UniqueFd outfd(::open(out.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!outfd) return fail_errno(errno, "open(" + out + ")");
  workspace::ExtractLimits limits;
  limits.max_ratio = ~std::uint64_t{0} / 2;  // our own archive: no bomb to stop
  limits.max_total_bytes = ~std::uint64_t{0} / 2;
  auto got = workspace::extract_archive(afd.get(), outfd.get(), limits,
                                        workspace::ArchiveOwner{owner, owner}, "the build");
  (void)::unlinkat(dirfd.get(), name.c_str(), 0);
  if (!got) return std::unexpected(got.error());
  return {};
}

Status detach_build_disk(const std::string& ws) {
  return linux::detach_quota_disk(ws, image_of(ws));
}

}  // namespace agentbox::session
