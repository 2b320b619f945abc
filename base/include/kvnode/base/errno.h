// The one errno -> Status mapping of the project.
//
// Codes follow absl::ErrnoToStatusCode (ENOENT NotFound, EACCES/EPERM
// PermissionDenied, EINVAL InvalidArgument, EAGAIN Unavailable, ENOMEM
// ResourceExhausted, ...), with one change: a connection the peer broke or
// that timed out (ECONNRESET, EPIPE, ENOTCONN, ECONNREFUSED, ETIMEDOUT) is
// Unavailable, retryable, because every caller here treats a vanished peer
// that way. The message is "<what>: <strerror> (errno N)".
// rdma/ adds the verbs-specific kinds on top (rdma/errors.h).
#ifndef KVNODE_BASE_ERRNO_H_
#define KVNODE_BASE_ERRNO_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvnode::base {

// `err` as a Status whose message says `what` failed.
[[nodiscard]] absl::Status ErrnoStatus(int err, std::string_view what);

// "<strerror> (errno N)", for log lines.
std::string ErrnoText(int err);

// std::string_view -> absl::string_view (Debian's Abseil keeps its own type).
inline absl::string_view Av(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace kvnode::base

#endif  // KVNODE_BASE_ERRNO_H_
