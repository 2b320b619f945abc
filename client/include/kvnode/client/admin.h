// The node's admin socket (a Unix stream socket; see docs/protocol.md and the
// contract): one request line, one answer, then the server closes.
//
// Thread safety: pure functions; each call uses its own connection.
#ifndef KVNODE_CLIENT_ADMIN_H_
#define KVNODE_CLIENT_ADMIN_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvnode::client {

// Where a node started without --admin_socket listens, in the order the node
// picks them: /run/kvnode/admin.sock, $XDG_RUNTIME_DIR/kvnode/admin.sock,
// /tmp/kvnode-$UID/admin.sock.
std::vector<std::string> DefaultAdminSocketCandidates();
// The first candidate that exists, else the first one.
std::string DefaultAdminSocketPath();

// Sends `request` (a command word and arguments, without the newline) and
// returns the whole answer (for JSON commands one object; trailing newline
// removed). Unavailable when nobody listens, DeadlineExceeded on time-out.
[[nodiscard]] absl::StatusOr<std::string> AdminRequest(const std::string& socket_path,
                                                       std::string_view request,
                                                       absl::Time deadline);

// Reads a token file as the node does: the whole file without its trailing
// newline(s); must be 1..1024 bytes. Refuses a group/world-readable file.
[[nodiscard]] absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path);

}  // namespace kvnode::client

#endif  // KVNODE_CLIENT_ADMIN_H_
