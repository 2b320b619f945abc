// The device-free rules of ClusterClient (not installed): which map to
// believe, where a key goes, and what a WRONG_SHARD answer asks for. Pure
// values and functions; ClusterClient (cluster_client.cc) applies them.
#ifndef KVNODE_CLIENT_LIB_CLUSTER_MAP_H_
#define KVNODE_CLIENT_LIB_CLUSTER_MAP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/client/client.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::client {

// What MapTracker::Offer did with a map.
enum class MapOffer : uint8_t {
  kAdopted,       // newer epoch, or the same epoch with new membership
  kSame,          // equal to the map held
  kOlder,         // a lower epoch than the map held
  kOtherCluster,  // names another cluster than the first map did
  kInconsistent,  // same epoch, other slot ranges: not believed
  kInvalid,       // fails ShardMap::Validate
};
const char* MapOfferName(MapOffer o);

// The map a ClusterClient routes by. Rules, in order:
//   (1) an invalid map is never taken (a node or the wire may send anything);
//   (2) the first map fixes the cluster name; maps of another cluster are
//       ignored (a seed list that mixes clusters);
//   (3) a higher epoch wins;
//   (4) the same epoch with the same slots and ranges is taken when its
//       node table differs: endpoints, generations and liveness come from
//       membership, which changes without a new epoch, unless its
//       members_revision (the etcd revision membership was read at) is
//       older than the held map's; the same epoch with other ranges is a
//       node's inconsistency and ignored;
//   (5) a lower epoch is ignored.
class MapTracker {
 public:
  MapOffer Offer(const proto::ShardMap& map);
  bool has_map() const { return map_.has_value(); }
  // Only when has_map().
  const proto::ShardMap& map() const { return *map_; }
  uint64_t epoch() const { return map_.has_value() ? map_->epoch : 0; }

 private:
  std::optional<proto::ShardMap> map_;
};

// Where an operation on `key` goes in a valid `map`.
struct Route {
  uint32_t slot = 0;
  uint16_t node = 0;  // index into map.nodes
};
// The owner of the key's slot; ShardUnavailableError (errors.h) when the
// owner is not alive or has no endpoint.
absl::StatusOr<Route> RouteKey(const proto::ShardMap& map, std::string_view key);
// The status of an operation on `slot` already at node `node_id` (sent, or
// waiting there for its session) when the map says the node is not alive
// and no session to it is up: SHARD_UNAVAILABLE as for a new operation
// (RouteKey), and for a write also that it may have been applied (it may
// have reached the node before it died).
absl::Status InFlightUnavailableError(uint32_t slot, std::string_view node_id, uint64_t epoch,
                                      bool write);
// Fails at once every operation outstanding on `session`, the session to
// map node `node_id`, when `map` says the node is not alive and the session
// is not up (down, or reconnecting to where nothing listens): none of them
// can be answered before the node is back, mostly long after their
// deadline. A session that is up wins over the map, as in routing (its
// operations may still be answered): nothing fails then. Keyed operations
// fail with InFlightUnavailableError, PINGs as a lost connection; Poll on
// `session` reports each once. Returns how many failed with the former.
uint32_t FailInFlight(const proto::ShardMap& map, std::string_view node_id, Client::Impl& session);

// A node to send a PING to: the first alive one with an endpoint, from
// `start` on (round robin); ShardUnavailableError-like Unavailable if none.
absl::StatusOr<uint16_t> AnyAliveNode(const proto::ShardMap& map, uint32_t start);

// What to do with an op a node answered WRONG_SHARD, given the node's map
// epoch in the answer and the client's.
enum class WrongShardPlan : uint8_t {
  kReroute,  // the client's map already names another owner: resubmit now
  kRefresh,  // the node knows a newer map: ask it (once), then reroute
  kRetry,    // the node is behind the client (or has no map yet): resubmit
             // to it after a backoff, inside the op's deadline
};
// `routed_to`: the node id the op was sent to; `owner_now`: the id of its
// slot's owner in the client's current map.
WrongShardPlan PlanWrongShard(uint64_t node_epoch, uint64_t client_epoch,
                              std::string_view routed_to, std::string_view owner_now);

// The error of an op whose WRONG_SHARD named an epoch no node would give:
// after one refresh the newest map obtainable is `best_epoch` < `claimed`.
absl::Status ForgedEpochError(std::string_view node_id, uint64_t claimed, uint64_t best_epoch,
                              std::string_view what);

}  // namespace kvnode::client

#endif  // KVNODE_CLIENT_LIB_CLUSTER_MAP_H_
