#include "kvnode/cluster/migration_driver.h"

#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "driver_keys.h"
#include "etcd_retry.h"
#include "kept_lease.h"
#include "kvnode/base/errno.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/roll.h"

namespace kvnode::cluster {
namespace {

using base::Av;

// "slots 1024-1080 a -> d".
std::string Name(const SlotMove& m) {
  return absl::StrCat("slots ", m.first, "-", m.last, " ", m.from, " -> ", m.to);
}

// The target's report on `m`'s current attempt, if its member carries one.
const MigrationReport* ReportOn(const MigrationPlan& p, const SlotMove& m,
                                const std::map<std::string, Member>& members) {
  auto it = members.find(m.to);
  if (it == members.end() || !it->second.migration) return nullptr;
  const MigrationReport& r = *it->second.migration;
  if (r.id != p.migration_id || r.first != m.first || r.attempt != m.attempt) return nullptr;
  return &r;
}

// What the driver watches of a copying move's target (contract 4), kept in
// memory only: a resumed driver starts watching afresh.
struct Watched {
  uint64_t attempt = 0;
  uint64_t generation = 0;  // the target's when the watch began
  uint64_t keys = 0;
  uint64_t bytes = 0;
  absl::Time since;  // the last progress, or the watch's start
};

class Driver {
 public:
  Driver(EtcdClient& etcd, const MigrationDriverOptions& o, const MigrationProgressFn& progress)
      : etcd_(etcd),
        o_(o),
        progress_(progress),
        plan_key_(MigrationKey(o.cluster)),
        retry_(o.etcd_wait, o.poll, "no new move starts, ",
               "etcd answers again: the migration goes on",
               [this](const std::string& event) { Say(event); }) {}

  MigrationOutcome Run();

 private:
  MigrationProgress Progress() const;
  void Say(const std::string& event) {
    if (progress_) progress_(seen_, Progress(), event);
  }
  MigrationOutcome Out(MigrationResult r, std::string message) {
    return MigrationOutcome{r, std::move(message), seen_};
  }
  MigrationOutcome Fail(const absl::Status& s);

  absl::Status Read();
  // guard_roll: also require the roll plan's key at the revision Read saw
  // (a migration starts or resumes only against a roll not running:
  // contract 6).
  absl::Status WritePlan(bool guard_roll = false);
  // Applies `change` to the plan read last (a non-OK status from it is
  // returned as is) and writes it, reading again and reapplying while a
  // target's commit wins the CAS (contract 1).
  template <typename F>
  absl::Status Update(F change, bool guard_roll = false);
  absl::Status TakeLock();
  absl::StatusOr<MigrationPlan> NewPlan() const;
  // Events for the moves whose state changed since the last read.
  void NoticeChanges();
  // Why the copying move `m` has failed; "" while it is under way.
  std::string Judge(const SlotMove& m);
  MigrationOutcome Drive();
  MigrationOutcome Abort();

