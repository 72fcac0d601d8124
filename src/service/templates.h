#pragma once
// The template store's operations (API.md "Templates, snapshots, health, packages"): push a
// YAML template, list, get, delete, build (with its log), snapshots and rollback. The work is
// session/template_manager.h on the worker pool; every call validates the template's name once.
// A push, a delete, a build's start and a rollback emit "template.push", "template.delete",
// "template.build" and "template.rollback" (the audit log's lines, whatever surface it was).

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "service/deps.h"
#include "service/origin.h"
#include "session/template_manager.h"

namespace agentbox::service {

class Templates {
 public:
  // `tm` null: templates are not enabled (every call is ENOTSUP).
  Templates(Deps deps, std::shared_ptr<session::TemplateManager> tm)
      : d_(deps), tm_(std::move(tm)) {}

  bool enabled() const { return tm_ != nullptr; }
  // The store itself, for what only reads it (null when not enabled).
  const std::shared_ptr<session::TemplateManager>& store() const { return tm_; }

  // The template and whether it is new (false: it replaced one of the same name).
  asio::awaitable<Result<std::pair<session::TemplateInfo, bool>>> put(Origin origin,
                                                                      std::string yaml);
  asio::awaitable<Result<std::vector<session::TemplateInfo>>> list(Origin origin);
  asio::awaitable<Result<session::TemplateInfo>> get(Origin origin, std::string name);
  asio::awaitable<Status> remove(Origin origin, std::string name);
  asio::awaitable<Result<session::TemplateInfo>> rollback(Origin origin, std::string name,
                                                          std::uint64_t version);

  // Cluster mode: the node build `build_id` ran on when it is another one (its log and state
  // are read there), else "" (no cache miss goes to etcd: a build's record is written when it
  // starts).
  std::string build_node(const std::string& build_id) const;
  // Starts a build and returns at once (its state is kRunning).
  asio::awaitable<Result<session::BuildInfo>> start_build(Origin origin, std::string name);
  asio::awaitable<Result<session::BuildInfo>> build(Origin origin, std::string name,
                                                    std::string build_id);
  // The build once it has ended. Waits in short turns on the pool, so a long build holds no
  // thread for its length.
  asio::awaitable<Result<session::BuildInfo>> wait_build(Origin origin, std::string name,
                                                         std::string build_id);
  // The log's lines past `from`, waiting up to `wait` for one (0: what is there now).
  asio::awaitable<Result<session::TemplateManager::LogChunk>> build_log(
      Origin origin, std::string name, std::string build_id, std::size_t from,
      std::chrono::milliseconds wait);

 private:
  Status check_enabled() const;
  // Enabled, and `name` is a template name.
  Status check(const std::string& name) const;

  Deps d_;
  std::shared_ptr<session::TemplateManager> tm_;
};

}  // namespace agentbox::service
