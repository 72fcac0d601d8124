// Session ids, scope templates (seed 002) and the per-session uid hash (seed 001).

#include <cstdint>
#include <string>
#include <string_view>

#include "common/fnv.h"
#include "common/validate.h"
#include "session/session_manager.h"

namespace agentbox::session {
namespace {

constexpr std::size_t kMaxIdBytes = validate::kMaxIdBytes;
using validate::quote;

}  // namespace

std::string_view state_name(State s) {
  switch (s) {
    case State::kRunning: return "running";
    case State::kSuspended: return "suspended";
  }
  return "unknown";
}

Status validate_id(std::string_view id) {
  return validate::session_id(id);  // the one rule, common/validate.h
}

Result<std::string> render_scope(std::string_view tmpl,
                                 const std::map<std::string, std::string>& vars) {
  std::string out;
  std::size_t i = 0;
  while (i < tmpl.size()) {
    char c = tmpl[i];
    if (c == '}') {
      return fail(Code::kInvalid, "invalid scope template " + quote(tmpl) + ": unmatched '}' at " +
                                      std::to_string(i));
    }
    if (c != '{') {
      out += c;
      ++i;
      continue;
    }
    std::size_t close = tmpl.find_first_of("{}", i + 1);
    if (close == std::string_view::npos || tmpl[close] != '}') {
      return fail(Code::kInvalid, "invalid scope template " + quote(tmpl) + ": unmatched '{' at " +
                                      std::to_string(i));
    }
    std::string name(tmpl.substr(i + 1, close - i - 1));
    if (name.empty()) {
      return fail(Code::kInvalid, "invalid scope template " + quote(tmpl) +
                                      ": empty variable name at " + std::to_string(i));
    }
    // Seed 002: a variable the caller did not supply renders as "unknown", so a scope still
    // names one stable session rather than failing the request.
    auto it = vars.find(name);
    out += it == vars.end() ? std::string("unknown") : it->second;
    i = close + 1;
    if (out.size() > kMaxIdBytes) break;  // already too long to be an id; stop copying
  }
  if (auto st = validate_id(out); !st) {
    return fail(Code::kInvalid,
                "scope template " + quote(tmpl) + " renders an invalid id: " + st.error().message);
  }
  return out;
}

uid_t first_uid_probe(std::string_view id) {
  // FNV-1, as Go's hash/fnv.New32 that seed 001's toolbox-server names "FNV32": the same agent
  // gets the same first uid here as there.
  return static_cast<uid_t>(fnv1_32(id) % 60000u + 10000u);
}

}  // namespace agentbox::session
