#include "kvnode/storage/store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "kvnode/storage/format.h"
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

// The meta word of the bucket that holds slot `slot` (format.h).
std::atomic_ref<uint64_t> MetaWordOf(const Store& s, uint64_t slot) {
  const uint64_t bucket = slot & ~uint64_t{kSlotLineSize - 1};
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(s.arena_base() + bucket + 8));
}

// Whether the CLOCK reference bit of `key`'s slot is set; the key must be
// resident.
bool Referenced(const Store& s, const std::string& key) {
  const Geometry& g = s.geometry();
  ReadStep step = FirstRead(g, key);
  ReadResult r;
  std::string holder;
  do {
    holder.assign(s.arena_base() + step.offset, step.length);
    r = Decode(g, key, step, holder);
    step = r.next;
  } while (r.outcome == ReadResult::Outcome::kNext);
  EXPECT_EQ(r.outcome, ReadResult::Outcome::kFound) << key;
  const uint64_t bucket = r.slot & ~uint64_t{kSlotLineSize - 1};
  const uint64_t bit = kMetaRefShift + (r.slot - bucket) / 8 - kBucketHeaderWords;
  return (MetaWordOf(s, r.slot).load() >> bit & 1) != 0;
}

// Clears every reference bit of the index, as the writer's CLOCK hand does
// on its way round: a Get that sets one again changes the arena.
void ClearReferenceBits(const Store& s) {
  const Geometry& g = s.geometry();
  for (uint64_t b = 0; b < g.bucket_count; ++b) {
    uint64_t at = BucketOffset(g, b);
    for (uint32_t depth = 0; at != 0 && depth < kMaxChainLength; ++depth) {
      MetaWordOf(s, at).fetch_and(~kMetaRefMask);
      at = LinkNext(*reinterpret_cast<const uint64_t*>(s.arena_base() + at));
    }
  }
}

// One process writes the arena, CLOCK's reference bits included
// (docs/format.md): the new process of a live upgrade before the writer
// switch, and the old one after it (it still answers the RPC GETs of clients
// that have not moved, while the new one may free and reuse that memory),
// serve Gets from the arena without changing a byte of it. The writer's own
// Gets still mark their keys recently used.
TEST(StoreTest, OnlyTheWriterMarksTheKeysItServes) {
  TempStore t;
  auto o = Store::Open(t.options);
  ASSERT_TRUE(o.ok()) << o.status();
  constexpr int kKeys = 20;
  auto key = [](int i) { return "key-" + std::to_string(i); };
  for (int i = 0; i < kKeys; ++i) ASSERT_TRUE((*o)->Put(key(i), "value-" + key(i)).ok());
  auto n = Store::AttachLive(t.options);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_TRUE((*n)->PrepareJournal().ok());

  auto expect_gets_write_nothing = [&](Store& reader, const std::string& who) {
    SCOPED_TRACE(who);
    ClearReferenceBits(reader);
    const std::string before(reader.arena_base(), reader.arena_size());
    for (int i = 0; i < kKeys; ++i) {
      auto g = reader.Get(key(i));
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_TRUE(g->from_arena);
      EXPECT_EQ(g->value, "value-" + key(i));
    }
    const std::string after(reader.arena_base(), reader.arena_size());
    const auto diff = std::mismatch(before.begin(), before.end(), after.begin());
    EXPECT_TRUE(diff.first == before.end())
        << "the arena changed at offset " << diff.first - before.begin();
  };
  expect_gets_write_nothing(**n, "the new side before the writer switch");
  ASSERT_TRUE((*o)->ReleaseDbForHandoff().ok());
  ASSERT_TRUE((*n)->BecomeJournalWriter((*o)->last_version()).ok());
  expect_gets_write_nothing(**o, "the old side after the writer switch");

  ClearReferenceBits(**n);
  ASSERT_FALSE(Referenced(**n, key(1)));
  ASSERT_TRUE((*n)->Get(key(1)).ok());
  EXPECT_TRUE(Referenced(**n, key(1))) << "the writer's Get did not mark its key";
  EXPECT_FALSE(Referenced(**n, key(2)));
}

}  // namespace
}  // namespace kvnode::storage
