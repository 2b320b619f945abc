// What kvctl's two drivers, the fleet roll's (roll_driver.h) and the slot
// migration's (migration_driver.h), do alike with the cluster's keys: read
// them all at once, write their plan by CAS, and take their lock. Each
// driver keeps its own plan, messages and decisions. Private to cluster/.
//
// Every etcd call but the lock's refusal path goes through the driver's
// EtcdRetry (etcd_retry.h), so etcd going away pauses both drivers alike.
//
// Thread safety: none; called from the driver's thread.
#ifndef KVNODE_CLUSTER_SRC_DRIVER_KEYS_H_
#define KVNODE_CLUSTER_SRC_DRIVER_KEYS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcd_retry.h"
#include "kept_lease.h"
#include "kvnode/cluster/etcd_client.h"
#include "kvnode/cluster/member.h"
#include "kvnode/cluster/migration.h"
#include "kvnode/cluster/roll.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::cluster {

// The cluster's keys as one GetPrefix read them.
struct ClusterKeys {
  std::optional<proto::ShardMap> map;  // the stored map, if it decoded
  std::string map_error;               // "" with a map, else why there is none
  // The live members by node id: a value that does not decode is no member
  // (its node is not alive).
  std::map<std::string, Member> members;
  // Each plan as decoded (nullopt: no key) and its key's mod_revision (0:
  // no key). Whether a plan that does not decode is an error is the
  // reader's call: its own, yes; the other driver's, no.
  std::optional<absl::StatusOr<RollPlan>> roll;
  int64_t roll_rev = 0;
  std::optional<absl::StatusOr<MigrationPlan>> migration;
  int64_t migration_rev = 0;
};

// One GetPrefix of /kvnode/<cluster>/, through `retry`.
absl::StatusOr<ClusterKeys> ReadCluster(EtcdClient& etcd, EtcdRetry& retry,
                                        std::string_view cluster);

// Of the nodes `ids`, those not alive and serving in `members`, joined
// with ", " ("a is down, b is draining"); "" when all are.
std::string NotServing(const std::map<std::string, Member>& members,
                       const std::vector<std::string>& ids);

// A driver's plan write (both drivers' contract 1): `value` at `key` if its
// mod_revision is `rev` (0: no key) and, when `guard_key` is not empty,
// guard_key's is `guard_rev`; through `retry`. Once `lock` is lost it
// writes nothing and returns Unavailable ("this kvctl lost the <what>'s
// lock ..."). A CAS not applied is a result, not an error: the caller
// words it.
absl::StatusOr<CasResult> CasPlan(EtcdClient& etcd, EtcdRetry& retry, const KeptLease* lock,
                                  std::string_view what, const std::string& key,
                                  const std::string& value, int64_t rev,
                                  const std::string& guard_key, int64_t guard_rev);

struct DriverLock {
  std::string key;     // the lock's key (RollLockKey, MigrationLockKey)
  std::string holder;  // who drives, stored in the lock for a refused driver
  // false: a held lock refuses at once (a new start); true: wait up to
  // lock_wait for a dead driver's lock to expire with its lease.
  bool wait = false;
  absl::Duration lock_wait;
  absl::Duration poll;
  int64_t lock_ttl_s = 5;
  // Refused: the plan the holder drives, named by plan_name (" roll <id>"
  // or "" when it does not decode), and the command to resume it.
  std::string plan_key;
  std::function<std::string(const std::string& value)> plan_name;
  std::string resume;
};

// Takes `lock` under a new lease kept alive by the result (KeptLease, its
// lease's TTL / 3). FailedPrecondition, naming the holder, when another
// driver holds it; etcd's error when etcd fails or stays away.
absl::StatusOr<std::unique_ptr<KeptLease>> TakeDriverLock(EtcdClient& etcd, EtcdRetry& retry,
                                                          const DriverLock& lock);

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_SRC_DRIVER_KEYS_H_
