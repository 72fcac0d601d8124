// GET /v1/events (WebSocket): the caller's tenant's session lifecycle events (an admin: every
// tenant's), one JSON text frame each:
//   {"event":"created","cause":"api","session":{...as GET /v1/sessions/{id}},"time":"..."}
// The session manager tells its subscribers on pool threads; the frame is made there and handed
// to the socket's writer (WsSession::send posts to the connection's executor), so the manager is
// never held up by a client. A client that stops reading is closed when its queue is full.

#include <boost/beast/websocket/rfc6455.hpp>

#include "common/log.h"
#include "server/internal/processes.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "server/websocket.h"
#include "session/events.h"

namespace agentbox::server::detail {
namespace {

asio::awaitable<bool> events(Call* call) {
  Context* ctx = call->ctx;
  Conn* conn = call->conn;
  auto ws = std::make_shared<WsSession>(std::move(conn->stream), ws_options(ctx->opts));
  const session::Caller caller = call->ex.req.caller;
  std::weak_ptr<WsSession> weak = ws;
  // Subscribed before the handshake: an event of a request the client sends once it has its
  // 101 is never missed (it waits in the queue until run() starts the writer).
  auto subscription = ctx->sessions->subscribe([weak, caller](const session::SessionEvent& ev) {
    if (!caller.admin && ev.session.tenant != caller.tenant) return;
    auto s = weak.lock();
    if (!s) return;
    json j = json::object();
    j["event"] = session::event_kind_name(ev.kind);
    j["cause"] = session::event_cause_name(ev.cause);
    j["session"] = encode_session(ev.session);
    j["time"] = rfc3339(std::chrono::system_clock::now());
    s->send(to_wire(j));
  });
  log_request(call, 101);
  auto ec = co_await ws->accept(call->hp->release());
  if (ec) co_return false;
  conn->on_shutdown = [weak] {
    if (auto s = weak.lock()) s->close(beast::websocket::close_code::going_away, "shutting down");
  };
  // What the client sends is not a command here: read (for pongs and the close) and drop.
  co_await ws->run([](std::string, bool) {});
  conn->on_shutdown = nullptr;
  co_return false;  // the connection was the WebSocket's
}

}  // namespace

std::vector<RouteSpec> event_routes() {
  return {
      {RouteId::kEvents, "GET", "/v1/events", BodyKind::kNone, true, events,
       RouteKind::kWebSocket},
  };
}

}  // namespace agentbox::server::detail
