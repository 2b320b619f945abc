// kvctl's cluster commands (they talk to etcd, not to a node):
//
//   kvctl cluster init --etcd_endpoints E --cluster NAME --nodes a,b,c [--slots 4096]
//   kvctl cluster status --etcd_endpoints E --cluster NAME [--json]
//   kvctl cluster forget-node ID --etcd_endpoints E --cluster NAME
//   kvctl cluster roll ...                          (kvctl_roll.h)
//   kvctl cluster add-node|remove-node|rebalance ... (kvctl_migrate.h)
#ifndef KVNODE_TOOLS_KVCTL_CLUSTER_H_
#define KVNODE_TOOLS_KVCTL_CLUSTER_H_

#include <string>
#include <vector>

namespace kvnode::tools {

// `args` are the words after "cluster". Returns kvctl's exit status: 0 ok,
// 1 etcd answered with a refusal (a map exists already), 2 no answer from
// etcd or bad usage.
int ClusterCommand(const std::vector<std::string>& args, bool json);

}  // namespace kvnode::tools

#endif  // KVNODE_TOOLS_KVCTL_CLUSTER_H_
