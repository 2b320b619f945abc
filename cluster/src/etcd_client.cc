#include "kvnode/cluster/etcd_client.h"

namespace kvnode::cluster {

absl::Status EtcdClientOptions::Validate() const { return absl::UnimplementedError("etcd client"); }

absl::StatusOr<std::vector<std::string>> ParseEndpoints(std::string_view) {
  return absl::UnimplementedError("etcd client");
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const EtcdClientOptions&) {
  return absl::UnimplementedError("etcd client");
}

}  // namespace kvnode::cluster
