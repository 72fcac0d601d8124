// Mounts and skills against the real daemon on the ns backend (API.md "Sessions"): rw mounts and
// skills are writable by the session user without chowning the host dir (idmapped), a skill added
// to a running session is visible to its next exec, bad input changes nothing, what was added
// stays over suspend/resume and a daemon restart, and the daemon's global skills and agents dir
// (seed 000) appear in every box.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;


struct Owner {
  uid_t uid;
  gid_t gid;
};
Owner owner_of(const std::string& path) {
  struct stat st{};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return {st.st_uid, st.st_gid};
}

class MountsApi : public ::testing::Test {
 protected:
  MountsApi()
      : roots_("agentbox-mounts"),
        allowed_(roots_.path() + "/allowed"),
        d_({"--backend", "ns", "--allow-mount-root", allowed_}),
        api_(d_) {}

  static void SetUpTestSuite() {}
  void SetUp() override {
    fs::create_directories(allowed_ + "/skills/web");
    std::ofstream(allowed_ + "/skills/web/SKILL.md") << "# web\n";
    ::chmod((allowed_ + "/skills/web/SKILL.md").c_str(), 0644);
  }

  ApiReply add(const std::string& id, const json& body) {
    return api_.post("/v1/sessions/" + id + "/mounts", body);
  }
  // The box's mount table as its commands see it.
  std::string box_mounts(const std::string& id) {
    return api_.sh(id, "cat /proc/self/mountinfo").body["stdout"].get<std::string>();
  }

  TempDir roots_;
  std::string allowed_;
  Daemon d_;
  Api api_;
};

