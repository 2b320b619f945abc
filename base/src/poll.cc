#include "kvnode/base/poll.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include "absl/time/clock.h"
#include "kvnode/base/errno.h"

namespace kvnode::base {

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(left + absl::Microseconds(999)), 1 << 30));
}

absl::StatusOr<short> PollUntil(int fd, short events, absl::Time deadline) {
  for (;;) {
    const int timeout_ms = PollTimeoutMs(deadline);
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, timeout_ms);
    if (n > 0) return p.revents;
    if (n == 0) {
      if (timeout_ms == 0) return static_cast<short>(0);
      continue;  // woke before the deadline (rounding): re-check it
    }
    if (errno == EINTR) continue;
    return ErrnoStatus(errno, "poll");
  }
}

}  // namespace kvnode::base
