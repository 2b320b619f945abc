// The synchronous calls of Client and ClusterClient (Get, Put, Delete,
// Ping) as one operation each: the request they run and what they return of
// its result. Both classes run them through their Execute.
#ifndef KVNODE_CLIENT_SRC_SYNC_OPS_H_
#define KVNODE_CLIENT_SRC_SYNC_OPS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/client/client.h"

namespace kvnode::client::internal {

inline OpRequest SyncOp(OpKind kind, std::string_view key, std::string_view value,
                        absl::Time deadline) {
  OpRequest op;
  op.kind = kind;
  op.key = key;
  op.value = value;
  op.deadline = deadline;
  return op;
}

inline absl::StatusOr<GetResult> AsGet(const OpResult& r) {
  if (!r.status.ok()) return r.status;
  return GetResult{std::string(r.value), r.version};
}

inline absl::StatusOr<uint64_t> AsVersion(const OpResult& r) {
  if (!r.status.ok()) return r.status;
  return r.version;
}

}  // namespace kvnode::client::internal

#endif  // KVNODE_CLIENT_SRC_SYNC_OPS_H_
