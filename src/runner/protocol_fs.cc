// The file metadata conventions of xbot's Go peers (PROTOCOLS.md part 1): os.FileMode bits and
// the mod-time strings of stat and dir replies, both ways.

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <string_view>

#include "runner/protocol.h"

namespace agentbox::runner::proto {

// ---- Go os.FileMode ----

std::uint32_t go_mode_from_st_mode(mode_t m) {
  std::uint32_t g = m & 0777;
  switch (m & S_IFMT) {
    case S_IFDIR: g |= gomode::kDir; break;
    case S_IFLNK: g |= gomode::kSymlink; break;
    case S_IFBLK: g |= gomode::kDevice; break;
    case S_IFCHR: g |= gomode::kDevice | gomode::kCharDevice; break;
    case S_IFIFO: g |= gomode::kNamedPipe; break;
    case S_IFSOCK: g |= gomode::kSocket; break;
    case S_IFREG: break;
    default: g |= gomode::kIrregular; break;
  }
  if (m & S_ISUID) g |= gomode::kSetuid;
  if (m & S_ISGID) g |= gomode::kSetgid;
  if (m & S_ISVTX) g |= gomode::kSticky;
  return g;
}

mode_t st_mode_from_go_mode(std::uint32_t g) {
  mode_t m = perm_from_go(g);
  if (g & gomode::kDir) {
    m |= S_IFDIR;
  } else if (g & gomode::kSymlink) {
    m |= S_IFLNK;
  } else if (g & gomode::kCharDevice) {
    m |= S_IFCHR;
  } else if (g & gomode::kDevice) {
    m |= S_IFBLK;
  } else if (g & gomode::kNamedPipe) {
    m |= S_IFIFO;
  } else if (g & gomode::kSocket) {
    m |= S_IFSOCK;
  } else {
    m |= S_IFREG;
  }
  return m;
}

mode_t perm_from_go(std::uint32_t g) {
  mode_t m = g & 0777;
  if (g & gomode::kSetuid) m |= S_ISUID;
  if (g & gomode::kSetgid) m |= S_ISGID;
  if (g & gomode::kSticky) m |= S_ISVTX;
  return m;
}

std::uint32_t go_perm_from_mode(mode_t m) {
  std::uint32_t g = m & 0777;
  if (m & S_ISUID) g |= gomode::kSetuid;
  if (m & S_ISGID) g |= gomode::kSetgid;
  if (m & S_ISVTX) g |= gomode::kSticky;
  return g;
}

// ---- times ----

std::string format_mod_time(std::int64_t unix_seconds) {
  time_t t = static_cast<time_t>(unix_seconds);
  struct tm tm {};
  localtime_r(&t, &tm);
  char buf[64];
  std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::string out(buf, n);
  long off = tm.tm_gmtoff;
  if (off == 0) return out + "Z";
  char sign = off < 0 ? '-' : '+';
  if (off < 0) off = -off;
  std::snprintf(buf, sizeof buf, "%c%02ld:%02ld", sign, off / 3600, (off / 60) % 60);
  return out + buf;
}

Result<std::int64_t> parse_mod_time(std::string_view s) {
  auto bad_time = [&] {
    return fail(Code::kInvalid, "mod_time \"" + std::string(s) + "\" is not RFC 3339");
  };
  auto digits = [&](std::size_t pos, std::size_t n, int& out) {
    if (pos + n > s.size()) return false;
    out = 0;
    for (std::size_t i = pos; i < pos + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return false;
      out = out * 10 + (s[i] - '0');
    }
    return true;
  };
  int Y, M, D, h, m, sec;
  if (!digits(0, 4, Y) || s.size() < 20 || s[4] != '-' || !digits(5, 2, M) || s[7] != '-' ||
      !digits(8, 2, D) || (s[10] != 'T' && s[10] != 't') || !digits(11, 2, h) || s[13] != ':' ||
      !digits(14, 2, m) || s[16] != ':' || !digits(17, 2, sec)) {
    return bad_time();
  }
  std::size_t i = 19;
  if (i < s.size() && s[i] == '.') {
    ++i;
    std::size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (i == start) return bad_time();
  }
  long off = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z') && i + 1 == s.size()) {
    off = 0;
  } else if (i < s.size() && (s[i] == '+' || s[i] == '-') && i + 6 == s.size() && s[i + 3] == ':') {
    int oh, om;
    if (!digits(i + 1, 2, oh) || !digits(i + 4, 2, om)) return bad_time();
    off = (oh * 3600L + om * 60L) * (s[i] == '-' ? -1 : 1);
  } else {
    return bad_time();
  }
  if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60) return bad_time();
  struct tm tm {};
  tm.tm_year = Y - 1900;
  tm.tm_mon = M - 1;
  tm.tm_mday = D;
  tm.tm_hour = h;
  tm.tm_min = m;
  tm.tm_sec = sec;
  return static_cast<std::int64_t>(timegm(&tm)) - off;
}

}  // namespace agentbox::runner::proto
