// Archives through the API: DELETE /v1/sessions/{id}?archive=true writes the workspace as a
// tar.zst under data_dir/archives before deleting it, POST /v1/sessions/{id}/restore brings it
// back (files, modes, symlinks, content; with the ns backend the same uid owning them), and
// hostile or misplaced archives are refused with nothing left behind (SECURITY.md T5; the
// exhaustive hostile cases are tests/session/archive_test.cc).

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "integration/api_test_util.h"

namespace agentbox::testing {
namespace {

namespace fs = std::filesystem;

// Everything about a workspace a user would notice: type, mode, size, name, link target, and a
// hash of every file's content.
// (Directory sizes are left out: they depend on the file system's history, not the content.)
constexpr char kSnapshot[] =
    "find . -mindepth 1 -printf '%y %m %p -> %l\\n' | sort; "
    "find . -type f -printf '%s %p\\n' | sort; "
    "find . -type f -print0 | sort -z | xargs -0 -r sha256sum";

struct TarEntry {
  std::string name;
  mode_t type = AE_IFREG;
  std::string data;
  std::string symlink;
};

// A zstd pax tar at `path`, made by libarchive from `entries` exactly as given.
void make_archive(const std::string& path, const std::vector<TarEntry>& entries, bool zstd = true) {
  struct archive* a = archive_write_new();
  if (zstd) {
    ASSERT_EQ(archive_write_add_filter_zstd(a), ARCHIVE_OK);
  }
  ASSERT_EQ(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
  ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK);
  for (const TarEntry& t : entries) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, t.name.c_str());
    archive_entry_set_filetype(e, t.type);
    archive_entry_set_perm(e, 0644);
    if (!t.symlink.empty()) archive_entry_set_symlink(e, t.symlink.c_str());
    if (t.type == AE_IFREG) archive_entry_set_size(e, static_cast<la_int64_t>(t.data.size()));
    ASSERT_GE(archive_write_header(a, e), ARCHIVE_WARN) << archive_error_string(a);
    if (!t.data.empty()) {
      ASSERT_GE(archive_write_data(a, t.data.data(), t.data.size()), 0);
    }
    archive_entry_free(e);
  }
  ASSERT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
}

// Fills session `id` with a varied tree through the API and commands.
void populate(Api& api, const std::string& id) {
  ASSERT_EQ(api.put(files_target(id, "hello.txt"), "hello\n").status, 200);
  ASSERT_EQ(api.put(files_target(id, "bin/run.sh", "&mkdirs=true&mode=0755"), "#!/bin/sh\n").status,
            200);
  ASSERT_EQ(api.put(files_target(id, "private", "&mode=0600"), "secret").status, 200);
  ASSERT_EQ(api.post("/v1/sessions/" + id + "/mkdir", {{"path", "a/b/c"}}).status, 200);
  auto r = api.sh(id,
                  "set -e; : > empty; head -c 3000000 /dev/urandom > a/b/big.bin; "
                  "ln -s hello.txt link; ln -s /workspace/a/b abs-link; ln -s nowhere dangling; "
                  "chmod 0750 a; chmod 0640 hello.txt; mkdir -p 'with space/x'; "
                  "echo z > 'with space/x/z'");
  ASSERT_EQ(r.status, 200) << r;
  ASSERT_EQ(r.body["exit_code"], 0) << r;
}

class ArchiveApi : public ::testing::Test {
 protected:
  std::string archives() const { return daemon_.data_dir() + "/archives"; }
  std::string workspace(const std::string& id) const {
    return daemon_.data_dir() + "/workspaces/" + id;
  }
  // The archive dir as the daemon will find it (the test puts hostile archives there).
  void ensure_archives_dir() { fs::create_directories(archives()); }
  // Nothing of session `id` is left: no session, no workspace dir.
  void expect_no_session(const std::string& id) {
    EXPECT_EQ(api_.get("/v1/sessions/" + id).status, 404);
    EXPECT_FALSE(fs::exists(fs::symlink_status(workspace(id)))) << workspace(id);
    auto list = api_.get("/v1/sessions");
    for (const auto& s : list.body["sessions"]) EXPECT_NE(s["id"], id);
  }

  Daemon daemon_;
  Api api_{daemon_};
};

