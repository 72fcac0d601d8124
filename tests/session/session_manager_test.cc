// SessionManager against a tiny in-test backend: the unit under test is the manager (ids, uids,
// workspaces, BoxConfig, life cycle, concurrency), not a real box.

#include "session/session_manager.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "sandbox/default_limits.h"
#include "support/fake_backend.h"

namespace agentbox::session {
namespace {

namespace fs = std::filesystem;

const Caller kDaemon = Caller::daemon();

using testing::FakeBackend;
using testing::FakeSandbox;

class SessionManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/session_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    data_ = root_ + "/data";
    fs::create_directories(data_);
    fs::create_directories(root_ + "/skills/web");
    fs::create_directories(root_ + "/shared/tpl");
    fs::create_directories(root_ + "/elsewhere");
    ns_ = std::make_shared<FakeBackend>("ns");
    host_ = std::make_shared<FakeBackend>("host");
  }
  void TearDown() override {
    mgr_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  ManagerConfig config() {
    ManagerConfig c;
    c.data_dir = data_;
    c.default_backend = "ns";
    c.backends = {{"ns", ns_}, {"host", host_}};
    c.shared_dirs = {{root_ + "/shared/tpl", "site-templates", false}};
    c.allowed_mount_roots = {root_ + "/skills"};
    c.reaper_interval = std::chrono::hours(1);  // tests call reap_idle() themselves
    if (tweak_) tweak_(c);
    return c;
  }
  // A daemon restart: the manager goes (its boxes shut down), a new one opens the same data dir.
  void restart() {
    mgr_.reset();
    (void)mgr();
  }
  SessionManager& mgr() {
    if (!mgr_) {
      auto m = SessionManager::open(config());
      EXPECT_TRUE(m) << m.error().message;
      mgr_ = std::move(*m);
    }
    return *mgr_;
  }
  std::string workspace(const std::string& id) { return data_ + "/workspaces/" + id; }

  std::string root_, data_;
  std::function<void(ManagerConfig&)> tweak_;
  std::shared_ptr<FakeBackend> ns_, host_;
  std::unique_ptr<SessionManager> mgr_;
};

TEST_F(SessionManagerTest, CreateThenGetIsIdempotent) {
  SessionSpec spec;
  spec.labels = {{"team", "a"}};
  auto r = mgr().create_or_get("group_123", spec, kDaemon);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->second);
  EXPECT_EQ(r->first.id, "group_123");
  EXPECT_EQ(r->first.state, State::kRunning);
  EXPECT_EQ(r->first.backend, "ns");
  EXPECT_EQ(r->first.workspace, "/workspace");
  EXPECT_EQ(r->first.spec.labels.at("team"), "a");
  ASSERT_TRUE(r->first.uid.has_value());
  EXPECT_EQ(*r->first.uid, first_uid_probe("group_123"));

  // Same id again: the existing session, no new box; labels are the one field that follows a
  // re-create (RecreateWithADifferentSpecIsEexistNamingTheField has the rest).
  SessionSpec other;
  other.labels = {{"team", "b"}};
  auto again = mgr().create_or_get("group_123", other, kDaemon);
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->second);
  EXPECT_EQ(again->first.spec.labels.at("team"), "b");
  EXPECT_EQ(again->first.created_at, r->first.created_at);
  EXPECT_EQ(ns_->creates_, 1);

  auto got = mgr().get("group_123", kDaemon);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->uid, r->first.uid);
}

