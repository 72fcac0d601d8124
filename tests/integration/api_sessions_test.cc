// Sessions routes of API.md against the real daemon: create-or-get (201 then 200), scope
// templates, get, list, delete, the lifecycle routes, and every bad-input answer.

#include <filesystem>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

class SessionsApi : public ::testing::Test {
 protected:
  Daemon daemon_;
  Api api_{daemon_};
};

TEST_F(SessionsApi, CreateIsIdempotentAndReturnsTheSessionObject) {
  json spec = {{"id", "group_123"},
               {"limits", {{"memory_mb", 512}, {"max_pids", 64}}},
               {"network", {{"mode", "none"}}},
               {"labels", {{"team", "a"}}}};
  auto first = api_.post("/v1/sessions", spec);
  ASSERT_EQ(first.status, 201) << first;
  const json& s = first.body;
  EXPECT_EQ(s["id"], "group_123");
  EXPECT_EQ(s["state"], "running");
  EXPECT_EQ(s["backend"], test_backend());
  EXPECT_TRUE(s["workspace"].is_string() && !s["workspace"].get<std::string>().empty());
  EXPECT_TRUE(is_rfc3339_utc(s["created_at"].get<std::string>())) << s["created_at"];
  EXPECT_TRUE(is_rfc3339_utc(s["last_used_at"].get<std::string>())) << s["last_used_at"];
  EXPECT_EQ(s["limits"]["memory_mb"], 512);
  EXPECT_EQ(s["limits"]["max_pids"], 64);
  EXPECT_EQ(s["network"]["mode"], "none");
  EXPECT_EQ(s["labels"]["team"], "a");
  EXPECT_TRUE(s.contains("uid"));

  // Same id again: 200, the existing session unchanged.
  auto second = api_.post("/v1/sessions", {{"id", "group_123"}});
  ASSERT_EQ(second.status, 200) << second;
  EXPECT_EQ(second.body["created_at"], s["created_at"]);
  EXPECT_EQ(second.body["limits"]["memory_mb"], 512);
  // Asking for something else under the same id is a conflict naming the field, not a silent
  // success with other limits than asked for.
  auto clash = api_.post("/v1/sessions", {{"id", "group_123"}, {"limits", {{"memory_mb", 1024}}}});
  ASSERT_EQ(clash.status, 409) << clash;
  EXPECT_EQ(clash.code(), "EEXIST");
  EXPECT_NE(clash.message().find("limits.memory_mb"), std::string::npos) << clash;
  // labels may change on a re-create.
  auto relabel = api_.post("/v1/sessions", {{"id", "group_123"}, {"labels", {{"team", "b"}}}});
  ASSERT_EQ(relabel.status, 200) << relabel;
  EXPECT_EQ(relabel.body["labels"]["team"], "b");
  EXPECT_EQ(relabel.body["limits"]["memory_mb"], 512);
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "group_123"}, {"labels", {{"team", "a"}}}}).status,
            200);

  auto got = api_.get("/v1/sessions/group_123");
  ASSERT_EQ(got.status, 200) << got;
  EXPECT_EQ(got.body["id"], "group_123");
  EXPECT_EQ(got.body["labels"]["team"], "a");
}

TEST_F(SessionsApi, ScopeTemplateRendersTheIdAndMissingVariablesBecomeUnknown) {
  auto r = api_.post("/v1/sessions",
                     {{"scope", "{launcher_type}_{launcher_id}"},
                      {"variables", {{"launcher_type", "group"}, {"launcher_id", "123"}}}});
  ASSERT_EQ(r.status, 201) << r;
  EXPECT_EQ(r.body["id"], "group_123");

  auto missing = api_.post("/v1/sessions", {{"scope", "{launcher_type}_{launcher_id}"},
                                            {"variables", {{"launcher_type", "person"}}}});
  ASSERT_EQ(missing.status, 201) << missing;
  EXPECT_EQ(missing.body["id"], "person_unknown");

  // The same scope and variables name the same session.
  auto again = api_.post("/v1/sessions",
                         {{"scope", "{launcher_type}_{launcher_id}"},
                          {"variables", {{"launcher_type", "group"}, {"launcher_id", 123}}}});
  ASSERT_EQ(again.status, 200) << again;
  EXPECT_EQ(again.body["id"], "group_123");

  // A template that renders into an invalid id is refused.
  auto bad = api_.post("/v1/sessions", {{"scope", "{a}/{b}"}, {"variables", {{"a", "x"}}}});
  EXPECT_EQ(bad.status, 400) << bad;
  EXPECT_EQ(bad.code(), "EINVAL");
}

