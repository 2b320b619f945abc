#include "kvnode/cluster/roll_driver.h"

#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "driver_keys.h"
#include "etcd_retry.h"
#include "kept_lease.h"
#include "kvnode/base/errno.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/migration.h"

namespace kvnode::cluster {
namespace {

using base::Av;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

class Driver {
 public:
  Driver(EtcdClient& etcd, const RollOptions& o, const RollProgressFn& progress)
      : etcd_(etcd),
        o_(o),
        progress_(progress),
        roll_key_(RollKey(o.cluster)),
        retry_(o.etcd_wait, o.poll, "the roll is paused, ", "etcd answers again: the roll goes on",
               [this](const std::string& event) { Say(event); }) {}

  RollOutcome Run();

 private:
  void Say(const std::string& event) {
    if (progress_) progress_(seen_, event);
  }
  RollOutcome Out(RollResult r, std::string message) {
    return RollOutcome{r, std::move(message), seen_};
  }
  RollOutcome Fail(const absl::Status& s) {
    if (absl::IsAborted(s)) return Out(RollResult::kRefused, std::string(s.message()));
    return Out(Retryable(s) ? RollResult::kPaused : RollResult::kInvalid,
               Retryable(s) ? absl::StrCat("etcd unavailable: ", s.message(),
                                           "; the roll is paused (no node starts an upgrade "
                                           "without its intent): kvctl cluster roll --resume")
                            : std::string(s.message()));
  }

  absl::Status Read();
  // guard_migration: also require the migration plan's key at the
  // revision Read saw (a roll starts or resumes only against a migration
  // plan not running: contract 4).
  absl::Status WritePlan(bool guard_migration = false);
  absl::Status TakeLock();
  absl::StatusOr<RollPlan> NewPlan();
  RollOutcome Abort();
  RollOutcome Drive();
  // Every node of the map alive and serving: "" or what is not.
  std::string Unhealthy() const;
  absl::Status StartBatch(std::vector<std::string>* batch);
  absl::StatusOr<bool> AwaitBatch(const std::vector<std::string>& batch);
  absl::StatusOr<std::string> Gate(const std::vector<std::string>& batch);
  absl::Status Stop(const std::string& reason);

