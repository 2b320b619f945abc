#include "kvnode/cluster/migration_commit.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/map_json.h"
#include "kvnode/cluster/migration.h"

namespace kvnode::cluster {
namespace {

using base::Av;

CommitOutcome Outcome(CommitResult r, std::string message) {
  CommitOutcome out;
  out.result = r;
  out.message = std::move(message);
  return out;
}

// Why the plan does not allow committing (first_slot, attempt) of
// `migration_id`; "" when it does (contract 2).
std::string WhyNot(const MigrationPlan& plan, std::string_view migration_id, uint32_t first_slot,
                   uint64_t attempt) {
  if (plan.migration_id != migration_id) {
    return absl::StrCat("the plan is migration ", plan.migration_id, ", not ", Av(migration_id));
  }
  if (plan.state != MigrationState::kRunning) {
    return absl::StrCat("migration ", Av(migration_id), " is ", Av(MigrationStateName(plan.state)));
  }
  for (const SlotMove& m : plan.moves) {
    if (m.first != first_slot) continue;
    if (m.state != MoveState::kCopying || m.attempt != attempt) {
      return absl::StrCat("the move of slots ", m.first, "-", m.last, " is ",
                          Av(MoveStateName(m.state)), " at attempt ", m.attempt,
                          ", not copying at ", attempt);
    }
    return "";
  }
  return absl::StrCat("migration ", Av(migration_id), " has no move starting at slot ", first_slot);
}

}  // namespace

CommitOutcome CommitMove(EtcdClient& etcd, std::string_view cluster, std::string_view migration_id,
                         uint32_t first_slot, uint64_t attempt, const MoveCounts& counts) {
  const std::string plan_key = MigrationKey(cluster);
  const std::string map_key = MapKey(cluster);
  auto plan_kv = etcd.Get(plan_key);
  if (!plan_kv.ok()) return Outcome(CommitResult::kError, std::string(plan_kv.status().message()));
  auto map_kv = etcd.Get(map_key);
  if (!map_kv.ok()) return Outcome(CommitResult::kError, std::string(map_kv.status().message()));
  if (!*plan_kv) return Outcome(CommitResult::kLost, absl::StrCat("no plan at ", plan_key));
  if (!*map_kv) return Outcome(CommitResult::kError, absl::StrCat("no map at ", map_key));
  auto plan = DecodeMigrationJson((*plan_kv)->value, plan_key);
  if (!plan.ok()) return Outcome(CommitResult::kError, std::string(plan.status().message()));
  if (std::string why = WhyNot(*plan, migration_id, first_slot, attempt); !why.empty()) {
    return Outcome(CommitResult::kLost, why);
  }
  auto map = DecodeMapJson((*map_kv)->value, cluster);
  if (!map.ok()) return Outcome(CommitResult::kError, std::string(map.status().message()));
  SlotMove* move = nullptr;
  for (SlotMove& m : plan->moves) {
    if (m.first == first_slot) move = &m;
  }
  auto after = ApplyMove(*map, *plan, *move);
  if (!after.ok()) {
    return Outcome(CommitResult::kError,
                   absl::StrCat("the stored map cannot take the move: ", after.status().message()));
  }
  after->epoch = map->epoch + 1;
  move->state = MoveState::kDone;
  move->keys = counts.keys;
  move->bytes = counts.bytes;
  move->reason.clear();
  auto r = etcd.PutBothIfModRevisions(
      RevisionedPut{plan_key, EncodeMigrationJson(*plan), (*plan_kv)->mod_revision},
      RevisionedPut{map_key, EncodeMapJson(*after), (*map_kv)->mod_revision});
  if (!r.ok()) {
    return Outcome(
        CommitResult::kError,
        absl::StrCat(r.status().message(), "; the commit may have landed: re-read ", plan_key));
  }
  if (!r->applied) {
    const bool plan_moved = !r->current || r->current->mod_revision != (*plan_kv)->mod_revision;
    return Outcome(CommitResult::kLost, absl::StrCat(plan_moved ? "the plan" : "the map",
                                                     " changed between the read and the commit"));
  }
  CommitOutcome out;
  out.result = CommitResult::kCommitted;
  out.map = std::move(*after);
  out.revision = r->revision;
  return out;
}

}  // namespace kvnode::cluster
