#pragma once
// Seed 004's workspace care as operations (API.md "Templates, snapshots, health, packages"):
// a session's health checks (the built-in ones plus its template's), their repair, package
// installs in its box, and the config's auto_repair when a session resumes. The work itself is
// sandbox/health_checks.h and sandbox/installers.h; it runs on the worker pool (its file calls
// block; its box commands are awaited there).

#include <boost/asio/awaitable.hpp>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "sandbox/health_checks.h"
#include "sandbox/installers.h"
#include "service/deps.h"
#include "service/origin.h"
#include "session/events.h"
#include "session/session_manager.h"
#include "session/template_manager.h"

namespace agentbox::service {

class Health {
 public:
  // `templates` may be null (no template store: only the built-in checks). The config's
  // auto_repair on resume is resume_repair.h (the session manager's on_resume hook: it runs
  // before the resume's first command).
  Health(Deps deps, std::shared_ptr<session::TemplateManager> templates)
      : d_(deps), templates_(std::move(templates)) {}

  asio::awaitable<Result<sandbox::HealthReport>> check(Origin origin, std::string id);
  // Emits "session.repair".
  asio::awaitable<Result<sandbox::HealthReport>> repair(Origin origin, std::string id);
  // Installs in the session's box, under its network policy (emits "session.packages").
  asio::awaitable<Result<sandbox::InstallResult>> install(Origin origin, std::string id,
                                                          sandbox::InstallRequest req);

 private:
  asio::awaitable<Result<sandbox::HealthTarget>> target(const Origin& origin, std::string id);

  Deps d_;
  std::shared_ptr<session::TemplateManager> templates_;
};

}  // namespace agentbox::service