TEST_F(SessionManagerTest, WorkspaceIsPrivateAndOwnedByTheSessionUid) {
  auto r = mgr().create_or_get("s1", {}, kDaemon);
  ASSERT_TRUE(r) << r.error().message;
  struct stat st {};
  ASSERT_EQ(::lstat(workspace("s1").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, *r->first.uid);
  EXPECT_EQ(st.st_gid, *r->first.uid);
  ASSERT_EQ(::lstat((data_ + "/workspaces").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
}

TEST_F(SessionManagerTest, HostBackendKeepsTheDaemonAsOwner) {
  SessionSpec spec;
  spec.backend = "host";
  auto r = mgr().create_or_get("h1", spec, kDaemon);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->first.backend, "host");
  EXPECT_FALSE(r->first.uid.has_value());  // commands run as the daemon's user
  struct stat st {};
  ASSERT_EQ(::lstat(workspace("h1").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(host_->creates_, 1);
  EXPECT_EQ(ns_->creates_, 0);
}

TEST_F(SessionManagerTest, BoxConfigCarriesSpecSharedDirsAndSkills) {
  SessionSpec spec;
  spec.limits.memory_mb = 512;
  spec.limits.max_pids = 64;
  spec.env = {{"FOO", "bar"}};
  spec.skills = {{"web", root_ + "/skills/web"}};
  spec.mounts = {{root_ + "/skills", "/data/skills", "rw"},
                 {root_ + "/skills/web", "/ignored", "none"}};
  auto r = mgr().create_or_get("cfg", spec, kDaemon);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(ns_->configs_.size(), 1u);
  const sandbox::BoxConfig& c = ns_->configs_[0];
  EXPECT_EQ(c.key, "cfg");
  EXPECT_EQ(c.workspace_dir, workspace("cfg"));
  EXPECT_EQ(c.limits.memory_mb, 512u);
  EXPECT_EQ(c.limits.max_pids, 64u);
  EXPECT_EQ(c.env.at("FOO"), "bar");
  EXPECT_EQ(c.uid, first_uid_probe("cfg"));
  EXPECT_EQ(c.gid, c.uid);

  auto find = [&](const std::string& box_path) -> const sandbox::BindMount* {
    for (const auto& m : c.mounts)
      if (m.box_path == box_path) return &m;
    return nullptr;
  };
  const auto* shared = find("/shared/site-templates");
  ASSERT_NE(shared, nullptr);
  EXPECT_TRUE(shared->read_only);  // even though the config said otherwise
  EXPECT_EQ(shared->host_path, root_ + "/shared/tpl");
  const auto* skill = find("/workspace/.skills/web");
  ASSERT_NE(skill, nullptr);
  EXPECT_FALSE(skill->read_only);  // seed 002: skills are rw unless asked ro
  EXPECT_EQ(skill->what, "skills.web");
  EXPECT_EQ(skill->host_path, fs::canonical(root_ + "/skills/web").string());
  const auto* extra = find("/data/skills");
  ASSERT_NE(extra, nullptr);
  EXPECT_FALSE(extra->read_only);
  EXPECT_EQ(find("/ignored"), nullptr);  // mode "none" is not mounted
  EXPECT_EQ(c.mounts.size(), 3u);
}

TEST_F(SessionManagerTest, MountsOutsideTheAllowedRootsAreRefused) {
  // A symlink under the allowed root that points out of it does not pass either.
  fs::create_directory_symlink(root_ + "/elsewhere", root_ + "/skills/link");
  for (std::string host : {root_ + "/elsewhere", root_ + "/skills/link",
                           root_ + "/skills/../elsewhere", std::string("/")}) {
    SessionSpec spec;
    spec.mounts = {{host, "/mnt/x", "ro"}};
    auto r = mgr().create_or_get("m1", spec, kDaemon);
    ASSERT_FALSE(r) << host;
    EXPECT_EQ(r.error().code, Code::kAccess) << r.error().message;
    EXPECT_NE(r.error().message.find("mounts[0]"), std::string::npos) << r.error().message;
  }
  SessionSpec spec;
  spec.skills = {{"evil", "/etc"}};
  auto r = mgr().create_or_get("m1", spec, kDaemon);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kAccess);
  // Nothing was left behind by the failed creations.
  EXPECT_TRUE(mgr().list(kDaemon).empty());
  EXPECT_FALSE(fs::exists(workspace("m1")));
  EXPECT_EQ(ns_->creates_, 0);
}

// API.md "Sessions": a missing host dir is 404 ENOENT, naming the field.
TEST_F(SessionManagerTest, MissingMountSourceIsNotFoundNamingTheField) {
  SessionSpec spec;
  spec.skills = {{"web", root_ + "/skills/not-there"}};
  auto r = mgr().create_or_get("m2", spec, kDaemon);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kNotFound) << r.error().message;
  EXPECT_NE(r.error().message.find("skills.web"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("not-there"), std::string::npos) << r.error().message;
}

TEST_F(SessionManagerTest, InvalidSpecsNameTheField) {
  struct Case {
    SessionSpec spec;
    std::string field;
  };
  std::vector<Case> cases(5);
  cases[0].spec.network.mode = "bogus";
  cases[0].field = "network.mode";
  cases[1].spec.mounts = {{root_ + "/skills", "/mnt", "rwx"}};
  cases[1].field = "mounts[0].mode";
  cases[2].spec.mounts = {{root_ + "/skills", "relative/path", "ro"}};
  cases[2].field = "mounts[0].mount_path";
  cases[3].spec.skills = {{"../up", root_ + "/skills/web"}};
  cases[3].field = "skill";
  cases[4].spec.backend = "docker";
  cases[4].field = "docker";
  for (const auto& c : cases) {
    auto r = mgr().create_or_get("bad", c.spec, kDaemon);
    ASSERT_FALSE(r) << c.field;
    EXPECT_EQ(r.error().code, Code::kInvalid);
    EXPECT_NE(r.error().message.find(c.field), std::string::npos) << r.error().message;
  }
  auto r = mgr().create_or_get("../x", {}, kDaemon);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalid);
  EXPECT_FALSE(mgr().get("a/b", kDaemon));
  EXPECT_EQ(mgr().get("a/b", kDaemon).error().code, Code::kInvalid);
  EXPECT_TRUE(mgr().list(kDaemon).empty());
}

TEST_F(SessionManagerTest, BackendFailureIsReturnedAndLeavesNothing) {
  ns_->down_ = true;
  auto r = mgr().create_or_get("down", {}, kDaemon);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kUnavailable);
  EXPECT_FALSE(mgr().get("down", kDaemon));
  EXPECT_EQ(mgr().get("down", kDaemon).error().code, Code::kNotFound);
  EXPECT_FALSE(fs::exists(workspace("down")));
  // The uid was given back: the retry gets the first probe again.
  ns_->down_ = false;
  auto ok = mgr().create_or_get("down", {}, kDaemon);
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(*ok->first.uid, first_uid_probe("down"));
}

TEST_F(SessionManagerTest, ExistingWorkspaceIsReusedNotWiped) {
  fs::create_directories(workspace("keep"));
  std::ofstream(workspace("keep") + "/old.txt") << "kept";
  ASSERT_TRUE(mgr().create_or_get("keep", {}, kDaemon));
  EXPECT_TRUE(fs::exists(workspace("keep") + "/old.txt"));
  // And a backend failure does not delete a workspace that was there before.
  ASSERT_TRUE(mgr().destroy("keep", kDaemon));
  fs::create_directories(workspace("keep2"));
  std::ofstream(workspace("keep2") + "/old.txt") << "kept";
  ns_->down_ = true;
  EXPECT_FALSE(mgr().create_or_get("keep2", {}, kDaemon));
  EXPECT_TRUE(fs::exists(workspace("keep2") + "/old.txt"));
}

TEST_F(SessionManagerTest, WorkspaceSymlinkIsRefused) {
  // Someone planted data_dir/workspaces/<id> as a link to a host dir: never used as workspace.
  ASSERT_TRUE(mgr().list(kDaemon).empty());  // opens the manager, creating data_dir/workspaces
  fs::create_directory_symlink(root_ + "/elsewhere", workspace("planted"));
  auto r = mgr().create_or_get("planted", {}, kDaemon);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kAccess) << r.error().message;
  EXPECT_EQ(ns_->creates_, 0);
}

