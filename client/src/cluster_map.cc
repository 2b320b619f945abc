#include "cluster_map.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "client_impl.h"
#include "kvnode/client/errors.h"

namespace kvnode::client {

const char* MapOfferName(MapOffer o) {
  switch (o) {
    case MapOffer::kAdopted:
      return "adopted";
    case MapOffer::kSame:
      return "same";
    case MapOffer::kOlder:
      return "older";
    case MapOffer::kOtherCluster:
      return "other cluster";
    case MapOffer::kInconsistent:
      return "inconsistent";
    case MapOffer::kInvalid:
      return "invalid";
  }
  return "?";
}

MapOffer MapTracker::Offer(const proto::ShardMap& map) {
  if (!map.Validate().ok()) return MapOffer::kInvalid;  // (1)
  if (!map_.has_value()) {
    map_ = map;
    return MapOffer::kAdopted;
  }
  if (map.cluster != map_->cluster) return MapOffer::kOtherCluster;  // (2)
  if (map.epoch > map_->epoch) {                                     // (3)
    map_ = map;
    return MapOffer::kAdopted;
  }
  if (map.epoch < map_->epoch) return MapOffer::kOlder;  // (5)
  if (map == *map_) return MapOffer::kSame;
  // (4) Same epoch: only membership may differ.
  if (map.num_slots != map_->num_slots || map.ranges != map_->ranges ||
      map.nodes.size() != map_->nodes.size()) {
    return MapOffer::kInconsistent;
  }
  for (size_t i = 0; i < map.nodes.size(); ++i) {
    if (map.nodes[i].node_id != map_->nodes[i].node_id) return MapOffer::kInconsistent;
  }
  // Membership read at an earlier etcd revision than the one held: an older
  // view of who is alive (another node's push overtaken, a node cut off).
  if (map.members_revision < map_->members_revision) return MapOffer::kOlder;
  map_ = map;
  return MapOffer::kAdopted;
}

absl::StatusOr<Route> RouteKey(const proto::ShardMap& map, std::string_view key) {
  Route r;
  r.slot = proto::SlotOf(key, map.num_slots);
  r.node = map.OwnerOf(r.slot);
  const proto::MapNode& n = map.nodes[r.node];
  // A node without an endpoint cannot be reached either: the map knows its
  // slots but no member key has told where it listens.
  if (!n.alive || n.endpoint.empty()) return ShardUnavailableError(r.slot, n.node_id, map.epoch);
  return r;
}

absl::Status InFlightUnavailableError(uint32_t slot, std::string_view node_id, uint64_t epoch,
                                      bool write) {
  absl::Status st = ShardUnavailableError(slot, node_id, epoch);
  if (!write) return st;
  absl::Status w(st.code(), absl::StrCat(st.message(), "; the write may have been applied"));
  st.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { w.SetPayload(url, payload); });
  return w;
}

uint32_t FailInFlight(const proto::ShardMap& map, std::string_view node_id, Client::Impl& session) {
  const std::optional<uint16_t> node = map.IndexOf(node_id);
  if (!node.has_value() || map.nodes[*node].alive || session.connected()) return 0;
  const std::string id(node_id);
  uint32_t unavailable = 0;
  session.FailOutstanding([&](const Slot& s) {
    if (s.kind == OpKind::kPing) {
      return absl::UnavailableError(absl::StrCat("PING: node '", id, "' is not alive in map epoch ",
                                                 map.epoch, " and its session is down"));
    }
    ++unavailable;
    return InFlightUnavailableError(proto::SlotOf(s.key, map.num_slots), id, map.epoch,
                                    IsWrite(s.kind));
  });
  return unavailable;
}

absl::StatusOr<uint16_t> AnyAliveNode(const proto::ShardMap& map, uint32_t start) {
  const size_t n = map.nodes.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (start + k) % n;
    if (map.nodes[i].alive && !map.nodes[i].endpoint.empty()) return static_cast<uint16_t>(i);
  }
  return absl::UnavailableError(
      absl::StrCat("no node of cluster '", map.cluster, "' is alive in map epoch ", map.epoch));
}

WrongShardPlan PlanWrongShard(uint64_t node_epoch, uint64_t client_epoch,
                              std::string_view routed_to, std::string_view owner_now) {
  if (node_epoch > client_epoch) return WrongShardPlan::kRefresh;
  // The op was routed by a map older than the one held now (adopted while
  // it was in flight): the current map already says where it goes.
  if (owner_now != routed_to) return WrongShardPlan::kReroute;
  return WrongShardPlan::kRetry;
}

absl::Status ForgedEpochError(std::string_view node_id, uint64_t claimed, uint64_t best_epoch,
                              std::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      std::string(what), ": node '", std::string(node_id), "' answered WRONG_SHARD with map epoch ",
      claimed, " but after a refresh the newest map any node gave is epoch ", best_epoch,
      ": epoch refused (forged or from another cluster), not retried"));
}

}  // namespace kvnode::client
