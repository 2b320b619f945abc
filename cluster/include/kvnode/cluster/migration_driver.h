// kvctl's side of a slot migration (docs/cluster.md, "Slot migration"):
// takes the migration's lock, writes the plan, sets each move's intent,
// and watches the moves' targets in their member keys until every move is
// done. The targets copy and commit (migration_commit.h); the driver never
// talks to a node, so killed at any point, a resumed driver (from any
// machine) goes on from the plan in etcd.
//
// Contracts:
//  1. Every plan write is a CAS on the plan's mod_revision, under the lock
//     (a leased key kept alive by the driver): a driver that lost its lock
//     writes nothing more. The targets' commits write the plan too, so a
//     lost CAS is not a conflict: the driver re-reads and decides again
//     from what it reads (a move it was about to mark failed may be done).
//  2. At most parallel_moves moves are copying at once, and never two
//     with the same source or the same target.
//  3. An intent (a move to copying, attempt + 1) is written only while the
//     move's source and target are alive and serving.
//  4. A move ends copying only by its target's commit (done), or by the
//     driver marking it failed: the target reported the attempt failed,
//     its member key went or came back at another generation, or it made
//     no progress (keys, bytes) for node_timeout.
//  5. A failed move stops the migration once the moves still copying have
//     ended: none of them is stranded (a commit needs the plan running).
//  6. A migration neither starts nor resumes while a fleet roll's plan is
//     running (kRefused, naming it). The start's and the resume's plan
//     write also compares the roll plan's mod_revision as read, so that one
//     of a roll and a migration started at once is refused.
//  7. etcd unreachable: calls are retried for etcd_wait, then the driver
//     returns kPaused; moves in flight go on and commit.
//
// Thread safety: one driver per call of RunMigration; the EtcdClient may be
// shared.
#ifndef KVNODE_CLUSTER_MIGRATION_DRIVER_H_
#define KVNODE_CLUSTER_MIGRATION_DRIVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "kvnode/cluster/etcd_client.h"
#include "kvnode/cluster/member.h"
#include "kvnode/cluster/migration.h"

namespace kvnode::cluster {

enum class MigrationMode { kStart, kResume, kAbort, kDryRun };

struct MigrationDriverOptions {
  std::string cluster;
  MigrationMode mode = MigrationMode::kStart;
  // kStart / kDryRun: what to plan, from the stored map.
  MigrationKind kind = MigrationKind::kRebalance;
  std::string node;             // add_node / remove_node: the node; rebalance: empty
  MigrationOptions plan;        // max_slots_per_move, rate_mb_s
  uint32_t parallel_moves = 2;  // moves copying at once, 1..64
  // A copying move whose target reports no progress this long fails.
  absl::Duration node_timeout = absl::Minutes(5);
  // etcd unreachable this long: the driver returns kPaused.
  absl::Duration etcd_wait = absl::Seconds(60);
  // How long --resume/--abort waits for the lock of a driver that died.
  absl::Duration lock_wait = absl::Seconds(10);
  absl::Duration poll = absl::Milliseconds(200);
  // At most this often a "progress" event while bytes move.
  absl::Duration progress_every = absl::Seconds(5);
  int64_t lock_ttl_s = 5;
  std::string holder;  // who drives, for a refused second driver: "host pid N"
};

// What the driver saw last: the plan and the live members by node id.
struct MigrationSnapshot {
  MigrationPlan plan;
  std::map<std::string, Member> members;
};

// The figures of a progress line.
struct MigrationProgress {
  uint32_t moves_done = 0;
  uint32_t moves_total = 0;
  uint64_t slots_done = 0;
  uint64_t slots_total = 0;
  // Done moves' final counts plus copying moves' targets' reports.
  uint64_t keys = 0;
  uint64_t bytes = 0;
  double bytes_per_s = 0;  // since this driver started
  // Slots left at the rate slots were done since this driver started;
  // absl::InfiniteDuration() before the first.
  absl::Duration eta = absl::InfiniteDuration();
};

// `plan`'s figures with `members`' reports (the rate and eta left 0 and
// infinite: the driver fills them).
MigrationProgress CountProgress(const MigrationPlan& plan,
                                const std::map<std::string, Member>& members);

enum class MigrationResult {
  kDone,     // every move done (kAbort: the migration is aborted; kDryRun: planned)
  kStopped,  // a move failed (plan.reason)
  kRefused,  // another driver holds the lock, a migration is unfinished, a roll
             // runs, nothing to resume or abort
  kPaused,   // etcd unreachable for etcd_wait, or the lock lost
  kInvalid,  // bad options or cluster (no map, a plan the planner refuses)
};

struct MigrationOutcome {
  MigrationResult result = MigrationResult::kInvalid;
  std::string message;     // why, for anything but kDone
  MigrationSnapshot last;  // the plan and members as last read (empty plan if none)
};

// Called on each change worth a line: a move's state, the migration's
// state, etcd lost or back, and "progress" at most every progress_every.
using MigrationProgressFn = std::function<void(
    const MigrationSnapshot& seen, const MigrationProgress& progress, const std::string& event)>;

MigrationOutcome RunMigration(EtcdClient& etcd, const MigrationDriverOptions& options,
                              const MigrationProgressFn& progress);

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_MIGRATION_DRIVER_H_
