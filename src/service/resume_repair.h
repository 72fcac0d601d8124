#pragma once
// Seed 004's auto_repair (config `auto_repair`, flag --auto-repair): when a suspended session
// resumes, its health checks run and every failing one is repaired (sandbox/health_checks.h) before
// the resume's first command runs. Installed as ManagerConfig::on_resume.

#include <memory>
#include <vector>

#include "sandbox/health_checks.h"
#include "sandbox/sandbox.h"
#include "session/session_manager.h"
#include "session/template_manager.h"

namespace agentbox::service {

// The health checks of the template snapshot `info` started on (its template's current ones
// when that snapshot is gone); none for a session without a template, or when `templates` is
// null or the template was deleted.
std::vector<sandbox::HealthCheck> template_health_checks(session::TemplateManager* templates,
                                                         const session::SessionInfo& info);

// sandbox::repair_health on `box`, run to its end on the calling thread (a private
// io_context): the report. Blocking.
sandbox::HealthReport repair_now(const sandbox::HealthTarget& target);

// The on_resume hook that repairs the resumed session's workspace and logs what stays failing.
// A repair that fails does not fail the resume (the session's /health says what is wrong).
std::function<void(const session::SessionInfo&, const std::shared_ptr<sandbox::Sandbox>&)>
auto_repair_on_resume(std::shared_ptr<session::TemplateManager> templates);

}  // namespace agentbox::service
