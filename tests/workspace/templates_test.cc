// Template YAML validation (workspace/templates.h): what is accepted, what is refused and how
// the error names the line and the field, what only warns.

#include "workspace/templates.h"

#include <gtest/gtest.h>

namespace agentbox::workspace {
namespace {

std::string error_of(std::string_view yaml) {
  auto r = parse_template(yaml);
  EXPECT_FALSE(r.has_value()) << yaml;
  return r ? "" : r.error().message;
}

TEST(TemplateYaml, SeedShapeParses) {
  auto r = parse_template(R"(version: "1.0"
name: "default"
description: "Standard Python + Node.js workspace"
python:
  version: "3.12"
  dependencies:
    - matplotlib>=3.8.0
    - requests>=2.31.0
nodejs:
  version: "20"
  runtime: "bun"
  dependencies:
    docx: "^8.5.0"
system:
  shell: "/bin/bash"
  editor: "nano"
security:
  network_enabled: true
  filesystem_readonly: ["/usr"]
)");
  ASSERT_TRUE(r) << r.error().message;
  const Template& t = r->tmpl;
  EXPECT_EQ(t.name, "default");
  EXPECT_EQ(t.version, "1.0");
  EXPECT_EQ(t.python.version, "3.12");
  ASSERT_EQ(t.python.dependencies.size(), 2u);
  EXPECT_EQ(t.python.dependencies[1], "requests>=2.31.0");
  EXPECT_EQ(t.nodejs.runtime, "bun");
  ASSERT_EQ(t.nodejs.dependencies.size(), 1u);
  EXPECT_EQ(t.nodejs.dependencies[0].first, "docx");
  EXPECT_EQ(t.shell, "/bin/bash");
  EXPECT_EQ(t.network, "open");
  // What agentbox does not apply is said, with its line.
  ASSERT_EQ(r->warnings.size(), 2u);
  EXPECT_NE(r->warnings[0].find("line 16"), std::string::npos) << r->warnings[0];
  EXPECT_NE(r->warnings[0].find("system.editor"), std::string::npos) << r->warnings[0];
  EXPECT_NE(r->warnings[1].find("security.filesystem_readonly"), std::string::npos);
}

TEST(TemplateYaml, ExtensionsParse) {
  auto r = parse_template(R"(name: ext
files:
  a.txt: "A"
  dir/b.txt: "B"
setup:
  - echo one
  - echo two
env: {K: V}
security: {network: allowlist, allow: [example.org]}
limits: {memory_mb: 256, max_pids: 64}
health:
  - {name: venv, command: "test -d .venv", repair: "true"}
)");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->warnings.empty());
  EXPECT_EQ(r->tmpl.files.size(), 2u);
  EXPECT_EQ(r->tmpl.setup.size(), 2u);
  EXPECT_EQ(r->tmpl.env.at("K"), "V");
  EXPECT_EQ(r->tmpl.allow.at(0), "example.org");
  EXPECT_EQ(*r->tmpl.limits.memory_mb, 256u);
  EXPECT_EQ(r->tmpl.health.at(0).repair, "true");
}

TEST(TemplateYaml, ErrorsNameTheLineAndTheField) {
  EXPECT_NE(error_of("name: [unclosed\n").find("malformed YAML"), std::string::npos);
  EXPECT_NE(error_of("- a\n- b\n").find("mapping"), std::string::npos);
  EXPECT_NE(error_of("description: x\n").find("'name'"), std::string::npos);
  EXPECT_NE(error_of("name: a/b\n").find("invalid template name"), std::string::npos);
  std::string e = error_of("name: x\npython:\n  version: '3'\n  dependencies: {a: b}\n");
  EXPECT_NE(e.find("line 4"), std::string::npos) << e;
  EXPECT_NE(e.find("python.dependencies"), std::string::npos) << e;
  e = error_of("name: x\nnodejs:\n  runtime: deno\n");
  EXPECT_NE(e.find("line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("nodejs.runtime"), std::string::npos) << e;
  e = error_of("name: x\nlimits:\n  memory_mb: 1\n");
  EXPECT_NE(e.find("limits.memory_mb"), std::string::npos) << e;
  e = error_of("name: x\nsecurity: {network: everything}\n");
  EXPECT_NE(e.find("security.network"), std::string::npos) << e;
  e = error_of("name: x\nsecurity: {allow: [a.org]}\n");
  EXPECT_NE(e.find("allowlist"), std::string::npos) << e;
  e = error_of("name: x\nhealth:\n  - {name: a}\n");
  EXPECT_NE(e.find("health[0].command"), std::string::npos) << e;
  e = error_of("name: x\npython: {dependencies: ['--index-url=http://x']}\n");
  EXPECT_NE(e.find("python.dependencies[0]"), std::string::npos) << e;
  e = error_of("name: x\nsystem: {shell: bash}\n");
  EXPECT_NE(e.find("system.shell"), std::string::npos) << e;
}

TEST(TemplateYaml, FilePathsStayInTheWorkspace) {
  for (const char* p : {"../x", "/etc/passwd", "a/../../x", "a//b", "./a", "a/.", ""}) {
    std::string e = error_of(std::string("name: x\nfiles:\n  \"") + p + "\": y\n");
    EXPECT_NE(e.find("files."), std::string::npos) << p << ": " << e;
  }
  std::string e = error_of("name: x\nfiles:\n  a: '1'\n  a/b: '2'\n");
  EXPECT_NE(e.find("lies under the file"), std::string::npos) << e;
}

TEST(TemplateRef, NameOrNameAtVersion) {
  auto a = parse_template_ref("py");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->name, "py");
  EXPECT_FALSE(a->version);
  auto b = parse_template_ref("py@3");
  ASSERT_TRUE(b);
  EXPECT_EQ(*b->version, 3u);
  for (const char* bad : {"py@", "py@0", "py@x", "@1", "a/b", "py@1@2"}) {
    EXPECT_FALSE(parse_template_ref(bad)) << bad;
  }
}

}  // namespace
}  // namespace agentbox::workspace
