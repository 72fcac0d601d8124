#pragma once
// The web dashboard's files (ui/ at the repo root, bundled by esbuild during the build) as the
// daemon serves them under /ui/: compiled into agentboxd by a generated ui_assets.cc
// (scripts/embed-ui), so `make run`, the tests and a package all serve the same bundle with
// nothing to install beside the binary.

#include <span>
#include <string_view>

namespace agentbox::server {

struct UiAsset {
  std::string_view path;          // under /ui/: "index.html", "app.js", ...
  std::string_view content_type;  // "text/html; charset=utf-8", ...
  std::string_view body;
};

std::span<const UiAsset> ui_assets();

}  // namespace agentbox::server
