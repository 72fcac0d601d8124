#pragma once
// The operations layer of one daemon (shared/DESIGN.md "Architecture": service/), made once by
// daemon/main.cc and lent to every surface: /v1, the dialects, the runner hub. Owns the
// operation events' bus (the audit log and the metrics subscribe to it) and subscribes what must
// follow a session's lifecycle whatever surface moved it: managed-process revival. (Auto-repair
// on resume is the session manager's on_resume hook, resume_repair.h: it must finish before the
// resume's first command.)

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <memory>

#include "service/deps.h"
#include "service/exec.h"
#include "service/files.h"
#include "service/health.h"
#include "service/images.h"
#include "service/op_events.h"
#include "service/processes.h"
#include "service/sessions.h"
#include "service/template_sync.h"
#include "service/templates.h"
#include "session/session_manager.h"
#include "session/template_manager.h"

namespace agentbox::service {

struct ServiceOptions {
  // The template store (null: none).
  std::shared_ptr<session::TemplateManager> templates;
  // Cluster mode (null: none); outlives the services.
  cluster::Cluster* cluster = nullptr;
  // The image store (null: images not enabled).
  std::shared_ptr<image::ImageStore> images;
};

class Services {
 private:
  // First: the operation classes below are made from these.
  OpBus bus_;
  // Cluster mode with templates (null otherwise).
  std::unique_ptr<TemplateCatalog> template_catalog_;
  Deps deps_;
  ServiceOptions opts_;
  std::shared_ptr<void> lifecycle_sub_;  // SessionManager::subscribe handle

 public:
  // Keeps references to ioc, pool and manager, which outlive it.
  Services(asio::io_context& ioc, asio::thread_pool& pool, session::SessionManager& manager,
           ServiceOptions opts);
  Services(const Services&) = delete;
  Services& operator=(const Services&) = delete;

  // Subscribes revival to the manager's events, and resumes the sessions that have managed
  // processes. Once, when the daemon starts serving.
  void start();

  OpBus& bus() { return bus_; }
  const Deps& deps() const { return deps_; }
  session::SessionManager& manager() { return *deps_.sessions; }

  Sessions sessions;
  Exec exec;
  Files files;
  Processes processes;
  Health health;
  Images images;
  Templates templates;
};

}  // namespace agentbox::service
