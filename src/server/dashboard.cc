// The web dashboard (API.md "Dashboard"): GET /ui/ and its static files, served without a token
// (they hold no data: every call the page makes carries the token in its Authorization header),
// and POST /v1/ws-tickets, which trades the token for a single-use WebSocket ticket. The files
// are compiled in (ui_assets.h); `ui: false` makes every /ui route a 404.
//
// SECURITY: every file goes out with a Content-Security-Policy that allows scripts only from
// this origin (no inline script, no eval, no outside origin), connections only to this origin
// (HTTP and its ws/wss), and no framing; nosniff, no referrer. No CORS header is ever sent, so a
// page on another origin cannot read any reply.

#include <algorithm>

#include "server/http_error.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "server/ui_assets.h"

namespace agentbox::server::detail {
namespace {

// A Host header that can go into the policy as it is: a host name or IP literal and a port.
bool plain_host(std::string_view host) {
  return !host.empty() && host.size() <= 255 && std::all_of(host.begin(), host.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == ':' || c == '[' || c == ']';
  });
}

// style-src allows inline styles: xterm.js sizes its rows and writes its theme with element
// styles and a <style> element it makes at run time. Scripts stay 'self' only.
std::string content_security_policy(std::string_view host) {
  std::string connect = "'self'";
  if (plain_host(host)) {
    connect += " ws://" + std::string(host) + " wss://" + std::string(host);
  }
  return "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
         "img-src 'self' data:; font-src 'self'; connect-src " +
         connect +
         "; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
}

Reply ui_not_found(const Request& req) {
  return error_reply(Error::make(Code::kNotFound, "no such route: " + req.method + " " + req.path));
}

Reply asset_reply(Call* call, const UiAsset& a) {
  Reply r;
  r.status = 200;
  r.content_type = std::string(a.content_type);
  r.body = std::string(a.body);
  r.headers.emplace_back("Content-Security-Policy",
                         content_security_policy(header_value(call, "host")));
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  r.headers.emplace_back("Referrer-Policy", "no-referrer");
  r.headers.emplace_back("X-Frame-Options", "DENY");
  r.headers.emplace_back("Cache-Control", "no-cache");
  return r;
}

const UiAsset* find_asset(std::string_view path) {
  for (const UiAsset& a : ui_assets()) {
    if (a.path == path) return &a;
  }
  return nullptr;
}

// GET /ui: the dashboard lives under /ui/ (its files are relative to it).
asio::awaitable<bool> ui_redirect(Call* call) {
  if (!call->ctx->opts.ui) co_return co_await send_reply(call, ui_not_found(call->ex.req));
  Reply r;
  r.status = 301;
  r.content_type = "text/plain; charset=utf-8";
  r.body = "/ui/\n";
  r.headers.emplace_back("Location", "/ui/");
  co_return co_await send_reply(call, std::move(r));
}

asio::awaitable<bool> ui_index(Call* call) {
  const UiAsset* a = call->ctx->opts.ui ? find_asset("index.html") : nullptr;
  if (!a) co_return co_await send_reply(call, ui_not_found(call->ex.req));
  co_return co_await send_reply(call, asset_reply(call, *a));
}

asio::awaitable<bool> ui_file(Call* call) {
  const Request& req = call->ex.req;
  auto it = req.params.find("path");
  const UiAsset* a =
      call->ctx->opts.ui && it != req.params.end() ? find_asset(it->second) : nullptr;
  if (!a) co_return co_await send_reply(call, ui_not_found(req));
  co_return co_await send_reply(call, asset_reply(call, *a));
}

// POST /v1/ws-tickets → {"ticket", "expires_in"}: a single-use ticket bound to the caller, for
// the dashboard's WebSockets (?ticket=). The token it was asked with is never in a URL.
asio::awaitable<Reply> ws_ticket(Context* ctx, Request* req) {
  if (auto st = empty_body(req); !st) co_return error_reply(st.error());
  auto ticket = ctx->tickets.issue(req->caller);
  if (!ticket) co_return error_reply(ticket.error());
  Reply r = json_reply(200, {{"ticket", *ticket}, {"expires_in", ctx->tickets.ttl().count()}});
  r.headers.emplace_back("Cache-Control", "no-store");
  co_return r;
}

}  // namespace

std::vector<RouteSpec> dashboard_routes() {
  using B = BodyKind;
  using R = RouteId;
  return {
      {R::kUiRedirect, "GET", "/ui", B::kNone, false, ui_redirect},
      {R::kUiIndex, "GET", "/ui/", B::kNone, false, ui_index},
      {R::kUiFile, "GET", "/ui/{path}", B::kNone, false, ui_file, RouteKind::kHttp, true},
      {R::kWsTicket, "POST", "/v1/ws-tickets", B::kJson, true, simple<ws_ticket>},
  };
}

}  // namespace agentbox::server::detail
