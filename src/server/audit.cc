#include "server/audit.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/log.h"
#include "server/json_codec.h"
#include "session/session_manager.h"

namespace agentbox::server {
namespace {

Result<UniqueFd> open_log(const std::string& path, std::uint64_t* size) {
  // 0600: the log names sessions and commands of every tenant.
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) return fail_errno(errno, "open(" + path + ")");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return fail_errno(errno, "stat(" + path + ")");
  *size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

}  // namespace

AuditLog::AuditLog(std::string path, std::uint64_t max_bytes, int keep, UniqueFd fd,
                   std::uint64_t size)
    : path_(std::move(path)), max_bytes_(max_bytes), keep_(keep), fd_(std::move(fd)), size_(size) {}

Result<std::unique_ptr<AuditLog>> AuditLog::open(std::string path, std::uint64_t max_bytes,
                                                 int keep) {
  if (max_bytes == 0) return fail(Code::kInvalid, "audit log: max size must be > 0");
  std::uint64_t size = 0;
  auto fd = open_log(path, &size);
  if (!fd) return std::unexpected(fd.error());
  return std::unique_ptr<AuditLog>(
      new AuditLog(std::move(path), max_bytes, keep, std::move(*fd), size));
}

Result<std::vector<std::string>> AuditLog::tail(std::size_t max_bytes) const {
  UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return fail_errno(errno, "open(" + path_ + ")");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return fail_errno(errno, "stat(" + path_ + ")");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t from = size > max_bytes ? size - max_bytes : 0;
  std::string data(static_cast<std::size_t>(size - from), '\0');
  std::size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::pread(fd.get(), data.data() + got, data.size() - got,
                              static_cast<off_t>(from + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "read(" + path_ + ")");
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  data.resize(got);
  std::vector<std::string> lines;
  std::size_t start = 0;
  if (from > 0) {  // the first line is cut: skip it
    auto nl = data.find('\n');
    start = nl == std::string::npos ? data.size() : nl + 1;
  }
  while (start < data.size()) {
    auto nl = data.find('\n', start);
    if (nl == std::string::npos) break;  // a line being written: not whole yet
    if (nl > start) lines.push_back(data.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

void AuditLog::rotate_locked() {
  // audit.log.(keep-1) -> .keep, ..., audit.log -> .1; the oldest is overwritten by rename.
  for (int i = keep_ - 1; i >= 1; --i) {
    std::string from = path_ + "." + std::to_string(i);
    std::string to = path_ + "." + std::to_string(i + 1);
    if (::rename(from.c_str(), to.c_str()) != 0 && errno != ENOENT) {
      spdlog::warn("audit log: rename({}, {}): {}", from, to, std::strerror(errno));
    }
  }
  if (keep_ >= 1) {
    std::string first = path_ + ".1";
    if (::rename(path_.c_str(), first.c_str()) != 0) {
      spdlog::warn("audit log: rename({}, {}): {}", path_, first, std::strerror(errno));
    }
  } else {
    (void)::unlink(path_.c_str());
  }
  std::uint64_t size = 0;
  auto fd = open_log(path_, &size);
  if (!fd) {
    spdlog::error("audit log: reopening after rotation: {}", fd.error().message);
    return;  // keep writing to the renamed file rather than lose lines
  }
  fd_ = std::move(*fd);
  size_ = size;
}

void AuditLog::record(std::string_view event, std::string_view tenant, std::string_view session,
                      const nlohmann::ordered_json& fields) {
  nlohmann::ordered_json line = nlohmann::ordered_json::object();
  line["time"] = rfc3339(std::chrono::system_clock::now());
  line["event"] = event;
  line["tenant"] = tenant;
  line["session"] = session;
  if (fields.is_object()) {
    for (const auto& [k, v] : fields.items()) line[k] = v;
  }
  // Paths and commands may be any bytes: replace invalid UTF-8 rather than throw.
  std::string text = line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  text += '\n';

  std::lock_guard lk(mu_);
  // One write(2) per line on O_APPEND: atomic with respect to other appenders.
  ssize_t n = ::write(fd_.get(), text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    if (!warned_) {
      spdlog::error("audit log {}: write failed: {}", path_,
                    n < 0 ? std::strerror(errno) : "short write");
      warned_ = true;
    }
    return;
  }
  warned_ = false;
  size_ += text.size();
  if (size_ >= max_bytes_) rotate_locked();
}

void record_session_event(AuditLog& log, const session::SessionEvent& ev) {
  using session::EventCause;
  using session::EventKind;
  const session::SessionInfo& s = ev.session;
  const std::string_view tenant = ev.actor.empty() ? std::string_view(s.tenant) : ev.actor;
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();
  if (ev.cause == EventCause::kReaper || ev.cause == EventCause::kEviction) {
    fields["by"] = "agentboxd";
    fields["reason"] = ev.detail;
  } else if (!ev.detail.empty()) {
    fields["archive"] = ev.detail;  // a restore's source, an archived destroy's archive
  }
  switch (ev.kind) {
    case EventKind::kCreated:
      log.record(ev.cause == EventCause::kRestore ? "session.restore" : "session.create", tenant,
                 s.id, fields);
      return;
    case EventKind::kResumed: log.record("session.resume", tenant, s.id, fields); return;
    case EventKind::kSuspended: log.record("session.suspend", tenant, s.id, fields); return;
    case EventKind::kUpdated:
      return;  // the route writes session.update / session.network with the request's fields
    case EventKind::kDestroyed:
      if (fields.contains("archive")) log.record("session.archive", tenant, s.id, fields);
      log.record("session.destroy", tenant, s.id, fields);
      return;
  }
}

std::shared_ptr<void> audit_session_events(session::SessionManager& sessions,
                                           std::shared_ptr<AuditLog> log) {
  return sessions.subscribe(
      [log = std::move(log)](const session::SessionEvent& ev) { record_session_event(*log, ev); });
}

nlohmann::ordered_json op_fields_json(const service::Fields& fields) {
  using ojson = nlohmann::ordered_json;
  struct ToJson {
    ojson operator()(std::nullptr_t) const { return nullptr; }
    ojson operator()(bool v) const { return v; }
    ojson operator()(std::int64_t v) const { return v; }
    ojson operator()(std::uint64_t v) const { return v; }
    ojson operator()(const std::string& v) const { return v; }
    ojson operator()(const std::vector<std::string>& v) const { return v; }
    ojson operator()(const std::map<std::string, std::string>& v) const { return v; }
    ojson operator()(const std::map<std::string, std::uint64_t>& v) const { return v; }
    ojson operator()(const std::vector<service::FieldRecord>& v) const {
      ojson arr = ojson::array();
      for (const auto& rec : v) {
        ojson o = ojson::object();
        for (const auto& [k, val] : rec) o[k] = val;
        arr.push_back(std::move(o));
      }
      return arr;
    }
  };
  ojson out = ojson::object();
  for (const auto& [name, value] : fields) out[name] = std::visit(ToJson{}, value);
  return out;
}

std::shared_ptr<void> audit_operations(service::OpBus& bus, std::shared_ptr<AuditLog> log) {
  return bus.subscribe([log = std::move(log)](const service::OpEvent& ev) {
    nlohmann::ordered_json fields = op_fields_json(ev.fields);
    // The surface, for every door but the native API (seed 001 is the daemon's own too; a
    // runner's events are about the runner connection itself).
    if (ev.origin.surface != service::Surface::kV1 &&
        ev.origin.surface != service::Surface::kSeed001 &&
        ev.origin.surface != service::Surface::kRunner) {
      fields["via"] = service::surface_name(ev.origin.surface);
    }
    log->record(ev.op, ev.origin.caller.tenant, ev.session, fields);
  });
}

}  // namespace agentbox::server
