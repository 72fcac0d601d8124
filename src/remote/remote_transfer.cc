#include "remote/remote_transfer.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "sandbox/file_feed.h"

namespace agentbox::remote {

namespace {

using namespace std::chrono_literals;

// A chunk transfer waits this long for each frame of the runner (an ack, the ok).
constexpr std::chrono::milliseconds kTransferIdle = 60s;

Error unexpected_frame(const RunnerReply& r) {
  return Error::make(Code::kInternal,
                     "write_file: runner answered '" + r.type + "', not what the request expects");
}

}  // namespace

Result<std::unique_ptr<ChunkUpload>> ChunkUpload::start(const std::shared_ptr<RunnerConn>& conn,
                                                        const std::string& target,
                                                        std::uint32_t perm, std::int64_t size) {
  auto t = AB_TRY(conn->start_transfer(std::string(proto::type::kFileBegin),
                                       proto::to_json(proto::FileBegin{target, perm, size})));
  std::unique_ptr<ChunkUpload> up(new ChunkUpload(std::move(t)));
  AB_TRY(up->wait_ack());
  return up;
}

Status ChunkUpload::wait_ack() {
  auto f = AB_TRY(t_->next(kTransferIdle));
  if (f.type != proto::type::kAck) return std::unexpected(unexpected_frame(f));
  auto a = AB_TRY(proto::body_as<proto::Ack>(f));
  acked_ = std::max(acked_, a.offset);
  return {};
}

Status ChunkUpload::send(std::string_view chunk) {
  while (sent_ - acked_ >= t_->window()) AB_TRY(wait_ack());
  t_->send_chunk(sent_, chunk);
  sent_ += static_cast<std::int64_t>(chunk.size());
  return {};
}

Status ChunkUpload::write(std::string_view data) {
  const auto chunk = static_cast<std::size_t>(t_->chunk_size());
  if (!pending_.empty()) {
    std::size_t take = std::min(chunk - pending_.size(), data.size());
    pending_.append(data.substr(0, take));
    data.remove_prefix(take);
    if (pending_.size() < chunk) return {};
    AB_TRY(send(pending_));
    pending_.clear();
  }
  while (data.size() >= chunk) {
    AB_TRY(send(data.substr(0, chunk)));
    data.remove_prefix(chunk);
  }
  if (!data.empty()) {
    pending_.reserve(chunk);
    pending_.append(data);
  }
  return {};
}

Result<std::uint64_t> ChunkUpload::finish() {
  if (!pending_.empty()) {
    AB_TRY(send(pending_));
    std::string().swap(pending_);
  }
  t_->send(proto::type::kFileEnd, proto::to_json(proto::FileEnd{sent_}));
  for (;;) {
    auto f = AB_TRY(t_->next(kTransferIdle));
    if (f.type == proto::type::kAck) continue;
    t_->finish();
    if (f.type != proto::type::kOk) return std::unexpected(unexpected_frame(f));
    return static_cast<std::uint64_t>(sent_);
  }
}

Result<proto::FileChunk> chunk_of(RunnerReply& f) {
  if (!f.binary) return proto::body_as<proto::FileChunk>(f);
  proto::FileChunk c;
  c.offset = f.body && f.body->is_object() ? f.body->value("offset", std::int64_t{-1}) : -1;
  c.data = std::move(*f.binary);
  return c;
}

namespace {

// How far the download may run ahead of its reader (the runner's window comes on top).
constexpr std::uint64_t kStreamRoom = 32u << 20;

Status pwrite_all(int fd, std::string_view data, std::int64_t at) {
  while (!data.empty()) {
    ssize_t w = ::pwrite(fd, data.data(), data.size(), at);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return fail_errno(errno, "write(download)");
    data.remove_prefix(static_cast<std::size_t>(w));
    at += w;
  }
  return {};
}

// The producer: chunks into `fd` until file_end, an error, or the reader leaving.
Status feed_chunks(RunnerTransfer* t, sandbox::FileFeed* feed, int fd, std::int64_t size) {
  std::int64_t got = 0;
  std::uint64_t punched = 0;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  for (;;) {
    auto f = AB_TRY(t->next(kTransferIdle));
    if (f.type == proto::type::kFileEnd) {
      t->finish();
      auto e = AB_TRY(proto::body_as<proto::FileEnd>(f));
      if (e.size != got || got != size) {
        return fail(Code::kInternal, "read_file: the runner ended after " + std::to_string(got) +
                                         " bytes but said " + std::to_string(size));
      }
      return {};
    }
    if (f.type != proto::type::kFileChunk) return std::unexpected(unexpected_frame(f));
    auto c = AB_TRY(chunk_of(f));
    if (c.offset != got || got + static_cast<std::int64_t>(c.data.size()) > size) {
      return fail(Code::kInternal, "read_file: the runner sent a chunk at offset " +
                                       std::to_string(c.offset) + ", expected " +
                                       std::to_string(got));
    }
    AB_TRY(pwrite_all(fd, c.data, got));
    got += static_cast<std::int64_t>(c.data.size());
    feed->arrived(static_cast<std::uint64_t>(got));
    // What the reader has sent goes from memory (whole pages).
    const std::uint64_t done = feed->consumed() / page * page;
    if (done >= punched + (4u << 20)) {
      (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        static_cast<off_t>(punched), static_cast<off_t>(done - punched));
      punched = done;
    }
    if (!feed->wait_room(kStreamRoom, kTransferIdle)) {
      if (feed->closed()) return {};  // the reader left: the transfer is abandoned
      return fail(Code::kTimedOut, "read_file: the reader took nothing for too long");
    }
    t->send(proto::type::kAck, proto::to_json(proto::Ack{got}));
  }
}

}  // namespace

Result<sandbox::FileReader> stream_download(std::shared_ptr<RunnerTransfer> t,
                                            const RunnerReply& begin) {
  auto b = AB_TRY(proto::body_as<proto::FileBegin>(begin));
  if (b.size < 0 || b.size > proto::kMaxFileSize) {
    return fail(Code::kTooBig, "read_file: the runner announced " + std::to_string(b.size) +
                                   " bytes, over the " + std::to_string(proto::kMaxFileSize) +
                                   "-byte limit");
  }
  UniqueFd fd(::memfd_create("agentbox-remote-read", MFD_CLOEXEC));
  if (!fd) return fail_errno(errno, "memfd_create");
  UniqueFd reader(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!reader) return fail_errno(errno, "dup(memfd)");
  auto feed = std::make_shared<sandbox::FileFeed>();
  std::thread([t = std::move(t), feed, fd = std::move(fd), size = b.size]() mutable {
    if (auto s = feed_chunks(t.get(), feed.get(), fd.get(), size); !s) feed->fail(s.error());
    // An unfinished transfer is aborted here (RunnerTransfer's destructor tells the runner).
    t.reset();
  }).detach();
  sandbox::FileReader out;
  out.fd = std::move(reader);
  out.size = static_cast<std::uint64_t>(b.size);
  out.feed = std::move(feed);
  return out;
}

}  // namespace agentbox::remote
