#include "kvnode/storage/store.h"

#include <gtest/gtest.h>

#include <string>

#include "kvnode/storage/limits.h"
#include "kvnode/storage/read_path.h"
#include "test_util.h"

namespace kvnode::storage {
namespace {

using testing::TempStore;

TEST(StoreTest, PutGetDeleteRoundTrip) {
  TempStore t;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->opened_as(), Store::OpenedAs::kCreated);
  auto v1 = (*store)->Put("alpha", "one");
  ASSERT_TRUE(v1.ok()) << v1.status();
  auto v2 = (*store)->Put("alpha", "two");
  ASSERT_TRUE(v2.ok());
  EXPECT_GT(*v2, *v1);
  auto g = (*store)->Get("alpha");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->value, "two");
  EXPECT_EQ(g->version, *v2);
  EXPECT_TRUE(g->from_arena);
  EXPECT_TRUE(absl::IsNotFound((*store)->Get("beta").status()));
  ASSERT_TRUE((*store)->Delete("alpha").ok());
  EXPECT_TRUE(absl::IsNotFound((*store)->Get("alpha").status()));
  ASSERT_TRUE((*store)->Delete("never-there").ok());
  StoreStats s = (*store)->stats();
  EXPECT_EQ(s.keys, 0u);
  EXPECT_EQ(s.resident_keys, 0u);
  ASSERT_TRUE((*store)->Close().ok());
}

TEST(StoreTest, RefusesOversizeAndEmpty) {
  TempStore t;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE(absl::IsInvalidArgument((*store)->Put("", "x").status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument((*store)->Put(std::string(kMaxKeySize + 1, 'k'), "x").status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument((*store)->Put("k", std::string(kMaxValueSize + 1, 'v')).status()));
  EXPECT_TRUE((*store)->Put(std::string(kMaxKeySize, 'k'), std::string(kMaxValueSize, 'v')).ok());
  auto g = (*store)->Get(std::string(kMaxKeySize, 'k'));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->value.size(), kMaxValueSize);
  EXPECT_TRUE((*store)->Put("empty", "").ok());
  g = (*store)->Get("empty");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->value, "");
}

}  // namespace
}  // namespace kvnode::storage
