#include "server/json_codec.h"

#include <gtest/gtest.h>

#include "sandbox/default_limits.h"

namespace agentbox::server {
namespace {

// The decode error message for `body`, or "" when it decodes.
template <typename F>
std::string error_of(F decode, std::string_view body) {
  auto j = parse_object(body);
  if (!j) return j.error().message;
  auto r = decode(*j);
  if (r) return "";
  EXPECT_EQ(r.error().code, Code::kInvalid) << body;
  return r.error().message;
}

auto exec_error(std::string_view body) {
  return error_of(decode_exec, body);
}

TEST(JsonCodec, ParseObject) {
  EXPECT_FALSE(parse_object("").has_value());
  EXPECT_TRUE(parse_object("", /*allow_empty=*/true).value().empty());
  EXPECT_FALSE(parse_object("{").has_value());
  EXPECT_FALSE(parse_object("[]").has_value());
  EXPECT_FALSE(parse_object("\"s\"").has_value());
  EXPECT_FALSE(parse_object("{} trailing").has_value());
  EXPECT_TRUE(parse_object(R"({"a":1})").has_value());
  // Deep nesting is an error value, not a crash.
  EXPECT_FALSE(parse_object(std::string(100000, '[')).has_value());
}

TEST(JsonCodec, ExecDecodesEveryField) {
  auto j = parse_object(R"({"command":"ls -la","cwd":"/workspace/x","env":{"K":"V"},
      "stdin":"in","timeout_sec":1.5,"max_output_bytes":10,"artifact_dir":"/workspace/out"})");
  ASSERT_TRUE(j);
  auto spec = decode_exec(*j);
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->command, "ls -la");
  EXPECT_TRUE(spec->argv.empty());
  EXPECT_EQ(spec->cwd, "/workspace/x");
  EXPECT_EQ(spec->env.at("K"), "V");
  EXPECT_EQ(spec->stdin_data, "in");
  EXPECT_EQ(spec->timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(spec->max_output_bytes, 10u);
  EXPECT_EQ(spec->artifact_dir, "/workspace/out");

  auto argv = decode_exec(*parse_object(R"({"argv":["ls","-la"],"cwd":null})"));
  ASSERT_TRUE(argv);
  EXPECT_EQ(argv->argv, (std::vector<std::string>{"ls", "-la"}));
  EXPECT_EQ(argv->timeout, sandbox::kDefaultExecTimeout);
  EXPECT_EQ(argv->max_output_bytes, sandbox::kDefaultMaxOutputBytes);
}

// API.md "General": an unknown field, nested ones too, is EINVAL naming it; a dialect's
// decoder (seed 001's /exec) keeps taking what its clients add.
TEST(JsonCodec, UnknownFieldsAreRefusedNamingThem) {
  auto err = [](Status st) { return st ? std::string("<ok>") : st.error().message; };
  EXPECT_EQ(err(check_known_fields(json{{"a", 1}}, {"a", "b"})), "<ok>");
  EXPECT_EQ(err(check_known_fields(json::object(), {})), "<ok>");
  auto e = check_known_fields(json{{"a", 1}, {"limts", 2}}, {"a", "limits"});
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, Code::kInvalid);
  EXPECT_EQ(e.error().message, "field 'limts' is not known (the body takes: a, limits)");
  EXPECT_EQ(err(check_known_fields(json{{"x", 1}}, {}, "pty")),
            "field 'pty.x' is not known (pty takes no fields)");

