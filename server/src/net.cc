#include "net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"

namespace kvnode::server {
namespace {

absl::Status Errno(absl::string_view what, int err) {
  return base::ErrnoStatus(err, std::string_view(what.data(), what.size()));
}

std::string Render(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    return absl::StrCat(host, ":", port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    return absl::StrCat("[", host, "]:", port);
  }
  if (ss.ss_family == AF_UNIX) return "unix";
  return "?";
}

}  // namespace

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "': expected host:port"));
  }
  absl::string_view host = s.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') {
      return absl::InvalidArgumentError(absl::StrCat("'", s, "': bad [ipv6] host"));
    }
    host = host.substr(1, host.size() - 2);
  }
  uint32_t port = 0;
  if (!absl::SimpleAtoi(s.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "': port must be 0..65535"));
  }
  return ListenAddress{std::string(host), static_cast<uint16_t>(port)};
}

absl::StatusOr<int> BindTcp(const std::string& address, absl::string_view flag) {
  absl::StatusOr<ListenAddress> a = ParseListenAddress(address);
  if (!a.ok()) return a.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(a->port);
  if (int rc = getaddrinfo(a->host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", address, ": ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = Errno("socket", errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      last = Errno(absl::StrCat(flag, " ", address, ": bind"), errno);
      close(fd);
      continue;
    }
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

absl::Status StartListening(int fd, const std::string& address, absl::string_view flag) {
  if (listen(fd, SOMAXCONN) != 0) {
    return Errno(absl::StrCat(flag, " ", address, ": listen"), errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ListenUnix(const std::string& path) {
  sockaddr_un sun{};
  if (path.empty() || path.size() >= sizeof(sun.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--admin_socket '", path, "': empty or longer than ", sizeof(sun.sun_path) - 1, " bytes"));
  }
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return Errno(absl::StrCat("mkdir ", dir), errno);
    }
  }
  sun.sun_family = AF_UNIX;
  std::memcpy(sun.sun_path, path.data(), path.size());
  // A live node on this path? Then refuse rather than steal its socket.
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::AlreadyExistsError(
          absl::StrCat("--admin_socket ", path, " exists and is not a socket"));
    }
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0) {
      const bool live = connect(probe, reinterpret_cast<sockaddr*>(&sun), sizeof(sun)) == 0;
      close(probe);
      if (live) {
        return absl::AlreadyExistsError(absl::StrCat(
            "--admin_socket ", path, ": another process is listening there (a node running?)"));
      }
    }
    unlink(path.c_str());
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket(AF_UNIX)", errno);
  // Owner only from the start: no window in which others could connect.
  const mode_t old = umask(0177);
  const int rc = bind(fd, reinterpret_cast<sockaddr*>(&sun), sizeof(sun));
  const int err = errno;
  umask(old);
  if (rc != 0) {
    close(fd);
    return Errno(absl::StrCat("bind ", path), err);
  }
  if (chmod(path.c_str(), 0600) != 0 || listen(fd, 16) != 0) {
    const int e = errno;
    close(fd);
    unlink(path.c_str());
    return Errno(absl::StrCat("listen ", path), e);
  }
  return fd;
}

std::string SockName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return Render(ss);
}

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return Render(ss);
}

absl::Status CheckListening(int fd, const char* what) {
  int v = 0;
  socklen_t len = sizeof(v);
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) != 0) {
    return Errno(absl::StrCat("inherited ", what, " fd ", fd), errno);
  }
  if (v == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("inherited ", what, " fd ", fd, " is not a listening socket"));
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  return absl::OkStatus();
}

}  // namespace kvnode::server
