#include "kvctl_migrate.h"

#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/map_json.h"
#include "kvnode/cluster/migration.h"

DECLARE_bool(dry_run);
DEFINE_uint32(max_slots_per_move, 64,
              "cluster add-node|remove-node|rebalance: the most slots one move carries "
              "(1..65536): a move is the unit of copy, retry and map commit");
DEFINE_uint64(rate_mb_s, 0,
              "cluster add-node|remove-node|rebalance: copy rate limit over all moves in MB/s "
              "(0: unthrottled)");

namespace kvnode::tools {
namespace {

using cluster::Migration;
using cluster::MigrationKind;

struct Verb {
  const char* word;
  MigrationKind kind;
};
constexpr Verb kVerbs[] = {{"add-node", MigrationKind::kAddNode},
                           {"remove-node", MigrationKind::kRemoveNode},
                           {"rebalance", MigrationKind::kRebalance}};

int Fail(const std::string& verb, int code, const std::string& what) {
  std::fprintf(stderr, "kvctl cluster %s: %s\n", verb.c_str(), what.c_str());
  return code;
}

// The stored map, or why there is none (exit 2).
absl::StatusOr<proto::ShardMap> ReadMap(cluster::EtcdClient& etcd, const std::string& name) {
  const std::string key = cluster::MapKey(name);
  auto kv = etcd.Get(key);
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) {
    return absl::NotFoundError(
        absl::StrCat("cluster '", name, "' has no map at ", key, " (kvctl cluster init)"));
  }
  auto map = cluster::DecodeMapJson((*kv)->value, name);
  if (!map.ok())
    return absl::InvalidArgumentError(absl::StrCat("key ", key, ": ", map.status().message()));
  return map;
}

std::string What(const cluster::MigrationPlan& p, const std::string& cluster_name) {
  switch (p.kind) {
    case MigrationKind::kAddNode:
      return absl::StrCat("add node '", p.node, "' to cluster ", cluster_name);
    case MigrationKind::kRemoveNode:
      return absl::StrCat("remove node '", p.node, "' from cluster ", cluster_name);
    case MigrationKind::kRebalance:
      break;
  }
  return absl::StrCat("rebalance cluster ", cluster_name);
}

// Slots of node `id` in `map`; -1 when it is not among its nodes.
int64_t SlotsOf(const proto::ShardMap& map, const std::string& id) {
  auto i = map.IndexOf(id);
  return i ? static_cast<int64_t>(map.SlotsOwnedBy(*i)) : -1;
}

std::string Count(int64_t n) { return n < 0 ? "-" : absl::StrCat(n); }

void PrintDryRun(const proto::ShardMap& map, const Migration& m, const std::string& cluster_name,
                 uint32_t max_slots) {
  const cluster::MigrationPlan& p = m.plan;
  std::printf("dry run (nothing written): %s, from map epoch %llu (%u slots, %zu nodes)\n",
              What(p, cluster_name).c_str(), static_cast<unsigned long long>(map.epoch),
              map.num_slots, map.nodes.size());
  uint64_t moved = 0;
  if (!p.moves.empty()) {
    std::printf("%-5s %-13s %6s  %s\n", "MOVE", "SLOTS", "COUNT", "FROM -> TO");
  }
  for (size_t i = 0; i < p.moves.size(); ++i) {
    const cluster::SlotMove& mv = p.moves[i];
    moved += mv.slots();
    std::printf("%-5zu %-13s %6u  %s -> %s\n", i + 1, absl::StrCat(mv.first, "..", mv.last).c_str(),
                mv.slots(), mv.from.c_str(), mv.to.c_str());
  }
  if (p.moves.empty()) {
    std::printf("nothing to move: the slot counts differ by at most 1\n");
  } else {
    std::printf("moved: %llu of %u slots (%.1f %%) in %zu moves of at most %u slots; rate %s\n",
                static_cast<unsigned long long>(moved), map.num_slots,
                100.0 * static_cast<double>(moved) / map.num_slots, p.moves.size(), max_slots,
                p.rate_mb_s == 0 ? "unthrottled" : absl::StrCat(p.rate_mb_s, " MB/s").c_str());
  }
  std::printf("%-16s %7s %7s %8s\n", "NODE", "BEFORE", "AFTER", "CHANGE");
  std::vector<std::string> ids;
  for (const auto& n : map.nodes) ids.push_back(n.node_id);
  if (p.kind == MigrationKind::kAddNode) ids.push_back(p.node);
  for (const std::string& id : ids) {
    const int64_t before = SlotsOf(map, id), after = SlotsOf(m.target, id);
    const int64_t change = std::max<int64_t>(after, 0) - std::max<int64_t>(before, 0);
    std::printf("%-16s %7s %7s %8s%s\n", id.c_str(), Count(before).c_str(), Count(after).c_str(),
                change == 0 ? "0" : absl::StrFormat("%+d", change).c_str(),
                before < 0  ? "  (joins)"
                : after < 0 ? "  (leaves)"
                            : "");
  }
  std::printf("target map: %zu ranges (now %zu)\n", m.target.ranges.size(), map.ranges.size());
}

}  // namespace

