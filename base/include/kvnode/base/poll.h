// Waiting for a descriptor with a deadline.
#ifndef KVNODE_BASE_POLL_H_
#define KVNODE_BASE_POLL_H_

#include <poll.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvnode::base {

// Milliseconds until `deadline` for poll(), rounded up so that a caller never
// spins on a 0 ms timeout before the deadline; -1 = forever (InfiniteFuture);
// 0 once past.
int PollTimeoutMs(absl::Time deadline);

// Waits until `fd` reports one of `events` (or POLLERR/POLLHUP/POLLNVAL, which
// poll() always reports: the next I/O call on fd tells what happened) or the
// deadline passes. EINTR is retried. Returns the revents, 0 when the deadline
// passed first, or poll()'s error.
[[nodiscard]] absl::StatusOr<short> PollUntil(int fd, short events, absl::Time deadline);

}  // namespace kvnode::base

#endif  // KVNODE_BASE_POLL_H_
