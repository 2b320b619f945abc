#include "kvnode/rdma/errors.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace kvnode::rdma {
namespace {

constexpr const char* KindName(RdmaErrorKind kind) {
  switch (kind) {
    case RdmaErrorKind::kMrInUse:
      return "MR_IN_USE";
    case RdmaErrorKind::kMrWindowBound:
      return "MR_WINDOW_BOUND";
    case RdmaErrorKind::kRetryLater:
      return "RETRY_LATER";
    case RdmaErrorKind::kMemlockLimit:
      return "MEMLOCK_LIMIT";
    case RdmaErrorKind::kClosed:
      return "CLOSED";
    case RdmaErrorKind::kDrainTimeout:
      return "DRAIN_TIMEOUT";
    case RdmaErrorKind::kQueueFull:
      return "QUEUE_FULL";
  }
  return "UNKNOWN";
}

constexpr RdmaErrorKind kAllKinds[] = {
    RdmaErrorKind::kMrInUse,      RdmaErrorKind::kMrWindowBound, RdmaErrorKind::kRetryLater,
    RdmaErrorKind::kMemlockLimit, RdmaErrorKind::kClosed,        RdmaErrorKind::kDrainTimeout,
    RdmaErrorKind::kQueueFull,
};

}  // namespace

absl::Status WithKind(absl::Status status, RdmaErrorKind kind) {
  if (!status.ok()) status.SetPayload(kRdmaErrorPayloadUrl, absl::Cord(KindName(kind)));
  return status;
}

std::optional<RdmaErrorKind> GetRdmaErrorKind(const absl::Status& status) {
  auto p = status.GetPayload(kRdmaErrorPayloadUrl);
  if (!p) return std::nullopt;
  for (RdmaErrorKind k : kAllKinds) {
    if (*p == KindName(k)) return k;
  }
  return std::nullopt;
}

bool IsRetryable(const absl::Status& status) {
  std::optional<RdmaErrorKind> k = GetRdmaErrorKind(status);
  return k == RdmaErrorKind::kMrInUse || k == RdmaErrorKind::kMrWindowBound ||
         k == RdmaErrorKind::kRetryLater || k == RdmaErrorKind::kQueueFull;
}

absl::Status ErrnoStatus(absl::string_view what, int err) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err), " (errno ", err, ")");
  switch (err) {
    case EINVAL:
      return absl::InvalidArgumentError(msg);
    case ENOMEM:
    case EAGAIN:
      return WithKind(absl::ResourceExhaustedError(msg), RdmaErrorKind::kRetryLater);
    case EBUSY:
      return absl::FailedPreconditionError(msg);
    case EOPNOTSUPP:
    case ENOSYS:
      return absl::UnimplementedError(msg);
    case EPERM:
    case EACCES:
      return absl::PermissionDeniedError(msg);
    case ENODEV:
    case ENOENT:
      return absl::NotFoundError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status WcStatusToStatus(absl::string_view what, ibv_wc_status status, uint32_t vendor_err) {
  if (status == IBV_WC_SUCCESS) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": completion status ", ibv_wc_status_str(status), " (",
                                 static_cast<int>(status), ", vendor_err ", vendor_err, ")");
  switch (status) {
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
      return absl::UnavailableError(msg);
    case IBV_WC_WR_FLUSH_ERR:
      return absl::AbortedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace kvnode::rdma