// Ids whose first uid probe is the same, found by search (FNV is deterministic).
std::vector<std::string> colliding_ids(uid_t probe, std::size_t n) {
  std::vector<std::string> out;
  for (int i = 0; out.size() < n; ++i) {
    std::string id = "c" + std::to_string(i);
    if (first_uid_probe(id) == probe) out.push_back(id);
  }
  return out;
}

TEST_F(SessionManagerTest, UidCollisionsProbeOnwardAndWrap) {
  auto ids = colliding_ids(69999, 3);
  auto a = mgr().create_or_get(ids[0], {}, kDaemon);
  auto b = mgr().create_or_get(ids[1], {}, kDaemon);
  auto c = mgr().create_or_get(ids[2], {}, kDaemon);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a->first.uid, 69999u);
  EXPECT_EQ(*b->first.uid, 10000u);  // wrapped within [10000, 70000)
  EXPECT_EQ(*c->first.uid, 10001u);

  // The uid stays taken while its session lives, and is free again after destroy.
  ASSERT_TRUE(mgr().destroy(ids[0], kDaemon));
  auto again = mgr().create_or_get(ids[0], {}, kDaemon);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again->first.uid, 69999u);
}

// Seed 001: a workspace the toolbox-server made is owned by the uid it gave the agent; the new
// session takes that uid when it is in the range and free, else the usual probe.
TEST_F(SessionManagerTest, AnExistingWorkspacesOwnerUidIsAdoptedWhenFree) {
  ASSERT_TRUE(mgr().list(kDaemon).empty());  // makes data_dir/workspaces
  fs::create_directories(workspace("old"));
  ASSERT_EQ(::chown(workspace("old").c_str(), 23456, 23456), 0);
  auto a = mgr().create_or_get("old", {}, kDaemon);
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ(*a->first.uid, 23456u);

  // Taken by "old" now: a second such workspace gets its own probe, never a shared uid.
  fs::create_directories(workspace("twin"));
  ASSERT_EQ(::chown(workspace("twin").c_str(), 23456, 23456), 0);
  auto b = mgr().create_or_get("twin", {}, kDaemon);
  ASSERT_TRUE(b);
  EXPECT_EQ(*b->first.uid, first_uid_probe("twin"));

  // Out of the range (root, a system uid): the probe.
  fs::create_directories(workspace("rootowned"));
  auto c = mgr().create_or_get("rootowned", {}, kDaemon);
  ASSERT_TRUE(c);
  EXPECT_EQ(*c->first.uid, first_uid_probe("rootowned"));

  // Kept across a restart like any uid.
  restart();
  auto again = mgr().get("old", kDaemon);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again->uid, 23456u);
}

TEST_F(SessionManagerTest, EffectiveLimitsDeriveTmpAndRefuseATmpOverHalfTheMemory) {
  tweak_ = [](ManagerConfig& c) { c.default_limits = sandbox::builtin_default_limits(); };
  auto a = mgr().create_or_get("lim", {}, kDaemon);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->first.spec.limits.tmp_mb, 128u);  // min(512 / 4, 512)
  EXPECT_FALSE(a->first.spec.limits.cpu_time_sec.has_value());
  {
    std::lock_guard lk(ns_->mu_);
    ASSERT_FALSE(ns_->configs_.empty());
    EXPECT_EQ(ns_->configs_.back().limits.tmp_mb, 128u);  // what the box is made with
  }

  SessionSpec big;
  big.limits.memory_mb = 8192;
  auto b = mgr().create_or_get("big", big, kDaemon);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->first.spec.limits.tmp_mb, 512u);  // capped

  SessionSpec over;
  over.limits.memory_mb = 100;
  over.limits.tmp_mb = 51;
  auto o = mgr().create_or_get("over", over, kDaemon);
  ASSERT_FALSE(o);
  EXPECT_EQ(o.error().code, Code::kInvalid);
  EXPECT_NE(o.error().message.find("'limits.tmp_mb'"), std::string::npos) << o.error().message;
  EXPECT_FALSE(mgr().get("over", kDaemon));
  over.limits.tmp_mb = 50;
  EXPECT_TRUE(mgr().create_or_get("over", over, kDaemon));
}

