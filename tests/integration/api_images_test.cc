// Images (API.md "Images") against the real daemon and a real registry: Debian's
// docker-registry on 127.0.0.1 (tests/support/registry.h), images this test builds itself from
// busybox-static and pushes with skopeo. Pull, list, inspect, delete, progress, digest mismatch,
// hostile layers, registry down, basic auth.
//
// Every daemon here picks the ns backend itself, so the suite is left out of the "ns/" re-run.

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "integration/api_test_util.h"
#include "support/registry.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;

constexpr std::uint32_t kLayerIdBase = 1u << 30;  // image/layer.h

std::size_t entries_in(const std::string& dir) {
  std::error_code ec;
  std::size_t n = 0;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); ++it) ++n;
  return n;
}

std::string url_path(const std::string& s) {
  return client::url_encode(s);
}

class ImagesApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new LocalRegistry();
    layouts_ = new TempDir("agentbox-oci");
    TestImage img;
    img.layers.push_back(busybox_rootfs());
    img.layers.push_back({LayerEntry::file("etc/only-in-image", "image file\n")});
    img.env = {"PATH=/bin:/usr/bin", "IMAGE_VAR=from-image"};
    write_oci_layout(*layouts_ / "busybox", img, "1");
    registry_->push(*layouts_ / "busybox", "1", "test/busybox:1");
  }
  static void TearDownTestSuite() {
    delete registry_;
    delete layouts_;
    registry_ = nullptr;
    layouts_ = nullptr;
  }

  // A daemon (ns backend) whose config names the registry as plain HTTP, plus `extra` YAML.
  std::unique_ptr<Daemon> daemon(const std::string& registry_yaml = "") {
    const std::string cfg = dir_ / "config.yaml";
    spit(cfg, "registries:\n" + (registry_yaml.empty()
                                     ? "  \"" + registry_->host() + "\":\n    insecure: true\n"
                                     : registry_yaml));
    return std::make_unique<Daemon>(std::vector<std::string>{"--backend", "ns", "--config", cfg});
  }
  std::string ref(const std::string& repo_tag) const { return registry_->host() + "/" + repo_tag; }

  // Pushes an image of one busybox layer plus `layer` as repo_tag; returns its layout dir.
  std::string push_with(const std::string& name, const std::vector<LayerEntry>& layer) {
    TestImage img;
    img.layers.push_back(busybox_rootfs());
    img.layers.push_back(layer);
    const std::string dir = *layouts_ / name;
    write_oci_layout(dir, img, "1");
    registry_->push(dir, "1", "test/" + name + ":1");
    return dir;
  }

  static LocalRegistry* registry_;
  static TempDir* layouts_;
  TempDir dir_{"agentbox-images-test"};
};
LocalRegistry* ImagesApi::registry_ = nullptr;
TempDir* ImagesApi::layouts_ = nullptr;

