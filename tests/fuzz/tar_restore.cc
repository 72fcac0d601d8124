// Fuzz harness: the archives a restore extracts (workspace/archive.h extract_archive), as
// POST /v1/sessions/{id}/restore and the template build hand them over. The input's first byte
// says whether the rest is the archive as is (the zstd framing is fuzzed) or a tar that the
// harness compresses with zstd first (the tar reader and the extraction rules are fuzzed). The
// archive is a memfd; the workspace a private directory emptied after each input and removed at
// exit. Whatever the archive says, nothing may appear outside that directory.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zstd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "workspace/archive.h"

namespace fs = std::filesystem;
using namespace agentbox::workspace;

namespace {
fs::path g_root;  // holds g_root/ws (extracted into) and g_root/outside (must stay empty)

void remove_root() {
  std::error_code ec;
  if (!g_root.empty()) fs::remove_all(g_root, ec);
}

void setup() {
  if (!g_root.empty()) return;
  std::string tmpl = (fs::temp_directory_path() / "agentbox-fuzz-tar-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
  g_root = tmpl;
  fs::create_directory(g_root / "ws");
  std::atexit(remove_root);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  setup();
  std::string archive(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    std::string z(ZSTD_compressBound(archive.size()), '\0');
    std::size_t n = ZSTD_compress(z.data(), z.size(), archive.data(), archive.size(), 1);
    if (ZSTD_isError(n)) std::abort();
    z.resize(n);
    archive = std::move(z);
  }
  int afd = ::memfd_create("agentbox-fuzz-archive", MFD_CLOEXEC);
  if (afd < 0) std::abort();
  if (!archive.empty() &&
      ::pwrite(afd, archive.data(), archive.size(), 0) != static_cast<ssize_t>(archive.size())) {
    std::abort();
  }
  int into = ::open((g_root / "ws").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (into < 0) std::abort();
  ExtractLimits limits;
  limits.max_total_bytes = 16u << 20;
  limits.max_entries = 4096;
  (void)extract_archive(afd, into, limits, std::nullopt, "fuzz.tar.zst");
  ::close(into);
  ::close(afd);
  // Nothing outside the workspace: g_root holds only ws.
  for (const auto& e : fs::directory_iterator(g_root)) {
    if (e.path().filename() != "ws") std::abort();
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(g_root / "ws")) fs::remove_all(e.path(), ec);
  return 0;
}
