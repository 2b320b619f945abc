// The shard map as clients see it: which node serves each slot of a cluster,
// at which endpoint, and whether that node is alive. A node builds it from
// etcd (kvnode::cluster) and sends it on the control channel (control.h
// ShardMapUpdate); libkvclient routes each key by it.
//
// A key's slot is XXH64 of the key with a fixed seed, modulo the slot count.
// XXH64 with its own seed shares nothing with the arena's bucket hash (XXH3
// with the arena's random seed), so the keys of one slot spread over the
// whole index and one bucket's keys over all slots.
//
// Wire form (inside the control frame's payload, little endian):
//
//   epoch u64 | members_revision u64 | num_slots u32 | cluster str16 | node_count u16 |
//   node_count x (node_id str16 | endpoint str16 | generation u64 | flags u8) |
//   range_count u32 | range_count x (first_slot u32 | node u16)
//
// Ranges are sorted by first_slot, the first starts at 0, and each runs up to
// the next one's first slot (the last to num_slots): the even split of n nodes
// is n ranges. `node` indexes the node table. flags bit 0: alive.
//
// Thread safety: pure values and functions.
#ifndef KVNODE_PROTO_SHARD_MAP_H_
#define KVNODE_PROTO_SHARD_MAP_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvnode::proto {

inline constexpr uint32_t kDefaultSlots = 4096;
inline constexpr uint32_t kMaxSlots = 65536;
inline constexpr size_t kMaxMapNodes = 64;
inline constexpr size_t kMaxMapRanges = 4096;
inline constexpr size_t kMaxNodeIdSize = 64;
inline constexpr size_t kMaxClusterNameSize = 64;

// The slot of `key` in a map of `num_slots` (>= 1) slots.
uint32_t SlotOf(std::string_view key, uint32_t num_slots);

// A node id or cluster name: 1..64 bytes of [A-Za-z0-9._-]. It is part of
// etcd keys and file contents, so nothing else is accepted. `what` names the
// field in the error.
absl::Status CheckName(std::string_view name, size_t max, std::string_view what);

struct MapNode {
  std::string node_id;
  std::string endpoint;     // control endpoint, host:port; empty when unknown
  uint64_t generation = 0;  // the serving process's upgrade generation; 0 unknown
  bool alive = false;       // holds its membership lease
  friend bool operator==(const MapNode&, const MapNode&) = default;
};

struct SlotRange {
  uint32_t first_slot = 0;
  uint16_t node = 0;  // index into ShardMap::nodes
  friend bool operator==(const SlotRange&, const SlotRange&) = default;
};

struct ShardMap {
  std::string cluster;
  uint64_t epoch = 0;  // >= 1; every change of ownership raises it
  // The etcd revision the membership (endpoints, generations, alive) was read
  // at. Membership changes without a new epoch; two maps of one epoch from
  // two nodes are ordered by it, so a client never takes an older view of
  // who is alive over a newer one (Newer below).
  uint64_t members_revision = 0;
  uint32_t num_slots = 0;
  std::vector<MapNode> nodes;
  std::vector<SlotRange> ranges;

  // Every structural rule above: names, slot count, node ids unique, ranges
  // sorted from 0 and naming existing nodes, sizes within the limits.
  absl::Status Validate() const;
  // Index into `nodes` of the owner of `slot` (< num_slots) of a valid map.
  uint16_t OwnerOf(uint32_t slot) const;
  // Index of `node_id` in `nodes`, if present.
  std::optional<uint16_t> IndexOf(std::string_view node_id) const;
  // Slots owned by node index `node`.
  uint32_t SlotsOwnedBy(uint16_t node) const;
  friend bool operator==(const ShardMap&, const ShardMap&) = default;
};

// Whether `a` is a newer view than `b`: a higher epoch, or the same epoch
// with membership read at a later etcd revision.
inline bool Newer(const ShardMap& a, const ShardMap& b) {
  return a.epoch != b.epoch ? a.epoch > b.epoch : a.members_revision > b.members_revision;
}

// The map split evenly over `node_ids` in their order (each gets a run of
// num_slots / n slots, the first num_slots % n one more), epoch 1, nobody
// alive and no endpoints yet.
absl::StatusOr<ShardMap> EvenSplit(std::string_view cluster, uint32_t num_slots,
                                   const std::vector<std::string>& node_ids);

// The wire form above. Encode validates first; Decode validates what it read.
absl::Status EncodeShardMap(const ShardMap& map, std::string* out);
absl::StatusOr<ShardMap> DecodeShardMap(std::string_view bytes);

}  // namespace kvnode::proto

#endif  // KVNODE_PROTO_SHARD_MAP_H_
