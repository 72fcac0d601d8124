#include "server/routes.h"

#include <algorithm>

#include "server/internal/surfaces.h"

namespace agentbox::server {

const std::vector<RouteSpec>& route_specs() {
  static const std::vector<RouteSpec> kRoutes = [] {
    std::vector<RouteSpec> all;
    for (auto part :
         {detail::session_routes, detail::exec_routes, detail::file_routes, detail::seed001_routes,
          detail::ops_routes, detail::process_routes, detail::event_routes, detail::mcp_routes,
          detail::e2b_routes, detail::health_routes, detail::template_routes,
          detail::image_routes, detail::langbot_routes, detail::runner_routes,
          detail::dashboard_routes, detail::audit_routes, detail::cluster_routes,
          detail::not_built_routes}) {
      auto routes = part();
      all.insert(all.end(), routes.begin(), routes.end());
    }
    return all;
  }();
  return kRoutes;
}

std::vector<RouteInfo> route_table() {
  std::vector<RouteInfo> out;
  for (const auto& r : route_specs()) out.push_back({std::string(r.method), std::string(r.path)});
  return out;
}

namespace {

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> out;
  // A leading "/" is required; each following "/" starts a segment (empty segments kept, so
  // "/v1/sessions/" does not match "/v1/sessions").
  if (path.empty() || path.front() != '/') return out;
  path.remove_prefix(1);
  for (;;) {
    auto slash = path.find('/');
    out.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return out;
}

// Matches `path` against a template; fills params on success.
// With `subtree`, the last template parameter takes the rest of the path (slashes included).
bool match_template(std::string_view tmpl, bool subtree, const std::vector<std::string_view>& segs,
                    std::map<std::string, std::string>* params) {
  auto tsegs = split_path(tmpl);
  if (segs.empty()) return false;
  if (subtree ? segs.size() < tsegs.size() : tsegs.size() != segs.size()) return false;
  std::map<std::string, std::string> found;
  for (std::size_t i = 0; i < tsegs.size(); ++i) {
    std::string_view t = tsegs[i];
    if (t.size() >= 2 && t.front() == '{' && t.back() == '}') {
      if (segs[i].empty()) return false;
      std::string raw(segs[i]);
      if (subtree && i + 1 == tsegs.size()) {
        for (std::size_t j = i + 1; j < segs.size(); ++j) raw += "/" + std::string(segs[j]);
      }
      auto decoded = url_decode(raw, /*plus_as_space=*/false);
      if (!decoded) return false;
      found.emplace(std::string(t.substr(1, t.size() - 2)), std::move(*decoded));
    } else if (t != segs[i]) {
      return false;
    }
  }
  *params = std::move(found);
  return true;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

RouteMatch match_route(std::string_view method, std::string_view path) {
  RouteMatch m;
  auto segs = split_path(path);
  for (const auto& r : route_specs()) {
    std::map<std::string, std::string> params;
    if (!match_template(r.path, r.subtree, segs, &params)) continue;
    if (r.method == method) {
      m.route = &r;
      m.params = std::move(params);
      m.allowed.clear();
      return m;
    }
    m.allowed.emplace_back(r.method);
  }
  return m;
}

Result<std::string> url_decode(std::string_view s, bool plus_as_space) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '%') {
      int hi = i + 2 < s.size() ? hex_value(s[i + 1]) : -1;
      int lo = i + 2 < s.size() ? hex_value(s[i + 2]) : -1;
      if (hi < 0 || lo < 0) {
        return fail(Code::kInvalid, "malformed percent-encoding in '" + std::string(s) + "'");
      }
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (c == '+' && plus_as_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

Result<std::map<std::string, std::string>> parse_query(std::string_view query) {
  std::map<std::string, std::string> out;
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.empty()) continue;
    auto eq = pair.find('=');
    auto key = url_decode(pair.substr(0, eq), true);
    if (!key) return std::unexpected(key.error());
    std::string value;
    if (eq != std::string_view::npos) {
      auto v = url_decode(pair.substr(eq + 1), true);
      if (!v) return std::unexpected(v.error());
      value = std::move(*v);
    }
    out.emplace(std::move(*key), std::move(value));  // emplace keeps the first
  }
  return out;
}

}  // namespace agentbox::server
