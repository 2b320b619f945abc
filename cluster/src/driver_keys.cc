#include "driver_keys.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvnode/base/errno.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/map_json.h"
#include "nlohmann/json.hpp"

namespace kvnode::cluster {

using nlohmann::json;

absl::StatusOr<ClusterKeys> ReadCluster(EtcdClient& etcd, EtcdRetry& retry,
                                        std::string_view cluster) {
  auto range = retry.Call([&] { return etcd.GetPrefix(ClusterPrefix(cluster)); });
  if (!range.ok()) return range.status();
  ClusterKeys c;
  c.map_error = "no map (kvctl cluster init)";
  const std::string map_key = MapKey(cluster);
  const std::string roll_key = RollKey(cluster);
  const std::string migration_key = MigrationKey(cluster);
  for (const KeyValue& kv : range->kvs) {
    if (kv.key == map_key) {
      auto m = DecodeMapJson(kv.value, cluster);
      c.map_error = m.ok() ? "" : std::string(m.status().message());
      if (m.ok()) c.map = std::move(*m);
    } else if (kv.key == roll_key) {
      c.roll = DecodeRollJson(kv.value, kv.key);
      c.roll_rev = kv.mod_revision;
    } else if (kv.key == migration_key) {
      c.migration = DecodeMigrationJson(kv.value, kv.key);
      c.migration_rev = kv.mod_revision;
    } else if (auto id = NodeIdOfMemberKey(cluster, kv.key)) {
      auto m = DecodeMemberJson(kv.value, kv.key, *id);
      if (m.ok()) c.members[*id] = std::move(*m);  // else: not alive
    }
  }
  return c;
}

std::string NotServing(const std::map<std::string, Member>& members,
                       const std::vector<std::string>& ids) {
  std::vector<std::string> bad;
  for (const std::string& id : ids) {
    auto it = members.find(id);
    if (it == members.end()) {
      bad.push_back(absl::StrCat(id, " is down"));
    } else if (it->second.state != MemberState::kServing) {
      bad.push_back(absl::StrCat(id, " is ", base::Av(MemberStateName(it->second.state))));
    }
  }
  return absl::StrJoin(bad, ", ");
}

absl::StatusOr<CasResult> CasPlan(EtcdClient& etcd, EtcdRetry& retry, const KeptLease* lock,
                                  std::string_view what, const std::string& key,
                                  const std::string& value, int64_t rev,
                                  const std::string& guard_key, int64_t guard_rev) {
  if (lock != nullptr && lock->Lost()) {
    return absl::UnavailableError(
        absl::StrCat("this kvctl lost the ", base::Av(what), "'s lock (its lease expired)"));
  }
  return retry.Call([&] {
    return guard_key.empty() ? etcd.PutIfModRevision(key, value, rev)
                             : etcd.PutIfModRevisions(key, value, rev, guard_key, guard_rev);
  });
}

absl::StatusOr<std::unique_ptr<KeptLease>> TakeDriverLock(EtcdClient& etcd, EtcdRetry& retry,
                                                          const DriverLock& lock) {
  const absl::Time deadline = absl::Now() + lock.lock_wait;
  auto lease = retry.Call([&] { return etcd.LeaseGrant(lock.lock_ttl_s); });
  if (!lease.ok()) return lease.status();
  const std::string value = json{{"holder", lock.holder}}.dump();
  for (;;) {
    auto r = retry.Call([&] { return etcd.PutIfModRevision(lock.key, value, 0, lease->id); });
    if (!r.ok()) return r.status();
    if (r->applied) break;
    std::string holder = "another kvctl";
    if (r->current) {
      json j = json::parse(r->current->value, nullptr, false);
      if (j.is_object() && j.contains("holder") && j["holder"].is_string()) {
        holder = j["holder"].get<std::string>();
      }
    }
    // A new start is refused at once; --resume and --abort wait for the lock
    // of a driver that died to expire with its lease.
    if (!lock.wait || absl::Now() > deadline) {
      (void)etcd.LeaseRevoke(lease->id);
      std::string id;
      if (auto p = etcd.Get(lock.plan_key); p.ok() && *p) id = lock.plan_name((*p)->value);
      return absl::FailedPreconditionError(
          absl::StrCat("refused:", id, " is being driven by ", holder, " (lock ", lock.key,
                       "); wait for it, or, if it died, ", lock.resume, " once its lease ends"));
    }
    absl::SleepFor(lock.poll);  // waiting for a lease to run out, with a deadline
  }
  return std::make_unique<KeptLease>(etcd, lease->id, absl::Seconds(lock.lock_ttl_s) / 3);
}

}  // namespace kvnode::cluster
