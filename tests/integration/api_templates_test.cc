// Templates, builds, snapshots and sessions on them (API.md "Templates, snapshots, health,
// packages"; SECURITY.md T9), against the real daemon on the ns backend: real boxes build the
// snapshots, real overlayfs mounts give each session its copy-on-write workspace.
//
// Every daemon here picks the ns backend itself, so the suite is left out of the "ns/" re-run.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;

const char kBase[] = R"(name: base
version: "1.0"
description: a small template
files:
  hello.txt: "hello from the template\n"
  src/app.py: "print('app')\n"
setup:
  - echo built > built.txt
  - mkdir -p data && seq 1 100 > data/numbers
  - echo "setup says hi"
env:
  GREETING: hi
)";

// kBase with `line` added as the last setup line.
std::string with_setup_line(const std::string& yaml, const std::string& line) {
  const std::string last = "  - echo \"setup says hi\"\n";
  std::string out = yaml;
  out.replace(out.find(last), last.size(), last + "  - " + line + "\n");
  return out;
}

// Host processes whose command line is exactly `argv` (a box's processes are host processes too).
int processes_running(const std::vector<std::string>& argv) {
  std::string want;
  for (const auto& a : argv) want += a + '\0';
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (cmd == want) ++n;
  }
  return n;
}

// The entries of a directory, by name.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

class TemplatesApi : public ::testing::Test {
 protected:
  ApiReply push(const std::string& yaml) {
    return api_.call("POST", "/v1/templates", yaml, "application/yaml");
  }
  ApiReply build(const std::string& name) {
    return api_.call("POST", "/v1/templates/" + name + "/build?wait=true", "{}");
  }
  std::string out(const std::string& session, const std::string& cmd) {
    auto r = api_.exec(session, {{"command", cmd}});
    EXPECT_EQ(r.status, 200) << r;
    return r.body.value("stdout", "");
  }
  // Mounts of this daemon's data dir still in /proc/mounts.
  int mounts_under(const std::string& dir) {
    std::string all = read_host_file("/proc/mounts");
    int n = 0;
    for (std::size_t p = all.find(dir); p != std::string::npos; p = all.find(dir, p + 1)) ++n;
    return n;
  }

  Daemon daemon_{{"--backend", "ns"}};
  Api api_{daemon_};
};

TEST_F(TemplatesApi, UploadValidatesNamesTheLineAndWarnsAboutUnknownKeys) {
  auto bad = push("name: x\nfiles: [1, 2\n");
  EXPECT_EQ(bad.status, 400) << bad;
  EXPECT_NE(bad.message().find("line"), std::string::npos) << bad;

  auto wrong = push("name: x\n\npython:\n  dependencies: 3\n");
  EXPECT_EQ(wrong.status, 400) << wrong;
  EXPECT_NE(wrong.message().find("line 4"), std::string::npos) << wrong;
  EXPECT_NE(wrong.message().find("python.dependencies"), std::string::npos) << wrong;

  for (const char* path : {"../escape", "/etc/passwd", "a/../../b", "./a"}) {
    auto esc = push(std::string("name: x\nfiles:\n  \"") + path + "\": boom\n");
    EXPECT_EQ(esc.status, 400) << path << " " << esc;
    EXPECT_NE(esc.message().find("files."), std::string::npos) << esc;
  }
  auto noname = push("description: nameless\n");
  EXPECT_EQ(noname.status, 400) << noname;
  EXPECT_NE(noname.message().find("name"), std::string::npos) << noname;

  auto ok = push("name: warned\nfrobnicate: yes\nsystem:\n  shell: /bin/sh\n  editor: nano\n");
  ASSERT_EQ(ok.status, 201) << ok;
  ASSERT_EQ(ok.body["warnings"].size(), 2u) << ok;
  EXPECT_NE(ok.body["warnings"][0].get<std::string>().find("frobnicate"), std::string::npos);
  EXPECT_NE(ok.body["warnings"][1].get<std::string>().find("system.editor"), std::string::npos);

  EXPECT_EQ(push(kBase).status, 201);
  EXPECT_EQ(push(kBase).status, 200) << "a second upload replaces";
  auto list = api_.get("/v1/templates");
  ASSERT_EQ(list.status, 200) << list;
  ASSERT_EQ(list.body["templates"].size(), 2u) << list;
  auto one = api_.get("/v1/templates/base");
  ASSERT_EQ(one.status, 200) << one;
  EXPECT_EQ(one.body["description"], "a small template");
  EXPECT_TRUE(one.body["current_version"].is_null()) << "never built";
  EXPECT_EQ(api_.get("/v1/templates/nope").status, 404);

  // A session on a template that was never built: 409; on none at all: 404.
  auto unbuilt = api_.post("/v1/sessions", {{"id", "s"}, {"template", "base"}});
  EXPECT_EQ(unbuilt.status, 409) << unbuilt;
  auto unknown = api_.post("/v1/sessions", {{"id", "s"}, {"template", "nope"}});
  EXPECT_EQ(unknown.status, 404) << unknown;
  EXPECT_EQ(api_.get("/v1/sessions/s").status, 404) << "nothing half-made";

  EXPECT_EQ(api_.del("/v1/templates/warned").status, 200);
  EXPECT_EQ(api_.get("/v1/templates/warned").status, 404);
  EXPECT_EQ(api_.del("/v1/templates/warned").status, 404);
}