  auto create = [](const char* body) {
    auto r = decode_create_session(*parse_object(body));
    return r ? std::string("<ok>") : r.error().message;
  };
  EXPECT_NE(create(R"({"id":"a","limts":{"memory_mb":256}})").find("'limts'"), std::string::npos);
  EXPECT_NE(create(R"({"id":"a","limits":{"memry_mb":256}})").find("'limits.memry_mb'"),
            std::string::npos);
  EXPECT_NE(create(R"({"id":"a","network":{"mode":"none","alow":[]}})").find("'network.alow'"),
            std::string::npos);
  EXPECT_NE(create(R"({"id":"a","mounts":[{"host_path":"/a","mount_path":"/b","ro":true}]})")
                .find("'mounts[0].ro'"),
            std::string::npos);
  EXPECT_NE(decode_exec(*parse_object(R"({"command":"ls","unknown":1})"))
                .error()
                .message.find("'unknown'"),
            std::string::npos);
  EXPECT_FALSE(decode_process_start(*parse_object(R"({"command":"sh","pty":{"cols":1,"rows":1,
      "x":1}})")));
  EXPECT_FALSE(decode_mkdir(*parse_object(R"({"path":"a","p":true})")));
  EXPECT_FALSE(decode_rename(*parse_object(R"({"from":"a","to":"b","f":1})")));
  EXPECT_FALSE(decode_signal(*parse_object(R"({"signal":"TERM","x":1})")));
  EXPECT_FALSE(decode_add_mounts(*parse_object(R"({"skills":{},"skill":{}})")));
  EXPECT_FALSE(decode_install(*parse_object(R"({"manager":"pip","packages":["a"],"u":1})")));
  // Seed 001 (a dialect): extra top-level fields pass; its cgroup is a limits object.
  EXPECT_TRUE(
      decode_seed_exec(*parse_object(R"({"command":"ls","env":{"AGENT_ID":"a"},"client":"x"})")));
  EXPECT_FALSE(decode_seed_exec(
      *parse_object(R"({"command":"ls","env":{"AGENT_ID":"a"},"cgroup":{"memory":1}})")));
}

TEST(JsonCodec, ExecErrorsNameTheField) {
  EXPECT_EQ(exec_error(R"({"command":"ls","timeout_sec":"abc"})"),
            "field 'timeout_sec' must be a number");
  EXPECT_EQ(exec_error("{}"), "field 'command' (or 'argv') is required");
  EXPECT_EQ(exec_error(R"({"command":5})"), "field 'command' must be a string");
  EXPECT_NE(exec_error(R"({"argv":[1]})").find("'argv[0]'"), std::string::npos);
  EXPECT_NE(exec_error(R"({"argv":["a\u0000b"]})").find("'argv[0]'"), std::string::npos);
  EXPECT_NE(exec_error(R"({"command":"ls","env":{"A=B":"x"}})").find("'env'"), std::string::npos);
  EXPECT_NE(exec_error(R"({"command":"ls","env":{"A":true}})").find("'env.A'"), std::string::npos);
  EXPECT_NE(exec_error(R"({"command":"ls","timeout_sec":0})").find("'timeout_sec'"),
            std::string::npos);
  EXPECT_NE(exec_error(R"({"command":"ls","timeout_sec":1e9})").find("'timeout_sec'"),
            std::string::npos);
  EXPECT_NE(exec_error(R"({"command":"ls","max_output_bytes":-5})").find("'max_output_bytes'"),
            std::string::npos);
  EXPECT_NE(exec_error(R"({"command":"ls","max_output_bytes":1e30})").find("'max_output_bytes'"),
            std::string::npos);
  EXPECT_NE(exec_error(R"({"command":"ls","max_output_bytes":18446744073709551615})")
                .find("'max_output_bytes'"),
            std::string::npos);
}

