// Reading and writing whole control frames on a connected stream socket, with
// a deadline. Works on blocking and non-blocking sockets alike: every wait is
// a poll() bounded by the deadline, every transfer uses MSG_DONTWAIT (and
// MSG_NOSIGNAL when sending, so a vanished peer is an error, not SIGPIPE).
// Partial transfers and EINTR are handled.
//
// After any error from these functions the stream may be mid-frame: the
// caller must close the connection (a timeout included).
//
// Error codes: DeadlineExceeded when the deadline passed; Unavailable when
// the peer closed or reset the connection (message says whether mid-frame);
// the decode errors of control.h for a bad frame; Internal for other errno.
#ifndef KVNODE_PROTO_FRAME_IO_H_
#define KVNODE_PROTO_FRAME_IO_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/proto/control.h"

namespace kvnode::proto {

// Sends all of `bytes` before `deadline`.
[[nodiscard]] absl::Status WriteAll(int fd, std::span<const uint8_t> bytes, absl::Time deadline);

// Receives exactly bytes.size() bytes before `deadline`.
[[nodiscard]] absl::Status ReadExactly(int fd, std::span<uint8_t> bytes, absl::Time deadline);

// Encodes `m` and sends the whole frame.
[[nodiscard]] absl::Status WriteControl(int fd, const ControlMessage& m, absl::Time deadline);

// Receives one whole frame and decodes it. A peer that closes cleanly
// between frames gives Unavailable("... closed the connection").
[[nodiscard]] absl::StatusOr<ControlMessage> ReadControl(int fd, absl::Time deadline);

}  // namespace kvnode::proto

#endif  // KVNODE_PROTO_FRAME_IO_H_
