// The installers' manifests (pyproject.toml, package.json) and request checks: what a repair or a
// rebuild reads back is what an install wrote, and a user's own lines and fields stay.
#include "sandbox/installers.h"

#include <gtest/gtest.h>

namespace agentbox::sandbox {
namespace {

TEST(InstallersManifest, NewPyprojectRoundTrips) {
  PythonManifest m;
  m.dependencies = {"requests==2.31", "tiny"};
  m.source.find_links = {"/workspace/wheels"};
  m.source.no_index = true;
  auto text = render_pyproject("", m);
  ASSERT_TRUE(text) << text.error().message;
  EXPECT_NE(text->find("[project]"), std::string::npos);
  EXPECT_NE(text->find("name = \"workspace\""), std::string::npos);
  auto back = parse_pyproject(*text);
  ASSERT_TRUE(back) << back.error().message << "\n" << *text;
  EXPECT_EQ(back->dependencies, m.dependencies);
  EXPECT_EQ(back->source.find_links, m.source.find_links);
  EXPECT_TRUE(back->source.no_index);
  EXPECT_EQ(back->source.index_url, "");
}

TEST(InstallersManifest, ExistingPyprojectKeepsItsOtherLines) {
  const std::string old =
      "# my project\n"
      "[build-system]\n"
      "requires = [\"setuptools\"]\n"
      "\n"
      "[project]\n"
      "name = \"mine\"  # the name\n"
      "dependencies = [\n"
      "  'numpy>=1.26',  # fast arrays\n"
      "  \"pandas\",\n"
      "]\n"
      "requires-python = \">=3.11\"\n"
      "classifiers = [\"A\", [\"nested\"], {x = 1}]\n"
      "description = \"\"\"multi\nline [not a table]\n\"\"\"\n"
      "\n"
      "[tool.other]\n"
      "x = { a = \"]\" }\n";
  auto parsed = parse_pyproject(old);
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->dependencies, (std::vector<std::string>{"numpy>=1.26", "pandas"}));

  PythonManifest m = *parsed;
  m.dependencies = merge_requirements(m.dependencies, {"Pandas==2.1", "tiny"});
  m.source.index_url = "http://127.0.0.1:8080/simple";
  auto text = render_pyproject(old, m);
  ASSERT_TRUE(text) << text.error().message;
  for (const char* kept : {"# my project", "requires = [\"setuptools\"]", "name = \"mine\"  # the name",
                           "requires-python = \">=3.11\"", "line [not a table]", "[tool.other]",
                           "x = { a = \"]\" }"}) {
    EXPECT_NE(text->find(kept), std::string::npos) << kept << "\n" << *text;
  }
  auto back = parse_pyproject(*text);
  ASSERT_TRUE(back) << back.error().message << "\n" << *text;
  EXPECT_EQ(back->dependencies, (std::vector<std::string>{"numpy>=1.26", "Pandas==2.1", "tiny"}));
  EXPECT_EQ(back->source.index_url, "http://127.0.0.1:8080/simple");

  // Written again with no source: the [tool.agentbox] table goes, the rest stays.
  PythonManifest plain = *back;
  plain.source = {};
  auto again = render_pyproject(*text, plain);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->find("tool.agentbox"), std::string::npos) << *again;
  EXPECT_NE(again->find("[tool.other]"), std::string::npos);
  auto back2 = parse_pyproject(*again);
  ASSERT_TRUE(back2) << back2.error().message;
  EXPECT_EQ(back2->dependencies, back->dependencies);
}

TEST(InstallersManifest, ProjectWithoutDependenciesGetsThem) {
  const std::string old = "[project]\nname = \"x\"\n\n[tool.agentbox]\nno_index = true\n";
  PythonManifest m;
  m.dependencies = {"a\"quote\\"};
  auto text = render_pyproject(old, m);
  ASSERT_TRUE(text);
  auto back = parse_pyproject(*text);
  ASSERT_TRUE(back) << back.error().message << "\n" << *text;
  EXPECT_EQ(back->dependencies, m.dependencies);
  EXPECT_FALSE(back->source.no_index);  // replaced by m's (empty) source
  EXPECT_NE(text->find("name = \"x\""), std::string::npos);
}

