#include "common/error.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace agentbox {

std::string_view code_name(Code c) {
  switch (c) {
    case Code::kInvalid: return "EINVAL";
    case Code::kUnauthorized: return "EUNAUTHORIZED";
    case Code::kAccess: return "EACCES";
    case Code::kNotFound: return "ENOENT";
    case Code::kExists: return "EEXIST";
    case Code::kNotDir: return "ENOTDIR";
    case Code::kIsDir: return "EISDIR";
    case Code::kNotEmpty: return "ENOTEMPTY";
    case Code::kTooBig: return "ETOOBIG";
    case Code::kQuota: return "EQUOTA";
    case Code::kTimedOut: return "ETIMEDOUT";
    case Code::kUnavailable: return "EUNAVAILABLE";
    case Code::kInternal: return "EINTERNAL";
    case Code::kNotSupported: return "ENOTSUP";
    case Code::kImage: return "EIMAGE";
    case Code::kUpstream: return "EUNAVAILABLE";
  }
  return "EINTERNAL";
}

Code code_for_errno(int err) {
  switch (err) {
    case ENOENT: return Code::kNotFound;
    case EEXIST: return Code::kExists;
    case ENOTDIR: return Code::kNotDir;
    case EISDIR: return Code::kIsDir;
    case ENOTEMPTY: return Code::kNotEmpty;
    case EACCES:
    case EPERM:
    case EROFS:
    case EXDEV:   // openat2 RESOLVE_BENEATH / IN_ROOT refusing to cross
    case ELOOP:   // a symlink where none may be followed (O_NOFOLLOW, RESOLVE_NO_MAGICLINKS)
      return Code::kAccess;
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
      return Code::kQuota;
    case EFBIG:
    case ENAMETOOLONG:
      return Code::kTooBig;
    case EINVAL:
    case EBADF:
      return Code::kInvalid;
    case ETIMEDOUT: return Code::kTimedOut;
    default: return Code::kInternal;
  }
}

Error Error::from_errno(int err, std::string_view what) {
  std::string msg(what);
  msg += ": ";
  msg += strerrorname_np(err) ? strerrorname_np(err) : "errno";
  msg += " (";
  msg += std::strerror(err);
  msg += ")";
  return Error{code_for_errno(err), err, std::move(msg)};
}

void check_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "AB_CHECK failed: %s at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace agentbox
