// agentbox start | ps | logs | kill: the background processes of a session (API.md "Processes
// and terminals"). `attach` and `shell` are terminal_cmd.cc.

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/cli.h"

namespace agentbox::cli {
namespace {

using json = nlohmann::json;

bool ok(const client::Response& r) {
  return r.status >= 200 && r.status < 300;
}

std::optional<json> parse_reply(const client::Response& r) {
  json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    report(Error::make(Code::kInternal, "server reply is not a JSON object (HTTP " +
                                            std::to_string(r.status) + ")"));
    return std::nullopt;
  }
  return j;
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "-";
  if (it->is_string()) return it->get<std::string>();
  return it->dump();
}

std::string command_of(const json& p) {
  if (auto a = p.find("argv"); a != p.end() && a->is_array()) {
    std::vector<std::string> argv;
    for (const auto& w : *a) argv.push_back(w.is_string() ? w.get<std::string>() : w.dump());
    return shell_join(argv);
  }
  return text(p, "command");
}

// EXIT: the exit code once ended, "signal N" when a signal ended it, "-" while running.
std::string exit_of(const json& p) {
  if (auto s = p.find("signal"); s != p.end() && s->is_number_integer()) {
    return "signal " + s->dump();
  }
  return text(p, "exit_code");
}

// Our terminal's size, else 80x24.
std::pair<int, int> terminal_size() {
  winsize ws{};
  for (int fd : {STDIN_FILENO, STDOUT_FILENO}) {
    if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
      return {ws.ws_col, ws.ws_row};
    }
  }
  return {80, 24};
}

}  // namespace

int start(const Globals& g, const StartArgs& a) {
  if (a.argv.empty() == a.command.empty()) {
    return usage("start: give the command after -- (or as -c 'shell command')");
  }
  auto env = parse_pairs(a.env, "--env");
  if (!env) return usage(env.error().message);
  json body = json::object();
  if (!a.argv.empty()) {
    body["argv"] = a.argv;
  } else {
    body["command"] = a.command;
  }
  if (!a.tag.empty()) body["tag"] = a.tag;
  if (!a.cwd.empty()) body["cwd"] = a.cwd;
  if (!env->empty()) body["env"] = *env;
  // Sent as given: `on-failure` and `always` are the server's to accept or refuse (501 where
  // managed processes are not built), and its error is passed through.
  if (!a.restart.empty()) body["restart"] = a.restart;
  if (a.send_stdin) body["stdin"] = true;
  if (a.pty) {
    auto [cols, rows] = terminal_size();
    body["pty"] = {{"cols", cols}, {"rows", rows}};
  }
  client::Client c(g.options());
  auto r = c.request("POST", session_target(a.session) + "/processes",
                     body.dump(-1, ' ', false, json::error_handler_t::replace));
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto p = parse_reply(*r);
  if (!p) return kExitServerError;
  if (a.quiet) {
    std::cout << text(*p, "pid") << std::endl;
  } else {
    std::cout << p->dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
  }
  return kExitOk;
}

int ps(const Globals& g, const std::string& session, bool as_json) {
  client::Client c(g.options());
  auto r = c.request("GET", session_target(session) + "/processes");
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  auto j = parse_reply(*r);
  if (!j) return kExitServerError;
  if (as_json) {
    std::cout << j->dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    return kExitOk;
  }
  auto list = j->find("processes");
  if (list == j->end() || !list->is_array()) {
    return report(Error::make(Code::kInternal, "server reply has no \"processes\" list"));
  }
  std::vector<std::vector<std::string>> rows = {{"PID", "TAG", "STATUS", "EXIT", "COMMAND"}};
  for (const auto& p : *list) {
    if (!p.is_object()) continue;
    rows.push_back({text(p, "pid"), text(p, "tag"), text(p, "state"), exit_of(p), command_of(p)});
  }
  print_table(rows);
  return kExitOk;
}

int logs(const Globals& g, const std::string& session, const std::string& ref, bool follow) {
  std::signal(SIGPIPE, SIG_IGN);  // a closed stdout is EPIPE, handled below
  bool output_closed = false;
  OutputRecords records([&output_closed](std::string_view type, std::string_view data) {
    int fd = type == "stderr" ? STDERR_FILENO : STDOUT_FILENO;
    if (!write_all(fd, data)) {
      output_closed = true;
      return false;
    }
    return true;
  });
  client::ClientOptions opts = g.options();
  // A follow waits as long as the process is quiet; a silent server past this is taken for a
  // dropped connection, and the follow resumes on a new one.
  if (follow) opts.timeout = std::chrono::minutes(2);
  client::Client c(opts);
  // Reconnects after a drop: quickly at first, then every 2 s, for at most kRetryFor without
  // one answered request.
  constexpr auto kRetryFor = std::chrono::seconds(30);
  auto delay = std::chrono::milliseconds(100);
  bool answered_once = false;
  auto failing_since = std::chrono::steady_clock::now();
  for (;;) {
    std::string target = process_target(session, ref) + "/output";
    std::string query;
    if (follow) query += "follow=true";
    if (records.next())
      query += (query.empty() ? "" : "&") + std::string("since=") + std::to_string(*records.next());
    if (!query.empty()) target += "?" + query;
    bool answered = false;
    auto r = c.request_stream(
        "GET", target, {}, [&records](std::string_view chunk) { return records.feed(chunk); },
        [&answered](const client::Response& head) {
          answered = head.status >= 200 && head.status < 300;
        });
    records.connection_ended();
    if (output_closed) return 128 + SIGPIPE;
    if (r && !ok(*r)) return report(*r);  // 404 (the process or session is gone), 401, ...
    if (!records.bad_line().empty()) {
      return report(Error::make(Code::kInternal,
                                "unexpected line in the output stream: " + records.bad_line()));
    }
    if (!follow) {
      if (!r) return report(r.error());
      return kExitOk;
    }
    if (records.exit()) return kExitOk;
    // The stream ended before the exit record: the connection dropped (an error), or the
    // server ended it (restarting, or the process left its table). Ask again from where we are.
    if (answered) {
      answered_once = true;
      delay = std::chrono::milliseconds(100);
      failing_since = std::chrono::steady_clock::now();
    } else if (!answered_once && !r) {
      return report(r.error());  // never reached the server: a wrong URL, nothing listening
    } else if (std::chrono::steady_clock::now() - failing_since > kRetryFor) {
      return report(r ? Error::make(Code::kUnavailable,
                                    "output stream of " + ref + " keeps ending without its exit")
                      : r.error());
    }
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(2000));
  }
}

int kill(const Globals& g, const std::string& session, const std::string& ref,
         const std::string& signal) {
  client::Client c(g.options());
  Result<client::Response> r = fail(Code::kInternal, "unset");
  if (signal.empty()) {
    r = c.request("DELETE", process_target(session, ref));
  } else {
    json body = json::object();
    // A number goes as a number ("9"), a name as it is ("TERM", "SIGTERM"); the server names
    // the signals it takes when it refuses one.
    if (!signal.empty() && signal.size() <= 3 &&
        signal.find_first_not_of("0123456789") == std::string::npos) {
      body["signal"] = std::stoi(signal);
    } else {
      body["signal"] = signal;
    }
    r = c.request("POST", process_target(session, ref) + "/signal",
                  body.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  if (!r) return report(r.error());
  if (!ok(*r)) return report(*r);
  return kExitOk;
}

}  // namespace agentbox::cli
