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

TEST_F(ImagesApi, ASecondImageFetchesOnlyTheLayersTheStoreDoesNotHave) {
  TestImage base;
  base.layers.push_back(busybox_rootfs("agentbox-reuse-base"));
  const std::string dir = *layouts_ / "reuse-base";
  write_oci_layout(dir, base, "1");
  registry_->push(dir, "1", "test/reuse-base:1");
  TestImage more = base;
  more.layers.push_back({LayerEntry::file("etc/more", "more\n")});
  write_oci_layout(*layouts_ / "reuse-more", more, "1");
  registry_->push(*layouts_ / "reuse-more", "1", "test/reuse-more:1");

  auto d = daemon();
  Api api(*d);
  auto one = api.post("/v1/images", {{"ref", ref("test/reuse-base:1")}});
  ASSERT_EQ(one.status, 201) << one;
  // The registry's copy of the shared base blob goes bad: a pull that fetched it would fail.
  const std::string base_blob = one.body["layers"][0].value("digest", "");
  const std::string stored = registry_->blob_path(base_blob);
  std::string bytes = slurp(stored);
  ASSERT_FALSE(bytes.empty()) << stored;
  bytes[bytes.size() / 2] ^= 0x55;
  ASSERT_TRUE(spit(stored, bytes));
  auto two = api.post("/v1/images", {{"ref", ref("test/reuse-more:1")}});
  ASSERT_EQ(two.status, 201) << two;
  EXPECT_EQ(two.body["layers"][0].value("digest", ""), base_blob);
  auto s = api.post("/v1/sessions", {{"id", "more"}, {"image", ref("test/reuse-more:1")}});
  ASSERT_EQ(s.status, 201) << s;
  EXPECT_EQ(api.sh("more", "cat /etc/more /etc/os-release").body.value("stdout", ""),
            "more\nID=agentbox-reuse-base\nNAME=\"agentbox-reuse-base\"\n");
  ASSERT_EQ(api.del("/v1/sessions/more").status, 200);
  EXPECT_EQ(entries_in(d->data_dir() + "/images/tmp"), 0u);
  // A store without the base fetches it, and finds it bad.
  auto fresh = daemon();
  Api api2(*fresh);
  auto bad = api2.post("/v1/images", {{"ref", ref("test/reuse-more:1")}});
  EXPECT_EQ(bad.status, 422) << bad;
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

// Seed 003: xbot's server in docker mode (SANDBOX_MODE=docker, SANDBOX_DOCKER_IMAGE=REF) runs
// every user's sandbox in a container of that image; agentboxd so configured gives every session
// that names no image that image as its root.
TEST_F(ImageSessions, Seed003DockerModeImageIsTheRootOfSessionsThatNameNone) {
  const std::string r = ref("test/session:1");
  struct Env {
    Env(const char* mode, const char* image) {
      ::setenv("SANDBOX_MODE", mode, 1);
      if (image) ::setenv("SANDBOX_DOCKER_IMAGE", image, 1);
    }
    ~Env() {
      ::unsetenv("SANDBOX_MODE");
      ::unsetenv("SANDBOX_DOCKER_IMAGE");
    }
  };
  {
    std::unique_ptr<Daemon> d;
    {
      Env env("docker", r.c_str());
      d = daemon();
    }
    Api api(*d);
    auto made = api.post("/v1/sessions", {{"id", "xbot-user"}});
    ASSERT_EQ(made.status, 201) << made;
    EXPECT_EQ(made.body["image"].value("ref", ""), r) << made;
    EXPECT_NE(run(api, "xbot-user", "cat /etc/os-release").find("agentbox-session-image"),
              std::string::npos);
    EXPECT_EQ(run(api, "xbot-user", "cat /etc/only-in-image"), "image file\n");
    // A session naming its own image keeps it.
    auto own = api.post("/v1/sessions", {{"id", "own"}, {"image", ref("test/busybox:1")}});
    ASSERT_EQ(own.status, 201) << own;
    EXPECT_EQ(own.body["image"].value("ref", ""), ref("test/busybox:1"));
    for (const char* id : {"xbot-user", "own"}) api.del(std::string("/v1/sessions/") + id);
  }
  // Docker mode without an image: refused at startup, naming the variable.
  Env env("docker", nullptr);
  std::string out;
  EXPECT_EQ(Daemon::run_to_exit({"--listen", "127.0.0.1:0", "--data-dir", dir_ / "data"}, &out), 2);
  EXPECT_NE(out.find("SANDBOX_DOCKER_IMAGE"), std::string::npos) << out;
}

TEST_F(ImageSessions, AnImageThatCannotBePulledFailsTheCreate) {
  auto d = daemon();
  Api api(*d);
  auto r = api.post("/v1/sessions", {{"id", "x"}, {"image", ref("test/missing:1")}});
  EXPECT_EQ(r.status, 502) << r;
  EXPECT_NE(r.message().find("'image'"), std::string::npos) << r;
  EXPECT_EQ(api.get("/v1/sessions/x").status, 404);
}

// Templates on an image (API.md "Images": `image:` as a template's base).
class ImagesTemplate : public ImageSessions {
 protected:
  static void SetUpTestSuite() {
    ImageSessions::SetUpTestSuite();
    push_base("test/tbase:1", "agentbox-template-base");
  }
  // Pushes a busybox image whose /etc/os-release names `os_id` as `repo_tag`.
  static void push_base(const std::string& repo_tag, const std::string& os_id) {
    TestImage img;
    img.layers.push_back(busybox_rootfs(os_id));
    img.env = {"PATH=/usr/local/bin:/bin:/usr/bin"};
    const std::string dir = *layouts_ / os_id;
    write_oci_layout(dir, img, "1");
    registry_->push(dir, "1", repo_tag);
  }
  // A template on image `ref` whose setup writes `etc_v` to /etc/v and a script to
  // /usr/local/bin/x, outside the workspace.
  static std::string yaml(const std::string& name, const std::string& ref,
                          const std::string& etc_v = "y") {
    return "name: " + name + "\nimage: \"" + ref +
           "\"\n"
           "files:\n  hello.txt: hi\n"
           "setup:\n"
           "  - mkdir -p /usr/local/bin\n"
           "  - 'echo \"#!/bin/sh\" > /usr/local/bin/x && echo \"echo x-ran\" >> "
           "/usr/local/bin/x'\n"
           "  - chmod 755 /usr/local/bin/x\n"
           "  - echo " +
           etc_v + " > /etc/v\n";
  }
  ApiReply build(Api& api, const std::string& name) {
    return api.call("POST", "/v1/templates/" + name + "/build?wait=true", "{}");
  }
};

TEST_F(ImagesTemplate, ABuildOnAnImageKeepsWhatItsSetupWritesOutsideTheWorkspace) {
  ASSERT_FALSE(fs::exists("/etc/v"));
  ASSERT_FALSE(fs::exists("/usr/local/bin/x"));
  auto d = daemon();
  Api api(*d);
  const std::string r = ref("test/tbase:1");
  auto put = api.call("POST", "/v1/templates", yaml("onimg", r), "application/yaml");
  ASSERT_EQ(put.status, 201) << put;
  EXPECT_EQ(put.body.value("image", ""), r);
  auto b = build(api, "onimg");
  ASSERT_EQ(b.status, 201) << b;
  ASSERT_EQ(b.body.value("state", ""), "succeeded") << b;
  auto snaps = api.get("/v1/templates/onimg/snapshots");
  ASSERT_EQ(snaps.body["snapshots"].size(), 1u) << snaps;
  const json& image = snaps.body["snapshots"][0]["image"];
  ASSERT_TRUE(image.is_object()) << snaps;
  EXPECT_EQ(image.value("ref", ""), r);
  const std::string digest = image.value("digest", "");
  EXPECT_EQ(api.get("/v1/images/" + url_path(r)).body.value("digest", "?"), digest);

  // A session on it has the image's root with the build's changes, read-only, root's.
  auto made = api.post("/v1/sessions", {{"id", "t1"}, {"template", "onimg"}});
  ASSERT_EQ(made.status, 201) << made;
  EXPECT_EQ(made.body["image"].value("digest", ""), digest) << made;
  EXPECT_EQ(made.body["image"].value("ref", ""), r) << made;
  EXPECT_EQ(run(api, "t1", "cat /etc/v"), "y\n");
  EXPECT_EQ(run(api, "t1", "/usr/local/bin/x"), "x-ran\n");
  EXPECT_EQ(run(api, "t1", "x"), "x-ran\n") << "the image's PATH";
  EXPECT_EQ(run(api, "t1", "stat -c %u:%g /etc/v /usr/local/bin/x"), "0:0\n0:0\n");
  EXPECT_NE(run(api, "t1", "cat /etc/os-release").find("agentbox-template-base"),
            std::string::npos);
  EXPECT_EQ(run(api, "t1", "cat /workspace/hello.txt"), "hi");
  // The box's own /etc/passwd (its session user), not the build's.
  EXPECT_NE(
      run(api, "t1", "cat /etc/passwd").find(":" + std::to_string(made.body.value("uid", 0)) + ":"),
      std::string::npos);
  int code = 0;
  run(api, "t1", "echo z > /etc/v", &code);
  EXPECT_NE(code, 0) << "a read-only root";
  // The host's root is untouched.
  EXPECT_FALSE(fs::exists("/etc/v"));
  EXPECT_FALSE(fs::exists("/usr/local/bin/x"));
  // On disk the layer holds the build's files only, as the image root's ids, never host root's.
  std::vector<std::string> layers;
  for (const auto& e : fs::directory_iterator(d->data_dir() + "/root_layers")) {
    layers.push_back(e.path());
  }
  ASSERT_EQ(layers.size(), 1u);
  struct stat st;
  ASSERT_EQ(::lstat((layers[0] + "/usr/local/bin/x").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kLayerIdBase);
  ASSERT_EQ(::lstat((layers[0] + "/etc/v").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kLayerIdBase);
  for (const char* box_made : {"etc/passwd", "etc/hosts", "etc/os-release", "workspace", "proc"}) {
    EXPECT_FALSE(fs::exists(layers[0] + "/" + box_made)) << box_made;
  }

  // The session names another image: refused, naming the field.
  auto other = api.post("/v1/sessions",
                        {{"id", "t2"}, {"template", "onimg"}, {"image", ref("test/session:1")}});
  EXPECT_EQ(other.status, 400) << other;
  EXPECT_NE(other.message().find("'image'"), std::string::npos) << other;

  // The image is in use by the session, then by the template alone.
  EXPECT_EQ(api.del("/v1/images/" + digest).status, 409);
  ASSERT_EQ(api.del("/v1/sessions/t1").status, 200);
  auto busy = api.del("/v1/images/" + digest);
  EXPECT_EQ(busy.status, 409) << busy;
  EXPECT_EQ(busy.code(), "EEXIST");
  EXPECT_NE(busy.message().find("onimg"), std::string::npos) << busy;
  ASSERT_EQ(api.del("/v1/templates/onimg").status, 200);
  EXPECT_EQ(entries_in(d->data_dir() + "/root_layers"), 0u) << "gone with its snapshot";
  EXPECT_EQ(api.del("/v1/images/" + digest).status, 200);
}

TEST_F(ImagesTemplate, SessionsKeepTheImageAndSnapshotVersionTheyStartedOn) {
  push_base("test/moving:1", "agentbox-moving-one");
  auto d = daemon();
  Api api(*d);
  const std::string r = ref("test/moving:1");
  ASSERT_EQ(api.call("POST", "/v1/templates", yaml("mv", r, "one"), "application/yaml").status,
            201);
  ASSERT_EQ(build(api, "mv").body.value("state", ""), "succeeded");
  auto s1 = api.post("/v1/sessions", {{"id", "s1"}, {"template", "mv"}});
  ASSERT_EQ(s1.status, 201) << s1;
  const std::string d1 = s1.body["image"].value("digest", "");

  // The tag moves to another image, pulled again; the template changes and is rebuilt.
  push_base("test/moving:1", "agentbox-moving-two");
  auto pulled = api.post("/v1/images", {{"ref", r}});
  ASSERT_EQ(pulled.status, 201) << pulled;
  const std::string d2 = pulled.body.value("digest", "");
  ASSERT_NE(d1, d2);
  ASSERT_EQ(api.call("POST", "/v1/templates", yaml("mv", r, "two"), "application/yaml").status,
            200);
  ASSERT_EQ(build(api, "mv").body.value("state", ""), "succeeded");
  auto s2 = api.post("/v1/sessions", {{"id", "s2"}, {"template", "mv"}});
  ASSERT_EQ(s2.status, 201) << s2;
  EXPECT_EQ(s2.body["image"].value("digest", ""), d2);
  EXPECT_EQ(run(api, "s2", "cat /etc/v"), "two\n");
  EXPECT_NE(run(api, "s2", "cat /etc/os-release").find("agentbox-moving-two"), std::string::npos);

  // s1 keeps version 1 on the first image, also across a suspend and resume.
  ASSERT_EQ(api.post("/v1/sessions/s1/suspend", json::object()).status, 200);
  ASSERT_EQ(api.post("/v1/sessions/s1/resume", json::object()).status, 200);
  auto got = api.get("/v1/sessions/s1");
  EXPECT_EQ(got.body["image"].value("digest", ""), d1) << got;
  EXPECT_EQ(run(api, "s1", "cat /etc/v"), "one\n");
  EXPECT_NE(run(api, "s1", "cat /etc/os-release").find("agentbox-moving-one"), std::string::npos);
  // ... and both images stay in use.
  EXPECT_EQ(api.del("/v1/images/" + d1).status, 409);
  EXPECT_EQ(api.del("/v1/images/" + d2).status, 409);
  // A session may name the template's image as it was (its digest).
  auto same = api.post("/v1/sessions", {{"id", "s3"}, {"template", "mv"}, {"image", d2}});
  EXPECT_EQ(same.status, 201) << same;
  for (const char* id : {"s1", "s2", "s3"}) api.del(std::string("/v1/sessions/") + id);
}

TEST_F(ImagesTemplate, AMalformedImageIs400AndAnUnpullableOneFailsTheBuild) {
  auto d = daemon();
  Api api(*d);
  auto bad =
      api.call("POST", "/v1/templates", "name: bad\nimage: \"Not A Ref!\"\n", "application/yaml");
  EXPECT_EQ(bad.status, 400) << bad;
  EXPECT_NE(bad.message().find("'image'"), std::string::npos) << bad;
  const std::string missing = ref("test/missing:1");
  ASSERT_EQ(api.call("POST", "/v1/templates", yaml("gone", missing), "application/yaml").status,
            201);
  auto b = build(api, "gone");
  EXPECT_EQ(b.status, 422) << b;
  EXPECT_EQ(b.body.value("state", ""), "failed") << b;
  EXPECT_NE(b.message().find(missing), std::string::npos) << b;
  EXPECT_EQ(api.post("/v1/sessions", {{"id", "g"}, {"template", "gone"}}).status, 409);
}

}  // namespace
}  // namespace agentbox::testing
