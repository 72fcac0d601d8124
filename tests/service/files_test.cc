// service::Files: every mutation emits one event naming the path (never the contents), reads
// emit none, a file call never creates a session, and the edit and partial read the dialects use.

#include "service/files.h"

#include "service_fixture.h"

namespace agentbox::service {
namespace {

class FilesTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    ASSERT_TRUE(run(services_->sessions.create(as("t1"), "f1", {})));
    box_ = fake_box("f1");
    ASSERT_NE(box_, nullptr);
  }
  testing::FakeSandbox* box_ = nullptr;
};

TEST_F(FilesTest, WriteThenReadRoundTripsAndEmitsOnePutWithPathAndSize) {
  sandbox::WriteOptions opts;
  auto n = run(services_->files.write(as("t1"), "f1", "/workspace/a.txt", "hello", opts));
  ASSERT_TRUE(n) << n.error().message;
  EXPECT_EQ(*n, 5u);
  EXPECT_EQ(box_->file("/workspace/a.txt"), "hello");
  auto back = run(services_->files.read(as("t1"), "f1", "/workspace/a.txt", 1024));
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, "hello");
  ASSERT_EQ(events_.size(), 1u);  // the read is not an event
  EXPECT_EQ(events_[0].op, "file.put");
  EXPECT_EQ(std::get<std::string>(*events_[0].field("path")), "/workspace/a.txt");
  EXPECT_EQ(std::get<std::uint64_t>(*events_[0].field("size")), 5u);
}

TEST_F(FilesTest, AnUploadChangesNothingUntilItIsCommitted) {
  box_->put("/workspace/b.txt", "old");
  auto up = run(services_->files.begin_upload(as("t1"), "f1", "/workspace/b.txt", {}));
  ASSERT_TRUE(up) << up.error().message;
  ASSERT_TRUE(up->writer->write("new "));
  ASSERT_TRUE(up->writer->write("bytes"));
  EXPECT_EQ(box_->file("/workspace/b.txt"), "old");
  EXPECT_TRUE(events_.empty());
  auto size = run(services_->files.commit(as("t1"), &*up));
  ASSERT_TRUE(size);
  EXPECT_EQ(box_->file("/workspace/b.txt"), "new bytes");
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].op, "file.put");
}

TEST_F(FilesTest, MkdirRenameRemoveEmitOneEventEach) {
  ASSERT_TRUE(run(services_->files.mkdir(as("t1"), "f1", "/workspace/d")));
  box_->put("/workspace/d/x", "1");
  ASSERT_TRUE(run(services_->files.rename(as("t1"), "f1", "/workspace/d/x", "/workspace/d/y")));
  ASSERT_TRUE(run(services_->files.remove(as("t1"), "f1", "/workspace/d", true)));
  ASSERT_EQ(events_.size(), 3u);
  EXPECT_EQ(events_[0].op, "file.mkdir");
  EXPECT_EQ(events_[1].op, "file.rename");
  EXPECT_EQ(std::get<std::string>(*events_[1].field("to")), "/workspace/d/y");
  EXPECT_EQ(events_[2].op, "file.delete");
  EXPECT_TRUE(std::get<bool>(*events_[2].field("recursive")));
  EXPECT_EQ(box_->file("/workspace/d/y"), "<none>");
}

TEST_F(FilesTest, AFailedMutationEmitsNothing) {
  auto st = run(services_->files.rename(as("t1"), "f1", "/workspace/none", "/workspace/x"));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Code::kNotFound);
  EXPECT_TRUE(events_.empty());
}

TEST_F(FilesTest, AFileCallNeverCreatesASessionAndAnotherTenantsIsNotThere) {
  auto r = run(services_->files.stat(as("t1"), "nobody", "/workspace"));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kNotFound);
  EXPECT_FALSE(manager_->get("nobody", session::Caller::daemon()));
  auto other = run(services_->files.read(as("t2"), "f1", "/workspace/a.txt", 10));
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().code, Code::kNotFound);
}

TEST_F(FilesTest, ReadPartGivesTheSliceAndTheWholeSize) {
  box_->put("/workspace/c.txt", "0123456789");
  auto part = run(services_->files.read_part(as("t1"), "f1", "/workspace/c.txt", 3, 4));
  ASSERT_TRUE(part);
  EXPECT_EQ(part->data, "3456");
  EXPECT_EQ(part->size, 10u);
  auto past = run(services_->files.read_part(as("t1"), "f1", "/workspace/c.txt", 20, 4));
  ASSERT_TRUE(past);
  EXPECT_EQ(past->data, "");
}

TEST_F(FilesTest, EditReplacesExactlyWhatWasAskedAndOtherwiseLeavesTheFile) {
  box_->put("/workspace/e.txt", "a b a");
  auto twice =
      run(services_->files.edit(as("t1"), "f1", "/workspace/e.txt", "a", "z", false, 1 << 20, {}));
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().message.find("2 times"), std::string::npos);
  auto missing =
      run(services_->files.edit(as("t1"), "f1", "/workspace/e.txt", "q", "z", false, 1 << 20, {}));
  ASSERT_FALSE(missing);
  EXPECT_EQ(box_->file("/workspace/e.txt"), "a b a");
  EXPECT_TRUE(events_.empty());
  auto all =
      run(services_->files.edit(as("t1"), "f1", "/workspace/e.txt", "a", "zz", true, 1 << 20, {}));
  ASSERT_TRUE(all) << all.error().message;
  EXPECT_EQ(*all, 2u);
  EXPECT_EQ(box_->file("/workspace/e.txt"), "zz b zz");
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].op, "file.edit");
}

}  // namespace
}  // namespace agentbox::service
