#pragma once
// Lexical validation of agent-supplied paths. Nothing here decides whether a path is safe to
// touch: ".." is kept, and symlinks are invisible to string code. Safety is decided by
// RootedFs (sandbox/rooted_fs.h), which resolves every path with openat2 from a root dirfd.
// These functions only reject malformed input early and bring paths into one spelling.

#include <cstddef>
#include <string>
#include <string_view>

#include "common/error.h"

namespace agentbox::sandbox {

inline constexpr std::size_t kMaxPathBytes = 4096;

// Validates and normalises an API path into an absolute in-box path.
// Rejects: empty, NUL bytes, backslashes (EINVAL: a Windows-style "..\\x" is never what an agent
// means, and SECURITY.md T3 wants it refused rather than created as an odd file name) and paths
// over kMaxPathBytes before or after joining (ETOOBIG). A relative path is taken relative to
// `workspace` (the box's workspace path, e.g. "/workspace"). Collapses "//" and "/./" and a
// trailing "/" or "/.", but KEEPS ".." components: "/workspace/../etc" stays as it is, and the
// resolver refuses the escape (a lexical ".." collapse would be wrong across symlinks).
[[nodiscard]] Result<std::string> normalize_box_path(std::string_view path,
                                                     std::string_view workspace);

// For roots that ARE the workspace dir (host backend): the path relative to the workspace ("" for
// the workspace itself), suitable for RootedFs in RootMode::kBeneath. Accepts paths under
// `workspace` and under the alias "/workspace" (compared per component, so "/workspace2" is not
// under "/workspace"); relative paths are relative to the workspace. Any other absolute path is
// EACCES ("outside the workspace"). The input is normalised as by normalize_box_path first.
[[nodiscard]] Result<std::string> workspace_relative(std::string_view abs_path,
                                                     std::string_view workspace);

// `path` with control bytes (newlines, ESC, ...) escaped as \xNN, for error messages and logs:
// agent-chosen names may hold any byte but NUL and '/'.
std::string printable_path(std::string_view path);

}  // namespace agentbox::sandbox
