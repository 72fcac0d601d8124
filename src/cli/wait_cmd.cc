// agentbox wait [--timeout S] [URL]: seed 001's WAIT_FOR_SIDECAR for any entrypoint. Polls
// GET URL/healthz until it answers 200, so a container started next to agentboxd (a sidecar in
// the same pod, which starts in no particular order) begins only once the daemon serves.

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "cli/cli.h"

namespace agentbox::cli {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Between attempts; and the longest one attempt may wait for a reply, so a daemon that accepts
// but hangs does not eat the whole timeout in one try.
constexpr milliseconds kPollInterval{250};
constexpr milliseconds kAttemptTimeout{2000};

}  // namespace

int wait(const Globals& g, const std::string& url_arg, std::optional<std::uint32_t> timeout_sec) {
  auto target = resolve_wait_target(url_arg, timeout_sec, std::getenv("WAIT_FOR_SIDECAR"),
                                    std::getenv("WAIT_FOR_SIDECAR_TIMEOUT"), g.server);
  if (!target) return usage("wait: " + target.error().message);
  const std::string url = target->base_url + "/healthz";
  const auto deadline = Clock::now() + std::chrono::seconds(target->timeout_sec);
  std::string last;  // why the last attempt failed
  for (;;) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    client::ClientOptions o = g.options();
    o.server = target->base_url;
    o.timeout = std::clamp(left, milliseconds(100), kAttemptTimeout);
    client::Client c(o);
    auto r = c.request("GET", "/healthz");
    if (r && r->status == 200) return kExitOk;
    last = r ? "HTTP " + std::to_string(r->status) : r.error().message;
    // The last attempt is made at the deadline, so "up within N s" holds for the whole N s.
    auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(kPollInterval, deadline - now));
  }
  std::cerr << "agentbox: ETIMEDOUT: " << url << " did not answer 200 within "
            << target->timeout_sec << " s (last attempt: " << last << ")" << std::endl;
  return kExitUnreachable;
}

}  // namespace agentbox::cli
