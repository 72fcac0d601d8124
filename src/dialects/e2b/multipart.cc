#include "dialects/e2b/multipart.h"

#include <algorithm>
#include <cctype>

namespace agentbox::server {
namespace {

constexpr std::size_t kMaxPaddingBytes = 64;  // LWSP allowed after a delimiter (RFC 2046)

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// RFC 2046 bchars, plus the characters form encoders put in boundaries.
bool boundary_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("'()+_,-./:=? ").find(c) != std::string_view::npos;
}

struct Param {
  std::string key;  // lower-cased
  std::string value;
};

// "form-data; name=\"file\"; filename=\"a.txt\"" -> the type ("form-data") and its parameters.
// A quoted value ends at the first unescaped '"'; a backslash quotes the next character
// (RFC 2616 quoted-pair, as Go's mime package reads it).
Result<std::pair<std::string, std::vector<Param>>> parse_params(std::string_view v,
                                                                std::string_view what) {
  auto semi = v.find(';');
  std::string type(trim(v.substr(0, semi)));
  std::vector<Param> params;
  std::size_t i = semi == std::string_view::npos ? v.size() : semi + 1;
  while (i < v.size()) {
    while (i < v.size() && (v[i] == ' ' || v[i] == '\t' || v[i] == ';')) ++i;
    if (i >= v.size()) break;
    auto eq = v.find('=', i);
    if (eq == std::string_view::npos) {
      return fail(Code::kInvalid, std::string(what) + ": parameter '" +
                                      std::string(trim(v.substr(i))) + "' has no value");
    }
    std::string key(trim(v.substr(i, eq - i)));
    std::transform(key.begin(), key.end(), key.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    i = eq + 1;
    while (i < v.size() && (v[i] == ' ' || v[i] == '\t')) ++i;
    std::string value;
    if (i < v.size() && v[i] == '"') {
      ++i;
      bool closed = false;
      while (i < v.size()) {
        char c = v[i++];
        if (c == '\\' && i < v.size()) {
          value.push_back(v[i++]);
        } else if (c == '"') {
          closed = true;
          break;
        } else {
          value.push_back(c);
        }
      }
      if (!closed) {
        return fail(Code::kInvalid,
                    std::string(what) + ": parameter '" + key + "' has an unterminated quote");
      }
    } else {
      auto end = v.find(';', i);
      value = std::string(trim(v.substr(i, end - i)));
      i = end == std::string_view::npos ? v.size() : end;
    }
    params.push_back({std::move(key), std::move(value)});
  }
  return std::make_pair(std::move(type), std::move(params));
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// RFC 5987 ext-value: UTF-8''percent%20encoded.
Result<std::string> decode_ext_value(std::string_view v) {
  auto q1 = v.find('\'');
  auto q2 = q1 == std::string_view::npos ? q1 : v.find('\'', q1 + 1);
  if (q2 == std::string_view::npos || !iequals(v.substr(0, q1), "utf-8")) {
    return fail(Code::kInvalid,
                "multipart part: filename* must be UTF-8''<percent-encoded name>, got '" +
                    std::string(v) + "'");
  }
  std::string out;
  for (std::size_t i = q2 + 1; i < v.size(); ++i) {
    if (v[i] != '%') {
      out.push_back(v[i]);
      continue;
    }
    int hi = i + 2 < v.size() ? hex_digit(v[i + 1]) : -1;
    int lo = i + 2 < v.size() ? hex_digit(v[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      return fail(Code::kInvalid, "multipart part: malformed percent-encoding in filename* '" +
                                      std::string(v) + "'");
    }
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

}  // namespace

Result<std::string> MultipartParser::boundary_of(std::string_view content_type) {
  auto parsed = parse_params(content_type, "Content-Type");
  if (!parsed) return std::unexpected(parsed.error());
  if (!iequals(parsed->first, "multipart/form-data")) {
    return fail(Code::kInvalid,
                "Content-Type '" + parsed->first + "' is not multipart/form-data");
  }
  for (const Param& p : parsed->second) {
    if (p.key != "boundary") continue;
    if (p.value.empty() || p.value.size() > 70 || p.value.back() == ' ' ||
        !std::all_of(p.value.begin(), p.value.end(), boundary_char)) {
      return fail(Code::kInvalid, "Content-Type: malformed multipart boundary '" + p.value +
                                      "' (1 to 70 characters of RFC 2046)");
    }
    return p.value;
  }
  return fail(Code::kInvalid, "Content-Type multipart/form-data has no boundary parameter");
}

MultipartParser::MultipartParser(std::string boundary, MultipartLimits limits)
    : delimiter_("\r\n--" + boundary), limits_(limits), buf_("\r\n") {}

Status MultipartParser::fail_with(Code code, std::string message) {
  state_ = State::kFailed;
  error_ = message;
  return fail(code, std::move(message));
}

Status MultipartParser::parse_headers(std::string_view block, MultipartHead* head) {
  const std::string part = "multipart part " + std::to_string(parts_);
  // Unfold obsolete continuation lines into their header first.
  std::vector<std::string> lines;
  while (!block.empty()) {
    auto eol = block.find("\r\n");
    std::string_view line = block.substr(0, eol);
    block = eol == std::string_view::npos ? std::string_view{} : block.substr(eol + 2);
    if (!line.empty() && (line.front() == ' ' || line.front() == '\t') && !lines.empty()) {
      lines.back() += " " + std::string(trim(line));
    } else {
      lines.emplace_back(line);
    }
  }
  bool disposition = false;
  for (const std::string& line : lines) {
    auto colon = line.find(':');
    if (colon == std::string::npos || colon == 0) {
      return fail_with(Code::kInvalid, part + ": malformed header line '" + line + "'");
    }
    std::string_view name = trim(std::string_view(line).substr(0, colon));
    std::string_view value = trim(std::string_view(line).substr(colon + 1));
    if (iequals(name, "content-type")) {
      head->content_type = std::string(value);
      continue;
    }
    if (!iequals(name, "content-disposition")) continue;
    disposition = true;
    auto parsed = parse_params(value, part + " Content-Disposition");
    if (!parsed) return fail_with(Code::kInvalid, parsed.error().message);
    if (!iequals(parsed->first, "form-data")) {
      return fail_with(Code::kInvalid,
                       part + ": Content-Disposition is '" + parsed->first + "', not form-data");
    }
    bool has_name = false;
    std::optional<std::string> filename_ext;
    for (Param& p : parsed->second) {
      if (p.key == "name") {
        head->name = std::move(p.value);
        has_name = true;
      } else if (p.key == "filename") {
        head->filename = std::move(p.value);
      } else if (p.key == "filename*") {
        auto d = decode_ext_value(p.value);
        if (!d) return fail_with(Code::kInvalid, d.error().message);
        filename_ext = std::move(*d);
      }
    }
    if (filename_ext) head->filename = std::move(filename_ext);
    if (!has_name) {
      return fail_with(Code::kInvalid, part + ": Content-Disposition has no name parameter");
    }
  }
  if (!disposition) {
    return fail_with(Code::kInvalid, part + " has no Content-Disposition header");
  }
  return {};
}

Status MultipartParser::feed(std::string_view bytes, std::vector<MultipartEvent>* out) {
  if (state_ == State::kFailed) return fail(Code::kInvalid, error_);
  if (state_ == State::kDone) return {};  // the epilogue
  buf_.append(bytes);
  for (;;) {
    switch (state_) {
      case State::kPreamble: {
        auto pos = buf_.find(delimiter_);
        if (pos == std::string::npos) {
          // Keep what could be the start of the delimiter; drop the rest of the preamble.
          std::size_t keep = std::min(buf_.size(), delimiter_.size() - 1);
          preamble_seen_ += buf_.size() - keep;
          buf_.erase(0, buf_.size() - keep);
          if (preamble_seen_ > limits_.max_preamble_bytes) {
            return fail_with(Code::kInvalid,
                             "multipart body: no boundary delimiter in its first " +
                                 std::to_string(limits_.max_preamble_bytes) +
                                 " bytes (does the body match the Content-Type boundary?)");
          }
          return {};
        }
        buf_.erase(0, pos + delimiter_.size());
        state_ = State::kAfterDelimiter;
        break;
      }
      case State::kAfterDelimiter: {
        if (buf_.size() < 2) return {};
        if (buf_.compare(0, 2, "--") == 0) {
          state_ = State::kDone;
          buf_.clear();
          return {};
        }
        std::size_t i = 0;
        while (i < buf_.size() && (buf_[i] == ' ' || buf_[i] == '\t')) ++i;
        if (i > kMaxPaddingBytes) {
          return fail_with(Code::kInvalid, "multipart body: too much padding after a boundary");
        }
        if (buf_.size() < i + 2) return {};
        if (buf_.compare(i, 2, "\r\n") != 0) {
          return fail_with(Code::kInvalid,
                           "multipart body: a boundary delimiter is followed by neither CRLF nor "
                           "'--'");
        }
        buf_.erase(0, i + 2);
        if (++parts_ > limits_.max_parts) {
          return fail_with(Code::kTooBig, "multipart body: more than " +
                                              std::to_string(limits_.max_parts) + " parts");
        }
        state_ = State::kHeaders;
        break;
      }
      case State::kHeaders: {
        std::size_t block_end;
        std::size_t consumed;
        if (buf_.compare(0, 2, "\r\n") == 0) {
          block_end = 0;  // no headers at all
          consumed = 2;
        } else {
          auto pos = buf_.find("\r\n\r\n");
          if (pos == std::string::npos) {
            if (buf_.size() > limits_.max_header_bytes) {
              return fail_with(Code::kTooBig,
                               "multipart part " + std::to_string(parts_) +
                                   ": header block over " +
                                   std::to_string(limits_.max_header_bytes) + " bytes");
            }
            return {};
          }
          block_end = pos;
          consumed = pos + 4;
        }
        if (block_end > limits_.max_header_bytes) {
          return fail_with(Code::kTooBig, "multipart part " + std::to_string(parts_) +
                                              ": header block over " +
                                              std::to_string(limits_.max_header_bytes) +
                                              " bytes");
        }
        MultipartEvent ev;
        ev.kind = MultipartEvent::Kind::kBegin;
        if (auto s = parse_headers(std::string_view(buf_).substr(0, block_end), &ev.head); !s) {
          return s;
        }
        buf_.erase(0, consumed);
        out->push_back(std::move(ev));
        state_ = State::kBody;
        break;
      }
      case State::kBody: {
        auto pos = buf_.find(delimiter_);
        std::size_t data_end =
            pos != std::string::npos
                ? pos
                : (buf_.size() >= delimiter_.size() ? buf_.size() - (delimiter_.size() - 1) : 0);
        if (data_end > 0) {
          MultipartEvent ev;
          ev.kind = MultipartEvent::Kind::kData;
          ev.data = buf_.substr(0, data_end);
          out->push_back(std::move(ev));
        }
        if (pos == std::string::npos) {
          buf_.erase(0, data_end);
          return {};
        }
        buf_.erase(0, pos + delimiter_.size());
        MultipartEvent end;
        end.kind = MultipartEvent::Kind::kEnd;
        out->push_back(std::move(end));
        state_ = State::kAfterDelimiter;
        break;
      }
      case State::kDone:
      case State::kFailed:
        return {};
    }
  }
}

Status MultipartParser::finish() const {
  switch (state_) {
    case State::kDone: return {};
    case State::kFailed: return fail(Code::kInvalid, error_);
    case State::kPreamble:
      return fail(Code::kInvalid,
                  "multipart body: no boundary delimiter found (does the body match the "
                  "Content-Type boundary?)");
    default:
      return fail(Code::kInvalid,
                  "multipart body ended early: part " + std::to_string(parts_) +
                      " has no closing boundary ('--" +
                      delimiter_.substr(4) + "--' missing)");
  }
}

}  // namespace agentbox::server
