// Seed 004's installs that persist, health and repair, and the box environment (issue 13 items
// 4-6), through the real daemon on real ns boxes, offline: a wheel made in the test (a zip with
// the module and its dist-info) found with --find-links, an `npm pack` tarball of a package the
// test writes. Nothing here reaches any package registry.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

// Runs `cmd` on the host (test inputs only); true on exit 0.
bool host_sh(const std::string& cmd) { return std::system(cmd.c_str()) == 0; }

// A hand-made wheel `<name>-<version>-py3-none-any.whl` in `dir` whose module says VALUE.
bool make_wheel(const std::string& dir, const std::string& name, const std::string& version,
                int value) {
  const std::string di = name + "-" + version + ".dist-info";
  return host_sh("cd " + dir + " && /usr/bin/python3 - <<'PY'\n"
                 "import zipfile\n"
                 "w = zipfile.ZipFile('" + name + "-" + version + "-py3-none-any.whl', 'w')\n"
                 "w.writestr('" + name + "/__init__.py', 'VALUE = " + std::to_string(value) +
                 "\\n')\n"
                 "w.writestr('" + di + "/METADATA', 'Metadata-Version: 2.1\\nName: " + name +
                 "\\nVersion: " + version + "\\n')\n"
                 "w.writestr('" + di + "/WHEEL', 'Wheel-Version: 1.0\\nGenerator: test\\n"
                 "Root-Is-Purelib: true\\nTag: py3-none-any\\n')\n"
                 "w.writestr('" + di + "/RECORD', '')\n"
                 "w.close()\n"
                 "PY");
}

class PackagesFixture : public ::testing::Test {
 protected:
  explicit PackagesFixture(std::vector<std::string> args = {"--backend", "ns"})
      : daemon_(std::move(args)), api_(daemon_) {}

  void SetUp() override {
    const std::string d = daemon_.temp_dir();
    ASSERT_TRUE(make_wheel(d, "tinypkg", "0.1", 42));
    ASSERT_TRUE(make_wheel(d, "otherpkg", "0.2", 7));
    // An npm package with a module and a bin (node_modules/.bin must be on the box's PATH).
    ASSERT_TRUE(host_sh(
        "mkdir -p " + d + "/tinynpm && cd " + d + "/tinynpm && "
        "printf '%s' '{\"name\":\"tinynpm\",\"version\":\"1.0.0\",\"main\":\"index.js\","
        "\"bin\":{\"tinynpm-hello\":\"cli.js\"}}' > package.json && "
        "echo 'module.exports = 7;' > index.js && "
        "printf '#!/usr/bin/env node\\nconsole.log(\"hello from tinynpm\");\\n' > cli.js && "
        "chmod +x cli.js && npm pack --silent --pack-destination " + d + " >/dev/null 2>&1"));
  }

  // Uploads the test's wheels to /workspace/wheels and the npm tarball to /workspace/pkgs.
  void upload_inputs(const std::string& id) {
    const std::string d = daemon_.temp_dir();
    for (const char* w : {"tinypkg-0.1-py3-none-any.whl", "otherpkg-0.2-py3-none-any.whl"}) {
      auto r = api_.put(files_target(id, std::string("/workspace/wheels/") + w, "&mkdirs=true"),
                        read_host_file(d + "/" + w));
      ASSERT_EQ(r.status, 200) << r;
    }
    std::string tgz = read_host_file(d + "/tinynpm-1.0.0.tgz");
    ASSERT_FALSE(tgz.empty());
    auto r = api_.put(files_target(id, "/workspace/pkgs/tinynpm-1.0.0.tgz", "&mkdirs=true"), tgz);
    ASSERT_EQ(r.status, 200) << r;
  }

