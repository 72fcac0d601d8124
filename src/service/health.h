#pragma once
// Seed 004's workspace care as operations (API.md "Templates, snapshots, health, packages"):
// a session's health checks (the built-in ones plus its template's), their repair, package
// installs in its box, and the config's auto_repair when a session resumes. The work itself is
// workspace/health.h and workspace/installers.h; it runs on the worker pool (its file calls
// block; its box commands are awaited there).

#include <boost/asio/awaitable.hpp>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "service/deps.h"
#include "service/origin.h"
#include "session/events.h"
#include "session/session_manager.h"
#include "session/template_manager.h"
#include "sandbox/health_checks.h"
#include "sandbox/installers.h"

namespace agentbox::service {

class Health {
 public:
  // `templates` may be null (no template store: only the built-in checks).
  Health(Deps deps, std::shared_ptr<session::TemplateManager> templates, bool auto_repair)
      : d_(deps), templates_(std::move(templates)), auto_repair_(auto_repair) {}

  asio::awaitable<Result<sandbox::HealthReport>> check(Origin origin, std::string id);
  // Emits "session.repair".
  asio::awaitable<Result<sandbox::HealthReport>> repair(Origin origin, std::string id);
  // Installs in the session's box, under its network policy (emits "session.packages").
  asio::awaitable<Result<sandbox::InstallResult>> install(Origin origin, std::string id,
                                                            sandbox::InstallRequest req);

  // The health checks (YAML `health:`) of the template the session started on; none for a
  // plain session. Blocking (reads the template store).
  std::vector<sandbox::HealthCheck> template_checks(const session::SessionInfo& info) const;

  // With auto_repair, a kResumed event runs the session's repair. Any thread.
  void on_session_event(const session::SessionEvent& ev);

 private:
  asio::awaitable<Result<sandbox::HealthTarget>> target(const Origin& origin, std::string id);
  asio::awaitable<void> auto_repair(std::string id);

  Deps d_;
  std::shared_ptr<session::TemplateManager> templates_;
  bool auto_repair_;
};

}  // namespace agentbox::service
