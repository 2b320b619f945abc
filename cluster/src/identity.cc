#include "kvnode/cluster/identity.h"

namespace kvnode::cluster {

absl::StatusOr<std::string> NewInstanceId() { return absl::UnimplementedError("identity"); }
std::string EncodeIdentity(const Identity&) { return {}; }
absl::StatusOr<Identity> DecodeIdentity(std::string_view, std::string_view) {
  return absl::UnimplementedError("identity");
}
absl::StatusOr<std::optional<Identity>> LoadIdentity(const std::string&) {
  return absl::UnimplementedError("identity");
}
absl::Status StoreIdentity(const std::string&, const Identity&) {
  return absl::UnimplementedError("identity");
}
absl::StatusOr<Identity> LoadOrCreateIdentity(const std::string&, std::string_view,
                                              std::string_view) {
  return absl::UnimplementedError("identity");
}
absl::StatusOr<std::optional<proto::ShardMap>> LoadMap(const std::string&, std::string_view) {
  return absl::UnimplementedError("identity");
}
absl::Status StoreMap(const std::string&, const proto::ShardMap&) {
  return absl::UnimplementedError("identity");
}

}  // namespace kvnode::cluster
