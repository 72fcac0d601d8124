#include "service/files.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/log.h"
#include "service/blocking.h"

namespace agentbox::service {
namespace {

Result<Files::Part> read_part_of(sandbox::Sandbox* box, const std::string& path,
                                 std::uint64_t offset, std::size_t limit) {
  sandbox::FileReader f = AB_TRY(box->open_file(path));
  Files::Part r;
  r.size = f.size;
  if (offset >= f.size) return r;
  std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(limit, f.size - offset));
  r.data.resize(want);
  std::size_t got = 0;
  while (got < want) {
    ssize_t n =
        ::pread(f.fd.get(), r.data.data() + got, want - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(errno, "read(" + path + ")");
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  r.data.resize(got);
  return r;
}

std::size_t count_of(std::string_view hay, std::string_view needle) {
  std::size_t n = 0;
  for (std::size_t pos = hay.find(needle); pos != std::string_view::npos;
       pos = hay.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

// The edit of Files::edit on the file's text: the new text and how many it replaced.
Result<std::pair<std::string, std::size_t>> replace_in(const std::string& path,
                                                       const std::string& text,
                                                       const std::string& old_s,
                                                       const std::string& new_s, bool all) {
  if (old_s.empty()) return fail(Code::kInvalid, "the text to replace must not be empty");
  std::size_t n = count_of(text, old_s);
  if (n == 0) return fail(Code::kInvalid, "old_string does not occur in " + path);
  if (n > 1 && !all) {
    return fail(Code::kInvalid, "old_string occurs " + std::to_string(n) + " times in " + path +
                                    "; give more context or set replace_all");
  }
  std::string out;
  std::size_t pos = 0;
  for (std::size_t hit = text.find(old_s); hit != std::string::npos; hit = text.find(old_s, pos)) {
    out.append(text, pos, hit - pos);
    out += new_s;
    pos = hit + old_s.size();
  }
  out.append(text, pos);
  return std::make_pair(std::move(out), n);
}

}  // namespace

asio::awaitable<Result<Lease>> Files::lease(const Origin& origin, std::string id) {
  Sessions sessions(d_);
  co_return co_await sessions.lease(origin, std::move(id), /*create_if_missing=*/false);
}

asio::awaitable<Result<sandbox::FileReader>> Files::open(Origin origin, std::string id,
                                                         std::string path, bool streamed) {
  auto l = co_await lease(origin, std::move(id));
  if (!l) co_return std::unexpected(l.error());
  auto job = on_pool(d_.pool, [box = l->box, path, streamed] {
    return streamed ? box->open_file_streamed(path) : box->open_file(path);
  });
  co_return co_await std::move(job);
}

asio::awaitable<Result<std::string>> Files::read(Origin origin, std::string id, std::string path,
                                                 std::uint64_t max_bytes) {
  auto l = co_await lease(origin, std::move(id));
  if (!l) co_return std::unexpected(l.error());
  auto job =
      on_pool(d_.pool, [box = l->box, path, max_bytes] { return box->read_file(path, max_bytes); });
  co_return co_await std::move(job);
}

asio::awaitable<Result<Files::Part>> Files::read_part(Origin origin, std::string id,
                                                      std::string path, std::uint64_t offset,
                                                      std::size_t limit) {
  auto l = co_await lease(origin, std::move(id));
  if (!l) co_return std::unexpected(l.error());
  auto job = on_pool(d_.pool, [box = l->box, path, offset, limit] {
    return read_part_of(box.get(), path, offset, limit);
  });
  co_return co_await std::move(job);
}

asio::awaitable<Result<std::size_t>> Files::edit(Origin origin, std::string id, std::string path,
                                                 std::string old_text, std::string new_text,
                                                 bool all, std::size_t max_read,
                                                 sandbox::WriteOptions opts) {
  auto l = co_await lease(origin, std::move(id));
  if (!l) co_return std::unexpected(l.error());
  auto job = on_pool(
      d_.pool,
      [box = l->box, path, old_text, new_text, all, max_read, opts]() -> Result<std::size_t> {
        Part part = AB_TRY(read_part_of(box.get(), path, 0, max_read));
        if (part.data.size() < part.size) {
          return fail(Code::kTooBig, path + " is over the " + std::to_string(max_read >> 20) +
                                         " MiB edit_file reads; use exec or write_file");
        }
        auto edited = AB_TRY(replace_in(path, part.data, old_text, new_text, all));
        AB_TRY(box->write_file(path, edited.first, opts));
        return edited.second;
      });
  auto n = co_await std::move(job);
  if (!n) co_return n;
  Fields f = {{"path", path}, {"replacements", std::uint64_t{*n}}};
  d_.bus->emit("file.edit", origin, l->id, f);
  co_return n;
}

asio::awaitable<Result<Upload>> Files::begin_upload(Origin origin, std::string id, std::string path,
                                                    sandbox::WriteOptions opts) {
  auto l = co_await lease(origin, std::move(id));
  if (!l) co_return std::unexpected(l.error());
  auto job = on_pool(d_.pool, [box = l->box, path, opts] { return box->create_file(path, opts); });
  auto w = co_await std::move(job);
  if (!w) co_return std::unexpected(w.error());
  co_return Upload{std::move(*l), std::move(path), std::move(*w)};
}

asio::awaitable<Result<std::uint64_t>> Files::commit(Origin origin, Upload* upload) {
  sandbox::FileWriter* w = upload->writer.get();
  auto job = on_pool(d_.pool, [w] { return w->commit(); });
  auto size = co_await std::move(job);
  if (!size) co_return size;
  Fields f = {{"path", upload->path}, {"size", std::uint64_t{*size}}};
  d_.bus->emit("file.put", origin, upload->lease.id, f);
  co_return size;
}

asio::awaitable<Result<std::uint64_t>> Files::write(Origin origin, std::string id, std::string path,
                                                    std::string data, sandbox::WriteOptions opts) {
  auto up = co_await begin_upload(origin, std::move(id), std::move(path), opts);
  if (!up) co_return std::unexpected(up.error());
  sandbox::FileWriter* w = up->writer.get();
  auto job = on_pool(d_.pool, [w, data = std::move(data)] { return w->write(data); });
  if (auto st = co_await std::move(job); !st) co_return std::unexpected(st.error());
  co_return co_await commit(std::move(origin), &*up);
}

asio::awaitable<Result<sandbox::FileInfo>> Files::stat(Origin origin, std::string id,
                                                       std::string path) {
  auto l = co_await lease(origin, std::move(id));
  if (!l) co_return std::unexpected(l.error());
  auto job = on_pool(d_.pool, [box = l->box, path] { return box->stat(path); });
  co_return co_await std::move(job);
}

asio::awaitable<Result<std::vector<sandbox::DirEntry>>> Files::list(Origin origin, std::string id,
                                                                    std::string path) {
  auto l = co_await lease(origin, std::move(id));
  if (!l) co_return std::unexpected(l.error());
  auto job = on_pool(d_.pool, [box = l->box, path] { return box->read_dir(path); });
  co_return co_await std::move(job);
}

asio::awaitable<Status> Files::mkdir(Origin origin, std::string id, std::string path) {
  auto l = co_await lease(origin, std::move(id));
  if (!l) co_return std::unexpected(l.error());
  auto job = on_pool(d_.pool, [box = l->box, path] { return box->mkdir_all(path); });
  auto st = co_await std::move(job);
  if (!st) co_return st;
  Fields f = {{"path", path}};
  d_.bus->emit("file.mkdir", origin, l->id, f);
  co_return st;
}

asio::awaitable<Status> Files::remove(Origin origin, std::string id, std::string path,
                                      bool recursive) {
  auto l = co_await lease(origin, std::move(id));
  if (!l) co_return std::unexpected(l.error());
  auto job = on_pool(d_.pool, [box = l->box, path, recursive] {
    return recursive ? box->remove_all(path) : box->remove(path);
  });
  auto st = co_await std::move(job);
  if (!st) co_return st;
  Fields f = {{"path", path}, {"recursive", recursive}};
  d_.bus->emit("file.delete", origin, l->id, f);
  co_return st;
}

asio::awaitable<Status> Files::rename(Origin origin, std::string id, std::string from,
                                      std::string to) {
  auto l = co_await lease(origin, std::move(id));
  if (!l) co_return std::unexpected(l.error());
  auto job = on_pool(d_.pool, [box = l->box, from, to] { return box->rename(from, to); });
  auto st = co_await std::move(job);
  if (!st) co_return st;
  Fields f = {{"from", from}, {"to", to}};
  d_.bus->emit("file.rename", origin, l->id, f);
  co_return st;
}

}  // namespace agentbox::service