TEST_F(SessionManagerTest, NoTwoSessionsShareAUid) {
  std::set<uid_t> seen;
  for (int i = 0; i < 300; ++i) {
    auto r = mgr().create_or_get("u" + std::to_string(i), {}, kDaemon);
    ASSERT_TRUE(r);
    EXPECT_TRUE(seen.insert(*r->first.uid).second) << "uid reused: " << *r->first.uid;
  }
}

TEST_F(SessionManagerTest, AcquireRunningSessionMarksItUsed) {
  auto missing = mgr().acquire("nope", false, kDaemon);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Code::kNotFound);
  EXPECT_NE(missing.error().message.find("nope"), std::string::npos);
  EXPECT_FALSE(mgr().get("nope", kDaemon));

  auto created = mgr().create_or_get("a1", {}, kDaemon);
  ASSERT_TRUE(created);
  auto before = created->first.last_used_at;
  auto box1 = mgr().acquire("a1", false, kDaemon);
  auto box2 = mgr().acquire("a1", true, kDaemon);
  ASSERT_TRUE(box1 && box2);
  EXPECT_EQ(box1->get(), box2->get());
  EXPECT_EQ(ns_->creates_, 1);
  EXPECT_GE(mgr().get("a1", kDaemon)->last_used_at, before);
}

TEST_F(SessionManagerTest, AcquireCreatesWithDefaultsWhenAsked) {
  auto box = mgr().acquire("exec-made", true, kDaemon);
  ASSERT_TRUE(box) << box.error().message;
  auto info = mgr().get("exec-made", kDaemon);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->backend, "ns");
  EXPECT_EQ(info->state, State::kRunning);
  EXPECT_TRUE(fs::is_directory(workspace("exec-made")));
}

TEST_F(SessionManagerTest, DestroyShutsTheBoxAndRemovesTheWorkspaceSafely) {
  auto box = mgr().acquire("d1", true, kDaemon);
  ASSERT_TRUE(box);
  std::shared_ptr<sandbox::Sandbox> held = *box;  // an exec in flight holds the sandbox
  // A workspace with content and a symlink that points at a host dir: the link is removed, the
  // host dir is not followed.
  std::ofstream(root_ + "/elsewhere/precious") << "x";
  fs::create_directories(workspace("d1") + "/a/b");
  std::ofstream(workspace("d1") + "/a/b/f") << "y";
  fs::create_directory_symlink(root_ + "/elsewhere", workspace("d1") + "/link");

  ASSERT_TRUE(mgr().destroy("d1", kDaemon));
  EXPECT_TRUE(static_cast<FakeSandbox*>(held.get())->shut_down());
  EXPECT_FALSE(fs::exists(fs::symlink_status(workspace("d1"))));
  EXPECT_TRUE(fs::exists(root_ + "/elsewhere/precious"));
  EXPECT_FALSE(mgr().get("d1", kDaemon));
  EXPECT_TRUE(mgr().list(kDaemon).empty());
  held->name();  // still a live object for whoever holds it

  auto again = mgr().destroy("d1", kDaemon);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, Code::kNotFound);
}

TEST_F(SessionManagerTest, ListIsSortedAndCountsByState) {
  for (const char* id : {"zeta", "alpha", "mid"}) ASSERT_TRUE(mgr().create_or_get(id, {}, kDaemon));
  auto l = mgr().list(kDaemon);
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0].id, "alpha");
  EXPECT_EQ(l[1].id, "mid");
  EXPECT_EQ(l[2].id, "zeta");
  auto counts = mgr().count_by_state();
  EXPECT_EQ(counts["running"], 3u);
  EXPECT_EQ(counts["suspended"], 0u);
}

TEST_F(SessionManagerTest, ConcurrentCreateOfOneIdCreatesOnce) {
  ns_->delay_ = std::chrono::milliseconds(50);
  SessionManager& m = mgr();  // opened before the threads start
  constexpr int kThreads = 8;
  std::atomic<int> created{0}, ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      if (i % 2) {
        auto r = m.create_or_get("race", {}, kDaemon);
        if (r) {
          ok++;
          if (r->second) created++;
        }
      } else {
        if (m.acquire("race", true, kDaemon)) ok++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, kThreads);
  EXPECT_LE(created, 1);
  EXPECT_EQ(ns_->creates_, 1);
  EXPECT_EQ(mgr().list(kDaemon).size(), 1u);
}

TEST_F(SessionManagerTest, ConcurrentCreateAndDestroyKeepAConsistentState) {
  ns_->delay_ = std::chrono::milliseconds(2);
  SessionManager& m = mgr();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        if ((i + t) % 2) {
          (void)m.create_or_get("churn", {}, kDaemon);
        } else {
          (void)m.destroy("churn", kDaemon);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  // Whatever interleaving happened, the session and its workspace agree.
  bool listed = mgr().get("churn", kDaemon).has_value();
  EXPECT_EQ(listed, fs::exists(workspace("churn")));
}

TEST_F(SessionManagerTest, ShutdownAllStopsEveryBoxAndKeepsWorkspaces) {
  auto a = mgr().acquire("s-a", true, kDaemon);
  auto b = mgr().acquire("s-b", true, kDaemon);
  ASSERT_TRUE(a && b);
  mgr().shutdown_all();
  EXPECT_TRUE(static_cast<FakeSandbox*>(a->get())->shut_down());
  EXPECT_TRUE(static_cast<FakeSandbox*>(b->get())->shut_down());
  EXPECT_EQ(mgr().get("s-a", kDaemon)->state, State::kSuspended);
  EXPECT_EQ(mgr().count_by_state()["suspended"], 2u);
  EXPECT_TRUE(fs::is_directory(workspace("s-a")));
  auto after = mgr().acquire("s-a", false, kDaemon);
  ASSERT_FALSE(after);
  EXPECT_EQ(after.error().code, Code::kUnavailable);
}

TEST_F(SessionManagerTest, OpenRefusesAnUnknownDefaultBackend) {
  ManagerConfig c = config();
  c.default_backend = "nope";
  auto m = SessionManager::open(c);
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message.find("nope"), std::string::npos);
}

