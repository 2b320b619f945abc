// A full arena: writes still succeed (RocksDB), non-resident keys are served
// by the slow path, CLOCK evicts, and the client decoder never claims a key
// that exists is absent.
#include <gtest/gtest.h>

#include <string>

#include "kvnode/storage/read_path.h"
#include "kvnode/storage/store.h"
#include "test_util.h"

namespace kvnode::storage {
namespace {

using Outcome = ReadResult::Outcome;

std::string Key(int i) { return "key-" + std::to_string(i); }
std::string Value(int i) {
  return std::string(1000, static_cast<char>('a' + i % 26)) + std::to_string(i);
}

ReadResult ClientRead(const Store& s, const std::string& key, std::string* holder) {
  const Geometry& g = s.geometry();
  ReadStep step = FirstRead(g, key);
  ReadResult r;
  for (int hop = 0; hop < 100; ++hop) {
    holder->assign(s.arena_base() + step.offset, step.length);
    r = Decode(g, key, step, *holder);
    if (r.outcome != Outcome::kNext) break;
    step = r.next;
  }
  return r;
}

TEST(CapacityTest, FullArenaServesEverythingThroughTheSlowPath) {
  testing::TempStore t;
  t.options.arena_size = 2 << 20;
  t.options.promote_on_get = false;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  constexpr int kKeys = 4000;  // ~4 MB of values into a 2 MiB arena
  for (int i = 0; i < kKeys; ++i) ASSERT_TRUE(s.Put(Key(i), Value(i)).ok()) << i;
  StoreStats st = s.stats();
  EXPECT_EQ(st.keys, uint64_t{kKeys});
  EXPECT_LT(st.resident_keys, uint64_t{kKeys});
  EXPECT_GT(st.resident_keys, 500u);
  EXPECT_GT(st.evictions, 0u);
  EXPECT_EQ(st.resident_keys + st.marker_slots, uint64_t{kKeys}) << "lossy " << st.lossy_buckets;

  int found = 0, slow = 0;
  std::string holder;
  for (int i = 0; i < kKeys; ++i) {
    const ReadResult r = ClientRead(s, Key(i), &holder);
    ASSERT_NE(r.outcome, Outcome::kNotFound) << Key(i);
    ASSERT_NE(r.outcome, Outcome::kRetry) << Key(i);
    if (r.outcome == Outcome::kFound) {
      EXPECT_EQ(r.value, Value(i));
      ++found;
    } else {
      ++slow;
    }
    auto g = s.Get(Key(i));
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->value, Value(i));
    EXPECT_EQ(g->from_arena, r.outcome == Outcome::kFound);
  }
  EXPECT_EQ(uint64_t(found), st.resident_keys);
  EXPECT_GT(slow, 0);
  for (int i = 0; i < 300; ++i) {
    const ReadResult r = ClientRead(s, "absent-" + std::to_string(i), &holder);
    EXPECT_TRUE(r.outcome == Outcome::kNotFound || r.outcome == Outcome::kSlowPath);
  }

  // Deleting keys, resident or not, makes them absent everywhere.
  for (int i = 0; i < kKeys; i += 3) ASSERT_TRUE(s.Delete(Key(i)).ok());
  for (int i = 0; i < kKeys; ++i) {
    const ReadResult r = ClientRead(s, Key(i), &holder);
    if (i % 3 == 0) {
      EXPECT_NE(r.outcome, Outcome::kFound) << Key(i);
      EXPECT_TRUE(absl::IsNotFound(s.Get(Key(i)).status()));
    } else {
      EXPECT_NE(r.outcome, Outcome::kNotFound) << Key(i);
    }
  }
  st = s.stats();
  EXPECT_EQ(st.keys, uint64_t{kKeys - (kKeys + 2) / 3});
}

TEST(CapacityTest, SlowPathGetPromotesTheKey) {
  testing::TempStore t;
  t.options.arena_size = 2 << 20;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  for (int i = 0; i < 4000; ++i) ASSERT_TRUE(s.Put(Key(i), Value(i)).ok());
  std::string holder;
  int victim = -1;
  for (int i = 0; i < 4000 && victim < 0; ++i) {
    if (ClientRead(s, Key(i), &holder).outcome == Outcome::kSlowPath) victim = i;
  }
  ASSERT_GE(victim, 0);
  auto g = s.Get(Key(victim));
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->from_arena);
  const ReadResult r = ClientRead(s, Key(victim), &holder);
  ASSERT_EQ(r.outcome, Outcome::kFound);
  EXPECT_EQ(r.value, Value(victim));
  EXPECT_TRUE(s.Get(Key(victim))->from_arena);
  EXPECT_GE(s.stats().promotions, 1u);
  // A write to a non-resident key makes it resident with the new value.
  int other = -1;
  for (int i = 0; i < 4000 && other < 0; ++i) {
    if (ClientRead(s, Key(i), &holder).outcome == Outcome::kSlowPath) other = i;
  }
  ASSERT_GE(other, 0);
  ASSERT_TRUE(s.Put(Key(other), "fresh").ok());
  const ReadResult r2 = ClientRead(s, Key(other), &holder);
  ASSERT_EQ(r2.outcome, Outcome::kFound);
  EXPECT_EQ(r2.value, "fresh");
  EXPECT_EQ(s.stats().keys, 4000u);
}

// A tiny index: long overflow chains (up to the writer's bound, which a
// reader walks to the end).
TEST(CapacityTest, OverflowChains) {
  testing::TempStore t;
  t.options.bucket_count = 4;
  t.options.bucket_size = 64;
  t.options.max_chain_buckets = kMaxChainLength;  // 384 slots per chain, ~250 keys
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(s.Put(Key(i), "v" + std::to_string(i)).ok());
  EXPECT_GT(s.stats().overflow_buckets, 100u);
  std::string holder;
  int found = 0;
  for (int i = 0; i < 1000; ++i) {
    const ReadResult r = ClientRead(s, Key(i), &holder);
    ASSERT_NE(r.outcome, Outcome::kNotFound);
    if (r.outcome == Outcome::kFound) {
      EXPECT_EQ(r.value, "v" + std::to_string(i));
      ++found;
    }
    EXPECT_EQ(s.Get(Key(i))->value, "v" + std::to_string(i));
  }
  EXPECT_GT(found, 600);
}

}  // namespace
}  // namespace kvnode::storage
