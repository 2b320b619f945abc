#include "kvnode/proto/frame_io.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "kvnode/base/poll.h"
#include "kvnode/proto/wire.h"

namespace kvnode::proto {
namespace {

// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline, std::string_view what) {
  absl::StatusOr<short> r = base::PollUntil(fd, events, deadline);
  if (!r.ok()) {
    return absl::Status(
        r.status().code(),
        absl::StrCat("control: fd ", fd, " while ", wire::Av(what), ": ", r.status().message()));
  }
  if (*r == 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("control: deadline passed while ", wire::Av(what)));
  }
  return absl::OkStatus();  // ready, or POLLERR/POLLHUP: the I/O call tells
}

absl::Status IoError(int err, std::string_view what, int fd) {
  return base::ErrnoStatus(err, absl::StrCat("control: ", wire::Av(what), " on fd ", fd));
}

}  // namespace

absl::Status WriteAll(int fd, std::span<const uint8_t> bytes, absl::Time deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = WaitFor(fd, POLLOUT, deadline, "sending"); !s.ok()) return s;
      continue;
    }
    return IoError(n < 0 ? errno : EPIPE, "send", fd);
  }
  return absl::OkStatus();
}

absl::Status ReadExactly(int fd, std::span<uint8_t> bytes, absl::Time deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = recv(fd, bytes.data() + done, bytes.size() - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(
          done == 0 ? absl::StrCat("control: peer on fd ", fd, " closed the connection")
                    : absl::StrCat("control: peer on fd ", fd, " closed the connection after ",
                                   done, " of ", bytes.size(), " bytes"));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s = WaitFor(fd, POLLIN, deadline, "receiving"); !s.ok()) return s;
      continue;
    }
    return IoError(errno, "recv", fd);
  }
  return absl::OkStatus();
}

absl::Status WriteControl(int fd, const ControlMessage& m, absl::Time deadline) {
  std::string frame;
  if (absl::Status s = EncodeControl(m, &frame); !s.ok()) return s;
  return WriteAll(fd, AsBytes(frame), deadline);
}

absl::StatusOr<ControlMessage> ReadControl(int fd, absl::Time deadline) {
  std::array<uint8_t, kFrameHeaderSize> head;
  if (absl::Status s = ReadExactly(fd, head, deadline); !s.ok()) return s;
  absl::StatusOr<FrameHeader> h = DecodeFrameHeader(head);
  if (!h.ok()) return h.status();
  std::string payload(h->payload_size, '\0');
  std::span<uint8_t> p(reinterpret_cast<uint8_t*>(payload.data()), payload.size());
  if (absl::Status s = ReadExactly(fd, p, deadline); !s.ok()) {
    if (absl::IsUnavailable(s)) {
      return absl::UnavailableError(
          absl::StrCat(s.message(), " (mid-frame, ", MessageTypeName(h->type), ")"));
    }
    return s;
  }
  return DecodeControlPayload(*h, p);
}

}  // namespace kvnode::proto
