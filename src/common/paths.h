#pragma once
// The one rule for "is this path at or under that directory", lexically, by whole components:
// "/srv/skills2" is not under "/srv/skills"; a trailing '/' on `dir` does not matter; "/"
// contains every absolute path. No filesystem is asked: where symlinks matter, resolve first
// (openat2, realpath) and compare the results.

#include <string_view>

namespace agentbox::paths {

inline bool at_or_under(std::string_view path, std::string_view dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  if (dir.empty()) return false;
  if (dir == "/") return !path.empty() && path.front() == '/';
  return path == dir ||
         (path.size() > dir.size() && path.starts_with(dir) && path[dir.size()] == '/');
}

// The part of `path` below `dir` ("" for `dir` itself, "a/b" for dir + "/a/b"); call only when
// at_or_under(path, dir).
inline std::string_view below(std::string_view path, std::string_view dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  if (dir == "/") return path.substr(1);
  return path.size() == dir.size() ? std::string_view() : path.substr(dir.size() + 1);
}

}  // namespace agentbox::paths