TEST_F(SessionManagerTest, ATenantSeesAndTouchesOnlyItsOwnSessions) {
  const Caller a{"a", false, 0}, b{"b", false, 0}, admin{"ops", true, 0};
  ASSERT_TRUE(mgr().create_or_get("mine", SessionSpec{}, a));
  ASSERT_TRUE(mgr().create_or_get("theirs", SessionSpec{}, b));

  auto got = mgr().get("mine", b);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, Code::kNotFound);
  // Word for word what a missing session gets.
  EXPECT_EQ(got.error().message, "no such session: mine");
  EXPECT_EQ(mgr().get("nobody", b).error().message, "no such session: nobody");
  auto box = mgr().acquire("mine", /*create_if_missing=*/true, b);
  ASSERT_FALSE(box);
  EXPECT_EQ(box.error().code, Code::kNotFound);
  EXPECT_EQ(mgr().destroy("mine", b).error().code, Code::kNotFound);
  EXPECT_EQ(mgr().destroy_archived("mine", b).error().code, Code::kNotFound);
  auto dup = mgr().create_or_get("mine", SessionSpec{}, b);
  ASSERT_FALSE(dup);
  EXPECT_EQ(dup.error().code, Code::kExists);
  EXPECT_TRUE(fs::is_directory(workspace("mine")));

  auto la = mgr().list(a);
  ASSERT_EQ(la.size(), 1u);
  EXPECT_EQ(la[0].id, "mine");
  EXPECT_EQ(la[0].tenant, "a");
  EXPECT_EQ(mgr().list(admin).size(), 2u);
  EXPECT_TRUE(mgr().get("mine", admin));
  EXPECT_TRUE(mgr().acquire("mine", false, admin));
  EXPECT_TRUE(mgr().acquire("fresh", true, b));
  EXPECT_EQ(mgr().get("fresh", admin)->tenant, "b");
}

TEST_F(SessionManagerTest, QuotasAreEquotaNamingTheLimitAndFreeUpOnDestroy) {
  auto c = config();
  c.max_running_boxes = 3;
  auto m = SessionManager::open(c);
  ASSERT_TRUE(m);
  const Caller a{"a", false, 2}, b{"b", false, 0};
  ASSERT_TRUE((*m)->create_or_get("a1", SessionSpec{}, a));
  ASSERT_TRUE((*m)->acquire("a2", true, a));
  auto over = (*m)->create_or_get("a3", SessionSpec{}, a);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code, Code::kQuota);
  EXPECT_NE(over.error().message.find("max_sessions limit of 2"), std::string::npos)
      << over.error().message;
  EXPECT_FALSE(fs::exists(workspace("a3")));
  ASSERT_TRUE((*m)->create_or_get("b1", SessionSpec{}, b));
  auto boxes = (*m)->create_or_get("b2", SessionSpec{}, b);
  ASSERT_FALSE(boxes);
  EXPECT_EQ(boxes.error().code, Code::kQuota);
  EXPECT_NE(boxes.error().message.find("max_running_boxes limit of 3"), std::string::npos)
      << boxes.error().message;
  ASSERT_TRUE((*m)->destroy("a1", a));
  EXPECT_TRUE((*m)->create_or_get("a3", SessionSpec{}, a));
}

