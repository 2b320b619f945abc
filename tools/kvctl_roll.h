// kvctl cluster roll: a fleet roll driven from the command line
// (docs/cluster.md, "Fleet roll"; the driver is cluster/roll_driver.h).
//
//   kvctl cluster roll --binary PATH [--build_id ID] [--max_unavailable 1] [--gate_s 10]
//                      [--dry_run] --etcd_endpoints E --cluster NAME
//   kvctl cluster roll --resume | --abort --etcd_endpoints E --cluster NAME
#ifndef KVNODE_TOOLS_KVCTL_ROLL_H_
#define KVNODE_TOOLS_KVCTL_ROLL_H_

#include "kvnode/cluster/etcd_client.h"

namespace kvnode::tools {

// Exit status: 0 the roll is done (or aborted, or shown by --dry_run),
// 1 it stopped (a rollback, a failure, a failed gate) or was refused (another
// kvctl drives it, one is unfinished), 2 bad usage or cluster, 3 paused
// (etcd unreachable, or the lock lost): --resume later.
int RollCommand(cluster::EtcdClient& etcd, const std::string& cluster_name);

}  // namespace kvnode::tools

#endif  // KVNODE_TOOLS_KVCTL_ROLL_H_