TEST_F(TemplatesApi, BuildsMakeVersionsAFailedBuildKeepsTheCurrentOneAndRollbackWorks) {
  ASSERT_EQ(push(kBase).status, 201);
  auto b1 = build("base");
  ASSERT_EQ(b1.status, 201) << b1;
  EXPECT_EQ(b1.body["state"], "succeeded") << b1;
  EXPECT_EQ(b1.body["snapshot"]["version"], 1) << b1;
  std::string snap1 = b1.body["snapshot"]["id"];
  EXPECT_EQ(snap1.size(), 64u);
  EXPECT_TRUE(fs::is_directory(daemon_.data_dir() + "/snapshots/" + snap1));

  // Its log: the steps and the setup's own output.
  std::string id = b1.body["build_id"];
  auto log = api_.get("/v1/templates/base/builds/" + id + "/log");
  ASSERT_EQ(log.status, 200) << log;
  EXPECT_NE(log.raw.find("setup says hi"), std::string::npos) << log.raw;
  EXPECT_NE(log.raw.find("setup[1]"), std::string::npos) << log.raw;
  auto info = api_.get("/v1/templates/base/builds/" + id);
  EXPECT_EQ(info.body["state"], "succeeded") << info;
  EXPECT_EQ(info.body["exit_code"], 0) << info;

  // A setup line that fails: the build says which, no new version, v1 still current.
  std::string failing = kBase;
  failing.replace(failing.find("setup:\n"), 7, "setup:\n  - touch should_not_be_seen\n");
  const std::string last = "  - echo \"setup says hi\"\n";
  failing.replace(failing.find(last), last.size(), last + "  - echo about to fail; exit 3\n");
  ASSERT_EQ(push(failing).status, 200);
  auto bad = build("base");
  EXPECT_EQ(bad.status, 422) << bad;
  EXPECT_EQ(bad.body["state"], "failed") << bad;
  EXPECT_EQ(bad.body["exit_code"], 3) << bad;
  EXPECT_NE(bad.body["error"]["message"].get<std::string>().find("setup[4]"), std::string::npos)
      << bad;
  auto snaps = api_.get("/v1/templates/base/snapshots");
  ASSERT_EQ(snaps.body["snapshots"].size(), 1u) << snaps;
  EXPECT_EQ(snaps.body["snapshots"][0]["current"], true);
  EXPECT_TRUE(fs::is_empty(daemon_.data_dir() + "/builds")) << "no half-made build left";
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "after-fail"}, {"template", "base"}}).status, 201);
  EXPECT_EQ(out("after-fail", "cat built.txt; ls should_not_be_seen 2>&1 | grep -c 'No such'"),
            "built\n1\n");

  // v2 with other content, then a rollback to v1 for new sessions.
  std::string v2 = kBase;
  v2.replace(v2.find("echo built"), 10, "echo rebuilt");
  ASSERT_EQ(push(v2).status, 200);
  auto b2 = build("base");
  ASSERT_EQ(b2.status, 201) << b2;
  EXPECT_EQ(b2.body["snapshot"]["version"], 2);
  EXPECT_NE(b2.body["snapshot"]["id"], snap1);
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "on2"}, {"template", "base"}}).status, 201);
  EXPECT_EQ(out("on2", "cat built.txt"), "rebuilt\n");

  auto rb = api_.post("/v1/templates/base/rollback", {{"version", 1}});
  ASSERT_EQ(rb.status, 200) << rb;
  EXPECT_EQ(rb.body["current_version"], 1);
  EXPECT_EQ(api_.post("/v1/templates/base/rollback", {{"version", 9}}).status, 404);
  auto s1 = api_.post("/v1/sessions", {{"id", "on1"}, {"template", "base"}});
  ASSERT_EQ(s1.status, 201) << s1;
  EXPECT_EQ(s1.body["snapshot"]["version"], 1) << s1;
  EXPECT_EQ(out("on1", "cat built.txt"), "built\n");
  EXPECT_EQ(out("on2", "cat built.txt"), "rebuilt\n") << "sessions keep their snapshot";
  auto pinned = api_.post("/v1/sessions", {{"id", "pinned"}, {"template", "base@2"}});
  ASSERT_EQ(pinned.status, 201) << pinned;
  EXPECT_EQ(out("pinned", "cat built.txt"), "rebuilt\n");

  // In use: no delete. Unused: deleted, and its snapshots collected.
  EXPECT_EQ(api_.del("/v1/templates/base").status, 409);
  for (const char* s : {"after-fail", "on1", "on2", "pinned"}) {
    EXPECT_EQ(api_.del(std::string("/v1/sessions/") + s).status, 200);
  }
  EXPECT_EQ(api_.del("/v1/templates/base").status, 200);
  EXPECT_TRUE(fs::is_empty(daemon_.data_dir() + "/snapshots"));
  EXPECT_TRUE(fs::is_empty(daemon_.data_dir() + "/layers"));
  EXPECT_EQ(mounts_under(daemon_.data_dir()), 0);
}

