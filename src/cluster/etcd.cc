#include "cluster/etcd.h"

#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "client/client.h"
#include "common/base64.h"

namespace agentbox::cluster {
namespace {

using json = nlohmann::json;

std::string b64(const std::string& s) {
  return base64_encode(s);
}

// The gateway spells int64 as a JSON string ("123"); plain numbers are taken too.
std::int64_t as_i64(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    try {
      return std::stoll(it->get<std::string>());
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

std::string unb64(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_string()) return {};
  return base64_decode(it->get<std::string>()).value_or(std::string());
}

KeyValue decode_kv(const json& j) {
  KeyValue kv;
  kv.key = unb64(j, "key");
  kv.value = unb64(j, "value");
  kv.create_revision = as_i64(j, "create_revision");
  kv.mod_revision = as_i64(j, "mod_revision");
  kv.lease = as_i64(j, "lease");
  return kv;
}

std::int64_t header_revision(const json& j) {
  auto h = j.find("header");
  return h == j.end() || !h->is_object() ? 0 : as_i64(*h, "revision");
}

Result<json> parse_reply(const std::string& body, const std::string& what) {
  auto j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return fail(Code::kInternal, "etcd " + what + ": a reply that is not a JSON object");
  }
  return j;
}

// The gateway's error body: {"error": "...", "code": N, "message": "..."}.
std::string error_text(const std::string& body) {
  auto j = json::parse(body, nullptr, false);
  if (j.is_object()) {
    for (const char* f : {"message", "error"}) {
      auto it = j.find(f);
      if (it != j.end() && it->is_string()) return it->get<std::string>();
    }
  }
  return body.substr(0, 200);
}

// Splits a stream of concatenated JSON objects (newline-separated or not) into whole objects.
class ObjectSplitter {
 public:
  template <class F>
  void feed(std::string_view data, F&& on_object) {
    for (char c : data) {
      if (depth_ == 0 && c != '{') continue;  // whitespace between objects
      cur_ += c;
      if (in_string_) {
        if (escape_) {
          escape_ = false;
        } else if (c == '\\') {
          escape_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
        continue;
      }
      if (c == '"') {
        in_string_ = true;
      } else if (c == '{') {
        ++depth_;
      } else if (c == '}' && --depth_ == 0) {
        on_object(cur_);
        cur_.clear();
      }
    }
  }

 private:
  std::string cur_;
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
};

}  // namespace

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(EtcdOptions opts) : opts_(std::move(opts)) {
  idle_.resize(opts_.endpoints.size());
}

EtcdClient::~EtcdClient() = default;

std::unique_ptr<client::Client> EtcdClient::take(std::size_t endpoint) {
  {
    std::lock_guard lock(mu_);
    auto& pool = idle_[endpoint];
    if (!pool.empty()) {
      auto c = std::move(pool.back());
      pool.pop_back();
      return c;
    }
  }
  client::ClientOptions o;
  o.server = opts_.endpoints[endpoint];
  o.tls = {opts_.ca_file, opts_.cert_file, opts_.key_file};
  o.timeout = opts_.timeout;
  return std::make_unique<client::Client>(std::move(o));
}

void EtcdClient::give_back(std::size_t endpoint, std::unique_ptr<client::Client> c) {
  std::lock_guard lock(mu_);
  if (idle_[endpoint].size() < 8) idle_[endpoint].push_back(std::move(c));
}

Result<std::string> EtcdClient::call(const std::string& path, const std::string& body) {
  const std::size_t n = opts_.endpoints.size();
  if (n == 0) return fail(Code::kInvalid, "etcd: no endpoints");
  std::string errors;
  // Two rounds over the endpoints: a leader election (a member just died) fails a call for a
  // moment on the members left.
  for (int round = 0; round < 2; ++round) {
    if (round > 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    errors.clear();
    const std::size_t first = preferred_.load() % n;
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t e = (first + k) % n;
      auto c = take(e);
      auto r = c->request("POST", path, body);
      if (!r) {
        errors += (errors.empty() ? "" : "; ") + r.error().message;
        continue;  // the connection is closed; the client is dropped
      }
      give_back(e, std::move(c));
      if (r->status >= 500) {
        // No leader or no quorum on this member: another may do better.
        errors += (errors.empty() ? "" : "; ") + opts_.endpoints[e] + ": " + error_text(r->body);
        continue;
      }
      if (r->status != 200) {
        return fail(Code::kInternal, "etcd " + path + " at " + opts_.endpoints[e] + ": HTTP " +
                                         std::to_string(r->status) + ": " + error_text(r->body));
      }
      preferred_.store(e);
      return std::move(r->body);
    }
  }
  return fail(Code::kUnavailable, "etcd unreachable (" + errors + ")");
}

Result<std::int64_t> EtcdClient::put(const std::string& key, const std::string& value,
                                     std::int64_t lease) {
  json req = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  auto body = AB_TRY(call("/v3/kv/put", req.dump()));
  auto j = AB_TRY(parse_reply(body, "put"));
  return header_revision(j);
}

Result<RangeResult> EtcdClient::range(const std::string& key, const std::string& range_end) {
  json req = {{"key", b64(key)}};
  if (!range_end.empty()) req["range_end"] = b64(range_end);
  auto body = AB_TRY(call("/v3/kv/range", req.dump()));
  auto j = AB_TRY(parse_reply(body, "range"));
  RangeResult out;
  out.revision = header_revision(j);
  auto kvs = j.find("kvs");
  if (kvs != j.end() && kvs->is_array()) {
    for (const auto& kv : *kvs) out.kvs.push_back(decode_kv(kv));
  }
  return out;
}

Result<std::int64_t> EtcdClient::erase(const std::string& key, const std::string& range_end) {
  json req = {{"key", b64(key)}};
  if (!range_end.empty()) req["range_end"] = b64(range_end);
  auto body = AB_TRY(call("/v3/kv/deleterange", req.dump()));
  auto j = AB_TRY(parse_reply(body, "deleterange"));
  return as_i64(j, "deleted");
}

Result<CreateResult> EtcdClient::create_if_absent(const std::string& key, const std::string& value,
                                                  std::int64_t lease) {
  json put = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  json req = {
      {"compare", json::array({{{"key", b64(key)},
                                {"target", "CREATE"},
                                {"result", "EQUAL"},
                                {"create_revision", "0"}}})},
      {"success", json::array({{{"request_put", put}}})},
      {"failure", json::array({{{"request_range", {{"key", b64(key)}}}}})},
  };
  auto body = AB_TRY(call("/v3/kv/txn", req.dump()));
  auto j = AB_TRY(parse_reply(body, "txn"));
  CreateResult out;
  out.revision = header_revision(j);
  out.succeeded = j.value("succeeded", false);
  if (out.succeeded) return out;
  auto resps = j.find("responses");
  if (resps != j.end() && resps->is_array() && !resps->empty()) {
    const json& r = (*resps)[0];
    auto rr = r.find("response_range");
    if (rr != r.end()) {
      auto kvs = rr->find("kvs");
      if (kvs != rr->end() && kvs->is_array() && !kvs->empty()) {
        out.existing = decode_kv((*kvs)[0]);
        return out;
      }
    }
  }
  // Neither written nor there: deleted between the compare and the read cannot happen inside
  // one transaction, so this is a reply we do not understand.
  return fail(Code::kInternal, "etcd txn on " + key + ": failed without the key's value");
}

Result<bool> EtcdClient::erase_if_value(const std::string& key, const std::string& value) {
  json req = {
      {"compare",
       json::array(
           {{{"key", b64(key)}, {"target", "VALUE"}, {"result", "EQUAL"}, {"value", b64(value)}}})},
      {"success", json::array({{{"request_delete_range", {{"key", b64(key)}}}}})},
  };
  auto body = AB_TRY(call("/v3/kv/txn", req.dump()));
  auto j = AB_TRY(parse_reply(body, "txn"));
  return j.value("succeeded", false);
}

Result<bool> EtcdClient::put_if_value(const std::string& key, const std::string& expected,
                                      const std::string& value, std::int64_t lease) {
  json put = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  json req = {
      {"compare", json::array({{{"key", b64(key)},
                                {"target", "VALUE"},
                                {"result", "EQUAL"},
                                {"value", b64(expected)}}})},
      {"success", json::array({{{"request_put", std::move(put)}}})},
  };
  auto body = AB_TRY(call("/v3/kv/txn", req.dump()));
  auto j = AB_TRY(parse_reply(body, "txn"));
  return j.value("succeeded", false);
}

Result<std::int64_t> EtcdClient::lease_grant(std::int64_t ttl_sec) {
  json req = {{"TTL", std::to_string(ttl_sec)}};
  auto body = AB_TRY(call("/v3/lease/grant", req.dump()));
  auto j = AB_TRY(parse_reply(body, "lease grant"));
  if (j.contains("error") && j["error"].is_string() && !j["error"].get<std::string>().empty()) {
    return fail(Code::kInternal, "etcd lease grant: " + j["error"].get<std::string>());
  }
  std::int64_t id = as_i64(j, "ID");
  if (id == 0) return fail(Code::kInternal, "etcd lease grant: no lease id in the reply");
  return id;
}

Result<std::int64_t> EtcdClient::lease_keepalive(std::int64_t id) {
  json req = {{"ID", std::to_string(id)}};
  auto body = AB_TRY(call("/v3/lease/keepalive", req.dump()));
  // A stream endpoint: one {"result": {...}} per request (or {"error": ...}).
  std::optional<json> first;
  ObjectSplitter split;
  split.feed(body, [&](const std::string& obj) {
    if (!first) first = json::parse(obj, nullptr, false);
  });
  if (!first || !first->is_object()) {
    return fail(Code::kInternal, "etcd lease keepalive: an empty reply");
  }
  auto res = first->find("result");
  if (res == first->end() || !res->is_object()) {
    std::string text = error_text(first->dump());
    if (text.find("not found") != std::string::npos) return 0;  // expired
    return fail(Code::kUnavailable, "etcd lease keepalive: " + text);
  }
  return as_i64(*res, "TTL");
}

Status EtcdClient::lease_revoke(std::int64_t id) {
  json req = {{"ID", std::to_string(id)}};
  auto body = AB_TRY(call("/v3/lease/revoke", req.dump()));
  (void)body;
  return {};
}

Status EtcdClient::watch(const std::string& key, const std::string& range_end,
                         std::int64_t start_revision,
                         const std::function<void(const WatchEvent&)>& on_event,
                         const std::atomic<bool>& stop, std::chrono::milliseconds idle_timeout,
                         const std::function<void(std::int64_t)>& on_progress) {
  const std::size_t n = opts_.endpoints.size();
  if (n == 0) return fail(Code::kInvalid, "etcd: no endpoints");
  json create = {{"key", b64(key)}};
  if (!range_end.empty()) create["range_end"] = b64(range_end);
  if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
  const std::string body = json{{"create_request", create}}.dump();
  std::string errors;
  const std::size_t first = preferred_.load() % n;
  for (std::size_t k = 0; k < n && !stop.load(); ++k) {
    const std::size_t e = (first + k) % n;
    client::ClientOptions o;
    o.server = opts_.endpoints[e];
    o.tls = {opts_.ca_file, opts_.cert_file, opts_.key_file};
    o.timeout = idle_timeout;
    client::Client c(std::move(o));
    ObjectSplitter split;
    bool created = false;
    std::string stream_error;
    auto on_chunk = [&](std::string_view data) {
      split.feed(data, [&](const std::string& text) {
        auto j = json::parse(text, nullptr, false);
        if (!j.is_object()) return;
        auto res = j.find("result");
        if (res == j.end() || !res->is_object()) {
          stream_error = error_text(text);
          return;
        }
        created = true;
        if (res->value("canceled", false)) {
          stream_error = "watch canceled: " + res->value("cancel_reason", std::string("?"));
          return;
        }
        auto evs = res->find("events");
        if (evs != res->end() && evs->is_array()) {
          for (const auto& ev : *evs) {
            WatchEvent we;
            we.deleted = ev.value("type", std::string()) == "DELETE";
            auto kv = ev.find("kv");
            if (kv != ev.end()) we.kv = decode_kv(*kv);
            on_event(we);
          }
        }
        if (on_progress) on_progress(header_revision(*res));
      });
      return stream_error.empty() && !stop.load();
    };
    auto r = c.request_stream("POST", "/v3/watch", body, on_chunk);
    if (stop.load()) return {};
    if (!stream_error.empty()) return fail(Code::kUnavailable, "etcd watch: " + stream_error);
    if (!r) {
      if (created) return std::unexpected(r.error());  // it ran here; the caller resumes
      errors += (errors.empty() ? "" : "; ") + r.error().message;
      continue;
    }
    if (r->status != 200) {
      errors += (errors.empty() ? "" : "; ") + opts_.endpoints[e] + ": HTTP " +
                std::to_string(r->status) + " " + error_text(r->body);
      continue;
    }
    return fail(Code::kUnavailable, "etcd watch at " + opts_.endpoints[e] + ": stream ended");
  }
  if (stop.load()) return {};
  return fail(Code::kUnavailable, "etcd watch: etcd unreachable (" + errors + ")");
}

}  // namespace agentbox::cluster
