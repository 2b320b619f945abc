// Socket helpers for the control loop: listeners (TCP, Unix), address
// rendering. Errors carry errno and what was attempted.
#ifndef KVNODE_SERVER_SRC_NET_H_
#define KVNODE_SERVER_SRC_NET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvnode::server {

// Splits "host:port" / "[v6]:port" (port 0..65535 allowed, unlike
// proto::ParseHostPort, so that tests can ask for any free port).
struct ListenAddress {
  std::string host;
  uint16_t port = 0;
};
[[nodiscard]] absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view s);

// A non-blocking, close-on-exec TCP socket with SO_REUSEADDR bound to
// `address`, not listening yet: a second node on the port fails at once, and
// clients that connect before StartListening are refused (and back off)
// instead of waiting in the backlog for a node that is still starting.
// Errors name `flag`, the option the address came from.
[[nodiscard]] absl::StatusOr<int> BindTcp(const std::string& address,
                                          absl::string_view flag = "--listen");
[[nodiscard]] absl::Status StartListening(int fd, const std::string& address,
                                          absl::string_view flag = "--listen");

// A non-blocking Unix stream listener at `path`, mode 0600. The parent
// directory is created 0700 if missing. A stale socket file (nobody
// listening) is replaced; a live one is an error (another node runs).
[[nodiscard]] absl::StatusOr<int> ListenUnix(const std::string& path);

// "ip:port" of a socket's local or peer address; "?" if unknown.
std::string SockName(int fd);
std::string PeerName(int fd);

// Checks that the fd is a listening socket (for inherited fds).
[[nodiscard]] absl::Status CheckListening(int fd, const char* what);

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_SRC_NET_H_