TEST_F(TemplatesApi, SessionsWriteOnlyTheirOwnLayerAndNeverSeeEachOthers) {
  ASSERT_EQ(push(kBase).status, 201);
  auto b = build("base");
  ASSERT_EQ(b.status, 201) << b;
  std::string snap = daemon_.data_dir() + "/snapshots/" + b.body["snapshot"]["id"].get<std::string>();
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "a"}, {"template", "base"}}).status, 201);
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "b"}, {"template", "base"}}).status, 201);

  // The session owns what the template made, and may change and delete it.
  EXPECT_EQ(out("a", "cat hello.txt; wc -l < data/numbers; echo $GREETING; id -u; stat -c %u hello.txt")
                .substr(0, 28),
            "hello from the template\n100\n");
  auto w = api_.exec("a", {{"command",
                            "echo mine > hello.txt && rm -r data && mkdir newdir && "
                            "echo x > newdir/f && rm src/app.py"}});
  ASSERT_EQ(w.status, 200) << w;
  ASSERT_EQ(w.body["exit_code"], 0) << w;
  EXPECT_EQ(out("a", "cat hello.txt; ls"), "mine\nbuilt.txt\nhello.txt\nnewdir\nsrc\n");
  // T9: b sees the snapshot as it was; whiteouts of a hide nothing from b.
  EXPECT_EQ(out("b", "cat hello.txt; wc -l < data/numbers; cat src/app.py; ls newdir 2>&1 | grep -c 'No such'"),
            "hello from the template\n100\nprint('app')\n1\n");
  // The snapshot on disk is untouched.
  EXPECT_EQ(read_host_file(snap + "/hello.txt"), "hello from the template\n");
  EXPECT_TRUE(fs::exists(snap + "/data/numbers"));
  // The files API sees the merged view too.
  auto f = api_.get("/v1/sessions/b/files?path=/workspace/src/app.py");
  EXPECT_EQ(f.status, 200) << f;
  EXPECT_EQ(f.raw, "print('app')\n");

  // A symlink planted in a session points inside its own box, never at the host.
  auto l = api_.exec("a", {{"command", "ln -s /etc/hostname link && cat link >/dev/null; echo $?"}});
  EXPECT_EQ(l.body["stdout"], "0\n") << l;

  // Disk used per session: only its own writes live in its layer.
  std::uintmax_t layer_bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(daemon_.data_dir() + "/layers/b")) {
    if (e.is_regular_file()) layer_bytes += e.file_size();
  }
  EXPECT_EQ(layer_bytes, 0u) << "b wrote nothing";
}

