// Fuzz harness: LangBot Box runtime frames (dialects/langbot). A text frame of /rpc/ws is parsed
// as on_frame() does (a JSON object with seq_id and action), and its `context` and `data` go
// through the decoders the actions call: decode_context (the tenant placement),
// decode_box_spec (BoxSpec, with and without cmd), session_spec (the spec a BoxSpec maps to),
// decode_proc_spec / process_id_of (BoxManagedProcessSpec); every reply is encoded with
// reply_frame() and Python's json.dumps (py_dumps), whatever seq_id the frame carried.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dialects/langbot/internal.h"

using namespace agentbox::server::detail;
using namespace agentbox::server::detail::langbot;
using nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view frame(reinterpret_cast<const char*>(data), size);
  json m = json::parse(frame, nullptr, false);
  if (!m.is_object()) return 0;
  json seq_id = m.contains("seq_id") ? m["seq_id"] : json(nullptr);
  json payload = m.contains("data") ? m["data"] : json::object();
  json context = m.contains("context") ? m["context"] : json(nullptr);
  (void)decode_context(context, "");
  (void)decode_context(context, "instance-1");
  for (bool need_cmd : {false, true}) {
    auto spec = decode_box_spec(payload, need_cmd);
    if (spec) {
      auto s = session_spec(spec->shape);
      (void)s;
    } else {
      (void)py_dumps(reply_frame(seq_id, 1, error_message(spec.error()), ojson::object()));
    }
  }
  (void)process_id_of(payload);
  auto proc = decode_proc_spec(payload);
  if (payload.is_object() && payload.contains("spec")) (void)decode_proc_spec(payload["spec"]);
  (void)py_dumps(reply_frame(seq_id, 0, "success", ojson::parse(payload.dump())));
  (void)py_str(ojson::parse(payload.dump()));
  return 0;
}