TEST(JsonCodec, CreateSession) {
  auto r = decode_create_session(*parse_object(
      R"({"scope":"{launcher_type}_{launcher_id}","variables":{"launcher_type":"group",
          "launcher_id":42},"limits":{"memory_mb":512,"cpu_percent":100},
          "network":{"mode":"none","allow":[]},"env":{"A":"b"},"ttl_sec":60,
          "labels":{"team":"a"},"mounts":[{"host_path":"/srv/x","mount_path":"/workspace/x",
          "mode":"ro"}],"skills":{"web":"/srv/web"},"backend":"host"})"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->id, "group_42");
  EXPECT_EQ(r->spec.limits.memory_mb, 512u);
  EXPECT_EQ(r->spec.limits.cpu_percent, 100u);
  EXPECT_FALSE(r->spec.limits.max_pids.has_value());
  EXPECT_EQ(r->spec.network.mode, "none");
  EXPECT_TRUE(r->spec.network.allow.empty());
  EXPECT_EQ(r->spec.ttl_sec, 60);
  EXPECT_EQ(r->spec.labels.at("team"), "a");
  ASSERT_EQ(r->spec.mounts.size(), 1u);
  EXPECT_EQ(r->spec.mounts[0].mode, "ro");
  EXPECT_EQ(r->spec.skills.at("web"), "/srv/web");
  EXPECT_EQ(r->spec.backend, "host");

  auto err = [](std::string_view b) {
    return error_of([](const json& j) { return decode_create_session(j); }, b);
  };
  EXPECT_EQ(err("{}"), "field 'id' (or 'scope') is required");
  EXPECT_EQ(err(R"({"id":"a","scope":"b"})"), "give either 'id' or 'scope', not both");
  EXPECT_NE(err(R"({"id":"../a"})"), "");
  EXPECT_NE(err(R"({"id":"a","limits":{"memory_mb":"x"}})").find("'limits.memory_mb'"),
            std::string::npos);
  EXPECT_NE(err(R"({"id":"a","limits":[]})").find("'limits'"), std::string::npos);
  EXPECT_NE(err(R"({"id":"a","network":{"allow":"x"}})").find("'network.allow'"),
            std::string::npos);
  EXPECT_NE(err(R"({"id":"a","mounts":[{"host_path":"/a","mount_path":"/b","mode":"rwx"}]})")
                .find("'mounts[0].mode'"),
            std::string::npos);
  EXPECT_NE(err(R"({"scope":"{a}","variables":{"a":[1]}})").find("'variables.a'"),
            std::string::npos);
  EXPECT_NE(err(R"({"id":"a","ttl_sec":-1})").find("'ttl_sec'"), std::string::npos);
  // cpu_time_sec: 1 s to a week; tmp_mb: at least 1.
  for (const char* bad : {"0", "1000000000", "604801", "-1", "\"10\"", "1.5"}) {
    EXPECT_NE(err(std::string(R"({"id":"a","limits":{"cpu_time_sec":)") + bad + "}}")
                  .find("'limits.cpu_time_sec'"),
              std::string::npos)
        << bad;
  }
  EXPECT_NE(err(R"({"id":"a","limits":{"tmp_mb":0}})").find("'limits.tmp_mb'"), std::string::npos);
}

TEST(JsonCodec, CpuTimeAndTmpLimitsDecodeAndShow) {
  auto r = decode_create_session(
      *parse_object(R"({"id":"a","limits":{"cpu_time_sec":604800,"tmp_mb":64}})"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->spec.limits.cpu_time_sec, 604800u);
  EXPECT_EQ(r->spec.limits.tmp_mb, 64u);
  session::SessionInfo info;
  info.id = "a";
  info.spec.limits = r->spec.limits;
  json j = encode_session(info);
  EXPECT_EQ(j["limits"]["cpu_time_sec"], 604800);
  EXPECT_EQ(j["limits"]["tmp_mb"], 64);
}

TEST(JsonCodec, KilledByIsNullOrTheCause) {
  sandbox::ExecResult r;
  EXPECT_TRUE(encode_exec_result(r)["killed_by"].is_null());
  const std::pair<sandbox::KilledBy, const char*> causes[] = {
      {sandbox::KilledBy::kTimeout, "timeout"},
      {sandbox::KilledBy::kCpuTime, "cpu_time"},
      {sandbox::KilledBy::kMemory, "memory"},
      {sandbox::KilledBy::kPids, "pids"}};
  for (const auto& [k, name] : causes) {
    r.killed_by = k;
    EXPECT_EQ(encode_exec_result(r)["killed_by"], name);
  }
  // Seed 001's reply keeps exactly its own fields.
  EXPECT_FALSE(encode_seed_exec_result(r).contains("killed_by"));
}

auto create(std::string_view body) { return decode_create_session(*parse_object(body)); }

// API.md "General": a value that is not built is ENOTSUP naming it, never accepted and ignored.
TEST(JsonCodec, CreateRefusesWhatIsNotBuilt) {
  // Every network mode is built now.
  ASSERT_TRUE(create(R"({"id":"a","network":{"mode":"open"}})"));
  // Templates are built: the name is kept for the manager to resolve.
  auto t = create(R"({"id":"a","template":"python-data"})");
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->spec.template_name, "python-data");
  // Seed 002's primary host_path in place of the workspace itself is built: it is the workspace
  // (kept as the spec's primary, not one more mount).
  for (const char* body : {R"({"id":"a","host_path":"/srv/p"})",
                           R"({"id":"a","host_path":"/srv/p","mount_path":"/workspace/"})"}) {
    auto hp = create(body);
    ASSERT_TRUE(hp) << body << ": " << hp.error().message;
    EXPECT_TRUE(hp->spec.mounts.empty()) << body;
    EXPECT_EQ(hp->spec.primary.host_path, "/srv/p") << body;
    EXPECT_EQ(hp->spec.primary.mount_path, "/workspace") << body;
    EXPECT_EQ(hp->spec.primary.mode, "rw") << body;
  }
  EXPECT_TRUE(network_mode_built("none"));
  EXPECT_TRUE(network_mode_built("allowlist"));
  EXPECT_TRUE(network_mode_built("open"));
}