TEST(TemplatesRestart, OverlaySurvivesSuspendResumeRestartAndArchiveHoldsTheMergedView) {
  TempDir dir("agentbox-tmpl");
  const std::string data = dir.path() + "/data";
  fs::create_directories(data);
  {
    Daemon d({"--backend", "ns", "--data-dir", data});
    Api api(d);
    ASSERT_EQ(api.call("POST", "/v1/templates", kBase, "application/yaml").status, 201);
    ASSERT_EQ(api.call("POST", "/v1/templates/base/build?wait=true", "{}").status, 201);
    ASSERT_EQ(api.post("/v1/sessions", {{"id", "p"}, {"template", "base"}}).status, 201);
    auto w = api.exec("p", {{"command", "echo kept > mine.txt && rm hello.txt"}});
    ASSERT_EQ(w.body["exit_code"], 0) << w;
    ASSERT_EQ(api.post("/v1/sessions/p/suspend", json::object()).status, 200);
    ASSERT_EQ(api.post("/v1/sessions/p/resume", json::object()).status, 200);
    auto r = api.exec("p", {{"command", "cat mine.txt built.txt; ls hello.txt 2>&1 | grep -c 'No such'"}});
    EXPECT_EQ(r.body["stdout"], "kept\nbuilt\n1\n") << r;
  }
  EXPECT_EQ(read_host_file("/proc/mounts").find(data), std::string::npos)
      << "a clean exit leaves no overlay mounted";
  {
    Daemon d({"--backend", "ns", "--data-dir", data});
    Api api(d);
    auto r = api.exec("p", {{"command", "cat mine.txt built.txt; ls hello.txt 2>&1 | grep -c 'No such'"}});
    EXPECT_EQ(r.body["stdout"], "kept\nbuilt\n1\n") << r;
    auto t = api.get("/v1/templates/base");
    EXPECT_EQ(t.body["current_version"], 1) << t;
    // Suspended after the restart, then archived: the archive has the merged view.
    ASSERT_EQ(api.post("/v1/sessions/p/suspend", json::object()).status, 200);
    auto del = api.del("/v1/sessions/p?archive=true");
    ASSERT_EQ(del.status, 200) << del;
    std::string archive = del.body["archive"];
    auto restored = api.post("/v1/sessions/q/restore", {{"archive", archive}});
    ASSERT_EQ(restored.status, 201) << restored;
    auto q = api.exec("q", {{"command", "cat mine.txt built.txt src/app.py; ls hello.txt 2>&1 | grep -c 'No such'"}});
    EXPECT_EQ(q.body["stdout"], "kept\nbuilt\nprint('app')\n1\n") << q;
    EXPECT_EQ(api.del("/v1/sessions/q").status, 200);
  }
  EXPECT_EQ(read_host_file("/proc/mounts").find(data), std::string::npos);
}

// limits.disk_mb on a templated session caps its own layer (upper + work), not the snapshot:
// the template's files are there, 4 MiB fit, 32 MiB hit ENOSPC; the cap survives suspend/resume
// and a daemon restart, and a destroy leaves no mount and no image behind.
TEST(TemplatesQuota, ATemplatedSessionsWritesAreCappedAtDiskMbAndTheSnapshotDoesNotCount) {
  TempDir dir("agentbox-tmplq");
  const std::string data = dir.path() + "/data";
  fs::create_directories(data);
  const std::string big = "dd if=/dev/zero of=big bs=1M count=32 2>&1; echo rc=$?";
  {
    Daemon d({"--backend", "ns", "--data-dir", data});
    Api api(d);
    ASSERT_EQ(api.call("POST", "/v1/templates", kBase, "application/yaml").status, 201);
    auto b = api.call("POST", "/v1/templates/base/build?wait=true", "{}");
    ASSERT_EQ(b.status, 201) << b;
    const std::string snap = data + "/snapshots/" + b.body["snapshot"]["id"].get<std::string>();
    auto c = api.post("/v1/sessions",
                      {{"id", "cap"}, {"template", "base"}, {"limits", {{"disk_mb", 16}}}});
    ASSERT_EQ(c.status, 201) << c;
    auto seen = api.exec("cap", {{"command", "cat hello.txt built.txt; wc -l < data/numbers"}});
    EXPECT_EQ(seen.body["stdout"], "hello from the template\nbuilt\n100\n") << seen;
    auto small = api.exec("cap", {{"command", "dd if=/dev/zero of=four bs=1M count=4 2>/dev/null && sync"}});
    EXPECT_EQ(small.body["exit_code"], 0) << small;
    auto full = api.exec("cap", {{"command", big}});
    EXPECT_NE(full.body.value("stdout", "").find("No space left"), std::string::npos) << full;
    EXPECT_EQ(full.body.value("stdout", "").find("rc=0"), std::string::npos) << full;
    // The snapshot on the host is untouched.
    EXPECT_TRUE(fs::exists(snap + "/hello.txt"));
    EXPECT_FALSE(fs::exists(snap + "/four"));
    ASSERT_EQ(api.post("/v1/sessions/cap/suspend", json::object()).status, 200);
    ASSERT_EQ(api.post("/v1/sessions/cap/resume", json::object()).status, 200);
    auto again = api.exec("cap", {{"command", "rm -f big; stat -c %s four; cat hello.txt; " + big}});
    EXPECT_NE(again.body.value("stdout", "").find("4194304\nhello from the template\n"),
              std::string::npos) << again;
    EXPECT_NE(again.body.value("stdout", "").find("No space left"), std::string::npos) << again;
  }
  EXPECT_EQ(read_host_file("/proc/mounts").find(data), std::string::npos)
      << "a clean exit leaves neither the overlay nor the layer's disk mounted";
  {
    Daemon d({"--backend", "ns", "--data-dir", data});
    Api api(d);
    auto r = api.exec("cap", {{"command", "rm -f big; stat -c %s four; " + big}});
    EXPECT_NE(r.body.value("stdout", "").find("4194304\n"), std::string::npos) << r;
    EXPECT_NE(r.body.value("stdout", "").find("No space left"), std::string::npos) << r;
    auto del = api.del("/v1/sessions/cap");
    EXPECT_EQ(del.status, 200) << del;
    EXPECT_EQ(read_host_file("/proc/mounts").find(data), std::string::npos)
        << "a destroy leaves no mount";
    EXPECT_FALSE(fs::exists(data + "/layers/cap"));
    EXPECT_FALSE(fs::exists(data + "/layers/cap.img"));
  }
}