  EtcdClient& etcd_;
  const MigrationDriverOptions& o_;
  const MigrationProgressFn& progress_;
  const std::string plan_key_;
  EtcdRetry retry_;                  // every etcd call but the lock's refusal path (contract 7)
  std::unique_ptr<KeptLease> lock_;  // the migration's lock (MigrationLockKey), contract 1
  MigrationSnapshot seen_;
  bool have_plan_ = false;
  int64_t plan_rev_ = 0;
  std::optional<proto::ShardMap> map_;
  std::string map_error_;
  std::string roll_running_;               // the fleet roll whose plan is running (contract 6)
  int64_t roll_rev_ = 0;                   // the roll plan's mod_revision as read; 0: none
  std::map<uint32_t, Watched> watched_;    // by the move's first slot
  std::map<uint32_t, MoveState> noticed_;  // each move's state at the last NoticeChanges
  const absl::Time start_ = absl::Now();
  uint64_t bytes_at_start_ = 0;
  uint64_t slots_at_start_ = 0;
  absl::Time last_progress_ = absl::InfinitePast();
};

MigrationOutcome Driver::Fail(const absl::Status& s) {
  if (absl::IsAborted(s)) return Out(MigrationResult::kRefused, std::string(s.message()));
  if (Retryable(s)) {
    return Out(MigrationResult::kPaused,
               absl::StrCat(s.message(),
                            "; the migration is paused (moves in flight go on and commit, no "
                            "new move starts): --resume once etcd answers"));
  }
  return Out(MigrationResult::kInvalid, std::string(s.message()));
}

MigrationProgress Driver::Progress() const {
  MigrationProgress p = CountProgress(seen_.plan, seen_.members);
  const double elapsed_s = absl::ToDoubleSeconds(absl::Now() - start_);
  if (elapsed_s > 0 && p.bytes > bytes_at_start_) {
    p.bytes_per_s = static_cast<double>(p.bytes - bytes_at_start_) / elapsed_s;
  }
  if (p.slots_done > slots_at_start_) {
    const double per_slot = elapsed_s / static_cast<double>(p.slots_done - slots_at_start_);
    p.eta = absl::Seconds(per_slot * static_cast<double>(p.slots_total - p.slots_done));
  }
  return p;
}

absl::Status Driver::Read() {
  auto c = ReadCluster(etcd_, retry_, o_.cluster);
  if (!c.ok()) return c.status();
  seen_.members = std::move(c->members);
  map_ = std::move(c->map);
  map_error_ = std::move(c->map_error);
  roll_running_.clear();
  if (c->roll && c->roll->ok() && (*c->roll)->state == RollState::kRunning) {
    roll_running_ = (*c->roll)->roll_id;
  }
  roll_rev_ = c->roll_rev;
  have_plan_ = false;
  plan_rev_ = 0;
  if (c->migration) {
    if (!c->migration->ok()) return c->migration->status();
    seen_.plan = std::move(**c->migration);
    have_plan_ = true;
    plan_rev_ = c->migration_rev;
  }
  return absl::OkStatus();
}

absl::Status Driver::WritePlan(bool guard_roll) {
  auto r =
      CasPlan(etcd_, retry_, lock_.get(), "migration", plan_key_, EncodeMigrationJson(seen_.plan),
              plan_rev_, guard_roll ? RollKey(o_.cluster) : "", roll_rev_);
  if (!r.ok()) return r.status();
  if (!r->applied) {
    return absl::AbortedError(absl::StrCat("the plan at ", plan_key_, " changed under this kvctl"));
  }
  plan_rev_ = r->revision;
  have_plan_ = true;
  return absl::OkStatus();
}

template <typename F>
absl::Status Driver::Update(F change, bool guard_roll) {
  for (;;) {
    const std::string id = seen_.plan.migration_id;
    if (absl::Status s = change(seen_.plan); !s.ok()) return s;
    absl::Status s = WritePlan(guard_roll);
    if (!absl::IsAborted(s)) return s;
    if (s = Read(); !s.ok()) return s;
    if (!have_plan_ || seen_.plan.migration_id != id) {
      return absl::AbortedError(absl::StrCat("the plan at ", plan_key_, " was replaced"));
    }
  }
}

absl::Status Driver::TakeLock() {
  DriverLock l;
  l.key = MigrationLockKey(o_.cluster);
  l.holder = o_.holder;
  l.wait = o_.mode != MigrationMode::kStart;
  l.lock_wait = o_.lock_wait;
  l.poll = o_.poll;
  l.lock_ttl_s = o_.lock_ttl_s;
  l.plan_key = plan_key_;
  l.plan_name = [this](const std::string& value) {
    auto plan = DecodeMigrationJson(value, plan_key_);
    return plan.ok() ? absl::StrCat(" migration ", plan->migration_id) : std::string();
  };
  l.resume = "--resume";
  auto lock = TakeDriverLock(etcd_, retry_, l);
  if (!lock.ok()) return lock.status();
  lock_ = std::move(*lock);
  return absl::OkStatus();
}

absl::StatusOr<MigrationPlan> Driver::NewPlan() const {
  if (!map_) return absl::FailedPreconditionError(map_error_);
  if (o_.parallel_moves < 1 || o_.parallel_moves > 64) {
    return absl::InvalidArgumentError("--parallel_moves must be within 1..64");
  }
  absl::StatusOr<Migration> m =
      o_.kind == MigrationKind::kAddNode      ? PlanAddNode(*map_, o_.node, o_.plan)
      : o_.kind == MigrationKind::kRemoveNode ? PlanRemoveNode(*map_, o_.node, o_.plan)
                                              : PlanRebalance(*map_, o_.plan);
  if (!m.ok()) return m.status();
  m->plan.migration_id = NewMigrationId();
  if (EncodeMigrationJson(m->plan).size() > kMaxMigrationJsonSize) {
    return absl::InvalidArgumentError(absl::StrCat("the plan would encode above ",
                                                   kMaxMigrationJsonSize,
                                                   " bytes: raise --max_slots_per_move"));
  }
  return std::move(m->plan);
}

void Driver::NoticeChanges() {
  for (const SlotMove& m : seen_.plan.moves) {
    auto [it, fresh] = noticed_.try_emplace(m.first, m.state);
    if (fresh || it->second == m.state) continue;
    it->second = m.state;
    if (m.state == MoveState::kDone) {
      Say(absl::StrCat(Name(m), ": done (", m.keys, " keys, ", m.bytes, " bytes)"));
    }
  }
}

std::string Driver::Judge(const SlotMove& m) {
  const absl::Time now = absl::Now();
  auto member = seen_.members.find(m.to);
  if (member == seen_.members.end()) return absl::StrCat(m.to, " is down (no member key)");
  const MigrationReport* r = ReportOn(seen_.plan, m, seen_.members);
  auto [it, fresh] = watched_.try_emplace(m.first);
  Watched& w = it->second;
  if (fresh || w.attempt != m.attempt) {
    w = Watched{m.attempt, member->second.generation, r ? r->keys : 0, r ? r->bytes : 0, now};
  }
  if (member->second.generation != w.generation) {
    return absl::StrCat(m.to, " restarted without committing (generation ", w.generation, ", now ",
                        member->second.generation, ")");
  }
  if (r != nullptr && r->state == MoveReportState::kFailed) {
    return absl::StrCat(m.to, " reports: ", r->reason);
  }
  if (r != nullptr && (r->keys != w.keys || r->bytes != w.bytes)) {
    w.keys = r->keys;
    w.bytes = r->bytes;
    w.since = now;
  }
  if (now - w.since > o_.node_timeout) {
    return absl::StrCat("no progress from ", m.to, " in ", absl::FormatDuration(o_.node_timeout),
                        " (", w.keys, " keys, ", w.bytes, " bytes copied)");
  }
  return "";
}

MigrationOutcome Driver::Drive() {
  const std::string id = seen_.plan.migration_id;
  {
    MigrationProgress p = CountProgress(seen_.plan, seen_.members);
    bytes_at_start_ = p.bytes;
    slots_at_start_ = p.slots_done;
  }
  for (;;) {
    if (lock_->Lost()) {
      return Fail(absl::UnavailableError("this kvctl lost the migration's lock"));
    }
    if (!have_plan_ || seen_.plan.migration_id != id ||
        seen_.plan.state != MigrationState::kRunning) {
      return Fail(absl::AbortedError(
          absl::StrCat("migration ", id, " was stopped, aborted or replaced by another kvctl")));
    }
    NoticeChanges();
    MigrationPlan& p = seen_.plan;
    std::vector<std::string> events;
    std::vector<std::string> failed;
    std::set<std::string> busy;
    uint32_t copying = 0;
    bool changed = false, all_done = true;
    for (SlotMove& m : p.moves) {
      if (m.state == MoveState::kCopying) {
        if (std::string why = Judge(m); !why.empty()) {
          const Watched& w = watched_[m.first];
          m.state = MoveState::kFailed;
          m.reason = why;
          m.keys = w.keys;
          m.bytes = w.bytes;
          changed = true;
          events.push_back(absl::StrCat(Name(m), ": failed (", why, ")"));
        }
      }
      if (m.state == MoveState::kCopying) {
        ++copying;
        busy.insert(m.from);
        busy.insert(m.to);
      }
      if (m.state == MoveState::kFailed) {
        failed.push_back(absl::StrCat(Name(m), " failed: ", m.reason));
      }
      all_done &= m.state == MoveState::kDone;
    }
    // Intents (contracts 2, 3), none once a move has failed (contract 5).
    std::string waiting;
    for (SlotMove& m : p.moves) {
      if (!failed.empty() || copying >= o_.parallel_moves) break;
      if (m.state != MoveState::kPending || busy.count(m.from) || busy.count(m.to)) continue;
      if (std::string bad = NotServing(seen_.members, {m.from, m.to}); !bad.empty()) {
        if (waiting.empty()) waiting = absl::StrCat("before ", Name(m), ": ", bad);
        continue;
      }
      m.state = MoveState::kCopying;
      m.attempt += 1;
      m.keys = m.bytes = 0;
      m.reason.clear();
      watched_[m.first] = Watched{m.attempt, seen_.members[m.to].generation, 0, 0, absl::Now()};
      ++copying;
      busy.insert(m.from);
      busy.insert(m.to);
      changed = true;
      events.push_back(absl::StrCat(Name(m), ": copying (attempt ", m.attempt, ")"));
    }
    if (copying == 0 && !all_done && (!failed.empty() || !waiting.empty())) {
      p.state = MigrationState::kStopped;
      p.reason = failed.empty() ? waiting : absl::StrJoin(failed, "; ");
      changed = true;
    } else if (all_done) {
      p.state = MigrationState::kDone;
      changed = true;
    }
    if (changed) {
      absl::Status s = WritePlan();
      if (absl::IsAborted(s)) {  // a target committed meanwhile: decide again
        if (s = Read(); !s.ok()) return Fail(s);
        continue;
      }
      if (!s.ok()) return Fail(s);
      for (const std::string& e : events) Say(e);
      for (const SlotMove& m : p.moves) noticed_[m.first] = m.state;
      if (p.state == MigrationState::kStopped) {
        Say(absl::StrCat("stopped: ", p.reason));
        return Out(MigrationResult::kStopped, p.reason);
      }
      if (p.state == MigrationState::kDone) {
        Say("done");
        return Out(MigrationResult::kDone, "");
      }
    }
    if (absl::Now() - last_progress_ >= o_.progress_every && copying > 0) {
      last_progress_ = absl::Now();
      Say("progress");
    }
    absl::SleepFor(o_.poll);  // polling the plan and the member keys, bounded by node_timeout
    if (absl::Status s = Read(); !s.ok()) return Fail(s);
  }
}

MigrationOutcome Driver::Abort() {
  absl::Status s = Update([&](MigrationPlan& p) {
    p.state = MigrationState::kAborted;
    p.reason = absl::StrCat("aborted by ", o_.holder);
    for (SlotMove& m : p.moves) {
      if (m.state == MoveState::kDone || m.state == MoveState::kAborted) continue;
      m.state = MoveState::kAborted;
      m.reason = p.reason;
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return Fail(s);
  Say("aborted");
  return Out(MigrationResult::kDone, "");
}

MigrationOutcome Driver::Run() {
  if (o_.mode == MigrationMode::kDryRun) {
    if (absl::Status s = Read(); !s.ok()) return Fail(s);
    auto plan = NewPlan();
    if (!plan.ok()) return Fail(plan.status());
    seen_.plan = std::move(*plan);
    return Out(MigrationResult::kDone, "");
  }
  if (absl::Status s = TakeLock(); !s.ok()) {
    return absl::IsFailedPrecondition(s) ? Out(MigrationResult::kRefused, std::string(s.message()))
                                         : Fail(s);
  }
  if (absl::Status s = Read(); !s.ok()) return Fail(s);
  const MigrationState state = seen_.plan.state;
  const bool open =
      have_plan_ && (state == MigrationState::kRunning || state == MigrationState::kStopped);
  if (o_.mode != MigrationMode::kAbort && !roll_running_.empty()) {
    return Out(MigrationResult::kRefused,
               absl::StrCat("fleet roll ", roll_running_,
                            " is running: a slot migration waits for it to end (kvctl cluster "
                            "status shows it)"));
  }
  if (o_.mode == MigrationMode::kStart) {
    if (open) {
      return Out(MigrationResult::kRefused,
                 absl::StrCat("migration ", seen_.plan.migration_id, " is unfinished (",
                              Av(MigrationStateName(state)),
                              seen_.plan.reason.empty() ? "" : ": " + seen_.plan.reason,
                              "): --resume or --abort it first"));
    }
    auto plan = NewPlan();
    if (!plan.ok()) return Fail(plan.status());
    seen_.plan = std::move(*plan);
    if (absl::Status s = WritePlan(/*guard_roll=*/true); !s.ok()) {
      if (absl::IsAborted(s)) {
        return Out(MigrationResult::kRefused,
                   absl::StrCat("refused: the plans changed while this migration started (",
                                s.message(), "); see kvctl cluster status"));
      }
      return Fail(s);
    }
    MigrationProgress p = CountProgress(seen_.plan, seen_.members);
    Say(absl::StrCat("started: ", Av(MigrationKindName(seen_.plan.kind)),
                     seen_.plan.node.empty() ? "" : " " + seen_.plan.node, ", ", p.moves_total,
                     " moves of ", p.slots_total, " slots"));
    return Drive();
  }
  if (!open) {
    return Out(MigrationResult::kRefused,
               have_plan_ ? absl::StrCat("migration ", seen_.plan.migration_id, " is ",
                                         Av(MigrationStateName(state)), "; nothing to ",
                                         o_.mode == MigrationMode::kAbort ? "abort" : "resume")
                          : absl::StrCat("no migration at ", plan_key_));
  }
  if (o_.mode == MigrationMode::kAbort) return Abort();
  absl::Status s = Update(
      [&](MigrationPlan& p) {
        if (!roll_running_.empty()) {  // started since the check above
          return absl::AbortedError(absl::StrCat("fleet roll ", roll_running_, " is running"));
        }
        for (SlotMove& m : p.moves) {
          if (m.state == MoveState::kFailed) m.state = MoveState::kPending;
        }
        p.state = MigrationState::kRunning;
        p.reason.clear();
        return absl::OkStatus();
      },
      /*guard_roll=*/true);
  if (!s.ok()) return Fail(s);
  Say("resumed");
  return Drive();
}

}  // namespace

MigrationProgress CountProgress(const MigrationPlan& plan,
                                const std::map<std::string, Member>& members) {
  MigrationProgress p;
  for (const SlotMove& m : plan.moves) {
    ++p.moves_total;
    p.slots_total += m.slots();
    if (m.state == MoveState::kDone) {
      ++p.moves_done;
      p.slots_done += m.slots();
      p.keys += m.keys;
      p.bytes += m.bytes;
    } else if (m.state == MoveState::kCopying) {
      if (const MigrationReport* r = ReportOn(plan, m, members);
          r != nullptr && r->state == MoveReportState::kCopying) {
        p.keys += r->keys;
        p.bytes += r->bytes;
      }
    }
  }
  return p;
}

MigrationOutcome RunMigration(EtcdClient& etcd, const MigrationDriverOptions& options,
                              const MigrationProgressFn& progress) {
  Driver d(etcd, options, progress);
  return d.Run();
}

}  // namespace kvnode::cluster
