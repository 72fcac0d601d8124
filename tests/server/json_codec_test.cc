#include "server/json_codec.h"

#include <gtest/gtest.h>

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
      "stdin":"in","timeout_sec":1.5,"max_output_bytes":10,"artifact_dir":"/workspace/out",
      "unknown":{"ignored":true}})");
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
          "network":{"mode":"allowlist","allow":["pypi.org"]},"env":{"A":"b"},"ttl_sec":60,
          "labels":{"team":"a"},"mounts":[{"host_path":"/srv/x","mount_path":"/workspace/x",
          "mode":"ro"}],"skills":{"web":"/srv/web"},"template":"py","backend":"host"})"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->id, "group_42");
  EXPECT_EQ(r->spec.limits.memory_mb, 512u);
  EXPECT_EQ(r->spec.limits.cpu_percent, 100u);
  EXPECT_FALSE(r->spec.limits.max_pids.has_value());
  EXPECT_EQ(r->spec.network.mode, "allowlist");
  EXPECT_EQ(r->spec.network.allow, std::vector<std::string>{"pypi.org"});
  EXPECT_EQ(r->spec.ttl_sec, 60);
  EXPECT_EQ(r->spec.labels.at("team"), "a");
  ASSERT_EQ(r->spec.mounts.size(), 1u);
  EXPECT_EQ(r->spec.mounts[0].mode, "ro");
  EXPECT_EQ(r->spec.skills.at("web"), "/srv/web");
  EXPECT_EQ(r->spec.template_name, "py");
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
