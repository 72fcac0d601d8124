// The audit log: after API work, data_dir/audit.log holds one well-formed JSON line per session
// change, exec and file mutation, each with time, tenant and session, and never a token or a
// file's content.

#include <filesystem>
#include <fstream>
#include <sstream>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

constexpr char kToken[] = "audit-token-SECRET-0123456789";

std::vector<json> audit_lines(const std::string& path, std::string* raw = nullptr) {
  std::string text = read_host_file(path);
  if (raw) *raw = text;
  std::vector<json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << line;
    out.push_back(j);
  }
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "last line is cut";
  return out;
}

// The lines of `event`, in order.
std::vector<json> of(const std::vector<json>& lines, const std::string& event) {
  std::vector<json> out;
  for (const auto& l : lines) {
    if (l.value("event", "") == event) out.push_back(l);
  }
  return out;
}

TEST(AuditApi, SessionExecAndFileChangesAreLoggedOneJsonLineEach) {
  Daemon daemon({"--token", kToken});
  Api api(daemon, kToken);
  const std::string log_path = daemon.data_dir() + "/audit.log";

  api.create("aud");
  ASSERT_EQ(api.sh("aud", "echo hi; exit 3").status, 200);
  ASSERT_EQ(api.exec("aud", {{"argv", {"/bin/echo", "argv-form"}}}).status, 200);
  ASSERT_EQ(api.put(files_target("aud", "notes.txt"), "TOP-SECRET-CONTENT").status, 200);
  ASSERT_EQ(api.post("/v1/sessions/aud/mkdir", {{"path", "d/e"}}).status, 200);
  ASSERT_EQ(api.post("/v1/sessions/aud/rename", {{"from", "notes.txt"}, {"to", "d/n.txt"}}).status,
            200);
  ASSERT_EQ(api.del(files_target("aud", "d/n.txt")).status, 200);
  ASSERT_EQ(api.post("/workspace/write",
                     {{"agent_id", "aud"}, {"path", "seed.txt"}, {"content", "SEED-CONTENT"}})
                .status,
            200);
  ASSERT_EQ(api.sh("implicit", "true").status, 200);  // exec creates: a session.create too
  ASSERT_EQ(api.del("/v1/sessions/aud").status, 200);
  // Failed requests change nothing and are not audited.
  ASSERT_EQ(api.del(files_target("implicit", "missing")).status, 404);

  std::string raw;
  auto lines = audit_lines(log_path, &raw);
  ASSERT_FALSE(lines.empty());
  for (const auto& l : lines) {
    SCOPED_TRACE(l.dump());
    ASSERT_TRUE(l.is_object());
    EXPECT_TRUE(is_rfc3339_utc(l.value("time", ""))) << l;
    EXPECT_EQ(l.value("tenant", ""), "default");
    EXPECT_FALSE(l.value("session", "").empty());
    EXPECT_FALSE(l.value("event", "").empty());
  }
  // Never a token, never file contents.
  EXPECT_EQ(raw.find(kToken), std::string::npos);
  EXPECT_EQ(raw.find("TOP-SECRET-CONTENT"), std::string::npos);
  EXPECT_EQ(raw.find("SEED-CONTENT"), std::string::npos);

  auto creates = of(lines, "session.create");
  ASSERT_EQ(creates.size(), 2u) << raw;
  EXPECT_EQ(creates[0]["session"], "aud");
  EXPECT_EQ(creates[1]["session"], "implicit");

  auto execs = of(lines, "exec");
  ASSERT_EQ(execs.size(), 3u) << raw;
  EXPECT_EQ(execs[0]["command"], "echo hi; exit 3");
  EXPECT_EQ(execs[0]["exit_code"], 3);
  EXPECT_TRUE(execs[0]["duration_ms"].is_number_integer());
  EXPECT_FALSE(execs[0].contains("stdout"));
  EXPECT_EQ(execs[1]["argv"], (json{"/bin/echo", "argv-form"}));
  EXPECT_EQ(execs[1]["exit_code"], 0);
  EXPECT_EQ(execs[2]["session"], "implicit");

  auto puts = of(lines, "file.put");
  ASSERT_EQ(puts.size(), 2u) << raw;
  EXPECT_EQ(puts[0]["path"], "notes.txt");
  EXPECT_EQ(puts[0]["size"], 18);
  EXPECT_EQ(puts[1]["path"], "seed.txt");
  EXPECT_EQ(puts[1]["size"], 12);
  auto mkdirs = of(lines, "file.mkdir");
  ASSERT_EQ(mkdirs.size(), 1u);
  EXPECT_EQ(mkdirs[0]["path"], "d/e");
  auto renames = of(lines, "file.rename");
  ASSERT_EQ(renames.size(), 1u);
  EXPECT_EQ(renames[0]["from"], "notes.txt");
  EXPECT_EQ(renames[0]["to"], "d/n.txt");
  auto deletes = of(lines, "file.delete");
  ASSERT_EQ(deletes.size(), 1u) << raw;
  EXPECT_EQ(deletes[0]["path"], "d/n.txt");
  auto destroys = of(lines, "session.destroy");
  ASSERT_EQ(destroys.size(), 1u);
  EXPECT_EQ(destroys[0]["session"], "aud");

  // The order is the order things happened in.
  std::vector<std::string> events;
  for (const auto& l : lines) {
    if (l["session"] == "aud") events.push_back(l["event"]);
  }
  EXPECT_EQ(events, (std::vector<std::string>{"session.create", "exec", "exec", "file.put",
                                              "file.mkdir", "file.rename", "file.delete",
                                              "file.put", "session.destroy"}));
}

