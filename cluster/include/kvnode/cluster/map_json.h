// The shard map as stored in etcd at MapKey(cluster): JSON, without the
// per-node endpoint, generation and liveness (those come from the member
// keys, member.h Assemble):
//
//   {"cluster":"c1","epoch":1,"slots":4096,"nodes":["a","b","c"],
//    "ranges":[[0,"a"],[1366,"b"],[2731,"c"]]}
//
// Ranges are [first_slot, node_id] pairs sorted by first_slot, the first at 0
// (proto/shard_map.h has the structural rules).
//
// Thread safety: pure functions.
#ifndef KVNODE_CLUSTER_MAP_JSON_H_
#define KVNODE_CLUSTER_MAP_JSON_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::cluster {

// A stored map larger than this is refused before parsing.
inline constexpr size_t kMaxMapJsonSize = 1 << 20;

// The JSON above for a valid `map` (its endpoints, generations and alive bits
// are not stored).
std::string EncodeMapJson(const proto::ShardMap& map);

// Parses and validates a stored map. InvalidArgument naming what is wrong:
// not JSON, a missing field or one of the wrong type, a range naming an
// unknown node, slot errors, `cluster` not `expected_cluster` (when not
// empty), or anything proto::ShardMap::Validate refuses. The nodes come back
// with no endpoint, generation 0, not alive.
absl::StatusOr<proto::ShardMap> DecodeMapJson(std::string_view json,
                                              std::string_view expected_cluster);

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_MAP_JSON_H_
