// The shard map: slot hashing, the even split, validation of every rule, the
// wire form's round trip, truncation and random input.
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::proto {
namespace {

ShardMap Three() { return *EvenSplit("c1", 4096, {"a", "b", "c"}); }

TEST(SlotOf, IsStableAndSpreadsKeys) {
  // Fixed forever: nodes and clients of different builds must agree.
  EXPECT_EQ(SlotOf("key-1", 4096), SlotOf("key-1", 4096));
  std::vector<int> hits(16);
  for (int i = 0; i < 16000; ++i) ++hits[SlotOf("key-" + std::to_string(i), 16)];
  for (int h : hits) {
    EXPECT_GT(h, 800);
    EXPECT_LT(h, 1200);
  }
}

TEST(EvenSplit, GivesEachNodeOneRunAndTheRemainderToTheFirst) {
  ShardMap m = *EvenSplit("c1", 10, {"a", "b", "c"});
  ASSERT_EQ(m.ranges.size(), 3u);
  EXPECT_EQ(m.SlotsOwnedBy(0), 4u);
  EXPECT_EQ(m.SlotsOwnedBy(1), 3u);
  EXPECT_EQ(m.SlotsOwnedBy(2), 3u);
  EXPECT_EQ(m.OwnerOf(0), 0);
  EXPECT_EQ(m.OwnerOf(3), 0);
  EXPECT_EQ(m.OwnerOf(4), 1);
  EXPECT_EQ(m.OwnerOf(9), 2);
  EXPECT_EQ(m.IndexOf("c"), 2);
  EXPECT_FALSE(m.IndexOf("d").has_value());
}

TEST(EvenSplit, RefusesMoreNodesThanSlotsAndBadNames) {
  EXPECT_FALSE(EvenSplit("c1", 2, {"a", "b", "c"}).ok());
  EXPECT_FALSE(EvenSplit("c1", 16, {"a", "a"}).ok());
  EXPECT_FALSE(EvenSplit("c1", 16, {"a/b"}).ok());
  EXPECT_FALSE(EvenSplit("", 16, {"a"}).ok());
  EXPECT_FALSE(EvenSplit("c1", 0, {"a"}).ok());
  EXPECT_FALSE(EvenSplit("c1", kMaxSlots + 1, {"a"}).ok());
  EXPECT_FALSE(EvenSplit("c1", 16, {}).ok());
}

TEST(ShardMapValidate, NamesWhatIsWrong) {
  struct Case {
    const char* want;
    void (*edit)(ShardMap&);
  };
  const Case cases[] = {
      {"epoch is 0", [](ShardMap& m) { m.epoch = 0; }},
      {"does not start at slot 0", [](ShardMap& m) { m.ranges[0].first_slot = 1; }},
      {"names node index 7", [](ShardMap& m) { m.ranges[1].node = 7; }},
      {"does not start after", [](ShardMap& m) { m.ranges[2].first_slot = 5; }},
      {"'a' twice", [](ShardMap& m) { m.nodes[1].node_id = "a"; }},
      {"may hold only", [](ShardMap& m) { m.nodes[1].node_id = "b\n"; }},
      {"starts at slot 5000", [](ShardMap& m) { m.ranges[2].first_slot = 5000; }},
  };
  for (const Case& c : cases) {
    ShardMap m = Three();
    c.edit(m);
    absl::Status s = m.Validate();
    EXPECT_FALSE(s.ok()) << c.want;
    EXPECT_NE(s.message().find(c.want), std::string_view::npos) << s;
    std::string out;
    EXPECT_FALSE(EncodeShardMap(m, &out).ok()) << c.want;
  }
}

TEST(ShardMap, NewerOrdersByEpochThenMembership) {
  ShardMap a = Three(), b = Three();
  a.epoch = 2;
  b.epoch = 1;
  b.members_revision = 99;
  EXPECT_TRUE(Newer(a, b));
  EXPECT_FALSE(Newer(b, a));
  b.epoch = 2;
  EXPECT_TRUE(Newer(b, a));
  EXPECT_FALSE(Newer(a, a));
}

TEST(ShardMapWire, RoundTripsAndRefusesEveryTruncation) {
  ShardMap m = Three();
  m.epoch = 9;
  m.members_revision = 1234;
  m.nodes[2].endpoint = "[::1]:7002";
  m.nodes[2].alive = true;
  m.nodes[2].generation = 3;
  std::string bytes;
  ASSERT_TRUE(EncodeShardMap(m, &bytes).ok());
  absl::StatusOr<ShardMap> back = DecodeShardMap(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeShardMap(bytes.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeShardMap(bytes + "x").ok());
}

TEST(ShardMapWire, RandomBytesNeverDecodeToAnInvalidMap) {
  std::mt19937_64 rng(7);
  std::string good;
  ASSERT_TRUE(EncodeShardMap(Three(), &good).ok());
  for (int i = 0; i < 20000; ++i) {
    std::string b = good;
    for (int k = 0; k < 3; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    absl::StatusOr<ShardMap> m = DecodeShardMap(b);
    if (m.ok()) {
      EXPECT_TRUE(m->Validate().ok());
      for (uint32_t s = 0; s < m->num_slots; s += 97) EXPECT_LT(m->OwnerOf(s), m->nodes.size());
    }
  }
}

}  // namespace
}  // namespace kvnode::proto
