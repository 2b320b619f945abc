// kvfill's FillDb against the real Store: what it writes must be what a node
// opens, rebuilds its arena from, and serves as kvload's values.
#include "kvnode/fill/fill.h"

#include <gtest/gtest.h>

#include <string>

#include "kvnode/load/verify.h"
#include "kvnode/load/workload.h"
#include "kvnode/storage/store.h"
#include "storage/test_util.h"

namespace kvnode::storage {
namespace {

using fill::FillDb;
using fill::FillOptions;
using testing::TempStore;

FillOptions Fill(const TempStore& t, uint64_t keys, uint64_t value_size) {
  FillOptions f;
  f.db_path = t.options.db_path;
  f.keys = keys;
  f.key_size = 16;
  f.value_size = value_size;
  f.load_version = uint64_t{1234} << 24;
  f.keys_per_file = 700;  // several files, the last one short
  return f;
}

TEST(FillTest, NodeRebuildsArenaFromFilledDbAndServesKvloadValues) {
  TempStore t;
  const uint64_t kKeys = 2000;
  uint64_t last_progress = 0;
  int calls = 0;
  auto r = FillDb(Fill(t, kKeys, 64), [&](uint64_t done) {
    EXPECT_GT(done, last_progress);
    last_progress = done;
    ++calls;
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->keys, kKeys);
  EXPECT_EQ(r->files, 3u);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(last_progress, kKeys);
  EXPECT_EQ(r->first_version, 1u);
  EXPECT_EQ(r->last_version, kKeys);
  EXPECT_FALSE(r->generation_bumped);

  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->opened_as(), Store::OpenedAs::kCreated);
  StoreStats s = (*store)->stats();
  EXPECT_EQ(s.rebuilt_keys, kKeys);
  EXPECT_EQ(s.keys, kKeys);
  EXPECT_EQ(s.resident_keys, kKeys);
  for (uint64_t i = 0; i < kKeys; ++i) {
    const std::string key = load::FormatKey(i, 16);
    auto g = (*store)->Get(key);
    ASSERT_TRUE(g.ok()) << key << ": " << g.status();
    EXPECT_TRUE(g->from_arena);
    EXPECT_EQ(g->version, i + 1);
    ASSERT_EQ(g->value, load::EncodeVerifiedValue(key, uint64_t{1234} << 24, 64)) << key;
    const load::CheckedValue c = load::CheckVerifiedValue(key, g->value);
    EXPECT_EQ(c.check, load::ValueCheck::kOk);
  }
  EXPECT_TRUE(absl::IsNotFound((*store)->Get(load::FormatKey(kKeys, 16)).status()));
  // The next write continues the store's versions after the filled ones.
  auto v = (*store)->Put(load::FormatKey(7, 16), "new");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_GT(*v, kKeys);

  // While the node holds the database, kvfill refuses (RocksDB's lock).
  EXPECT_TRUE(absl::IsUnavailable(FillDb(Fill(t, 10, 64)).status()));
  ASSERT_TRUE((*store)->Close().ok());
  // And a database with keys is not filled again.
  EXPECT_TRUE(absl::IsFailedPrecondition(FillDb(Fill(t, 10, 64)).status()));
}

TEST(FillTest, ShortValuesAreZeroBytesAsKvloadSends) {
  TempStore t;
  auto r = FillDb(Fill(t, 50, 16));
  ASSERT_TRUE(r.ok()) << r.status();
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  auto g = (*store)->Get(load::FormatKey(49, 16));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->value, std::string(16, '\0'));
}

// A node that shut down cleanly left an arena whose generation matches the
// database: a fill after that must make the next start rebuild, or the node
// would re-attach the old arena and miss every filled key.
TEST(FillTest, CleanArenaOfAnEarlierNodeIsRebuiltNotReattached) {
  TempStore t;
  {
    auto store = Store::Open(t.options);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put("other", "x").ok());
    ASSERT_TRUE((*store)->Delete("other").ok());
    ASSERT_TRUE((*store)->Close().ok());
  }
  auto r = FillDb(Fill(t, 300, 64));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->generation_bumped);
  EXPECT_GT(r->first_version, 1u);  // after the Put's version
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->opened_as(), Store::OpenedAs::kRebuilt);
  EXPECT_EQ((*store)->stats().keys, 300u);
  auto g = (*store)->Get(load::FormatKey(299, 16));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->version, r->last_version);
}

TEST(FillTest, ValidatesLikeKvload) {
  FillOptions f;
  EXPECT_TRUE(absl::IsInvalidArgument(f.Validate()));  // no db_path
  f.db_path = "/nonexistent/db";
  f.keys = 1000;
  f.key_size = 3;  // "k999" needs 4
  EXPECT_TRUE(absl::IsInvalidArgument(f.Validate()));
  f.key_size = 4;
  EXPECT_TRUE(f.Validate().ok());
  f.keys = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(f.Validate()));
}

}  // namespace
}  // namespace kvnode::storage