  EtcdClient& etcd_;
  const RollOptions& o_;
  const RollProgressFn& progress_;
  const std::string roll_key_;
  EtcdRetry retry_;                  // every etcd call but the lock's refusal path (contract 3)
  std::unique_ptr<KeptLease> lock_;  // the roll's lock (RollLockKey), contract 1
  RollSnapshot seen_;
  bool have_plan_ = false;
  int64_t plan_rev_ = 0;
  std::optional<proto::ShardMap> map_;
  std::string map_error_;
  // The slot migration whose plan is running, if any: a roll neither
  // starts nor resumes meanwhile (docs/cluster.md, "Slot migration",
  // invariant 6).
  std::string migration_running_;
  int64_t migration_rev_ = 0;  // its key's mod_revision as read; 0: none
};

absl::Status Driver::Read() {
  auto c = ReadCluster(etcd_, retry_, o_.cluster);
  if (!c.ok()) return c.status();
  seen_.members = std::move(c->members);
  map_ = std::move(c->map);
  map_error_ = std::move(c->map_error);
  migration_running_.clear();
  if (c->migration && c->migration->ok() && (*c->migration)->state == MigrationState::kRunning) {
    migration_running_ = (*c->migration)->migration_id;
  }
  migration_rev_ = c->migration_rev;
  have_plan_ = false;
  plan_rev_ = 0;
  if (c->roll) {
    if (!c->roll->ok()) return c->roll->status();
    seen_.plan = std::move(**c->roll);
    have_plan_ = true;
    plan_rev_ = c->roll_rev;
  }
  return absl::OkStatus();
}

absl::Status Driver::WritePlan(bool guard_migration) {
  const std::string migration_key = MigrationKey(o_.cluster);
  auto r = CasPlan(etcd_, retry_, lock_.get(), "roll", roll_key_, EncodeRollJson(seen_.plan),
                   plan_rev_, guard_migration ? migration_key : "", migration_rev_);
  if (!r.ok()) return r.status();
  if (!r->applied) {
    if (guard_migration && (r->guard ? r->guard->mod_revision : 0) != migration_rev_) {
      return absl::AbortedError(absl::StrCat("refused: a slot migration's plan was written at ",
                                             migration_key,
                                             " while this roll started; see kvctl cluster status"));
    }
    return absl::AbortedError(
        absl::StrCat("the plan at ", roll_key_, " changed under this kvctl; stopped"));
  }
  plan_rev_ = r->revision;
  have_plan_ = true;
  return absl::OkStatus();
}

absl::Status Driver::TakeLock() {
  DriverLock l;
  l.key = RollLockKey(o_.cluster);
  l.holder = o_.holder;
  l.wait = o_.mode != RollMode::kStart;
  l.lock_wait = o_.lock_wait;
  l.poll = o_.poll;
  l.lock_ttl_s = o_.lock_ttl_s;
  l.plan_key = roll_key_;
  l.plan_name = [this](const std::string& value) {
    auto plan = DecodeRollJson(value, roll_key_);
    return plan.ok() ? absl::StrCat(" roll ", plan->roll_id) : std::string();
  };
  l.resume = "kvctl cluster roll --resume";
  auto lock = TakeDriverLock(etcd_, retry_, l);
  if (!lock.ok()) return lock.status();
  lock_ = std::move(*lock);
  return absl::OkStatus();
}

absl::StatusOr<RollPlan> Driver::NewPlan() {
  if (!map_) return absl::FailedPreconditionError(map_error_);
  if (o_.binary.empty() || o_.binary[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--binary '", o_.binary, "' must be an absolute path"));
  }
  if (o_.build_id.empty()) return absl::InvalidArgumentError("the new build id is empty");
  if (o_.max_unavailable < 1 || o_.max_unavailable > 1024) {
    return absl::InvalidArgumentError("--max_unavailable must be within 1..1024");
  }
  RollPlan p;
  p.roll_id = NewRollId();
  p.binary = o_.binary;
  p.build_id = o_.build_id;
  p.max_unavailable = o_.max_unavailable;
  p.gate_s = o_.gate_s;
  for (const proto::MapNode& n : map_->nodes) {
    RollNode r;
    r.node_id = n.node_id;
    p.nodes.push_back(std::move(r));
  }
  return p;
}

std::string Driver::Unhealthy() const {
  if (!map_) return map_error_;
  std::vector<std::string> ids;
  for (const proto::MapNode& n : map_->nodes) ids.push_back(n.node_id);
  return NotServing(seen_.members, ids);
}

absl::Status Driver::Stop(const std::string& reason) {
  seen_.plan.state = RollState::kStopped;
  seen_.plan.reason = reason;
  absl::Status s = WritePlan();
  Say(absl::StrCat("stopped: ", reason));
  return s;
}

// The next batch: nodes already on the build are done at once; the others
// (up to max_unavailable) get their intent. An empty batch: none pending.
absl::Status Driver::StartBatch(std::vector<std::string>* batch) {
  RollPlan& p = seen_.plan;
  for (RollNode& n : p.nodes) {
    if (batch->size() >= p.max_unavailable) break;
    if (n.state != RollNodeState::kPending) continue;
    auto it = seen_.members.find(n.node_id);
    if (it == seen_.members.end()) {
      return absl::FailedPreconditionError(absl::StrCat(n.node_id, " is down"));
    }
    const Member& m = it->second;
    n.started_ms = NowMs();
    if (m.build_id == p.build_id) {
      n.state = RollNodeState::kDone;
      n.to_generation = m.generation;
      n.ended_ms = n.started_ms;
      n.reason = "already on the build";
      continue;
    }
    n.state = RollNodeState::kUpgrading;
    n.attempt += 1;
    n.from_generation = m.generation;
    n.to_generation = 0;
    n.ended_ms = 0;
    n.reason.clear();
    batch->push_back(n.node_id);
  }
  if (absl::Status s = WritePlan(); !s.ok()) return s;
  for (const std::string& id : *batch) Say(absl::StrCat(id, ": upgrading"));
  return absl::OkStatus();
}

// Waits until no node of the batch is upgrading; true when all are done.
absl::StatusOr<bool> Driver::AwaitBatch(const std::vector<std::string>& batch) {
  const absl::Time since = absl::Now();
  for (;;) {
    bool waiting = false, all_done = true, changed = false;
    for (const std::string& id : batch) {
      RollNode* n = seen_.plan.node(id);
      if (n == nullptr) continue;
      if (n->state == RollNodeState::kUpgrading) {
        auto it = seen_.members.find(id);
        std::optional<Member> m;
        if (it != seen_.members.end()) m = it->second;
        RollVerdict v = Judge(seen_.plan, *n, m);
        if (v.state == RollNodeState::kUpgrading && absl::Now() - since > o_.node_timeout) {
          v.state = RollNodeState::kFailed;
          v.reason = absl::StrCat("no outcome within ", absl::FormatDuration(o_.node_timeout),
                                  ": the node is ",
                                  m ? absl::StrCat(Av(MemberStateName(m->state)), " at generation ",
                                                   m->generation, " with build '", m->build_id, "'")
                                    : "down");
        }
        if (v.state != RollNodeState::kUpgrading) {
          n->state = v.state;
          n->to_generation = v.to_generation;
          n->reason = v.reason;
          n->ended_ms = NowMs();
          changed = true;
          Say(absl::StrCat(id, ": ", Av(RollNodeStateName(v.state)),
                           v.reason.empty() ? "" : absl::StrCat(" (", v.reason, ")")));
        }
      }
      waiting |= n->state == RollNodeState::kUpgrading;
      all_done &= n->state == RollNodeState::kDone;
    }
    if (changed) {
      if (absl::Status s = WritePlan(); !s.ok()) return s;
    }
    if (!waiting) return all_done;
    absl::SleepFor(o_.poll);  // polling the member keys, bounded by node_timeout
    if (absl::Status s = Read(); !s.ok()) return s;
    if (!have_plan_ || seen_.plan.state != RollState::kRunning) {
      return absl::AbortedError("the roll was stopped or aborted by another kvctl");
    }
  }
}

// Healthy for gate_s: "" or why not.
absl::StatusOr<std::string> Driver::Gate(const std::vector<std::string>& batch) {
  Say(absl::StrCat("gate: ", seen_.plan.gate_s, " s healthy before the next node"));
  std::map<std::string, MemberHealth> from;
  for (const auto& [id, m] : seen_.members) {
    if (m.health) from[id] = *m.health;
  }
  const absl::Time end = absl::Now() + absl::Seconds(seen_.plan.gate_s);
  for (;;) {
    if (std::string bad = Unhealthy(); !bad.empty()) return absl::StrCat("gate: ", bad);
    for (const std::string& id : batch) {
      auto it = seen_.members.find(id);
      if (it == seen_.members.end()) return absl::StrCat("gate: ", id, " is down");
      if (it->second.build_id != seen_.plan.build_id) {
        return absl::StrCat("gate: ", id, " runs build '", it->second.build_id, "', not '",
                            seen_.plan.build_id, "'");
      }
    }
    for (const auto& [id, h0] : from) {
      auto it = seen_.members.find(id);
      if (it == seen_.members.end() || !it->second.health) continue;
      const MemberHealth& h = *it->second.health;
      for (auto [name, a, b] : {std::tuple{"rejected", h0.rejected, h.rejected},
                                {"qp_errors", h0.qp_errors, h.qp_errors},
                                {"upgrade_failures", h0.upgrade_failures, h.upgrade_failures}}) {
        if (b > a) return absl::StrCat("gate: ", id, "'s ", name, " rose from ", a, " to ", b);
      }
    }
    if (absl::Now() >= end) return std::string();
    absl::SleepFor(std::min(o_.poll, end - absl::Now()));  // polling for gate_s
    if (absl::Status s = Read(); !s.ok()) return s;
  }
}

RollOutcome Driver::Drive() {
  for (;;) {
    RollPlan& p = seen_.plan;
    std::vector<std::string> batch;
    for (const RollNode& n : p.nodes) {
      if (n.state == RollNodeState::kUpgrading) batch.push_back(n.node_id);  // resumed
    }
    if (batch.empty()) {
      if (std::string bad = Unhealthy(); !bad.empty()) {
        absl::Status s = Stop(absl::StrCat("not every node is serving: ", bad));
        return s.ok() ? Out(RollResult::kStopped, p.reason) : Fail(s);
      }
      if (absl::Status s = StartBatch(&batch); !s.ok()) return Fail(s);
      if (batch.empty()) {
        bool pending = false;
        for (const RollNode& n : p.nodes) pending |= n.state == RollNodeState::kPending;
        if (pending) continue;  // the batch was all done already
        p.state = RollState::kDone;
        if (absl::Status s = WritePlan(); !s.ok()) return Fail(s);
        Say("done");
        return Out(RollResult::kDone, "");
      }
    }
    auto done = AwaitBatch(batch);
    if (!done.ok()) return Fail(done.status());
    if (!*done) {
      std::vector<std::string> why;
      for (const std::string& id : batch) {
        const RollNode* n = p.node(id);
        if (n->state != RollNodeState::kDone) why.push_back(absl::StrCat(id, ": ", n->reason));
      }
      absl::Status s = Stop(absl::StrJoin(why, "; "));
      return s.ok() ? Out(RollResult::kStopped, p.reason) : Fail(s);
    }
    auto gate = Gate(batch);
    if (!gate.ok()) return Fail(gate.status());
    if (!gate->empty()) {
      absl::Status s = Stop(*gate);
      return s.ok() ? Out(RollResult::kStopped, p.reason) : Fail(s);
    }
    Say("gate passed");
  }
}

RollOutcome Driver::Abort() {
  RollPlan& p = seen_.plan;
  if (p.state == RollState::kDone || p.state == RollState::kAborted) {
    return Out(RollResult::kRefused,
               absl::StrCat("roll ", p.roll_id, " is already ", Av(RollStateName(p.state)),
                            "; nothing to abort"));
  }
  p.state = RollState::kAborted;
  p.reason = absl::StrCat("aborted by ", o_.holder);
  if (absl::Status s = WritePlan(); !s.ok()) return Fail(s);
  Say("aborted");
  return Out(RollResult::kDone, "");
}

RollOutcome Driver::Run() {
  if (o_.mode == RollMode::kDryRun) {
    if (absl::Status s = Read(); !s.ok()) return Fail(s);
    auto plan = NewPlan();
    if (!plan.ok()) return Fail(plan.status());
    seen_.plan = std::move(*plan);
    return Out(RollResult::kDone, "");
  }
  if (absl::Status s = TakeLock(); !s.ok()) {
    return absl::IsFailedPrecondition(s) ? Out(RollResult::kRefused, std::string(s.message()))
                                         : Fail(s);
  }
  if (absl::Status s = Read(); !s.ok()) return Fail(s);
  const bool open = have_plan_ && (seen_.plan.state == RollState::kRunning ||
                                   seen_.plan.state == RollState::kStopped);
  if (o_.mode != RollMode::kAbort && !migration_running_.empty()) {
    return Out(RollResult::kRefused,
               absl::StrCat("slot migration ", migration_running_,
                            " is running: a fleet roll waits for it to end (kvctl cluster "
                            "status shows it)"));
  }
  if (o_.mode == RollMode::kStart) {
    if (open) {
      return Out(RollResult::kRefused,
                 absl::StrCat("roll ", seen_.plan.roll_id, " is unfinished (",
                              Av(RollStateName(seen_.plan.state)),
                              seen_.plan.reason.empty() ? "" : ": " + seen_.plan.reason,
                              "): kvctl cluster roll --resume or --abort"));
    }
    auto plan = NewPlan();
    if (!plan.ok()) return Fail(plan.status());
    seen_.plan = std::move(*plan);
    if (absl::Status s = WritePlan(/*guard_migration=*/true); !s.ok()) return Fail(s);
    Say(absl::StrCat("started: ", seen_.plan.nodes.size(), " nodes to build '", seen_.plan.build_id,
                     "'"));
    return Drive();
  }
  if (!open) {
    return Out(RollResult::kRefused,
               have_plan_ ? absl::StrCat("roll ", seen_.plan.roll_id, " is ",
                                         Av(RollStateName(seen_.plan.state)), "; nothing to ",
                                         o_.mode == RollMode::kAbort ? "abort" : "resume")
                          : absl::StrCat("no roll at ", roll_key_));
  }
  if (o_.mode == RollMode::kAbort) return Abort();
  for (RollNode& n : seen_.plan.nodes) {
    if (n.state == RollNodeState::kRolledBack || n.state == RollNodeState::kFailed) {
      n.state = RollNodeState::kPending;
    }
  }
  seen_.plan.state = RollState::kRunning;
  seen_.plan.reason.clear();
  if (absl::Status s = WritePlan(/*guard_migration=*/true); !s.ok()) return Fail(s);
  Say("resumed");
  return Drive();
}

}  // namespace

RollOutcome RunRoll(EtcdClient& etcd, const RollOptions& options, const RollProgressFn& progress) {
  Driver d(etcd, options, progress);
  return d.Run();
}

}  // namespace kvnode::cluster
