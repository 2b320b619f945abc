// Typed errors of libkvclient.
//
// Every operation returns an absl::Status whose code says what kind of
// failure it was; ErrorKindOf() maps it to the kinds callers act on:
//
//   kNotFound        GET/DELETE of an absent key (absl NotFound)
//   kTimeout         the operation's deadline passed while the session was
//                    up (absl DeadlineExceeded)
//   kConnectionLost  the session was lost and could not be re-established
//                    before the deadline, or reconnection is disabled
//                    (absl Unavailable)
//   kShardUnavailable (ClusterClient) the key's slot belongs to a node the
//                    shard map says is not alive: failed at once, nothing
//                    was sent; retry once the node is back (absl Unavailable
//                    with a payload that tells it from kConnectionLost)
//   kRejected        the server refused the request or the session and a
//                    retry will not help: malformed/oversize request, wrong
//                    auth token, unsupported version, too many clients
//                    (absl InvalidArgument, PermissionDenied,
//                    FailedPrecondition, ResourceExhausted)
//   kInternal        anything else (server storage error, local verbs error)
//
// Thread safety: pure functions.
#ifndef KVNODE_CLIENT_ERRORS_H_
#define KVNODE_CLIENT_ERRORS_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace kvnode::client {

enum class ErrorKind {
  kOk,
  kNotFound,
  kTimeout,
  kConnectionLost,
  kRejected,
  kInternal,
  kShardUnavailable,
};

ErrorKind ErrorKindOf(const absl::Status& status);
std::string_view ErrorKindName(ErrorKind kind);  // "ok", "not_found", "timeout", ...

// The status of an operation on `slot`, whose owner `node_id` is not alive
// in map `epoch`: "SHARD_UNAVAILABLE: slot S of node 'b' (not alive in map
// epoch E)", kind kShardUnavailable.
absl::Status ShardUnavailableError(uint32_t slot, std::string_view node_id, uint64_t epoch);

inline bool IsKeyNotFound(const absl::Status& s) { return ErrorKindOf(s) == ErrorKind::kNotFound; }
inline bool IsTimeout(const absl::Status& s) { return ErrorKindOf(s) == ErrorKind::kTimeout; }
inline bool IsConnectionLost(const absl::Status& s) {
  return ErrorKindOf(s) == ErrorKind::kConnectionLost;
}
inline bool IsRejected(const absl::Status& s) { return ErrorKindOf(s) == ErrorKind::kRejected; }
inline bool IsShardUnavailable(const absl::Status& s) {
  return ErrorKindOf(s) == ErrorKind::kShardUnavailable;
}

}  // namespace kvnode::client

#endif  // KVNODE_CLIENT_ERRORS_H_
