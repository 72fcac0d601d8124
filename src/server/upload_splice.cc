// PUT /files, zero-copy (server/internal/upload_splice.h).

#include "server/internal/upload_splice.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <utility>

#include "common/unique_fd.h"
#include "server/internal/blocking.h"

namespace agentbox::server::detail {
namespace {

using namespace boost::asio::experimental::awaitable_operators;

// A pipe's capacity, asked for (the kernel's pipe-max-size allows 1 MiB by default); with less,
// chunks are smaller and nothing else changes.
constexpr int kPipeBytes = 1 << 20;
// A fill hands over what it has when the socket runs dry with at least this much in the pipe
// (so the file write overlaps the wait), else it waits for more.
constexpr std::size_t kHandOver = 256u << 10;

struct Pipe {
  UniqueFd r;
  UniqueFd w;
  std::size_t capacity = 0;
};

Result<Pipe> make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return fail_errno(errno, "pipe2");
  Pipe p{UniqueFd(fds[0]), UniqueFd(fds[1])};
  int cap = ::fcntl(p.w.get(), F_SETPIPE_SZ, kPipeBytes);
  if (cap < 0) cap = ::fcntl(p.w.get(), F_GETPIPE_SZ);
  if (cap <= 0) return fail_errno(errno, "F_GETPIPE_SZ");
  p.capacity = static_cast<std::size_t>(cap);
  return p;
}

struct Fill {
  beast::error_code ec;
  std::size_t got = 0;
};

// Moves up to `want` bytes from the socket into the (empty) pipe, waiting for the socket when it
// has nothing (at most `timeout` at a time).
asio::awaitable<Fill> fill_pipe(Conn* conn, int pipe_w, std::size_t want,
                                std::chrono::seconds timeout) {
  Fill out;
  auto& sock = conn->stream.socket();
  const int fd = sock.native_handle();
  // splice(2) honours the socket's own O_NONBLOCK, not only SPLICE_F_NONBLOCK.
  boost::system::error_code nb;
  sock.non_blocking(true, nb);
  if (nb) {
    out.ec = nb;
    co_return out;
  }
  while (out.got < want) {
    ssize_t n =
        ::splice(fd, nullptr, pipe_w, nullptr, want - out.got, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n > 0) {
      out.got += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) {
      out.ec = asio::error::eof;
      co_return out;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN) {
      out.ec = beast::error_code(errno, boost::system::system_category());
      co_return out;
    }
    if (out.got >= kHandOver) co_return out;
    asio::steady_timer timer(sock.get_executor(), timeout);
    auto readable = sock.async_wait(tcp::socket::wait_read, kTuple);
    auto expired = timer.async_wait(kTuple);
    auto first = co_await (std::move(readable) || std::move(expired));
    if (first.index() == 1) {
      out.ec = beast::error::timeout;
      co_return out;
    }
    if (auto [ec] = std::get<0>(first); ec) {
      out.ec = ec;
      co_return out;
    }
  }
  co_return out;
}

}  // namespace

asio::awaitable<SpliceUpload> splice_upload(Call* call, BodyReader* body,
                                            sandbox::FileWriter* writer,
                                            sandbox::SpliceTarget* target) {
  Context* ctx = call->ctx;
  SpliceUpload out;
  // What came with the request head (read past it into the buffer) goes first, as bytes.
  if (const std::size_t early = std::min<std::uint64_t>(body->buffer->size(), body->raw_left);
      early > 0) {
    std::string head_bytes(early, '\0');
    BodyChunk chunk = co_await read_body_chunk(body, head_bytes.data(), early);
    ctx->metrics.add_bytes_in(chunk.wire_bytes);
    auto job = run_blocking(ctx->pool, [writer, &head_bytes] { return writer->write(head_bytes); });
    out.status = co_await std::move(job);
    if (!out.status) co_return out;
  }
  std::array<Pipe, 2> pipes;
  for (Pipe& p : pipes) {
    auto made = make_pipe();
    if (!made) {
      out.status = std::unexpected(made.error());
      co_return out;
    }
    p = std::move(*made);
  }
  // Two pipes, as put_file's two buffers: while the pool moves one into the file, the other
  // fills from the socket.
  int cur = 0;
  std::size_t queued = 0;  // bytes in pipes[1 - cur] not yet in the file
  auto drain = [ctx, target](int pipe_r, std::size_t n) {
    return run_blocking(ctx->pool, [target, pipe_r, n] { return target->splice_from(pipe_r, n); });
  };
  for (;;) {
    if (body->raw_left == 0) {
      if (queued > 0) {
        auto last = drain(pipes[1 - cur].r.get(), queued);
        out.status = co_await std::move(last);
      }
      co_return out;
    }
    const std::size_t want =
        static_cast<std::size_t>(std::min<std::uint64_t>(body->raw_left, pipes[cur].capacity));
    auto fill_op = fill_pipe(call->conn, pipes[cur].w.get(), want, body->timeout);
    Fill fill;
    Status wrote;
    if (queued > 0) {
      auto write_job = drain(pipes[1 - cur].r.get(), queued);
      std::tie(fill, wrote) = co_await (std::move(fill_op) && std::move(write_job));
      queued = 0;
    } else {
      fill = co_await std::move(fill_op);
    }
    body->raw_left -= fill.got;
    ctx->metrics.add_bytes_in(fill.got);
    if (!wrote) {
      out.status = std::move(wrote);
      co_return out;
    }
    if (fill.ec) {
      out.client_gone = true;
      out.gone_reason = fill.ec.message();
      co_return out;
    }
    queued = fill.got;
    cur = 1 - cur;
  }
}

}  // namespace agentbox::server::detail