TEST(InstallersManifest, MalformedPyprojectNamesTheLine) {
  auto r = parse_pyproject("[project]\nname = \"x\"\ndependencies = [\"a\", 3]\n");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalid);
  EXPECT_NE(r.error().message.find("pyproject.toml line 3"), std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("dependencies"), std::string::npos) << r.error().message;
  auto r2 = parse_pyproject("[project\n");
  ASSERT_FALSE(r2);
  EXPECT_NE(r2.error().message.find("line 1"), std::string::npos);
  auto r3 = parse_pyproject("[project]\ndependencies = [\"a\"\n");
  ASSERT_FALSE(r3);
  // And a render of a malformed file refuses rather than guessing.
  EXPECT_FALSE(render_pyproject("[project]\ndependencies = [\"a\"\n", PythonManifest{}));
}

TEST(InstallersManifest, RequirementNames) {
  EXPECT_EQ(requirement_name("Foo_Bar.baz>=1"), "foo-bar-baz");
  EXPECT_EQ(requirement_name("requests[socks]==2.31 ; python_version>'3'"), "requests");
  EXPECT_EQ(requirement_name("/workspace/wheels/tiny_pkg-1.0-py3-none-any.whl"), "tiny-pkg");
  EXPECT_EQ(requirement_name("./dist/tiny-pkg-1.0.tar.gz"), "tiny-pkg");
  EXPECT_EQ(requirement_name("./somedir"), "");
  EXPECT_EQ(merge_requirements({"a==1", "b"}, {"A>=2", "c", "c"}),
            (std::vector<std::string>{"A>=2", "b", "c"}));
}

TEST(InstallersManifest, PackageJsonRoundTripKeepsOtherFields) {
  const std::string old =
      "{\n  \"name\": \"mine\",\n  \"type\": \"module\",\n  \"dependencies\": {\"a\": \"^1\"},\n"
      "  \"scripts\": {\"t\": \"node t.js\"}\n}\n";
  auto deps = parse_package_json(old);
  ASSERT_TRUE(deps);
  ASSERT_EQ(deps->size(), 1u);
  EXPECT_EQ((*deps)[0], (std::pair<std::string, std::string>{"a", "^1"}));
  deps->emplace_back("tiny", "file:pkgs/tiny-1.0.0.tgz");
  auto text = render_package_json(old, *deps);
  ASSERT_TRUE(text);
  EXPECT_LT(text->find("\"name\": \"mine\""), text->find("\"type\""));
  EXPECT_NE(text->find("\"scripts\""), std::string::npos);
  auto back = parse_package_json(*text);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, *deps);

  auto fresh = render_package_json("", {{"x", "1.0.0"}});
  ASSERT_TRUE(fresh);
  EXPECT_NE(fresh->find("\"name\": \"workspace\""), std::string::npos);
  EXPECT_TRUE(parse_package_json("")->empty());
  EXPECT_FALSE(parse_package_json("[1]"));
  EXPECT_FALSE(parse_package_json("{\"dependencies\": {\"a\": 1}}"));
  EXPECT_FALSE(render_package_json("{oops", {}));
}

TEST(InstallersRequest, BadInputNamesTheField) {
  EXPECT_TRUE(parse_manager("pip"));
  auto m = parse_manager("cargo");
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message.find("'manager'"), std::string::npos);
  EXPECT_NE(m.error().message.find("cargo"), std::string::npos);

  InstallRequest req;
  EXPECT_FALSE(validate_install(req));  // no packages
  req.packages = {"ok", "--index-url=http://evil"};
  auto st = validate_install(req);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("packages[1]"), std::string::npos) << st.error().message;
  req.packages = {"ok", "bad\nline"};
  EXPECT_FALSE(validate_install(req));
  req.packages = {"ok"};
  EXPECT_TRUE(validate_install(req));
  req.python.find_links = {"-x"};
  st = validate_install(req);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("find_links[0]"), std::string::npos);
  req.python.find_links = {"/workspace/wheels"};
  req.manager = PackageManager::kNpm;
  EXPECT_FALSE(validate_install(req));  // pip's sources are not npm's
}

}  // namespace
}  // namespace agentbox::sandbox
