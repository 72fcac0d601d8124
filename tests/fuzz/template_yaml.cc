// Fuzz harness: template YAML (workspace/templates.h parse_template), what POST /v1/templates
// hands the daemon, and the template references of a session create (parse_template_ref).

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "workspace/templates.h"

using namespace agentbox::workspace;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view yaml(reinterpret_cast<const char*>(data), size);
  auto t = parse_template(yaml);
  if (t) (void)check_host_paths(t->tmpl, {"/nonexistent-readonly"});
  if (size < 256) (void)parse_template_ref(yaml);
  return 0;
}
