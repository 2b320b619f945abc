// kvctl's side of a fleet roll (docs/cluster.md, "Fleet roll"): takes the
// roll's lock, writes the plan and each batch's intents, waits for the nodes'
// outcomes in their member keys, and gates each next batch on the cluster's
// health. It never talks to a node: killed at any point, a resumed driver
// (from any machine) goes on from the plan in etcd.
//
// Contracts:
//  1. Every plan write is a CAS on the plan's mod_revision, under the lock
//     (a leased key kept alive by the driver): a driver that lost its lock
//     writes nothing more.
//  2. An intent is written only after a gate found every node of the map
//     alive and serving.
//  3. etcd unreachable: calls are retried for RollOptions::etcd_wait, then
//     the driver returns kPaused; the nodes start nothing meanwhile.
//  4. A roll neither starts nor resumes while a slot migration's plan is
//     running (kRefused, naming it): a live upgrade and a move of the same
//     node exclude each other (docs/cluster.md, "Slot migration",
//     invariant 6). The start's and the resume's plan write also compares
//     the migration plan's mod_revision as read, so that one of a roll and
//     a migration started at once is refused.
//
// Thread safety: one driver per call of RunRoll; the EtcdClient may be shared.
#ifndef KVNODE_CLUSTER_ROLL_DRIVER_H_
#define KVNODE_CLUSTER_ROLL_DRIVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "kvnode/cluster/etcd_client.h"
#include "kvnode/cluster/member.h"
#include "kvnode/cluster/roll.h"

namespace kvnode::cluster {

enum class RollMode { kStart, kResume, kAbort, kDryRun };

struct RollOptions {
  std::string cluster;
  RollMode mode = RollMode::kStart;
  // kStart / kDryRun: the new binary's absolute path and its build id.
  std::string binary;
  std::string build_id;
  uint32_t max_unavailable = 1;  // nodes upgrading at once, 1..1024
  uint32_t gate_s = 10;          // healthy time after each batch
  // A node without an outcome this long after its intent fails the roll.
  absl::Duration node_timeout = absl::Minutes(5);
  // etcd unreachable this long: the driver returns kPaused.
  absl::Duration etcd_wait = absl::Seconds(60);
  // How long --resume/--abort waits for the lock of a driver that died.
  absl::Duration lock_wait = absl::Seconds(10);
  absl::Duration poll = absl::Milliseconds(200);
  int64_t lock_ttl_s = 5;
  std::string holder;  // who drives, for a refused second driver: "host pid N"
};

// What the driver saw last: the plan and the live members by node id.
struct RollSnapshot {
  RollPlan plan;
  std::map<std::string, Member> members;
};

enum class RollResult {
  kDone,     // every node on the build (kAbort: the roll is aborted; kDryRun: shown)
  kStopped,  // a rollback, a failure or a failed gate (plan.reason)
  kRefused,  // another driver holds the lock, a roll is unfinished, nothing to resume,
             // a slot migration is running
  kPaused,   // etcd unreachable for etcd_wait, or the lock lost
  kInvalid,  // bad options or cluster (no map, a node missing)
};

struct RollOutcome {
  RollResult result = RollResult::kInvalid;
  std::string message;  // why, for anything but kDone
  RollSnapshot last;    // the plan and members as last read (empty plan if none)
};

// Called on each change worth a progress line: a node's state, a gate's
// start and end, the roll's state, etcd lost or back. `event` says it.
using RollProgressFn = std::function<void(const RollSnapshot& seen, const std::string& event)>;

RollOutcome RunRoll(EtcdClient& etcd, const RollOptions& options, const RollProgressFn& progress);

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_ROLL_DRIVER_H_
