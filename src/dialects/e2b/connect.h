#pragma once
// Connect-RPC (connectrpc.com/docs/protocol) with the JSON codec over HTTP/1.1, as the E2B SDKs'
// envd clients speak it (shared/E2B-MCP.md 3.1): unary calls (application/json in and out) and
// server streams (application/connect+json: one enveloped request message in; enveloped
// messages out on a chunked 200, then exactly one end-of-stream envelope carrying the error, if
// any, and metadata). No binary protobuf, no compression, no client streaming, no GET.
//
// Envelope: flags (1 byte: 0x01 compressed, 0x02 end of stream) | length (4 bytes, big-endian) |
// payload. Errors are {"code":"not_found","message":"..."}: on a unary call with the code's HTTP
// status and Content-Type application/json; on a stream always inside the end-of-stream envelope
// of a 200 reply (a non-200 stream reply would lose the code).
//
// Used by the E2B dialect (e2b.cc: process.Process; the files side: filesystem.Filesystem).
// Threading: the stream writer runs on the connection's (network) thread.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/internal/transport.h"

namespace agentbox::server::connectrpc {

using json = nlohmann::json;

// Connect's error codes.
enum class Code {
  kCanceled,
  kUnknown,
  kInvalidArgument,
  kDeadlineExceeded,
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,
  kFailedPrecondition,
  kAborted,
  kOutOfRange,
  kUnimplemented,
  kInternal,
  kUnavailable,
  kDataLoss,
  kUnauthenticated,
};

std::string_view code_name(Code c);  // "not_found", ...
std::optional<Code> code_from_name(std::string_view name);
// The HTTP status of a unary error reply (Connect's table: not_found 404, unavailable 503, ...).
int http_status(Code c);

struct RpcError {
  Code code = Code::kUnknown;
  std::string message;
  std::map<std::string, std::vector<std::string>> metadata;  // end-of-stream only
  // A unary reply's HTTP status other than the code's: 404 for a method that does not exist,
  // 415 for a codec not served (what Connect servers answer). 0: the code's.
  int status = 0;

  static RpcError make(Code c, std::string m, int status = 0) {
    return RpcError{c, std::move(m), {}, status};
  }
};

// An agentbox error in Connect's terms: EINVAL -> invalid_argument, ENOENT -> not_found,
// EEXIST -> already_exists, EACCES -> permission_denied, ETIMEDOUT -> deadline_exceeded,
// ENOTSUP -> unimplemented, ... The message is kept, prefixed with the agentbox code.
RpcError from_error(const Error& e);

// {"code":"...","message":"..."} (and "metadata" when there is some, end-of-stream form).
json error_json(const RpcError& e);

// ---- requests

enum class CallKind { kUnary, kServerStream };

// The call kind a request's Content-Type asks for: application/json (optionally with
// "; charset=utf-8") is unary, application/connect+json a server stream; anything else (binary
// protobuf, gRPC) is an error naming it.
std::optional<CallKind> call_kind(std::string_view content_type);

// The request message of a call: a unary body is one JSON object; a stream body is exactly one
// envelope (flags 0: compressed or end-of-stream envelopes are refused) holding one. Errors are
// invalid_argument (malformed JSON, a bad envelope) or unimplemented (compression).
std::expected<json, RpcError> decode_request(CallKind kind, std::string_view body);

// Connect-Timeout-Ms: 1 to 10 ASCII digits. Absent -> nullopt; malformed -> invalid_argument.
std::expected<std::optional<std::chrono::milliseconds>, RpcError> parse_timeout(
    std::string_view header, bool present);

// Connect-Protocol-Version, when present, must be "1".
std::optional<RpcError> check_protocol_version(std::string_view header, bool present);

// ---- replies

// One envelope around `payload`.
std::string envelope(std::uint8_t flags, std::string_view payload);
// A message envelope (flags 0) of `message`.
std::string message_frame(const json& message);
// The end-of-stream envelope (flags 0x02): {} or {"error":{...},"metadata":{...}}.
std::string end_frame(const std::optional<RpcError>& error,
                      const std::map<std::string, std::vector<std::string>>& metadata = {});

// A unary reply: 200 application/json with the message, or the error's status and JSON body.
detail::Reply unary_ok(const json& message);
detail::Reply unary_error(const RpcError& e);

// ---- a server-streaming reply, on the connection of `call`

class StreamWriter {
 public:
  explicit StreamWriter(detail::Call* call) : call_(call) {}
  // Writes the 200 head (application/connect+json, chunked). False: the client is gone.
  boost::asio::awaitable<bool> begin();
  bool begun() const { return begun_; }
  // Queues one message envelope; flush() writes what is queued as one chunk (one write).
  void queue(const json& message);
  boost::asio::awaitable<bool> flush();
  // queue() + flush().
  boost::asio::awaitable<bool> send(const json& message);
  // What is queued, the end-of-stream envelope and the last chunk, in one write; begins first
  // when not begun (an error before the first message still travels in a 200 reply). Returns
  // whether the connection may serve another request.
  boost::asio::awaitable<bool> end(std::optional<RpcError> error = std::nullopt);

 private:
  boost::asio::awaitable<bool> write_raw(std::string bytes);
  detail::Call* call_;
  std::string pending_;  // envelopes queued, not written yet
  bool begun_ = false;
  bool failed_ = false;
};

}  // namespace agentbox::server::connectrpc