TEST_F(ArchiveApi, DeleteWithArchiveThenRestoreGivesBackTheSameWorkspace) {
  api_.create("proj");
  populate(api_, "proj");
  auto before = api_.sh("proj", kSnapshot);
  ASSERT_EQ(before.body["exit_code"], 0) << before;
  std::string snap = before.body["stdout"];
  ASSERT_NE(snap.find("big.bin"), std::string::npos) << snap;

  auto del = api_.del("/v1/sessions/proj?archive=true");
  ASSERT_EQ(del.status, 200) << del;
  EXPECT_EQ(del.body["id"], "proj");
  std::string path = del.body["archive"];
  EXPECT_EQ(path.rfind(archives() + "/proj-", 0), 0u) << path;
  EXPECT_EQ(path.substr(path.size() - 8), ".tar.zst") << path;
  EXPECT_TRUE(fs::is_regular_file(path));
  EXPECT_LT(fs::file_size(path), 3500000u);
  // The archive is written to a temp name and renamed: only finished archives are there.
  for (const auto& e : fs::directory_iterator(archives())) {
    EXPECT_EQ(e.path().string(), path);
  }
  expect_no_session("proj");

  auto restored = api_.post("/v1/sessions/proj/restore", {{"archive", path}});
  ASSERT_EQ(restored.status, 201) << restored;
  EXPECT_EQ(restored.body["id"], "proj");
  EXPECT_EQ(restored.body["state"], "running");
  auto after = api_.sh("proj", kSnapshot);
  EXPECT_EQ(after.body["stdout"], snap);
  EXPECT_EQ(api_.get(files_target("proj", "hello.txt")).raw, "hello\n");

  // The same archive into a second id, by a path relative to the archive dir.
  auto copy =
      api_.post("/v1/sessions/proj2/restore", {{"archive", fs::path(path).filename().string()}});
  ASSERT_EQ(copy.status, 201) << copy;
  EXPECT_EQ(api_.sh("proj2", kSnapshot).body["stdout"], snap);

  // Restoring over an existing session: 409, the session untouched.
  ASSERT_EQ(api_.put(files_target("proj", "new.txt"), "new").status, 200);
  auto again = api_.post("/v1/sessions/proj/restore", {{"archive", path}});
  EXPECT_EQ(again.status, 409) << again;
  EXPECT_EQ(again.code(), "EEXIST");
  EXPECT_EQ(api_.get(files_target("proj", "new.txt")).raw, "new");
}

TEST_F(ArchiveApi, AFailedArchiveKeepsTheSessionAndItsWorkspace) {
  // Deeper than an archive may be (kMaxArchiveDepth 256): archiving fails, so nothing may be
  // deleted and no partial archive may be left.
  api_.create("deep");
  auto mk = api_.sh("deep", "p=.; for i in $(seq 300); do p=$p/d; done; mkdir -p $p && "
                            "echo bottom > $p/f && echo top > top.txt");
  ASSERT_EQ(mk.body["exit_code"], 0) << mk;
  auto del = api_.del("/v1/sessions/deep?archive=true");
  EXPECT_EQ(del.status, 413) << del;
  EXPECT_EQ(del.code(), "ETOOBIG");
  EXPECT_NE(del.message().find("deep"), std::string::npos) << del;
  EXPECT_TRUE(fs::is_directory(workspace("deep")));
  EXPECT_TRUE(!fs::exists(archives()) || fs::is_empty(archives()));
  auto got = api_.get("/v1/sessions/deep");
  ASSERT_EQ(got.status, 200) << got;
  EXPECT_EQ(api_.get(files_target("deep", "top.txt")).raw, "top\n");
  // A plain delete still works.
  EXPECT_EQ(api_.del("/v1/sessions/deep").status, 200);
  EXPECT_FALSE(fs::exists(workspace("deep")));
}

TEST_F(ArchiveApi, ArchiveOfAMissingSessionIs404AndWritesNothing) {
  auto r = api_.del("/v1/sessions/ghost?archive=true");
  EXPECT_EQ(r.status, 404) << r;
  EXPECT_EQ(r.code(), "ENOENT");
  EXPECT_TRUE(!fs::exists(archives()) || fs::is_empty(archives()));
  auto bad = api_.del("/v1/sessions/ghost?archive=maybe");
  EXPECT_EQ(bad.status, 400) << bad;
}

TEST_F(ArchiveApi, ArchivesOutsideTheArchiveDirAre403) {
  ensure_archives_dir();
  // A real, valid archive placed outside: refused for where it is, not for what it is.
  std::string outside = daemon_.temp_dir() + "/outside.tar.zst";
  make_archive(outside, {{.name = "f", .data = "x"}});
  for (const std::string& p :
       {outside, std::string("/etc/passwd"), archives() + "/../../outside.tar.zst",
        std::string("../outside.tar.zst"), std::string("../../../../../etc/x.tar.zst")}) {
    SCOPED_TRACE(p);
    auto r = api_.post("/v1/sessions/r1/restore", {{"archive", p}});
    EXPECT_EQ(r.status, 403) << r;
    EXPECT_EQ(r.code(), "EACCES");
    expect_no_session("r1");
  }
  // A symlink inside the archive dir pointing at it is not followed.
  fs::create_symlink(outside, archives() + "/link.tar.zst");
  auto link = api_.post("/v1/sessions/r1/restore", {{"archive", archives() + "/link.tar.zst"}});
  EXPECT_EQ(link.status, 403) << link;
  expect_no_session("r1");
}

