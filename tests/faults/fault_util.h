#pragma once
// Helpers of the fault tests: a small loop-mounted filesystem to fill, the integrity of a
// state.db, and the daemon's workspaces and archives as found on disk.

#include <sqlite3.h>
#include <sys/mount.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "integration/api_test_util.h"
#include "support/support.h"

namespace agentbox::testing {

// An ext4 filesystem of `mb` MiB in an image file under a temp dir, mounted at mount_point()
// through a loop device. The destructor unmounts it (lazily if still busy) and detaches the loop
// device, whatever the test did; the temp dir goes with it.
class LoopFs {
 public:
  explicit LoopFs(int mb) {
    const std::string img = dir_ / "fs.img";
    mnt_ = dir_ / "mnt";
    std::filesystem::create_directory(mnt_);
    int st = 0;
    // -m 0: no blocks reserved for root (the daemon is root: it would fill those too).
    run_shell("truncate -s " + std::to_string(mb) + "M " + img + " && mkfs.ext4 -q -F -m 0 " + img +
                  " >/dev/null 2>&1",
              &st);
    if (st != 0) throw std::runtime_error("mkfs.ext4 failed");
    std::string dev = run_shell("losetup --find --show " + img, &st);
    while (!dev.empty() && dev.back() == '\n') dev.pop_back();
    if (st != 0 || dev.empty()) throw std::runtime_error("losetup failed");
    dev_ = dev;
    if (::mount(dev_.c_str(), mnt_.c_str(), "ext4", 0, nullptr) != 0) {
      detach();
      throw std::runtime_error("mount of " + dev_ + " failed");
    }
    mounted_ = true;
  }
  ~LoopFs() {
    if (mounted_ && ::umount2(mnt_.c_str(), 0) != 0) ::umount2(mnt_.c_str(), MNT_DETACH);
    detach();
  }
  LoopFs(const LoopFs&) = delete;
  LoopFs& operator=(const LoopFs&) = delete;
  const std::string& mount_point() const { return mnt_; }
  const std::string& device() const { return dev_; }

 private:
  void detach() {
    if (dev_.empty()) return;
    int st = 0;
    run_shell("losetup -d " + dev_ + " 2>/dev/null", &st);
    dev_.clear();
  }
  TempDir dir_{"agentbox-faults-loop"};
  std::string mnt_;
  std::string dev_;
  bool mounted_ = false;
};

// PRAGMA integrity_check of the database at `path` ("ok" when sound), read-only.
inline std::string db_integrity(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close_v2(db);
    return "cannot open";
  }
  std::string out;
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db, "PRAGMA integrity_check;", -1, &s, nullptr) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW) {
    out = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
  } else {
    out = sqlite3_errmsg(db);
  }
  sqlite3_finalize(s);
  sqlite3_close_v2(db);
  return out;
}

// Whether /proc/mounts names `path` as a mount point.
inline bool mounted(const std::string& path) {
  return read_host_file("/proc/mounts").find(" " + path + " ") != std::string::npos;
}

// The names in `dir` ({} when it does not exist).
inline std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace agentbox::testing
