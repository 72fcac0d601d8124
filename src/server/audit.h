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
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "service/op_events.h"
#include "session/events.h"

namespace agentbox::session {
class SessionManager;
}

namespace agentbox::server {

class AuditLog {
 public:
  static Result<std::unique_ptr<AuditLog>> open(std::string path, std::uint64_t max_bytes,
                                                int keep = 3);

  // Appends {"time", "event", "tenant", "session", ...fields}. `fields` must be an object.
  void record(std::string_view event, std::string_view tenant, std::string_view session,
              const nlohmann::ordered_json& fields = nlohmann::ordered_json::object());

  const std::string& path() const { return path_; }

  // The whole lines among the last `max_bytes` of the current file (not the rotated ones),
  // oldest first. For GET /v1/audit; runs in the pool (it reads the file).
  Result<std::vector<std::string>> tail(std::size_t max_bytes) const;

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

// The session lines of the log come from the session manager's lifecycle events (events.h):
// session.create / .restore / .resume / .suspend / .archive + .destroy, with the acting
// tenant (the owner when the daemon acted), and {"by":"agentboxd","reason":...} for what the
// reaper or eviction did. Lines are written until the returned handle is dropped.
[[nodiscard]] std::shared_ptr<void> audit_session_events(session::SessionManager& sessions,
                                                         std::shared_ptr<AuditLog> log);
// One event as audit lines (exposed for tests).
void record_session_event(AuditLog& log, const session::SessionEvent& ev);

// Every operation event of service/ (op_events.h) as one line {"event": op, "tenant": the
// caller's, "session", ...fields}, until the returned handle is dropped.
[[nodiscard]] std::shared_ptr<void> audit_operations(service::OpBus& bus,
                                                     std::shared_ptr<AuditLog> log);
// One operation event's fields as the JSON object of its line (exposed for tests).
nlohmann::ordered_json op_fields_json(const service::Fields& fields);

}  // namespace agentbox::server
