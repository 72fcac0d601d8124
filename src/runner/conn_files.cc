// agentbox-runner: chunked file transfers of a connection (conn.h; docs/runner-protocol.md).

#include "runner/conn.h"

namespace agentbox::runner::detail {

bool Conn::send_chunked(const std::string& id, const std::string& path) {
  auto fd = fs_.open_at(path, O_RDONLY | O_NONBLOCK);
  if (!fd) return false;  // the plain path reports the error
  struct stat st {};
  if (fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= p::kChunkThreshold) {
    return false;
  }
  if (st.st_size > p::kMaxFileSize) {
    reply_error(id, p::code::kTooBig,
                "read " + path + ": " + std::to_string(st.st_size) + " bytes is over the " +
                    std::to_string(p::kMaxFileSize) + "-byte limit");
    return true;
  }
  auto d = std::make_shared<Download>();
  {
    std::lock_guard l(mu_);
    if (closed_) return true;
    downloads_[id] = d;
  }
  std::int64_t size = st.st_size, sent = 0;
  // Version 3: binary frames, read straight into the frame after its header.
  const bool binary = version_ >= p::kBinaryVersion && id.size() <= 255;
  const std::int64_t window = binary ? p::kBinaryWindowBytes : p::kWindowBytes;
  const std::int64_t chunk = binary ? p::kBinaryChunkSize : p::kChunkSize;
  reply(id, p::type::kFileBegin, p::to_json(p::FileBegin{"", 0, size}));
  std::string buf;
  while (sent < size) {
    {
      std::unique_lock l(d->mu);
      d->cv.wait(l, [&] { return d->cancelled || sent - d->acked < window; });
      if (d->cancelled) break;
    }
    const auto want = static_cast<std::size_t>(std::min(chunk, size - sent));
    std::size_t head = 0;
    if (binary) {
      buf = p::binary_chunk_header(id, sent, want);
      head = p::binary_chunk_header_size(id);
    } else {
      buf.resize(want);
    }
    ssize_t n = pread(fd->get(), buf.data() + head, want, sent);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      reply_error(id, Error::from_errno(errno, "read " + path));
      break;
    }
    if (n == 0) break;  // the file shrank: end here, file_end says how much came
    buf.resize(head + static_cast<std::size_t>(n));
    if (binary) {
      outbox.send_binary(std::move(buf));
    } else {
      outbox.send(p::chunk_frame(id, "", sent, buf));
    }
    sent += n;
  }
  bool cancelled;
  {
    std::lock_guard l(d->mu);
    cancelled = d->cancelled;
  }
  if (!cancelled) reply(id, p::type::kFileEnd, p::to_json(p::FileEnd{sent}));
  std::lock_guard l(mu_);
  downloads_.erase(id);
  return true;
}

void Conn::transfer_frame(const p::Envelope& e) {
  const std::string& t = e.type;
  const std::string& id = e.id;
  if (t == p::type::kAck || t == p::type::kError) {
    std::shared_ptr<Download> d;
    {
      std::lock_guard l(mu_);
      if (auto it = downloads_.find(id); it != downloads_.end()) d = it->second;
    }
    if (d) {
      std::lock_guard l(d->mu);
      if (t == p::type::kError) {
        d->cancelled = true;
      } else if (auto a = p::body_as<p::Ack>(e); a) {
        d->acked = std::max(d->acked, a->offset);
      }
      d->cv.notify_all();
    }
    if (t == p::type::kError) uploads_.erase(id);
    return;
  }
  if (t == p::type::kFileBegin) {
    auto b = body<p::FileBegin>(e);
    if (!b) return;
    const bool unknown = b->size == p::kSizeUnknown;
    if (unknown ? version_ < p::kBinaryVersion : b->size < 0) {
      return reply_error(id, p::code::kInvalid,
                         "file_begin: size " + std::to_string(b->size) +
                             (unknown ? " (not known yet) needs version 3" : " is negative"));
    }
    if (b->size > p::kMaxFileSize) {
      return reply_error(id, p::code::kTooBig,
                         "write " + b->path + ": " + std::to_string(b->size) +
                             " bytes is over the " + std::to_string(p::kMaxFileSize) +
                             "-byte limit");
    }
    if (uploads_.count(id)) return reply_error(id, p::code::kInvalid, "transfer " + id + " exists");
    auto w = fs_.create(b->path, b->perm);
    if (!w) return reply_error(id, w.error());
    uploads_[id] = Upload{std::move(*w), b->size};
    return reply(id, p::type::kAck, p::to_json(p::Ack{0}));
  }
  if (t == p::type::kFileChunk) {
    auto c = p::body_as<p::FileChunk>(e);
    if (!c) return abort_upload(id, p::code::kInvalid, c.error().message);
    return upload_chunk(id, c->offset, c->data);
  }
  // file_end
  Upload* up = upload_of(id);
  if (!up) return;
  Upload& u = *up;
  auto abort = [&](std::string_view code, std::string msg) {
    abort_upload(id, code, std::move(msg));
  };
  auto end = p::body_as<p::FileEnd>(e);
  if (!end) return abort(p::code::kInvalid, end.error().message);
  if (u.size == p::kSizeUnknown) u.size = end->size;
  if (end->size != u.size || u.writer.written() != u.size) {
    return abort(p::code::kInvalid, "file_end after " + std::to_string(u.writer.written()) +
                                        " bytes, announced " + std::to_string(u.size));
  }
  if (auto s = u.writer.commit(); !s)
    return abort(p::code_for_errno(s.error().sys_errno), s.error().message);
  uploads_.erase(id);
  reply(id, p::type::kOk, std::nullopt);
}

void Conn::upload_chunk(const std::string& id, std::int64_t offset, std::string_view data) {
  Upload* up = upload_of(id);
  if (!up) return;
  Upload& u = *up;
  auto abort = [&](std::string_view code, std::string msg) {
    abort_upload(id, code, std::move(msg));
  };
  if (offset != u.writer.written()) {
    return abort(p::code::kInvalid, "file_chunk at offset " + std::to_string(offset) +
                                        ", expected " + std::to_string(u.writer.written()));
  }
  const std::int64_t end = u.writer.written() + static_cast<std::int64_t>(data.size());
  if (u.size == p::kSizeUnknown && end > p::kMaxFileSize) {
    return abort(p::code::kTooBig,
                 "write: over the " + std::to_string(p::kMaxFileSize) + "-byte limit");
  }
  if (u.size != p::kSizeUnknown && end > u.size) {
    return abort(p::code::kInvalid,
                 "file_chunk beyond the announced size " + std::to_string(u.size));
  }
  if (auto s = u.writer.write(data); !s)
    return abort(p::code_for_errno(s.error().sys_errno), s.error().message);
  reply(id, p::type::kAck, p::to_json(p::Ack{u.writer.written()}));
}

void Conn::dispatch_binary(std::string_view frame) {
  if (version_ < p::kBinaryVersion) {
    spdlog::warn("a binary frame without version 3: dropped");
    return;
  }
  auto c = p::decode_binary_chunk(frame);
  if (!c) {
    spdlog::warn("bad binary frame: {}", c.error().message);
    return;
  }
  upload_chunk(std::string(c->id), c->offset, c->data);
}

}  // namespace agentbox::runner::detail