  ApiReply pip(const std::string& id, const std::vector<std::string>& pkgs, bool persist = true) {
    return api_.post("/v1/sessions/" + id + "/packages",
                     {{"manager", "pip"},
                      {"packages", pkgs},
                      {"persist", persist},
                      {"find_links", {"/workspace/wheels"}},
                      {"no_index", true}});
  }
  ApiReply npm(const std::string& id, const std::vector<std::string>& pkgs) {
    return api_.post("/v1/sessions/" + id + "/packages", {{"manager", "npm"}, {"packages", pkgs}});
  }
  std::string out(const std::string& id, const std::string& cmd) {
    auto r = api_.sh(id, cmd);
    EXPECT_EQ(r.status, 200) << r;
    return r.body.value("stdout", "") + r.body.value("stderr", "");
  }
  // The check named `name` of a health/repair reply.
  static json check(const ApiReply& r, const std::string& name) {
    for (const auto& c : r.body.value("checks", json::array())) {
      if (c.value("name", "") == name) return c;
    }
    return json();
  }
  std::string file(const std::string& id, const std::string& path) {
    auto r = api_.get(files_target(id, path));
    return r.status == 200 ? r.raw : "<" + std::to_string(r.status) + ">";
  }

  Daemon daemon_;
  Api api_;
};

using PackagesApi = PackagesFixture;

TEST_F(PackagesApi, PipInstallsIntoTheVenvOnPathAndRecordsIt) {
  api_.create("py");
  upload_inputs("py");
  auto r = pip("py", {"tinypkg"});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["exit_code"], 0) << r;
  EXPECT_EQ(r.body["recorded"], json::array({"tinypkg"})) << r;
  EXPECT_FALSE(r.body.contains("error")) << r;

  // `python` is the venv's: /workspace/.venv/bin comes first on PATH (seed 004).
  EXPECT_EQ(out("py", "python -c 'import tinypkg, sys; print(tinypkg.VALUE, sys.prefix)'"),
            "42 /workspace/.venv\n");
  EXPECT_EQ(out("py", "echo $PATH"),
            "/workspace/.venv/bin:/workspace/node_modules/.bin:/usr/local/sbin:/usr/local/bin:"
            "/usr/sbin:/usr/bin:/sbin:/bin\n");
  std::string pyproject = file("py", "/workspace/pyproject.toml");
  EXPECT_NE(pyproject.find("[project]"), std::string::npos) << pyproject;
  EXPECT_NE(pyproject.find("\"tinypkg\","), std::string::npos) << pyproject;
  EXPECT_NE(pyproject.find("find_links = [\"/workspace/wheels\"]"), std::string::npos)
      << pyproject;
  EXPECT_NE(file("py", "/workspace/.workspace_configured").find("Z"), std::string::npos);

  // Without persist: installed, not recorded.
  auto np = pip("py", {"otherpkg"}, false);
  EXPECT_EQ(np.body["exit_code"], 0) << np;
  EXPECT_EQ(np.body["recorded"], json::array());
  EXPECT_EQ(out("py", "python -c 'import otherpkg; print(otherpkg.VALUE)'"), "7\n");
  EXPECT_EQ(file("py", "/workspace/pyproject.toml"), pyproject);

  // The caches are on the /cache tmpfs, not in the workspace (and its quota).
  EXPECT_EQ(out("py", "stat -f -c %T /cache; echo $XDG_CACHE_HOME $PIP_CACHE_DIR "
                      "$npm_config_cache; test -e /workspace/.cache && echo cache-in-workspace"),
            "tmpfs\n/cache /cache/pip /cache/npm\n");
}

TEST_F(PackagesApi, NpmInstallsAPackedTarballWithItsBinOnPath) {
  api_.create("js");
  upload_inputs("js");
  auto r = npm("js", {"/workspace/pkgs/tinynpm-1.0.0.tgz"});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["exit_code"], 0) << r;
  EXPECT_EQ(r.body["recorded"], json::array({"tinynpm@file:pkgs/tinynpm-1.0.0.tgz"})) << r;
  EXPECT_EQ(out("js", "cd /tmp && tinynpm-hello"), "hello from tinynpm\n");
  EXPECT_EQ(out("js", "node -e 'console.log(require(\"tinynpm\"))'"), "7\n");
  auto pj = json::parse(file("js", "/workspace/package.json"), nullptr, false);
  EXPECT_EQ(pj["dependencies"]["tinynpm"], "file:pkgs/tinynpm-1.0.0.tgz") << pj;
}

