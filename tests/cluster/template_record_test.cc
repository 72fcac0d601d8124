// The catalog's template record (cluster/template_record.h): what one node writes, another
// reads the same; a malformed record is no record; a number is never given twice under a name.

#include "cluster/template_record.h"

#include <gtest/gtest.h>

namespace agentbox::cluster {
namespace {

TEST(TemplateRecord, RoundTripsAndKeepsNumbersAcrossADelete) {
  TemplateRecord r;
  r.yaml = "name: t\n";
  r.current = 2;
  r.versions[1] = TemplateVersion{true, "n1", "b1", "name: t\n", "abc", 10, 2, 1700000000000};
  r.versions[2] = TemplateVersion{false, "n2", "b2", "name: t\nsetup: [x]\n"};
  const TemplateRecord back = parse_template_record(encode_template_record(r));
  ASSERT_TRUE(back.stored);
  EXPECT_FALSE(back.deleted);
  EXPECT_EQ(back.yaml, r.yaml);
  EXPECT_EQ(back.current, 2u);
  ASSERT_EQ(back.versions.size(), 2u);
  ASSERT_NE(back.built(1), nullptr);
  EXPECT_EQ(back.built(1)->snapshot, "abc");
  EXPECT_EQ(back.built(1)->created_ms, 1700000000000);
  EXPECT_EQ(back.built(2), nullptr);  // still building
  EXPECT_EQ(back.versions.at(2).node, "n2");
  EXPECT_EQ(back.versions.at(2).yaml, "name: t\nsetup: [x]\n");
  EXPECT_EQ(back.highest(), 2u);

  // Deleted: a tombstone with no versions that still knows the highest number.
  TemplateRecord gone;
  gone.deleted = true;
  gone.last_version = back.highest();
  const TemplateRecord t = parse_template_record(encode_template_record(gone));
  EXPECT_TRUE(t.stored);
  EXPECT_TRUE(t.deleted);
  EXPECT_TRUE(t.versions.empty());
  EXPECT_EQ(t.highest(), 2u);
}

TEST(TemplateRecord, NothingOrSomethingMalformedIsNoRecord) {
  EXPECT_FALSE(parse_template_record("").stored);
  EXPECT_FALSE(parse_template_record("[1,2]").stored);
  EXPECT_FALSE(parse_template_record("{nope").stored);
  // Keys that are not version numbers are skipped, not fatal.
  auto r =
      parse_template_record(R"({"yaml":"y","versions":{"x":{},"-1":{},"3":{"state":"built"}}})");
  ASSERT_TRUE(r.stored);
  ASSERT_EQ(r.versions.size(), 1u);
  EXPECT_NE(r.built(3), nullptr);
  EXPECT_EQ(parse_build_node(encode_build_record("n3", "t")), "n3");
  EXPECT_EQ(parse_build_node("junk"), "");
}

}  // namespace
}  // namespace agentbox::cluster