TEST_F(MountsApi, ASkillAddedToARunningSessionIsSeenByItsNextExecAndWritableAsTheDirOwner) {
  // Another uid's dir: the agent writes in it, the host sees the dir owner's files.
  ASSERT_EQ(::chown((allowed_ + "/skills/web").c_str(), 4242, 4343), 0);
  ASSERT_EQ(::chown((allowed_ + "/skills/web/SKILL.md").c_str(), 4242, 4343), 0);
  ASSERT_EQ(::chmod((allowed_ + "/skills/web").c_str(), 0700), 0);
  api_.create("s");
  ASSERT_EQ(api_.sh("s", "echo hi").body["stdout"], "hi\n");  // the box runs
  auto r = add("s", {{"skills", {{"web", allowed_ + "/skills/web"}}}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["applied"], "live") << r;
  EXPECT_EQ(r.body["session"]["skills"]["web"], allowed_ + "/skills/web") << r;
  EXPECT_EQ(r.body["session"]["skill_modes"]["web"], "rw") << r;

  auto x = api_.sh("s",
                   "cat /workspace/.skills/web/SKILL.md && echo note > /workspace/.skills/web/n "
                   "&& echo more >> /workspace/.skills/web/SKILL.md && id -u");
  EXPECT_EQ(x.body["exit_code"], 0) << x;
  const std::string uid = std::to_string(api_.get("/v1/sessions/s").body["uid"].get<int>());
  EXPECT_EQ(x.body["stdout"], "# web\n" + uid + "\n") << x;
  const Owner made = owner_of(allowed_ + "/skills/web/n");
  EXPECT_EQ(made.uid, 4242u);
  EXPECT_EQ(made.gid, 4343u);
  const Owner dir = owner_of(allowed_ + "/skills/web");
  EXPECT_EQ(dir.uid, 4242u);  // nothing chowned
  EXPECT_EQ(owner_of(allowed_ + "/skills/web/SKILL.md").uid, 4242u);
  EXPECT_EQ(read_host_file(allowed_ + "/skills/web/SKILL.md"), "# web\nmore\n");

  // The file API sees it too.
  auto f = api_.get(files_target("s", "/workspace/.skills/web/n"));
  EXPECT_EQ(f.raw, "note\n") << f;

  // ro on request.
  fs::create_directories(allowed_ + "/skills/docs");
  std::ofstream(allowed_ + "/skills/docs/SKILL.md") << "# docs\n";
  r = add("s", {{"skills", {{"docs", allowed_ + "/skills/docs"}}}, {"skill_mode", "ro"}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["applied"], "live");
  x = api_.sh("s", "cat /workspace/.skills/docs/SKILL.md; touch /workspace/.skills/docs/x 2>&1");
  EXPECT_NE(x.body["stdout"].get<std::string>().find("# docs\n"), std::string::npos) << x;
  EXPECT_NE(x.body["stdout"].get<std::string>().find("Read-only file system"), std::string::npos)
      << x;
}

TEST_F(MountsApi, RootOwnedHostDirMountedRwIsWritableAndNotChowned) {
  fs::create_directories(allowed_ + "/data");
  std::ofstream(allowed_ + "/data/old.txt") << "old\n";
  ASSERT_EQ(::chmod((allowed_ + "/data").c_str(), 0755), 0);
  api_.create("r");
  auto r = add("r", {{"mounts", {{{"host_path", allowed_ + "/data"}, {"mount_path", "/data"}}}}});
  ASSERT_EQ(r.status, 200) << r;
  // /data is a new top-level dir: its mountpoint cannot be made on the running box's read-only
  // root, so it comes with the next start.
  EXPECT_EQ(r.body["applied"], "next_start") << r;
  ASSERT_EQ(api_.call("POST", "/v1/sessions/r/suspend").status, 200);
  auto x = api_.sh("r", "echo new > /data/new.txt && cat /data/old.txt");
  EXPECT_EQ(x.body["stdout"], "old\n") << x;
  EXPECT_EQ(owner_of(allowed_ + "/data/new.txt").uid, 0u);
  EXPECT_EQ(owner_of(allowed_ + "/data").uid, 0u);
  EXPECT_EQ(owner_of(allowed_ + "/data/old.txt").uid, 0u);
}

// A mount added to a running box under /workspace or /mnt (the box's small tmpfs of mountpoints)
// is there for the next exec; only a new top-level dir waits for the next start (above).
TEST_F(MountsApi, MountsUnderWorkspaceAndMntComeLiveForTheNextExec) {
  fs::create_directories(allowed_ + "/data");
  std::ofstream(allowed_ + "/data/a.txt") << "data\n";
  ::chmod((allowed_ + "/data/a.txt").c_str(), 0644);
  api_.create("lm");
  ASSERT_EQ(api_.sh("lm", "echo hi").body["stdout"], "hi\n");  // the box runs
  auto r = add(
      "lm",
      {{"mounts",
        {{{"host_path", allowed_ + "/data"}, {"mount_path", "/workspace/x"}, {"mode", "ro"}}}}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["applied"], "live") << r;
  r = add("lm", {{"mounts",
                  {{{"host_path", allowed_ + "/data"}, {"mount_path", "/mnt/x"}},
                   {{"host_path", allowed_ + "/data"}, {"mount_path", "/mnt/deep/er"}}}}});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["applied"], "live") << r;

  auto x = api_.sh("lm",
                   "cat /workspace/x/a.txt /mnt/x/a.txt /mnt/deep/er/a.txt && "
                   "echo new > /mnt/x/b.txt && cat /mnt/deep/er/b.txt");
  EXPECT_EQ(x.body["exit_code"], 0) << x;
  EXPECT_EQ(x.body["stdout"], "data\ndata\ndata\nnew\n") << x;
  EXPECT_EQ(read_host_file(allowed_ + "/data/b.txt"), "new\n");
  // /mnt itself is the daemon's: the agent makes nothing there, and the ro mount stays ro.
  x = api_.sh("lm", "touch /mnt/y 2>&1; touch /workspace/x/y 2>&1; stat -c %a /mnt");
  const std::string said = x.body["stdout"].get<std::string>();
  EXPECT_NE(said.find("/mnt/y"), std::string::npos) << x;
  EXPECT_NE(said.find("Read-only file system"), std::string::npos) << x;
  EXPECT_NE(said.find("755\n"), std::string::npos) << x;
  EXPECT_FALSE(fs::exists(allowed_ + "/data/y"));
}

// A mount below /mnt given at create (seed 001's /mnt/shared-readonly/... layout) is there at
// start, on top of the /mnt tmpfs.
TEST_F(MountsApi, AMountBelowMntAtCreateIsThere) {
  fs::create_directories(allowed_ + "/site");
  std::ofstream(allowed_ + "/site/index.html") << "<p>hi</p>\n";
  ::chmod((allowed_ + "/site/index.html").c_str(), 0644);
  auto r = api_.post("/v1/sessions", {{"id", "sr"},
                                      {"mounts",
                                       {{{"host_path", allowed_ + "/site"},
                                         {"mount_path", "/mnt/shared-readonly/site-templates"},
                                         {"mode", "ro"}}}}});
  ASSERT_EQ(r.status, 201) << r;
  auto x = api_.sh("sr", "cat /mnt/shared-readonly/site-templates/index.html");
  EXPECT_EQ(x.body["stdout"], "<p>hi</p>\n") << x;
}

TEST_F(MountsApi, BadInputIsRefusedNamingItAndNothingIsHalfApplied) {
  api_.create("b");
  ASSERT_EQ(add("b", {{"skills", {{"web", allowed_ + "/skills/web"}}}}).status, 200);
  const json before = api_.get("/v1/sessions/b").body;
  const std::string mounts_before = box_mounts("b");
  fs::create_directories(allowed_ + "/ok");

  struct Case {
    json body;
    int status;
    std::string names;
  };
  const std::vector<Case> cases = {
      // A system path as target (the second mount: the good first one must not stay).
      {{{"mounts",
         {{{"host_path", allowed_ + "/ok"}, {"mount_path", "/workspace/ok"}},
          {{"host_path", allowed_ + "/ok"}, {"mount_path", "/etc/x"}}}}},
       400,
       "mounts[1].mount_path"},
      {{{"mounts", {{{"host_path", allowed_ + "/ok"}, {"mount_path", "/usr"}}}}},
       400,
       "mounts[0].mount_path"},
      // A host dir that does not exist (API.md: 404 ENOENT).
      {{{"skills", {{"nope", allowed_ + "/skills/nope"}}}}, 404, "skills.nope"},
      // A target the session has already, as a skill or within the request.
      {{{"mounts", {{{"host_path", allowed_ + "/ok"}, {"mount_path", "/workspace/.skills/web"}}}}},
       400,
       "mounts[0].mount_path"},
      {{{"skills", {{"web", allowed_ + "/ok"}}}}, 400, "skills.web"},
      {{{"mounts",
         {{{"host_path", allowed_ + "/ok"}, {"mount_path", "/workspace/d"}},
          {{"host_path", allowed_ + "/ok"}, {"mount_path", "/workspace/d"}}}}},
       400,
       "mounts[1].mount_path"},
      // A bad mode.
      {{{"mounts", {{{"host_path", allowed_ + "/ok"}, {"mount_path", "/workspace/m"},
                     {"mode", "rwx"}}}}},
       400,
       "mounts[0].mode"},
      {{{"skills", {{"x", allowed_ + "/ok"}}}, {"skill_mode", "wo"}}, 400, "skill_mode"},
      // Outside the allowed roots.
      {{{"mounts", {{{"host_path", roots_.path()}, {"mount_path", "/workspace/r"}}}}},
       403,
       "mounts[0].host_path"},
      // Nothing to add.
      {json::object(), 400, "mounts"},
  };
  for (const Case& c : cases) {
    auto r = add("b", c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r;
    EXPECT_NE(r.message().find(c.names), std::string::npos) << c.body << " -> " << r;
  }
  // Nothing half-applied: the spec and the box's mounts are as before.
  const json after = api_.get("/v1/sessions/b").body;
  EXPECT_EQ(after["mounts"], before["mounts"]);
  EXPECT_EQ(after["skills"], before["skills"]);
  EXPECT_EQ(box_mounts("b"), mounts_before);
  EXPECT_FALSE(fs::exists(d_.data_dir() + "/workspaces/b/ok"));
  // Not the caller's session / no such session.
  EXPECT_EQ(add("nobody", {{"skills", {{"web", allowed_ + "/skills/web"}}}}).status, 404);
}

TEST(MountsRestart, AddedMountsStayOverSuspendResumeARestartAndAnArchive) {
  TempDir roots("agentbox-mounts");
  const std::string allowed = roots.path() + "/allowed";
  fs::create_directories(allowed + "/skill");
  std::ofstream(allowed + "/skill/SKILL.md") << "# kept\n";
  const std::string data = roots.path() + "/data";
  {
    Daemon d({"--backend", "ns", "--allow-mount-root", allowed, "--data-dir", data});
    Api api(d);
    api.create("p");
    auto r = api.post("/v1/sessions/p/mounts", {{"skills", {{"kept", allowed + "/skill"}}}});
    ASSERT_EQ(r.status, 200) << r;
    ASSERT_EQ(api.call("POST", "/v1/sessions/p/suspend").status, 200);
    EXPECT_EQ(api.sh("p", "cat /workspace/.skills/kept/SKILL.md").body["stdout"], "# kept\n");
    d.stop();
  }
  Daemon d2({"--backend", "ns", "--allow-mount-root", allowed, "--data-dir", data});
  Api api2(d2);
  EXPECT_EQ(api2.get("/v1/sessions/p").body["skills"]["kept"], allowed + "/skill");
  EXPECT_EQ(api2.sh("p", "cat /workspace/.skills/kept/SKILL.md").body["stdout"], "# kept\n");
  // And over an archive and a restore.
  auto del = api2.del("/v1/sessions/p?archive=true");
  ASSERT_EQ(del.status, 200) << del;
  auto restored =
      api2.post("/v1/sessions/p2/restore", {{"archive", del.body["archive"].get<std::string>()}});
  ASSERT_EQ(restored.status, 201) << restored;
  EXPECT_EQ(restored.body["skills"]["kept"], allowed + "/skill") << restored;
  EXPECT_EQ(api2.sh("p2", "cat /workspace/.skills/kept/SKILL.md").body["stdout"], "# kept\n");
}

TEST(GlobalSkills, EverySessionSeesThemReadOnlyAndItsOwnSkillWins) {
  TempDir dirs("agentbox-global");
  const std::string global = dirs.path() + "/skills";
  const std::string agents = dirs.path() + "/agents";
  const std::string own = dirs.path() + "/own/web";
  fs::create_directories(global + "/web");
  fs::create_directories(global + "/pdf");
  fs::create_directories(global + "/notaskill");
  fs::create_directories(agents);
  fs::create_directories(own);
  std::ofstream(global + "/web/SKILL.md") << "# global web\n";
  std::ofstream(global + "/pdf/SKILL.md") << "# global pdf\n";
  std::ofstream(global + "/notaskill/README") << "x\n";
  std::ofstream(agents + "/reviewer.md") << "# reviewer\n";
  std::ofstream(own + "/SKILL.md") << "# own web\n";
  Daemon d({"--backend", "ns", "--global-skills-dir", global, "--agents-dir", agents,
            "--allow-mount-root", dirs.path() + "/own"});
  Api api(d);
  api.create("g");
  auto r = api.sh("g",
                  "ls /workspace/.skills; cat /workspace/.skills/web/SKILL.md "
                  "/workspace/.agents/reviewer.md; touch /workspace/.skills/pdf/x "
                  "/workspace/.agents/x 2>&1 | grep -c 'Read-only'");
  EXPECT_EQ(r.body["stdout"], "pdf\nweb\n# global web\n# reviewer\n2\n") << r;

  auto c = api.post("/v1/sessions", {{"id", "mine"}, {"skills", {{"web", own}}}});
  ASSERT_EQ(c.status, 201) << c;
  r = api.sh("mine", "cat /workspace/.skills/web/SKILL.md /workspace/.skills/pdf/SKILL.md");
  EXPECT_EQ(r.body["stdout"], "# own web\n# global pdf\n") << r;

  // A configured dir that does not exist stops the daemon at start, naming it.
  std::string out;
  EXPECT_EQ(Daemon::run_to_exit({"--global-skills-dir", dirs.path() + "/missing"}, &out), 2);
  EXPECT_NE(out.find("global_skills_dir"), std::string::npos) << out;
}

}  // namespace
}  // namespace agentbox::testing
