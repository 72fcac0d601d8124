#pragma once
// A fake xbot runner for the runner tests, written from shared/PROTOCOLS.md part 1 (not from
// agentbox's own code): it dials the real daemon's /ws/{user} over a real WebSocket, sends
// `register` exactly as xbot's runner does (no `version` unless asked), and answers requests
// the way xbot's native runner does, quirks included: replies carry only id/type/body, `mode` is
// Go's os.FileMode, removing a non-empty directory is EEXIST, `ok` has no body. Files are served
// from a real directory (the runner's workspace).
//
// Tests change its behaviour per request type with `on`: a hook returns the reply envelope to
// send (without id), or a Action (drop the connection, send garbage, never answer).

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/websocket.h"
#include "common/base64.h"
#include "integration/api_test_util.h"

namespace agentbox::testing {

inline std::string b64(std::string_view in) { return base64_encode(in); }
inline std::string unb64(const std::string& s) { return base64_decode(s).value_or(""); }

class FakeRunner {
 public:
  enum class Action { kReply, kDrop, kGarbage, kSilent };
  struct Outcome {
    Action action = Action::kReply;
    json reply;  // {"type":..., "body":...} for kReply
    std::vector<json> extra;  // whole frames sent after it (e.g. a held-back earlier reply)
  };
  using Hook = std::function<Outcome(const json& request)>;

  // `workspace`: the dir it serves (reported in register). `version`: 0 = like xbot (no field).
  FakeRunner(const Daemon& d, std::string url_user, std::string token, std::string workspace,
             int version = 0, std::string body_user = "")
      : opts_(d.options()),
        url_user_(std::move(url_user)),
        token_(std::move(token)),
        workspace_(std::move(workspace)),
        version_(version),
        body_user_(body_user.empty() ? url_user_ : std::move(body_user)) {}
  ~FakeRunner() { stop(); }

  void on(const std::string& type, Hook h) {
    std::lock_guard lk(mu_);
    hooks_[type] = std::move(h);
  }
  // Fields added to the register body (agentbox's extensions, e.g. {"enforces": [...]}); call
  // before start().
  void register_extra(json fields) { register_extra_ = std::move(fields); }
  // Replies in seed 003's flat form: the body's fields beside id and type, no `body`
  // ({"id":..,"type":"exec_result","stdout":..}); call before start().
  void answer_flat(bool on) { flat_ = on; }

