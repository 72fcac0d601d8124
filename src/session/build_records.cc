#include "session/build_records.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/unique_fd.h"
#include "linux/state_file.h"
#include "session/store.h"

namespace agentbox::session {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::system_clock;

std::string read_all(const std::string& path) {
  std::string text;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return text;
  char buf[65536];
  for (ssize_t r; (r = ::read(fd.get(), buf, sizeof buf)) > 0;) {
    text.append(buf, static_cast<std::size_t>(r));
  }
  return text;
}

BuildState state_of(const std::string& s) {
  return s == "succeeded" ? BuildState::kSucceeded
         : s == "failed"  ? BuildState::kFailed
                          : BuildState::kRunning;
}

}  // namespace

Status save_build_record(const std::string& dir, const BuildInfo& info,
                         const std::vector<std::string>& log) {
  json j = {{"id", info.id},
            {"template", info.template_name},
            {"state", build_state_name(info.state)},
            {"step", info.step},
            {"error", info.error},
            {"snapshot", info.snapshot},
            {"version", info.version},
            {"started_ms", to_unix_ms(info.started_at)},
            {"ended_ms", to_unix_ms(info.ended_at)}};
  if (info.exit_code) j["exit_code"] = *info.exit_code;
  if (info.state != BuildState::kRunning) {
    std::string text;
    for (const std::string& l : log) text += l + "\n";
    AB_TRY(linux::write_state_file(dir + "/" + info.id + ".log", text));
  }
  return linux::write_state_file(dir + "/" + info.id + ".json",
                                 j.dump(-1, ' ', false, json::error_handler_t::replace));
}

std::vector<BuildRecord> load_build_records(const std::string& dir) {
  std::vector<BuildRecord> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".json") {
      if (e.path().extension() == ".tmp") (void)::unlink(e.path().c_str());
      continue;
    }
    json j = json::parse(read_all(e.path().string()), nullptr, false);
    BuildRecord r;
    try {
      if (!j.is_object()) throw std::runtime_error("not a JSON object");
      r.info.id = j.at("id").get<std::string>();
      r.info.template_name = j.at("template").get<std::string>();
      r.info.state = state_of(j.at("state").get<std::string>());
      r.info.step = j.value("step", "");
      r.info.error = j.value("error", "");
      r.info.snapshot = j.value("snapshot", "");
      r.info.version = j.value("version", std::uint64_t{0});
      r.info.started_at = from_unix_ms(j.at("started_ms").get<std::int64_t>());
      r.info.ended_at = from_unix_ms(j.value("ended_ms", std::int64_t{0}));
      if (j.contains("exit_code")) r.info.exit_code = j.at("exit_code").get<int>();
    } catch (const std::exception& ex) {
      spdlog::warn("templates: build record {}: {} (ignored)", name, ex.what());
      continue;
    }
    if (r.info.id + ".json" != name) continue;
    std::string text = read_all(dir + "/" + r.info.id + ".log");
    for (std::size_t p = 0, nl; p < text.size(); p = nl + 1) {
      nl = text.find('\n', p);
      if (nl == std::string::npos) nl = text.size();
      r.log.push_back(text.substr(p, nl - p));
    }
    if (r.info.state == BuildState::kRunning) {
      // The daemon stopped (or died) during this build: nothing of it became a snapshot.
      r.info.state = BuildState::kFailed;
      r.info.error = "the daemon stopped during the build (step " + r.info.step + ")";
      r.info.exit_code = -1;
      r.info.ended_at = Clock::now();
      r.log.push_back("==> failed: " + r.info.error);
      if (auto st = save_build_record(dir, r.info, r.log); !st) {
        spdlog::warn("templates: build record {}: {}", name, st.error().message);
      }
    }
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const BuildRecord& a, const BuildRecord& b) {
    return a.info.started_at < b.info.started_at;
  });
  return out;
}

void remove_build_record(const std::string& dir, const std::string& id) {
  (void)::unlink((dir + "/" + id + ".json").c_str());
  (void)::unlink((dir + "/" + id + ".log").c_str());
}

}  // namespace agentbox::session
