#pragma once
// The audit log (DESIGN.md "session/ ... audit log"; README "Audit log"): one JSON object per
// line in data_dir/audit.log for every session change (create, destroy, archive, restore), every
// exec (command or argv, exit code, duration) and every file mutation through the API (put,
// delete, rename, mkdir: path, size), each with time, tenant and session.
//
// SECURITY: never a token, never file contents or exec output — callers pass only the fields
// above. Lines are written with one write(2) on an O_APPEND fd, so concurrent writers (and a
// tail -f reader) never see a torn or interleaved line.
//
// Rotation by size: once audit.log reaches max_bytes it becomes audit.log.1 (.1 -> .2, ...,
// keeping `keep` old files) and a new audit.log starts.
//
// Threading: every method may be called from any thread (one mutex). A failed write is logged
// once and does not fail the request that caused it.

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/unique_fd.h"

namespace agentbox::server {

class AuditLog {
 public:
  static Result<std::unique_ptr<AuditLog>> open(std::string path, std::uint64_t max_bytes,
                                                int keep = 3);

  // Appends {"time", "event", "tenant", "session", ...fields}. `fields` must be an object.
  void record(std::string_view event, std::string_view tenant, std::string_view session,
              const nlohmann::ordered_json& fields = nlohmann::ordered_json::object());

  const std::string& path() const { return path_; }

 private:
  AuditLog(std::string path, std::uint64_t max_bytes, int keep, UniqueFd fd, std::uint64_t size);
  void rotate_locked();

  const std::string path_;
  const std::uint64_t max_bytes_;
  const int keep_;
  std::mutex mu_;
  UniqueFd fd_;          // guarded by mu_
  std::uint64_t size_;   // bytes in the current file; guarded by mu_
  bool warned_ = false;  // a write error was logged; guarded by mu_
};

}  // namespace agentbox::server
