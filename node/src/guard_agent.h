// A node's guard in a slot migration (docs/cluster.md "Slot migration"):
// it acts on the migration plan its etcd session delivers and on the maps
// it serves, and keeps the server's guard (protocol.md 1.5) up while the
// node may stop serving a slot its map still gives it:
//   - up while the plan is running with a move from this node copying (the
//     source raises its guard before its first freeze);
//   - up while a move from this node is done but the map the node serves
//     still gives it one of the move's slots (the commit's map has not
//     reached it: its clients on the new map must not read it unchecked);
//   - down otherwise: clients on maps older than the node's go on checking.
// A process starting (a restart, a live upgrade's new process) raises it
// again from the plan it is delivered.
//
// Invariants:
//   1. The guard is asked for only when the wanted state changes, and its
//      answer is kept: held_ is true only after the server said every
//      session acknowledged or was cut.
//   2. Nothing here waits on etcd or on the server: the raise is answered
//      by callback.
//
// Thread safety: every method may be called from any thread.
#ifndef KVNODE_NODE_SRC_GUARD_AGENT_H_
#define KVNODE_NODE_SRC_GUARD_AGENT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "kvnode/base/annotated_mutex.h"
#include "kvnode/cluster/migration.h"
#include "kvnode/server/shard_gate.h"

namespace kvnode::node {

// Whether node `self` must keep its guard up for `plan`, serving `view`
// (null: no map yet). Pure.
bool GuardWanted(const std::optional<cluster::MigrationPlan>& plan, std::string_view self,
                 const server::ShardView* view);

class GuardAgent {
 public:
  // Raises (up) or lowers the server's guard; a raise answers `done` once
  // it holds (or why it could not), a lowering answers at once.
  using GuardFn = std::function<void(bool up, std::function<void(absl::Status)> done)>;

  explicit GuardAgent(std::string self) : self_(std::move(self)) {}

  // The session's on_migration: the latest plan (nullopt: none).
  void OnPlan(const std::optional<cluster::MigrationPlan>& plan);
  // Every view the node publishes.
  void OnView(std::shared_ptr<const server::ShardView> view);
  // Once the server runs: acts on what came meanwhile.
  void SetGuard(GuardFn guard);

  bool wanted() const;
  bool held() const;  // raised and acknowledged (or cut) by every session

 private:
  void Reconsider();

  const std::string self_;
  mutable AnnotatedMutex mu_;  // not absl::Mutex: TSan sees this one (annotated_mutex.h)
  std::optional<cluster::MigrationPlan> plan_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const server::ShardView> view_ ABSL_GUARDED_BY(mu_);
  GuardFn guard_ ABSL_GUARDED_BY(mu_);
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool asked_ ABSL_GUARDED_BY(mu_) = false;  // the server's guard as last asked for
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t asks_ ABSL_GUARDED_BY(mu_) = 0;  // tags a raise's answer
};

}  // namespace kvnode::node

#endif  // KVNODE_NODE_SRC_GUARD_AGENT_H_
