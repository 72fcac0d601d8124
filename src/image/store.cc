#include "image/store.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/log.h"
#include "common/unique_fd.h"
#include "image/internal/fetch.h"
#include "image/layer.h"

namespace agentbox::image {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::uint64_t kMaxMetaBytes = 4 << 20;  // a manifest, index or config blob

std::string hex_of(const std::string& digest) {
  return digest.substr(7);
}

std::string to_hex(const unsigned char* d, unsigned n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out += kHex[d[i] >> 4];
    out += kHex[d[i] & 15];
  }
  return out;
}

// "sha256:<hex>" of what `fd` holds from its start.
Result<std::string> sha256_fd(int fd, const std::string& shown) {
  if (::lseek(fd, 0, SEEK_SET) != 0) return fail_errno(errno, "seek(" + shown + ")");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return fail(Code::kInternal, "sha256 unavailable");
  }
  std::vector<char> buf(1 << 16);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail_errno(errno, "read(" + shown + ")");
    }
    if (n == 0) break;
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(n));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  return "sha256:" + to_hex(md, len);
}

// The OCI platform of this host ("amd64", "arm64", ...).
std::string host_arch() {
  utsname u{};
  ::uname(&u);
  std::string m = u.machine;
  if (m == "x86_64") return "amd64";
  if (m == "aarch64") return "arm64";
  if (m == "i686" || m == "i386") return "386";
  if (m.starts_with("armv7")) return "arm";
  return m;
}

// One blob of the pulled layout, opened and checked against its digest.
Result<UniqueFd> open_blob(const std::string& oci, const std::string& digest) {
  if (!is_digest(digest)) {
    return fail(Code::kImage, "image names a blob '" + digest + "' that is not a sha256 digest");
  }
  const std::string path = oci + "/blobs/sha256/" + hex_of(digest);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return fail(Code::kImage, "blob " + digest + " is missing from the pulled image");
  auto got = AB_TRY(sha256_fd(fd.get(), digest));
  if (got != digest) {
    return fail(Code::kImage, "blob " + digest + " does not match its digest (got " + got + ")");
  }
  return fd;
}

Result<json> read_json_blob(const std::string& oci, const std::string& digest) {
  auto fd = AB_TRY(open_blob(oci, digest));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return fail_errno(errno, "stat(blob " + digest + ")");
  if (static_cast<std::uint64_t>(st.st_size) > kMaxMetaBytes) {
    return fail(Code::kImage, "blob " + digest + " is too big for a manifest or config");
  }
  std::string s(static_cast<std::size_t>(st.st_size), '\0');
  if (::pread(fd.get(), s.data(), s.size(), 0) != static_cast<ssize_t>(s.size())) {
    return fail_errno(errno, "read(blob " + digest + ")");
  }
  json j = json::parse(s, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return fail(Code::kImage, "blob " + digest + " is not a JSON object");
  }
  return j;
}

std::string str_at(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

json encode_record(const Image& img) {
  json layers = json::array();
  for (const auto& l : img.layers) {
    layers.push_back({{"digest", l.digest},
                      {"diff_id", l.diff_id},
                      {"size", l.size},
                      {"media_type", l.media_type}});
  }
  return {{"ref", img.ref},
          {"refs", img.refs},
          {"digest", img.digest},
          {"size", img.size},
          {"layers", std::move(layers)},
          {"platform", img.platform},
          {"config",
           {{"env", img.config.env}, {"workdir", img.config.workdir}, {"user", img.config.user}}},
          {"pulled_at", img.pulled_at}};
}

Result<Image> decode_record(const std::string& text, const std::string& shown) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return fail(Code::kInternal, "image record " + shown + " is not JSON");
  }
  try {
    Image img;
    img.ref = j.at("ref").get<std::string>();
    img.refs = j.at("refs").get<std::vector<std::string>>();
    img.digest = j.at("digest").get<std::string>();
    img.size = j.at("size").get<std::uint64_t>();
    for (const auto& l : j.at("layers")) {
      img.layers.push_back({l.at("digest").get<std::string>(), l.at("diff_id").get<std::string>(),
                            l.at("size").get<std::uint64_t>(),
                            l.at("media_type").get<std::string>()});
    }
    img.platform = j.at("platform").get<std::string>();
    const json& c = j.at("config");
    img.config.env = c.at("env").get<std::vector<std::string>>();
    img.config.workdir = c.at("workdir").get<std::string>();
    img.config.user = c.at("user").get<std::string>();
    img.pulled_at = j.at("pulled_at").get<std::int64_t>();
    return img;
  } catch (const json::exception& e) {
    return fail(Code::kInternal, "image record " + shown + ": " + e.what());
  }
}

