#pragma once
// One daemon's operations layer for a test: a real SessionManager (in memory, on a temp data
// dir) over fake boxes ("ns", support/fake_backend.h) and the host backend ("host"), its
// Services, and every operation event they emit. run() drives an operation to its end.

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sandbox/host_backend.h"
#include "service/services.h"
#include "support/fake_backend.h"
#include "support/support.h"

namespace agentbox::service {

// An event as a test keeps it (OpEvent's views end with the call).
struct SeenEvent {
  std::string op;
  std::string tenant;
  Surface surface;
  std::string session;
  Fields fields;
  bool has_exec = false;

  const FieldValue* field(const std::string& name) const {
    for (const auto& [k, v] : fields) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_ = std::make_shared<testing::FakeBackend>("ns");
    session::ManagerConfig c;
    c.data_dir = dir_.path();
    c.default_backend = "ns";
    c.backends = {{"ns", fake_}, {"host", std::make_shared<sandbox::HostBackend>()}};
    c.persist = false;
    c.reaper_interval = std::chrono::hours(1);
    auto m = session::SessionManager::open(std::move(c));
    ASSERT_TRUE(m) << m.error().message;
    manager_ = std::move(*m);
    services_ = std::make_unique<Services>(ioc_, pool_, *manager_, ServiceOptions{});
    sub_ = services_->bus().subscribe([this](const OpEvent& ev) {
      events_.push_back({std::string(ev.op), ev.origin.caller.tenant, ev.origin.surface,
                         std::string(ev.session), ev.fields, ev.exec != nullptr});
    });
  }
  void TearDown() override {
    services_.reset();
    if (manager_) manager_->shutdown_all();
    manager_.reset();
    pool_.join();
  }

  // Runs `op` on the test's io_context until it is done; its result. The loop stays stopped in
  // between (what a box's processes do meanwhile waits for the next run()).
  template <typename T>
  T run(asio::awaitable<T> op) {
    std::optional<T> out;
    // Stops the loop when `op` is done: a process's readers are work that never ends by itself.
    asio::co_spawn(ioc_, std::move(op), [this, &out](std::exception_ptr e, T r) {
      if (e) std::rethrow_exception(e);
      out.emplace(std::move(r));
      ioc_.stop();
    });
    ioc_.restart();
    ioc_.run();
    EXPECT_TRUE(out.has_value());
    return std::move(*out);
  }

  // The fake box of session `id` (made by the "ns" fake backend).
  testing::FakeSandbox* fake_box(const std::string& id) {
    auto box = manager_->acquire_running(id, session::Caller::daemon());
    return dynamic_cast<testing::FakeSandbox*>(box.get());
  }

  static Origin as(const std::string& tenant) {
    return Origin(session::Caller(tenant, false, 0), 7, Surface::kV1);
  }

  testing::TempDir dir_{"agentbox-service-test"};
  asio::io_context ioc_;
  asio::thread_pool pool_{2};
  std::shared_ptr<testing::FakeBackend> fake_;
  std::unique_ptr<session::SessionManager> manager_;
  std::unique_ptr<Services> services_;
  std::shared_ptr<void> sub_;
  std::vector<SeenEvent> events_;  // on the io thread or the pool: read after run()
};

}  // namespace agentbox::service
