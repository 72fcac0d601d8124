#include "image/layer.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "common/unique_fd.h"
#include "linux/sys.h"

namespace agentbox::image {
namespace {

constexpr std::size_t kChunk = 1 << 16;
constexpr std::string_view kWhiteout = ".wh.";
constexpr std::string_view kOpaque = ".wh..wh..opq";

struct ReaderFree {
  void operator()(struct archive* a) const { archive_read_free(a); }
};
using Reader = std::unique_ptr<struct archive, ReaderFree>;

std::string archive_error(struct archive* a) {
  const char* s = archive_error_string(a);
  return s ? s : "unknown libarchive error";
}

std::string hex(const unsigned char* d, unsigned n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out += kHex[d[i] >> 4];
    out += kHex[d[i] & 15];
  }
  return out;
}

// A printable form of an entry name for messages.
std::string shown_name(std::string_view name) {
  std::string out;
  for (char c : name.substr(0, 256)) {
    out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  }
  if (name.size() > 256) out += "...";
  return out;
}

Reader open_reader(bool raw) {
  Reader a(archive_read_new());
  if (!a) return a;
  archive_read_support_filter_gzip(a.get());
  archive_read_support_filter_zstd(a.get());
  archive_read_support_filter_none(a.get());
  if (raw) {
    archive_read_support_format_raw(a.get());
    archive_read_support_format_empty(a.get());
  } else {
    archive_read_support_format_tar(a.get());
    archive_read_support_format_empty(a.get());
  }
  return a;
}

Error bad(const std::string& shown, std::string_view entry, const std::string& why) {
  return Error::make(Code::kImage, "layer " + shown + ": entry '" + shown_name(entry) + "' " + why);
}

// SECURITY: every step is a plain name in this tree: no "..", no absolute path, no symlink (not
// even one pointing inside), no magic link, no other mount.
int open_beneath(int dirfd, const char* path, std::uint64_t flags) {
  return linux::sys::openat2_raw(
      dirfd, path, flags,
      RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV);
}

Result<std::vector<std::string>> split_entry(std::string_view name, const std::string& shown) {
  if (name.empty()) return fail(Code::kImage, "layer " + shown + ": an entry has no name");
  if (name.size() > PATH_MAX) return std::unexpected(bad(shown, name, "is over PATH_MAX"));
  if (name.front() == '/') return std::unexpected(bad(shown, name, "is an absolute path"));
  std::vector<std::string> comps;
  std::size_t i = 0;
  while (i <= name.size()) {
    std::size_t j = name.find('/', i);
    if (j == std::string_view::npos) j = name.size();
    std::string_view c = name.substr(i, j - i);
    i = j + 1;
    if (c.empty() || c == ".") continue;
    if (c == "..") return std::unexpected(bad(shown, name, "has a '..' component"));
    if (c.size() > NAME_MAX) return std::unexpected(bad(shown, name, "has an over-long name"));
    comps.emplace_back(c);
  }
  if (comps.size() > 512) return std::unexpected(bad(shown, name, "is too deep"));
  return comps;
}

// The directory holding comps.back() (all of comps when `whole`), made 0755 where missing.
Result<UniqueFd> open_parent(int into_fd, const std::vector<std::string>& comps, bool whole,
                             std::string_view entry, const std::string& shown) {
  UniqueFd cur(::openat(into_fd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!cur) return fail_errno(errno, "open(layer dir)");
  const std::size_t n = whole ? comps.size() : comps.size() - 1;
  for (std::size_t k = 0; k < n; ++k) {
    const char* c = comps[k].c_str();
    int fd = open_beneath(cur.get(), c, O_PATH | O_DIRECTORY);
    if (fd < 0 && errno == ENOENT) {
      if (::mkdirat(cur.get(), c, 0755) != 0 && errno != EEXIST) {
        return fail_errno(errno, "layer " + shown + ": mkdir for entry " + shown_name(entry));
      }
      if (::fchownat(cur.get(), c, kLayerIdBase, kLayerIdBase, AT_SYMLINK_NOFOLLOW) != 0) {
        return fail_errno(errno, "layer " + shown + ": chown for entry " + shown_name(entry));
      }
      fd = open_beneath(cur.get(), c, O_PATH | O_DIRECTORY);
    }
    if (fd < 0) {
      int err = errno;
      if (err == ELOOP || err == EXDEV || err == ENOTDIR) {
        return std::unexpected(bad(shown, entry,
                                   "goes through a symlink or non-directory ('" +
                                       shown_name(comps[k]) + "'), which would leave the layer"));
      }
      return fail_errno(err, "layer " + shown + ": open parent of entry " + shown_name(entry));
    }
    cur = UniqueFd(fd);
  }
  return cur;
}

// Makes room for a new non-directory `leaf` in `pfd`: a later entry of a tar replaces an earlier
// one of the same name (an empty directory may be replaced; a full one is an error).
Status clear_leaf(int pfd, const std::string& leaf, std::string_view entry,
                  const std::string& shown) {
  struct stat st;
  if (::fstatat(pfd, leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return {};
  if (S_ISDIR(st.st_mode)) {
    if (::unlinkat(pfd, leaf.c_str(), AT_REMOVEDIR) != 0) {
      return std::unexpected(bad(shown, entry, "replaces a non-empty directory"));
    }
    return {};
  }
  if (::unlinkat(pfd, leaf.c_str(), 0) != 0) {
    return fail_errno(errno, "layer " + shown + ": replace entry " + shown_name(entry));
  }
  return {};
}

struct Fixup {
  std::vector<std::string> comps;
  mode_t mode;
  timespec mtime;
};

Status set_owner_mode_time(int pfd, const std::string& leaf, uid_t uid, gid_t gid,
                           std::optional<mode_t> mode, timespec mtime, std::string_view entry,
                           const std::string& shown) {
  if (::fchownat(pfd, leaf.c_str(), kLayerIdBase + uid, kLayerIdBase + gid, AT_SYMLINK_NOFOLLOW) !=
      0) {
    return fail_errno(errno, "layer " + shown + ": chown entry " + shown_name(entry));
  }
  // chown clears setuid/setgid: the mode goes after it.
  if (mode && ::fchmodat(pfd, leaf.c_str(), *mode, 0) != 0) {
    return fail_errno(errno, "layer " + shown + ": chmod entry " + shown_name(entry));
  }
  timespec times[2] = {mtime, mtime};
  (void)::utimensat(pfd, leaf.c_str(), times, AT_SYMLINK_NOFOLLOW);
  return {};
}

}  // namespace

Result<std::string> layer_diff_id(int blob_fd, const std::string& shown) {
  if (::lseek(blob_fd, 0, SEEK_SET) != 0) return fail_errno(errno, "seek(" + shown + ")");
  Reader a = open_reader(true);
  if (!a) return fail(Code::kInternal, "archive_read_new failed");
  if (archive_read_open_fd(a.get(), blob_fd, kChunk) != ARCHIVE_OK) {
    return fail(Code::kImage, "layer " + shown + " is not a tar stream: " + archive_error(a.get()));
  }
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return fail(Code::kInternal, "sha256 unavailable");
  }
  archive_entry* e = nullptr;
  int r = archive_read_next_header(a.get(), &e);
  if (r == ARCHIVE_OK || r == ARCHIVE_WARN) {
    std::vector<char> buf(kChunk);
    for (;;) {
      la_ssize_t n = archive_read_data(a.get(), buf.data(), buf.size());
      if (n < 0) {
        return fail(Code::kImage,
                    "layer " + shown + " does not decompress: " + archive_error(a.get()));
      }
      if (n == 0) break;
      EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(n));
    }
  } else if (r != ARCHIVE_EOF) {
    return fail(Code::kImage, "layer " + shown + " does not decompress: " + archive_error(a.get()));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  return "sha256:" + hex(md, len);
}

Result<LayerStats> unpack_layer(int blob_fd, int into_fd, const std::string& shown) {
  if (::lseek(blob_fd, 0, SEEK_SET) != 0) return fail_errno(errno, "seek(" + shown + ")");
  Reader a = open_reader(false);
  if (!a) return fail(Code::kInternal, "archive_read_new failed");
  if (archive_read_open_fd(a.get(), blob_fd, kChunk) != ARCHIVE_OK) {
    return fail(Code::kImage, "layer " + shown + " is not a tar: " + archive_error(a.get()));
  }
  LayerStats stats;
  std::vector<Fixup> dirs;
  std::vector<char> buf(kChunk);
  for (;;) {
    archive_entry* e = nullptr;
    int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) {
      return fail(Code::kImage,
                  "layer " + shown + " is not a valid tar: " + archive_error(a.get()));
    }
    ++stats.entries;
    const char* raw = archive_entry_pathname(e);
    if (!raw) return fail(Code::kImage, "layer " + shown + ": an entry has no name");
    const std::string name = raw;
    auto comps = AB_TRY(split_entry(name, shown));
    const mode_t type = archive_entry_filetype(e);
    const la_int64_t uid = archive_entry_uid(e), gid = archive_entry_gid(e);
    if (uid < 0 || gid < 0 || uid >= kLayerIdCount || gid >= kLayerIdCount) {
      return std::unexpected(bad(shown, name, "is owned by an id over 65535"));
    }
    const mode_t perm = archive_entry_perm(e) & 07777;
    const timespec mtime{archive_entry_mtime(e), archive_entry_mtime_nsec(e)};

    if (comps.empty()) {
      if (type == AE_IFDIR) continue;  // "./": the layer's root, which we made
      return std::unexpected(bad(shown, name, "names the root as a non-directory"));
    }
    const std::string& leaf = comps.back();

    // Whiteouts (OCI image-spec layer.md) become overlayfs whiteouts.
    if (std::string_view(leaf).starts_with(kWhiteout)) {
      if (leaf == kOpaque) {
        if (comps.size() == 1) {
          return std::unexpected(bad(shown, name, "is a whiteout of / (an opaque root)"));
        }
        comps.pop_back();
        auto dir = AB_TRY(open_parent(into_fd, comps, true, name, shown));
        // setxattr needs a real fd (not O_PATH) on the directory.
        UniqueFd d(::openat(dir.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!d || ::fsetxattr(d.get(), "trusted.overlay.opaque", "y", 1, 0) != 0) {
          return fail_errno(errno,
                            "layer " + shown + ": mark opaque for entry " + shown_name(name));
        }
        continue;
      }
      std::string target = leaf.substr(kWhiteout.size());
      if (target.empty() || target == "." || target == "..") {
        return std::unexpected(bad(shown, name, "is a whiteout of /"));
      }
      auto parent = AB_TRY(open_parent(into_fd, comps, false, name, shown));
      AB_TRY(clear_leaf(parent.get(), target, name, shown));
      if (::mknodat(parent.get(), target.c_str(), S_IFCHR | 0, makedev(0, 0)) != 0) {
        return fail_errno(errno, "layer " + shown + ": whiteout for entry " + shown_name(name));
      }
      continue;
    }

    auto parent = AB_TRY(open_parent(into_fd, comps, false, name, shown));
    const int pfd = parent.get();

    if (const char* hl = archive_entry_hardlink(e)) {
      auto split = split_entry(hl, shown);
      if (!split || split->empty()) {
        return std::unexpected(
            bad(shown, name, "is a hard link to '" + shown_name(hl) + "', outside the layer"));
      }
      const std::vector<std::string>& tcomps = *split;
      auto tparent = open_parent(into_fd, tcomps, false, name, shown);
      if (!tparent) return std::unexpected(tparent.error());
      struct stat st;
      if (::fstatat(tparent->get(), tcomps.back().c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
          S_ISDIR(st.st_mode)) {
        return std::unexpected(
            bad(shown, name,
                "is a hard link to '" + shown_name(hl) + "', which is not a file of this layer"));
      }
      AB_TRY(clear_leaf(pfd, leaf, name, shown));
      if (::linkat(tparent->get(), tcomps.back().c_str(), pfd, leaf.c_str(), 0) != 0) {
        return fail_errno(errno, "layer " + shown + ": link entry " + shown_name(name));
      }
      continue;
    }

    switch (type) {
      case AE_IFDIR: {
        struct stat st;
        if (::fstatat(pfd, leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
          if (!S_ISDIR(st.st_mode)) AB_TRY(clear_leaf(pfd, leaf, name, shown));
        }
        if (::mkdirat(pfd, leaf.c_str(), 0700) != 0 && errno != EEXIST) {
          return fail_errno(errno, "layer " + shown + ": mkdir entry " + shown_name(name));
        }
        AB_TRY(set_owner_mode_time(pfd, leaf, static_cast<uid_t>(uid), static_cast<gid_t>(gid),
                                   std::nullopt, mtime, name, shown));
        dirs.push_back({std::move(comps), perm, mtime});  // modes last: a 0555 dir must fill
        continue;
      }
      case AE_IFLNK: {
        const char* target = archive_entry_symlink(e);
        if (!target || !*target) return std::unexpected(bad(shown, name, "is an empty symlink"));
        AB_TRY(clear_leaf(pfd, leaf, name, shown));
        if (::symlinkat(target, pfd, leaf.c_str()) != 0) {
          return fail_errno(errno, "layer " + shown + ": symlink entry " + shown_name(name));
        }
        AB_TRY(set_owner_mode_time(pfd, leaf, static_cast<uid_t>(uid), static_cast<gid_t>(gid),
                                   std::nullopt, mtime, name, shown));
        continue;
      }
      case AE_IFIFO: {
        AB_TRY(clear_leaf(pfd, leaf, name, shown));
        if (::mkfifoat(pfd, leaf.c_str(), 0600) != 0) {
          return fail_errno(errno, "layer " + shown + ": mkfifo entry " + shown_name(name));
        }
        AB_TRY(set_owner_mode_time(pfd, leaf, static_cast<uid_t>(uid), static_cast<gid_t>(gid),
                                   perm, mtime, name, shown));
        continue;
      }
      case AE_IFREG: break;
      case AE_IFCHR:
      case AE_IFBLK:
        return std::unexpected(bad(shown, name, "is a device node; images may not carry them"));
      default: return std::unexpected(bad(shown, name, "is a socket or of an unknown type"));
    }

    // A regular file.
    AB_TRY(clear_leaf(pfd, leaf, name, shown));
    UniqueFd out(
        ::openat(pfd, leaf.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out) return fail_errno(errno, "layer " + shown + ": create entry " + shown_name(name));
    for (;;) {
      la_ssize_t n = archive_read_data(a.get(), buf.data(), buf.size());
      if (n < 0) {
        return fail(Code::kImage, "layer " + shown + ": entry '" + shown_name(name) +
                                      "' does not read: " + archive_error(a.get()));
      }
      if (n == 0) break;
      const char* p = buf.data();
      std::size_t left = static_cast<std::size_t>(n);
      while (left > 0) {
        ssize_t w = ::write(out.get(), p, left);
        if (w < 0) {
          if (errno == EINTR) continue;
          return fail_errno(errno, "layer " + shown + ": write entry " + shown_name(name));
        }
        p += w;
        left -= static_cast<std::size_t>(w);
      }
      stats.bytes += static_cast<std::uint64_t>(n);
    }
    out.reset();
    AB_TRY(set_owner_mode_time(pfd, leaf, static_cast<uid_t>(uid), static_cast<gid_t>(gid), perm,
                               mtime, name, shown));
  }
  // Directory modes and times last, deepest first.
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    auto parent = open_parent(into_fd, it->comps, false, "", shown);
    if (!parent) continue;  // replaced by a later entry
    const std::string& leaf = it->comps.back();
    (void)::fchmodat(parent->get(), leaf.c_str(), it->mode, 0);
    timespec times[2] = {it->mtime, it->mtime};
    (void)::utimensat(parent->get(), leaf.c_str(), times, AT_SYMLINK_NOFOLLOW);
  }
  return stats;
}

}  // namespace agentbox::image
