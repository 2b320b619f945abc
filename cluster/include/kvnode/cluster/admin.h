// What kvctl's cluster commands do against etcd, apart from their printing:
// create a cluster's first map, and read a cluster's state in one pass.
//
// Thread safety: functions; the EtcdClient may be shared.
#ifndef KVNODE_CLUSTER_ADMIN_H_
#define KVNODE_CLUSTER_ADMIN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kvnode/cluster/etcd_client.h"
#include "kvnode/cluster/member.h"
#include "kvnode/cluster/migration.h"
#include "kvnode/cluster/roll.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::cluster {

// Writes the even split of `slots` over `nodes` as epoch 1 at MapKey(cluster),
// only if there is no map yet (a Txn: the key must not exist): otherwise
// AlreadyExists "cluster 'c1' already has a map (epoch N) at /kvnode/c1/map".
absl::StatusOr<proto::ShardMap> InitCluster(EtcdClient& etcd, std::string_view cluster,
                                            const std::vector<std::string>& nodes, uint32_t slots);

struct NodeStatus {
  std::string node_id;
  bool in_map = false;            // the map names it
  uint32_t slots = 0;             // slots it owns in the map
  std::optional<Member> member;   // its member key, when alive and readable
  int64_t lease_ttl_left_s = -1;  // of the member key's lease; -1 unknown
};

struct ClusterStatus {
  std::string cluster;
  std::optional<EtcdHealth> etcd;  // nullopt: Health failed (etcd_error says why)
  std::string etcd_error;
  std::optional<proto::ShardMap> map;      // assembled with the live members
  std::string map_error;                   // the stored map's problem, if any
  std::vector<NodeStatus> nodes;           // the map's nodes, then members not in it
  std::vector<std::string> member_errors;  // unreadable member values
  std::optional<RollPlan> roll;            // the fleet roll's plan, if any
  std::string roll_error;                  // its value's problem, if unreadable
  std::optional<MigrationPlan> migration;  // slot migration's plan, if any
  std::string migration_error;             // its value's problem, if unreadable
};

// Unbinds `node_id` from its database (kvctl cluster forget-node): deletes
// InstanceKey(cluster, node_id), so the next database that registers the id
// keeps it (the replacement of a lost node). Refused with FailedPrecondition
// "node 'b' is alive (...); stop it first" while its member key exists (a
// Txn: the instance key goes only while the member key is absent). Returns
// the instance id it forgot; NotFound when the id was not bound.
absl::StatusOr<std::string> ForgetNode(EtcdClient& etcd, std::string_view cluster,
                                       std::string_view node_id);

// One read of the cluster's prefix plus a TimeToLive per member lease.
// Unavailable when etcd cannot be read at all; problems with single values
// are reported inside the result.
absl::StatusOr<ClusterStatus> ReadClusterStatus(EtcdClient& etcd, std::string_view cluster);

// The status as JSON (kvctl cluster status --json).
std::string ClusterStatusJson(const ClusterStatus& status);

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_ADMIN_H_