TEST_F(ArchiveApi, WhatIsNotATarZstIs400NamingIt) {
  ensure_archives_dir();
  make_archive(archives() + "/plain.tar", {{.name = "f", .data = "x"}}, /*zstd=*/false);
  make_archive(archives() + "/plain-named.tar.zst", {{.name = "f", .data = "x"}},
               /*zstd=*/false);
  std::ofstream(archives() + "/junk.tar.zst") << "not an archive";
  for (const std::string name :
       {"plain.tar", "plain-named.tar.zst", "junk.tar.zst", "missing.tar.zst"}) {
    SCOPED_TRACE(name);
    auto r = api_.post("/v1/sessions/r2/restore", {{"archive", archives() + "/" + name}});
    EXPECT_EQ(r.status, 400) << r;
    EXPECT_EQ(r.code(), "EINVAL");
    EXPECT_NE(r.message().find(name), std::string::npos) << r;
    expect_no_session("r2");
  }
  auto wrong_type = api_.post("/v1/sessions/r2/restore", {{"archive", 42}});
  EXPECT_EQ(wrong_type.status, 400) << wrong_type;
}

TEST_F(ArchiveApi, HostileArchivesAreRefusedAndLeaveNothingBehind) {
  ensure_archives_dir();
  const std::string canary_dir = daemon_.temp_dir() + "/canary";
  fs::create_directories(canary_dir);
  struct Case {
    std::string name;
    std::vector<TarEntry> entries;
    int status;
  };
  const std::vector<Case> cases = {
      {"dotdot", {{.name = "ok.txt", .data = "fine"}, {.name = "../../x", .data = "pwned"}}, 403},
      {"absolute", {{.name = canary_dir + "/abs", .data = "pwned"}}, 403},
      {"through-symlink",
       {{.name = "d", .type = AE_IFLNK, .symlink = canary_dir}, {.name = "d/x", .data = "pwned"}},
       403},
      {"root-symlink",
       {{.name = "d", .type = AE_IFLNK, .symlink = "/"},
        {.name = "d/etc/agentbox-pwned", .data = "pwned"}},
       403},
      {"fifo", {{.name = "ok.txt", .data = "fine"}, {.name = "p", .type = AE_IFIFO}}, 403},
      {"chardev", {{.name = "null", .type = AE_IFCHR}}, 403},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = archives() + "/" + c.name + ".tar.zst";
    make_archive(path, c.entries);
    auto r = api_.post("/v1/sessions/victim/restore", {{"archive", path}});
    EXPECT_EQ(r.status, c.status) << r;
    expect_no_session("victim");
    EXPECT_TRUE(fs::is_empty(canary_dir));
    EXPECT_FALSE(fs::exists("/etc/agentbox-pwned"));
    EXPECT_FALSE(fs::exists(daemon_.data_dir() + "/x"));
  }
  // The daemon is fine and the id is free for a good archive.
  make_archive(archives() + "/good.tar.zst", {{.name = "ok.txt", .data = "fine"}});
  auto good = api_.post("/v1/sessions/victim/restore", {{"archive", "good.tar.zst"}});
  ASSERT_EQ(good.status, 201) << good;
  EXPECT_EQ(api_.get(files_target("victim", "ok.txt")).raw, "fine");
}

// With isolation the restored files belong to the session's uid again (the same id gets the
// same uid), whatever uid the archive recorded.
TEST(ArchiveApiNs, RestoredWorkspaceBelongsToTheSessionUid) {
  Daemon daemon({"--backend", "ns"});
  Api api(daemon);
  auto created = api.post("/v1/sessions", {{"id", "owned"}});
  ASSERT_EQ(created.status, 201) << created;
  ASSERT_TRUE(created.body["uid"].is_number()) << created;
  const int uid = created.body["uid"];
  auto r = api.sh("owned", "mkdir -p d && echo hi > d/f && ln -s d/f l && id -u");
  ASSERT_EQ(r.body["exit_code"], 0) << r;
  EXPECT_EQ(r.body["stdout"], std::to_string(uid) + "\n");
  auto before = api.sh("owned", kSnapshot).body["stdout"];

  auto del = api.del("/v1/sessions/owned?archive=true");
  ASSERT_EQ(del.status, 200) << del;
  auto restored = api.post("/v1/sessions/owned/restore", {{"archive", del.body["archive"]}});
  ASSERT_EQ(restored.status, 201) << restored;
  EXPECT_EQ(restored.body["uid"], uid);
  EXPECT_EQ(api.sh("owned", kSnapshot).body["stdout"], before);
  auto owners =
      api.sh("owned", "stat -c '%u %g' . d d/f; find . -mindepth 1 ! -user " + std::to_string(uid));
  ASSERT_EQ(owners.body["exit_code"], 0) << owners;
  std::string u = std::to_string(uid);
  EXPECT_EQ(owners.body["stdout"], u + " " + u + "\n" + u + " " + u + "\n" + u + " " + u + "\n");
  // On the host too: the workspace tree is the session uid's.
  struct stat st;
  std::string ws = daemon.data_dir() + "/workspaces/owned";
  ASSERT_EQ(::lstat((ws + "/l").c_str(), &st), 0);
  EXPECT_EQ(static_cast<int>(st.st_uid), uid);
  // And it can write there.
  EXPECT_EQ(api.sh("owned", "echo more >> d/f && cat d/f").body["stdout"], "hi\nmore\n");
}

}  // namespace
}  // namespace agentbox::testing
