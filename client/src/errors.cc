#include "kvnode/client/errors.h"

namespace kvnode::client {

ErrorKind ErrorKindOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return ErrorKind::kOk;
    case absl::StatusCode::kNotFound:
      return ErrorKind::kNotFound;
    case absl::StatusCode::kDeadlineExceeded:
      return ErrorKind::kTimeout;
    case absl::StatusCode::kUnavailable:
      return ErrorKind::kConnectionLost;
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
  }
  return "internal";
}

}  // namespace kvnode::client