TEST_F(SessionManagerTest, RestoreOfAHostileArchiveLeavesNothingAndFreesTheId) {
  ASSERT_TRUE(mgr().create_or_get("src", SessionSpec{}, kDaemon));
  { std::ofstream(workspace("src") + "/f.txt") << "data"; }
  auto path = mgr().destroy_archived("src", kDaemon);
  ASSERT_TRUE(path) << path.error().message;
  EXPECT_EQ(path->rfind(data_ + "/archives/src-", 0), 0u) << *path;
  EXPECT_FALSE(fs::exists(workspace("src")));

  // A file that is not an archive, in the right place: EINVAL, nothing left, id still free.
  std::ofstream(data_ + "/archives/bad.tar.zst") << "garbage";
  auto bad = mgr().restore("dst", data_ + "/archives/bad.tar.zst", kDaemon);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Code::kInvalid);
  EXPECT_FALSE(fs::exists(workspace("dst")));
  EXPECT_FALSE(mgr().get("dst", kDaemon));
  // Elsewhere: EACCES before anything is read.
  auto elsewhere = mgr().restore("dst", root_ + "/elsewhere/x.tar.zst", kDaemon);
  ASSERT_FALSE(elsewhere);
  EXPECT_EQ(elsewhere.error().code, Code::kAccess);

  auto good = mgr().restore("dst", *path, kDaemon);
  ASSERT_TRUE(good) << good.error().message;
  EXPECT_EQ(good->state, State::kRunning);
  std::ifstream f(workspace("dst") + "/f.txt");
  std::string content;
  f >> content;
  EXPECT_EQ(content, "data");
  struct stat st;
  ASSERT_EQ(::stat((workspace("dst") + "/f.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, first_uid_probe("dst"));  // the ns backend: the session's own uid
}

// --- Lifecycle, persistence, the reaper ---

TEST_F(SessionManagerTest, SuspendTakesTheBoxDownAndAnyUseResumesWithTheSameUid) {
  auto created = mgr().create_or_get("s1", {}, kDaemon);
  ASSERT_TRUE(created);
  auto first = mgr().acquire("s1", false, kDaemon);
  ASSERT_TRUE(first);
  auto* fake = dynamic_cast<FakeSandbox*>(first->get());
  ASSERT_NE(fake, nullptr);
  std::ofstream(workspace("s1") + "/keep.txt") << "still here";

  auto suspended = mgr().suspend("s1", kDaemon);
  ASSERT_TRUE(suspended) << suspended.error().message;
  EXPECT_EQ(suspended->state, State::kSuspended);
  EXPECT_TRUE(fake->shut_down());
  EXPECT_EQ(mgr().count_by_state()["suspended"], 1u);
  ASSERT_TRUE(mgr().suspend("s1", kDaemon));  // suspending a suspended session is a no-op
  EXPECT_EQ(ns_->creates_, 1);

  auto again = mgr().acquire("s1", false, kDaemon);  // any use resumes
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(ns_->creates_, 2);
  EXPECT_NE(again->get(), first->get());
  auto info = mgr().get("s1", kDaemon);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->state, State::kRunning);
  EXPECT_EQ(info->uid, created->first.uid);
  EXPECT_TRUE(fs::exists(workspace("s1") + "/keep.txt"));

  ASSERT_TRUE(mgr().suspend("s1", kDaemon));
  auto resumed = mgr().resume("s1", kDaemon);
  ASSERT_TRUE(resumed);
  EXPECT_EQ(resumed->state, State::kRunning);
  EXPECT_EQ(mgr().suspend("nope", kDaemon).error().code, Code::kNotFound);
  EXPECT_EQ(mgr().resume("nope", kDaemon).error().code, Code::kNotFound);
}

TEST_F(SessionManagerTest, SessionsSurviveARestartSuspendedWithUidsSpecsAndTenants) {
  auto ids = colliding_ids(42424, 3);
  SessionSpec spec;
  spec.labels = {{"team", "a"}};
  spec.limits.memory_mb = 256;
  spec.env = {{"K", "V"}};
  spec.ttl_sec = 99;
  Caller alice{"alice", false, 0};
  auto a = mgr().create_or_get(ids[0], spec, alice);
  auto b = mgr().create_or_get(ids[1], {}, kDaemon);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(*a->first.uid, 42424u);
  ASSERT_EQ(*b->first.uid, 42425u);
  ASSERT_TRUE(mgr().destroy(ids[0], alice));
  auto a2 = mgr().create_or_get(ids[0], spec, alice);  // the uid is free again, and reused
  ASSERT_TRUE(a2);
  ASSERT_EQ(*a2->first.uid, 42424u);

  restart();
  auto list = mgr().list(kDaemon);
  ASSERT_EQ(list.size(), 2u);
  for (const SessionInfo& s : list) EXPECT_EQ(s.state, State::kSuspended) << s.id;
  auto ra = mgr().get(ids[0], alice);
  ASSERT_TRUE(ra) << "the tenant lost its session";
  EXPECT_EQ(ra->uid, 42424u);
  EXPECT_EQ(ra->spec.labels, spec.labels);
  EXPECT_EQ(ra->spec.limits.memory_mb, 256u);
  EXPECT_EQ(ra->spec.env, spec.env);
  EXPECT_EQ(ra->spec.ttl_sec, 99);
  EXPECT_EQ(ra->workspace, "/workspace");
  EXPECT_EQ(ra->created_at.time_since_epoch() / std::chrono::milliseconds(1),
            a2->first.created_at.time_since_epoch() / std::chrono::milliseconds(1));
  EXPECT_FALSE(mgr().get(ids[0], Caller{"bob", false, 0})) << "tenant lost at restart";
  EXPECT_EQ(mgr().get(ids[1], kDaemon)->uid, 42425u);

  // The third colliding id probes past both stored allocations, as before the restart.
  auto c = mgr().create_or_get(ids[2], {}, kDaemon);
  ASSERT_TRUE(c);
  EXPECT_EQ(*c->first.uid, 42426u);
  // First use resumes with the stored spec.
  ASSERT_TRUE(mgr().acquire(ids[0], false, alice));
  EXPECT_EQ(ns_->configs_.back().limits.memory_mb, 256u);
  EXPECT_EQ(ns_->configs_.back().uid, 42424u);
  // A destroyed session stays destroyed after the next restart.
  ASSERT_TRUE(mgr().destroy(ids[1], kDaemon));
  restart();
  EXPECT_FALSE(mgr().get(ids[1], kDaemon));
  EXPECT_EQ(mgr().list(kDaemon).size(), 2u);
}

TEST_F(SessionManagerTest, WithoutPersistenceARestartForgetsSessions) {
  tweak_ = [](ManagerConfig& c) { c.persist = false; };
  ASSERT_TRUE(mgr().create_or_get("mem", {}, kDaemon));
  restart();
  EXPECT_FALSE(mgr().get("mem", kDaemon));
  EXPECT_FALSE(fs::exists(data_ + "/state.db"));
  EXPECT_TRUE(fs::is_directory(workspace("mem"))) << "a workspace is never deleted by a restart";
}

TEST_F(SessionManagerTest, AWorkspaceWithoutARowIsKeptAndAdopted) {
  fs::create_directories(workspace("orphan"));
  std::ofstream(workspace("orphan") + "/data.txt") << "precious";
  restart();
  EXPECT_TRUE(fs::exists(workspace("orphan") + "/data.txt"));
  EXPECT_FALSE(mgr().get("orphan", kDaemon));
  ASSERT_TRUE(mgr().create_or_get("orphan", {}, kDaemon));
  EXPECT_TRUE(fs::exists(workspace("orphan") + "/data.txt"));
}

TEST_F(SessionManagerTest, TempFilesOfInterruptedWritesAreSweptAtStartup) {
  ASSERT_TRUE(mgr().create_or_get("tw", {}, kDaemon));
  fs::create_directories(workspace("tw") + "/deep/er");
  const std::string stale = workspace("tw") + "/deep/er/.agentbox-tmp-abc123";
  std::ofstream(stale) << "half a write";
  std::ofstream(workspace("tw") + "/deep/kept.txt") << "a real file";
  // Older than the daemon that will sweep.
  fs::last_write_time(stale, fs::file_time_type::clock::now() - std::chrono::hours(1));
  // A symlink to a dir outside holding a temp-named file: never followed.
  fs::create_directories(root_ + "/elsewhere/x");
  const std::string outside = root_ + "/elsewhere/x/.agentbox-tmp-outside";
  std::ofstream(outside) << "not ours";
  fs::last_write_time(outside, fs::file_time_type::clock::now() - std::chrono::hours(1));
  fs::create_directory_symlink(root_ + "/elsewhere/x", workspace("tw") + "/link");
  restart();
  for (int i = 0; i < 200 && fs::exists(stale); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(workspace("tw") + "/deep/kept.txt"));
  EXPECT_TRUE(fs::exists(outside));
}

TEST_F(SessionManagerTest, ReaperSuspendsIdleSessionsButNeverOneInUse) {
  tweak_ = [](ManagerConfig& c) { c.default_ttl_sec = 1; };
  ASSERT_TRUE(mgr().create_or_get("idle", {}, kDaemon));
  ASSERT_TRUE(mgr().create_or_get("busy", {}, kDaemon));
  SessionSpec forever;
  forever.ttl_sec = 0;  // its own ttl_sec wins over the default: never
  ASSERT_TRUE(mgr().create_or_get("forever", forever, kDaemon));
  EXPECT_EQ(mgr().reap_idle(), 0u);
  auto lease = mgr().acquire("busy", false, kDaemon);  // a long command holds this
  ASSERT_TRUE(lease);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(mgr().reap_idle(), 1u);
  EXPECT_EQ(mgr().get("idle", kDaemon)->state, State::kSuspended);
  EXPECT_EQ(mgr().get("busy", kDaemon)->state, State::kRunning);
  EXPECT_EQ(mgr().get("forever", kDaemon)->state, State::kRunning);
  // The command ends: the TTL starts then, not when it began.
  lease->reset();
  EXPECT_EQ(mgr().reap_idle(), 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(mgr().reap_idle(), 1u);
  EXPECT_EQ(mgr().get("busy", kDaemon)->state, State::kSuspended);
  EXPECT_TRUE(fs::is_directory(workspace("busy")));
}

TEST_F(SessionManagerTest, KeepaliveExtendsWithoutResuming) {
  SessionSpec spec;
  spec.ttl_sec = 1;
  ASSERT_TRUE(mgr().create_or_get("k", spec, kDaemon));
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  auto kept = mgr().keepalive("k", kDaemon);
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->state, State::kRunning);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(mgr().reap_idle(), 0u);
  ASSERT_TRUE(mgr().suspend("k", kDaemon));
  ASSERT_TRUE(mgr().keepalive("k", kDaemon));
  EXPECT_EQ(mgr().get("k", kDaemon)->state, State::kSuspended);
  EXPECT_EQ(mgr().keepalive("nope", kDaemon).error().code, Code::kNotFound);
}

TEST_F(SessionManagerTest, ReaperDestroysWhenConfiguredAndTellsWhy) {
  std::vector<std::string> events;
  std::mutex mu;
  tweak_ = [&](ManagerConfig& c) {
    c.default_ttl_sec = 1;
    c.ttl_destroys = true;
  };
  auto sub = mgr().subscribe([&](const SessionEvent& ev) {
    std::lock_guard lk(mu);
    events.push_back(std::string(event_kind_name(ev.kind)) + " " +
                     std::string(event_cause_name(ev.cause)) + " " + ev.session.id + " " +
                     std::string(ev.detail));
  });
  ASSERT_TRUE(mgr().create_or_get("gone", {}, kDaemon));
  ASSERT_TRUE(mgr().suspend("gone", kDaemon));  // suspended ones are destroyed too when idle
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(mgr().reap_idle(), 1u);
  EXPECT_FALSE(mgr().get("gone", kDaemon));
  EXPECT_FALSE(fs::exists(workspace("gone")));
  std::lock_guard lk(mu);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0], "created api gone ");
  EXPECT_EQ(events[1], "suspended api gone ");
  EXPECT_EQ(events[2].rfind("destroyed reaper gone idle", 0), 0u) << events[2];
}