// The image manifest of the pulled layout: index.json's one entry, or the host platform's entry
// of an image index.
Result<std::pair<std::string, json>> pick_manifest(const std::string& oci, std::string* platform) {
  std::ifstream in(oci + "/index.json");
  std::stringstream ss;
  ss << in.rdbuf();
  json index = json::parse(ss.str(), nullptr, false);
  if (index.is_discarded() || !index.contains("manifests") || !index["manifests"].is_array() ||
      index["manifests"].empty()) {
    return fail(Code::kImage, "the pulled image has no manifest (index.json)");
  }
  std::string digest = str_at(index["manifests"][0], "digest");
  for (int depth = 0; depth < 2; ++depth) {
    auto m = AB_TRY(read_json_blob(oci, digest));
    if (!m.contains("manifests")) return std::make_pair(digest, std::move(m));
    // A multi-arch index: the host's platform.
    const std::string arch = host_arch();
    std::string pick;
    for (const auto& d : m["manifests"]) {
      if (!d.is_object() || !d.contains("platform")) continue;
      const json& p = d["platform"];
      if (str_at(p, "os") == "linux" && str_at(p, "architecture") == arch) {
        pick = str_at(d, "digest");
        break;
      }
    }
    if (pick.empty()) {
      return fail(Code::kImage, "image index " + digest + " has no linux/" + arch + " image");
    }
    digest = pick;
  }
  (void)platform;
  return fail(Code::kImage, "image index nests too deep");
}

}  // namespace

bool is_digest(const std::string& s) {
  if (s.size() != 71 || !s.starts_with("sha256:")) return false;
  return std::all_of(s.begin() + 7, s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

Result<std::string> registry_host(const std::string& ref) {
  if (ref.empty() || ref.size() > 512) {
    return fail(Code::kInvalid, "field 'ref': must be an image reference of 1..512 characters");
  }
  for (char c : ref) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == '/' || c == ':' || c == '@';
    if (!ok) {
      return fail(Code::kInvalid, "field 'ref': '" + ref + "' is not an image reference");
    }
  }
  if (ref.front() == '-' || ref.front() == '/' || ref.back() == '/' || ref.back() == ':' ||
      ref.find("//") != std::string::npos) {
    return fail(Code::kInvalid, "field 'ref': '" + ref + "' is not an image reference");
  }
  auto slash = ref.find('/');
  if (slash == std::string::npos) return std::string("docker.io");
  std::string first = ref.substr(0, slash);
  if (first.find('.') != std::string::npos || first.find(':') != std::string::npos ||
      first == "localhost") {
    return first;
  }
  return std::string("docker.io");
}

Result<std::shared_ptr<ImageStore>> ImageStore::open(StoreConfig cfg) {
  std::error_code ec;
  for (const char* sub : {"", "/layers", "/images", "/tmp"}) {
    fs::create_directories(cfg.dir + sub, ec);
    if (ec) return fail(Code::kInternal, "mkdir " + cfg.dir + sub + ": " + ec.message());
  }
  ::chmod(cfg.dir.c_str(), 0700);
  // What a crash mid-pull left.
  for (const auto& e : fs::directory_iterator(cfg.dir + "/tmp", ec)) fs::remove_all(e.path(), ec);
  auto store = std::shared_ptr<ImageStore>(new ImageStore(std::move(cfg)));
  if (std::size_t n = store->gc_layers(); n > 0) {
    spdlog::info("images: removed {} layer(s) no image uses", n);
  }
  return store;
}

Result<Image> ImageStore::read_record(const std::string& digest) const {
  const std::string path = cfg_.dir + "/images/" + hex_of(digest) + ".json";
  std::ifstream in(path);
  if (!in) return fail(Code::kNotFound, "no such image: " + digest);
  std::stringstream ss;
  ss << in.rdbuf();
  return decode_record(ss.str(), path);
}

Status ImageStore::write_record(const Image& img) {
  const std::string path = cfg_.dir + "/images/" + hex_of(img.digest) + ".json";
  const std::string tmp = path + ".tmp";
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd) return fail_errno(errno, "create(" + tmp + ")");
    const std::string s = encode_record(img).dump(2) + "\n";
    if (::write(fd.get(), s.data(), s.size()) != static_cast<ssize_t>(s.size()) ||
        ::fsync(fd.get()) != 0) {
      return fail_errno(errno, "write(" + tmp + ")");
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail_errno(errno, "rename(" + path + ")");
  return {};
}

std::vector<Image> ImageStore::list() const {
  std::lock_guard lk(records_mu_);
  std::vector<Image> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(cfg_.dir + "/images", ec)) {
    const std::string name = e.path().filename().string();
    if (!name.ends_with(".json") || name.size() != 64 + 5) continue;
    if (auto img = read_record("sha256:" + name.substr(0, 64))) out.push_back(std::move(*img));
  }
  std::sort(out.begin(), out.end(),
            [](const Image& a, const Image& b) { return a.pulled_at > b.pulled_at; });
  return out;
}

