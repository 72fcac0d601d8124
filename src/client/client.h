#pragma once
// A small synchronous HTTP client for the agentboxd API (shared/API.md), used by the CLI and by
// the integration tests. One keep-alive connection, reopened when the server closes it.
// Non-2xx replies are not Errors: the caller gets the status and body (use api_error() to read
// the {"error":{code,message}} body). An Error means no reply could be had (connect, I/O).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace agentbox::client {

// The exec routes carry stdin inside their JSON body. agentboxd caps an exec request body at
// kMaxExecBodyBytes by default (server::ServerOptions::max_exec_json_bytes); the CLI sends at
// most kMaxExecStdinBytes of stdin, which leaves room for JSON escaping of ordinary text.
inline constexpr std::size_t kMaxExecBodyBytes = 24u << 20;
inline constexpr std::size_t kMaxExecStdinBytes = 16u << 20;

// TLS of an https:// server: the server's certificate is verified against `ca_file` (PEM; the
// system's CAs when empty) and its name (or IP address) against the URL's host; `cert_file` and
// `key_file` (PEM) are this client's own certificate, for servers that ask for one (etcd with
// --client-cert-auth).
struct TlsOptions {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

struct ClientOptions {
  std::string server = "http://127.0.0.1:9090";  // http://host:port or https://host:port
  std::string token;                             // sent as Authorization: Bearer when set
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  TlsOptions tls;  // for https:// only
};

struct Response {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
};

// {"error":{"code","message"}} of a reply, if it has one.
struct ApiError {
  std::string code;
  std::string message;
};
std::optional<ApiError> api_error(const Response& r);

// Percent-encodes a query parameter value.
std::string url_encode(std::string_view s);

class Client {
 public:
  explicit Client(ClientOptions opts);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // A request with a small body (JSON or none); the whole reply is read into memory.
  Result<Response> request(std::string_view method, std::string_view target,
                           std::string_view body = {},
                           std::string_view content_type = "application/json");
  // The same with extra request headers (name, value), e.g. a dialect's session header.
  using Headers = std::vector<std::pair<std::string, std::string>>;
  Result<Response> request(std::string_view method, std::string_view target, std::string_view body,
                           std::string_view content_type, const Headers& headers);

  // A request whose reply body is handed to on_chunk as it arrives (NDJSON exec stream, file
  // download). on_chunk returns false to abort (the connection is then closed). Returns the
  // status and headers; body is left empty unless the status is not 2xx (then it holds the
  // error body). `on_header` (optional) gets the status and headers as soon as they arrive, so
  // a caller can tell a stream that was answered and then dropped from one that never was.
  Result<Response> request_stream(std::string_view method, std::string_view target,
                                  std::string_view body,
                                  const std::function<bool(std::string_view)>& on_chunk,
                                  const std::function<void(const Response&)>& on_header = {});

  // A request whose body of `size` bytes is pulled from `read` (fills the buffer, returns the
  // count; 0 only at the end) — a file upload. `progress` gets the bytes sent so far.
  Result<Response> upload(std::string_view method, std::string_view target, std::uint64_t size,
                          const std::function<Result<std::size_t>(char*, std::size_t)>& read,
                          const std::function<void(std::uint64_t)>& progress = {});

  // The same upload with the body taken from `fd` (a regular file) from its current offset,
  // sent with sendfile(2): the bytes go from the page cache to the socket without being copied
  // through this process. Fewer than `size` bytes left in the file is an error.
  Result<Response> upload_file(std::string_view method, std::string_view target, int fd,
                               std::uint64_t size,
                               const std::function<void(std::uint64_t)>& progress = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace agentbox::client
