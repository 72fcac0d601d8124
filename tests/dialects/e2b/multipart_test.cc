// dialects/e2b/multipart.h: the multipart/form-data bodies the E2B SDKs upload files with, fed in
// pieces of every size, and the faults a sender can make, each refused with its name.

#include "dialects/e2b/multipart.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace agentbox::server {
namespace {

struct Part {
  MultipartHead head;
  std::string body;
  bool ended = false;
};

// Feeds `body` in pieces of `step` bytes; the parts seen, or the first error.
Result<std::vector<Part>> parse(const std::string& boundary, const std::string& body,
                                std::size_t step, MultipartLimits limits = {}) {
  MultipartParser p(boundary, limits);
  std::vector<Part> parts;
  for (std::size_t i = 0; i < body.size(); i += step) {
    std::vector<MultipartEvent> evs;
    if (auto s = p.feed(std::string_view(body).substr(i, step), &evs); !s) {
      return std::unexpected(s.error());
    }
    for (auto& e : evs) {
      switch (e.kind) {
        case MultipartEvent::Kind::kBegin: parts.push_back({e.head, "", false}); break;
        case MultipartEvent::Kind::kData: parts.back().body += e.data; break;
        case MultipartEvent::Kind::kEnd: parts.back().ended = true; break;
      }
    }
  }
  if (auto s = p.finish(); !s) return std::unexpected(s.error());
  return parts;
}

// What undici sends for files.write([{path, data}, ...]).
std::string form(const std::string& boundary,
                 const std::vector<std::pair<std::string, std::string>>& files) {
  std::string out;
  for (const auto& [name, data] : files) {
    out += "--" + boundary + "\r\n";
    out += "Content-Disposition: form-data; name=\"file\"; filename=\"" + name + "\"\r\n";
    out += "Content-Type: application/octet-stream\r\n\r\n";
    out += data + "\r\n";
  }
  out += "--" + boundary + "--\r\n";
  return out;
}

TEST(E2bFilesMultipart, BoundaryComesFromTheContentType) {
  EXPECT_EQ(*MultipartParser::boundary_of("multipart/form-data; boundary=----formdata-undici-0"),
            "----formdata-undici-0");
  EXPECT_EQ(*MultipartParser::boundary_of("Multipart/Form-Data;boundary=\"a b:c\""), "a b:c");
  auto not_form = MultipartParser::boundary_of("application/json");
  ASSERT_FALSE(not_form);
  EXPECT_NE(not_form.error().message.find("not multipart/form-data"), std::string::npos);
  auto none = MultipartParser::boundary_of("multipart/form-data");
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("no boundary"), std::string::npos);
  EXPECT_FALSE(MultipartParser::boundary_of("multipart/form-data; boundary=" + std::string(71, 'x')));
  EXPECT_FALSE(MultipartParser::boundary_of("multipart/form-data; boundary=\"\""));
}

TEST(E2bFilesMultipart, ManyFilesArriveWhateverThePieceSize) {
  std::string binary("\0\r\n--not-the-boundary\r\n\xff", 25);
  std::string big(300000, 'z');
  std::string body = form("XyZ", {{"/workspace/a.txt", "hello"},
                                  {"/workspace/sub/b.bin", binary},
                                  {"/workspace/empty", ""},
                                  {"/workspace/big", big}});
  for (std::size_t step : {1ul, 2ul, 7ul, 64ul, 4096ul, body.size()}) {
    SCOPED_TRACE("piece size " + std::to_string(step));
    auto parts = parse("XyZ", body, step);
    ASSERT_TRUE(parts) << parts.error().message;
    ASSERT_EQ(parts->size(), 4u);
    EXPECT_EQ((*parts)[0].head.name, "file");
    EXPECT_EQ((*parts)[0].head.filename.value_or("?"), "/workspace/a.txt");
    EXPECT_EQ((*parts)[0].head.content_type, "application/octet-stream");
    EXPECT_EQ((*parts)[0].body, "hello");
    EXPECT_EQ((*parts)[1].body, binary);
    EXPECT_EQ((*parts)[2].body, "");
    EXPECT_EQ((*parts)[3].body, big);
    for (const auto& p : *parts) EXPECT_TRUE(p.ended);
  }
}

