#include "kvnode/cluster/admin.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/map_json.h"
#include "nlohmann/json.hpp"

namespace kvnode::cluster {
namespace {

using base::Av;
using nlohmann::json;

struct Scan {
  std::optional<proto::ShardMap> stored;
  std::map<std::string, std::pair<Member, int64_t>> members;  // id -> (member, lease)
};

void ReadKvs(const RangeResult& range, std::string_view cluster, Scan* scan, ClusterStatus* out) {
  const std::string map_key = MapKey(cluster);
  for (const KeyValue& kv : range.kvs) {
    if (kv.key == map_key) {
      auto map = DecodeMapJson(kv.value, cluster);
      if (map.ok())
        scan->stored = std::move(*map);
      else
        out->map_error = absl::StrCat("key ", map_key, ": ", map.status().message());
      continue;
    }
    if (kv.key == RollKey(cluster)) {
      auto roll = DecodeRollJson(kv.value, kv.key);
      if (roll.ok())
        out->roll = std::move(*roll);
      else
        out->roll_error = std::string(roll.status().message());
      continue;
    }
    if (kv.key == MigrationKey(cluster)) {
      auto plan = DecodeMigrationJson(kv.value, kv.key);
      if (plan.ok())
        out->migration = std::move(*plan);
      else
        out->migration_error = std::string(plan.status().message());
      continue;
    }
    std::optional<std::string> id = NodeIdOfMemberKey(cluster, kv.key);
    if (!id) continue;
    auto m = DecodeMemberJson(kv.value, kv.key, *id);
    if (m.ok())
      scan->members[*id] = {std::move(*m), kv.lease};
    else
      out->member_errors.push_back(std::string(m.status().message()));
  }
}

NodeStatus NodeOf(EtcdClient& etcd, const std::string& id, Scan& scan) {
  NodeStatus n;
  n.node_id = id;
  auto it = scan.members.find(id);
  if (it == scan.members.end()) return n;
  n.member = it->second.first;
  if (it->second.second != 0) {
    auto ttl = etcd.LeaseTimeToLive(it->second.second);
    if (ttl.ok()) n.lease_ttl_left_s = *ttl;
  }
  return n;
}

}  // namespace

absl::StatusOr<proto::ShardMap> InitCluster(EtcdClient& etcd, std::string_view cluster,
                                            const std::vector<std::string>& nodes, uint32_t slots) {
  auto map = proto::EvenSplit(cluster, slots, nodes);
  if (!map.ok()) return map.status();
  const std::string key = MapKey(cluster);
  auto cas = etcd.PutIfModRevision(key, EncodeMapJson(*map), 0);
  if (!cas.ok()) return cas.status();
  if (!cas->applied) {
    auto have = cas->current ? DecodeMapJson(cas->current->value, cluster)
                             : absl::StatusOr<proto::ShardMap>(absl::UnknownError("gone"));
    std::string epoch = have.ok() ? absl::StrCat("epoch ", have->epoch) : "unreadable";
    return absl::AlreadyExistsError(
        absl::StrCat("cluster '", Av(cluster), "' already has a map (", epoch, ") at ", key));
  }
  return *map;
}

absl::StatusOr<std::string> ForgetNode(EtcdClient& etcd, std::string_view cluster,
                                       std::string_view node_id) {
  if (auto s = proto::CheckName(node_id, proto::kMaxNodeIdSize, "node id"); !s.ok()) return s;
  const std::string key = InstanceKey(cluster, node_id);
  auto bound = etcd.Get(key);
  if (!bound.ok()) return bound.status();
  if (!bound->has_value()) {
    return absl::NotFoundError(absl::StrCat("node '", Av(node_id), "' of cluster '", Av(cluster),
                                            "' is not bound to a database (no ", key, ")"));
  }
  const std::string member_key = MemberKey(cluster, node_id);
  auto r = etcd.DeleteUnlessExists(key, member_key);
  if (!r.ok()) return r.status();
  if (!r->applied) {
    auto m = r->current ? DecodeMemberJson(r->current->value, member_key, node_id)
                        : absl::StatusOr<Member>(absl::UnknownError("gone"));
    std::string who = m.ok() ? absl::StrCat("instance ", m->instance, ", pid ", m->pid,
                                            ", endpoint ", m->endpoint)
                             : "its member key is unreadable";
    return absl::FailedPreconditionError(absl::StrCat("node '", Av(node_id), "' is alive (", who,
                                                      ", key ", member_key, "); stop it first"));
  }
  return (*bound)->value;
}

absl::StatusOr<ClusterStatus> ReadClusterStatus(EtcdClient& etcd, std::string_view cluster) {
  ClusterStatus out;
  out.cluster = std::string(cluster);
  auto health = etcd.Health();
  if (health.ok())
    out.etcd = *health;
  else
    out.etcd_error = std::string(health.status().message());
  auto range = etcd.GetPrefix(ClusterPrefix(cluster));
  if (!range.ok()) return range.status();
  Scan scan;
  ReadKvs(*range, cluster, &scan, &out);
  if (scan.stored) {
    std::vector<Member> live;
    for (const auto& [id, m] : scan.members) live.push_back(m.first);
    out.map = Assemble(*scan.stored, live);
    for (uint16_t i = 0; i < out.map->nodes.size(); ++i) {
      NodeStatus n = NodeOf(etcd, out.map->nodes[i].node_id, scan);
      n.in_map = true;
      n.slots = out.map->SlotsOwnedBy(i);
      out.nodes.push_back(std::move(n));
    }
  }
  for (const auto& [id, m] : scan.members) {
    if (!out.map || !out.map->IndexOf(id)) out.nodes.push_back(NodeOf(etcd, id, scan));
  }
  return out;
}

std::string ClusterStatusJson(const ClusterStatus& s) {
  json nodes = json::array();
  for (const NodeStatus& n : s.nodes) {
    json j = {{"node_id", n.node_id},
              {"in_map", n.in_map},
              {"slots", n.slots},
              {"alive", n.member.has_value()},
              {"lease_ttl_left_s", n.lease_ttl_left_s}};
    if (n.member) {
      j["state"] = std::string(MemberStateName(n.member->state));
      j["endpoint"] = n.member->endpoint;
      j["generation"] = n.member->generation;
      j["version"] = n.member->version;
      j["build_id"] = n.member->build_id;
      j["pid"] = n.member->pid;
    }
    nodes.push_back(std::move(j));
  }
  json etcd = s.etcd ? json{{"ok", true},
                            {"endpoint", s.etcd->endpoint},
                            {"version", s.etcd->version},
                            {"revision", s.etcd->revision}}
                     : json{{"ok", false}, {"error", s.etcd_error}};
  json out = {{"cluster", s.cluster},
              {"etcd", std::move(etcd)},
              {"nodes", std::move(nodes)},
              {"map_epoch", s.map ? s.map->epoch : 0},
              {"slots", s.map ? s.map->num_slots : 0}};
  if (!s.map_error.empty()) out["map_error"] = s.map_error;
  if (!s.member_errors.empty()) out["member_errors"] = s.member_errors;
  if (s.roll) out["roll"] = json::parse(EncodeRollJson(*s.roll));
  if (!s.roll_error.empty()) out["roll_error"] = s.roll_error;
  if (s.migration) out["migration"] = json::parse(EncodeMigrationJson(*s.migration));
  if (!s.migration_error.empty()) out["migration_error"] = s.migration_error;
  return out.dump();
}

}  // namespace kvnode::cluster
