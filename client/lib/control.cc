// The control connection: TCP connect with a deadline and the mapping of the
// server's Error frames to typed statuses.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client_impl.h"

namespace kvnode::client {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Fd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

namespace {

int MillisUntil(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  const int64_t ms = absl::ToInt64Milliseconds(left + absl::Microseconds(999));
  return ms > 1000000 ? 1000000 : static_cast<int>(ms);
}

}  // namespace

absl::StatusOr<Fd> TcpConnect(const std::string& endpoint, absl::Time deadline) {
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
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.get() < 0) {
      last = absl::InternalError(absl::StrCat("socket(): ", strerror(errno)));
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int rc = connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
      last = absl::UnavailableError(
          absl::StrCat("connect to ", endpoint, ": ", strerror(errno), " (errno ", errno, ")"));
      continue;
    }
    if (rc != 0) {
      for (;;) {
        pollfd p{fd.get(), POLLOUT, 0};
        int n = poll(&p, 1, MillisUntil(deadline));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          last = absl::InternalError(absl::StrCat("poll(connect): ", strerror(errno)));
          break;
        }
        if (n == 0) {
          last = absl::DeadlineExceededError(
              absl::StrCat("connect to ", endpoint, ": no answer before the deadline"));
          break;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          last = absl::UnavailableError(
              absl::StrCat("connect to ", endpoint, ": ", strerror(err), " (errno ", err, ")"));
          break;
        }
        freeaddrinfo(res);
        return fd;
      }
      continue;
    }
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
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
