#pragma once
// What every operation class of service/ works with. Owned by the daemon (daemon/main.cc); the
// pointers outlive the services.

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "cluster/cluster.h"
#include "service/op_events.h"
#include "session/session_manager.h"

namespace agentbox::service {

namespace asio = boost::asio;

class TemplateCatalog;  // service/template_sync.h

struct Deps {
  // The network loop: process I/O and the daemon's own coroutines (revival, auto-repair) run
  // here, as a request's would.
  asio::io_context* ioc = nullptr;
  // Blocking work (SessionManager calls, file syscalls, fsync).
  asio::thread_pool* pool = nullptr;
  session::SessionManager* sessions = nullptr;
  OpBus* bus = nullptr;
  // Cluster mode (cluster/cluster.h): new ids are placed through the catalog; null: a cluster
  // of one, and nothing here changes.
  cluster::Cluster* cluster = nullptr;
  // Cluster mode with templates: where they live (null: each node's own store only).
  TemplateCatalog* templates = nullptr;
};

}  // namespace agentbox::service
