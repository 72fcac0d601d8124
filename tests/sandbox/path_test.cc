#include "sandbox/path.h"

#include <gtest/gtest.h>

#include <string>

namespace agentbox::sandbox {
namespace {

std::string norm(std::string_view p, std::string_view ws = "/workspace") {
  auto r = normalize_box_path(p, ws);
  EXPECT_TRUE(r.has_value()) << p << ": " << r.error().message;
  return r.value_or("<error>");
}

Code norm_error(std::string_view p, std::string_view ws = "/workspace") {
  auto r = normalize_box_path(p, ws);
  EXPECT_FALSE(r.has_value()) << p << " normalised to " << *r;
  return r ? Code::kInternal : r.error().code;
}

TEST(NormalizeBoxPath, AbsolutePathsKeepTheirComponents) {
  EXPECT_EQ(norm("/workspace/a.txt"), "/workspace/a.txt");
  EXPECT_EQ(norm("/tmp/x"), "/tmp/x");
  EXPECT_EQ(norm("/"), "/");
}

TEST(NormalizeBoxPath, RelativePathsAreUnderTheWorkspace) {
  EXPECT_EQ(norm("a.txt"), "/workspace/a.txt");
  EXPECT_EQ(norm("src/main.py"), "/workspace/src/main.py");
  EXPECT_EQ(norm("."), "/workspace");
  EXPECT_EQ(norm("a", "/home/u/ws/"), "/home/u/ws/a");
}

TEST(NormalizeBoxPath, CollapsesSlashesAndDots) {
  EXPECT_EQ(norm("//workspace//a///b"), "/workspace/a/b");
  EXPECT_EQ(norm("/workspace/./a/./b/."), "/workspace/a/b");
  EXPECT_EQ(norm("/workspace/a/"), "/workspace/a");
  EXPECT_EQ(norm("./a//"), "/workspace/a");
  EXPECT_EQ(norm("///"), "/");
}

TEST(NormalizeBoxPath, KeepsDotDotForTheResolverToJudge) {
  EXPECT_EQ(norm("/workspace/../etc/shadow"), "/workspace/../etc/shadow");
  EXPECT_EQ(norm("../../etc/shadow"), "/workspace/../../etc/shadow");
  EXPECT_EQ(norm("a/../../x"), "/workspace/a/../../x");
  EXPECT_EQ(norm("/.."), "/..");
}

TEST(NormalizeBoxPath, RejectsEmptyNulAndBackslash) {
  EXPECT_EQ(norm_error(""), Code::kInvalid);
  EXPECT_EQ(norm_error(std::string_view("a\0b", 3)), Code::kInvalid);
  EXPECT_EQ(norm_error(std::string_view("\0", 1)), Code::kInvalid);
  EXPECT_EQ(norm_error("..\\..\\etc\\shadow"), Code::kInvalid);
}

TEST(NormalizeBoxPath, ErrorMessagesEscapeControlBytes) {
  auto r = normalize_box_path(std::string_view("a\nb\0", 4), "/workspace");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("a\\x0ab"), std::string::npos) << r.error().message;
}

TEST(NormalizeBoxPath, RejectsOverLongPaths) {
  EXPECT_EQ(norm(std::string(kMaxPathBytes - 1, 'a'), "/"),
            "/" + std::string(kMaxPathBytes - 1, 'a'));
  EXPECT_EQ(norm_error(std::string(kMaxPathBytes + 1, 'a')), Code::kTooBig);
  // Fits alone, too long once joined with the workspace.
  EXPECT_EQ(norm_error(std::string(kMaxPathBytes - 2, 'a')), Code::kTooBig);
  // Many slashes collapse, but the raw input is still bounded.
  EXPECT_EQ(norm_error(std::string(kMaxPathBytes + 1, '/')), Code::kTooBig);
}

TEST(NormalizeBoxPath, NamesMayHoldAnyOtherByte) {
  EXPECT_EQ(norm("new\nline \xff\xfe"), "/workspace/new\nline \xff\xfe");
  EXPECT_EQ(norm("/workspace/..."), "/workspace/...");
}

TEST(WorkspaceRelative, UnderTheWorkspaceOrItsAlias) {
  EXPECT_EQ(workspace_relative("/home/u/ws/a/b", "/home/u/ws").value(), "a/b");
  EXPECT_EQ(workspace_relative("/home/u/ws", "/home/u/ws").value(), "");
  EXPECT_EQ(workspace_relative("/home/u/ws/", "/home/u/ws/").value(), "");
  EXPECT_EQ(workspace_relative("/workspace/a", "/home/u/ws").value(), "a");
  EXPECT_EQ(workspace_relative("/workspace", "/home/u/ws").value(), "");
  EXPECT_EQ(workspace_relative("a//b/", "/home/u/ws").value(), "a/b");
  EXPECT_EQ(workspace_relative("/x/y", "/").value(), "x/y");
}

TEST(WorkspaceRelative, DotDotIsLeftForTheResolver) {
  EXPECT_EQ(workspace_relative("/workspace/../etc/passwd", "/home/u/ws").value(), "../etc/passwd");
  EXPECT_EQ(workspace_relative("a/../../x", "/home/u/ws").value(), "a/../../x");
}

TEST(WorkspaceRelative, OtherAbsolutePathsAreOutside) {
  for (const char* p : {"/etc/passwd", "/home/u/ws2/a", "/home/u", "/workspace2", "/work", "/"}) {
    auto r = workspace_relative(p, "/home/u/ws");
    ASSERT_FALSE(r) << p << " -> " << *r;
    EXPECT_EQ(r.error().code, Code::kAccess) << p;
  }
}

TEST(WorkspaceRelative, ValidatesLikeNormalize) {
  EXPECT_EQ(workspace_relative("", "/ws").error().code, Code::kInvalid);
  EXPECT_EQ(workspace_relative(std::string_view("/ws/a\0", 6), "/ws").error().code, Code::kInvalid);
  EXPECT_EQ(workspace_relative(std::string(kMaxPathBytes + 1, 'a'), "/ws").error().code,
            Code::kTooBig);
}

}  // namespace
}  // namespace agentbox::sandbox
