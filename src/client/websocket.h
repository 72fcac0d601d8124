#pragma once
// A WebSocket client for agentboxd's WebSocket routes (API.md: process attach, the one-step pty,
// /v1/events), used by the CLI (`agentbox shell`, `agentbox attach`). Boost.Beast on a private
// io_context, all on the calling thread: connect() does the upgrade (Authorization as for every
// request), run() is one event loop over the socket, an optional input fd and optional signals.
//
// Not thread-safe: one WebSocket per thread. send() and close() are called before run() or from
// run()'s callbacks. Messages are written in order through one bounded queue.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/client.h"
#include "common/error.h"

namespace agentbox::client {

struct WsMessage {
  std::string data;
  bool binary = false;
};

// How run() ended.
struct WsEnd {
  // A close frame came (the peer's, or its answer to ours): its code and reason, e.g. 1000
  // "exit 3" when an attached process ended.
  bool closed = false;
  int code = 0;
  std::string reason;
  // The socket failed without a close frame (reset, no reply within the timeout): why.
  std::optional<Error> error;
};

class WebSocket {
 public:
  explicit WebSocket(ClientOptions opts);
  ~WebSocket();
  WebSocket(const WebSocket&) = delete;
  WebSocket& operator=(const WebSocket&) = delete;

  // GET `target` with Upgrade: websocket. A 101 gives a Response with status 101; a refused
  // upgrade gives the server's reply (its status and error body, as Client::request does); an
  // Error means no reply could be had (connect, I/O, a bad server URL).
  Result<Response> connect(std::string_view target);

  struct Handlers {
    // Each message from the server, as it comes.
    std::function<void(WsMessage)> on_message;
    // Bytes read from input_fd (-1: none) as they come; an empty view once it ends (EOF or a
    // read error). A helper thread reads the fd (so a pipe, a terminal and a regular file all
    // work) and reads again only once the write queue has room: a fast producer waits.
    int input_fd = -1;
    std::function<void(std::string_view)> on_input;
    // Signals handled inside the loop (e.g. SIGWINCH), while run() runs.
    std::vector<int> signals;
    std::function<void(int)> on_signal;
    // Called every tick_interval (0: never) while the socket is open.
    std::chrono::milliseconds tick_interval{0};
    std::function<void()> on_tick;
  };
  // Runs until the socket ends: the server's close, the answer to close(), or an error.
  WsEnd run(Handlers handlers);

  // Queues one message (text unless `binary`).
  void send(std::string data, bool binary);
  // Sends what is queued, then a close frame; run() ends when the server answers it.
  void close(int code = 1000, std::string reason = {});

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace agentbox::client
