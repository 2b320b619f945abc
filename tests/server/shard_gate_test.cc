#include "kvnode/server/shard_gate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace kvnode::server {
namespace {

proto::ShardMap Split(uint32_t slots, std::vector<std::string> ids, uint64_t epoch = 1) {
  absl::StatusOr<proto::ShardMap> m = proto::EvenSplit("c1", slots, ids);
  EXPECT_TRUE(m.ok()) << m.status();
  m->epoch = epoch;
  return *m;
}

// Owns() agrees with the map's own OwnerOf for every slot of every node: the
// bitset is the ranges, not an approximation of them.
TEST(ShardView, OwnsExactlyTheMapsSlots) {
  const proto::ShardMap map = Split(4096, {"a", "b", "c"});
  uint32_t total = 0;
  for (uint16_t self = 0; self < 3; ++self) {
    const ShardView v(map, self);
    uint32_t owned = 0;
    for (uint32_t s = 0; s < map.num_slots; ++s) {
      EXPECT_EQ(v.Owns(s), map.OwnerOf(s) == self) << "slot " << s << " node " << self;
      owned += v.Owns(s) ? 1 : 0;
    }
    EXPECT_EQ(v.slots_owned(), owned);
    EXPECT_EQ(v.slots_owned(), map.SlotsOwnedBy(self));
    EXPECT_FALSE(v.Owns(map.num_slots));
    EXPECT_FALSE(v.Owns(UINT32_MAX));
    total += owned;
  }
  EXPECT_EQ(total, 4096u);
}

TEST(ShardView, InterleavedRangesAndOddSlotCounts) {
  proto::ShardMap map = Split(100, {"a", "b"});
  map.ranges = {{0, 1}, {3, 0}, {64, 1}, {65, 0}, {99, 1}};
  ASSERT_TRUE(map.Validate().ok()) << map.Validate();
  const ShardView b(map, 1);
  for (uint32_t s = 0; s < 100; ++s) EXPECT_EQ(b.Owns(s), map.OwnerOf(s) == 1) << s;
  EXPECT_EQ(b.slots_owned(), 3u + 1u + 1u);
}

TEST(ShardView, ANodeOutsideTheMapOwnsNothing) {
  auto v = ShardView::ForNode(Split(64, {"a", "b"}), "z");
  EXPECT_EQ(v->self, ShardView::kNotInMap);
  EXPECT_EQ(v->slots_owned(), 0u);
  for (uint32_t s = 0; s < 64; ++s) EXPECT_FALSE(v->Owns(s));
  EXPECT_FALSE(v->OwnsKey("k"));
  auto b = ShardView::ForNode(Split(64, {"a", "b"}), "b");
  EXPECT_EQ(b->self, 1);
  EXPECT_EQ(b->slots_owned(), 32u);
}

TEST(ShardView, OwnsKeyUsesTheSlotHash) {
  auto a = ShardView::ForNode(Split(4096, {"a", "b"}), "a");
  auto b = ShardView::ForNode(Split(4096, {"a", "b"}), "b");
  int mine = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string key = "key-" + std::to_string(i);
    EXPECT_NE(a->OwnsKey(key), b->OwnsKey(key)) << key;
    EXPECT_EQ(a->OwnsKey(key), a->Owns(proto::SlotOf(key, 4096)));
    mine += a->OwnsKey(key) ? 1 : 0;
  }
  // Both nodes get keys (XXH64 spreads them): the test is not vacuous.
  EXPECT_GT(mine, 50);
  EXPECT_LT(mine, 150);
}

// An invalid map (ranges past num_slots, unsorted, a zero slot count) is
// clipped, never read out of bounds.
TEST(ShardView, InvalidMapIsClipped) {
  proto::ShardMap map = Split(10, {"a"});
  map.ranges = {{5, 0}, {2, 0}, {900000, 0}};
  const ShardView v(map, 0);
  EXPECT_EQ(v.slots_owned(), 8u);  // 2..9: the first and last ranges are empty
  EXPECT_FALSE(v.Owns(1));
  map.num_slots = 0;
  const ShardView empty(map, 0);
  EXPECT_EQ(empty.slots_owned(), 0u);
  EXPECT_FALSE(empty.OwnsKey("k"));
}

