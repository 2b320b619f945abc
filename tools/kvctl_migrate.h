// kvctl cluster add-node | remove-node | rebalance: slot migration from the
// command line (docs/cluster.md, "Slot migration"; the plan is
// cluster/migration.h).
//
//   kvctl cluster add-node ID    [--max_slots_per_move 64] [--rate_mb_s 0] --dry_run
//                                --etcd_endpoints E --cluster NAME
//   kvctl cluster remove-node ID [...] --dry_run --etcd_endpoints E --cluster NAME
//   kvctl cluster rebalance      [...] --dry_run --etcd_endpoints E --cluster NAME
//
// Only the dry run is built: it reads the stored map, prints the plan
// (or, with --json, the plan's JSON as it would be stored) and writes
// nothing. Without --dry_run the command refuses before it talks to etcd.
#ifndef KVNODE_TOOLS_KVCTL_MIGRATE_H_
#define KVNODE_TOOLS_KVCTL_MIGRATE_H_

#include <string>
#include <vector>

#include "kvnode/cluster/etcd_client.h"

namespace kvnode::tools {

// Whether `verb` (the word after "cluster") is one of the commands above.
bool IsMigrateVerb(const std::string& verb);

// `args` are the words after "cluster" (the verb, then the node id for
// add-node and remove-node). Exit status as the roll's: 0 the plan is shown,
// 1 refused (the node is in the map already, is not in it, is the last one,
// the map is full, a bad node id), 2 bad usage or cluster (a flag out of
// range, no map or one that does not decode, etcd not answering, a plan too
// large to store, or no --dry_run: moving slots is not built yet).
int MigrateCommand(cluster::EtcdClient& etcd, const std::string& cluster_name,
                   const std::vector<std::string>& args, bool json);

}  // namespace kvnode::tools

#endif  // KVNODE_TOOLS_KVCTL_MIGRATE_H_