Result<Image> ImageStore::get(const std::string& ref_or_digest) const {
  if (is_digest(ref_or_digest)) {
    std::lock_guard lk(records_mu_);
    return read_record(ref_or_digest);
  }
  for (auto& img : list()) {
    if (std::find(img.refs.begin(), img.refs.end(), ref_or_digest) != img.refs.end()) return img;
  }
  return fail(Code::kNotFound, "no such image: " + ref_or_digest);
}

std::vector<std::string> ImageStore::layer_dirs(const Image& img) const {
  std::vector<std::string> out;
  for (const auto& l : img.layers) out.push_back(cfg_.dir + "/layers/" + hex_of(l.diff_id));
  return out;
}

Result<Image> ImageStore::pull(const std::string& ref, const ProgressFn& progress) {
  if (is_digest(ref)) {
    auto img = get(ref);
    if (img) return img;
    return fail(Code::kNotFound, "no such image: " + ref +
                                     " (a bare digest cannot be pulled; "
                                     "pull it by reference)");
  }
  auto host = AB_TRY(registry_host(ref));
  std::lock_guard lk(pull_mu_);

  std::string tmpl = cfg_.dir + "/tmp/pull-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return fail_errno(errno, "mkdtemp(" + tmpl + ")");
  const std::string tmp = tmpl;
  std::vector<std::string> added;  // layer dirs this pull made
  bool ok = false;
  struct Cleanup {
    const std::string& tmp;
    const std::vector<std::string>& added;
    const bool& ok;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      if (!ok) {
        for (const auto& d : added) fs::remove_all(d, ec);
      }
    }
  } cleanup{tmp, added, ok};

  const std::string oci = tmp + "/oci";
  // Only what is new is fetched: every layer blob the store has unpacked already (by the
  // records of its images: blob digest -> diff id, verified when it was pulled) is put in the
  // layout first as a sparse stand-in of its size, which skopeo reuses instead of fetching.
  const std::map<std::string, std::string> known = AB_TRY(stand_in_blobs(oci));
  AB_TRY(detail::skopeo_copy(cfg_, host, ref, oci, tmp));

  std::string platform;
  auto picked = AB_TRY(pick_manifest(oci, &platform));
  auto& [digest, manifest] = picked;
  if (!manifest.contains("config") || !manifest.contains("layers") ||
      !manifest["layers"].is_array()) {
    return fail(Code::kImage, "manifest " + digest + " is not an image manifest");
  }
  auto config = AB_TRY(read_json_blob(oci, str_at(manifest["config"], "digest")));

  Image img;
  img.ref = ref;
  img.digest = digest;
  img.platform = str_at(config, "os") + "/" + str_at(config, "architecture");
  if (config.contains("config") && config["config"].is_object()) {
    const json& c = config["config"];
    if (c.contains("Env") && c["Env"].is_array()) {
      for (const auto& e : c["Env"]) {
        if (e.is_string()) img.config.env.push_back(e.get<std::string>());
      }
    }
    img.config.workdir = str_at(c, "WorkingDir");
    img.config.user = str_at(c, "User");
  }
  std::vector<std::string> diff_ids;
  if (config.contains("rootfs") && config["rootfs"].contains("diff_ids")) {
    for (const auto& d : config["rootfs"]["diff_ids"]) {
      diff_ids.push_back(d.is_string() ? d.get<std::string>() : "");
    }
  }
  const json& layers = manifest["layers"];
  if (diff_ids.size() != layers.size()) {
    return fail(Code::kImage, "image " + digest + ": the config names " +
                                  std::to_string(diff_ids.size()) + " layers, the manifest " +
                                  std::to_string(layers.size()));
  }
  for (std::size_t i = 0; i < layers.size(); ++i) {
    LayerInfo l;
    l.digest = str_at(layers[i], "digest");
    l.media_type = str_at(layers[i], "mediaType");
    l.size = layers[i].value("size", std::uint64_t{0});
    l.diff_id = diff_ids[i];
    if (!is_digest(l.diff_id)) {
      return fail(Code::kImage, "image " + digest + ": diff id '" + l.diff_id + "' of layer " +
                                    l.digest + " is not a sha256 digest");
    }
    const std::string final_dir = cfg_.dir + "/layers/" + hex_of(l.diff_id);
    struct stat st;
    const bool have = ::stat(final_dir.c_str(), &st) == 0;
    if (auto k = known.find(l.digest); k != known.end() && k->second != l.diff_id) {
      // Not fetched (a stand-in): the blob is the one the store unpacked, whose diff id it knows.
      return fail(Code::kImage, "layer " + l.digest + " does not match its diff id " + l.diff_id +
                                    " (got " + k->second + ")");
    }
    if (!have) {
      auto blob = AB_TRY(open_blob(oci, l.digest));
      // The diff id is hashed on a thread of its own while the layer is unpacked into tmp (two
      // decompressions at once, not one after the other); nothing of it is kept unless it
      // matches (a failed pull removes tmp).
      auto for_diff = AB_TRY(open_blob(oci, l.digest));
      std::future<Result<std::string>> diff_job = std::async(
          std::launch::async, [fd = for_diff.get(), d = l.digest] { return layer_diff_id(fd, d); });
      std::string into = tmp + "/layer-" + std::to_string(i);
      if (::mkdir(into.c_str(), 0755) != 0) return fail_errno(errno, "mkdir(" + into + ")");
      if (::chown(into.c_str(), kLayerIdBase, kLayerIdBase) != 0) {
        return fail_errno(errno, "chown(" + into + ")");
      }
      UniqueFd into_fd(::open(into.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!into_fd) return fail_errno(errno, "open(" + into + ")");
      auto unpacked = unpack_layer(blob.get(), into_fd.get(), l.digest);
      auto diff = AB_TRY(diff_job.get());
      if (diff != l.diff_id) {
        return fail(Code::kImage, "layer " + l.digest + " does not match its diff id " + l.diff_id +
                                      " (got " + diff + ")");
      }
      AB_TRY(unpacked);
      if (::rename(into.c_str(), final_dir.c_str()) != 0) {
        return fail_errno(errno, "rename(" + final_dir + ")");
      }
      added.push_back(final_dir);
    }
    img.size += l.size;
    img.layers.push_back(std::move(l));
    if (progress)
      progress({img.layers.back().digest, img.layers.back().size, img.layers.back().size});
  }
  img.pulled_at = static_cast<std::int64_t>(std::time(nullptr));

  {
    std::lock_guard rl(records_mu_);
    // The ref now names this digest: another image loses it.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(cfg_.dir + "/images", ec)) {
      const std::string name = e.path().filename().string();
      if (!name.ends_with(".json") || name.size() != 64 + 5) continue;
      auto other = read_record("sha256:" + name.substr(0, 64));
      if (!other || other->digest == img.digest) continue;
      auto it = std::find(other->refs.begin(), other->refs.end(), ref);
      if (it == other->refs.end()) continue;
      other->refs.erase(it);
      if (other->ref == ref) other->ref = other->refs.empty() ? "" : other->refs.back();
      AB_TRY(write_record(*other));
    }
    if (auto old = read_record(img.digest)) img.refs = old->refs;
    if (std::find(img.refs.begin(), img.refs.end(), ref) == img.refs.end()) img.refs.push_back(ref);
    AB_TRY(write_record(img));
  }
  ok = true;
  spdlog::info("images: pulled {} as {} ({} layers, {} new)", ref, img.digest, img.layers.size(),
               added.size());
  return img;
}

