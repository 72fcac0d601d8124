// Templates as a user writes them (issue 27, item 4), against the real daemon on real ns boxes:
// a template's env is in its sessions' environment (and `packages` follows PIP_FIND_LINKS /
// PIP_NO_INDEX from it), a --shared-dirs daemon builds templates, a host dir the build box would
// not see is refused at the push naming readonly_dirs, limits.disk_mb caps the build, and build
// records answer after a daemon restart. Installs come from a wheel the test makes, never a
// registry.
//
// Every daemon here picks the ns backend itself (suites Templates*: left out of the ns/ re-run).

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;

// A hand-made wheel tinypkg-0.1 (VALUE = 42) in `dir`.
bool make_tinypkg_wheel(const std::string& dir) {
  return std::system(("cd " + dir +
                      " && /usr/bin/python3 - <<'PY'\n"
                      "import zipfile\n"
                      "w = zipfile.ZipFile('tinypkg-0.1-py3-none-any.whl', 'w')\n"
                      "w.writestr('tinypkg/__init__.py', 'VALUE = 42\\n')\n"
                      "w.writestr('tinypkg-0.1.dist-info/METADATA', 'Metadata-Version: 2.1\\n"
                      "Name: tinypkg\\nVersion: 0.1\\n')\n"
                      "w.writestr('tinypkg-0.1.dist-info/WHEEL', 'Wheel-Version: 1.0\\n"
                      "Generator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n"
                      "w.writestr('tinypkg-0.1.dist-info/RECORD', '')\n"
                      "w.close()\n"
                      "PY")
                         .c_str()) == 0;
}

ApiReply push(Api& api, const std::string& yaml) {
  return api.call("POST", "/v1/templates", yaml, "application/yaml");
}
ApiReply build(Api& api, const std::string& name) {
  return api.call("POST", "/v1/templates/" + name + "/build?wait=true", "{}");
}
std::string log_of(Api& api, const std::string& name, const ApiReply& b) {
  return api.get("/v1/templates/" + name + "/builds/" + b.body.value("build_id", "") + "/log").raw;
}

// The template's env is in every session's environment, under the session's own env; a
// template that points pip at a local wheel dir through PIP_FIND_LINKS / PIP_NO_INDEX makes a
// session's `packages` install from it.
TEST(TemplatesEnv, TheTemplateEnvIsInEverySessionAndPackagesFollowsIt) {
  TempDir dir("agentbox-tmpl-env");
  const std::string d = dir.path();
  ASSERT_EQ(::chmod(d.c_str(), 0755), 0);  // the session user reads the wheel dir
  ASSERT_TRUE(make_tinypkg_wheel(d));
  std::ofstream(d + "/config.yaml") << "readonly_dirs:\n  - " << d << "\n";
  Daemon daemon({"--backend", "ns", "--config", d + "/config.yaml"});
  Api api(daemon);
  const std::string yaml =
      "name: envy\nenv:\n  GREETING: hi\n  SHADOWED: template\n"
      "  PIP_FIND_LINKS: " +
      d +
      "\n  PIP_NO_INDEX: \"1\"\n"
      "setup:\n  - test \"$GREETING\" = hi\n";
  ASSERT_EQ(push(api, yaml).status, 201);
  auto b = build(api, "envy");
  ASSERT_EQ(b.status, 201) << b << log_of(api, "envy", b);

  ASSERT_EQ(api.post("/v1/sessions",
                     {{"id", "e"}, {"template", "envy"}, {"env", {{"SHADOWED", "session"}}}})
                .status,
            201);
  auto r = api.sh("e", "echo \"$GREETING $SHADOWED $PIP_NO_INDEX\"");
  EXPECT_EQ(r.body.value("stdout", ""), "hi session 1\n") << r;

  // `packages` with neither find_links nor an index: pip takes them from the environment.
  auto p = api.post("/v1/sessions/e/packages", {{"manager", "pip"}, {"packages", {"tinypkg"}}});
  ASSERT_EQ(p.status, 200) << p;
  EXPECT_EQ(p.body["exit_code"], 0) << p;
  auto v = api.sh("e", "python -c 'import tinypkg; print(tinypkg.VALUE)'");
  EXPECT_EQ(v.body.value("stdout", ""), "42\n") << v;

  // After a suspend and resume (a new box), and after a daemon restart, the env is still there.
  ASSERT_EQ(api.post("/v1/sessions/e/suspend", json::object()).status, 200);
  EXPECT_EQ(api.sh("e", "echo $GREETING").body.value("stdout", ""), "hi\n");
  // A session on no template has none of it.
  api.create("plain");
  EXPECT_EQ(api.sh("plain", "echo \"[$GREETING]\"").body.value("stdout", ""), "[]\n");
  EXPECT_EQ(api.del("/v1/sessions/e").status, 200);
  EXPECT_EQ(api.del("/v1/sessions/plain").status, 200);
}