  // Connects and registers on its own thread; returns the daemon's answer to `register`
  // ({"type":"register_ok",...} or {"type":"error",...}), or a discarded json on no answer.
  json start(std::chrono::seconds wait = std::chrono::seconds(10)) {
    thread_ = std::thread([this] { run(); });
    auto deadline = std::chrono::steady_clock::now() + wait;
    while (!answered_.load() && !ended_.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::lock_guard lk(mu_);
    return register_answer_;
  }
  // Whether the daemon has closed the socket (or it failed).
  bool ended() const { return ended_.load(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int requests_seen() const { return seen_.load(); }
  json last_request() {
    std::lock_guard lk(mu_);
    return last_;
  }

 private:
  void run() {
    client::WebSocket ws(opts_);
    auto r = ws.connect("/ws/" + url_user_);
    if (!r || r->status != 101) {
      ended_ = true;
      return;
    }
    json body = {{"user_id", body_user_},
                 {"auth_token", token_},
                 {"workspace", workspace_},
                 {"shell", "/bin/sh"}};
    if (version_ != 0) body["version"] = version_;
    for (auto& [k, v] : register_extra_.items()) body[k] = v;
    json reg = {{"type", "register"}, {"user_id", body_user_}, {"body", body}};
    ws.send(reg.dump(), false);
    client::WebSocket::Handlers h;
    h.on_message = [&](client::WsMessage m) {
      json j = json::parse(m.data, nullptr, false);
      if (!answered_) {
        std::lock_guard lk(mu_);
        register_answer_ = j;
        answered_ = true;
        return;
      }
      if (j.is_discarded() || !j.is_object()) return;
      ++seen_;
      {
        std::lock_guard lk(mu_);
        last_ = j;
      }
      Outcome o = handle(j);
      if (o.action == Action::kDrop) {
        ws.close(1000, "bye");
        return;
      }
      if (o.action == Action::kSilent || !j.contains("id")) return;
      if (o.action == Action::kGarbage) {
        ws.send("this is not json {", false);
        return;
      }
      json reply = json::object();
      reply["id"] = j["id"];
      reply["type"] = o.reply["type"];
      if (o.reply.contains("body") && flat_) {
        for (auto& [k, v] : o.reply["body"].items()) reply[k] = v;
      } else if (o.reply.contains("body")) {
        reply["body"] = o.reply["body"];
      }
      ws.send(reply.dump(), false);
      for (const json& x : o.extra) ws.send(x.dump(), false);
    };
    h.tick_interval = std::chrono::milliseconds(20);
    h.on_tick = [&] {
      if (stop_ && !closing_) {
        closing_ = true;
        ws.close(1000, "stop");
      }
    };
    ws.run(std::move(h));
    ended_ = true;
  }

  static json err(const std::string& code, const std::string& msg) {
    return {{"type", "error"}, {"body", {{"message", msg}, {"code", code}}}};
  }
  static json os_err(int e, const std::string& op) {
    std::string code = e == ENOENT ? "ENOENT"
                       : (e == EEXIST || e == ENOTEMPTY) ? "EEXIST"
                       : (e == EACCES || e == EPERM) ? "EPERM"
                                                       : "EIO";
    return err(code, op + ": " + std::strerror(e));
  }
  // Go's os.FileMode of a st_mode.
  static std::uint32_t go_mode(mode_t m) {
    std::uint32_t g = m & 0777;
    if (S_ISDIR(m)) g |= 1u << 31;
    if (S_ISLNK(m)) g |= 1u << 27;
    if (m & S_ISUID) g |= 1u << 23;
    if (m & S_ISGID) g |= 1u << 22;
    if (m & S_ISVTX) g |= 1u << 20;
    return g;
  }

  Outcome handle(const json& req) {
    const std::string type = req.value("type", "");
    {
      std::lock_guard lk(mu_);
      if (auto it = hooks_.find(type); it != hooks_.end()) return it->second(req);
    }
    return {Action::kReply, serve(req)};
  }

  json serve(const json& req) {
    const std::string type = req.value("type", "");
    const json b = req.value("body", json::object());
    const std::string path = b.value("path", "");
    if (type == "exec") return exec(b);
    if (type == "read_file") {
      std::string data = read_host_file(path);
      struct stat st;
      if (::stat(path.c_str(), &st) != 0) return os_err(errno, "read " + path);
      return {{"type", "file_content"}, {"body", {{"data", b64(data)}}}};
    }
    if (type == "write_file") {
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                      b.value("perm", 0) & 07777);
      if (fd < 0) return os_err(errno, "write " + path);
      std::string data = unb64(b.value("data", ""));
      bool ok = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
      ::close(fd);
      if (!ok) return err("EIO", "short write");
      return {{"type", "ok"}};
    }
    if (type == "stat") {
      struct stat st;
      if (::stat(path.c_str(), &st) != 0) return os_err(errno, "stat " + path);
      char when[64];
      struct tm tm;
      localtime_r(&st.st_mtime, &tm);
      std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S%z", &tm);
      std::string w = when;  // +0100 -> +01:00 (RFC 3339)
      if (w.size() > 5) w.insert(w.size() - 2, ":");
      return {{"type", "file_info"},
              {"body",
               {{"name", std::filesystem::path(path).filename().string()},
                {"size", st.st_size},
                {"mode", go_mode(st.st_mode)},
                {"mod_time", w},
                {"is_dir", S_ISDIR(st.st_mode)}}}};
    }
    if (type == "read_dir") {
      DIR* d = ::opendir(path.c_str());
      if (d == nullptr) return os_err(errno, "read_dir " + path);
      std::map<std::string, json> entries;
      while (dirent* e = ::readdir(d)) {
        std::string n = e->d_name;
        if (n == "." || n == "..") continue;
        struct stat st;
        if (::lstat((path + "/" + n).c_str(), &st) != 0) continue;
        entries[n] = {{"name", n}, {"is_dir", S_ISDIR(st.st_mode)}, {"size", st.st_size}};
      }
      ::closedir(d);
      json arr = json::array();
      for (auto& [n, e] : entries) arr.push_back(e);
      return {{"type", "dir_entries"}, {"body", {{"entries", arr}}}};
    }
    if (type == "mkdir_all") {
      std::error_code ec;
      std::filesystem::create_directories(path, ec);
      if (ec) return os_err(ec.value(), "mkdir " + path);
      return {{"type", "ok"}};
    }
    if (type == "remove") {
      if (::remove(path.c_str()) != 0) return os_err(errno, "remove " + path);
      return {{"type", "ok"}};
    }
    if (type == "remove_all") {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
      return {{"type", "ok"}};
    }
    return err("EINVAL", "unknown request type: " + type);
  }

  json exec(const json& b) {
    std::vector<std::string> argv;
    if (b.value("shell", false)) {
      argv = {"/bin/sh", "-c", b.value("command", "")};
    } else {
      for (const auto& a : b.value("args", json::array())) argv.push_back(a.get<std::string>());
      if (argv.empty()) return err("EIO", "exec error: non-shell exec requires args to be set");
    }
    std::string dir = b.value("dir", workspace_);
    char out_t[] = "/tmp/agentbox-fakerunner-XXXXXX";
    int out = ::mkstemp(out_t);
    char err_t[] = "/tmp/agentbox-fakerunner-XXXXXX";
    int errf = ::mkstemp(err_t);
    ::unlink(out_t);
    ::unlink(err_t);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out, 1);
    posix_spawn_file_actions_adddup2(&fa, errf, 2);
    posix_spawn_file_actions_addchdir_np(&fa, dir.c_str());
    std::vector<char*> av;
    for (auto& a : argv) av.push_back(a.data());
    av.push_back(nullptr);
    std::vector<std::string> envs;
    for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
    for (const auto& e : b.value("env", json::array())) envs.push_back(e.get<std::string>());
    std::vector<char*> ev;
    for (auto& e : envs) ev.push_back(e.data());
    ev.push_back(nullptr);
    pid_t pid = -1;
    int rc = ::posix_spawnp(&pid, av[0], &fa, nullptr, av.data(), ev.data());
    posix_spawn_file_actions_destroy(&fa);
    int code = -1;
    if (rc == 0) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    auto slurp_fd = [](int fd) {
      std::string s;
      ::lseek(fd, 0, SEEK_SET);
      char buf[65536];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<std::size_t>(n));
      ::close(fd);
      return s;
    };
    std::string so = slurp_fd(out), se = slurp_fd(errf);
    if (rc != 0) return err("EIO", std::string("exec error: ") + std::strerror(rc));
    return {{"type", "exec_result"},
            {"body", {{"stdout", so}, {"stderr", se}, {"exit_code", code}, {"timed_out", false}}}};
  }

  client::ClientOptions opts_;
  std::string url_user_, token_, workspace_;
  int version_ = 0;
  std::string body_user_;
  json register_extra_ = json::object();
  bool flat_ = false;
  std::thread thread_;
  std::atomic<bool> stop_{false}, closing_{false}, answered_{false}, ended_{false};
  std::atomic<int> seen_{0};
  std::mutex mu_;
  std::map<std::string, Hook> hooks_;
  json register_answer_ = json(json::value_t::discarded);
  json last_;
};

}  // namespace agentbox::testing
