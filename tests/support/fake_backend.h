#pragma once
// A backend and a sandbox for tests of the layers above sandbox/ (session/, service/): fast, no
// root, no box. The sandbox keeps its files in memory (absolute in-box paths), records every
// exec it is asked for and answers with a result the test sets; it has no process table.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sandbox/sandbox.h"

namespace agentbox::testing {

class FakeSandbox : public sandbox::Sandbox {
 public:
  FakeSandbox(std::string backend, sandbox::BoxConfig cfg)
      : backend_(std::move(backend)), cfg_(std::move(cfg)) {}
  std::string_view name() const override { return backend_; }
  std::string workspace() const override { return "/workspace"; }
  std::optional<uid_t> uid() const override { return std::nullopt; }

  sandbox::asio::awaitable<Result<sandbox::ExecResult>> exec(sandbox::ExecSpec spec,
                                                             sandbox::OutputSink* sink) override {
    sandbox::ExecResult r;
    {
      std::lock_guard lk(mu_);
      execs_.push_back(spec);
      r = next_result_;
    }
    if (sink != nullptr) {
      std::string out = std::move(r.stdout_data);
      r.stdout_data.clear();
      if (!out.empty()) co_await sink->on_output(sandbox::StreamKind::kStdout, std::move(out));
    }
    co_return r;
  }

  Result<sandbox::FileReader> open_file(const std::string& path) override {
    std::lock_guard lk(mu_);
    auto it = files_.find(path);
    if (it == files_.end()) {
      if (dirs_.count(path)) return fail(Code::kIsDir, "is a directory: " + path);
      return fail(Code::kNotFound, "no such file: " + path);
    }
    UniqueFd fd(::memfd_create("fake", MFD_CLOEXEC));
    // pwrite: the fd's offset stays at 0, where a reader starts.
    if (!fd || ::pwrite(fd.get(), it->second.data(), it->second.size(), 0) !=
                   static_cast<ssize_t>(it->second.size())) {
      return fail(Code::kInternal, "memfd");
    }
    return sandbox::FileReader{std::move(fd), it->second.size(), nullptr};
  }

  Result<std::unique_ptr<sandbox::FileWriter>> create_file(const std::string& path,
                                                           sandbox::WriteOptions opts) override {
    std::lock_guard lk(mu_);
    if (dirs_.count(path)) return fail(Code::kIsDir, "is a directory: " + path);
    if (!dirs_.count(parent(path))) {
      if (!opts.mkdirs) return fail(Code::kNotFound, "no such directory: " + parent(path));
      mkdirs_locked(parent(path));
    }
    return std::unique_ptr<sandbox::FileWriter>(new Writer(this, path, opts.max_bytes));
  }

  Result<sandbox::FileInfo> stat(const std::string& path) override {
    std::lock_guard lk(mu_);
    sandbox::FileInfo i;
    i.path = path;
    i.name = path.substr(path.find_last_of('/') + 1);
    if (dirs_.count(path)) {
      i.is_dir = true;
      i.mode = 040755;
      return i;
    }
    auto it = files_.find(path);
    if (it == files_.end()) return fail(Code::kNotFound, "no such file: " + path);
    i.size = it->second.size();
    i.mode = 0100644;
    return i;
  }

