// Routes API.md describes that this version does not build yet. Each would answer 501 ENOTSUP
// naming itself (never 404, never a 2xx that ignores the request): an entry
//   {RouteId::kNotBuilt, "GET", "/v1/...", BodyKind::kNone, true, not_built, RouteKind::kNotBuilt}
// in the table below. Wave 2 builds every route of API.md, so the table is empty; fields and
// values that are not built are still refused by the surfaces themselves.

#include "server/internal/surfaces.h"
#include "server/internal/transport.h"

namespace agentbox::server::detail {

asio::awaitable<bool> not_built(Call* call) {
  const RouteSpec* r = call->route;
  co_return co_await send_error(
      call, Error::make(Code::kNotSupported, std::string(r->method) + " " + std::string(r->path) +
                                                 " is not built in this version"));
}

std::vector<RouteSpec> not_built_routes() { return {}; }

}  // namespace agentbox::server::detail