// Seed 004's dependencies from a local index the test makes (a hand-made wheel, an `npm pack`
// tarball), visible read-only in the build box through the config's readonly_dirs; never a
// registry.
TEST(TemplatesDeps, PythonAndNodeDependenciesFromALocalIndexAreInTheSnapshot) {
  TempDir dir("agentbox-tmpl-deps");
  const std::string d = dir.path();
  // The build user (not root) reads the local index through the read-only bind.
  ASSERT_EQ(::chmod(d.c_str(), 0755), 0);
  ASSERT_EQ(std::system(("cd " + d + " && /usr/bin/python3 - <<'PY'\n"
                         "import zipfile\n"
                         "w = zipfile.ZipFile('tinypkg-0.1-py3-none-any.whl', 'w')\n"
                         "w.writestr('tinypkg/__init__.py', 'VALUE = 42\\n')\n"
                         "w.writestr('tinypkg-0.1.dist-info/METADATA', 'Metadata-Version: 2.1\\n"
                         "Name: tinypkg\\nVersion: 0.1\\n')\n"
                         "w.writestr('tinypkg-0.1.dist-info/WHEEL', 'Wheel-Version: 1.0\\n"
                         "Generator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n"
                         "w.writestr('tinypkg-0.1.dist-info/RECORD', '')\n"
                         "w.close()\n"
                         "PY").c_str()),
            0);
  ASSERT_EQ(std::system(("mkdir -p " + d + "/tinynpm && cd " + d + "/tinynpm && "
                         "printf '%s' '{\"name\":\"tinynpm\",\"version\":\"1.0.0\","
                         "\"main\":\"index.js\"}' > package.json && "
                         "echo 'module.exports = 7;' > index.js && "
                         "npm pack --silent --pack-destination " + d + " >/dev/null 2>&1")
                            .c_str()),
            0);
  {
    std::ofstream(d + "/config.yaml") << "readonly_dirs:\n  - " << d << "\n";
  }
  Daemon daemon({"--backend", "ns", "--config", d + "/config.yaml"});
  Api api(daemon);
  std::string yaml = "name: deps\npython:\n  dependencies: [tinypkg]\n  find_links: [" + d +
                     "]\nnodejs:\n  dependencies:\n    tinynpm: " + d +
                     "/tinynpm-1.0.0.tgz\nsetup:\n  - test -d .venv && test -d node_modules\n";
  ASSERT_EQ(api.call("POST", "/v1/templates", yaml, "application/yaml").status, 201);
  auto b = api.call("POST", "/v1/templates/deps/build?wait=true", "{}");
  ASSERT_EQ(b.status, 201) << b << api.get("/v1/templates/deps/builds/" + b.body.value("build_id", "") + "/log").raw;
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "d"}, {"template", "deps"}}).status, 201);
  auto r = api.exec("d", {{"command",
                           ".venv/bin/python -c 'import tinypkg; print(tinypkg.VALUE)' && "
                           "node -e 'console.log(require(\"tinynpm\"))' && "
                           "grep -c tinypkg pyproject.toml && grep -c tinynpm package.json && "
                           "cat .workspace_configured >/dev/null && echo marked"}});
  EXPECT_EQ(r.body["stdout"], "42\n7\n1\n1\nmarked\n") << r;

  // A dependency that does not exist: the build fails naming the step, nothing new is current.
  std::string bad = yaml;
  bad.replace(bad.find("[tinypkg]"), 9, "[tinypkg, nosuchpkg]");
  ASSERT_EQ(api.call("POST", "/v1/templates", bad, "application/yaml").status, 200);
  auto f = api.call("POST", "/v1/templates/deps/build?wait=true", "{}");
  EXPECT_EQ(f.status, 422) << f;
  EXPECT_NE(f.body["error"]["message"].get<std::string>().find("python.dependencies"),
            std::string::npos)
      << f;
  EXPECT_EQ(api.get("/v1/templates/deps").body["current_version"], 1);
  EXPECT_EQ(api.del("/v1/sessions/d").status, 200);
}