TEST(ShardGate, PublishCurrentEpochVersion) {
  ShardGate gate;
  EXPECT_EQ(gate.Current(), nullptr);
  EXPECT_EQ(gate.epoch(), 0u);
  EXPECT_EQ(gate.version(), 0u);
  int woken = 0;
  gate.SetListener([&] { ++woken; });
  auto v = ShardView::ForNode(Split(16, {"a"}, 7), "a");
  gate.Publish(v);
  EXPECT_EQ(gate.Current(), v);
  EXPECT_EQ(gate.epoch(), 7u);
  EXPECT_EQ(gate.version(), 1u);
  EXPECT_EQ(woken, 1);
  gate.Publish(nullptr);
  EXPECT_EQ(gate.Current(), nullptr);
  EXPECT_EQ(gate.epoch(), 0u);
  EXPECT_EQ(gate.version(), 2u);
  EXPECT_EQ(woken, 2);
  gate.SetListener({});
  gate.Publish(v);
  EXPECT_EQ(woken, 2);
}

// One thread publishes maps of rising epochs while another reads the way
// the data thread does (version, then Current when it moved). The reader
// sees epochs never going back and ends on the last one. Run under TSan.
TEST(ShardGate, PublishFromAnotherThread) {
  ShardGate gate;
  std::atomic<int> woken{0};
  gate.SetListener([&] { woken.fetch_add(1); });
  constexpr uint64_t kLast = 2000;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (uint64_t e = 1; e <= kLast; ++e) {
      gate.Publish(ShardView::ForNode(Split(64, {"a", "b"}, e), e % 2 == 0 ? "a" : "b"));
    }
    done.store(true);
  });
  uint64_t seen_version = 0;
  std::shared_ptr<const ShardView> view;
  uint64_t last_epoch = 0;
  int refreshes = 0;
  for (;;) {
    const bool finished = done.load();
    const uint64_t v = gate.version();
    if (v != seen_version) {
      seen_version = v;
      view = gate.Current();
      ++refreshes;
      ASSERT_NE(view, nullptr);
      ASSERT_GE(view->map.epoch, last_epoch);
      last_epoch = view->map.epoch;
      // The view is whole: its bitset matches its own map.
      ASSERT_EQ(view->slots_owned(), 32u);
    }
    if (finished && v == gate.version()) break;
  }
  writer.join();
  EXPECT_EQ(last_epoch, kLast);
  EXPECT_EQ(gate.epoch(), kLast);
  EXPECT_EQ(woken.load(), static_cast<int>(kLast));
  EXPECT_GE(refreshes, 1);
}

// The slot words (docs/format.md "Slot words") are the view's ownership,
// byte for byte, over all kMaxSlots bytes; a new view changes only the
// bytes of slots that changed hands, and no view means nothing served.
TEST(SlotWords, StoredFromTheViewAndChangedOnlyWhereOwnershipMoved) {
  std::vector<uint8_t> words(proto::kMaxSlots, 0xee);  // not a table anyone made
  const proto::ShardMap one = Split(4096, {"a", "b", "c"}, 1);
  const ShardView a1(one, 0);
  EXPECT_EQ(StoreSlotWords(&a1, words.data()), proto::kMaxSlots);
  for (uint32_t s = 0; s < proto::kMaxSlots; ++s) {
    ASSERT_EQ(words[s], s < 4096 && one.OwnerOf(s) == 0 ? 1 : 0) << "slot " << s;
  }
  EXPECT_EQ(StoreSlotWords(&a1, words.data()), 0u);  // nothing to change

  // Epoch 2: the second half of a's range goes to b.
  proto::ShardMap two = one;
  two.epoch = 2;
  two.ranges.insert(two.ranges.begin() + 1, proto::SlotRange{683, 1});
  ASSERT_TRUE(two.Validate().ok()) << two.Validate();
  const ShardView a2(two, 0);
  const ShardView b2(two, 1);
  EXPECT_EQ(StoreSlotWords(&a2, words.data()), 1366u - 683u);
  for (uint32_t s = 0; s < 4096; ++s) EXPECT_EQ(words[s], s < 683 ? 1 : 0) << "slot " << s;
  std::vector<uint8_t> at_b(proto::kMaxSlots, 0);
  StoreSlotWords(&b2, at_b.data());
  for (uint32_t s = 0; s < 4096; ++s) {
    EXPECT_EQ(at_b[s], s >= 683 && s < 2731 ? 1 : 0) << "slot " << s;
    EXPECT_FALSE(words[s] == 1 && at_b[s] == 1) << "slot " << s << " served twice";
  }

  EXPECT_EQ(StoreSlotWords(nullptr, words.data()), 683u);
  EXPECT_EQ(std::count(words.begin(), words.end(), 0), proto::kMaxSlots);
}

}  // namespace
}  // namespace kvnode::server
