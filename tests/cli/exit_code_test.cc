// How the CLI turns an error into its exit code (src/cli/util.cc): the same cause gives the
// same code in every command, whether the error came from the server (wire code, HTTP status)
// or from the client itself (connect refused, a local file).

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "cli/cli.h"

namespace agentbox::cli {
namespace {

TEST(CliExitCode, EachWireCodeHasItsClass) {
  EXPECT_EQ(exit_code_for("ENOENT", 404), kExitNotFound);
  EXPECT_EQ(exit_code_for("EUNAUTHORIZED", 401), kExitAuth);
  EXPECT_EQ(exit_code_for("EUNAVAILABLE", 503), kExitUnreachable);
  EXPECT_EQ(exit_code_for("ETIMEDOUT", 504), kExitUnreachable);
  EXPECT_EQ(exit_code_for("EQUOTA", 429), kExitQuota);
  EXPECT_EQ(exit_code_for("ETOOBIG", 413), kExitQuota);
  for (const char* c : {"EEXIST", "ENOTEMPTY", "ENOTDIR", "EISDIR"}) {
    EXPECT_EQ(exit_code_for(c, 409), kExitConflict) << c;
  }
  EXPECT_EQ(exit_code_for("EACCES", 403), kExitDenied);
  EXPECT_EQ(exit_code_for("ENOTSUP", 501), kExitNotSupported);
  EXPECT_EQ(exit_code_for("EINTERNAL", 500), kExitServerError);
  EXPECT_EQ(exit_code_for("EINVAL", 400), kExitError);
}

TEST(CliExitCode, NotBuiltIsNotSupportedWhateverTheCode) {
  // Today's server answers an unbuilt route 422 EINVAL; the contract says 501 ENOTSUP.
  EXPECT_EQ(exit_code_for("EINVAL", 422, "repair: not implemented in this version"),
            kExitNotSupported);
  EXPECT_EQ(exit_code_for("", 501), kExitNotSupported);
  EXPECT_EQ(exit_code_for("ENOTSUP", 400), kExitNotSupported);
  // A route the server does not have (older than the CLI) is not a missing session.
  EXPECT_EQ(exit_code_for("ENOENT", 404, "no such route: POST /v1/sessions/s/mounts"),
            kExitNotSupported);
  EXPECT_EQ(exit_code_for("ENOENT", 404, "no such session: s"), kExitNotFound);
}

TEST(CliExitCode, UnknownCodesFallBackToTheStatus) {
  EXPECT_EQ(exit_code_for("", 401), kExitAuth);
  EXPECT_EQ(exit_code_for("EWHATEVER", 403), kExitDenied);
  EXPECT_EQ(exit_code_for("", 404), kExitNotFound);
  EXPECT_EQ(exit_code_for("", 409), kExitConflict);
  EXPECT_EQ(exit_code_for("", 413), kExitQuota);
  EXPECT_EQ(exit_code_for("", 429), kExitQuota);
  EXPECT_EQ(exit_code_for("", 502), kExitUnreachable);  // a proxy in front, daemon down
  EXPECT_EQ(exit_code_for("", 503), kExitUnreachable);
  EXPECT_EQ(exit_code_for("", 500), kExitServerError);
  EXPECT_EQ(exit_code_for("", 507), kExitServerError);
  EXPECT_EQ(exit_code_for("", 400), kExitError);
  EXPECT_EQ(exit_code_for("", 418), kExitError);
}

TEST(CliExitCode, ClientErrorsMatchTheServersClasses) {
  // The same classes for errors the CLI meets itself: connect refused / no reply, a local
  // file that is missing or unreadable.
  EXPECT_EQ(exit_code_for(Code::kUnavailable), kExitUnreachable);
  EXPECT_EQ(exit_code_for(Code::kTimedOut), kExitUnreachable);
  EXPECT_EQ(exit_code_for(Code::kNotFound), kExitNotFound);
  EXPECT_EQ(exit_code_for(Code::kAccess), kExitDenied);
  EXPECT_EQ(exit_code_for(Code::kUnauthorized), kExitAuth);
  EXPECT_EQ(exit_code_for(Code::kTooBig), kExitQuota);
  EXPECT_EQ(exit_code_for(Code::kQuota), kExitQuota);
  EXPECT_EQ(exit_code_for(Code::kIsDir), kExitConflict);
  EXPECT_EQ(exit_code_for(Code::kInternal), kExitServerError);
  EXPECT_EQ(exit_code_for(Code::kInvalid), kExitError);
  // And a wire code means the same as the Code it names.
  EXPECT_EQ(exit_code_for(std::string(code_name(Code::kNotEmpty)), 409),
            exit_code_for(Code::kNotEmpty));
}

TEST(CliExitCode, ClassesAreDistinctAndOutOfTheShellsRange) {
  std::set<int> codes = {kExitOk,      kExitError,        kExitUsage,       kExitNotFound,
                         kExitAuth,    kExitUnreachable,  kExitQuota,       kExitConflict,
                         kExitDenied,  kExitNotSupported, kExitServerError, kExitUnhealthy,
                         kExitTimedOut};
  EXPECT_EQ(codes.size(), 13u);
  // 126/127 (cannot run / not found) and 128+N belong to the shell and to exec's command.
  for (int c : codes) {
    if (c != kExitTimedOut) {
      EXPECT_LT(c, 124) << c;
    }
  }
  // Matches what the user is told: every code is in --help.
  std::string help = kExitCodesHelp;
  for (int c : codes) {
    if (c == kExitTimedOut) continue;
    EXPECT_NE(help.find("\n  " + std::to_string(c) + " "), std::string::npos) << c;
  }
  EXPECT_NE(help.find("124"), std::string::npos);
}

}  // namespace
}  // namespace agentbox::cli
