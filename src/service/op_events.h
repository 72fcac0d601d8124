#pragma once
// Operation events: every operation of service/ that changes something a tenant owns (an exec,
// a file mutation, a process start or kill, a policy change, a repair, an install) emits exactly
// one event when it is done, and the audit log and the metrics subscribe. Surfaces never write an
// audit line themselves, so an operation is audited the same way whichever surface it came
// through (the session lifecycle has its own events: session/events.h).
//
// The fields are plain values (no JSON below the wire layers); the audit log turns them into
// its JSON line. SECURITY: never a token, never file contents, exec output or stdin.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/error.h"
#include "sandbox/sandbox.h"
#include "service/origin.h"

namespace agentbox::service {

using FieldRecord = std::vector<std::pair<std::string, std::string>>;  // {"host_path": "/srv"...}
using FieldValue = std::variant<std::nullptr_t, bool, std::int64_t, std::uint64_t, std::string,
                                std::vector<std::string>, std::map<std::string, std::string>,
                                std::map<std::string, std::uint64_t>, std::vector<FieldRecord>>;
// In the order the audit line shows them.
using Fields = std::vector<std::pair<std::string, FieldValue>>;

struct OpEvent {
  std::string_view op;  // "exec", "file.put", "process.start", "session.network", ...
  const Origin& origin;
  std::string_view session;  // "" when the operation has none (runner.register)
  const Fields& fields;
  // For "exec": how the command ended (an Error when it could not run); null otherwise.
  const Result<sandbox::ExecResult>* exec = nullptr;
};

// Called synchronously on the thread that finished the operation (the network thread or a pool
// thread); must not block and must not call back into service/.
using OpSubscriber = std::function<void(const OpEvent&)>;

// The subscribers of one daemon. Thread-safe.
class OpBus {
 public:
  // `fn` gets every later event until the returned handle is dropped; in subscription order.
  [[nodiscard]] std::shared_ptr<void> subscribe(OpSubscriber fn);
  void publish(const OpEvent& ev) const;
  // publish() of {op, origin, session, fields}.
  void emit(std::string_view op, const Origin& origin, std::string_view session,
            const Fields& fields) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::weak_ptr<OpSubscriber>> subs_;
};

}  // namespace agentbox::service
