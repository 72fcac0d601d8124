#include "service/services.h"

#include "service/template_sync.h"

namespace agentbox::service {

Services::Services(asio::io_context& ioc, asio::thread_pool& pool, session::SessionManager& manager,
                   ServiceOptions opts)
    : template_catalog_(opts.cluster != nullptr && opts.templates != nullptr
                            ? std::make_unique<TemplateCatalog>(opts.cluster, opts.templates)
                            : nullptr),
      deps_{&ioc, &pool, &manager, &bus_, opts.cluster, template_catalog_.get()},
      opts_(std::move(opts)),
      sessions(deps_),
      exec(deps_),
      files(deps_),
      processes(deps_),
      health(deps_, opts_.templates),
      images(deps_, opts_.images),
      templates(deps_, opts_.templates) {}

void Services::start() {
  lifecycle_sub_ = deps_.sessions->subscribe([this](const session::SessionEvent& ev) {
    processes.on_session_event(ev);
    // A session gone from this node (any cause: API, reaper) leaves the cluster's catalog.
    if (ev.kind == session::EventKind::kDestroyed && deps_.cluster != nullptr) {
      deps_.cluster->forget(ev.session.id);
    }
  });
  processes.resume_managed_sessions();
}

}  // namespace agentbox::service
