#include "service/resume_repair.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <exception>
#include <optional>
#include <string>

#include "common/log.h"

namespace agentbox::service {

namespace asio = boost::asio;

std::vector<sandbox::HealthCheck> template_health_checks(session::TemplateManager* templates,
                                                         const session::SessionInfo& info) {
  std::vector<sandbox::HealthCheck> out;
  if (!templates || info.spec.template_name.empty()) return out;
  auto t = templates->get(info.spec.template_name);
  if (!t) return out;  // deleted since: its sessions keep only the built-in checks
  // The checks of the snapshot the session started on (a later upload or build changes only
  // the sessions made after it).
  const std::vector<workspace::TemplateHealthCheck>* checks = &t->tmpl.health;
  for (const auto& s : t->snapshots) {
    if (s.id == info.spec.snapshot && s.version == info.spec.template_version) checks = &s.health;
  }
  for (const auto& c : *checks) out.push_back({c.name, c.command, c.repair});
  return out;
}

sandbox::HealthReport repair_now(const sandbox::HealthTarget& target) {
  asio::io_context io;
  std::optional<sandbox::HealthReport> report;
  std::exception_ptr error;
  asio::co_spawn(io, sandbox::repair_health(target),
                 [&report, &error](std::exception_ptr p, sandbox::HealthReport r) {
                   if (p) {
                     error = p;
                   } else {
                     report = std::move(r);
                   }
                 });
  io.run();
  if (error) std::rethrow_exception(error);
  return std::move(*report);
}

std::function<void(const session::SessionInfo&, const std::shared_ptr<sandbox::Sandbox>&)>
auto_repair_on_resume(std::shared_ptr<session::TemplateManager> templates) {
  return
      [templates](const session::SessionInfo& info, const std::shared_ptr<sandbox::Sandbox>& box) {
        sandbox::HealthTarget target;
        target.box = box;
        target.template_checks = template_health_checks(templates.get(), info);
        target.configured = !info.spec.template_name.empty();
        try {
          sandbox::HealthReport report = repair_now(target);
          std::string failing;
          for (const auto& c : report.checks) {
            if (!c.ok) failing += (failing.empty() ? "" : ", ") + c.name;
          }
          if (report.healthy) {
            spdlog::info("session {}: auto_repair on resume: healthy", info.id);
          } else {
            spdlog::warn("session {}: auto_repair on resume: still failing: {}", info.id, failing);
          }
        } catch (const std::exception& e) {
          spdlog::error("session {}: auto_repair on resume: {}", info.id, e.what());
        }
      };
}

}  // namespace agentbox::service
