#include "service/exec.h"

#include <boost/asio/experimental/awaitable_operators.hpp>

#include "common/log.h"
#include "common/paths.h"

namespace agentbox::service {
namespace {

using namespace boost::asio::experimental::awaitable_operators;

constexpr std::string_view kWorkspacePath = "/workspace";

// Collects output for a run() without a sink; stops taking it once the caller is gone.
class CollectingSink final : public sandbox::OutputSink {
 public:
  CollectingSink(sandbox::OutputSink* forward, const bool* gone) : forward_(forward), gone_(gone) {}
  asio::awaitable<bool> on_output(sandbox::StreamKind kind, std::string data) override {
    if (*gone_) co_return false;
    if (forward_ != nullptr) co_return co_await forward_->on_output(kind, std::move(data));
    (kind == sandbox::StreamKind::kStdout ? stdout_ : stderr_) += data;
    co_return true;
  }
  std::string stdout_;
  std::string stderr_;

 private:
  sandbox::OutputSink* forward_;
  const bool* gone_;
};

asio::awaitable<Result<sandbox::ExecResult>> run_in(std::shared_ptr<sandbox::Sandbox> box,
                                                    sandbox::ExecSpec spec,
                                                    sandbox::OutputSink* sink) {
  co_return co_await box->exec(std::move(spec), sink);
}

}  // namespace

Status check_artifact_dir(const std::string& dir, std::string_view workspace) {
  if (dir.empty() || dir[0] != '/') return {};  // relative: under the workspace
  // /workspace names the workspace on every backend (the host backend maps it to its dir).
  if (paths::at_or_under(dir, kWorkspacePath) ||
      (!workspace.empty() && paths::at_or_under(dir, workspace))) {
    return {};
  }
  return fail(Code::kInvalid,
              "field 'artifact_dir' must be a path in the box under the workspace (" +
                  std::string(workspace) + "), not \"" + dir +
                  "\" (a host path, or a place whose files the API cannot return)");
}

asio::awaitable<std::optional<Result<sandbox::ExecResult>>> Exec::run(Origin origin, std::string id,
                                                                      sandbox::ExecSpec spec,
                                                                      sandbox::OutputSink* sink,
                                                                      StopSignal stop) {
  Sessions sessions(d_);
  auto lease = co_await sessions.lease(origin, std::move(id), /*create_if_missing=*/true);
  if (!lease) co_return Result<sandbox::ExecResult>(std::unexpected(lease.error()));
  co_return co_await run(std::move(origin), std::move(*lease), std::move(spec), sink,
                         std::move(stop));
}

asio::awaitable<std::optional<Result<sandbox::ExecResult>>> Exec::run(Origin origin, Lease lease,
                                                                      sandbox::ExecSpec spec,
                                                                      sandbox::OutputSink* sink,
                                                                      StopSignal stop) {
  if (auto st = check_artifact_dir(spec.artifact_dir, lease.box->workspace()); !st) {
    co_return Result<sandbox::ExecResult>(std::unexpected(st.error()));
  }
  // What ran, for the event: the argv or the command (never stdin, env or output).
  std::vector<std::string> argv = spec.argv;
  std::string command = spec.argv.empty() ? spec.command : std::string();
  bool* gone = stop.gone;
  CollectingSink collect(sink, gone);
  auto op = run_in(lease.box, std::move(spec), &collect) || std::move(stop.wait);
  auto outcome = co_await std::move(op);
  if (outcome.index() == 1 || *gone) {
    spdlog::info("req={} caller gone; command in session {} killed", origin.request_id, lease.id);
    if (outcome.index() == 0) emit(origin, lease.id, argv, command, std::get<0>(outcome), true);
    co_return std::nullopt;
  }
  auto r = std::get<0>(std::move(outcome));
  emit(origin, lease.id, argv, command, r, false);
  if (!r) {
    spdlog::warn("req={} exec in session {}: {}", origin.request_id, lease.id, r.error().message);
    co_return r;
  }
  if (sink == nullptr) {
    r->stdout_data = std::move(collect.stdout_);
    r->stderr_data = std::move(collect.stderr_);
  }
  co_return r;
}

void Exec::emit(const Origin& origin, const std::string& session,
                const std::vector<std::string>& argv, const std::string& command,
                const Result<sandbox::ExecResult>& r, bool caller_gone) const {
  Fields f;
  if (!argv.empty()) {
    f.emplace_back("argv", argv);
  } else {
    f.emplace_back("command", command);
  }
  if (r) {
    f.emplace_back("exit_code", std::int64_t{r->exit_code});
    f.emplace_back("duration_ms", std::int64_t{r->duration.count()});
    f.emplace_back("timed_out", r->timed_out);
  } else {
    f.emplace_back("exit_code", nullptr);
    f.emplace_back("duration_ms", std::int64_t{0});
    f.emplace_back("error", std::string(code_name(r.error().code)));
  }
  if (caller_gone) f.emplace_back("client_gone", true);
  d_.bus->publish(OpEvent{"exec", origin, session, f, &r});
}

}  // namespace agentbox::service
