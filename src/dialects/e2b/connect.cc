#include "dialects/e2b/connect.h"

#include <array>
#include <cstdio>
#include <boost/asio/write.hpp>

namespace agentbox::server::connectrpc {

namespace {

struct CodeRow {
  Code code;
  std::string_view name;
  int status;
};

// connectrpc.com/docs/protocol#error-codes
constexpr std::array<CodeRow, 16> kCodes = {{
    {Code::kCanceled, "canceled", 499},
    {Code::kUnknown, "unknown", 500},
    {Code::kInvalidArgument, "invalid_argument", 400},
    {Code::kDeadlineExceeded, "deadline_exceeded", 504},
    {Code::kNotFound, "not_found", 404},
    {Code::kAlreadyExists, "already_exists", 409},
    {Code::kPermissionDenied, "permission_denied", 403},
    {Code::kResourceExhausted, "resource_exhausted", 429},
    {Code::kFailedPrecondition, "failed_precondition", 400},
    {Code::kAborted, "aborted", 409},
    {Code::kOutOfRange, "out_of_range", 400},
    {Code::kUnimplemented, "unimplemented", 501},
    {Code::kInternal, "internal", 500},
    {Code::kUnavailable, "unavailable", 503},
    {Code::kDataLoss, "data_loss", 500},
    {Code::kUnauthenticated, "unauthenticated", 401},
}};

const CodeRow& row(Code c) {
  for (const auto& r : kCodes) {
    if (r.code == c) return r;
  }
  return kCodes[1];  // unknown
}

constexpr std::size_t kPrefix = 5;

}  // namespace

std::string_view code_name(Code c) { return row(c).name; }

std::optional<Code> code_from_name(std::string_view name) {
  for (const auto& r : kCodes) {
    if (r.name == name) return r.code;
  }
  return std::nullopt;
}

int http_status(Code c) { return row(c).status; }

RpcError from_error(const Error& e) {
  Code c = Code::kUnknown;
  switch (e.code) {
    case agentbox::Code::kInvalid: c = Code::kInvalidArgument; break;
    case agentbox::Code::kUnauthorized: c = Code::kUnauthenticated; break;
    case agentbox::Code::kAccess: c = Code::kPermissionDenied; break;
    case agentbox::Code::kNotFound: c = Code::kNotFound; break;
    case agentbox::Code::kExists: c = Code::kAlreadyExists; break;
    case agentbox::Code::kNotDir:
    case agentbox::Code::kIsDir:
    case agentbox::Code::kNotEmpty:
      c = Code::kFailedPrecondition;
      break;
    case agentbox::Code::kTooBig:
    case agentbox::Code::kQuota:
      c = Code::kResourceExhausted;
      break;
    case agentbox::Code::kTimedOut: c = Code::kDeadlineExceeded; break;
    case agentbox::Code::kUnavailable: c = Code::kUnavailable; break;
    case agentbox::Code::kInternal: c = Code::kInternal; break;
    case agentbox::Code::kNotSupported: c = Code::kUnimplemented; break;
    case agentbox::Code::kImage: c = Code::kFailedPrecondition; break;
    case agentbox::Code::kUpstream: c = Code::kUnavailable; break;
  }
  return RpcError::make(c, std::string(agentbox::code_name(e.code)) + ": " + e.message);
}

json error_json(const RpcError& e) {
  json j = json::object();
  j["code"] = std::string(code_name(e.code));
  j["message"] = e.message;
  return j;
}

std::optional<CallKind> call_kind(std::string_view content_type) {
  std::string_view t = content_type.substr(0, content_type.find(';'));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
  auto lower_eq = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      char x = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
      if (x != b[i]) return false;
    }
    return true;
  };
  if (lower_eq(t, "application/json")) return CallKind::kUnary;
  if (lower_eq(t, "application/connect+json")) return CallKind::kServerStream;
  return std::nullopt;
}

std::expected<json, RpcError> decode_request(CallKind kind, std::string_view body) {
  std::string_view payload = body;
  if (kind == CallKind::kServerStream) {
    if (body.size() < kPrefix) {
      return std::unexpected(RpcError::make(
          Code::kInvalidArgument, "a stream request must be one enveloped message (5-byte prefix)"));
    }
    auto flags = static_cast<std::uint8_t>(body[0]);
    std::uint32_t len = 0;
    for (int i = 1; i <= 4; ++i) len = (len << 8) | static_cast<std::uint8_t>(body[i]);
    if (flags & 0x01) {
      return std::unexpected(
          RpcError::make(Code::kUnimplemented, "compressed envelopes are not supported"));
    }
    if (flags != 0) {
      return std::unexpected(RpcError::make(
          Code::kInvalidArgument, "the request envelope has flags " + std::to_string(flags) +
                                      "; a request message has flags 0"));
    }
    if (body.size() - kPrefix != len) {
      return std::unexpected(RpcError::make(
          Code::kInvalidArgument,
          "the request envelope says " + std::to_string(len) + " bytes but " +
              std::to_string(body.size() - kPrefix) +
              " follow; a server-streaming call takes exactly one message"));
    }
    payload = body.substr(kPrefix);
  }
  if (payload.empty()) return json::object();  // Connect: an empty body is the empty message
  json j = json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return std::unexpected(
        RpcError::make(Code::kInvalidArgument, "the request message is not valid JSON"));
  }
  if (!j.is_object()) {
    return std::unexpected(
        RpcError::make(Code::kInvalidArgument, "the request message must be a JSON object"));
  }
  return j;
}

