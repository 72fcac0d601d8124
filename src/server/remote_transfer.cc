#include "server/remote_transfer.h"

#include <algorithm>

namespace agentbox::server {

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

}  // namespace agentbox::server