// A daemon started with the seed's --shared-dirs builds templates; the build box sees the
// shared dir read-only at /shared/<prefix>, as sessions do.
TEST(TemplatesSharedDirs, ADaemonWithSharedDirsBuildsTemplates) {
  TempDir shared("agentbox-tmpl-shared");
  ASSERT_EQ(::chmod(shared.path().c_str(), 0755), 0);
  std::ofstream(shared / "style.json") << R"({"color":"red"})";
  Daemon daemon({"--backend", "ns", "--shared-dirs", "site-templates:" + shared.path()});
  Api api(daemon);
  ASSERT_EQ(push(api,
                 "name: site\nsetup:\n  - cp /shared/site-templates/style.json .\n"
                 "  - touch /shared/site-templates/x 2>/dev/null && exit 9 || true\n")
                .status,
            201);
  auto b = build(api, "site");
  ASSERT_EQ(b.status, 201) << b << log_of(api, "site", b);
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "s"}, {"template", "site"}}).status, 201);
  EXPECT_EQ(api.sh("s", "cat style.json").body.value("stdout", ""), R"({"color":"red"})");
  EXPECT_FALSE(fs::exists(shared / "x"));
  EXPECT_EQ(api.del("/v1/sessions/s").status, 200);
}

// A host dir a template names that the build box would not see is refused at the push, naming
// the readonly_dirs entry to add; the same dir under readonly_dirs is accepted. A path the host
// does not have is the box's own (a dir the setup makes): accepted.
TEST(TemplatesHostPaths, AHostDirTheBoxDoesNotSeeIsRefusedNamingReadonlyDirs) {
  TempDir wheels("agentbox-tmpl-unseen");
  Daemon daemon({"--backend", "ns"});
  Api api(daemon);
  for (const std::string& yaml :
       {"name: t\npython:\n  dependencies: [tinypkg]\n  find_links: [" + wheels.path() + "]\n",
        "name: t\nenv:\n  PIP_FIND_LINKS: " + wheels.path() + "\n",
        "name: t\nnodejs:\n  dependencies:\n    x: " + wheels.path() + "\n"}) {
    auto r = push(api, yaml);
    EXPECT_EQ(r.status, 400) << yaml << r;
    EXPECT_NE(r.message().find("readonly_dirs"), std::string::npos) << r;
    EXPECT_NE(r.message().find("'" + wheels.path() + "'"), std::string::npos) << r;
  }
  EXPECT_EQ(api.get("/v1/templates/t").status, 404) << "nothing stored";
  auto own = push(api, "name: t\npython:\n  find_links: [/workspace/wheels]\n");
  EXPECT_EQ(own.status, 201) << own;

  std::ofstream(wheels / "config.yaml") << "readonly_dirs: [" << wheels.path() << "]\n";
  Daemon seen({"--backend", "ns", "--config", wheels / "config.yaml"});
  Api api2(seen);
  auto ok = push(api2, "name: t\npython:\n  find_links: [" + wheels.path() + "]\n");
  EXPECT_EQ(ok.status, 201) << ok;
}

