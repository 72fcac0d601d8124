// The images surface (API.md "Images"): POST /v1/images (pull; NDJSON progress with
// Accept: application/x-ndjson), GET /v1/images, GET /v1/images/{ref}, DELETE /v1/images/{digest}.
// The work is service::Images (image/store.h underneath).

#include "service/images.h"

#include <chrono>
#include <ctime>

#include "common/log.h"
#include "server/http_error.h"
#include "server/internal/surfaces.h"
#include "server/internal/transport.h"
#include "service/blocking.h"

namespace agentbox::server::detail {
namespace {

service::Images& images(Context* ctx) {
  return ctx->svc->images;
}

json encode_image(const image::Image& img) {
  json layers = json::array();
  for (const auto& l : img.layers) {
    layers.push_back({{"digest", l.digest},
                      {"diff_id", l.diff_id},
                      {"size", l.size},
                      {"media_type", l.media_type}});
  }
  return {
      {"ref", img.ref},
      {"refs", img.refs},
      {"digest", img.digest},
      {"size", img.size},
      {"layers", std::move(layers)},
      {"platform", img.platform},
      {"config",
       {{"env", img.config.env}, {"workdir", img.config.workdir}, {"user", img.config.user}}},
      {"pulled_at",
       rfc3339(std::chrono::system_clock::from_time_t(static_cast<std::time_t>(img.pulled_at)))}};
}

Result<std::string> decode_pull(Request* req) {
  auto body = AB_TRY(body_object(req));
  AB_TRY(check_known_fields(body, {"ref"}));
  auto it = body.find("ref");
  if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) {
    return fail(Code::kInvalid, "field 'ref' is required: an image reference");
  }
  std::string ref = it->get<std::string>();
  if (!image::is_digest(ref)) {
    if (auto host = image::registry_host(ref); !host) return std::unexpected(host.error());
  }
  return ref;
}

asio::awaitable<bool> pull_image(Call* call) {
  Context* ctx = call->ctx;
  Request* req = &call->ex.req;
  auto ref = decode_pull(req);
  if (!ref) co_return co_await send_error(call, ref.error());
  const bool ndjson = req->accept.find("application/x-ndjson") != std::string::npos;
  if (!ndjson) {
    auto r = co_await images(ctx).pull(origin_of(*req, service::Surface::kV1), *ref);
    if (!r) co_return co_await send_error(call, r.error());
    co_return co_await send_reply(call, json_reply(201, encode_image(*r)));
  }
  auto watch = std::make_shared<service::PullWatch>();
  if (auto st = images(ctx).start_pull(origin_of(*req, service::Surface::kV1), *ref, watch); !st) {
    co_return co_await send_error(call, st.error());
  }
  auto started = co_await start_ndjson(call);
  std::size_t from = 0;
  for (;;) {
    auto job = service::on_pool(ctx->pool, [watch, from]() -> Result<service::PullWatch::Seen> {
      return watch->wait(from, std::chrono::milliseconds(500));
    });
    auto seen = co_await std::move(job);
    if (!seen) co_return false;
    std::string out;
    for (const auto& p : seen->progress) {
      out += to_wire(json{{"layer", p.layer}, {"bytes", p.bytes}, {"total", p.total}}) + "\n";
    }
    from += seen->progress.size();
    if (seen->result) {
      const auto& r = *seen->result;
      if (r) {
        out += to_wire(json{{"image", encode_image(*r)}}) + "\n";
      } else {
        out += to_wire(json{{"error",
                             {{"code", code_name(r.error().code)},
                              {"message", r.error().message},
                              {"status", http_status(r.error())}}}}) +
               "\n";
      }
    }
    if (started.ok && !out.empty()) {
      if (!co_await write_stream(ctx, call->conn, started.chunked, out)) started.ok = false;
    }
    // The pull runs to its end even when the client left (it holds the store's lock).
    if (seen->result) break;
  }
  if (!started.ok) co_return false;
  if (!co_await end_stream(ctx, call->conn, started.chunked)) co_return false;
  co_return started.keep;
}

asio::awaitable<Reply> list_images(Context* ctx, Request* req) {
  auto r = co_await images(ctx).list(origin_of(*req, service::Surface::kV1));
  if (!r) co_return error_reply(r.error());
  json arr = json::array();
  for (const auto& img : *r) arr.push_back(encode_image(img));
  co_return json_reply(200, {{"images", std::move(arr)}});
}

asio::awaitable<Reply> get_image(Context* ctx, Request* req) {
  auto r = co_await images(ctx).get(origin_of(*req, service::Surface::kV1), req->params["ref"]);
  if (!r) co_return error_reply(r.error());
  co_return json_reply(200, encode_image(*r));
}

asio::awaitable<Reply> delete_image(Context* ctx, Request* req) {
  std::string digest = req->params["ref"];
  auto r = co_await images(ctx).remove(origin_of(*req, service::Surface::kV1), digest);
  if (!r) co_return error_reply(r.error());
  co_return json_reply(200, {{"digest", digest}, {"deleted", true}});
}

}  // namespace

std::vector<RouteSpec> image_routes() {
  constexpr BodyKind J = BodyKind::kJson;
  constexpr BodyKind N = BodyKind::kNone;
  return {
      {RouteId::kImagePull, "POST", "/v1/images", J, true, pull_image},
      {RouteId::kImageList, "GET", "/v1/images", N, true, simple<list_images>},
      {RouteId::kImageGet, "GET", "/v1/images/{ref}", N, true, simple<get_image>, RouteKind::kHttp,
       true},
      {RouteId::kImageDelete, "DELETE", "/v1/images/{ref}", N, true, simple<delete_image>},
  };
}

}  // namespace agentbox::server::detail
