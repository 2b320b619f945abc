#include "kvnode/cluster/map_json.h"

#include <cstdint>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "nlohmann/json.hpp"

namespace kvnode::cluster {
namespace {

using base::Av;
using nlohmann::json;

absl::Status Bad(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("shard map JSON: ", Av(what)));
}

// The unsigned integer field `name` of `obj`, at most `max`.
absl::StatusOr<uint64_t> UintField(const json& obj, const char* name, uint64_t max) {
  auto it = obj.find(name);
  if (it == obj.end()) return Bad(absl::StrCat("field '", name, "' is missing"));
  if (!it->is_number_unsigned()) {
    return Bad(absl::StrCat("field '", name, "' must be a non-negative integer"));
  }
  uint64_t v = it->get<uint64_t>();
  if (v > max) return Bad(absl::StrCat("field '", name, "' is ", v, ", above ", max));
  return v;
}

absl::Status DecodeNodes(const json& obj, proto::ShardMap* map) {
  auto it = obj.find("nodes");
  if (it == obj.end() || !it->is_array()) return Bad("field 'nodes' must be an array of node ids");
  if (it->size() > proto::kMaxMapNodes) {
    return Bad(absl::StrCat("'nodes' has ", it->size(), " entries, above ", proto::kMaxMapNodes));
  }
  for (const json& n : *it) {
    if (!n.is_string()) return Bad("'nodes' must hold only strings");
    proto::MapNode node;
    node.node_id = n.get<std::string>();
    map->nodes.push_back(std::move(node));
  }
  return absl::OkStatus();
}

absl::Status DecodeRanges(const json& obj, proto::ShardMap* map) {
  auto it = obj.find("ranges");
  if (it == obj.end() || !it->is_array()) {
    return Bad("field 'ranges' must be an array of [first_slot, node_id]");
  }
  if (it->size() > proto::kMaxMapRanges) {
    return Bad(absl::StrCat("'ranges' has ", it->size(), " entries, above ", proto::kMaxMapRanges));
  }
  std::unordered_map<std::string, uint16_t> index;
  for (size_t i = 0; i < map->nodes.size(); ++i) {
    index.emplace(map->nodes[i].node_id, static_cast<uint16_t>(i));
  }
  for (const json& r : *it) {
    if (!r.is_array() || r.size() != 2 || !r[0].is_number_unsigned() || !r[1].is_string()) {
      return Bad(absl::StrCat("range ", r.dump(), " is not [first_slot, node_id]"));
    }
    uint64_t first = r[0].get<uint64_t>();
    if (first >= proto::kMaxSlots)
      return Bad(absl::StrCat("range first slot ", first, " too large"));
    auto node = index.find(r[1].get<std::string>());
    if (node == index.end()) {
      return Bad(absl::StrCat("range ", r.dump(), " names a node not in 'nodes'"));
    }
    map->ranges.push_back({static_cast<uint32_t>(first), node->second});
  }
  return absl::OkStatus();
}

}  // namespace

std::string EncodeMapJson(const proto::ShardMap& map) {
  json nodes = json::array();
  for (const auto& n : map.nodes) nodes.push_back(n.node_id);
  json ranges = json::array();
  for (const auto& r : map.ranges) {
    std::string owner = r.node < map.nodes.size() ? map.nodes[r.node].node_id : "";
    ranges.push_back(json::array({r.first_slot, owner}));
  }
  json j = {{"cluster", map.cluster},
            {"epoch", map.epoch},
            {"slots", map.num_slots},
            {"nodes", std::move(nodes)},
            {"ranges", std::move(ranges)}};
  return j.dump();
}

absl::StatusOr<proto::ShardMap> DecodeMapJson(std::string_view text,
                                              std::string_view expected_cluster) {
  if (text.size() > kMaxMapJsonSize) {
    return Bad(absl::StrCat(text.size(), " bytes, above the limit of ", kMaxMapJsonSize));
  }
  json obj = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) return Bad("not valid JSON");
  if (!obj.is_object()) return Bad("not a JSON object");
  proto::ShardMap map;
  auto cluster = obj.find("cluster");
  if (cluster == obj.end() || !cluster->is_string()) return Bad("field 'cluster' must be a string");
  map.cluster = cluster->get<std::string>();
  if (!expected_cluster.empty() && map.cluster != expected_cluster) {
    return Bad(
        absl::StrCat("map of cluster '", map.cluster, "', not '", Av(expected_cluster), "'"));
  }
  auto epoch = UintField(obj, "epoch", UINT64_MAX);
  if (!epoch.ok()) return epoch.status();
  map.epoch = *epoch;
  auto slots = UintField(obj, "slots", proto::kMaxSlots);
  if (!slots.ok()) return slots.status();
  map.num_slots = static_cast<uint32_t>(*slots);
  if (auto s = DecodeNodes(obj, &map); !s.ok()) return s;
  if (auto s = DecodeRanges(obj, &map); !s.ok()) return s;
  if (auto s = map.Validate(); !s.ok()) return Bad(std::string(s.message()));
  return map;
}

}  // namespace kvnode::cluster