TEST_F(ImagesApi, PullListInspectAndDelete) {
  auto d = daemon();
  Api api(*d);
  const std::string r = ref("test/busybox:1");
  auto pulled = api.post("/v1/images", {{"ref", r}});
  ASSERT_EQ(pulled.status, 201) << pulled;
  const std::string digest = pulled.body.value("digest", "");
  EXPECT_TRUE(digest.starts_with("sha256:") && digest.size() == 71) << pulled;
  EXPECT_EQ(pulled.body.value("ref", ""), r);
  ASSERT_EQ(pulled.body["layers"].size(), 2u) << pulled;
  EXPECT_GT(pulled.body.value("size", 0), 100000) << "busybox is in it";
  EXPECT_TRUE(pulled.body.value("platform", "").starts_with("linux/")) << pulled;
  EXPECT_EQ(pulled.body["config"]["env"], json({"PATH=/bin:/usr/bin", "IMAGE_VAR=from-image"}));
  EXPECT_TRUE(is_rfc3339_utc(pulled.body.value("pulled_at", ""))) << pulled;

  // Each layer unpacked once, owned by the shifted ids (never host root), busybox executable.
  const std::string layers = d->data_dir() + "/images/layers";
  EXPECT_EQ(entries_in(layers), 2u);
  const std::string base = layers + "/" + pulled.body["layers"][0].value("diff_id", "").substr(7);
  struct stat st;
  ASSERT_EQ(::lstat((base + "/bin/busybox").c_str(), &st), 0) << base;
  EXPECT_EQ(st.st_uid, kLayerIdBase);
  EXPECT_TRUE(st.st_mode & S_IXUSR);
  ASSERT_EQ(::lstat((base + "/bin/sh").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));

  auto list = api.get("/v1/images");
  ASSERT_EQ(list.status, 200) << list;
  ASSERT_EQ(list.body["images"].size(), 1u) << list;
  EXPECT_EQ(list.body["images"][0].value("digest", ""), digest);

  auto by_ref = api.get("/v1/images/" + url_path(r));
  ASSERT_EQ(by_ref.status, 200) << by_ref;
  EXPECT_EQ(by_ref.body.value("digest", ""), digest);
  auto by_digest = api.get("/v1/images/" + digest);
  ASSERT_EQ(by_digest.status, 200) << by_digest;
  EXPECT_EQ(by_digest.body.value("ref", ""), r);
  EXPECT_EQ(api.get("/v1/images/" + url_path(ref("test/nope:1"))).status, 404);

  // A second pull of the same image stores nothing new.
  auto again = api.post("/v1/images", {{"ref", r}});
  ASSERT_EQ(again.status, 201) << again;
  EXPECT_EQ(again.body.value("digest", ""), digest);
  EXPECT_EQ(entries_in(layers), 2u);

  EXPECT_EQ(api.del("/v1/images/not-a-digest").status, 400);
  auto gone = api.del("/v1/images/" + digest);
  ASSERT_EQ(gone.status, 200) << gone;
  EXPECT_EQ(api.get("/v1/images").body["images"].size(), 0u);
  EXPECT_EQ(entries_in(layers), 0u) << "its layers went with it";
  EXPECT_EQ(api.del("/v1/images/" + digest).status, 404);
  EXPECT_EQ(entries_in(d->data_dir() + "/images/tmp"), 0u);
}

TEST_F(ImagesApi, ALayerSharedByTwoImagesIsStoredOnceAndGoesWithTheLastOfThem) {
  push_with("shared", {LayerEntry::file("etc/second", "2\n")});
  auto d = daemon();
  Api api(*d);
  auto one = api.post("/v1/images", {{"ref", ref("test/busybox:1")}});
  ASSERT_EQ(one.status, 201) << one;
  auto two = api.post("/v1/images", {{"ref", ref("test/shared:1")}});
  ASSERT_EQ(two.status, 201) << two;
  // The busybox base layer is the same blob in both: unpacked once.
  ASSERT_EQ(one.body["layers"][0].value("diff_id", ""), two.body["layers"][0].value("diff_id", ""));
  const std::string layers = d->data_dir() + "/images/layers";
  EXPECT_EQ(entries_in(layers), 3u);
  ASSERT_EQ(api.del("/v1/images/" + one.body.value("digest", "")).status, 200);
  EXPECT_EQ(entries_in(layers), 2u) << "the shared layer stays for the other image";
  auto s = api.post("/v1/sessions", {{"id", "on-two"}, {"image", ref("test/shared:1")}});
  ASSERT_EQ(s.status, 201) << s;
  EXPECT_EQ(api.sh("on-two", "cat /etc/second").body.value("stdout", ""), "2\n");
  ASSERT_EQ(api.del("/v1/sessions/on-two").status, 200);
  ASSERT_EQ(api.del("/v1/images/" + two.body.value("digest", "")).status, 200);
  EXPECT_EQ(entries_in(layers), 0u);
}

TEST_F(ImagesApi, PullStreamsProgressAsNdjson) {
  auto d = daemon();
  Api api(*d);
  auto r = api.call("POST", "/v1/images", json{{"ref", ref("test/busybox:1")}}.dump(),
                    "application/json", {{"Accept", "application/x-ndjson"}});
  ASSERT_EQ(r.status, 200) << r;
  std::istringstream lines(r.raw);
  std::string line;
  std::vector<json> got;
  while (std::getline(lines, line)) got.push_back(json::parse(line));
  ASSERT_EQ(got.size(), 3u) << r.raw;
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(got[i].value("layer", "").starts_with("sha256:")) << got[i];
    EXPECT_EQ(got[i].value("bytes", 0), got[i].value("total", 1)) << got[i];
  }
  EXPECT_TRUE(got[2]["image"].value("digest", "").starts_with("sha256:")) << got[2];
}

