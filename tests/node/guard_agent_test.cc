// The node's guard agent (node/src/guard_agent.h) without etcd or a server:
// whether a plan and a map want the guard up (GuardWanted), and that the
// agent asks the server only when that changes, keeps what the server
// answered, and asks again after a refused raise.
#include "guard_agent.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvnode/proto/shard_map.h"

namespace kvnode::node {
namespace {

using cluster::MigrationPlan;
using cluster::MigrationState;
using cluster::MoveState;

// a and b split 4096 slots at 2048; the map at `epoch` gives [1024, 1087]
// to b when `moved`.
std::shared_ptr<const server::ShardView> ViewOfA(uint64_t epoch, bool moved) {
  absl::StatusOr<proto::ShardMap> m = proto::EvenSplit("c1", 4096, {"a", "b"});
  EXPECT_TRUE(m.ok()) << m.status();
  m->epoch = epoch;
  if (moved) {
    m->ranges = {{0, 0}, {1024, 1}, {1088, 0}, {2048, 1}};
  }
  EXPECT_TRUE(m->Validate().ok()) << m->Validate();
  return server::ShardView::ForNode(*m, "a");
}

// One move of [1024, 1087] from a to b.
MigrationPlan Plan(MigrationState state, MoveState move) {
  MigrationPlan p;
  p.migration_id = std::string("m-1");
  p.state = state;
  p.moves.resize(1);
  p.moves[0].first = 1024;
  p.moves[0].last = 1087;
  p.moves[0].from = std::string("a");
  p.moves[0].to = std::string("b");
  p.moves[0].state = move;
  return p;
}

TEST(GuardWanted, WhileAMoveFromTheNodeCopiesOrItsMapLags) {
  const auto before = ViewOfA(1, false);
  const auto after = ViewOfA(2, true);
  EXPECT_FALSE(GuardWanted(std::nullopt, "a", before.get()));
  EXPECT_FALSE(GuardWanted(Plan(MigrationState::kRunning, MoveState::kPending), "a", before.get()));
  EXPECT_TRUE(GuardWanted(Plan(MigrationState::kRunning, MoveState::kCopying), "a", before.get()));
  EXPECT_TRUE(GuardWanted(Plan(MigrationState::kRunning, MoveState::kCopying), "a", nullptr));
  EXPECT_FALSE(GuardWanted(Plan(MigrationState::kRunning, MoveState::kCopying), "b", before.get()))
      << "the target gives nothing away";
  EXPECT_FALSE(GuardWanted(Plan(MigrationState::kStopped, MoveState::kCopying), "a", before.get()));
  // Committed: up until the node serves the map that gives the slots away.
  EXPECT_TRUE(GuardWanted(Plan(MigrationState::kRunning, MoveState::kDone), "a", before.get()));
  EXPECT_FALSE(GuardWanted(Plan(MigrationState::kRunning, MoveState::kDone), "a", after.get()));
  EXPECT_TRUE(GuardWanted(Plan(MigrationState::kDone, MoveState::kDone), "a", before.get()));
  EXPECT_FALSE(GuardWanted(Plan(MigrationState::kDone, MoveState::kDone), "a", after.get()));
  EXPECT_FALSE(GuardWanted(Plan(MigrationState::kAborted, MoveState::kAborted), "a", before.get()));
}

struct Asks {
  std::vector<bool> ups;
  std::vector<std::function<void(absl::Status)>> done;
};

GuardAgent::GuardFn Recorder(Asks* asks) {
  return [asks](bool up, std::function<void(absl::Status)> done) {
    asks->ups.push_back(up);
    asks->done.push_back(std::move(done));
  };
}

TEST(GuardAgent, AsksOnlyOnChangesAndKeepsTheAnswer) {
  GuardAgent agent("a");
  Asks asks;
  agent.OnView(ViewOfA(1, false));
  agent.OnPlan(Plan(MigrationState::kRunning, MoveState::kCopying));
  EXPECT_TRUE(agent.wanted());
  EXPECT_TRUE(asks.ups.empty());
  agent.SetGuard(Recorder(&asks));  // the server runs: what came meanwhile
  ASSERT_EQ(asks.ups, std::vector<bool>{true});
  EXPECT_FALSE(agent.held());
  asks.done[0](absl::OkStatus());
  EXPECT_TRUE(agent.held());
  agent.OnPlan(Plan(MigrationState::kRunning, MoveState::kCopying));  // no change
  agent.OnPlan(Plan(MigrationState::kRunning, MoveState::kDone));     // map not here yet
  EXPECT_EQ(asks.ups.size(), 1u);
  agent.OnView(ViewOfA(2, true));
  ASSERT_EQ(asks.ups, (std::vector<bool>{true, false}));
  asks.done[1](absl::OkStatus());
  EXPECT_FALSE(agent.wanted());
  EXPECT_FALSE(agent.held());
}

TEST(GuardAgent, ARefusedRaiseIsAskedAgain) {
  GuardAgent agent("a");
  Asks asks;
  agent.SetGuard(Recorder(&asks));
  agent.OnView(ViewOfA(1, false));
  agent.OnPlan(Plan(MigrationState::kRunning, MoveState::kCopying));
  ASSERT_EQ(asks.ups, std::vector<bool>{true});
  asks.done[0](absl::FailedPreconditionError("a live upgrade is in progress"));
  EXPECT_FALSE(agent.held());
  agent.OnView(ViewOfA(1, false));  // the next map (or plan) asks again
  ASSERT_EQ(asks.ups, (std::vector<bool>{true, true}));
  // A late answer to an older ask is not taken.
  asks.done[0](absl::OkStatus());
  EXPECT_FALSE(agent.held());
  asks.done[1](absl::OkStatus());
  EXPECT_TRUE(agent.held());
}

}  // namespace
}  // namespace kvnode::node