TEST(E2bFilesMultipart, PreambleEpilogueFieldsAndEncodedNames) {
  std::string body =
      "this preamble is ignored\r\n"
      "--b\r\n"
      "Content-Disposition: form-data; name=\"note\"\r\n\r\n"
      "not a file\r\n"
      "--b  \r\n"  // transport padding after a delimiter
      "content-disposition: form-data; name=file; filename*=UTF-8''na%C3%AFve%20name.txt; "
      "filename=\"fallback\"\r\n\r\n"
      "x\r\n"
      "--b\r\n"
      "Content-Disposition: form-data; name=\"file\"; filename=\"q\\\"uote\"\r\n\r\n"
      "y\r\n"
      "--b--\r\nepilogue, ignored too";
  auto parts = parse("b", body, 3);
  ASSERT_TRUE(parts) << parts.error().message;
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ((*parts)[0].head.name, "note");
  EXPECT_FALSE((*parts)[0].head.filename);
  EXPECT_EQ((*parts)[1].head.filename.value_or(""), "na\xC3\xAFve name.txt");
  EXPECT_EQ((*parts)[2].head.filename.value_or(""), "q\"uote");
}

TEST(E2bFilesMultipart, FaultsAreRefusedByName) {
  struct Case {
    std::string body;
    std::string says;
  };
  std::vector<Case> cases = {
      {"no delimiter anywhere", "no boundary delimiter"},
      {"--b\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc", "no closing boundary"},
      {"--b\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc\r\n--b", "no closing"},
      {"--b\r\nContent-Type: text/plain\r\n\r\nabc\r\n--b--", "no Content-Disposition"},
      {"--b\r\nContent-Disposition: attachment; name=\"f\"\r\n\r\nabc\r\n--b--", "not form-data"},
      {"--b\r\nContent-Disposition: form-data; filename=\"x\"\r\n\r\nabc\r\n--b--",
       "no name parameter"},
      {"--b\r\nContent-Disposition: form-data; name=\"f\r\n\r\nabc\r\n--b--", "unterminated"},
      {"--b\r\nno colon here\r\n\r\nabc\r\n--b--", "malformed header line"},
      {"--bXY\r\n", "neither CRLF nor '--'"},
      {"--b\r\nContent-Disposition: form-data; name=f; filename*=latin1''x\r\n\r\n\r\n--b--",
       "filename*"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    auto parts = parse("b", c.body, 5);
    ASSERT_FALSE(parts);
    EXPECT_EQ(parts.error().code, Code::kInvalid);
    EXPECT_NE(parts.error().message.find(c.says), std::string::npos) << parts.error().message;
  }
}

TEST(E2bFilesMultipart, WhatTheSenderControlsIsBounded) {
  MultipartLimits small;
  small.max_header_bytes = 100;
  small.max_parts = 2;
  small.max_preamble_bytes = 50;
  auto headers = parse("b", "--b\r\nX-Pad: " + std::string(200, 'p') + "\r\n\r\n\r\n--b--", 9,
                       small);
  ASSERT_FALSE(headers);
  EXPECT_EQ(headers.error().code, Code::kTooBig);
  auto parts = parse("b", form("b", {{"1", "a"}, {"2", "b"}, {"3", "c"}}), 9, small);
  ASSERT_FALSE(parts);
  EXPECT_EQ(parts.error().code, Code::kTooBig);
  EXPECT_NE(parts.error().message.find("more than 2 parts"), std::string::npos);
  auto preamble = parse("b", std::string(100, 'x') + form("b", {{"1", "a"}}), 9, small);
  ASSERT_FALSE(preamble);
  EXPECT_NE(preamble.error().message.find("first 50 bytes"), std::string::npos);
}

TEST(E2bFilesMultipart, AnErrorSpendsTheParser) {
  MultipartParser p("b");
  std::vector<MultipartEvent> evs;
  ASSERT_FALSE(p.feed("--b\r\nbroken\r\n\r\n", &evs));
  auto again = p.feed("--b--", &evs);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message.find("malformed header line"), std::string::npos);
  EXPECT_FALSE(p.finish());
}

}  // namespace
}  // namespace agentbox::server