TEST_F(PackagesApi, BadInputIsRefusedNamingItAndNothingIsHalfWritten) {
  api_.create("bad");
  upload_inputs("bad");
  const std::string p = "/v1/sessions/bad/packages";
  struct Case {
    json body;
    int status;
    std::string names;
  };
  for (const Case& c : std::vector<Case>{
           {{{"manager", "cargo"}, {"packages", {"x"}}}, 400, "cargo"},
           {{{"packages", {"x"}}}, 400, "'manager'"},
           {{{"manager", "pip"}}, 400, "'packages'"},
           {{{"manager", "pip"}, {"packages", json::array()}}, 400, "'packages'"},
           {{{"manager", "pip"}, {"packages", {"ok", "--index-url=http://127.0.0.1:1/"}}},
            400,
            "packages[1]"},
           {{{"manager", "pip"}, {"packages", {"x"}}, {"persist", "yes"}}, 400, "'persist'"},
           {{{"manager", "npm"}, {"packages", {"x"}}, {"find_links", {"/w"}}}, 400, "pip"},
       }) {
    auto r = api_.post(p, c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r;
    EXPECT_NE(r.raw.find(c.names), std::string::npos) << c.body << " -> " << r;
  }
  EXPECT_EQ(api_.post("/v1/sessions/nope/packages", {{"manager", "pip"}, {"packages", {"x"}}})
                .status,
            404);

  // A package that does not exist: the install fails naming it; no venv, no manifest, no marker.
  auto r = pip("bad", {"nosuchpkg"});
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_NE(r.body["exit_code"], 0) << r;
  EXPECT_EQ(r.body["recorded"], json::array());
  EXPECT_NE(r.body.value("error", "").find("nosuchpkg"), std::string::npos) << r;
  EXPECT_NE(r.body.value("stderr", "").find("nosuchpkg"), std::string::npos) << r;
  EXPECT_EQ(out("bad", "ls -A /workspace"), "pkgs\nwheels\n");

  // After a good install, a bad one changes nothing recorded.
  ASSERT_EQ(pip("bad", {"tinypkg"}).body["exit_code"], 0);
  const std::string pyproject = file("bad", "/workspace/pyproject.toml");
  auto again = pip("bad", {"otherpkg", "nosuchpkg"});
  EXPECT_NE(again.body["exit_code"], 0) << again;
  EXPECT_NE(again.body.value("error", "").find("otherpkg, nosuchpkg"), std::string::npos) << again;
  EXPECT_EQ(file("bad", "/workspace/pyproject.toml"), pyproject);
  EXPECT_EQ(out("bad", "python -c 'import tinypkg; print(tinypkg.VALUE)'"), "42\n");

  // npm: a tarball that is not there.
  auto n = npm("bad", {"/workspace/pkgs/nope-1.0.0.tgz"});
  ASSERT_EQ(n.status, 200) << n;
  EXPECT_NE(n.body["exit_code"], 0) << n;
  EXPECT_NE(n.body.value("error", "").find("nope-1.0.0.tgz"), std::string::npos) << n;
  EXPECT_EQ(file("bad", "/workspace/package.json"), "<404>");

  // A manifest that cannot be read stops a persisting install before anything runs.
  ASSERT_EQ(api_.put(files_target("bad", "/workspace/pyproject.toml"), "[project\n").status, 200);
  auto m = pip("bad", {"otherpkg"});
  EXPECT_EQ(m.status, 400) << m;
  EXPECT_NE(m.raw.find("pyproject.toml line 1"), std::string::npos) << m;
  EXPECT_EQ(out("bad", "python -c 'import otherpkg' 2>&1 | tail -1"),
            "ModuleNotFoundError: No module named 'otherpkg'\n");
}

TEST_F(PackagesApi, CliInstall) {
  api_.create("cli");
  upload_inputs("cli");
  const std::string bin = std::string(std::getenv("AGENTBOX_BIN_DIR")) + "/agentbox";
  const std::string base = bin + " --server " + daemon_.url() + " install cli ";
  std::string outp = daemon_.temp_dir() + "/cli.out";
  int rc = std::system((base + "pip tinypkg --find-links /workspace/wheels --no-index > " + outp +
                        " 2>&1")
                           .c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0) << read_host_file(outp);
  EXPECT_NE(read_host_file(outp).find("recorded in the workspace manifest: tinypkg"),
            std::string::npos)
      << read_host_file(outp);
  rc = std::system((base + "cargo x > " + outp + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2) << read_host_file(outp);
  rc = std::system((base + "pip nosuchpkg --find-links /workspace/wheels --no-index > " + outp +
                    " 2>&1")
                       .c_str());
  EXPECT_NE(WEXITSTATUS(rc), 0);
  EXPECT_NE(read_host_file(outp).find("agentbox: pip install of nosuchpkg failed"),
            std::string::npos)
      << read_host_file(outp);
}

using HealthApi = PackagesFixture;

TEST_F(HealthApi, ANewSessionIsHealthy) {
  api_.create("h0");
  auto h = api_.post("/v1/sessions/h0/health", json::object());
  ASSERT_EQ(h.status, 200) << h;
  EXPECT_EQ(h.body["healthy"], true) << h;
  std::vector<std::string> names;
  for (const auto& c : h.body["checks"]) names.push_back(c["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"box", "workspace", "disk", "marker"})) << h;
  EXPECT_EQ(api_.post("/v1/sessions/nope/health", json::object()).status, 404);
  EXPECT_EQ(api_.post("/v1/sessions/nope/repair", json::object()).status, 404);
}

TEST_F(HealthApi, DeletedVenvIsDetectedAndRepairKeepsPersistedPackages) {
  api_.create("hv");
  upload_inputs("hv");
  ASSERT_EQ(pip("hv", {"tinypkg"}).body["exit_code"], 0);
  ASSERT_EQ(pip("hv", {"otherpkg"}, /*persist=*/false).body["exit_code"], 0);
  auto h = api_.post("/v1/sessions/hv/health", json::object());
  EXPECT_EQ(h.body["healthy"], true) << h;
  EXPECT_EQ(check(h, "python")["ok"], true) << h;

  // A removed package is noticed too (not only a missing venv).
  out("hv", "rm -rf /workspace/.venv/lib/python3*/site-packages/tinypkg*");
  h = api_.post("/v1/sessions/hv/health", json::object());
  EXPECT_EQ(h.body["healthy"], false) << h;
  EXPECT_EQ(check(h, "python")["detail"], "not installed: tinypkg") << h;

  out("hv", "rm -rf /workspace/.venv");
  h = api_.post("/v1/sessions/hv/health", json::object());
  ASSERT_EQ(h.status, 200) << h;
  EXPECT_EQ(h.body["healthy"], false) << h;
  EXPECT_EQ(check(h, "python")["ok"], false) << h;
  EXPECT_NE(check(h, "python")["detail"].get<std::string>().find("/workspace/.venv"),
            std::string::npos)
      << h;

  auto r = api_.post("/v1/sessions/hv/repair", json::object());
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["healthy"], true) << r;
  EXPECT_EQ(check(r, "python")["repaired"], true) << r;
  EXPECT_EQ(check(r, "python")["repair_detail"], "reinstalled from pyproject.toml") << r;
  // The persisted package is back; the one installed without persist is not.
  EXPECT_EQ(out("hv", "python -c 'import tinypkg; print(tinypkg.VALUE)'"), "42\n");
  EXPECT_EQ(out("hv", "python -c 'import otherpkg' 2>&1 | tail -1"),
            "ModuleNotFoundError: No module named 'otherpkg'\n");
}

TEST_F(HealthApi, MissingNodeModulesAndMarkerAreRepaired) {
  api_.create("hn");
  upload_inputs("hn");
  ASSERT_EQ(npm("hn", {"/workspace/pkgs/tinynpm-1.0.0.tgz"}).body["exit_code"], 0);
  out("hn", "rm -rf /workspace/node_modules /workspace/.workspace_configured");
  auto h = api_.post("/v1/sessions/hn/health", json::object());
  EXPECT_EQ(h.body["healthy"], false) << h;
  EXPECT_EQ(check(h, "node")["detail"], "not in /workspace/node_modules: tinynpm") << h;
  EXPECT_EQ(check(h, "marker")["detail"], "/workspace/.workspace_configured is missing") << h;
  auto r = api_.post("/v1/sessions/hn/repair", json::object());
  EXPECT_EQ(r.body["healthy"], true) << r;
  EXPECT_EQ(check(r, "node")["repaired"], true) << r;
  EXPECT_EQ(check(r, "marker")["repaired"], true) << r;
  EXPECT_EQ(out("hn", "tinynpm-hello"), "hello from tinynpm\n");
}

TEST_F(HealthApi, ARepairThatCannotInstallSaysWhyAndWritesNoMarker) {
  api_.create("hf");
  upload_inputs("hf");
  ASSERT_EQ(pip("hf", {"tinypkg"}).body["exit_code"], 0);
  out("hf", "rm -rf /workspace/.venv /workspace/wheels /workspace/.workspace_configured");
  auto r = api_.post("/v1/sessions/hf/repair", json::object());
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["healthy"], false) << r;
  EXPECT_EQ(check(r, "python")["repaired"], false) << r;
  EXPECT_NE(check(r, "python")["repair_detail"].get<std::string>().find(
                "pip install from the manifest failed"),
            std::string::npos)
      << r;
  EXPECT_EQ(check(r, "marker")["repair_detail"], "not written: the python repair failed") << r;
  EXPECT_EQ(file("hf", "/workspace/.workspace_configured"), "<404>");
  EXPECT_EQ(out("hf", "test -e /workspace/.venv || echo gone"), "gone\n");
}

TEST_F(HealthApi, DiskAtNinetyFivePercentFails) {
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "hd"}, {"limits", {{"disk_mb", 64}}}}).status, 201);
  auto h = api_.post("/v1/sessions/hd/health", json::object());
  EXPECT_EQ(check(h, "disk")["ok"], true) << h;
  // Fill the session's own disk (a file per MiB until it is full).
  out("hd", "i=0; while head -c 1048576 /dev/zero > /workspace/f$i 2>/dev/null; do "
            "i=$((i+1)); done; true");
  h = api_.post("/v1/sessions/hd/health", json::object());
  EXPECT_EQ(h.body["healthy"], false) << h;
  EXPECT_EQ(check(h, "disk")["ok"], false) << h;
  EXPECT_NE(check(h, "disk")["detail"].get<std::string>().find("raise limits.disk_mb"),
            std::string::npos)
      << h;
}