// network.mode allowlist is built: its entries are checked by net::Policy (400 naming the bad
// one), a good list is kept as given.
TEST(JsonCodec, AllowlistEntriesAreValidated) {
  auto ok = create(R"({"id":"a","network":{"mode":"allowlist","allow":["example.org",
                      "*.example.test","example.org:8443"]}})");
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->spec.network.mode, "allowlist");
  EXPECT_EQ(ok->spec.network.allow,
            (std::vector<std::string>{"example.org", "*.example.test", "example.org:8443"}));
  auto bad = create(R"({"id":"a","network":{"mode":"allowlist","allow":["ok.test","bad host!"]}})");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Code::kInvalid);
  EXPECT_NE(bad.error().message.find("'network.allow'"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("bad host!"), std::string::npos) << bad.error().message;
}

TEST(JsonCodec, CreateRejectsMalformedFailClosedFields) {
  auto err = [](std::string_view b) {
    return error_of([](const json& j) { return decode_create_session(j); }, b);
  };
  // allow without allowlist is a client bug (400), not a missing feature.
  EXPECT_NE(err(R"({"id":"a","network":{"allow":["example.org"]}})").find("'network.allow'"),
            std::string::npos);
  EXPECT_NE(err(R"({"id":"a","network":{"mode":"none","allow":["example.org"]}})")
                .find("needs network.mode"),
            std::string::npos);
  EXPECT_NE(err(R"({"id":"a","network":{"mode":"closed"}})").find("'network.mode'"),
            std::string::npos);
  EXPECT_NE(err(R"({"id":"a","template":7})").find("'template'"), std::string::npos);
  // variables are type-checked also when id makes them unused.
  EXPECT_NE(err(R"({"id":"a","variables":[1]})").find("'variables'"), std::string::npos);
  EXPECT_NE(err(R"({"id":"a","variables":{"x":{}}})").find("'variables.x'"), std::string::npos);
  EXPECT_NE(err(R"({"id":"a","extra_mounts":{}})").find("'extra_mounts'"), std::string::npos);
  EXPECT_NE(err(R"({"id":"a","extra_mounts":[{"host_path":"/a"}]})")
                .find("'extra_mounts[0].mount_path'"),
            std::string::npos);
  EXPECT_NE(err(R"({"id":"a","mount_path":"/data"})").find("'mount_path' needs 'host_path'"),
            std::string::npos);
  EXPECT_NE(err(R"({"id":"a","host_path_mode":"ro"})").find("'host_path_mode'"),
            std::string::npos);
  EXPECT_NE(err(R"({"id":"a","host_path":"/srv/p","mount_path":"/d","host_path_mode":"x"})")
                .find("'host_path_mode'"),
            std::string::npos);
  EXPECT_NE(err(R"({"id":"a","host_path":1})").find("'host_path'"), std::string::npos);
}

