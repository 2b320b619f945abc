// A fleet roll (docs/cluster.md, "Fleet roll"): its plan as stored at
// RollKey(cluster), and the two decisions made from it, as pure functions so
// that the node and kvctl judge a plan the same way and tests can drive them:
//
//   ShouldAct  the node's: does this process run its live upgrade for the
//              plan now?
//   Judge      kvctl's: what has become of a node's intent, by its member?
//
// Thread safety: pure values and functions.
#ifndef KVNODE_CLUSTER_ROLL_H_
#define KVNODE_CLUSTER_ROLL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kvnode/cluster/member.h"

namespace kvnode::cluster {

// A plan value larger than this is refused before parsing.
inline constexpr size_t kMaxRollJsonSize = 1 << 20;

enum class RollState { kRunning, kStopped, kAborted, kDone };
enum class RollNodeState { kPending, kUpgrading, kDone, kRolledBack, kFailed };

// "running", "stopped", "aborted", "done".
std::string_view RollStateName(RollState s);
std::optional<RollState> ParseRollState(std::string_view name);
// "pending", "upgrading", "done", "rolled_back", "failed".
std::string_view RollNodeStateName(RollNodeState s);
std::optional<RollNodeState> ParseRollNodeState(std::string_view name);

struct RollNode {
  std::string node_id;
  RollNodeState state = RollNodeState::kPending;
  uint64_t attempt = 0;          // of the last intent; 0 before the first
  uint64_t from_generation = 0;  // the node's generation when the intent was written
  uint64_t to_generation = 0;    // done: the generation that runs build_id
  std::string reason;            // rolled_back / failed: why
  int64_t started_ms = 0;        // the intent's wall time (Unix ms); 0 before it
  int64_t ended_ms = 0;          // its outcome's; 0 while upgrading
  friend bool operator==(const RollNode&, const RollNode&) = default;
};

struct RollPlan {
  std::string roll_id;
  std::string binary;    // absolute path of the new binary on every node's machine
  std::string build_id;  // what a node running it reports
  uint32_t max_unavailable = 1;
  uint32_t gate_s = 10;
  RollState state = RollState::kRunning;
  std::string reason;           // stopped / aborted: why
  std::vector<RollNode> nodes;  // the roll's order
  friend bool operator==(const RollPlan&, const RollPlan&) = default;

  RollNode* node(std::string_view node_id);
  const RollNode* node(std::string_view node_id) const;
};

std::string EncodeRollJson(const RollPlan& plan);
// Errors name `key` and what is wrong (not JSON, a field missing or of the
// wrong type, an unknown state, a node twice, a relative binary path).
absl::StatusOr<RollPlan> DecodeRollJson(std::string_view json, std::string_view key);

// The node's decision: the intent this process carries out now, or nullopt.
// `self` is the process's own member value (generation, build_id);
// `acted_attempt` the last (roll_id, attempt) it acted on.
struct RollIntent {
  std::string roll_id;
  uint64_t attempt = 0;
  std::string binary;
  friend bool operator==(const RollIntent&, const RollIntent&) = default;
};
std::optional<RollIntent> ShouldAct(const RollPlan& plan, const Member& self,
                                    const std::optional<RollIntent>& acted);

// kvctl's view of one upgrading entry, judged from the node's member value
// (nullopt: no member key, the node is down).
struct RollVerdict {
  RollNodeState state = RollNodeState::kUpgrading;  // kUpgrading: still waiting
  uint64_t to_generation = 0;
  std::string reason;
};
RollVerdict Judge(const RollPlan& plan, const RollNode& entry, const std::optional<Member>& member);

// "r-<UTC yyyymmddThhmmss>-<4 hex>".
std::string NewRollId();

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_ROLL_H_
