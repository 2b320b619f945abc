#include "kvnode/client/errors.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client_impl.h"

namespace kvnode::client {
namespace {

// Status payloads that mark what an absl code alone cannot tell apart.
// kShardUnavailablePayload: an Unavailable that is not a lost connection.
// kWrongShardPayload: a node's WRONG_SHARD answer, the node's map epoch as
// decimal text (ClusterClient reroutes the op; a plain Client reports it).
constexpr char kShardUnavailablePayload[] = "kvnode.client/shard_unavailable";
constexpr char kWrongShardPayload[] = "kvnode.client/wrong_shard";

}  // namespace

absl::Status ShardUnavailableError(uint32_t slot, std::string_view node_id, uint64_t epoch) {
  absl::Status st = absl::UnavailableError(absl::StrCat("SHARD_UNAVAILABLE: slot ", slot,
                                                        " of node '", std::string(node_id),
                                                        "' (not alive in map epoch ", epoch, ")"));
  st.SetPayload(kShardUnavailablePayload, absl::Cord("1"));
  return st;
}

absl::Status WrongShardSignal(uint64_t node_epoch, std::string_view what) {
  absl::Status st = absl::FailedPreconditionError(
      absl::StrCat("node answered WRONG_SHARD (map epoch ", node_epoch, ") to ", std::string(what),
                   ": the key's slot is another node's"));
  st.SetPayload(kWrongShardPayload, absl::Cord(absl::StrCat(node_epoch)));
  return st;
}

std::optional<uint64_t> WrongShardEpochOf(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kFailedPrecondition) return std::nullopt;
  const auto p = status.GetPayload(kWrongShardPayload);  // absl::optional
  uint64_t epoch = 0;
  if (!p.has_value() || !absl::SimpleAtoi(std::string(*p), &epoch)) return std::nullopt;
  return epoch;
}

ErrorKind ErrorKindOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return ErrorKind::kOk;
    case absl::StatusCode::kNotFound:
      return ErrorKind::kNotFound;
    case absl::StatusCode::kDeadlineExceeded:
      return ErrorKind::kTimeout;
    case absl::StatusCode::kUnavailable:
      return status.GetPayload(kShardUnavailablePayload).has_value() ? ErrorKind::kShardUnavailable
                                                                     : ErrorKind::kConnectionLost;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnauthenticated:
      return ErrorKind::kRejected;
    default:
      return ErrorKind::kInternal;
  }
}

std::string_view ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kOk:
      return "ok";
    case ErrorKind::kNotFound:
      return "not_found";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kConnectionLost:
      return "connection_lost";
    case ErrorKind::kRejected:
      return "rejected";
    case ErrorKind::kInternal:
      return "internal";
    case ErrorKind::kShardUnavailable:
      return "shard_unavailable";
  }
  return "internal";
}

}  // namespace kvnode::client
