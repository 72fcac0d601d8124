#include "sandbox/path.h"

#include <string>
#include <string_view>

namespace agentbox::sandbox {

namespace {

constexpr std::string_view kWorkspaceAlias = "/workspace";

// Appends the components of `p` to `out` (an absolute path without trailing '/', "" for "/"),
// dropping empty and "." components and keeping "..".
void append_components(std::string_view p, std::string& out) {
  while (!p.empty()) {
    const std::size_t slash = p.find('/');
    const std::string_view comp = p.substr(0, slash);
    p = slash == std::string_view::npos ? std::string_view{} : p.substr(slash + 1);
    if (comp.empty() || comp == ".") continue;
    out += '/';
    out += comp;
  }
}

std::string quoted(std::string_view p) {
  return "\"" + printable_path(p) + "\"";
}

// Sets `rest` to the part of `path` below `dir` ("" for dir itself) and returns true, or returns
// false when `path` is not `dir` or under it. Both are normalised absolute paths; the match is
// per component.
bool strip_dir(std::string_view path, std::string_view dir, std::string& rest) {
  if (dir == "/") {
    rest.assign(path.substr(1));
    return true;
  }
  if (!path.starts_with(dir)) return false;
  if (path.size() == dir.size()) {
    rest.clear();
    return true;
  }
  if (path[dir.size()] != '/') return false;  // "/workspace2" is not under "/workspace"
  rest.assign(path.substr(dir.size() + 1));
  return true;
}

}  // namespace

std::string printable_path(std::string_view path) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(path.size());
  for (const char c : path) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

Result<std::string> normalize_box_path(std::string_view path, std::string_view workspace) {
  if (path.empty()) return fail(Code::kInvalid, "empty path");
  if (path.find('\0') != std::string_view::npos) {
    return fail(Code::kInvalid, "path " + quoted(path) + ": contains a NUL byte");
  }
  if (path.size() > kMaxPathBytes) {
    return fail(Code::kTooBig, "path of " + std::to_string(path.size()) + " bytes: over the " +
                                   std::to_string(kMaxPathBytes) + "-byte limit");
  }
  if (path.find('\\') != std::string_view::npos) {
    return fail(Code::kInvalid, "path " + quoted(path) + ": contains a backslash");
  }
  std::string out;
  out.reserve(workspace.size() + path.size() + 1);
  if (path.front() != '/') append_components(workspace, out);
  append_components(path, out);
  if (out.empty()) out = "/";
  if (out.size() > kMaxPathBytes) {
    return fail(Code::kTooBig, "path " + quoted(path) + ": over the " +
                                   std::to_string(kMaxPathBytes) + "-byte limit");
  }
  return out;
}

Result<std::string> workspace_relative(std::string_view abs_path, std::string_view workspace) {
  auto path = normalize_box_path(abs_path, workspace);
  if (!path) return std::unexpected(std::move(path.error()));
  std::string ws = "/";
  if (!workspace.empty()) {
    ws.clear();
    append_components(workspace, ws);
    if (ws.empty()) ws = "/";
  }
  std::string rest;
  if (strip_dir(*path, ws, rest) || strip_dir(*path, kWorkspaceAlias, rest)) return rest;
  return fail(Code::kAccess, quoted(*path) + ": outside the workspace");
}

}  // namespace agentbox::sandbox