// limits.disk_mb caps the build: a setup writing past it fails (ENOSPC), one within it builds,
// and nothing of either stays mounted.
TEST(TemplatesDisk, ABuildWritingPastItsDiskCapFails) {
  TempDir dir("agentbox-tmpl-disk");
  const std::string data = dir / "data";
  Daemon daemon({"--backend", "ns", "--data-dir", data});
  Api api(daemon);
  ASSERT_EQ(push(api,
                 "name: big\nlimits:\n  disk_mb: 16\nsetup:\n"
                 "  - head -c 40000000 /dev/zero > blob\n")
                .status,
            201);
  auto f = build(api, "big");
  EXPECT_EQ(f.status, 422) << f;
  EXPECT_NE(log_of(api, "big", f).find("No space left"), std::string::npos)
      << log_of(api, "big", f);
  EXPECT_TRUE(api.get("/v1/templates/big").body["current_version"].is_null());

  ASSERT_EQ(push(api,
                 "name: small\nlimits:\n  disk_mb: 16\nsetup:\n"
                 "  - head -c 4000000 /dev/zero > blob\n  - ln -s blob link\n")
                .status,
            201);
  auto b = build(api, "small");
  ASSERT_EQ(b.status, 201) << b << log_of(api, "small", b);
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "d"}, {"template", "small"}}).status, 201);
  EXPECT_EQ(api.sh("d", "stat -c %s blob; readlink link; ls -A | grep -c lost+found")
                .body.value("stdout", ""),
            "4000000\nblob\n0\n");
  EXPECT_EQ(api.del("/v1/sessions/d").status, 200);
  EXPECT_EQ(read_host_file("/proc/mounts").find(data + "/builds"), std::string::npos)
      << "no build disk stays mounted";
  EXPECT_TRUE(fs::is_empty(data + "/builds"));
}

// A build's record (and its log) answer after a daemon restart; a build the daemon died in is
// failed, saying so.
TEST(TemplatesRestart, BuildRecordsAnswerAfterARestart) {
  TempDir dir("agentbox-tmpl-records");
  const std::string data = dir / "data";
  std::string ok_id, failed_id;
  {
    Daemon d({"--backend", "ns", "--data-dir", data});
    Api api(d);
    ASSERT_EQ(push(api, "name: r\nsetup:\n  - echo from-the-build\n").status, 201);
    auto b = build(api, "r");
    ASSERT_EQ(b.status, 201) << b;
    ok_id = b.body.value("build_id", "");
    ASSERT_EQ(push(api, "name: r\nsetup:\n  - exit 3\n").status, 200);
    auto f = build(api, "r");
    ASSERT_EQ(f.status, 422) << f;
    failed_id = f.body.value("build_id", "");
  }
  Daemon d({"--backend", "ns", "--data-dir", data});
  Api api(d);
  auto ok = api.get("/v1/templates/r/builds/" + ok_id);
  ASSERT_EQ(ok.status, 200) << ok;
  EXPECT_EQ(ok.body["state"], "succeeded") << ok;
  EXPECT_EQ(ok.body["snapshot"]["version"], 1) << ok;
  EXPECT_NE(api.get("/v1/templates/r/builds/" + ok_id + "/log").raw.find("from-the-build"),
            std::string::npos);
  auto failed = api.get("/v1/templates/r/builds/" + failed_id);
  ASSERT_EQ(failed.status, 200) << failed;
  EXPECT_EQ(failed.body["state"], "failed") << failed;
  EXPECT_EQ(failed.body["exit_code"], 3) << failed;
  EXPECT_EQ(api.get("/v1/templates/r/builds/nosuchbuild").status, 404);
}

}  // namespace
}  // namespace agentbox::testing