// Every transition is told once, by the manager, with its cause and the acting tenant; what
// changes nothing (a re-create, a suspend of a suspended session) tells nothing.
TEST_F(SessionManagerTest, EveryTransitionIsPublishedOnceWithItsCause) {
  tweak_ = [](ManagerConfig& c) {
    c.max_running_boxes = 1;
    c.evict_idle = true;
  };
  std::vector<std::string> events;
  std::mutex mu;
  auto sub = mgr().subscribe([&](const SessionEvent& ev) {
    std::lock_guard lk(mu);
    events.push_back(std::string(event_kind_name(ev.kind)) + " " +
                     std::string(event_cause_name(ev.cause)) + " " + ev.session.id + " " +
                     std::string(ev.actor) + " " + std::string(ev.session.tenant) + " " +
                     std::string(state_name(ev.session.state)));
  });
  const Caller t("t", false, 0);
  ASSERT_TRUE(mgr().create_or_get("a", {}, t));
  ASSERT_TRUE(mgr().create_or_get("a", {}, t));      // exists: nothing happens
  ASSERT_TRUE(mgr().suspend("a", t));
  ASSERT_TRUE(mgr().suspend("a", t));                // already suspended: nothing happens
  ASSERT_TRUE(mgr().acquire("a", false, t));         // an implicit resume
  ASSERT_TRUE(mgr().acquire("b", true, kDaemon));    // an implicit create; evicts a
  ASSERT_TRUE(mgr().resume("a", t));                 // evicts b
  ASSERT_TRUE(mgr().resume("a", t));                 // running: nothing happens
  auto archive = mgr().destroy_archived("a", t);
  ASSERT_TRUE(archive) << archive.error().message;
  ASSERT_TRUE(mgr().restore("a", *archive, t));
  ASSERT_TRUE(mgr().destroy("b", kDaemon));
  sub.reset();
  ASSERT_TRUE(mgr().destroy("a", t));  // unsubscribed: not seen
  std::lock_guard lk(mu);
  EXPECT_EQ(events, (std::vector<std::string>{
                        "created api a t t running",
                        "suspended api a t t suspended",
                        "resumed api a t t running",
                        "suspended eviction a  t suspended",
                        "created api b default default running",
                        "suspended eviction b  default suspended",
                        "resumed api a t t running",
                        "destroyed api a t t running",
                        "created restore a t t running",
                        "destroyed api b default default suspended",
                    }));
}

