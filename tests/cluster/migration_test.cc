// Slot migration's plan (cluster/migration.h): the planners against the
// invariants migration.h numbers, the plan's JSON, and applying moves to
// the map. No etcd: kvctl's dry run against a real one is in
// kvctl_migrate_test.cc.
#include "kvnode/cluster/migration.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvnode/cluster/map_json.h"
#include "nlohmann/json.hpp"

namespace kvnode::cluster {
namespace {

using nlohmann::json;
using proto::ShardMap;

ShardMap Even(uint32_t slots, const std::vector<std::string>& ids) {
  auto m = proto::EvenSplit("c1", slots, ids);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

// A map with `ranges` given as {first_slot, node index}.
ShardMap Custom(uint32_t slots, const std::vector<std::string>& ids,
                const std::vector<proto::SlotRange>& ranges) {
  ShardMap m = Even(slots, ids);
  m.ranges = ranges;
  EXPECT_TRUE(m.Validate().ok()) << m.Validate();
  return m;
}

// Slots per node id.
std::map<std::string, uint32_t> CountsOf(const ShardMap& m) {
  std::map<std::string, uint32_t> c;
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    c[m.nodes[i].node_id] = m.SlotsOwnedBy(static_cast<uint16_t>(i));
  }
  return c;
}

uint32_t Spread(const ShardMap& m) {
  auto c = CountsOf(m);
  auto [lo, hi] = std::minmax_element(
      c.begin(), c.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return hi->second - lo->second;
}

uint32_t Moved(const MigrationPlan& p) {
  uint32_t n = 0;
  for (const SlotMove& m : p.moves) n += m.slots();
  return n;
}

// Slots each node gives.
std::map<std::string, uint32_t> Given(const MigrationPlan& p) {
  std::map<std::string, uint32_t> g;
  for (const SlotMove& m : p.moves) g[m.from] += m.slots();
  return g;
}

std::string OwnerOf(const ShardMap& m, uint32_t slot) { return m.nodes[m.OwnerOf(slot)].node_id; }

// Invariants 1-4 of migration.h for `mig` planned from `map`, and that the
// moves applied one by one, in plan order and in a shuffled one, give the
// target.
void CheckMigration(const ShardMap& map, const Migration& mig, uint32_t max_slots) {
  const MigrationPlan& p = mig.plan;
  ASSERT_TRUE(mig.target.Validate().ok()) << mig.target.Validate();
  EXPECT_EQ(mig.target.epoch, map.epoch);
  EXPECT_EQ(p.from_epoch, map.epoch);
  for (size_t i = 1; i < mig.target.ranges.size(); ++i) {
    EXPECT_NE(mig.target.ranges[i].node, mig.target.ranges[i - 1].node) << "unmerged at " << i;
  }
  std::vector<const SlotMove*> by_slot(map.num_slots, nullptr);
  for (const SlotMove& m : p.moves) {
    EXPECT_LE(m.slots(), max_slots);
    EXPECT_EQ(m.state, MoveState::kPending);
    for (uint32_t s = m.first; s <= m.last; ++s) {
      ASSERT_LT(s, map.num_slots);
      EXPECT_EQ(by_slot[s], nullptr) << "slot " << s << " in two moves";
      by_slot[s] = &m;
    }
  }
  for (uint32_t s = 0; s < map.num_slots; ++s) {
    if (by_slot[s] == nullptr) {
      ASSERT_EQ(OwnerOf(mig.target, s), OwnerOf(map, s)) << "slot " << s << " changed unplanned";
    } else {
      ASSERT_EQ(OwnerOf(map, s), by_slot[s]->from) << "slot " << s;
      ASSERT_EQ(OwnerOf(mig.target, s), by_slot[s]->to) << "slot " << s;
    }
  }
  // No move: nothing to apply. The target is the map with its ranges merged
  // (and a removed node of no slots dropped), checked slot by slot above.
  if (p.moves.empty()) return;
  std::vector<size_t> order(p.moves.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (int round = 0; round < 2; ++round) {
    if (round == 1) std::shuffle(order.begin(), order.end(), std::mt19937(7));
    ShardMap cur = map;
    for (size_t i : order) {
      auto next = ApplyMove(cur, p, p.moves[i]);
      ASSERT_TRUE(next.ok()) << next.status();
      cur = std::move(*next);
    }
    EXPECT_EQ(cur, mig.target) << (round == 0 ? "in plan order" : "shuffled") << "\n"
                               << EncodeMapJson(cur) << "\n"
                               << EncodeMapJson(mig.target) << "\nfrom " << EncodeMapJson(map)
                               << " moves " << p.moves.size();
  }
}

TEST(PlanAddNode, ThreeToFourMovesAQuarterTakenEvenlyFromTheEndOfEachNode) {
  const ShardMap map = Even(4096, {"a", "b", "c"});
  auto mig = PlanAddNode(map, "d");
  ASSERT_TRUE(mig.ok()) << mig.status();
  CheckMigration(map, *mig, 64);
  EXPECT_EQ(mig->plan.kind, MigrationKind::kAddNode);
  EXPECT_EQ(mig->plan.node, "d");
  const uint32_t moved = Moved(mig->plan);
  EXPECT_NEAR(moved, 4096 / 4, 41) << "25 % +- 1 % of 4096";
  EXPECT_EQ(moved, 1024u);
  for (const auto& [from, slots] : Given(mig->plan)) {
    EXPECT_NEAR(slots, moved / 3.0, 1.0) << from;
  }
  EXPECT_EQ(Given(mig->plan).size(), 3u);
  for (const SlotMove& m : mig->plan.moves) EXPECT_EQ(m.to, "d");
  // One run from the end of each node: a d b d c d.
  EXPECT_EQ(mig->target.ranges.size(), 6u);
  EXPECT_EQ(mig->target.nodes.back().node_id, "d");
  EXPECT_LE(Spread(mig->target), 1u);
  // a's run is its last 342 slots.
  EXPECT_EQ(OwnerOf(mig->target, 1023), "a");
  EXPECT_EQ(OwnerOf(mig->target, 1024), "d");
  EXPECT_EQ(OwnerOf(mig->target, 1365), "d");
}

TEST(PlanAddNode, TakesInProportionFromASkewedMapAndAcrossRanges) {
  // a: 0..99 and 300..399 (200), b: 100..299 (200), c: 400..999 (600).
  const ShardMap map = Custom(1000, {"a", "b", "c"}, {{0, 0}, {100, 1}, {300, 0}, {400, 2}});
  auto mig = PlanAddNode(map, "d");
  ASSERT_TRUE(mig.ok()) << mig.status();
  CheckMigration(map, *mig, 64);
  EXPECT_EQ(Moved(mig->plan), 250u);
  auto g = Given(mig->plan);
  EXPECT_EQ(g["a"], 50u);
  EXPECT_EQ(g["b"], 50u);
  EXPECT_EQ(g["c"], 150u);
  EXPECT_EQ(OwnerOf(mig->target, 350), "d");  // from the end of a's last range
  EXPECT_EQ(OwnerOf(mig->target, 349), "a");
}

TEST(PlanRemoveNode, FourToThreeSpreadsEvenlyInContiguousPieces) {
  const ShardMap map = Even(4096, {"a", "b", "c", "d"});
  for (const char* gone : {"a", "b", "d"}) {
    SCOPED_TRACE(gone);
    auto mig = PlanRemoveNode(map, gone);
    ASSERT_TRUE(mig.ok()) << mig.status();
    CheckMigration(map, *mig, 64);
    EXPECT_EQ(Moved(mig->plan), 1024u);
    EXPECT_FALSE(mig->target.IndexOf(gone).has_value());
    EXPECT_EQ(mig->target.nodes.size(), 3u);
    EXPECT_LE(Spread(mig->target), 1u);
    for (const SlotMove& m : mig->plan.moves) EXPECT_EQ(m.from, gone);
    // One piece per receiver, and a piece next to a neighbour merges with
    // it: b (between a and c) leaves a+ d c+ d; an end node one range more.
    EXPECT_EQ(mig->target.ranges.size(), std::string(gone) == "b" ? 4u : 5u);
  }
}

TEST(PlanRemoveNode, EvensASkewedMapAndRemovesANodeOfNoSlots) {
  // a 100, b 700, c 200, d 0 of 1000: d's 0 and then c's 200 go to a first.
  const ShardMap map = Custom(1000, {"a", "b", "c", "d"}, {{0, 0}, {100, 1}, {800, 2}});
  auto mig = PlanRemoveNode(map, "c");
  ASSERT_TRUE(mig.ok()) << mig.status();
  CheckMigration(map, *mig, 64);
  auto c = CountsOf(mig->target);
  EXPECT_EQ(c["a"] + c["d"], 300u);
  EXPECT_LE(std::max(c["a"], c["d"]) - std::min(c["a"], c["d"]), 1u);
  EXPECT_EQ(c["b"], 700u);  // above the level: receives nothing
  auto none = PlanRemoveNode(map, "d");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->plan.moves.empty());
  EXPECT_FALSE(none->target.IndexOf("d").has_value());
  EXPECT_EQ(CountsOf(none->target)["b"], 700u);
}

TEST(PlanRebalance, EvensASkewedMapMovingOnlyTheExcess) {
  // a 3000, b 500, c 596 of 4096.
  const ShardMap map = Custom(4096, {"a", "b", "c"}, {{0, 0}, {3000, 1}, {3500, 2}});
  auto mig = PlanRebalance(map);
  ASSERT_TRUE(mig.ok()) << mig.status();
  CheckMigration(map, *mig, 64);
  EXPECT_LE(Spread(mig->target), 1u);
  EXPECT_EQ(Moved(mig->plan), 3000u - 1366u);  // a keeps the one extra slot
  auto g = Given(mig->plan);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g["a"], 1634u);
  EXPECT_EQ(CountsOf(mig->target)["a"], 1366u);
  EXPECT_EQ(mig->plan.node, "");
}

TEST(PlanRebalance, FillsANodeOfNoSlotsAndLeavesABalancedMapAlone) {
  const ShardMap empty_d = Custom(4096, {"a", "b", "c", "d"}, {{0, 0}, {1366, 1}, {2731, 2}});
  auto mig = PlanRebalance(empty_d);
  ASSERT_TRUE(mig.ok()) << mig.status();
  CheckMigration(empty_d, *mig, 64);
  EXPECT_EQ(CountsOf(mig->target)["d"], 1024u);
  EXPECT_EQ(Moved(mig->plan), 1024u);
  auto balanced = PlanRebalance(Even(4096, {"a", "b", "c"}));
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  EXPECT_TRUE(balanced->plan.moves.empty());
  EXPECT_EQ(balanced->target, Even(4096, {"a", "b", "c"}));
}

// A random valid map: 1..12 nodes, 1..5000 slots (at least one per node),
// 1..40 ranges of random owners (some nodes may own nothing).
ShardMap RandomMap(std::mt19937& rng) {
  const size_t n = std::uniform_int_distribution<size_t>(1, 12)(rng);
  std::vector<std::string> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back(absl::StrCat("n", i));
  const uint32_t slots =
      std::uniform_int_distribution<uint32_t>(static_cast<uint32_t>(n), 5000)(rng);
  ShardMap m = Even(slots, ids);
  const size_t cuts =
      std::uniform_int_distribution<size_t>(0, std::min<size_t>(39, slots - 1))(rng);
  std::vector<uint32_t> firsts = {0};
  for (size_t i = 0; i < cuts; ++i) {
    firsts.push_back(std::uniform_int_distribution<uint32_t>(1, slots - 1)(rng));
  }
  std::sort(firsts.begin(), firsts.end());
  firsts.erase(std::unique(firsts.begin(), firsts.end()), firsts.end());
  m.ranges.clear();
  for (uint32_t f : firsts) {
    m.ranges.push_back(
        {f, static_cast<uint16_t>(std::uniform_int_distribution<size_t>(0, n - 1)(rng))});
  }
  EXPECT_TRUE(m.Validate().ok()) << m.Validate();
  return m;
}

TEST(MigrationPlanners, HoldTheirInvariantsOnRandomMaps) {
  std::mt19937 rng(20261207);
  for (int round = 0; round < 300; ++round) {
    SCOPED_TRACE(round);
    const ShardMap map = RandomMap(rng);
    const size_t n = map.nodes.size();
    const auto before = CountsOf(map);
    MigrationOptions o;
    o.max_slots_per_move = std::uniform_int_distribution<uint32_t>(1, 200)(rng);

    if (map.num_slots >= n + 1) {
      auto add = PlanAddNode(map, "new", o);
      ASSERT_TRUE(add.ok()) << add.status();
      CheckMigration(map, *add, o.max_slots_per_move);
      const uint32_t total = map.num_slots / static_cast<uint32_t>(n + 1);
      EXPECT_EQ(CountsOf(add->target)["new"], total);
      auto given = Given(add->plan);
      for (const auto& [id, count] : before) {
        // Each gives its proportional share, rounded either way.
        EXPECT_NEAR(given[id], 1.0 * count * total / map.num_slots, 1.0) << id;
      }
    }

    if (n >= 2) {
      const std::string gone =
          map.nodes[std::uniform_int_distribution<size_t>(0, n - 1)(rng)].node_id;
      auto remove = PlanRemoveNode(map, gone, o);
      ASSERT_TRUE(remove.ok()) << remove.status();
      CheckMigration(map, *remove, o.max_slots_per_move);
      EXPECT_EQ(Moved(remove->plan), before.at(gone));
      // Water-filling: the others end no further apart than they were, and
      // at most one apart when the removed node's slots sufficed to level them.
      uint32_t lo = UINT32_MAX, hi = 0;
      for (const auto& [id, count] : before) {
        if (id == gone) continue;
        lo = std::min(lo, count);
        hi = std::max(hi, count);
      }
      EXPECT_LE(Spread(remove->target), std::max(1u, hi - lo));
      // Every receiver gets one contiguous run of the removed node's slots
      // in slot order: pieces of one receiver are adjacent in the plan.
      std::map<std::string, size_t> last_piece;
      for (size_t i = 0; i < remove->plan.moves.size(); ++i) {
        const std::string& to = remove->plan.moves[i].to;
        if (last_piece.count(to) != 0) {
          EXPECT_EQ(last_piece[to], i - 1) << to;
        }
        last_piece[to] = i;
      }
    }

    auto rebalance = PlanRebalance(map, o);
    ASSERT_TRUE(rebalance.ok()) << rebalance.status();
    CheckMigration(map, *rebalance, o.max_slots_per_move);
    EXPECT_LE(Spread(rebalance->target), 1u);
    // The fewest slots: the excess above the shares, the larger shares
    // kept by the nodes that own most.
    std::vector<uint32_t> counts;
    for (const auto& [id, count] : before) counts.push_back(count);
    std::sort(counts.rbegin(), counts.rend());
    uint32_t excess = 0;
    for (size_t k = 0; k < n; ++k) {
      const uint32_t share =
          map.num_slots / static_cast<uint32_t>(n) + (k < map.num_slots % n ? 1 : 0);
      if (counts[k] > share) excess += counts[k] - share;
    }
    EXPECT_EQ(Moved(rebalance->plan), excess);
  }
}

TEST(MigrationChunks, NoMoveAboveTheLimitAndEvenPiecesOfARun) {
  const ShardMap map = Even(4096, {"a", "b", "c"});
  for (uint32_t max : {1u, 7u, 100u, 342u, 65536u}) {
    SCOPED_TRACE(max);
    MigrationOptions o;
    o.max_slots_per_move = max;
    auto mig = PlanAddNode(map, "d", o);
    ASSERT_TRUE(mig.ok()) << mig.status();
    CheckMigration(map, *mig, max);
    EXPECT_EQ(Moved(mig->plan), 1024u);
    // Each donor's run of 341 or 342 slots in ceil(run / max) pieces whose
    // sizes differ by at most one.
    std::map<std::string, std::vector<uint32_t>> pieces;
    for (const SlotMove& m : mig->plan.moves) pieces[m.from].push_back(m.slots());
    for (const auto& [from, sizes] : pieces) {
      const uint32_t run = std::accumulate(sizes.begin(), sizes.end(), 0u);
      EXPECT_EQ(sizes.size(), (run + max - 1) / max) << from;
      auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
      EXPECT_LE(*hi - *lo, 1u) << from;
    }
  }
  MigrationOptions zero;
  zero.max_slots_per_move = 0;
  auto refused = PlanAddNode(map, "d", zero);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_NE(refused.status().message().find("--max_slots_per_move 0"), absl::string_view::npos);
}

TEST(MigrationPlanners, RefuseWithTheReason) {
  const ShardMap three = Even(4096, {"a", "b", "c"});
  ShardMap bad_map = three;
  bad_map.epoch = 0;
  std::vector<std::string> many;
  for (size_t i = 0; i < proto::kMaxMapNodes; ++i) many.push_back(absl::StrCat("n", i));
  const ShardMap full = Even(4096, many);
  MigrationOptions fast;
  fast.rate_mb_s = 2'000'000;
  struct Case {
    const char* name;
    absl::StatusOr<Migration> got;
    const char* reason;
  };
  const Case cases[] = {
      {"id in the map", PlanAddNode(three, "b"), "node 'b' is in the map already (nodes: a, b, c)"},
      {"bad name", PlanAddNode(three, "d/1"), "may hold only A-Z a-z 0-9 . _ -"},
      {"empty name", PlanAddNode(three, ""), "must be 1..64 bytes"},
      {"long name", PlanAddNode(three, std::string(65, 'x')), "must be 1..64 bytes"},
      {"full map", PlanAddNode(full, "x"), "the map has 64 nodes, the most a map holds"},
      {"too few slots", PlanAddNode(Even(3, {"a", "b", "c"}), "d"),
       "the map's 3 slots leave none for node 'd' among 4 nodes"},
      {"not in the map", PlanRemoveNode(three, "z"), "node 'z' is not in the map (nodes: a, b, c)"},
      {"last node", PlanRemoveNode(Even(16, {"a"}), "a"),
       "node 'a' is the map's last node: a cluster keeps at least one"},
      {"bad map add", PlanAddNode(bad_map, "d"),
       "the map does not validate: shard map: epoch is 0"},
      {"bad map remove", PlanRemoveNode(bad_map, "a"), "the map does not validate"},
      {"bad map rebalance", PlanRebalance(bad_map), "the map does not validate"},
      {"rate", PlanRebalance(three, fast), "--rate_mb_s 2000000 is above 1000000"},
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(absl::IsInvalidArgument(c.got.status())) << c.name << ": " << c.got.status();
    EXPECT_NE(c.got.status().message().find(c.reason), absl::string_view::npos)
        << c.name << ": " << c.got.status();
  }
}

TEST(ApplyMove, RefusesAMoveAppliedTwiceOrOutsideTheMap) {
  const ShardMap map = Even(4096, {"a", "b", "c"});
  auto mig = PlanAddNode(map, "d");
  ASSERT_TRUE(mig.ok());
  const SlotMove& first = mig->plan.moves[0];
  auto once = ApplyMove(map, mig->plan, first);
  ASSERT_TRUE(once.ok()) << once.status();
  EXPECT_EQ(once->nodes.back().node_id, "d");  // joins with its first move
  EXPECT_EQ(once->epoch, map.epoch);
  auto twice = ApplyMove(*once, mig->plan, first);
  EXPECT_TRUE(absl::IsFailedPrecondition(twice.status())) << twice.status();
  EXPECT_NE(twice.status().message().find("slot 1024 is owned by 'd', not 'a'"),
            absl::string_view::npos)
      << twice.status();
  SlotMove outside = first;
  outside.first = 4000;
  outside.last = 4096;
  EXPECT_TRUE(absl::IsInvalidArgument(ApplyMove(map, mig->plan, outside).status()));
  SlotMove stranger = first;
  stranger.to = "e";  // neither in the map nor the node the plan adds
  EXPECT_TRUE(absl::IsInvalidArgument(ApplyMove(map, mig->plan, stranger).status()));
  SlotMove from_nowhere = first;
  from_nowhere.from = "z";
  EXPECT_TRUE(absl::IsFailedPrecondition(ApplyMove(map, mig->plan, from_nowhere).status()));
}

TEST(ApplyMove, TheRemovedNodeLeavesWithItsLastSlot) {
  const ShardMap map = Even(4096, {"a", "b", "c", "d"});
  auto mig = PlanRemoveNode(map, "b");
  ASSERT_TRUE(mig.ok());
  ShardMap cur = map;
  for (size_t i = 0; i < mig->plan.moves.size(); ++i) {
    EXPECT_TRUE(cur.IndexOf("b").has_value()) << "before move " << i;
    auto next = ApplyMove(cur, mig->plan, mig->plan.moves[i]);
    ASSERT_TRUE(next.ok()) << next.status();
    cur = std::move(*next);
  }
  EXPECT_FALSE(cur.IndexOf("b").has_value());
  EXPECT_EQ(cur, mig->target);
}

MigrationPlan SamplePlan() {
  auto mig = PlanAddNode(Even(4096, {"a", "b", "c"}), "d");
  EXPECT_TRUE(mig.ok());
  MigrationPlan p = mig->plan;
  p.migration_id = "m-20261207T170000-beef";
  p.rate_mb_s = 200;
  p.state = MigrationState::kStopped;
  p.reason = "move 3 failed: \"d\" unreachable";
  p.moves[0].state = MoveState::kDone;
  p.moves[0].attempt = 1;
  p.moves[0].keys = 12345;
  p.moves[0].bytes = 1ull << 40;
  p.moves[1].state = MoveState::kCopying;
  p.moves[2].state = MoveState::kFailed;
  p.moves[2].reason = "copy: connection reset";
  p.moves[3].state = MoveState::kAborted;
  return p;
}

TEST(MigrationJson, RoundTrips) {
  for (MigrationKind kind :
       {MigrationKind::kAddNode, MigrationKind::kRemoveNode, MigrationKind::kRebalance}) {
    MigrationPlan p = SamplePlan();
    p.kind = kind;
    if (kind == MigrationKind::kRebalance) p.node.clear();
    if (kind == MigrationKind::kRemoveNode) {
      p.node = "a";
      for (SlotMove& m : p.moves) m.from = p.node;
    }
    const std::string text = EncodeMigrationJson(p);
    auto back = DecodeMigrationJson(text, "/kvnode/c1/migration");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
    EXPECT_EQ(*back, p);
  }
  const std::string id = NewMigrationId();
  EXPECT_EQ(id.size(), std::string("m-20261207T170000-beef").size()) << id;
  EXPECT_EQ(id.substr(0, 2), "m-");
}

TEST(MigrationJson, RefusesBadValuesWithTheReason) {
  const json good = json::parse(EncodeMigrationJson(SamplePlan()));
  auto with = [&](const std::function<void(json&)>& edit) {
    json j = good;
    edit(j);
    return j.dump();
  };
  struct Case {
    std::string text;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {"", "not valid JSON"},
      {"{\"migration_id\":", "not valid JSON"},
      {"[1,2]", "not a JSON object"},
      {with([](json& j) { j.erase("state"); }), "field 'state' must be a string"},
      {with([](json& j) { j["from_epoch"] = -1; }),
       "field 'from_epoch' must be a non-negative integer"},
      {with([](json& j) { j["from_epoch"] = 0; }), "from_epoch is 0"},
      {with([](json& j) { j["migration_id"] = ""; }), "empty migration_id"},
      {with([](json& j) { j["kind"] = "split"; }), "unknown kind 'split'"},
      {with([](json& j) { j["state"] = "paused"; }), "unknown state 'paused'"},
      {with([](json& j) { j["node"] = "d/x"; }), "may hold only A-Z a-z 0-9 . _ -"},
      {with([](json& j) { j["kind"] = "rebalance"; }),
       "a rebalance names no node, but 'node' is set"},
      {with([](json& j) { j["moves"] = json::object(); }), "field 'moves' must be an array"},
      {with([](json& j) { j["moves"][0] = 7; }), "an entry of 'moves' is not an object"},
      {with([](json& j) { j["moves"][0]["state"] = "moving"; }),
       "move of slots 1024..1080: unknown state 'moving'"},
      {with([](json& j) { j["moves"][0]["first"] = 1081; }),
       "move of slots 1081..1080: not a range within 0..65535"},
      {with([](json& j) { j["moves"][0]["last"] = 65536; }),
       "move of slots 1024..65536: not a range within 0..65535"},
      {with([](json& j) { j["moves"][0]["attempt"] = -1; }),
       "field 'attempt' must be a non-negative integer"},
      {with([](json& j) { j["moves"][0]["keys"] = 1.5; }),
       "field 'keys' must be a non-negative integer"},
      {with([](json& j) { j["moves"][0]["from"] = "d"; }),
       "move of slots 1024..1080 from 'd' to itself"},
      {with([](json& j) { j["moves"][0]["from"] = ""; }), "from '' must be 1..64 bytes"},
      {with([](json& j) { j["moves"][1]["to"] = "b"; }),
       "move of slots 1081..1137 to 'b' in a plan that adds 'd'"},
      {with([](json& j) {
         j["kind"] = "remove_node";
         j["node"] = "a";
       }),
       "from 'b' in a plan that removes 'a'"},
      {with([](json& j) { j["moves"][1]["first"] = 1080; }),
       "moves of slots 1024..1080 and 1080..1137 overlap"},
      {with([](json& j) { j["moves"].push_back(j["moves"][0]); }),
       "moves of slots 1024..1080 and 1024..1080 overlap"},
      {with([](json& j) { j["reason"] = std::string(5000, 'r'); }),
       "field 'reason' is longer than 4096"},
      {std::string(kMaxMigrationJsonSize + 1, ' '), "bytes, above the limit of 1048576"},
  };
  for (const Case& c : cases) {
    auto d = DecodeMigrationJson(c.text, "/kvnode/c1/migration");
    ASSERT_FALSE(d.ok()) << c.reason;
    EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
    EXPECT_NE(d.status().message().find("migration plan at /kvnode/c1/migration: "),
              absl::string_view::npos)
        << d.status();
    EXPECT_NE(d.status().message().find(c.reason), absl::string_view::npos)
        << "want '" << c.reason << "', got: " << d.status();
  }
  // The unedited value decodes: every refusal above is the edit's.
  EXPECT_TRUE(DecodeMigrationJson(good.dump(), "k").ok());
}

}  // namespace
}  // namespace kvnode::cluster
