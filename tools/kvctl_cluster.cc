#include "kvctl_cluster.h"

#include <gflags/gflags.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kvctl_migrate.h"
#include "kvctl_roll.h"
#include "kvnode/cluster/admin.h"
#include "kvnode/cluster/etcd_client.h"

DEFINE_string(etcd_endpoints, "", "cluster: etcd's client endpoints, host:port[,host:port...]");
DEFINE_string(cluster, "", "cluster: the cluster's name");
DEFINE_string(nodes, "", "cluster init: the node ids the slots are split over, a,b,c");
DEFINE_uint32(slots, 4096, "cluster init: number of slots (1..65536)");

namespace kvnode::tools {
namespace {

using cluster::ClusterStatus;

int Fail(int code, const std::string& what) {
  std::fprintf(stderr, "kvctl cluster: %s\n", what.c_str());
  return code;
}

int Init(cluster::EtcdClient& etcd) {
  std::vector<std::string> nodes = absl::StrSplit(FLAGS_nodes, ',', absl::SkipWhitespace());
  if (nodes.empty()) return Fail(2, "init needs --nodes a,b,c");
  auto map = cluster::InitCluster(etcd, FLAGS_cluster, nodes, FLAGS_slots);
  if (!map.ok()) {
    return Fail(
        absl::IsAlreadyExists(map.status()) || absl::IsInvalidArgument(map.status()) ? 1 : 2,
        std::string(map.status().message()));
  }
  std::printf("cluster %s: map epoch %llu, %u slots over %zu nodes\n", FLAGS_cluster.c_str(),
              static_cast<unsigned long long>(map->epoch), map->num_slots, map->nodes.size());
  return 0;
}

std::string Or(const std::string& s) { return s.empty() ? "-" : s; }

// "migration m-...: add_node d, running, 3 of 18 moves done, 171 of 1024
// slots moved[: reason]".
std::string MigrationLine(const cluster::MigrationPlan& p) {
  size_t done = 0;
  uint64_t slots = 0, moved = 0;
  for (const auto& m : p.moves) {
    slots += m.slots();
    if (m.state == cluster::MoveState::kDone) {
      ++done;
      moved += m.slots();
    }
  }
  return absl::StrCat("migration ", p.migration_id, ": ",
                      std::string(cluster::MigrationKindName(p.kind)), p.node.empty() ? "" : " ",
                      p.node, ", ", std::string(cluster::MigrationStateName(p.state)), ", ", done,
                      " of ", p.moves.size(), " moves done, ", moved, " of ", slots, " slots moved",
                      p.reason.empty() ? "" : ": ", p.reason);
}

void PrintStatus(const ClusterStatus& s) {
  std::printf("cluster %s: ", s.cluster.c_str());
  if (s.map) {
    std::printf("map epoch %llu, %u slots\n", static_cast<unsigned long long>(s.map->epoch),
                s.map->num_slots);
  } else {
    std::printf("no map%s\n", s.map_error.empty() ? " (kvctl cluster init)" : "");
  }
  if (s.etcd) {
    std::printf("etcd: healthy, %s version %s, revision %lld\n", s.etcd->endpoint.c_str(),
                s.etcd->version.c_str(), static_cast<long long>(s.etcd->revision));
  } else {
    std::printf("etcd: %s\n", s.etcd_error.c_str());
  }
  if (!s.map_error.empty()) std::printf("map error: %s\n", s.map_error.c_str());
  for (const auto& e : s.member_errors) std::printf("member error: %s\n", e.c_str());
  if (s.roll) {
    const cluster::RollPlan& r = *s.roll;
    size_t done = 0;
    for (const auto& n : r.nodes) done += n.state == cluster::RollNodeState::kDone;
    std::printf("roll %s: %s, %zu of %zu nodes on build '%s'%s%s\n", r.roll_id.c_str(),
                std::string(cluster::RollStateName(r.state)).c_str(), done, r.nodes.size(),
                r.build_id.c_str(), r.reason.empty() ? "" : ": ", r.reason.c_str());
  }
  if (!s.roll_error.empty()) std::printf("roll error: %s\n", s.roll_error.c_str());
  if (s.migration) std::printf("%s\n", MigrationLine(*s.migration).c_str());
  if (!s.migration_error.empty()) {
    std::printf("migration error: %s\n", s.migration_error.c_str());
  }
  std::printf("%-16s %-10s %-5s %-14s %-6s %-6s %-21s %s\n", "NODE", "STATE", "GEN", "VERSION",
              "LEASE", "SLOTS", "ENDPOINT", "BUILD");
  for (const auto& n : s.nodes) {
    const auto* m = n.member ? &*n.member : nullptr;
    std::string lease = n.lease_ttl_left_s >= 0 ? absl::StrCat(n.lease_ttl_left_s, "s") : "-";
    std::printf("%-16s %-10s %-5s %-14s %-6s %-6s %-21s %s\n", n.node_id.c_str(),
                m ? std::string(cluster::MemberStateName(m->state)).c_str() : "down",
                m ? absl::StrCat(m->generation).c_str() : "-", Or(m ? m->version : "").c_str(),
                lease.c_str(), n.in_map ? absl::StrCat(n.slots).c_str() : "-",
                m ? m->endpoint.c_str() : "", m ? m->build_id.c_str() : "");
  }
}

}  // namespace

int Forget(cluster::EtcdClient& etcd, const std::string& node_id) {
  auto forgotten = cluster::ForgetNode(etcd, FLAGS_cluster, node_id);
  if (!forgotten.ok()) {
    return Fail(absl::IsUnavailable(forgotten.status()) ? 2 : 1,
                std::string(forgotten.status().message()));
  }
  std::printf(
      "cluster %s: node '%s' forgot instance %s; the next database started as '%s' takes it\n",
      FLAGS_cluster.c_str(), node_id.c_str(), forgotten->c_str(), node_id.c_str());
  return 0;
}

int ClusterCommand(const std::vector<std::string>& args, bool json) {
  const bool forget = args.size() == 2 && args[0] == "forget-node";
  const bool migrate = !args.empty() && IsMigrateVerb(args[0]);
  if (!forget && !migrate &&
      (args.size() != 1 || (args[0] != "init" && args[0] != "status" && args[0] != "roll"))) {
    return Fail(2,
                "usage: kvctl cluster init|status|roll|forget-node ID|add-node ID|"
                "remove-node ID|rebalance --etcd_endpoints E --cluster NAME");
  }
  if (FLAGS_cluster.empty()) return Fail(2, "--cluster is required");
  auto endpoints = cluster::ParseEndpoints(FLAGS_etcd_endpoints);
  if (!endpoints.ok()) return Fail(2, std::string(endpoints.status().message()));
  cluster::EtcdClientOptions opts;
  opts.endpoints = *endpoints;
  auto etcd = cluster::EtcdClient::Connect(opts);
  if (!etcd.ok()) return Fail(2, std::string(etcd.status().message()));
  if (args[0] == "init") return Init(**etcd);
  if (forget) return Forget(**etcd, args[1]);
  if (args[0] == "roll") return RollCommand(**etcd, FLAGS_cluster);
  if (migrate) return MigrateCommand(**etcd, FLAGS_cluster, args, json);
  auto status = cluster::ReadClusterStatus(**etcd, FLAGS_cluster);
  if (!status.ok()) return Fail(2, std::string(status.status().message()));
  if (json) {
    std::printf("%s\n", cluster::ClusterStatusJson(*status).c_str());
  } else {
    PrintStatus(*status);
  }
  return 0;
}

}  // namespace kvnode::tools
