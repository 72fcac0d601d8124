#include "workspace/tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "common/unique_fd.h"

namespace agentbox::workspace {
namespace {

struct MdDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using Md = std::unique_ptr<EVP_MD_CTX, MdDeleter>;

Result<std::vector<std::string>> names_in(int dirfd, const std::string& what) {
  int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fail_errno(errno, "open(" + what + ")");
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int err = errno;
    ::close(fd);
    return fail_errno(err, "fdopendir(" + what + ")");
  }
  std::vector<std::string> out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(std::move(n));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

void add(EVP_MD_CTX* md, const std::string& s) {
  std::uint64_t n = s.size();
  EVP_DigestUpdate(md, &n, sizeof n);
  EVP_DigestUpdate(md, s.data(), s.size());
}

Status walk(int dirfd, const std::string& rel, EVP_MD_CTX* md, TreeStats* st) {
  auto names = AB_TRY(names_in(dirfd, rel.empty() ? "." : rel));
  for (const std::string& n : names) {
    std::string path = rel.empty() ? n : rel + "/" + n;
    struct stat sb {};
    if (::fstatat(dirfd, n.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
      return fail_errno(errno, "stat(" + path + ")");
    }
    ++st->files;
    add(md, path);
    std::string meta = std::to_string(sb.st_mode) + ":" + std::to_string(sb.st_uid) + ":" +
                       std::to_string(sb.st_gid);
    add(md, meta);
    if (S_ISDIR(sb.st_mode)) {
      UniqueFd sub(::openat(dirfd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub) return fail_errno(errno, "open(" + path + ")");
      AB_TRY(walk(sub.get(), path, md, st));
      add(md, "/end");
    } else if (S_ISLNK(sb.st_mode)) {
      std::string target(4096, '\0');
      ssize_t len = ::readlinkat(dirfd, n.c_str(), target.data(), target.size());
      if (len < 0) return fail_errno(errno, "readlink(" + path + ")");
      target.resize(static_cast<std::size_t>(len));
      add(md, target);
    } else if (S_ISREG(sb.st_mode)) {
      UniqueFd f(::openat(dirfd, n.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (!f) return fail_errno(errno, "open(" + path + ")");
      std::uint64_t size = 0;
      char buf[1 << 16];
      for (;;) {
        ssize_t r = ::read(f.get(), buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return fail_errno(errno, "read(" + path + ")");
        if (r == 0) break;
        EVP_DigestUpdate(md, buf, static_cast<std::size_t>(r));
        size += static_cast<std::uint64_t>(r);
      }
      add(md, std::to_string(size));
      st->bytes += size;
    } else {
      return fail(
          Code::kInvalid,
          "snapshot: '" + path + "' is a device, fifo or socket, which a snapshot cannot hold");
    }
  }
  return {};
}

struct SizeWalk {
  dev_t dev = 0;
  std::set<std::pair<dev_t, ino_t>> linked;  // inodes with several links, seen once
  TreeSize size;
};

Status size_walk(int dirfd, SizeWalk* w) {
  auto names = names_in(dirfd, "a workspace directory");
  if (!names) {
    if (names.error().code == Code::kNotFound) return {};  // removed while we walked
    return std::unexpected(names.error());
  }
  for (const std::string& n : *names) {
    struct stat sb {};
    if (::fstatat(dirfd, n.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      return fail_errno(errno, "stat(" + n + ")");
    }
    if (sb.st_dev != w->dev) continue;  // a mount point inside the tree
    ++w->size.entries;
    if (!S_ISDIR(sb.st_mode) && sb.st_nlink > 1 &&
        !w->linked.emplace(sb.st_dev, sb.st_ino).second) {
      continue;
    }
    w->size.bytes += static_cast<std::uint64_t>(sb.st_blocks) * 512;
    if (S_ISDIR(sb.st_mode)) {
      UniqueFd sub(::openat(dirfd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub) {
        if (errno == ENOENT || errno == ENOTDIR) continue;
        return fail_errno(errno, "open(" + n + ")");
      }
      AB_TRY(size_walk(sub.get(), w));
    }
  }
  return {};
}

}  // namespace

Result<TreeSize> tree_size(int dirfd) {
  struct stat root {};
  if (::fstat(dirfd, &root) != 0) return fail_errno(errno, "stat(workspace)");
  SizeWalk w;
  w.dev = root.st_dev;
  AB_TRY(size_walk(dirfd, &w));
  return w.size;
}

Result<TreeStats> hash_tree(int dirfd) {
  Md md(EVP_MD_CTX_new());
  if (!md || EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr) != 1) {
    return fail(Code::kInternal, "sha256: cannot initialise");
  }
  TreeStats st;
  AB_TRY(walk(dirfd, "", md.get(), &st));
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(md.get(), out, &len);
  static const char kHex[] = "0123456789abcdef";
  for (unsigned int i = 0; i < len; ++i) {
    st.hash.push_back(kHex[out[i] >> 4]);
    st.hash.push_back(kHex[out[i] & 15]);
  }
  return st;
}

}  // namespace agentbox::workspace