class HealthAutoRepair : public PackagesFixture {
 protected:
  HealthAutoRepair() : PackagesFixture({"--backend", "ns", "--auto-repair"}) {}
};

// The repair finishes before the resume's first command runs: that command already sees the
// repaired workspace, whether the resume was asked for or came with the command itself.
TEST_F(HealthAutoRepair, ResumeRepairsADeletedVenvBeforeTheFirstCommand) {
  api_.create("ar");
  upload_inputs("ar");
  ASSERT_EQ(pip("ar", {"tinypkg"}).body["exit_code"], 0);
  const std::string probe =
      "test -f /workspace/.venv/lib/python3*/site-packages/tinypkg/__init__.py && echo yes";
  out("ar", "rm -rf /workspace/.venv");
  ASSERT_EQ(api_.post("/v1/sessions/ar/suspend", json::object()).status, 200);
  ASSERT_EQ(api_.post("/v1/sessions/ar/resume", json::object()).status, 200);
  EXPECT_EQ(api_.sh("ar", probe).body.value("stdout", ""), "yes\n");
  EXPECT_NE(daemon_.log().find("auto_repair on resume: healthy"), std::string::npos)
      << daemon_.log();

  // Resumed by the command itself (an exec of a suspended session).
  out("ar", "rm -rf /workspace/.venv");
  ASSERT_EQ(api_.post("/v1/sessions/ar/suspend", json::object()).status, 200);
  auto x = api_.sh("ar", probe);
  EXPECT_EQ(x.body.value("stdout", ""), "yes\n") << x;
}

}  // namespace
}  // namespace agentbox::testing