bool IsMigrateVerb(const std::string& verb) {
  for (const Verb& v : kVerbs) {
    if (verb == v.word) return true;
  }
  return false;
}

int MigrateCommand(cluster::EtcdClient& etcd, const std::string& cluster_name,
                   const std::vector<std::string>& args, bool json) {
  const std::string verb = args.empty() ? "" : args[0];
  const Verb* v = nullptr;
  for (const Verb& candidate : kVerbs) {
    if (verb == candidate.word) v = &candidate;
  }
  const size_t words = v != nullptr && v->kind == MigrationKind::kRebalance ? 1 : 2;
  if (v == nullptr || args.size() != words) {
    return Fail(verb, 2,
                "usage: kvctl cluster add-node ID | remove-node ID | rebalance --dry_run "
                "[--max_slots_per_move 64] [--rate_mb_s 0] --etcd_endpoints E --cluster NAME");
  }
  cluster::MigrationOptions o;
  o.max_slots_per_move = FLAGS_max_slots_per_move;
  o.rate_mb_s = FLAGS_rate_mb_s;
  if (auto s = o.Validate(); !s.ok()) return Fail(verb, 2, std::string(s.message()));
  if (!FLAGS_dry_run) {
    return Fail(verb, 2,
                "moving slots is not built yet, nothing was changed; --dry_run shows the plan");
  }
  auto map = ReadMap(etcd, cluster_name);
  if (!map.ok()) return Fail(verb, 2, std::string(map.status().message()));
  absl::StatusOr<Migration> m =
      v->kind == MigrationKind::kAddNode      ? cluster::PlanAddNode(*map, args[1], o)
      : v->kind == MigrationKind::kRemoveNode ? cluster::PlanRemoveNode(*map, args[1], o)
                                              : cluster::PlanRebalance(*map, o);
  if (!m.ok()) return Fail(verb, 1, std::string(m.status().message()));
  m->plan.migration_id = cluster::NewMigrationId();
  const std::string encoded = cluster::EncodeMigrationJson(m->plan);
  if (encoded.size() > cluster::kMaxMigrationJsonSize) {
    return Fail(verb, 2,
                absl::StrCat("the plan's ", m->plan.moves.size(), " moves would take ",
                             encoded.size(), " bytes, above the limit of ",
                             cluster::kMaxMigrationJsonSize, ": raise --max_slots_per_move"));
  }
  if (json) {
    std::printf("%s\n", encoded.c_str());
  } else {
    PrintDryRun(*map, *m, cluster_name, o.max_slots_per_move);
  }
  return 0;
}

}  // namespace kvnode::tools
