// agentbox-runner: serves a workspace on this machine to agentboxd (or xbot's server) over
// xbot's runner protocol. Thin: parse the command line, run (runner/runner.h).
#include <malloc.h>

#include <CLI/CLI.hpp>

#include "common/log.h"
#include "runner/runner.h"

int main(int argc, char** argv) {
  // File chunks (1 MiB, base64'd) come and go in the I/O and request threads: a fixed mmap
  // threshold gives each back to the system when freed, so the peak stays near the 8 MiB window
  // (glibc's sliding threshold would keep them in every thread's arena).
  mallopt(M_MMAP_THRESHOLD, 512 << 10);
  agentbox::runner::RunnerOptions o;
  std::string log_level = "info";
  long long backoff_ms = 1000;
  CLI::App app{"agentbox-runner: runs commands and file operations for agentboxd in a workspace",
               "agentbox-runner"};
  app.add_option("--server", o.server, "ws[s]://host:port/ws/<user>")->required();
  app.add_option("--token", o.token,
                 "the runner token agentboxd knows for this user ('-': $AGENTBOX_RUNNER_TOKEN)")
      ->required();
  app.add_option("--workspace", o.workspace, "the directory served (must exist)")->required();
  app.add_option("--user-id", o.user_id, "default: the last segment of --server's path");
  app.add_option("--ca", o.ca_file, "an extra CA certificate (PEM) for wss://");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  app.add_option("--backoff-base-ms", backoff_ms, "first reconnect delay (default 1000)")
      ->group("");  // for tests
  app.add_option("--protocol-version", o.protocol_version,
                 "the highest protocol version to speak (default 3)")
      ->group("");  // for tests: 1 or 2 act as an older agentbox-runner, 0 as xbot's
    CLI11_PARSE(app, argc, argv);
  agentbox::init_logging(log_level);
  if (o.token == "-") {
    const char* t = std::getenv("AGENTBOX_RUNNER_TOKEN");
    if (!t || !*t) {
      spdlog::error("--token -: AGENTBOX_RUNNER_TOKEN is not set");
      return 2;
    }
    o.token = t;
  }
  o.backoff_base = std::chrono::milliseconds(backoff_ms);
  return agentbox::runner::run(o);
}
