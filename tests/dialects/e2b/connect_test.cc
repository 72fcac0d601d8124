// The Connect-RPC codec (dialects/e2b/connect.h) against the protocol's own bytes: envelopes, the
// end-of-stream frame, error codes and their statuses, Connect-Timeout-Ms.

#include "dialects/e2b/connect.h"

#include <gtest/gtest.h>

namespace agentbox::server::connectrpc {
namespace {

std::string env(std::uint8_t flags, const std::string& payload) {
  std::string s(1, static_cast<char>(flags));
  auto n = static_cast<std::uint32_t>(payload.size());
  for (int shift : {24, 16, 8, 0}) s.push_back(static_cast<char>((n >> shift) & 0xff));
  return s + payload;
}

TEST(Connect, EnvelopesAreFlagsLengthPayload) {
  // The bytes E2B-MCP.md 3.1 saw from upstream envd.
  EXPECT_EQ(message_frame(json::parse(R"({"event":{"start":{"pid":2093}}})")),
            env(0, R"({"event":{"start":{"pid":2093}}})"));
  EXPECT_EQ(message_frame(json::parse(R"({"event":{"start":{"pid":2093}}})")).substr(0, 5),
            std::string("\x00\x00\x00\x00\x20", 5));
  EXPECT_EQ(end_frame(std::nullopt), env(2, "{}"));
  auto e = RpcError::make(Code::kDeadlineExceeded, "too slow");
  EXPECT_EQ(end_frame(e), env(2, R"({"error":{"code":"deadline_exceeded","message":"too slow"}})"));
  EXPECT_EQ(end_frame(std::nullopt, {{"k", {"v"}}}), env(2, R"({"metadata":{"k":["v"]}})"));
}

TEST(Connect, CodesHaveConnectsNamesAndStatuses) {
  struct Row {
    Code c;
    const char* name;
    int status;
  };
  for (Row r : {Row{Code::kCanceled, "canceled", 499}, Row{Code::kInvalidArgument, "invalid_argument", 400},
                Row{Code::kNotFound, "not_found", 404}, Row{Code::kAlreadyExists, "already_exists", 409},
                Row{Code::kPermissionDenied, "permission_denied", 403},
                Row{Code::kResourceExhausted, "resource_exhausted", 429},
                Row{Code::kFailedPrecondition, "failed_precondition", 400},
                Row{Code::kUnimplemented, "unimplemented", 501},
                Row{Code::kUnavailable, "unavailable", 503},
                Row{Code::kDeadlineExceeded, "deadline_exceeded", 504},
                Row{Code::kUnauthenticated, "unauthenticated", 401}}) {
    EXPECT_EQ(code_name(r.c), r.name);
    EXPECT_EQ(http_status(r.c), r.status) << r.name;
    EXPECT_EQ(code_from_name(r.name), r.c);
  }
  auto rep = unary_error(RpcError::make(Code::kNotFound, "gone"));
  EXPECT_EQ(rep.status, 404);
  EXPECT_EQ(rep.content_type, "application/json");
  EXPECT_EQ(rep.body, R"({"code":"not_found","message":"gone"})");
  EXPECT_EQ(unary_error(RpcError::make(Code::kUnimplemented, "x", 404)).status, 404);
  auto ok = unary_ok(json::object());
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "{}");
}

TEST(Connect, AgentboxErrorsMapOntoConnectCodes) {
  EXPECT_EQ(from_error(Error::make(agentbox::Code::kInvalid, "m")).code, Code::kInvalidArgument);
  EXPECT_EQ(from_error(Error::make(agentbox::Code::kNotFound, "m")).code, Code::kNotFound);
  EXPECT_EQ(from_error(Error::make(agentbox::Code::kExists, "m")).code, Code::kAlreadyExists);
  EXPECT_EQ(from_error(Error::make(agentbox::Code::kAccess, "m")).code, Code::kPermissionDenied);
  EXPECT_EQ(from_error(Error::make(agentbox::Code::kTooBig, "m")).code, Code::kResourceExhausted);
  EXPECT_EQ(from_error(Error::make(agentbox::Code::kNotSupported, "m")).code, Code::kUnimplemented);
  EXPECT_EQ(from_error(Error::make(agentbox::Code::kNotFound, "no such file")).message,
            "ENOENT: no such file");
}

TEST(Connect, RequestsDecodeByCallKind) {
  EXPECT_EQ(call_kind("application/json"), CallKind::kUnary);
  EXPECT_EQ(call_kind("application/json; charset=utf-8"), CallKind::kUnary);
  EXPECT_EQ(call_kind("Application/Connect+JSON"), CallKind::kServerStream);
  EXPECT_FALSE(call_kind("application/proto").has_value());
  EXPECT_FALSE(call_kind("application/connect+proto").has_value());

  EXPECT_EQ(decode_request(CallKind::kUnary, R"({"a":1})").value()["a"], 1);
  EXPECT_EQ(decode_request(CallKind::kUnary, "").value(), json::object());
  EXPECT_EQ(decode_request(CallKind::kUnary, "{x").error().code, Code::kInvalidArgument);
  EXPECT_EQ(decode_request(CallKind::kUnary, "[]").error().code, Code::kInvalidArgument);

  EXPECT_EQ(decode_request(CallKind::kServerStream, env(0, R"({"p":2})")).value()["p"], 2);
  EXPECT_EQ(decode_request(CallKind::kServerStream, "{}").error().code, Code::kInvalidArgument);
  EXPECT_EQ(decode_request(CallKind::kServerStream, env(1, "{}")).error().code,
            Code::kUnimplemented);  // compressed
  EXPECT_EQ(decode_request(CallKind::kServerStream, env(2, "{}")).error().code,
            Code::kInvalidArgument);
  EXPECT_EQ(decode_request(CallKind::kServerStream, env(0, "{}") + env(0, "{}")).error().code,
            Code::kInvalidArgument);  // one message only
  std::string short_body = env(0, "{}");
  short_body.pop_back();
  EXPECT_EQ(decode_request(CallKind::kServerStream, short_body).error().code,
            Code::kInvalidArgument);
}

TEST(Connect, TimeoutHeaderIsOneToTenDigitsOfMilliseconds) {
  EXPECT_FALSE(parse_timeout("", false).value().has_value());
  EXPECT_EQ(parse_timeout("60000", true).value()->count(), 60000);
  EXPECT_EQ(parse_timeout("0", true).value()->count(), 0);
  for (const char* bad : {"", "-1", "1.5", "12345678901", "soon", " 5"}) {
    EXPECT_FALSE(parse_timeout(bad, true).has_value()) << bad;
  }
  EXPECT_FALSE(check_protocol_version("", false).has_value());
  EXPECT_FALSE(check_protocol_version("1", true).has_value());
  EXPECT_TRUE(check_protocol_version("2", true).has_value());
}

}  // namespace
}  // namespace agentbox::server::connectrpc