TEST_F(SessionsApi, ListShowsEverySessionAndDeleteRemovesSessionAndWorkspace) {
  api_.create("a1");
  api_.create("b2");
  auto list = api_.get("/v1/sessions");
  ASSERT_EQ(list.status, 200) << list;
  ASSERT_TRUE(list.body["sessions"].is_array());
  std::vector<std::string> ids;
  for (const auto& s : list.body["sessions"]) ids.push_back(s["id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{"a1", "b2"}));

  ASSERT_EQ(api_.put(files_target("a1", "f.txt"), "x").status, 200);
  std::string ws = daemon_.data_dir() + "/workspaces/a1";
  EXPECT_TRUE(std::filesystem::exists(ws + "/f.txt"));

  auto del = api_.del("/v1/sessions/a1");
  ASSERT_EQ(del.status, 200) << del;
  EXPECT_EQ(del.body["id"], "a1");
  EXPECT_EQ(api_.get("/v1/sessions/a1").status, 404);
  EXPECT_FALSE(std::filesystem::exists(ws));
  auto after = api_.get("/v1/sessions");
  ASSERT_EQ(after.body["sessions"].size(), 1u);
  EXPECT_EQ(after.body["sessions"][0]["id"], "b2");

  auto again = api_.del("/v1/sessions/a1");
  EXPECT_EQ(again.status, 404) << again;
  EXPECT_EQ(again.code(), "ENOENT");
}

// ?limit=N&after=ID pages through the list by id; "next" is the after of the next page, null
// on the last; without limit everything comes at once (next null).
TEST_F(SessionsApi, ListPagesByIdWithLimitAndAfter) {
  for (const char* id : {"p3", "p1", "p5", "p2", "p4"}) api_.create(id);
  auto ids_of = [](const json& body) {
    std::vector<std::string> ids;
    for (const auto& s : body["sessions"]) ids.push_back(s["id"]);
    return ids;
  };
  auto all = api_.get("/v1/sessions");
  ASSERT_EQ(all.status, 200) << all;
  EXPECT_EQ(ids_of(all.body), (std::vector<std::string>{"p1", "p2", "p3", "p4", "p5"}));
  EXPECT_TRUE(all.body["next"].is_null());

  std::vector<std::vector<std::string>> pages;
  std::string after;
  for (int i = 0; i < 5; ++i) {
    auto page = api_.get("/v1/sessions?limit=2" + (after.empty() ? "" : "&after=" + after));
    ASSERT_EQ(page.status, 200) << page;
    pages.push_back(ids_of(page.body));
    if (page.body["next"].is_null()) break;
    after = page.body["next"].get<std::string>();
  }
  EXPECT_EQ(pages, (std::vector<std::vector<std::string>>{{"p1", "p2"}, {"p3", "p4"}, {"p5"}}));
  // An exact fit ends with next null; an after past the end is an empty last page.
  auto exact = api_.get("/v1/sessions?limit=5");
  EXPECT_EQ(ids_of(exact.body).size(), 5u);
  EXPECT_TRUE(exact.body["next"].is_null()) << exact;
  auto past = api_.get("/v1/sessions?limit=2&after=p9");
  EXPECT_TRUE(past.body["sessions"].empty() && past.body["next"].is_null()) << past;

  for (const char* bad : {"0", "1001", "-1", "x", ""}) {
    auto r = api_.get(std::string("/v1/sessions?limit=") + bad);
    EXPECT_EQ(r.status, 400) << bad << " " << r;
    EXPECT_NE(r.message().find("limit"), std::string::npos) << r;
  }
}

TEST_F(SessionsApi, BadIdsAreRejectedWith400) {
  for (const std::string& id : std::vector<std::string>{"", ".", "..", "../x", "a/b", "a b",
                                                       std::string(129, 'a'), "semi;colon"}) {
    auto r = api_.post("/v1/sessions", {{"id", id}});
    EXPECT_EQ(r.status, 400) << "id '" << id << "': " << r;
    EXPECT_EQ(r.code(), "EINVAL") << id;
  }
  EXPECT_EQ(api_.post("/v1/sessions", {{"id", std::string(128, 'a')}}).status, 201);

  for (const char* path : {"/v1/sessions/a%20b", "/v1/sessions/..", "/v1/sessions/a%2Fb",
                                 "/v1/sessions/%2e%2e/files?path=a"}) {
    auto r = api_.get(path);
    EXPECT_EQ(r.status, 400) << path << ": " << r;
    EXPECT_EQ(r.code(), "EINVAL") << path;
  }
  auto ex = api_.post("/v1/sessions/bad%20id/exec", {{"command", "true"}});
  EXPECT_EQ(ex.status, 400) << ex;
}

TEST_F(SessionsApi, MalformedBodiesNameTheBadField) {
  auto not_json = api_.call("POST", "/v1/sessions", "{\"id\": ");
  EXPECT_EQ(not_json.status, 400) << not_json;
  EXPECT_EQ(not_json.code(), "EINVAL");
  EXPECT_NE(not_json.message().find("JSON"), std::string::npos) << not_json;

  auto array = api_.call("POST", "/v1/sessions", "[1,2]");
  EXPECT_EQ(array.status, 400) << array;

  auto missing = api_.post("/v1/sessions", json::object());
  EXPECT_EQ(missing.status, 400) << missing;
  EXPECT_NE(missing.message().find("'id'"), std::string::npos) << missing;

  auto wrong_type = api_.post("/v1/sessions", {{"id", 5}});
  EXPECT_EQ(wrong_type.status, 400);
  EXPECT_NE(wrong_type.message().find("field 'id' must be a string"), std::string::npos)
      << wrong_type;

  auto limits = api_.post("/v1/sessions", {{"id", "x"}, {"limits", {{"memory_mb", "lots"}}}});
  EXPECT_EQ(limits.status, 400);
  EXPECT_NE(limits.message().find("'limits.memory_mb'"), std::string::npos) << limits;

  auto negative = api_.post("/v1/sessions", {{"id", "x"}, {"limits", {{"max_pids", -1}}}});
  EXPECT_EQ(negative.status, 400);
  EXPECT_NE(negative.message().find("'limits.max_pids'"), std::string::npos) << negative;

  // 0 would mean "no limit" to a cgroup: refused, like anything below what a box needs.
  for (const char* f : {"memory_mb", "max_pids", "cpu_percent", "max_open_files", "disk_mb"}) {
    auto zero = api_.post("/v1/sessions", {{"id", "x"}, {"limits", {{f, 0}}}});
    EXPECT_EQ(zero.status, 400) << f << ": " << zero;
    EXPECT_NE(zero.message().find(std::string("'limits.") + f + "'"), std::string::npos) << zero;
    EXPECT_NE(zero.message().find("between"), std::string::npos) << zero;
  }
  auto files = api_.post("/v1/sessions", {{"id", "x"}, {"limits", {{"max_open_files", 1 << 21}}}});
  EXPECT_EQ(files.status, 400) << files;
  EXPECT_EQ(api_.get("/v1/sessions/x").status, 404);

  auto net = api_.post("/v1/sessions", {{"id", "x"}, {"network", {{"mode", "everything"}}}});
  EXPECT_EQ(net.status, 400);
  EXPECT_NE(net.message().find("'network.mode'"), std::string::npos) << net;

  auto labels = api_.post("/v1/sessions", {{"id", "x"}, {"labels", {{"k", 1}}}});
  EXPECT_EQ(labels.status, 400);
  EXPECT_NE(labels.message().find("'labels.k'"), std::string::npos) << labels;

  auto mounts = api_.post("/v1/sessions", {{"id", "x"}, {"mounts", {{{"host_path", "/srv"}}}}});
  EXPECT_EQ(mounts.status, 400);
  EXPECT_NE(mounts.message().find("'mounts[0].mount_path'"), std::string::npos) << mounts;

  // An unknown field is refused naming it; none of the bad requests above created "x".
  auto extra = api_.post("/v1/sessions", {{"id", "x"}, {"colour", "blue"}});
  EXPECT_EQ(extra.status, 400) << extra;
  EXPECT_NE(extra.message().find("'colour'"), std::string::npos) << extra;
  EXPECT_EQ(api_.get("/v1/sessions/x").status, 404);
}

TEST_F(SessionsApi, UnknownSessionIs404OnEverySessionRoute) {
  const std::string s = "/v1/sessions/nobody";
  struct Case {
    std::string method;
    std::string target;
    std::string body;
  };
  std::vector<Case> cases = {
      {"GET", s, ""},
      {"DELETE", s, ""},
      {"POST", s + "/suspend", ""},
      {"POST", s + "/resume", ""},
      {"POST", s + "/keepalive", ""},
      {"POST", s + "/health", ""},
      {"POST", s + "/repair", ""},
      {"GET", s + "/files?path=a.txt", ""},
      {"PUT", s + "/files?path=a.txt", "data"},
      {"DELETE", s + "/files?path=a.txt", ""},
      {"GET", s + "/stat?path=a.txt", ""},
      {"GET", s + "/dir?path=.", ""},
      {"POST", s + "/mkdir", R"({"path":"d"})"},
      {"POST", s + "/rename", R"({"from":"a","to":"b"})"},
  };
  for (const auto& c : cases) {
    auto r = api_.call(c.method, c.target, c.body);
    EXPECT_EQ(r.status, 404) << c.method << " " << c.target << ": " << r;
    EXPECT_EQ(r.code(), "ENOENT") << c.method << " " << c.target;
  }
  // None of them created it.
  EXPECT_EQ(api_.get("/v1/sessions").body["sessions"].size(), 0u);
}

TEST_F(SessionsApi, LifecycleRoutes) {
  api_.create("life");
  auto keep = api_.post("/v1/sessions/life/keepalive", json::object());
  ASSERT_EQ(keep.status, 200) << keep;
  EXPECT_EQ(keep.body["id"], "life");
  EXPECT_EQ(keep.body["state"], "running");

  auto resume = api_.call("POST", "/v1/sessions/life/resume");
  ASSERT_EQ(resume.status, 200) << resume;
  EXPECT_EQ(resume.body["id"], "life");

  auto health = api_.call("POST", "/v1/sessions/life/health");
  ASSERT_EQ(health.status, 200) << health;
  EXPECT_EQ(health.body["healthy"], true) << health;
  ASSERT_TRUE(health.body["checks"].is_array());
  ASSERT_FALSE(health.body["checks"].empty());
  for (const auto& c : health.body["checks"]) {
    EXPECT_TRUE(c.contains("name") && c.contains("ok") && c.contains("detail")) << c;
  }

  auto suspend = api_.call("POST", "/v1/sessions/life/suspend");
  ASSERT_EQ(suspend.status, 200) << suspend;
  EXPECT_EQ(suspend.body["state"], "suspended");
  // keepalive extends without resuming; resume brings it back.
  auto keep2 = api_.call("POST", "/v1/sessions/life/keepalive");
  ASSERT_EQ(keep2.status, 200) << keep2;
  EXPECT_EQ(keep2.body["state"], "suspended");
  auto resume2 = api_.call("POST", "/v1/sessions/life/resume");
  ASSERT_EQ(resume2.status, 200) << resume2;
  EXPECT_EQ(resume2.body["state"], "running");

  // repair (api_packages_test has the rest): a healthy session stays healthy.
  {
    auto r = api_.call("POST", "/v1/sessions/life/repair");
    EXPECT_EQ(r.status, 200) << r;
    EXPECT_EQ(r.body["healthy"], true) << r;
  }
  // restore: 409 when the session exists (before the archive is looked at), 400 without an
  // archive, 403 for an archive outside data_dir/archives (api_archive_test has the rest).
  auto exists = api_.post("/v1/sessions/life/restore", {{"archive", "/tmp/x.tar.zst"}});
  EXPECT_EQ(exists.status, 409) << exists;
  EXPECT_EQ(exists.code(), "EEXIST");
  auto no_archive = api_.post("/v1/sessions/fresh/restore", json::object());
  EXPECT_EQ(no_archive.status, 400) << no_archive;
  EXPECT_NE(no_archive.message().find("'archive'"), std::string::npos);
  auto fresh = api_.post("/v1/sessions/fresh/restore", {{"archive", "/tmp/x.tar.zst"}});
  EXPECT_EQ(fresh.status, 403) << fresh;
  EXPECT_EQ(fresh.code(), "EACCES");
  EXPECT_EQ(api_.get("/v1/sessions/fresh").status, 404);

  // The pty route is a WebSocket (api_processes_test drives it): a plain GET is told so.
  auto pty = api_.get("/v1/sessions/life/pty?cols=80&rows=24&command=bash");
  EXPECT_EQ(pty.status, 426) << pty;
  EXPECT_EQ(pty.code(), "EINVAL") << pty;
}

}  // namespace
}  // namespace agentbox::testing
