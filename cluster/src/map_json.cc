#include "kvnode/cluster/map_json.h"

namespace kvnode::cluster {

std::string EncodeMapJson(const proto::ShardMap&) { return {}; }

absl::StatusOr<proto::ShardMap> DecodeMapJson(std::string_view, std::string_view) {
  return absl::UnimplementedError("map json");
}

}  // namespace kvnode::cluster