// The issue's "Bad input and faults": a build the daemon dies in (kill -9) never becomes a
// version; after the restart the previous one is current and serves new sessions, nothing of
// the killed build is left (its workspace, its processes), and the next build works.
TEST(TemplatesRestart, ABuildKilledWithTheDaemonLeavesThePreviousVersionCurrentAndNothingHalfMade) {
  TempDir dir("agentbox-tmpl-kill");
  const std::string data = dir.path() + "/data";
  fs::create_directories(data);
  const std::vector<std::string> sleeper = {"sleep", "37"};
  std::string snap1, killed_build;
  {
    Daemon d({"--backend", "ns", "--data-dir", data});
    Api api(d);
    ASSERT_EQ(api.call("POST", "/v1/templates", kBase, "application/yaml").status, 201);
    auto b1 = api.call("POST", "/v1/templates/base/build?wait=true", "{}");
    ASSERT_EQ(b1.status, 201) << b1;
    snap1 = b1.body["snapshot"]["id"];
    ASSERT_EQ(api.call("POST", "/v1/templates",
                       with_setup_line(kBase, "echo half > half.txt && sleep 37"),
                       "application/yaml")
                  .status,
              200);
    auto started = api.call("POST", "/v1/templates/base/build", "{}");
    ASSERT_EQ(started.status, 202) << started;
    killed_build = started.body["build_id"];
    // Midway: the last setup line runs (the workspace is half-made) when the daemon dies.
    bool midway = false;
    for (int i = 0; i < 300 && !midway; ++i) {
      auto b = api.get("/v1/templates/base/builds/" + killed_build);
      ASSERT_EQ(b.body["state"], "running") << b << "\ndaemon log:\n" << d.log();
      midway = b.body["step"].get<std::string>().find("sleep 37") != std::string::npos &&
               processes_running(sleeper) == 1;
      if (!midway) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(midway) << api.get("/v1/templates/base/builds/" + killed_build);
    ASSERT_FALSE(fs::is_empty(data + "/builds"));
    EXPECT_EQ(d.stop(SIGKILL), 128 + SIGKILL);
  }
  {
    Daemon d({"--backend", "ns", "--data-dir", data});
    Api api(d);
    EXPECT_TRUE(fs::is_empty(data + "/builds")) << "the killed build's workspace is removed";
    EXPECT_EQ(entries(data + "/snapshots"), std::vector<std::string>{snap1})
        << "no half-made snapshot on disk";
    auto t = api.get("/v1/templates/base");
    ASSERT_EQ(t.status, 200) << t;
    EXPECT_EQ(t.body["current_version"], 1) << t;
    ASSERT_EQ(t.body["snapshots"].size(), 1u) << t;
    EXPECT_EQ(t.body["snapshots"][0]["id"], snap1);
    // Its record survives the restart: failed, saying the daemon stopped during it.
    auto gone = api.get("/v1/templates/base/builds/" + killed_build);
    EXPECT_EQ(gone.status, 200) << gone;
    EXPECT_EQ(gone.body["state"], "failed") << "a build that died with the daemon is not running"
                                            << gone;
    EXPECT_NE(gone.raw.find("the daemon stopped during the build"), std::string::npos) << gone;
    // The killed build's processes died with it.
    for (int i = 0; i < 100 && processes_running(sleeper) > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(processes_running(sleeper), 0);

    ASSERT_EQ(api.post("/v1/sessions", {{"id", "after-kill"}, {"template", "base"}}).status, 201);
    auto r = api.sh("after-kill", "cat built.txt; ls half.txt 2>&1 | grep -c 'No such'");
    EXPECT_EQ(r.body["stdout"], "built\n1\n") << r;

    // The next build works and becomes version 2.
    std::string v2 = kBase;
    v2.replace(v2.find("echo built"), 10, "echo rebuilt");
    ASSERT_EQ(api.call("POST", "/v1/templates", v2, "application/yaml").status, 200);
    auto b2 = api.call("POST", "/v1/templates/base/build?wait=true", "{}");
    ASSERT_EQ(b2.status, 201) << b2;
    EXPECT_EQ(b2.body["snapshot"]["version"], 2) << b2;
    ASSERT_EQ(api.post("/v1/sessions", {{"id", "on2"}, {"template", "base"}}).status, 201);
    EXPECT_EQ(api.sh("on2", "cat built.txt").body["stdout"], "rebuilt\n");
    EXPECT_EQ(api.sh("after-kill", "cat built.txt").body["stdout"], "built\n");
    EXPECT_TRUE(fs::is_empty(data + "/builds"));
    EXPECT_EQ(api.del("/v1/sessions/after-kill").status, 200);
    EXPECT_EQ(api.del("/v1/sessions/on2").status, 200);
  }
  EXPECT_EQ(read_host_file("/proc/mounts").find(data), std::string::npos);
}

// A daemon stopped (SIGTERM) during a build stops at once, not when the running setup line
// ends: the build fails, its box and workspace go, and the next start has the previous version.
TEST(TemplatesRestart, ADaemonStoppedDuringABuildExitsAtOnceAndKeepsThePreviousVersion) {
  TempDir dir("agentbox-tmpl-term");
  const std::string data = dir.path() + "/data";
  fs::create_directories(data);
  const std::vector<std::string> sleeper = {"sleep", "41"};
  {
    Daemon d({"--backend", "ns", "--data-dir", data});
    Api api(d);
    ASSERT_EQ(api.call("POST", "/v1/templates", kBase, "application/yaml").status, 201);
    ASSERT_EQ(api.call("POST", "/v1/templates/base/build?wait=true", "{}").status, 201);
    ASSERT_EQ(api.call("POST", "/v1/templates", with_setup_line(kBase, "sleep 41"),
                       "application/yaml")
                  .status,
              200);
    auto started = api.call("POST", "/v1/templates/base/build", "{}");
    ASSERT_EQ(started.status, 202) << started;
    for (int i = 0; i < 300 && processes_running(sleeper) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_EQ(processes_running(sleeper), 1) << d.log();
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(d.stop(SIGTERM), 0) << d.log();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10))
        << "the stop waited for the setup line";
    EXPECT_NE(d.log().find("failed: setup[3]"), std::string::npos) << d.log();
    EXPECT_EQ(processes_running(sleeper), 0);
    EXPECT_TRUE(fs::is_empty(data + "/builds"));
  }
  Daemon d({"--backend", "ns", "--data-dir", data});
  Api api(d);
  EXPECT_EQ(api.get("/v1/templates/base").body["current_version"], 1);
  ASSERT_EQ(api.post("/v1/sessions", {{"id", "t"}, {"template", "base"}}).status, 201);
  EXPECT_EQ(api.sh("t", "cat built.txt").body["stdout"], "built\n");
  EXPECT_EQ(api.del("/v1/sessions/t").status, 200);
}

// A quota hit during a build. Its /tmp is capped (limits.tmp_mb): a setup line filling it fails
// the build naming the line, and the previous version stays current (limits.disk_mb, the
// workspace's cap: api_templates_seed_test.cc).
TEST_F(TemplatesApi, AQuotaHitDuringABuildNamesTheStepAndKeepsThePreviousVersion) {
  ASSERT_EQ(push(kBase).status, 201);
  auto b1 = build("base");
  ASSERT_EQ(b1.status, 201) << b1;
  const std::string snap1 = b1.body["snapshot"]["id"];

  ASSERT_EQ(push(with_setup_line(kBase, "head -c 32M /dev/zero > /tmp/big") +
                 "limits:\n  tmp_mb: 8\n")
                .status,
            200);
  auto full = build("base");
  EXPECT_EQ(full.status, 422) << full;
  EXPECT_EQ(full.body["state"], "failed") << full;
  EXPECT_NE(full.body["error"]["message"].get<std::string>().find("setup[3]"), std::string::npos)
      << full;
  auto log = api_.get("/v1/templates/base/builds/" + full.body.value("build_id", "") + "/log");
  EXPECT_NE(log.raw.find("No space left on device"), std::string::npos) << log.raw;
  auto after = api_.get("/v1/templates/base");
  EXPECT_EQ(after.body["current_version"], 1) << after;
  EXPECT_EQ(after.body["snapshots"].size(), 1u) << after;
  EXPECT_EQ(entries(daemon_.data_dir() + "/snapshots"), std::vector<std::string>{snap1});
  EXPECT_TRUE(fs::is_empty(daemon_.data_dir() + "/builds"));
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "q"}, {"template", "base"}}).status, 201);
  EXPECT_EQ(out("q", "cat built.txt"), "built\n");
}