TEST(AuditApi, ArchiveAndRestoreAreLoggedWithTheTenant) {
  char tmpl[] = "/tmp/agentbox-audit-XXXXXX.yaml";
  int fd = ::mkstemps(tmpl, 5);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(tmpl) << "tenants:\n  - {name: team-x, tokens: [tx-0123456789]}\n";
  Daemon daemon({"--config", tmpl});
  std::filesystem::remove(tmpl);
  Api api(daemon, "tx-0123456789");
  api.create("arch");
  auto del = api.del("/v1/sessions/arch?archive=true");
  ASSERT_EQ(del.status, 200) << del;
  std::string archive = del.body["archive"];
  ASSERT_EQ(api.post("/v1/sessions/arch/restore", {{"archive", archive}}).status, 201);

  auto lines = audit_lines(daemon.data_dir() + "/audit.log");
  std::vector<std::string> events;
  for (const auto& l : lines) {
    EXPECT_EQ(l["tenant"], "team-x") << l;
    EXPECT_EQ(l["session"], "arch") << l;
    events.push_back(l["event"]);
  }
  EXPECT_EQ(events, (std::vector<std::string>{"session.create", "session.archive",
                                              "session.destroy", "session.restore"}));
  EXPECT_EQ(of(lines, "session.archive")[0]["archive"], archive);
  EXPECT_EQ(of(lines, "session.restore")[0]["archive"], archive);
}

// Templates change what every later session starts from: who pushed, built, rolled back or
// deleted one is in the log, as a session's changes are (service::Templates emits them).
TEST(AuditApi, TemplateChangesAreLoggedWithTheirTenant) {
  Daemon daemon({"--backend", "ns", "--token", kToken});
  Api api(daemon, kToken);
  const std::string yaml = "name: aud-t\nfiles:\n  a.txt: one\n";
  ASSERT_EQ(api.call("POST", "/v1/templates", "name: [broken\n", "application/yaml").status, 400);
  ASSERT_EQ(api.call("POST", "/v1/templates", yaml, "application/yaml").status, 201);
  ASSERT_EQ(api.call("POST", "/v1/templates", yaml, "application/yaml").status, 200);
  auto b1 = api.call("POST", "/v1/templates/aud-t/build?wait=true", "{}");
  ASSERT_EQ(b1.status, 201) << b1;
  auto b2 = api.call("POST", "/v1/templates/aud-t/build?wait=true", "{}");
  ASSERT_EQ(b2.status, 201) << b2;
  ASSERT_EQ(api.post("/v1/templates/aud-t/rollback", {{"version", 1}}).status, 200);
  ASSERT_EQ(api.del("/v1/templates/nope").status, 404);  // failed: not logged
  ASSERT_EQ(api.del("/v1/templates/aud-t").status, 200);

  std::string raw;
  auto lines = audit_lines(daemon.data_dir() + "/audit.log", &raw);
  std::vector<std::string> events;
  for (const auto& l : lines) {
    const std::string ev = l.value("event", "");
    if (ev.rfind("template.", 0) != 0) continue;
    events.push_back(ev);
    EXPECT_EQ(l.value("tenant", ""), "default") << l;
    EXPECT_EQ(l.value("template", ""), "aud-t") << l;
    EXPECT_TRUE(is_rfc3339_utc(l.value("time", ""))) << l;
  }
  EXPECT_EQ(events, (std::vector<std::string>{"template.push", "template.push", "template.build",
                                              "template.build", "template.rollback",
                                              "template.delete"}))
      << raw;
  auto pushes = of(lines, "template.push");
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[0]["created"], true);
  EXPECT_EQ(pushes[1]["created"], false);
  auto builds = of(lines, "template.build");
  ASSERT_EQ(builds.size(), 2u);
  EXPECT_EQ(builds[0]["build_id"], b1.body["build_id"]);
  EXPECT_EQ(builds[1]["build_id"], b2.body["build_id"]);
  EXPECT_EQ(of(lines, "template.rollback")[0]["snapshot_version"], 1);
  EXPECT_EQ(raw.find(kToken), std::string::npos);
}

}  // namespace
}  // namespace agentbox::testing
