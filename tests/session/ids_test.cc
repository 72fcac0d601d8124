#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/fnv.h"
#include "session/session_manager.h"

namespace agentbox::session {
namespace {

TEST(ValidateIdTest, AcceptsTheDocumentedAlphabet) {
  EXPECT_TRUE(validate_id("group_123"));
  EXPECT_TRUE(validate_id("a"));
  EXPECT_TRUE(validate_id("A-Z.a_z-0.9"));
  EXPECT_TRUE(validate_id("..."));  // only "." and ".." are reserved
  EXPECT_TRUE(validate_id(".hidden"));
  EXPECT_TRUE(validate_id(std::string(128, 'x')));
}

TEST(ValidateIdTest, RefusesBadIdsNamingThem) {
  for (std::string bad : {std::string(""), std::string("."), std::string(".."), std::string("a/b"),
                          std::string("../etc"), std::string("a b"), std::string("é"),
                          std::string("a\0b", 3), std::string(129, 'x'), std::string("x;rm")}) {
    auto st = validate_id(bad);
    ASSERT_FALSE(st) << "accepted: " << bad;
    EXPECT_EQ(st.error().code, Code::kInvalid);
    EXPECT_NE(st.error().message.find("session id"), std::string::npos) << st.error().message;
  }
  auto st = validate_id("a/b");
  EXPECT_NE(st.error().message.find("\"a/b\""), std::string::npos) << st.error().message;
  // Non-printable bytes are escaped, and a huge id is not echoed back in full.
  st = validate_id(std::string("a\nb", 3));
  EXPECT_NE(st.error().message.find("a\\x0ab"), std::string::npos) << st.error().message;
  st = validate_id(std::string(100000, 'y'));
  EXPECT_LT(st.error().message.size(), 400u);
}

TEST(RenderScopeTest, SubstitutesVariables) {
  std::map<std::string, std::string> vars{
      {"launcher_type", "group"}, {"launcher_id", "123456"}, {"sender_id", "789"}};
  EXPECT_EQ(render_scope("{launcher_type}_{launcher_id}", vars).value(), "group_123456");
  EXPECT_EQ(render_scope("{launcher_type}_{launcher_id}_{sender_id}", vars).value(),
            "group_123456_789");
  EXPECT_EQ(render_scope("fixed-name", vars).value(), "fixed-name");
  EXPECT_EQ(render_scope("x{sender_id}{sender_id}", vars).value(), "x789789");
}

TEST(RenderScopeTest, MissingVariableBecomesUnknown) {
  std::map<std::string, std::string> vars{{"launcher_type", "person"}};
  EXPECT_EQ(render_scope("{launcher_type}_{launcher_id}", vars).value(), "person_unknown");
  EXPECT_EQ(render_scope("{query_id}", {}).value(), "unknown");
}

TEST(RenderScopeTest, UnbalancedBracesAreInvalid) {
  for (const char* t : {"{launcher_type", "launcher_type}", "{a{b}}", "a}{b", "{}", "{{a}}"}) {
    auto r = render_scope(t, {{"a", "x"}, {"b", "y"}});
    ASSERT_FALSE(r) << "accepted template " << t << " -> " << *r;
    EXPECT_EQ(r.error().code, Code::kInvalid);
    EXPECT_NE(r.error().message.find(t), std::string::npos) << r.error().message;
  }
}

TEST(RenderScopeTest, RenderedIdMustBeValid) {
  // A variable cannot smuggle a path separator (or "..") into the id.
  auto r = render_scope("{a}", {{"a", "../../etc"}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalid);
  EXPECT_NE(r.error().message.find("{a}"), std::string::npos) << r.error().message;
  EXPECT_FALSE(render_scope("{a}", {{"a", ".."}}));
  EXPECT_FALSE(render_scope("", {}));
  EXPECT_FALSE(render_scope("{a}", {{"a", std::string(200, 'z')}}));
  EXPECT_FALSE(render_scope("{a} {b}", {{"a", "x"}, {"b", "y"}}));
}

TEST(FirstUidProbeTest, IsSeed001sFnv1_32ModRangePlusBase) {
  // The published FNV-1 32 test vectors (Go's hash/fnv.New32, seed 001's "FNV32"): "" =
  // 0x811c9dc5, "a" = 0x050c5d7e, "foobar" = 0x31f0b262. (FNV-1a would give 0xe40c292c and
  // 0xbf9cf968: a different uid for the same agent than the toolbox-server gave it.)
  static_assert(fnv1_32("a") == 0x050c5d7eu && fnv1_32("foobar") == 0x31f0b262u);
  static_assert(fnv1a_32("a") == 0xe40c292cu && fnv1a_32("foobar") == 0xbf9cf968u);
  EXPECT_EQ(first_uid_probe(""), 0x811c9dc5u % 60000 + 10000);
  EXPECT_EQ(first_uid_probe("a"), 0x050c5d7eu % 60000 + 10000);
  EXPECT_EQ(first_uid_probe("foobar"), 0x31f0b262u % 60000 + 10000);
  EXPECT_EQ(first_uid_probe("group_123"), 40135u);
  for (int i = 0; i < 1000; ++i) {
    uid_t u = first_uid_probe("s" + std::to_string(i));
    EXPECT_GE(u, 10000u);
    EXPECT_LT(u, 70000u);
  }
}

TEST(StateNameTest, WireSpelling) {
  EXPECT_EQ(state_name(State::kRunning), "running");
  EXPECT_EQ(state_name(State::kSuspended), "suspended");
}

}  // namespace
}  // namespace agentbox::session