TEST_F(SessionManagerTest, RecreateWithADifferentSpecIsEexistNamingTheField) {
  SessionSpec spec;
  spec.limits.memory_mb = 256;
  spec.labels = {{"v", "1"}};
  ASSERT_TRUE(mgr().create_or_get("r", spec, kDaemon));
  SessionSpec other = spec;
  other.limits.memory_mb = 512;
  auto clash = mgr().create_or_get("r", other, kDaemon);
  ASSERT_FALSE(clash);
  EXPECT_EQ(clash.error().code, Code::kExists);
  EXPECT_NE(clash.error().message.find("limits.memory_mb"), std::string::npos)
      << clash.error().message;
  SessionSpec env;
  env.env = {{"A", "b"}};
  auto clash2 = mgr().create_or_get("r", env, kDaemon);
  ASSERT_FALSE(clash2);
  EXPECT_NE(clash2.error().message.find("env"), std::string::npos);
  // Fields left out are not a difference; labels and ttl_sec may change.
  ASSERT_TRUE(mgr().create_or_get("r", {}, kDaemon));
  SessionSpec relabel;
  relabel.labels = {{"v", "2"}};
  relabel.ttl_sec = 60;
  auto ok = mgr().create_or_get("r", relabel, kDaemon);
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_FALSE(ok->second);
  EXPECT_EQ(ok->first.spec.labels.at("v"), "2");
  EXPECT_EQ(ok->first.spec.limits.memory_mb, 256u);
  restart();
  EXPECT_EQ(mgr().get("r", kDaemon)->spec.labels.at("v"), "2");
  EXPECT_EQ(mgr().get("r", kDaemon)->spec.ttl_sec, 60);
}

TEST_F(SessionManagerTest, EvictIdleSuspendsTheLeastRecentlyUsedBoxToMakeRoom) {
  tweak_ = [](ManagerConfig& c) {
    c.max_running_boxes = 2;
    c.evict_idle = true;
  };
  ASSERT_TRUE(mgr().create_or_get("old", {}, kDaemon));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(mgr().create_or_get("new", {}, kDaemon));
  auto third = mgr().create_or_get("third", {}, kDaemon);
  ASSERT_TRUE(third) << third.error().message;
  EXPECT_EQ(mgr().get("old", kDaemon)->state, State::kSuspended);
  EXPECT_EQ(mgr().get("new", kDaemon)->state, State::kRunning);
  EXPECT_EQ(mgr().get("third", kDaemon)->state, State::kRunning);
  // Nothing idle to evict: both running boxes are in use.
  auto l1 = mgr().acquire("new", false, kDaemon);
  auto l2 = mgr().acquire("third", false, kDaemon);
  ASSERT_TRUE(l1 && l2);
  auto refused = mgr().acquire("old", false, kDaemon);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::kQuota);
  EXPECT_NE(refused.error().message.find("max_running_boxes"), std::string::npos);
}

}  // namespace
}  // namespace agentbox::session