// Seed 002's names are aliases that work: extra_mounts = mounts, a primary host_path mounted
// elsewhere is one more mount, host_path_mode none mounts nothing.
TEST(JsonCodec, CreateSeed002Aliases) {
  auto r = create(R"({"id":"a","mounts":[{"host_path":"/srv/a","mount_path":"/workspace/a"}],
      "extra_mounts":[{"host_path":"/srv/b","mount_path":"/data/b","mode":"ro"}],
      "host_path":"/srv/p","mount_path":"/project","host_path_mode":"ro"})");
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->spec.mounts.size(), 3u);
  EXPECT_EQ(r->spec.mounts[0].host_path, "/srv/a");
  EXPECT_EQ(r->spec.mounts[0].mode, "rw");
  EXPECT_EQ(r->spec.mounts[1].host_path, "/srv/b");
  EXPECT_EQ(r->spec.mounts[1].mount_path, "/data/b");
  EXPECT_EQ(r->spec.mounts[1].mode, "ro");
  EXPECT_EQ(r->spec.mounts[2].host_path, "/srv/p");
  EXPECT_EQ(r->spec.mounts[2].mount_path, "/project");
  EXPECT_EQ(r->spec.mounts[2].mode, "ro");

  auto rw = create(R"({"id":"a","host_path":"/srv/p","mount_path":"/project"})");
  ASSERT_TRUE(rw) << rw.error().message;
  ASSERT_EQ(rw->spec.mounts.size(), 1u);
  EXPECT_EQ(rw->spec.mounts[0].mode, "rw");

  // none: declared, not mounted (also in place of /workspace, which then stays the workspace).
  for (const char* body : {R"({"id":"a","host_path":"/srv/p","host_path_mode":"none"})",
                           R"({"id":"a","host_path":"/srv/p","mount_path":"/p",
                               "host_path_mode":"none"})"}) {
    auto none = create(body);
    ASSERT_TRUE(none) << body << ": " << none.error().message;
    EXPECT_TRUE(none->spec.mounts.empty()) << body;
    EXPECT_EQ(none->spec.primary.host_path, "/srv/p") << body;  // shown, not mounted
    EXPECT_EQ(none->spec.primary.mode, "none") << body;
  }
  EXPECT_EQ(r->spec.primary.mount_path, "/project");
  // A network that is built is accepted as before.
  auto net = create(R"({"id":"a","network":{"mode":"none"}})");
  ASSERT_TRUE(net) << net.error().message;
  EXPECT_EQ(net->spec.network.mode, "none");
}

TEST(JsonCodec, ArtifactDirIsAPathInTheBox) {
  EXPECT_NE(exec_error(R"({"command":"ls","artifact_dir":"/workspace/../etc"})")
                .find("'artifact_dir'"),
            std::string::npos);
  EXPECT_NE(exec_error(R"({"command":"ls","artifact_dir":""})").find("'artifact_dir'"),
            std::string::npos);
  EXPECT_EQ(exec_error(R"({"command":"ls","artifact_dir":"out"})"), "");
  // Once the box is known: tests/service/exec_test.cc (service::check_artifact_dir).
}

TEST(JsonCodec, SessionPatch) {
  auto u = decode_session_patch(*parse_object(
      R"({"limits":{"memory_mb":256,"max_pids":64},"ttl_sec":60,"labels":{"a":"b"}})"));
  ASSERT_TRUE(u) << u.error().message;
  ASSERT_TRUE(u->limits);
  EXPECT_EQ(u->limits->memory_mb, 256u);
  EXPECT_EQ(u->limits->max_pids, 64u);
  EXPECT_FALSE(u->limits->cpu_percent);
  EXPECT_EQ(u->ttl_sec, 60);
  EXPECT_EQ(u->labels->at("a"), "b");
  // Out of range: 400 naming the field.
  auto low = decode_session_patch(*parse_object(R"({"limits":{"memory_mb":1}})"));
  ASSERT_FALSE(low);
  EXPECT_EQ(low.error().code, Code::kInvalid);
  EXPECT_NE(low.error().message.find("limits.memory_mb"), std::string::npos);
  auto other = decode_session_patch(*parse_object(R"({"network":{"mode":"open"}})"));
  ASSERT_FALSE(other);
  EXPECT_NE(other.error().message.find("'network'"), std::string::npos);
  EXPECT_FALSE(decode_session_patch(*parse_object("{}")));
}

