// LangBot's BoxSpec `image` and `read_only_rootfs` (PROTOCOLS.md, API.md "Images"): an OCI image
// from a loopback registry (tests/support/registry.h) is the box's root, pulled by the first
// action that needs it, writable when asked; an image that cannot be had is refused in LangBot's
// error shape naming it. The daemon here always runs the ns backend (an image root needs it), so
// the suite is left out of the "ns/" re-run.

#include <optional>
#include <string>

#include "integration/api_test_util.h"
#include "integration/ws_test_util.h"
#include "support/registry.h"

namespace agentbox::testing {
namespace {

constexpr char kToken[] = "lb-control-token-0123456789abcdef0123";  // 32+ characters

// A LangBot control socket, as far as this suite needs one: a request, its response frame.
class LbControl {
 public:
  explicit LbControl(const Daemon& d) {
    ws_.set_headers({{"X-LangBot-Instance-Id", "inst-1"}, {"X-LangBot-Box-Control-Token", kToken}});
    EXPECT_FALSE(ws_.open(d.host_port(), "/rpc/ws"));
    EXPECT_EQ(ws_.status(), 101);
  }
  json call(const std::string& action, const json& data) {
    const std::int64_t seq = ++seq_;
    json req = {
        {"seq_id", seq},
        {"action", action},
        {"data", data},
        {"context",
         {{"instance_uuid", "inst-1"}, {"workspace_uuid", "w"}, {"placement_generation", 1}}}};
    ws_.write(req.dump(), false);
    for (;;) {
      auto m = ws_.read(std::chrono::seconds(120));
      if (!m) return json();
      json f = json::parse(*m, nullptr, false);
      if (f.is_object() && f.value("seq_id", std::int64_t{-1}) == seq) return f;
    }
  }

 private:
  Ws ws_;
  std::int64_t seq_ = 0;
};

json box_spec(const std::string& session_id, const std::string& cmd, const std::string& image) {
  return {{"cmd", cmd},           {"session_id", session_id}, {"image", image},
          {"network", "off"},     {"timeout_sec", 60},        {"workdir", "/workspace"},
          {"env", json::object()}};
}

std::string message(const json& f) {
  return f.is_object() ? f.value("message", "") : "";
}

TEST(ImagesLangBot, TheImageIsTheRootAndReadOnlyRootfsFalseMakesItWritable) {
  LocalRegistry registry;
  TempDir dir("agentbox-lb-image");
  TestImage img;
  auto root = busybox_rootfs("agentbox-langbot-image");
  root.push_back(LayerEntry::dir("data", 01777));
  img.layers.push_back(root);
  img.env = {"PATH=/bin", "FROM_IMAGE=yes"};
  write_oci_layout(dir / "oci", img, "1");
  registry.push(dir / "oci", "1", "lb/bb:1");
  const std::string ref = registry.host() + "/lb/bb:1";
  spit(dir / "config.yaml", "registries:\n  \"" + registry.host() + "\":\n    insecure: true\n");
  Daemon d({"--langbot-control-token", kToken, "--backend", "ns", "--config", dir / "config.yaml"});
  Api api(d);
  LbControl lb(d);

  auto spec =
      box_spec("img", "cat /etc/os-release; echo $FROM_IMAGE; echo w > /data/f; cat /data/f", ref);
  spec["read_only_rootfs"] = false;
  auto r = lb.call("box_exec", spec);
  ASSERT_EQ(r.value("code", -1), 0) << r;
  const std::string out = r["data"].value("stdout", "");
  EXPECT_NE(out.find("agentbox-langbot-image"), std::string::npos) << r;
  EXPECT_NE(out.find("yes\nw"), std::string::npos) << r;
  auto info = lb.call("box_get_session", {{"session_id", "img"}});
  ASSERT_EQ(info.value("code", -1), 0) << info;
  EXPECT_EQ(info["data"]["image"], ref);
  EXPECT_EQ(info["data"]["read_only_rootfs"], false);
  // The same session with the default read-only root: a conflict naming the field.
  auto c = lb.call("box_exec", box_spec("img", "true", ref));
  EXPECT_TRUE(message(c).starts_with("BoxSessionConflictError: ")) << c;
  EXPECT_NE(message(c).find("read_only_rootfs"), std::string::npos) << c;

  // A read-only image root: the image's files, no writes outside /workspace and /tmp.
  auto r2 = lb.call(
      "box_exec",
      box_spec("img2", "test -e /data/f || echo fresh; touch /data/g || echo refused", ref));
  ASSERT_EQ(r2.value("code", -1), 0) << r2;
  EXPECT_EQ(r2["data"].value("stdout", ""), "fresh\nrefused") << r2;

  // An image that cannot be had (nothing listens on port 1): LangBot's error naming it, and no
  // session stays.
  const std::string nowhere = "127.0.0.1:1/none:1";
  auto bad = lb.call("box_create_session", box_spec("img3", "", nowhere));
  EXPECT_EQ(bad.value("code", -1), 1) << bad;
  EXPECT_TRUE(message(bad).starts_with("BoxBackendUnavailableError: ")) << bad;
  EXPECT_NE(message(bad).find(nowhere), std::string::npos) << bad;
  EXPECT_EQ(api.get("/v1/sessions").body["sessions"].size(), 2u);
  // The default image with a writable root: refused, naming the field.
  auto rw = box_spec("img4", "", "rockchin/langbot-sandbox:latest");
  rw["read_only_rootfs"] = false;
  EXPECT_TRUE(message(lb.call("box_create_session", rw)).starts_with("BoxError: read_only_rootfs"));
}

}  // namespace
}  // namespace agentbox::testing
