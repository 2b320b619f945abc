#include "kvnode/cluster/node_session.h"

namespace kvnode::cluster {

absl::Status NodeSessionOptions::Validate() const {
  return absl::UnimplementedError("node session");
}

absl::StatusOr<std::unique_ptr<NodeSession>> NodeSession::Create(NodeSessionOptions,
                                                                 NodeSessionCallbacks) {
  return absl::UnimplementedError("node session");
}

}  // namespace kvnode::cluster
