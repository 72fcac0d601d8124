#include "common/validate.h"

#include <array>

#include "common/paths.h"

namespace agentbox::validate {

namespace {

constexpr std::size_t kMaxQuotedBytes = 160;

std::unexpected<Error> bad(std::string_view field, std::string_view what) {
  return fail(Code::kInvalid, "field '" + std::string(field) + "' " + std::string(what));
}

bool id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}


// Exactly these may not be mount targets; beneath them is fine.
constexpr std::array<std::string_view, 3> kNotItself = {"/", "/workspace", "/tmp"};
// Neither these nor anything beneath them (plus every /lib*, checked apart).
constexpr std::array<std::string_view, 7> kNotAtOrBeneath = {"/usr", "/bin", "/sbin", "/etc",
                                                             "/proc", "/sys", "/dev"};

}  // namespace

std::string quote(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= kMaxQuotedBytes) {
      out += "...";
      break;
    }
    auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  out += '"';
  return out;
}

Status session_id(std::string_view id) {
  if (id.empty()) return fail(Code::kInvalid, "invalid session id: empty");
  if (id.size() > kMaxIdBytes) {
    return fail(Code::kInvalid, "invalid session id " + quote(id) + ": longer than " +
                                    std::to_string(kMaxIdBytes) + " bytes");
  }
  for (char c : id) {
    if (!id_char(c)) {
      return fail(Code::kInvalid,
                  "invalid session id " + quote(id) + ": only A-Z a-z 0-9 . _ - are allowed");
    }
  }
  // SECURITY: ids name directories under data_dir/workspaces; "." and ".." would name the
  // workspaces dir itself or its parent.
  if (id == "." || id == "..") {
    return fail(Code::kInvalid, "invalid session id " + quote(id) + ": reserved name");
  }
  return {};
}

Status env_var(std::string_view name, std::string_view value, std::string_view field) {
  if (name.empty() || name.find('=') != std::string_view::npos ||
      name.find('\0') != std::string_view::npos) {
    return bad(field, "has an invalid variable name " + quote(name) +
                          " (must be non-empty, without '=' or NUL)");
  }
  if (value.find('\0') != std::string_view::npos) {
    return bad(std::string(field) + "." + std::string(name), "must not contain NUL");
  }
  return {};
}

Status env(const std::map<std::string, std::string>& vars, std::string_view field) {
  for (const auto& [k, v] : vars) AB_TRY(env_var(k, v, field));
  return {};
}

Status mount_target(std::string_view p, std::string_view field) {
  auto refuse = [&](std::string_view why) { return bad(field, quote(p) + ": " + std::string(why)); };
  if (p.empty() || p[0] != '/') return refuse("must be an absolute path");
  if (p.size() > kMaxMountPathBytes) {
    return refuse("longer than " + std::to_string(kMaxMountPathBytes) + " bytes");
  }
  if (p.find('\0') != std::string_view::npos) return refuse("contains a NUL byte");
  if (p != "/") {
    std::string_view rest = p.substr(1);
    for (;;) {
      const std::size_t slash = rest.find('/');
      const std::string_view comp = rest.substr(0, slash);
      if (comp.empty() || comp == "." || comp == "..") {
        return refuse("must be normalised (no empty, '.' or '..' components, no trailing '/')");
      }
      if (slash == std::string_view::npos) break;
      rest.remove_prefix(slash + 1);
    }
  }
  for (std::string_view d : kNotItself) {
    if (p == d) {
      return refuse(d == "/workspace" ? "cannot mount over the workspace itself (a path beneath "
                                        "it, e.g. /workspace/data, is fine)"
                                      : "cannot mount over " + std::string(d) + " itself");
    }
  }
  for (std::string_view d : kNotAtOrBeneath) {
    if (paths::at_or_under(p, d)) {
      return refuse(std::string(d) + " is a system directory of the box; mount elsewhere (e.g. " +
                    "/data or /workspace/data)");
    }
  }
  // /lib, /lib32, /lib64, /libx32, and whatever else a host calls /lib*.
  const std::string_view first = p.substr(1, p.find('/', 1) == std::string_view::npos
                                                 ? std::string_view::npos
                                                 : p.find('/', 1) - 1);
  if (first.starts_with("lib")) {
    return refuse("/" + std::string(first) +
                  " is a system directory of the box; mount elsewhere (e.g. /data or "
                  "/workspace/data)");
  }
  return {};
}

Status limit(const LimitBounds& b, std::uint64_t value, std::string_view prefix) {
  if (value >= b.min && value <= b.max) return {};
  std::string field = prefix.empty() ? std::string(b.name)
                                     : std::string(prefix) + "." + std::string(b.name);
  return bad(field, "must be between " + std::to_string(b.min) + " and " + std::to_string(b.max) +
                        " (got " + std::to_string(value) + ")");
}

bool is_process_tag(std::string_view tag) {
  if (tag.empty() || tag.size() > kMaxTagBytes) return false;
  bool all_digits = true;
  for (char c : tag) {
    if (!id_char(c)) return false;
    if (c < '0' || c > '9') all_digits = false;
  }
  return !all_digits;
}

}  // namespace agentbox::validate
