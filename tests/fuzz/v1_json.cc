// Fuzz harness: the /v1 JSON request decoders (server/json_codec.h). The daemon parses a body
// with parse_object() and hands it to the route's decoder; every decoder runs on every input
// (a body meant for one route is hostile input to the others).

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/json_codec.h"

using namespace agentbox::server;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  auto obj = parse_object(body, /*allow_empty=*/true);
  if (!obj) return 0;
  const json& j = *obj;
  (void)decode_create_session(j);
  (void)decode_create_session(j, "agent-{agent_id}");
  (void)decode_add_mounts(j);
  (void)decode_session_patch(j);
  (void)decode_install(j);
  (void)decode_exec(j);
  (void)decode_seed_exec(j);
  (void)decode_seed_read(j);
  (void)decode_seed_write(j);
  (void)decode_mkdir(j);
  (void)decode_rename(j);
  (void)decode_process_start(j);
  (void)decode_signal(j);
  (void)decode_pty_size(j);
  (void)decode_limits(j, "limits");
  agentbox::session::NetworkSpec net;
  (void)decode_network(j, &net);
  (void)check_known_fields(j, {"id", "limits"}, "x");
  (void)to_wire(j);
  return 0;
}