TEST_F(ImagesApi, BadReferencesAre400) {
  auto d = daemon();
  Api api(*d);
  EXPECT_EQ(api.post("/v1/images", json::object()).status, 400);
  EXPECT_EQ(api.post("/v1/images", {{"ref", "a b"}}).status, 400);
  EXPECT_EQ(api.post("/v1/images", {{"ref", "-oops"}}).status, 400);
  EXPECT_EQ(api.post("/v1/images", {{"ref", "x/y:1"}, {"extra", 1}}).status, 400);
}

TEST_F(ImagesApi, ABlobThatDoesNotMatchItsDigestIs422AndNothingIsStored) {
  TestImage img;
  img.layers.push_back(busybox_rootfs("corrupt"));
  const std::string dir = *layouts_ / "corrupt";
  write_oci_layout(dir, img, "1");
  registry_->push(dir, "1", "test/corrupt:1");
  // The layer blob as the registry stores it, one byte changed (same length).
  std::string blob_digest;
  for (const auto& e : fs::directory_iterator(dir + "/blobs/sha256")) {
    if (fs::file_size(e.path()) > 100000) blob_digest = "sha256:" + e.path().filename().string();
  }
  ASSERT_FALSE(blob_digest.empty());
  const std::string stored = registry_->blob_path(blob_digest);
  std::string bytes = slurp(stored);
  ASSERT_FALSE(bytes.empty()) << stored;
  bytes[bytes.size() / 2] ^= 0x55;
  ASSERT_TRUE(spit(stored, bytes));

  auto d = daemon();
  Api api(*d);
  auto r = api.post("/v1/images", {{"ref", ref("test/corrupt:1")}});
  EXPECT_EQ(r.status, 422) << r;
  EXPECT_EQ(r.code(), "EIMAGE") << r;
  EXPECT_NE(r.message().find(blob_digest), std::string::npos) << r;
  EXPECT_EQ(api.get("/v1/images").body["images"].size(), 0u);
  EXPECT_EQ(entries_in(d->data_dir() + "/images/layers"), 0u);
  EXPECT_EQ(entries_in(d->data_dir() + "/images/tmp"), 0u);
}

TEST_F(ImagesApi, HostileLayersAre422NamingTheEntryAndLeaveNothing) {
  struct Case {
    std::string name;
    std::vector<LayerEntry> layer;
    std::string entry;  // what the message names
  };
  LayerEntry dev{LayerEntry::Kind::kCharDev, "dev/mem", "", 0600};
  std::vector<Case> cases = {
      {"dotdot", {LayerEntry::file("../escaped", "x")}, "../escaped"},
      {"absolute", {LayerEntry::file("/etc/escaped", "x")}, "/etc/escaped"},
      {"symlink-escape",
       {LayerEntry::symlink("out", "/tmp"), LayerEntry::file("out/escaped", "x")},
       "out/escaped"},
      {"device", {LayerEntry::dir("dev"), dev}, "dev/mem"},
      {"whiteout-root", {LayerEntry::file(".wh..", "")}, ".wh.."},
      {"opaque-root", {LayerEntry::file(".wh..wh..opq", "")}, ".wh..wh..opq"},
  };
  auto d = daemon();
  Api api(*d);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    push_with(c.name, c.layer);
    auto r = api.post("/v1/images", {{"ref", ref("test/" + c.name + ":1")}});
    EXPECT_EQ(r.status, 422) << r;
    EXPECT_EQ(r.code(), "EIMAGE") << r;
    EXPECT_NE(r.message().find("'" + c.entry + "'"), std::string::npos) << r;
    EXPECT_EQ(api.get("/v1/images").body["images"].size(), 0u);
    EXPECT_EQ(entries_in(d->data_dir() + "/images/layers"), 0u) << "the busybox layer too";
    EXPECT_EQ(entries_in(d->data_dir() + "/images/tmp"), 0u);
  }
  EXPECT_FALSE(fs::exists("/tmp/escaped"));
  EXPECT_FALSE(fs::exists(d->data_dir() + "/images/escaped"));
}

TEST_F(ImagesApi, RegistryDownIs502NamingIt) {
  LocalRegistry down;
  const std::string host = down.host();
  down.stop();
  auto d = daemon("  \"" + host + "\":\n    insecure: true\n");
  Api api(*d);
  auto r = api.post("/v1/images", {{"ref", host + "/test/busybox:1"}});
  EXPECT_EQ(r.status, 502) << r;
  EXPECT_EQ(r.code(), "EUNAVAILABLE") << r;
  EXPECT_NE(r.message().find(host), std::string::npos) << r;
  EXPECT_EQ(entries_in(d->data_dir() + "/images/tmp"), 0u);
}

