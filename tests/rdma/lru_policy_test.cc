// Host-only: the registration cache's eviction policy (no device needed).

#include <gtest/gtest.h>

#include "kvnode/rdma/reg_cache.h"

namespace kvnode::rdma {
namespace {

RegKey K(uintptr_t addr, uint64_t len = 100) { return RegKey{addr, len, IBV_ACCESS_LOCAL_WRITE}; }
auto NoneBusy = [](const RegKey&) { return false; };

TEST(LruPolicy, EvictsLeastRecentlyUsedFirstUntilTheIncomingBytesFit) {
  LruPolicy p(300);
  p.Insert(K(1), 100);
  p.Insert(K(2), 100);
  p.Insert(K(3), 100);
  EXPECT_EQ(p.bytes(), 300u);
  EXPECT_TRUE(p.Touch(K(1)));  // order now 1, 3, 2 (most recent first)
  EXPECT_EQ(p.Order(), (std::vector<RegKey>{K(1), K(3), K(2)}));
  EXPECT_TRUE(p.PickVictims(0, NoneBusy).empty());
  EXPECT_EQ(p.PickVictims(100, NoneBusy), std::vector<RegKey>{K(2)});
  EXPECT_EQ(p.PickVictims(150, NoneBusy), (std::vector<RegKey>{K(2), K(3)}));
}

TEST(LruPolicy, NeverPicksEntriesInUse) {
  LruPolicy p(200);
  p.Insert(K(1), 100);
  p.Insert(K(2), 100);
  auto busy1 = [](const RegKey& k) { return k.addr == 1; };
  // 1 is the LRU but busy: 2 goes instead, and that is not enough for 150.
  std::vector<RegKey> v = p.PickVictims(150, busy1);
  EXPECT_EQ(v, std::vector<RegKey>{K(2)});
  EXPECT_GT(p.bytes() - 100 + 150, p.budget());
}

TEST(LruPolicy, KeysDifferByLengthAndAccessAndReinsertReplaces) {
  LruPolicy p(1000);
  p.Insert(RegKey{1, 100, 1}, 100);
  p.Insert(RegKey{1, 100, 3}, 100);
  p.Insert(RegKey{1, 200, 1}, 200);
  EXPECT_EQ(p.size(), 3u);
  p.Insert(RegKey{1, 100, 1}, 100);
  EXPECT_EQ(p.size(), 3u);
  EXPECT_EQ(p.bytes(), 400u);
  p.Erase(RegKey{1, 200, 1});
  EXPECT_EQ(p.bytes(), 200u);
  EXPECT_FALSE(p.Touch(RegKey{1, 200, 1}));
}

TEST(LruPolicy, OverlappingFindsEveryRegistrationTouchingARange) {
  LruPolicy p(1000);
  p.Insert(K(0, 100), 100);
  p.Insert(K(100, 100), 100);
  p.Insert(K(300, 50), 50);
  auto v = p.Overlapping(150, 200);  // [150, 350)
  std::sort(v.begin(), v.end(), [](const RegKey& a, const RegKey& b) { return a.addr < b.addr; });
  EXPECT_EQ(v, (std::vector<RegKey>{K(100, 100), K(300, 50)}));
  EXPECT_TRUE(p.Overlapping(200, 100).empty());
}

}  // namespace
}  // namespace kvnode::rdma