std::expected<std::optional<std::chrono::milliseconds>, RpcError> parse_timeout(
    std::string_view header, bool present) {
  if (!present) return std::optional<std::chrono::milliseconds>{};
  bool ok = !header.empty() && header.size() <= 10;
  std::int64_t v = 0;
  for (char c : header) {
    if (c < '0' || c > '9') {
      ok = false;
      break;
    }
    v = v * 10 + (c - '0');
  }
  if (!ok) {
    return std::unexpected(RpcError::make(
        Code::kInvalidArgument, "Connect-Timeout-Ms must be 1 to 10 digits (milliseconds)"));
  }
  return std::optional<std::chrono::milliseconds>(std::chrono::milliseconds(v));
}

std::optional<RpcError> check_protocol_version(std::string_view header, bool present) {
  if (!present || header == "1") return std::nullopt;
  return RpcError::make(Code::kInvalidArgument,
                        "Connect-Protocol-Version " + std::string(header) + " is not supported (1 is)");
}

std::string envelope(std::uint8_t flags, std::string_view payload) {
  std::string out;
  out.reserve(kPrefix + payload.size());
  auto len = static_cast<std::uint32_t>(payload.size());
  out.push_back(static_cast<char>(flags));
  out.push_back(static_cast<char>((len >> 24) & 0xff));
  out.push_back(static_cast<char>((len >> 16) & 0xff));
  out.push_back(static_cast<char>((len >> 8) & 0xff));
  out.push_back(static_cast<char>(len & 0xff));
  out.append(payload);
  return out;
}

std::string message_frame(const json& message) { return envelope(0x00, to_wire(message)); }

std::string end_frame(const std::optional<RpcError>& error,
                      const std::map<std::string, std::vector<std::string>>& metadata) {
  json j = json::object();
  if (error) {
    j["error"] = error_json(*error);
    if (!error->metadata.empty()) j["error"]["metadata"] = error->metadata;
  }
  if (!metadata.empty()) j["metadata"] = metadata;
  return envelope(0x02, to_wire(j));
}

detail::Reply unary_ok(const json& message) {
  detail::Reply r;
  r.status = 200;
  r.body = to_wire(message);
  r.content_type = "application/json";
  return r;
}

detail::Reply unary_error(const RpcError& e) {
  detail::Reply r;
  r.status = e.status != 0 ? e.status : http_status(e.code);
  r.body = to_wire(error_json(e));
  r.content_type = "application/json";
  return r;
}

// ---- StreamWriter

boost::asio::awaitable<bool> StreamWriter::begin() {
  if (begun_) co_return !failed_;
  begun_ = true;
  detail::Context* ctx = call_->ctx;
  detail::Exchange* ex = &call_->ex;
  detail::http::response<detail::http::empty_body> res{detail::http::status::ok, ex->version};
  res.set(detail::http::field::server, "agentboxd");
  res.set(detail::http::field::content_type, "application/connect+json");
  res.set(detail::http::field::cache_control, "no-store");
  // The request body was read whole before the stream starts; a client that still had one
  // pending (it cannot here) would lose the connection's framing.
  res.keep_alive(ex->keep_alive && !ex->body_pending && !ctx->stopping);
  res.chunked(true);
  detail::http::response_serializer<detail::http::empty_body> sr{res};
  call_->conn->stream.expires_after(ctx->opts.io_timeout);
  auto [ec, n] =
      co_await detail::http::async_write_header(call_->conn->stream, sr, detail::kTuple);
  ctx->metrics.add_bytes_out(n);
  detail::log_request(call_, 200);
  if (ec) failed_ = true;
  co_return !failed_;
}

namespace {

// HTTP/1.1 chunked framing of `data` (not empty).
void append_chunk(std::string* out, std::string_view data) {
  char size[20];
  int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  out->append(size, static_cast<std::size_t>(n));
  out->append(data);
  out->append("\r\n");
}

}  // namespace

boost::asio::awaitable<bool> StreamWriter::write_raw(std::string bytes) {
  if (failed_) co_return false;
  detail::Context* ctx = call_->ctx;
  call_->conn->stream.expires_after(ctx->opts.io_timeout);
  auto [ec, n] = co_await boost::asio::async_write(call_->conn->stream,
                                                   boost::asio::buffer(bytes), detail::kTuple);
  ctx->metrics.add_bytes_out(n);
  if (ec) failed_ = true;
  co_return !failed_;
}

void StreamWriter::queue(const json& message) { pending_ += message_frame(message); }

boost::asio::awaitable<bool> StreamWriter::flush() {
  if (!begun_) {
    bool ok = co_await begin();  // (not inside &&: g++ 12)
    if (!ok) co_return false;
  }
  if (pending_.empty()) co_return !failed_;
  std::string bytes;
  append_chunk(&bytes, pending_);
  pending_.clear();
  co_return co_await write_raw(std::move(bytes));
}

boost::asio::awaitable<bool> StreamWriter::send(const json& message) {
  queue(message);
  co_return co_await flush();
}

boost::asio::awaitable<bool> StreamWriter::end(std::optional<RpcError> error) {
  if (!begun_) {
    bool ok = co_await begin();  // (not inside &&: g++ 12)
    if (!ok) co_return false;
  }
  pending_ += end_frame(error);
  std::string bytes;
  append_chunk(&bytes, pending_);
  pending_.clear();
  bytes += "0\r\n\r\n";  // the last chunk
  if (!co_await write_raw(std::move(bytes))) co_return false;
  detail::Context* ctx = call_->ctx;
  co_return call_->ex.keep_alive && !call_->ex.body_pending && !ctx->stopping;
}

}  // namespace agentbox::server::connectrpc
