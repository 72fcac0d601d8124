#include "service/processes.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <csignal>
#include <cstdio>
#include <random>

#include "common/log.h"
#include "service/blocking.h"

namespace agentbox::service {
namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

// A key for a managed process without a tag: 16 hex digits, never all digits (so never a pid).
std::string new_process_key() {
  std::random_device rd;
  std::uint64_t v = (std::uint64_t{rd()} << 32) | rd();
  char buf[20];
  std::snprintf(buf, sizeof buf, "m%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

asio::awaitable<Result<sandbox::ProcessInfo>> get_settled(sandbox::ProcessTable* table,
                                                          std::string ref) {
  auto info = table->get(ref);
  if (info || info.error().code != Code::kNotFound) co_return info;
  asio::steady_timer t(co_await asio::this_coro::executor);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!info && table->starting(ref) && std::chrono::steady_clock::now() < deadline) {
    t.expires_after(std::chrono::milliseconds(10));
    co_await t.async_wait(kTuple);
    info = table->get(ref);
  }
  co_return info;
}

asio::awaitable<Result<sandbox::ProcessInfo>> kill_and_wait(sandbox::ProcessTable* table,
                                                            std::string ref) {
  auto before = co_await get_settled(table, ref);
  if (!before) co_return std::unexpected(before.error());
  if (auto st = table->kill(ref); !st) co_return std::unexpected(st.error());
  const std::string pid = std::to_string(before->pid);
  asio::steady_timer t(co_await asio::this_coro::executor);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  auto info = table->get(pid);
  while (info && info->state == sandbox::ProcessState::kRunning &&
         std::chrono::steady_clock::now() < deadline) {
    t.expires_after(std::chrono::milliseconds(5));
    co_await t.async_wait(kTuple);
    info = table->get(pid);
  }
  co_return info;
}

asio::awaitable<Result<ProcTarget>> Processes::target(Origin origin, std::string id, bool create) {
  Sessions sessions(d_);
  auto lease = co_await sessions.lease(origin, std::move(id), create);
  if (!lease) co_return std::unexpected(lease.error());
  ProcTarget t;
  t.table = lease->box->processes();
  t.lease = std::move(*lease);
  if (t.table == nullptr) {
    co_return std::unexpected(Error::make(
        Code::kNotSupported, "processes: not supported by the backend of session " + t.lease.id));
  }
  co_return t;
}

void Processes::emit_start(const Origin& origin, const std::string& session,
                           const sandbox::ProcessInfo& p) const {
  Fields f;
  if (!p.argv.empty()) {
    f.emplace_back("argv", p.argv);
  } else {
    f.emplace_back("command", p.command);
  }
  f.emplace_back("pid", std::int64_t{p.pid});
  if (!p.tag.empty()) f.emplace_back("tag", p.tag);
  f.emplace_back("pty", p.pty.has_value());
  d_.bus->emit("process.start", origin, session, f);
}

sandbox::ProcessTable::ExitCallback Processes::managed_hook(std::string session, std::string key) {
  return [sm = d_.sessions, pool = d_.pool, session = std::move(session), key = std::move(key)](
             const sandbox::ProcessInfo&, const sandbox::ProcessEnd& end) {
    if (end.restarting || end.shutdown) return;
    asio::post(*pool, [sm, session, key] { (void)sm->forget_managed(session, key); });
  };
}

asio::awaitable<Result<sandbox::ProcessInfo>> Processes::start(Origin origin, ProcTarget target,
                                                               sandbox::ProcessSpec spec) {
  sandbox::ProcessTable* table = target.table;
  const std::string session = target.lease.id;
  if (spec.restart == sandbox::ProcessSpec::Restart::kNever) {
    auto info = co_await table->start(std::move(spec));
    if (info) emit_start(origin, session, *info);
    co_return info;
  }
  // Managed: the spec is in the session's state before the process runs, and leaves it again
  // if the start fails.
  spec.key = spec.tag.empty() ? new_process_key() : spec.tag;
  // A tag in use (by a live or a supervised process) must not replace that one's stored spec.
  if (auto st = table->check_tag(spec.tag); !st) co_return std::unexpected(st.error());
  session::SessionManager* sm = d_.sessions;
  const sandbox::ProcessSpec saved = spec;
  auto save_job =
      on_pool(d_.pool, [sm, session, saved] { return sm->save_managed(session, saved); });
  if (auto st = co_await std::move(save_job); !st) co_return std::unexpected(st.error());
  auto info =
      co_await table->start(std::move(spec), managed_hook(session, saved.key), target.lease.box);
  if (!info) {
    if (info.error().code != Code::kExists) {
      auto forget_job = on_pool(
          d_.pool, [sm, session, key = saved.key] { return sm->forget_managed(session, key); });
      (void)co_await std::move(forget_job);
    }
    co_return info;
  }
  emit_start(origin, session, *info);
  co_return info;
}

asio::awaitable<Result<sandbox::ProcessInfo>> Processes::get(ProcTarget target, std::string ref) {
  co_return co_await get_settled(target.table, std::move(ref));
}

asio::awaitable<Result<sandbox::ProcessInfo>> Processes::kill(Origin origin, ProcTarget target,
                                                              std::string ref) {
  auto info = co_await kill_and_wait(target.table, std::move(ref));
  if (!info) co_return info;
  Fields f = {{"pid", std::int64_t{info->pid}}};
  d_.bus->emit("process.kill", origin, target.lease.id, f);
  co_return info;
}

asio::awaitable<Status> Processes::signal(Origin origin, ProcTarget target, std::string ref,
                                          int signo) {
  auto info = target.table->get(ref);
  if (!info) co_return std::unexpected(info.error());
  const std::string pid = std::to_string(info->pid);
  Status st = signo == SIGKILL ? target.table->kill(pid) : target.table->signal(pid, signo);
  if (!st) co_return st;
  Fields f = {{"pid", std::int64_t{info->pid}}, {"signal", std::int64_t{signo}}};
  d_.bus->emit("process.signal", origin, target.lease.id, f);
  co_return st;
}

asio::awaitable<void> Processes::start_managed(std::string session) {
  session::SessionManager* sm = d_.sessions;
  using Found = std::pair<std::vector<sandbox::ProcessSpec>, std::shared_ptr<sandbox::Sandbox>>;
  auto job = on_pool(d_.pool, [sm, session]() -> Result<Found> {
    auto specs = sm->managed_specs(session);
    std::shared_ptr<sandbox::Sandbox> box;
    if (!specs.empty()) box = sm->acquire_running(session, session::Caller::daemon());
    return Found{std::move(specs), std::move(box)};
  });
  auto found = co_await std::move(job);
  if (!found) co_return;
  std::vector<sandbox::ProcessSpec> specs = std::move(found->first);
  std::shared_ptr<sandbox::Sandbox> box = std::move(found->second);
  if (specs.empty() || !box || box->processes() == nullptr) co_return;
  for (sandbox::ProcessSpec& spec : specs) {
    const std::string key = spec.key;
    auto info = co_await box->processes()->start(std::move(spec), managed_hook(session, key), box);
    if (!info) {
      // EEXIST: already running in this box (a second resume event).
      if (info.error().code != Code::kExists) {
        spdlog::error("session {}: starting managed process {}: {}", session, key,
                      info.error().message);
      }
      continue;
    }
    spdlog::info("session {}: managed process {} runs again (pid {})", session, key, info->pid);
  }
}

void Processes::on_session_event(const session::SessionEvent& ev) {
  if (ev.kind != session::EventKind::kResumed) return;
  asio::co_spawn(*d_.ioc, start_managed(ev.session.id), [](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const std::exception& e) {
      spdlog::error("starting managed processes: {}", e.what());
    }
  });
}

void Processes::resume_managed_sessions() {
  session::SessionManager* sm = d_.sessions;
  asio::post(*d_.pool, [sm] {
    if (std::size_t n = sm->resume_managed()) {
      spdlog::info("resumed {} session(s) with managed processes", n);
    }
  });
}

}  // namespace agentbox::service
