// UpgradeMetrics: counters survive a handoff by being added on the new side,
// last-upgrade phase durations are replaced; NodeCompat reflects storage's
// layout and the test incompatibilities.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "kvnode/node/node.h"
#include "kvnode/storage/format.h"

namespace kvnode::upgrade {
namespace {

uint64_t Find(const std::vector<std::pair<std::string, uint64_t>>& v, const std::string& k) {
  for (const auto& [n, x] : v) {
    if (n == k) return x;
  }
  return ~uint64_t{0};
}

TEST(UpgradeMetrics, CountersAddAndLastPhasesReplaceAcrossAHandoff) {
  UpgradeMetrics old_side;
  old_side.Add(UpgradeMetrics::kClientsMigrated, 8);
  old_side.Add(UpgradeMetrics::kRefused);
  old_side.SetLast("o_pause", absl::Milliseconds(12));
  std::vector<std::pair<std::string, uint64_t>> exported;
  old_side.ExportTo(&exported);
  EXPECT_EQ(Find(exported, "upgrade.clients_migrated"), 8u);
  EXPECT_EQ(Find(exported, "upgrade.last_us.o_pause"), 12000u);

  UpgradeMetrics new_side;
  new_side.Add(UpgradeMetrics::kClientsMigrated, 2);
  new_side.SetLast("o_pause", absl::Milliseconds(99));
  exported.emplace_back("ops_put", 5);            // not ours: ignored
  exported.emplace_back("upgrade.unknown_x", 7);  // unknown: ignored
  new_side.ImportFrom(exported);
  EXPECT_EQ(new_side.Get(UpgradeMetrics::kClientsMigrated), 10u);
  EXPECT_EQ(new_side.Get(UpgradeMetrics::kRefused), 1u);
  std::vector<std::pair<std::string, uint64_t>> again;
  new_side.ExportTo(&again);
  EXPECT_EQ(Find(again, "upgrade.last_us.o_pause"), 12000u);  // replaced, not added

  bool saw_phase = false;
  for (const server::ExtraStat& e : new_side.Render()) {
    if (e.name == "upgrade_last_phase_seconds" && e.labels == "phase=\"o_pause\"") {
      saw_phase = true;
      EXPECT_DOUBLE_EQ(e.value, 0.012);
    }
  }
  EXPECT_TRUE(saw_phase);
}

TEST(UpgradeMetrics, LastPhasesTextListsEveryPhaseByNameInMilliseconds) {
  UpgradeMetrics m;
  EXPECT_EQ(m.LastPhasesText(), "");
  m.SetLast("o_pause", absl::Microseconds(2500));
  m.SetLast("n_attach", absl::Milliseconds(81));
  EXPECT_EQ(m.LastPhasesText(), "n_attach=81.0 o_pause=2.5");
  m.ClearLast();
  EXPECT_EQ(m.LastPhasesText(), "");
}

TEST(NodeCompat, ReflectsStorageAndTestIncompatibility) {
  absl::StatusOr<Compat> c = NodeCompat("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arena_layout_version, storage::kLayoutVersion);
  EXPECT_TRUE(c->Validate().ok());
  absl::StatusOr<Compat> bumped = NodeCompat("layout");
  ASSERT_TRUE(bumped.ok());
  EXPECT_NE(bumped->arena_layout_version, c->arena_layout_version);
  EXPECT_FALSE(NodeCompat("nonsense").ok());
}

}  // namespace
}  // namespace kvnode::upgrade
