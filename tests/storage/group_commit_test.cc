// Store::Write, the group commit: one durable write for many ops, split
// where one group cannot hold them, with each op's answer what Put or
// Delete alone would have given.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvnode/storage/store.h"
#include "test_util.h"

namespace kvnode::storage {
namespace {

using testing::TempStore;
using Kind = WriteOp::Kind;

WriteOp PutOp(std::string_view key, std::string_view value) {
  return WriteOp{Kind::kPut, key, value, nullptr};
}
WriteOp DeleteOp(std::string_view key) { return WriteOp{Kind::kDelete, key, {}, nullptr}; }

std::vector<WriteResult> Apply(Store& s, const std::vector<WriteOp>& ops) {
  std::vector<WriteResult> results(ops.size());
  s.Write(ops, results);
  return results;
}

TEST(GroupCommitTest, OneDurableWriteForDistinctKeysWithAnswersInOrder) {
  TempStore t;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  ASSERT_TRUE(s.Put("gone", "x").ok());
  const uint64_t before = s.stats().commits;
  const std::vector<WriteResult> r = Apply(s, {PutOp("a", "1"), PutOp("b", "2"), DeleteOp("gone"),
                                               DeleteOp("never"), PutOp("", "bad key")});
  EXPECT_EQ(s.stats().commits, before + 1);  // the refused op does not end the group
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  ASSERT_TRUE(r[1].status.ok()) << r[1].status;
  EXPECT_EQ(r[1].version, r[0].version + 1);
  EXPECT_FALSE(r[0].existed);
  EXPECT_TRUE(r[2].status.ok());
  EXPECT_TRUE(r[2].existed);
  EXPECT_TRUE(r[3].status.ok());
  EXPECT_FALSE(r[3].existed);
  EXPECT_TRUE(absl::IsInvalidArgument(r[4].status)) << r[4].status;
  EXPECT_EQ(s.Get("b")->value, "2");
  EXPECT_TRUE(absl::IsNotFound(s.Get("gone").status()));
  EXPECT_EQ(s.stats().keys, 2u);
  EXPECT_EQ(s.last_version(), r[1].version);
  ASSERT_TRUE(s.Close().ok());

  // What RocksDB holds, through a rebuild of the arena from it.
  ASSERT_TRUE(Arena::Remove(t.options.arena_options()).ok());
  auto again = Store::Open(t.options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->Get("a")->version, r[0].version);
  EXPECT_EQ((*again)->Get("b")->value, "2");
  EXPECT_TRUE(absl::IsNotFound((*again)->Get("gone").status()));
  EXPECT_GE((*again)->last_version(), r[1].version);
}

TEST(GroupCommitTest, AKeyWrittenTwiceEndsTheGroupAndSeesTheFirstWrite) {
  TempStore t;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  const uint64_t before = s.stats().commits;
  const std::vector<WriteResult> r =
      Apply(s, {PutOp("k", "1"), PutOp("other", "o"), DeleteOp("k"), PutOp("k", "3")});
  EXPECT_EQ(s.stats().commits, before + 3);  // {k, other} {delete k} {k}
  EXPECT_FALSE(r[0].existed);
  EXPECT_TRUE(r[2].existed);  // the delete saw the first put
  EXPECT_FALSE(r[3].existed);
  EXPECT_EQ(r[3].version, r[1].version + 1);
  EXPECT_EQ(s.Get("k")->value, "3");
  EXPECT_EQ(s.stats().keys, 2u);
}

TEST(GroupCommitTest, TheIntentsKeyListBoundsAGroup) {
  TempStore t;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  std::vector<std::string> keys;
  for (int i = 0; i < 12; ++i) keys.push_back(std::string(200, static_cast<char>('a' + i)));
  std::vector<WriteOp> ops;
  for (const std::string& k : keys) ops.push_back(PutOp(k, "v"));
  const uint64_t before = s.stats().commits;
  for (const WriteResult& r : Apply(s, ops)) EXPECT_TRUE(r.status.ok()) << r.status;
  // 203 bytes per key in a 1024-byte list: 5 keys per group.
  EXPECT_EQ(s.stats().commits, before + 3);
  for (const std::string& k : keys) EXPECT_EQ(s.Get(k)->value, "v");
}

// Every new key of a group passes the chain bound against the published
// index: two new keys of one home bucket are never in one group, so the
// bound holds and a refused key is nowhere.
TEST(GroupCommitTest, NewKeysOfOneChainNeverOverfillIt) {
  TempStore t;
  t.options.bucket_count = 1;
  t.options.bucket_size = 64;
  t.options.max_chain_buckets = 1;  // one bucket: kSlotsPerBucket keys
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  std::vector<std::string> keys;
  for (int i = 0; i < 10; ++i) keys.push_back("key-" + std::to_string(i));
  std::vector<WriteOp> ops;
  for (const std::string& k : keys) ops.push_back(PutOp(k, "v"));
  const std::vector<WriteResult> r = Apply(s, ops);
  size_t ok = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (r[i].status.ok()) {
      ++ok;
      EXPECT_EQ(s.Get(keys[i])->value, "v");
    } else {
      EXPECT_TRUE(absl::IsResourceExhausted(r[i].status)) << r[i].status;
      EXPECT_TRUE(absl::IsNotFound(s.Get(keys[i]).status())) << keys[i];
    }
  }
  EXPECT_EQ(ok, kSlotsPerBucket);
  EXPECT_EQ(s.stats().keys, ok);
  ASSERT_TRUE(s.Close().ok());
  ASSERT_TRUE(Arena::Remove(t.options.arena_options()).ok());
  auto again = Store::Open(t.options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->stats().keys, ok);
}

TEST(GroupCommitTest, SideRecordsAreComputedInOpOrder) {
  TempStore t;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  std::string order;
  auto side = [&order](const std::string& name) {
    return SideRecord{"rec", [&order, name](const WriteOutcome& o) {
                        order += name;
                        return name + "@" + std::to_string(o.version);
                      }};
  };
  const SideRecord first = side("1"), second = side("2");
  const std::vector<WriteOp> ops = {{Kind::kPut, "x", "v", &first},
                                    {Kind::kPut, "y", "v", &second}};
  const std::vector<WriteResult> r = Apply(s, ops);
  EXPECT_EQ(order, "12");
  auto recs = s.ReadSideRecords("rec");
  ASSERT_TRUE(recs.ok()) << recs.status();
  ASSERT_EQ(recs->size(), 1u);
  EXPECT_EQ((*recs)[0].second, "2@" + std::to_string(r[1].version));  // the last one wins
}

}  // namespace
}  // namespace kvnode::storage