TEST(JsonCodec, SeedRequests) {
  auto e = decode_seed_exec(
      *parse_object(R"({"command":"ls","env":{"AGENT_ID":"agent-1"},"cgroup":{"memory_mb":256}})"));
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->session_id, "agent-1");
  EXPECT_EQ(e->spec.cwd, "/workspace");
  EXPECT_EQ(e->limits.memory_mb, 256u);
  auto top =
      decode_seed_exec(*parse_object(R"({"command":"ls","agent_id":"b","env":{"AGENT_ID":"a"}})"));
  ASSERT_TRUE(top);
  EXPECT_EQ(top->session_id, "b");
  EXPECT_NE(error_of(decode_seed_exec, R"({"command":"ls"})").find("agent_id"), std::string::npos);
  EXPECT_NE(
      error_of(decode_seed_exec, R"({"command":"ls","env":{"AGENT_ID":7}})").find("'env.AGENT_ID'"),
      std::string::npos);

  auto w = decode_seed_write(*parse_object(R"({"agent_id":"a","path":"p","content":"c"})"));
  ASSERT_TRUE(w);
  EXPECT_EQ(w->content, "c");
  EXPECT_EQ(error_of(decode_seed_write, R"({"agent_id":"a","path":"p"})"),
            "field 'content' is required");
  EXPECT_EQ(error_of(decode_seed_read, R"({"agent_id":"a","path":1})"),
            "field 'path' must be a string");
  EXPECT_EQ(error_of(decode_rename, R"({"from":"a"})"), "field 'to' is required");
  EXPECT_EQ(error_of(decode_mkdir, R"({})"), "field 'path' is required");
}

TEST(JsonCodec, Encoders) {
  sandbox::ExecResult r;
  r.stdout_data = "a\xff";
  r.exit_code = 137;
  r.signal = 9;
  r.duration = std::chrono::milliseconds(12);
  r.artifacts.push_back({"/workspace/out/x.png", 10, "image/png"});
  json j = encode_exec_result(r);
  EXPECT_EQ(j["signal"], 9);
  EXPECT_EQ(j["duration_ms"], 12);
  EXPECT_EQ(j["artifacts"][0]["mime_type"], "image/png");
  EXPECT_EQ(to_wire(j).find('\xff'), std::string::npos);
  EXPECT_NE(to_wire(j).find("a\xEF\xBF\xBD"), std::string::npos);
  r.signal.reset();
  EXPECT_TRUE(encode_exec_result(r)["signal"].is_null());
  json seed = encode_seed_exec_result(r);
  EXPECT_EQ(seed.size(), 5u);

  EXPECT_EQ(rfc3339_ns(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(rfc3339_ns(1'700'000'000'999'999'999), "2023-11-14T22:13:20Z");
  EXPECT_EQ(rfc3339_ns(-1), "1969-12-31T23:59:59Z");

  sandbox::FileInfo f{"a.txt", "/workspace/a.txt", 5, 0100644, 0, false, false};
  json fj = encode_file_info(f);
  EXPECT_EQ(fj["mode"], 0100644);
  EXPECT_EQ(fj["mod_time"], "1970-01-01T00:00:00Z");
  EXPECT_EQ(encode_dir({})["entries"].size(), 0u);
}

TEST(JsonCodec, Utf8IncompleteTail) {
  EXPECT_EQ(utf8_incomplete_tail(""), 0u);
  EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("a\xC3"), 1u);          // first byte of é
  EXPECT_EQ(utf8_incomplete_tail("a\xC3\xA9"), 0u);      // complete é
  EXPECT_EQ(utf8_incomplete_tail("a\xE2\x82"), 2u);      // 2 of 3 bytes of €
  EXPECT_EQ(utf8_incomplete_tail("a\xF0\x9F\x98"), 3u);  // 3 of 4 bytes of an emoji
  EXPECT_EQ(utf8_incomplete_tail("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("a\xff"), 0u);  // invalid, not incomplete: sent as is
}

}  // namespace
}  // namespace agentbox::server
