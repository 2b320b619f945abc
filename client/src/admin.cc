#include "kvnode/client/admin.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client_impl.h"
#include "kvnode/base/poll.h"

namespace kvnode::client {

std::vector<std::string> DefaultAdminSocketCandidates() {
  std::vector<std::string> out = {"/run/kvnode/admin.sock"};
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && *x != '\0') {
    out.push_back(absl::StrCat(x, "/kvnode/admin.sock"));
  }
  out.push_back(absl::StrCat("/tmp/kvnode-", geteuid(), "/admin.sock"));
  return out;
}

std::string DefaultAdminSocketPath() {
  std::vector<std::string> c = DefaultAdminSocketCandidates();
  for (const std::string& p : c) {
    struct stat st;
    if (stat(p.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return p;
  }
  return c.front();
}

absl::StatusOr<std::string> AdminRequest(const std::string& socket_path, std::string_view request,
                                         absl::Time deadline) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("admin socket path too long: ", socket_path));
  }
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) return absl::InternalError(absl::StrCat("socket(AF_UNIX): ", strerror(errno)));
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("connect to admin socket ", socket_path, ": ", strerror(errno)));
  }
  std::string line(request);
  line.push_back('\n');
  size_t sent = 0;
  while (sent < line.size()) {
    ssize_t n = send(fd.get(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      absl::StatusOr<short> ready = base::PollUntil(fd.get(), POLLOUT, deadline);
      if (!ready.ok()) return ready.status();
      if (*ready == 0) return absl::DeadlineExceededError("admin request: send timed out");
      continue;
    }
    return absl::UnavailableError(absl::StrCat("admin request: send: ", strerror(errno)));
  }
  std::string answer;
  char buf[8192];
  for (;;) {
    ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n > 0) {
      answer.append(buf, static_cast<size_t>(n));
      if (answer.size() > (64u << 20)) return absl::ResourceExhaustedError("admin answer > 64 MiB");
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      absl::StatusOr<short> ready = base::PollUntil(fd.get(), POLLIN, deadline);
      if (!ready.ok()) return ready.status();
      if (*ready == 0) {
        return absl::DeadlineExceededError(absl::StrCat(
            "admin request '", std::string(request), "': no complete answer before the deadline"));
      }
      continue;
    }
    return absl::UnavailableError(absl::StrCat("admin request: recv: ", strerror(errno)));
  }
  while (!answer.empty() && (answer.back() == '\n' || answer.back() == '\r')) answer.pop_back();
  if (answer.empty()) return absl::UnavailableError("admin socket closed without an answer");
  return answer;
}

absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::NotFoundError(absl::StrCat("--auth_token_file ", path, ": ", strerror(errno)));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("--auth_token_file ", path, ": not a file"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("--auth_token_file ", path, ": readable by group/others (chmod 600 it)"));
  }
  std::string token;
  char buf[2048];
  for (;;) {
    ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat("read ", path, ": ", strerror(errno)));
    if (n == 0) break;
    token.append(buf, static_cast<size_t>(n));
    if (token.size() > 4096) break;
  }
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty() || token.size() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file ", path, ": token must be 1..1024 bytes"));
  }
  return token;
}

}  // namespace kvnode::client