  Result<std::vector<sandbox::DirEntry>> read_dir(const std::string& path) override {
    std::lock_guard lk(mu_);
    if (!dirs_.count(path)) return fail(Code::kNotFound, "no such directory: " + path);
    std::vector<sandbox::DirEntry> out;
    for (const auto& d : dirs_) {
      if (d != path && parent(d) == path) out.push_back({base(d), true});
    }
    for (const auto& [f, data] : files_) {
      if (parent(f) == path) out.push_back({base(f), false, false, data.size()});
    }
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.name < b.name; });
    return out;
  }

  Status mkdir_all(const std::string& path) override {
    std::lock_guard lk(mu_);
    if (files_.count(path)) return fail(Code::kExists, "a file is in the way: " + path);
    mkdirs_locked(path);
    return {};
  }
  Status remove(const std::string& path) override {
    std::lock_guard lk(mu_);
    if (files_.erase(path)) return {};
    if (!dirs_.count(path)) return fail(Code::kNotFound, "no such file: " + path);
    for (const auto& [f, data] : files_) {
      if (parent(f) == path) return fail(Code::kNotEmpty, "not empty: " + path);
    }
    dirs_.erase(path);
    return {};
  }
  Status remove_all(const std::string& path) override {
    std::lock_guard lk(mu_);
    bool any = files_.erase(path) + dirs_.erase(path) > 0;
    std::erase_if(files_, [&](const auto& kv) { return kv.first.starts_with(path + "/"); });
    std::erase_if(dirs_, [&](const std::string& d) { return d.starts_with(path + "/"); });
    if (!any) return fail(Code::kNotFound, "no such file: " + path);
    return {};
  }
  Status rename(const std::string& from, const std::string& to) override {
    std::lock_guard lk(mu_);
    auto it = files_.find(from);
    if (it == files_.end()) return fail(Code::kNotFound, "no such file: " + from);
    files_[to] = std::move(it->second);
    files_.erase(from);
    return {};
  }
  void shutdown() override { shut_down_ = true; }

  // For the test.
  const sandbox::BoxConfig& config() const { return cfg_; }
  bool shut_down() const { return shut_down_; }
  void set_next_result(sandbox::ExecResult r) {
    std::lock_guard lk(mu_);
    next_result_ = std::move(r);
  }
  std::vector<sandbox::ExecSpec> execs() {
    std::lock_guard lk(mu_);
    return execs_;
  }
  std::string file(const std::string& path) {
    std::lock_guard lk(mu_);
    auto it = files_.find(path);
    return it == files_.end() ? std::string("<none>") : it->second;
  }
  void put(const std::string& path, std::string data) {
    std::lock_guard lk(mu_);
    mkdirs_locked(parent(path));
    files_[path] = std::move(data);
  }

 private:
  class Writer : public sandbox::FileWriter {
   public:
    Writer(FakeSandbox* box, std::string path, std::uint64_t max)
        : box_(box), path_(std::move(path)), max_(max) {}
    Status write(std::string_view chunk) override {
      if (data_.size() + chunk.size() > max_) return fail(Code::kTooBig, "too big: " + path_);
      data_ += chunk;
      return {};
    }
    Result<std::uint64_t> commit() override {
      std::lock_guard lk(box_->mu_);
      box_->files_[path_] = data_;
      return data_.size();
    }

   private:
    FakeSandbox* box_;
    std::string path_;
    std::uint64_t max_;
    std::string data_;
  };

  static std::string parent(const std::string& p) {
    auto slash = p.find_last_of('/');
    return slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
  }
  static std::string base(const std::string& p) { return p.substr(p.find_last_of('/') + 1); }
  void mkdirs_locked(const std::string& p) {
    for (std::string d = p; d != "/" && !d.empty(); d = parent(d)) dirs_.insert(d);
    dirs_.insert("/");
  }

  std::string backend_;
  sandbox::BoxConfig cfg_;
  std::atomic<bool> shut_down_{false};
  std::mutex mu_;
  std::map<std::string, std::string> files_;
  std::set<std::string> dirs_{"/", "/workspace"};
  std::vector<sandbox::ExecSpec> execs_;
  sandbox::ExecResult next_result_;
};

class FakeBackend : public sandbox::Backend {
 public:
  explicit FakeBackend(std::string name) : name_(std::move(name)) {}
  std::string_view name() const override { return name_; }
  bool isolated() const override { return name_ != "host"; }  // as the real ones of that name
  Status check_usable() override { return {}; }
  Result<std::unique_ptr<sandbox::Sandbox>> create(sandbox::BoxConfig cfg) override {
    creates_++;
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (down_) return fail(Code::kUnavailable, "fake backend is down");
    // The workspace must exist before the backend is asked for a box.
    if (!std::filesystem::is_directory(cfg.workspace_dir)) {
      return fail(Code::kInternal, "fake backend: no workspace dir " + cfg.workspace_dir);
    }
    std::lock_guard lk(mu_);
    configs_.push_back(cfg);
    return std::make_unique<FakeSandbox>(name_, std::move(cfg));
  }

  std::atomic<int> creates_{0};
  std::atomic<bool> down_{false};
  std::chrono::milliseconds delay_{0};
  std::mutex mu_;
  std::vector<sandbox::BoxConfig> configs_;

 private:
  std::string name_;
};

}  // namespace agentbox::testing