// The template's own `health:` checks run in /health and /repair of its sessions.
TEST_F(TemplatesApi, TemplateHealthChecksRunInHealthAndRepair) {
  const std::string yaml =
      "name: checked\nsetup:\n  - touch ok\nhealth:\n"
      "  - name: x\n    command: 'test -f /workspace/ok'\n    repair: 'touch /workspace/ok'\n"
      "  - name: norepair\n    command: 'test ! -e /workspace/bad'\n";
  ASSERT_EQ(push(yaml).status, 201);
  ASSERT_EQ(build("checked").status, 201);
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "h"}, {"template", "checked"}}).status, 201);
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "plain"}}).status, 201);
  auto check = [](const ApiReply& r, const std::string& name) {
    for (const json& c : r.body.value("checks", json::array())) {
      if (c.value("name", "") == name) return c;
    }
    return json();
  };

  auto h = api_.post("/v1/sessions/h/health", json::object());
  ASSERT_EQ(h.status, 200) << h;
  EXPECT_EQ(h.body["healthy"], true) << h;
  EXPECT_EQ(check(h, "x")["ok"], true) << h;
  EXPECT_EQ(check(h, "norepair")["ok"], true) << h;
  auto p = api_.post("/v1/sessions/plain/health", json::object());
  EXPECT_TRUE(check(p, "x").is_null()) << "only the template's sessions run its checks: " << p;

  ASSERT_EQ(out("h", "rm ok && echo gone"), "gone\n");
  h = api_.post("/v1/sessions/h/health", json::object());
  EXPECT_EQ(h.body["healthy"], false) << h;
  EXPECT_EQ(check(h, "x")["ok"], false) << h;
  EXPECT_EQ(check(h, "norepair")["ok"], true) << h;
  EXPECT_EQ(out("h", "ls ok 2>&1 | grep -c 'No such'"), "1\n") << "health repairs nothing";

  auto r = api_.post("/v1/sessions/h/repair", json::object());
  ASSERT_EQ(r.status, 200) << r;
  EXPECT_EQ(r.body["healthy"], true) << r;
  EXPECT_EQ(check(r, "x")["ok"], true) << r;
  EXPECT_EQ(check(r, "x")["repaired"], true) << r;
  EXPECT_EQ(out("h", "ls ok"), "ok\n");
  h = api_.post("/v1/sessions/h/health", json::object());
  EXPECT_EQ(h.body["healthy"], true) << h;

  // A failing check without a repair step stays failing after /repair.
  ASSERT_EQ(out("h", "touch bad && echo made"), "made\n");
  r = api_.post("/v1/sessions/h/repair", json::object());
  EXPECT_EQ(r.body["healthy"], false) << r;
  EXPECT_EQ(check(r, "norepair")["ok"], false) << r;
  EXPECT_EQ(check(r, "x")["ok"], true) << r;

  // A session runs the checks of the snapshot it started on: a new upload, and its build, change
  // only the sessions made after it.
  ASSERT_EQ(out("h", "rm bad && echo removed"), "removed\n");
  ASSERT_EQ(push("name: checked\nsetup:\n  - touch ok\nhealth:\n"
                 "  - name: y\n    command: 'test -f /workspace/never'\n")
                .status,
            200);
  ASSERT_EQ(build("checked").status, 201);
  h = api_.post("/v1/sessions/h/health", json::object());
  EXPECT_EQ(h.body["healthy"], true) << h;
  EXPECT_EQ(check(h, "x")["ok"], true) << h;
  EXPECT_TRUE(check(h, "y").is_null()) << h;
  ASSERT_EQ(api_.post("/v1/sessions", {{"id", "h2"}, {"template", "checked"}}).status, 201);
  auto h2 = api_.post("/v1/sessions/h2/health", json::object());
  EXPECT_EQ(h2.body["healthy"], false) << h2;
  EXPECT_EQ(check(h2, "y")["ok"], false) << h2;
  EXPECT_TRUE(check(h2, "x").is_null()) << h2;
}

}  // namespace
}  // namespace agentbox::testing
