#include "server/http_error.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace agentbox::server {
namespace {

TEST(HttpError, EveryCodeHasItsApiStatus) {
  const std::vector<std::pair<Code, int>> expected = {
      {Code::kInvalid, 400},  {Code::kUnauthorized, 401}, {Code::kAccess, 403},
      {Code::kNotFound, 404}, {Code::kExists, 409},       {Code::kNotDir, 409},
      {Code::kIsDir, 409},    {Code::kNotEmpty, 409},     {Code::kTooBig, 413},
      {Code::kQuota, 429},    {Code::kTimedOut, 504},     {Code::kUnavailable, 503},
      {Code::kInternal, 500}, {Code::kNotSupported, 501},
  };
  for (const auto& [code, status] : expected) {
    EXPECT_EQ(http_status(Error::make(code, "x")), status) << code_name(code);
  }
  Error ni = not_implemented("suspend");
  EXPECT_EQ(ni.code, Code::kNotSupported);
  EXPECT_EQ(code_name(ni.code), "ENOTSUP");
  EXPECT_EQ(http_status(ni), 501);
  EXPECT_NE(ni.message.find("suspend"), std::string::npos);
}

TEST(HttpError, BodyIsTheApiShapeAndSurvivesBadUtf8) {
  auto body = error_body(Error::make(Code::kNotFound, "no such file: /workspace/a\xff.txt"));
  auto j = nlohmann::json::parse(body);
  EXPECT_EQ(j["error"]["code"], "ENOENT");
  EXPECT_EQ(j["error"]["message"], "no such file: /workspace/a\xEF\xBF\xBD.txt");
}

}  // namespace
}  // namespace agentbox::server
