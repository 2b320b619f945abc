// What a node knows of its cluster from the watch on /kvnode/<cluster>/: the
// last good stored map, the live members, and the assembled map made of
// them. Private to cluster/ (node_session.cc).
//
// Invariants:
//  1. map() is only ever a map DecodeMapJson accepted; a value that does not
//     decode leaves the previous one in place and sets map_error().
//  2. A member value that does not decode counts as no member (its node is
//     not alive) and sets member_error() until the key changes again.
//
// Thread safety: none; owned by the watch thread.
#ifndef KVNODE_CLUSTER_SRC_CLUSTER_VIEW_H_
#define KVNODE_CLUSTER_SRC_CLUSTER_VIEW_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "kvnode/cluster/etcd_client.h"
#include "kvnode/cluster/member.h"
#include "kvnode/cluster/migration.h"
#include "kvnode/cluster/roll.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::cluster {

// A plan the nodes act on, kept at one key (the fleet roll's, the slot
// migration's): the last value that decoded (nullopt: none, or one that
// does not decode, which is logged and not acted on), and whether it
// changed since TakeChange().
template <typename Plan>
class WatchedPlan {
 public:
  using Decoder = absl::StatusOr<Plan> (*)(std::string_view json, std::string_view key);
  WatchedPlan(std::string key, Decoder decode, const char* what)
      : key_(std::move(key)), decode_(decode), what_(what) {}

  const std::string& key() const { return key_; }
  const std::optional<Plan>& value() const { return value_; }
  // The plan (or its absence) when it changed since the last call, else
  // nullopt; clears the change.
  std::optional<std::optional<Plan>> TakeChange() {
    if (!changed_) return std::nullopt;
    changed_ = false;
    return value_;
  }
  void Apply(const KeyValue& kv, bool deleted);

 private:
  const std::string key_;
  const Decoder decode_;
  const char* const what_;  // "roll", "migration": for the log
  std::optional<Plan> value_;
  bool changed_ = false;
};

class ClusterView {
 public:
  explicit ClusterView(std::string cluster);

  // Applies a watch update; the assembled map when it differs from the last
  // one returned (nullopt: unchanged or no valid map yet).
  std::optional<proto::ShardMap> Apply(const WatchUpdate& update);

  const std::optional<proto::ShardMap>& map() const { return map_; }
  const Member* member(const std::string& node_id) const;
  int64_t revision() const { return revision_; }
  // The stored map's problem ("" when the last value decoded).
  const std::string& map_error() const { return map_error_; }
  int64_t map_errors() const { return map_errors_; }
  // The last malformed member value's problem ("" when none is malformed).
  std::string member_error() const;
  // The fleet roll's plan and the slot migration's.
  WatchedPlan<RollPlan>& roll() { return roll_; }
  WatchedPlan<MigrationPlan>& migration() { return migration_; }

 private:
  void ApplyKv(const KeyValue& kv, bool deleted);
  void ApplyMap(const KeyValue& kv, bool deleted);

  const std::string cluster_;
  const std::string map_key_;
  std::optional<proto::ShardMap> map_;
  std::map<std::string, Member> members_;
  std::map<std::string, std::string> bad_members_;  // key -> why
  std::optional<proto::ShardMap> assembled_;
  int64_t revision_ = 0;
  std::string map_error_;
  int64_t map_errors_ = 0;
  WatchedPlan<RollPlan> roll_;
  WatchedPlan<MigrationPlan> migration_;
};

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_SRC_CLUSTER_VIEW_H_
