#include "kvnode/proto/shard_map.h"

#include <xxhash.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "kvnode/proto/wire.h"

namespace kvnode::proto {
namespace {

using wire::Reader;
using wire::StringWriter;

// Fixed forever: every node and client of a cluster must agree on it.
constexpr uint64_t kSlotSeed = 0x31307473'6c6f766bULL;
constexpr uint8_t kNodeAlive = 1;

absl::Status Bad(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("shard map: ", wire::Av(what)));
}

absl::Status Short(std::string_view what) {
  return absl::DataLossError(absl::StrCat("shard map: ", wire::Av(what)));
}

void PutString(StringWriter& w, std::string_view s) {
  w.U16(static_cast<uint16_t>(s.size()));
  w.Bytes(s);
}

bool GetString(Reader& r, size_t max, std::string* out) {
  uint16_t len;
  std::string_view v;
  if (!r.U16(&len) || len > max || !r.View(len, &v)) return false;
  out->assign(v);
  return true;
}

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

uint32_t SlotOf(std::string_view key, uint32_t num_slots) {
  return static_cast<uint32_t>(XXH64(key.data(), key.size(), kSlotSeed) % num_slots);
}

absl::Status CheckName(std::string_view name, size_t max, std::string_view what) {
  if (name.empty() || name.size() > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        wire::Av(what), " '", absl::CEscape(wire::Av(name)), "' must be 1..", max, " bytes"));
  }
  if (!std::all_of(name.begin(), name.end(), NameChar)) {
    return absl::InvalidArgumentError(absl::StrCat(
        wire::Av(what), " '", absl::CEscape(wire::Av(name)), "' may hold only A-Z a-z 0-9 . _ -"));
  }
  return absl::OkStatus();
}

absl::Status ShardMap::Validate() const {
  if (auto s = CheckName(cluster, kMaxClusterNameSize, "cluster name"); !s.ok()) return s;
  if (epoch == 0) return Bad("epoch is 0");
  if (num_slots == 0 || num_slots > kMaxSlots) {
    return Bad(absl::StrCat(num_slots, " slots, must be 1..", kMaxSlots));
  }
  if (nodes.empty() || nodes.size() > kMaxMapNodes) {
    return Bad(absl::StrCat(nodes.size(), " nodes, must be 1..", kMaxMapNodes));
  }
  absl::flat_hash_set<std::string_view> ids;
  for (const MapNode& n : nodes) {
    if (auto s = CheckName(n.node_id, kMaxNodeIdSize, "node id"); !s.ok()) return s;
    if (!ids.insert(n.node_id).second) return Bad(absl::StrCat("node id '", n.node_id, "' twice"));
    if (n.endpoint.size() > 512) return Bad(absl::StrCat("endpoint of '", n.node_id, "' too long"));
  }
  if (ranges.empty() || ranges.size() > kMaxMapRanges || ranges.size() > num_slots) {
    return Bad(absl::StrCat(ranges.size(), " ranges, must be 1..min(slots, ", kMaxMapRanges, ")"));
  }
  if (ranges[0].first_slot != 0) return Bad("the first range does not start at slot 0");
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].node >= nodes.size()) {
      return Bad(
          absl::StrCat("range ", i, " names node index ", ranges[i].node, " of ", nodes.size()));
    }
    if (i > 0 && ranges[i].first_slot <= ranges[i - 1].first_slot) {
      return Bad(absl::StrCat("range ", i, " does not start after range ", i - 1));
    }
    if (ranges[i].first_slot >= num_slots) {
      return Bad(
          absl::StrCat("range ", i, " starts at slot ", ranges[i].first_slot, " of ", num_slots));
    }
  }
  return absl::OkStatus();
}

uint16_t ShardMap::OwnerOf(uint32_t slot) const {
  // The last range whose first slot is <= slot.
  auto it = std::upper_bound(ranges.begin(), ranges.end(), slot,
                             [](uint32_t s, const SlotRange& r) { return s < r.first_slot; });
  return std::prev(it)->node;
}

std::optional<uint16_t> ShardMap::IndexOf(std::string_view node_id) const {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].node_id == node_id) return static_cast<uint16_t>(i);
  }
  return std::nullopt;
}

uint32_t ShardMap::SlotsOwnedBy(uint16_t node) const {
  uint32_t n = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const uint32_t end = i + 1 < ranges.size() ? ranges[i + 1].first_slot : num_slots;
    if (ranges[i].node == node) n += end - ranges[i].first_slot;
  }
  return n;
}

absl::StatusOr<ShardMap> EvenSplit(std::string_view cluster, uint32_t num_slots,
                                   const std::vector<std::string>& node_ids) {
  ShardMap m;
  m.cluster = std::string(cluster);
  m.epoch = 1;
  m.num_slots = num_slots;
  const size_t n = node_ids.size();
  uint32_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    MapNode node;
    node.node_id = node_ids[i];
    m.nodes.push_back(std::move(node));
    if (num_slots != 0 && next < num_slots) {
      m.ranges.push_back(SlotRange{next, static_cast<uint16_t>(i)});
    }
    next += num_slots / static_cast<uint32_t>(n) + (i < num_slots % n ? 1 : 0);
  }
  if (auto s = m.Validate(); !s.ok()) return s;
  if (m.ranges.size() != n) return Bad(absl::StrCat(n, " nodes need at least ", n, " slots"));
  return m;
}

absl::Status EncodeShardMap(const ShardMap& map, std::string* out) {
  if (auto s = map.Validate(); !s.ok()) return s;
  StringWriter w(out);
  w.U64(map.epoch);
  w.U32(map.num_slots);
  PutString(w, map.cluster);
  w.U16(static_cast<uint16_t>(map.nodes.size()));
  for (const MapNode& n : map.nodes) {
    PutString(w, n.node_id);
    PutString(w, n.endpoint);
    w.U64(n.generation);
    w.U8(n.alive ? kNodeAlive : 0);
  }
  w.U32(static_cast<uint32_t>(map.ranges.size()));
  for (const SlotRange& r : map.ranges) {
    w.U32(r.first_slot);
    w.U16(r.node);
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardMap> DecodeShardMap(std::string_view bytes) {
  Reader r({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  ShardMap m;
  uint16_t node_count;
  if (!r.U64(&m.epoch) || !r.U32(&m.num_slots) || !GetString(r, kMaxClusterNameSize, &m.cluster) ||
      !r.U16(&node_count)) {
    return Short("truncated header");
  }
  if (node_count > kMaxMapNodes) return Bad(absl::StrCat(node_count, " nodes"));
  m.nodes.resize(node_count);
  for (MapNode& n : m.nodes) {
    uint8_t flags;
    if (!GetString(r, kMaxNodeIdSize, &n.node_id) || !GetString(r, 512, &n.endpoint) ||
        !r.U64(&n.generation) || !r.U8(&flags)) {
      return Short("truncated node table");
    }
    n.alive = (flags & kNodeAlive) != 0;
  }
  uint32_t range_count;
  if (!r.U32(&range_count)) return Short("truncated range count");
  if (range_count > kMaxMapRanges) return Bad(absl::StrCat(range_count, " ranges"));
  m.ranges.resize(range_count);
  for (SlotRange& s : m.ranges) {
    if (!r.U32(&s.first_slot) || !r.U16(&s.node)) return Short("truncated ranges");
  }
  if (r.remaining() != 0) return Short(absl::StrCat(r.remaining(), " trailing bytes"));
  if (auto s = m.Validate(); !s.ok()) return s;
  return m;
}

}  // namespace kvnode::proto
