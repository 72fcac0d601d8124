// Fuzz harness: the xbot runner protocol as agentboxd's /ws/{user} endpoint reads it
// (runner/protocol.h): a text frame through decode_flat_or_envelope() (RunnerConn::on_frame) and
// its body through every from_json() the daemon applies (register, replies, pushes, transfers);
// a binary frame through decode_binary_chunk() (RunnerConn::on_binary). The first byte says
// which kind of frame the rest is.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "runner/protocol.h"

namespace proto = agentbox::runner::proto;

namespace {
template <typename T>
void body(const proto::Envelope& e) {
  T out;
  (void)proto::from_json(e.body, out);
  if constexpr (requires { proto::to_json(out); }) (void)proto::to_json(out);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::string_view frame(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    auto c = proto::decode_binary_chunk(frame);
    if (c) {
      // What decodes re-encodes to the same frame.
      if (proto::binary_chunk(c->id, c->offset, c->data) != frame) std::abort();
    }
    return 0;
  }
  auto e = proto::decode_flat_or_envelope(frame);
  if (!e) return 0;
  (void)proto::is_push(e->type);
  body<proto::RegisterBody>(*e);
  body<proto::RegisterOk>(*e);
  body<proto::ErrorBody>(*e);
  body<proto::ExecRequest>(*e);
  body<proto::ExecResult>(*e);
  body<proto::PathRequest>(*e);
  body<proto::FileContent>(*e);
  body<proto::WriteFileRequest>(*e);
  body<proto::MkdirAllRequest>(*e);
  body<proto::FileInfo>(*e);
  body<proto::DirEntries>(*e);
  body<proto::DownloadRequest>(*e);
  body<proto::SizeBody>(*e);
  body<proto::BgExecRequest>(*e);
  body<proto::TaskRequest>(*e);
  body<proto::BgOutput>(*e);
  body<proto::StdioStart>(*e);
  body<proto::StreamData>(*e);
  body<proto::StreamRequest>(*e);
  body<proto::StreamExit>(*e);
  body<proto::PtyCreate>(*e);
  body<proto::PtyResize>(*e);
  body<proto::StreamSignal>(*e);
  body<proto::LlmModels>(*e);
  body<proto::FileBegin>(*e);
  body<proto::FileChunk>(*e);
  body<proto::FileEnd>(*e);
  body<proto::Ack>(*e);
  body<proto::BoxLimits>(*e);
  proto::ErrorBody eb;
  (void)proto::from_json(e->body, eb);
  (void)proto::to_code(eb.code, eb.message);
  (void)proto::encode(*e);
  return 0;
}
