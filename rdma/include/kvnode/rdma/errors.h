// Errors of the verbs layer, converted in one place.
//
// Verbs report failure three ways: create calls return NULL and set errno,
// destroy/modify/post calls return an errno value, and completions carry an
// ibv_wc_status. Every path in kvrdma turns them into absl::Status here, with
// what failed, the errno or verbs status, and whether a retry can help.
//
// Typed refusals. Some statuses are not "broken" but "not yet": a
// deregistration refused because a reference or a posted work request still
// names the MR, or a window still bound. They carry a payload under
// kRdmaErrorPayloadUrl whose value is one of the RdmaErrorKind names, so a
// caller tests them with GetRdmaErrorKind() instead of parsing messages.
#ifndef KVNODE_RDMA_ERRORS_H_
#define KVNODE_RDMA_ERRORS_H_

#include <infiniband/verbs.h>

#include <chrono>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvnode::rdma {

// All deadlines in kvrdma are points on the monotonic clock.
using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// A deadline `d` from now.
inline Deadline DeadlineIn(Clock::duration d) { return Clock::now() + d; }

inline constexpr absl::string_view kRdmaErrorPayloadUrl = "kvnode.rdma/error-kind";

enum class RdmaErrorKind {
  // The MR still has references or outstanding work requests (code
  // kFailedPrecondition). Retry after dropping references / polling
  // completions, up to your deadline.
  kMrInUse,
  // The device refused because a memory window is still bound to the MR
  // (rxe: EINVAL; spec: EBUSY). Invalidate/dealloc the window, then retry.
  kMrWindowBound,
  // The device is temporarily out of resources (ENOMEM, EAGAIN). Retry later.
  kRetryLater,
  // Registration would exceed RLIMIT_MEMLOCK (code kResourceExhausted).
  kMemlockLimit,
  // The object has been deregistered/deallocated/closed already.
  kClosed,
  // The QP's drain did not finish by its deadline (code kDeadlineExceeded).
  kDrainTimeout,
  // A work queue is full (code kResourceExhausted): poll completions first.
  kQueueFull,
};

// Attaches `kind` to `status` (which must not be OK) and returns it.
absl::Status WithKind(absl::Status status, RdmaErrorKind kind);

// The kind attached by WithKind, if any.
std::optional<RdmaErrorKind> GetRdmaErrorKind(const absl::Status& status);

// True when retrying the same call later can succeed (kMrInUse,
// kMrWindowBound after unbinding, kRetryLater, kQueueFull).
bool IsRetryable(const absl::Status& status);

// errno -> status: "<what>: <strerror> (errno N)". EINVAL -> InvalidArgument,
// ENOMEM/EAGAIN -> ResourceExhausted (kRetryLater), EBUSY -> FailedPrecondition,
// EOPNOTSUPP/ENOSYS -> Unimplemented, EPERM/EACCES -> PermissionDenied,
// ENODEV/ENOENT -> NotFound, else Internal.
absl::Status ErrnoStatus(absl::string_view what, int err);

// Completion status -> status; OK for IBV_WC_SUCCESS. Remote access and
// retry-exceeded errors map to kUnavailable (the peer is gone or revoked the
// key: "move", never data), flushes to kAborted, others to kInternal.
absl::Status WcStatusToStatus(absl::string_view what, ibv_wc_status status, uint32_t vendor_err);

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_ERRORS_H_
