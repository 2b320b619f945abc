// A node's part in a fleet roll (docs/cluster.md, "Fleet roll"): it acts on
// the plan its etcd session delivers. When cluster::ShouldAct says so, it
// runs this process's live upgrade to the plan's binary (the same path as
// SIGUSR2 and `kvctl upgrade`), once per (roll id, attempt), and reports a
// rollback or a refusal into the member key. A success needs no report: the
// new process's member key shows its generation and build.
//
// Invariants:
//   1. No intent is acted on twice by one process (acted_), and never by the
//      new process an upgrade made: its generation is not the intent's
//      from_generation.
//   2. Nothing here waits on etcd or on the upgrade: the upgrade runs on the
//      server's control and upgrade threads, its answer comes back by
//      callback.
//
// Thread safety: every method may be called from any thread.
#ifndef KVNODE_NODE_SRC_ROLL_AGENT_H_
#define KVNODE_NODE_SRC_ROLL_AGENT_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "kvnode/base/annotated_mutex.h"
#include "kvnode/cluster/member.h"
#include "kvnode/cluster/roll.h"

namespace kvnode::node {

class RollAgent {
 public:
  // Starts a live upgrade to `binary`; `answer` gets the admin answer line
  // of `upgrade --wait` (server/admin.h UpgradeOutcomeAnswer, or a refusal).
  using UpgradeFn = std::function<void(const std::string& binary,
                                       std::function<void(std::string answer)> answer)>;
  // This process's member value as it stands.
  using SelfFn = std::function<cluster::Member()>;
  // Writes a report into the member key.
  using ReportFn = std::function<void(cluster::RollReport)>;

  RollAgent(SelfFn self, ReportFn report) : self_(std::move(self)), report_(std::move(report)) {}

  // The session's on_roll: the latest plan (nullopt: none).
  void OnPlan(const std::optional<cluster::RollPlan>& plan);
  // Once the process can run an upgrade (its OldSide installed): acts on
  // the plan that came meanwhile.
  void SetUpgrade(UpgradeFn upgrade);

 private:
  void Act();
  void Finish(const cluster::RollIntent& intent, const std::string& answer);

  const SelfFn self_;
  const ReportFn report_;
  AnnotatedMutex mu_;  // not absl::Mutex: TSan sees this one (annotated_mutex.h)
  std::optional<cluster::RollPlan> plan_ ABSL_GUARDED_BY(mu_);
  UpgradeFn upgrade_ ABSL_GUARDED_BY(mu_);
  std::optional<cluster::RollIntent> acted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvnode::node

#endif  // KVNODE_NODE_SRC_ROLL_AGENT_H_
