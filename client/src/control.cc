// The control connection: non-blocking TCP connect, frames sent and received
// without waiting, the one poll() of Wait/WaitAny, and the mapping of the
// server's Error frames to typed statuses.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client_impl.h"
#include "kvnode/proto/frame_io.h"

namespace kvnode::client {

absl::StatusOr<Fd> TcpConnectStart(const std::string& endpoint) {
  absl::StatusOr<proto::HostPort> hp = proto::ParseHostPort(endpoint);
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(hp->port);
  if (int rc = getaddrinfo(hp->host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(absl::StrCat("resolve '", hp->host, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for ", endpoint));
  // The first address whose connect() does not fail at once; the caller
  // waits for the rest of the connection.
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.get() < 0) {
      last = absl::InternalError(absl::StrCat("socket(): ", strerror(errno)));
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last = absl::UnavailableError(
          absl::StrCat("connect to ", endpoint, ": ", strerror(errno), " (errno ", errno, ")"));
      continue;
    }
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

absl::StatusOr<bool> TcpConnectDone(int fd, const std::string& endpoint) {
  pollfd p{fd, POLLOUT, 0};
  int n;
  do {
    n = poll(&p, 1, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return absl::InternalError(absl::StrCat("poll(connect): ", strerror(errno)));
  if (n == 0) return false;
  int err = 0;
  socklen_t len = sizeof(err);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    return absl::UnavailableError(
        absl::StrCat("connect to ", endpoint, ": ", strerror(err), " (errno ", err, ")"));
  }
  return true;
}

absl::StatusOr<Fd> TcpConnect(const std::string& endpoint, absl::Time deadline) {
  absl::StatusOr<Fd> fd = TcpConnectStart(endpoint);
  if (!fd.ok()) return fd;
  for (;;) {
    absl::StatusOr<bool> done = TcpConnectDone(fd->get(), endpoint);
    if (!done.ok()) return done.status();
    if (*done) return fd;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("connect to ", endpoint, ": no answer before the deadline"));
    }
    pollfd p{fd->get(), POLLOUT, 0};
    PollFds(std::span<pollfd>(&p, 1), deadline);
  }
}

absl::Status SendFrame(int fd, const proto::ControlMessage& m) {
  // A deadline of now: WriteControl sends what fits and never polls for room.
  return proto::WriteControl(fd, m, absl::Now());
}

absl::Status ReceiveAvailable(int fd, proto::FrameAssembler* assembler) {
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      assembler->Append(std::string_view(buf, static_cast<size_t>(n)));
      continue;
    }
    if (n == 0) return absl::UnavailableError("the server closed the control connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("control connection: ", strerror(errno), " (errno ", errno, ")"));
  }
}

void PollFds(std::span<pollfd> fds, absl::Time until) {
  const absl::Duration left = until - absl::Now();
  if (left <= absl::ZeroDuration()) return;
  const int ms = static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(left + absl::Microseconds(999)), 1000));
  int n;
  do {
    n = poll(fds.data(), fds.size(), ms);
  } while (n < 0 && errno == EINTR);
}

absl::Status ServerErrorStatus(const proto::Error& e, std::string_view during) {
  const std::string msg = absl::StrCat("server refused ", std::string(during), ": error ",
                                       static_cast<uint32_t>(e.code), " (", e.message, ")");
  switch (e.code) {
    case proto::ErrorCode::kAuthFailed:
      return absl::PermissionDeniedError(msg);
    case proto::ErrorCode::kUnsupportedVersion:
      return absl::FailedPreconditionError(msg);
    case proto::ErrorCode::kTooManyClients:
      return absl::ResourceExhaustedError(msg);
    case proto::ErrorCode::kUnknownClient:
      return absl::NotFoundError(msg);
    case proto::ErrorCode::kMalformed:
    case proto::ErrorCode::kUnexpectedMessage:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

}  // namespace kvnode::client