Result<std::map<std::string, std::string>> ImageStore::stand_in_blobs(
    const std::string& oci) const {
  std::map<std::string, std::string> known;  // blob digest -> diff id
  std::map<std::string, std::uint64_t> sizes;
  for (const Image& img : list()) {
    for (const LayerInfo& l : img.layers) {
      if (!is_digest(l.digest) || !is_digest(l.diff_id) || known.contains(l.digest)) continue;
      struct stat st;
      if (::stat((cfg_.dir + "/layers/" + hex_of(l.diff_id)).c_str(), &st) != 0) continue;
      known[l.digest] = l.diff_id;
      sizes[l.digest] = l.size;
    }
  }
  if (known.empty()) return known;
  const std::string blobs = oci + "/blobs/sha256";
  std::error_code ec;
  fs::create_directories(blobs, ec);
  if (ec) return fail(Code::kInternal, "mkdir " + blobs + ": " + ec.message());
  for (const auto& [digest, size] : sizes) {
    const std::string path = blobs + "/" + hex_of(digest);
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd) return fail_errno(errno, "open(" + path + ")");
    if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
      return fail_errno(errno, "ftruncate(" + path + ")");
    }
  }
  return known;
}

Status ImageStore::remove(const std::string& digest) {
  if (!is_digest(digest)) {
    return fail(Code::kInvalid, "'" + digest + "' is not an image digest (sha256:<64 hex>)");
  }
  std::lock_guard lk(pull_mu_);
  {
    std::lock_guard rl(records_mu_);
    const std::string path = cfg_.dir + "/images/" + hex_of(digest) + ".json";
    if (::unlink(path.c_str()) != 0) {
      if (errno == ENOENT) return fail(Code::kNotFound, "no such image: " + digest);
      return fail_errno(errno, "unlink(" + path + ")");
    }
  }
  gc_layers_locked();
  return {};
}

std::size_t ImageStore::gc_layers() {
  std::lock_guard lk(pull_mu_);
  return gc_layers_locked();
}

std::size_t ImageStore::gc_layers_locked() {
  std::set<std::string> used;
  for (const auto& img : list()) {
    for (const auto& l : img.layers) used.insert(hex_of(l.diff_id));
  }
  std::size_t n = 0;
  std::error_code ec;
  std::vector<fs::path> drop;
  for (const auto& e : fs::directory_iterator(cfg_.dir + "/layers", ec)) {
    if (!used.contains(e.path().filename().string())) drop.push_back(e.path());
  }
  for (const auto& p : drop) {
    fs::remove_all(p, ec);
    if (!ec) ++n;
  }
  return n;
}

}  // namespace agentbox::image