TEST_F(ImagesApi, BasicAuthFromThePasswordFile) {
  LocalRegistry locked({.user = "puller", .password = "s3cret-pw"});
  locked.push(*layouts_ / "busybox", "1", "test/busybox:1");
  const std::string r = locked.host() + "/test/busybox:1";
  {
    auto d = daemon("  \"" + locked.host() + "\":\n    insecure: true\n");
    Api api(*d);
    auto refused = api.post("/v1/images", {{"ref", r}});
    EXPECT_EQ(refused.status, 502) << refused;
    EXPECT_EQ(refused.code(), "EUNAVAILABLE") << refused;
    EXPECT_NE(refused.message().find("unauthorized"), std::string::npos) << refused;
  }
  spit(dir_ / "pw", "s3cret-pw\n");
  auto d = daemon("  \"" + locked.host() + "\":\n    insecure: true\n    username: puller\n" +
                  "    password_file: " + (dir_ / "pw") + "\n");
  Api api(*d);
  auto ok = api.post("/v1/images", {{"ref", r}});
  EXPECT_EQ(ok.status, 201) << ok;
}

}  // namespace
}  // namespace agentbox::testing

namespace agentbox::testing {
namespace {

// Sessions whose root is an image (API.md "Images": create's `image` and `read_only_rootfs`).
class ImageSessions : public ImagesApi {
 protected:
  static void SetUpTestSuite() {
    ImagesApi::SetUpTestSuite();
    TestImage img;
    auto root = busybox_rootfs("agentbox-session-image");
    root.push_back(LayerEntry::dir("data", 01777));  // writable by anyone in the image
    root.push_back(LayerEntry::file("etc/only-in-image", "image file\n"));
    LayerEntry owned = LayerEntry::file("etc/owned-by-42", "x\n");
    owned.uid = 42;
    owned.gid = 43;
    root.push_back(owned);
    owned.path = "etc/kept-by-42";
    root.push_back(owned);
    img.layers.push_back(root);
    // A second layer that removes a file of the first (an OCI whiteout).
    img.layers.push_back({LayerEntry::file("etc/.wh.owned-by-42", "")});
    img.env = {"PATH=/bin:/usr/bin", "IMAGE_VAR=from-image", "OVERRIDDEN=image"};
    write_oci_layout(*layouts_ / "session", img, "1");
    registry_->push(*layouts_ / "session", "1", "test/session:1");
  }
  std::string run(Api& api, const std::string& id, const std::string& cmd, int* code = nullptr) {
    auto r = api.sh(id, cmd);
    EXPECT_EQ(r.status, 200) << r;
    if (code) *code = r.body.value("exit_code", -1);
    return r.body.value("stdout", "") + r.body.value("stderr", "");
  }
};

TEST_F(ImageSessions, TheRootIsTheImageReadOnlyWithItsEnvUnderTheSessions) {
  auto d = daemon();
  Api api(*d);
  const std::string r = ref("test/session:1");
  // Pulled on first use; the create waits.
  auto made =
      api.post("/v1/sessions", {{"id", "img"}, {"image", r}, {"env", {{"OVERRIDDEN", "session"}}}});
  ASSERT_EQ(made.status, 201) << made;
  ASSERT_TRUE(made.body["image"].is_object()) << made;
  EXPECT_EQ(made.body["image"].value("ref", ""), r);
  const std::string digest = made.body["image"].value("digest", "");
  EXPECT_TRUE(digest.starts_with("sha256:")) << made;
  EXPECT_EQ(made.body.value("read_only_rootfs", false), true);

  EXPECT_NE(run(api, "img", "cat /etc/os-release").find("agentbox-session-image"),
            std::string::npos);
  EXPECT_EQ(run(api, "img", "cat /etc/only-in-image"), "image file\n");
  int code = 0;
  run(api, "img", "test -e /etc/owned-by-42", &code);
  EXPECT_NE(code, 0) << "the upper layer's whiteout hides it";
  EXPECT_EQ(run(api, "img", "echo $IMAGE_VAR $OVERRIDDEN"), "from-image session\n");
  EXPECT_EQ(run(api, "img", "readlink /bin/sh"), "/bin/busybox\n");
  // Image files keep their ids inside the box (root's are root's), never the on-disk ones.
  EXPECT_EQ(run(api, "img", "stat -c %u:%g /bin/busybox"), "0:0\n");
  EXPECT_EQ(run(api, "img", "stat -c %u:%g /etc/kept-by-42"), "42:43\n");
  EXPECT_EQ(run(api, "img", "id -u"), std::to_string(made.body.value("uid", 0)) + "\n");
  // ... while on disk the image's root-owned busybox belongs to the layer id range, not to host
  // root (SECURITY.md T12).
  std::size_t seen = 0;
  for (const auto& e : fs::recursive_directory_iterator(d->data_dir() + "/images/layers")) {
    if (e.path().filename() != "busybox") continue;
    struct stat st;
    ASSERT_EQ(::lstat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, kLayerIdBase) << e.path();
    ++seen;
  }
  EXPECT_GT(seen, 0u);
  // Read-only root; the workspace and /tmp are writable.
  run(api, "img", "touch /data/x", &code);
  EXPECT_NE(code, 0);
  EXPECT_EQ(run(api, "img",
                "echo hi > /workspace/a && cat /workspace/a && echo t > /tmp/t && cat /tmp/t"),
            "hi\nt\n");
  // Nothing of the host's system: no /usr/lib of the host, no host binaries.
  run(api, "img", "test -e /usr/bin/apt-get || test -e /usr/lib/x86_64-linux-gnu", &code);
  EXPECT_NE(code, 0);

  // The image is in use: no delete while the session lives.
  auto busy = api.del("/v1/images/" + digest);
  EXPECT_EQ(busy.status, 409) << busy;
  EXPECT_EQ(busy.code(), "EEXIST");
  ASSERT_EQ(api.del("/v1/sessions/img").status, 200);
  EXPECT_EQ(api.del("/v1/images/" + digest).status, 200);
  EXPECT_FALSE(fs::exists(d->data_dir() + "/rootfs/img"));
}

TEST_F(ImageSessions, AWritableRootSurvivesSuspendResumeAndRestart) {
  TempDir data("agentbox-images-data");
  const std::string r = ref("test/session:1");
  std::string digest;
  {
    const std::string cfg = dir_ / "config.yaml";
    spit(cfg, "registries:\n  \"" + registry_->host() + "\":\n    insecure: true\n");
    Daemon d({"--backend", "ns", "--config", cfg, "--data-dir", data.path()});
    Api api(d);
    auto made = api.post("/v1/sessions", {{"id", "rw"}, {"image", r}, {"read_only_rootfs", false}});
    ASSERT_EQ(made.status, 201) << made;
    EXPECT_EQ(made.body.value("read_only_rootfs", true), false);
    digest = made.body["image"].value("digest", "");
    EXPECT_EQ(run(api, "rw", "echo kept > /data/f && cat /data/f"), "kept\n");
    ASSERT_EQ(api.post("/v1/sessions/rw/suspend", json::object()).status, 200);
    ASSERT_EQ(api.post("/v1/sessions/rw/resume", json::object()).status, 200);
    EXPECT_EQ(run(api, "rw", "cat /data/f"), "kept\n");
    // Not in the image's layers: the session's own upper dir has it, owned as the box sees it
    // plus the id base on disk.
    struct stat st;
    ASSERT_EQ(::stat((data.path() + "/rootfs/rw/upper/data/f").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, kLayerIdBase + made.body.value("uid", 0u));
    // /data, the image's (root's in the box), was copied up to hold it: stored as the box's
    // root through the idmap, never as host root.
    EXPECT_EQ(run(api, "rw", "stat -c %u /data"), "0\n");
    ASSERT_EQ(::stat((data.path() + "/rootfs/rw/upper/data").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, kLayerIdBase);
    // Written by the box's processes anywhere in the root, the image's binaries still run.
    EXPECT_EQ(run(api, "rw",
                  "mkdir -p /data/d && cp /bin/busybox /data/d/busybox && /data/d/busybox echo ok"),
              "ok\n");
  }
  const std::string cfg = dir_ / "config.yaml";
  Daemon d({"--backend", "ns", "--config", cfg, "--data-dir", data.path()});
  Api api(d);
  auto got = api.get("/v1/sessions/rw");
  ASSERT_EQ(got.status, 200) << got;
  EXPECT_EQ(got.body["image"].value("digest", ""), digest);
  EXPECT_EQ(got.body.value("read_only_rootfs", true), false);
  EXPECT_EQ(run(api, "rw", "cat /data/f"), "kept\n");
  ASSERT_EQ(api.del("/v1/sessions/rw").status, 200);
}

TEST_F(ImageSessions, E2bTemplateIdNamesAnImageByItsConfigAlias) {
  const std::string r = ref("test/session:1");
  const std::string cfg = dir_ / "config.yaml";
  spit(cfg, "registries:\n  \"" + registry_->host() + "\":\n    insecure: true\n" +
                "image_aliases:\n  bb: \"" + r + "\"\n");
  Daemon d({"--backend", "ns", "--config", cfg, "--token", "e2b_key"});
  Api raw(d, "");
  Api api(d, "e2b_key");
  auto made = raw.call("POST", "/e2b/v2/sandboxes", R"({"templateID":"bb","timeout":300})",
                       "application/json", {{"X-API-KEY", "e2b_key"}});
  ASSERT_EQ(made.status, 201) << made;
  EXPECT_EQ(made.body.value("templateID", ""), "bb");
  const std::string id = made.body.value("sandboxID", "");
  auto got = api.get("/v1/sessions/" + id);
  ASSERT_EQ(got.status, 200) << got;
  EXPECT_EQ(got.body["image"].value("ref", ""), r);
  EXPECT_NE(run(api, id, "cat /etc/os-release").find("agentbox-session-image"), std::string::npos);
  auto detail =
      raw.call("GET", "/e2b/sandboxes/" + id, "", "application/json", {{"X-API-KEY", "e2b_key"}});
  EXPECT_EQ(detail.body.value("templateID", ""), "bb") << detail;
  // A name that is neither a template nor an alias is still refused naming it.
  auto bad = raw.call("POST", "/e2b/v2/sandboxes", R"({"templateID":"nope"})", "application/json",
                      {{"X-API-KEY", "e2b_key"}});
  EXPECT_EQ(bad.status, 400) << bad;
  EXPECT_NE(bad.raw.find("nope"), std::string::npos) << bad;
  EXPECT_EQ(
      raw.call("DELETE", "/e2b/sandboxes/" + id, "", "application/json", {{"X-API-KEY", "e2b_key"}})
          .status,
      204);
}

TEST_F(ImageSessions, ImageOnTheHostBackendAndWritableRootWithoutImageAre501) {
  const std::string cfg = dir_ / "config.yaml";
  spit(cfg, "registries:\n  \"" + registry_->host() + "\":\n    insecure: true\n");
  Daemon d({"--backend", "host", "--config", cfg});
  Api api(d);
  auto r = api.post("/v1/sessions", {{"id", "h"}, {"image", ref("test/session:1")}});
  EXPECT_EQ(r.status, 501) << r;
  EXPECT_NE(r.message().find("'image'"), std::string::npos) << r;
  EXPECT_NE(r.message().find("host"), std::string::npos) << r;
  EXPECT_EQ(api.get("/v1/images").body["images"].size(), 0u) << "nothing pulled for it";
  auto w = api.post("/v1/sessions", {{"id", "w"}, {"read_only_rootfs", false}});
  EXPECT_EQ(w.status, 501) << w;
  EXPECT_NE(w.message().find("'read_only_rootfs'"), std::string::npos) << w;
  EXPECT_EQ(api.post("/v1/sessions", {{"id", "t"}, {"read_only_rootfs", "no"}}).status, 400);
  // A template on an image is not built: refused naming the field, nothing stored.
  auto t = api.call("POST", "/v1/templates",
                    "name: onimage\nimage: " + ref("test/session:1") + "\n", "application/yaml");
  EXPECT_EQ(t.status, 501) << t;
  EXPECT_NE(t.message().find("'image'"), std::string::npos) << t;
  EXPECT_EQ(api.get("/v1/templates/onimage").status, 404);
}

TEST_F(ImageSessions, AnImageThatCannotBePulledFailsTheCreate) {
  auto d = daemon();
  Api api(*d);
  auto r = api.post("/v1/sessions", {{"id", "x"}, {"image", ref("test/missing:1")}});
  EXPECT_EQ(r.status, 502) << r;
  EXPECT_NE(r.message().find("'image'"), std::string::npos) << r;
  EXPECT_EQ(api.get("/v1/sessions/x").status, 404);
}

}  // namespace
}  // namespace agentbox::testing
