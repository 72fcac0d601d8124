#pragma once
// What happens to sessions, told by the session manager to whoever subscribes (the audit log,
// metrics, the /v1/events WebSocket). The manager is the only source: no caller re-derives
// "was a session created?" from return values.

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace agentbox::session {

struct SessionInfo;

// kUpdated: a live change (PATCH /v1/sessions/{id}, a new network mode or policy); the detail
// names what changed ("limits", "ttl_sec", "labels", "network").
enum class EventKind { kCreated, kResumed, kSuspended, kDestroyed, kUpdated };
// Why: a client asked (kApi), the idle reaper, eviction at max_running_boxes, a restore from an
// archive, or the daemon's own start (sessions it resumes itself, e.g. for managed processes).
enum class EventCause { kApi, kReaper, kEviction, kRestore, kStartup };

std::string_view event_kind_name(EventKind k);    // "created", ..., "destroyed", "updated"
std::string_view event_cause_name(EventCause c);  // "api", "reaper", "eviction", "restore", "startup"

struct SessionEvent {
  EventKind kind;
  EventCause cause;
  // The session as it is after the event (for kDestroyed: as it was). Its `tenant` is the owner.
  const SessionInfo& session;
  // The tenant whose request caused it ("" when the daemon acted on its own account).
  std::string_view actor;
  // Extra words for the audit line, e.g. the archive path of a destroy with archive; may be "".
  std::string_view detail;
};

// Called synchronously, with no session-manager lock held, on the thread that made the change
// (a request's pool thread or the reaper). Must not block for long and must not call back into
// the manager.
using EventSubscriber = std::function<void(const SessionEvent&)>;

}  // namespace agentbox::session
