// The etcd keys of a cluster (docs/cluster.md): everything lives under
// /kvnode/<cluster>/. Names are checked by proto::CheckName before they get
// here, so a key never needs escaping.
//
// Thread safety: pure functions.
#ifndef KVNODE_CLUSTER_KEYS_H_
#define KVNODE_CLUSTER_KEYS_H_

#include <optional>
#include <string>
#include <string_view>

namespace kvnode::cluster {

// "/kvnode/<cluster>/": every key of the cluster, for a watch on all of them.
std::string ClusterPrefix(std::string_view cluster);
// "/kvnode/<cluster>/map": the stored shard map (JSON, no lease).
std::string MapKey(std::string_view cluster);
// "/kvnode/<cluster>/nodes/": the members, one leased key each.
std::string MembersPrefix(std::string_view cluster);
// "/kvnode/<cluster>/nodes/<node_id>".
std::string MemberKey(std::string_view cluster, std::string_view node_id);
// "/kvnode/<cluster>/instances/<node_id>": the instance id (hex) of the
// database that first registered the node id; no lease, so it outlives the
// node. Member writes require it to hold the writer's instance; only
// kvctl cluster forget-node removes it.
std::string InstanceKey(std::string_view cluster, std::string_view node_id);
// "/kvnode/<cluster>/roll": the fleet roll's plan (roll.h; no lease).
std::string RollKey(std::string_view cluster);
// "/kvnode/<cluster>/roll-lock": which kvctl drives the roll, under that
// kvctl's lease (roll_driver.h).
std::string RollLockKey(std::string_view cluster);
// "/kvnode/<cluster>/migration": slot migration's plan (migration.h; no
// lease).
std::string MigrationKey(std::string_view cluster);
// "/kvnode/<cluster>/migration-lock": which kvctl drives the migration,
// under that kvctl's lease.
std::string MigrationLockKey(std::string_view cluster);

// The node id of a member key of `cluster`; nullopt for any other key
// (including deeper paths under nodes/).
std::optional<std::string> NodeIdOfMemberKey(std::string_view cluster, std::string_view key);

// The end of etcd's key range covering every key that starts with `prefix`
// (the prefix with its last byte incremented; "\0" for "every key").
std::string PrefixRangeEnd(std::string_view prefix);

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_KEYS_H_
