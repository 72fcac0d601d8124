// Routes API.md describes that this version does not build yet. Each answers 501 ENOTSUP naming
// itself (never 404, never a 2xx that ignores the request). Building one is flipping its entry
// to a real handler in its surface's table.

#include "server/internal/surfaces.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {
namespace {

asio::awaitable<bool> not_built(Call* call) {
  const RouteSpec* r = call->route;
  co_return co_await send_error(
      call, Error::make(Code::kNotSupported, std::string(r->method) + " " + std::string(r->path) +
                                                 " is not built in this version"));
}

}  // namespace

std::vector<RouteSpec> not_built_routes() {
  constexpr RouteId N = RouteId::kNotBuilt;
  constexpr RouteKind K = RouteKind::kNotBuilt;
  constexpr BodyKind B = BodyKind::kNone;
  std::vector<RouteSpec> out = {
  };
  return out;
}

}  // namespace agentbox::server::detail
