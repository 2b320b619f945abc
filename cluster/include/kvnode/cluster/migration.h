// Slot migration's plan (docs/cluster.md, "Slot migration"): which slots
// move from which node to which when a node joins, a node leaves, or the
// slot counts are evened out; the plan as stored at MigrationKey(cluster);
// and the map that follows from one finished move. Pure functions, no
// etcd, so that kvctl, the nodes' mover and the tests compute the same
// thing.
//
// The planners' invariants (tests/cluster/migration_test.cc checks each):
//   1. Only the slots of a move change owner; every other slot keeps its
//      node.
//   2. Moves cover disjoint slots and each runs from the node that owns all
//      its slots in the map planned from, so they may be done and applied
//      in any order (ApplyMove), and applying all of them gives the target.
//   3. A move holds at most MigrationOptions::max_slots_per_move slots.
//   4. The target map validates (proto::ShardMap::Validate), its ranges
//      merged where neighbours have one owner, its epoch the map's: the
//      commit that stores a map raises the epoch, not the planner.
//
// Thread safety: pure values and functions.
#ifndef KVNODE_CLUSTER_MIGRATION_H_
#define KVNODE_CLUSTER_MIGRATION_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::cluster {

// A plan value larger than this is refused before parsing; a plan that would
// encode larger is refused by kvctl (fewer, larger moves fit).
inline constexpr size_t kMaxMigrationJsonSize = 1 << 20;

enum class MigrationKind { kAddNode, kRemoveNode, kRebalance };
enum class MigrationState { kRunning, kStopped, kAborted, kDone };
enum class MoveState { kPending, kCopying, kDone, kAborted, kFailed };

// "add_node", "remove_node", "rebalance".
std::string_view MigrationKindName(MigrationKind k);
std::optional<MigrationKind> ParseMigrationKind(std::string_view name);
// "running", "stopped", "aborted", "done".
std::string_view MigrationStateName(MigrationState s);
std::optional<MigrationState> ParseMigrationState(std::string_view name);
// "pending", "copying", "done", "aborted", "failed".
std::string_view MoveStateName(MoveState s);
std::optional<MoveState> ParseMoveState(std::string_view name);

// Slots first..last (inclusive) from node `from` to node `to`.
struct SlotMove {
  uint32_t first = 0;
  uint32_t last = 0;  // >= first
  std::string from;
  std::string to;
  MoveState state = MoveState::kPending;
  uint64_t attempt = 0;  // of the last copy started; 0 before the first
  uint64_t keys = 0;     // copied so far by the current attempt
  uint64_t bytes = 0;    // keys and values, likewise
  std::string reason;    // aborted / failed: why
  uint32_t slots() const { return last - first + 1; }
  friend bool operator==(const SlotMove&, const SlotMove&) = default;
};

struct MigrationPlan {
  std::string migration_id;  // "m-<UTC yyyymmddThhmmss>-<4 hex>" (NewMigrationId)
  MigrationKind kind = MigrationKind::kRebalance;
  std::string node;        // add_node / remove_node: that node; rebalance: empty
  uint64_t rate_mb_s = 0;  // copy rate limit over all moves; 0: unthrottled
  MigrationState state = MigrationState::kRunning;
  std::string reason;       // stopped / aborted: why
  uint64_t from_epoch = 0;  // the map epoch the moves were computed from
  std::vector<SlotMove> moves;
  friend bool operator==(const MigrationPlan&, const MigrationPlan&) = default;
};

struct MigrationOptions {
  // The largest move in slots (--max_slots_per_move): 1..65536, default 64.
  // A move is the mover's unit of work, retry and commit: 64 of 4096 slots
  // is 1/64 of the data.
  uint32_t max_slots_per_move = 64;
  // The copy rate limit in MB/s over all moves (--rate_mb_s): 0..1000000,
  // default 0, unthrottled.
  uint64_t rate_mb_s = 0;

  // InvalidArgument naming the flag.
  absl::Status Validate() const;
};

// What a planner computes: the plan (state running, no migration_id yet:
// the writer sets NewMigrationId()) and the map once every move is done.
struct Migration {
  MigrationPlan plan;
  proto::ShardMap target;
};

// The planners. Each refuses with InvalidArgument and the reason: a map
// that does not validate, options that do not (Validate above), and the
// cases named below.
//
// PlanAddNode: `new_id` joins with floor(slots / (n + 1)) slots, taken from
// the n nodes in proportion to what each owns (largest remainders; a
// balanced 3-node map gives 341 or 342 each of 4096), each from the end of
// its ranges, so a node of one range gives one contiguous run. `new_id` is
// appended to the map's nodes. Refused: a bad name, an id already in the
// map, a map of proto::kMaxMapNodes nodes, fewer slots than n + 1 (the new
// node would get none).
absl::StatusOr<Migration> PlanAddNode(const proto::ShardMap& map, std::string_view new_id,
                                      const MigrationOptions& options = {});

// PlanRemoveNode: `id`'s slots go, in slot order, in one contiguous piece
// per receiver, to the other nodes so that their counts end as even as
// moving only `id`'s slots allows: each slot to the receiver with the fewest
// at that point (from a balanced map, max - min <= 1 after). The first
// piece goes to the owner of the slot before `id`'s first, so that it
// merges. `id` leaves the map's nodes. Refused: an id not in the map, the
// map's last node.
absl::StatusOr<Migration> PlanRemoveNode(const proto::ShardMap& map, std::string_view id,
                                         const MigrationOptions& options = {});

// PlanRebalance: the slot counts end with max - min <= 1, moving the fewest
// slots: the nodes that own most keep floor + 1, the excess of each node
// above its share goes from the end of its ranges to the nodes below
// theirs. A balanced map gives a plan with no moves.
absl::StatusOr<Migration> PlanRebalance(const proto::ShardMap& map,
                                        const MigrationOptions& options = {});

// The map after `move` of `plan` is done: its slots owned by `move.to`
// (appended to the nodes when it is not among them: the node an add_node
// plan adds), ranges merged where neighbours have one owner, and, for a
// remove_node plan, its node dropped from the nodes once it owns nothing.
// The epoch stays: the commit that stores the map raises it.
// FailedPrecondition when a slot of the move is not owned by `move.from`
// in `map` (a move applied twice, or a plan of another map);
// InvalidArgument for a move outside the map's slots or naming a node the
// plan cannot add, or a result that does not validate.
absl::StatusOr<proto::ShardMap> ApplyMove(const proto::ShardMap& map, const MigrationPlan& plan,
                                          const SlotMove& move);

std::string EncodeMigrationJson(const MigrationPlan& plan);
// Errors name `key` and what is wrong: above kMaxMigrationJsonSize, not
// JSON, a field missing or of the wrong type, an unknown kind or state, a
// bad node name, a range with first > last or beyond proto::kMaxSlots, a
// move to its own node, overlapping moves, a move of an add_node plan not
// to its node or of a remove_node plan not from it.
absl::StatusOr<MigrationPlan> DecodeMigrationJson(std::string_view json, std::string_view key);

// "m-<UTC yyyymmddThhmmss>-<4 hex>".
std::string NewMigrationId();

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_MIGRATION_H_
