#include "kvnode/upgrade/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvnode/base/unique_fd.h"
#include "kvnode/proto/wire.h"

namespace kvnode::upgrade {

using proto::wire::Av;

absl::Status SdNotify(std::string_view state) {
  const char* env = getenv("NOTIFY_SOCKET");
  if (env == nullptr || env[0] == '\0') return absl::OkStatus();
  const std::string_view path(env);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path) || (path[0] != '/' && path[0] != '@')) {
    return absl::InvalidArgumentError(
        absl::StrCat("sd_notify: NOTIFY_SOCKET='", Av(path), "' is not a path or @abstract name"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (path[0] == '@') addr.sun_path[0] = '\0';
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() +
                                               (path[0] == '@' ? 0 : 1));
  base::UniqueFd fd(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat("sd_notify: socket: ", std::strerror(errno)));
  }
  ssize_t n;
  do {
    n = sendto(fd.get(), state.data(), state.size(), MSG_NOSIGNAL | MSG_DONTWAIT,
               reinterpret_cast<const sockaddr*>(&addr), len);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return absl::UnavailableError(
        absl::StrCat("sd_notify: sendto ", Av(path), ": ", std::strerror(errno)));
  }
  if (static_cast<size_t>(n) != state.size()) {
    return absl::InternalError("sd_notify: short datagram");
  }
  return absl::OkStatus();
}

absl::Status SdNotifyReady() { return SdNotify("READY=1"); }

absl::Status SdNotifyReloading() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const uint64_t usec =
      static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
  return SdNotify(absl::StrCat("RELOADING=1\nMONOTONIC_USEC=", usec));
}

absl::Status SdNotifyMainPid(pid_t pid) { return SdNotify(absl::StrCat("MAINPID=", pid)); }

absl::Status SdNotifyNewMainPid(pid_t pid) {
  return SdNotify(absl::StrCat("MAINPID=", pid, "\nREADY=1"));
}

absl::Status SdNotifyStatus(std::string_view text) {
  if (text.find('\n') != std::string_view::npos) {
    return absl::InvalidArgumentError("sd_notify: STATUS text with a newline");
  }
  return SdNotify(absl::StrCat("STATUS=", Av(text)));
}

absl::Status SdNotifyStopping() { return SdNotify("STOPPING=1"); }

}  // namespace kvnode::upgrade
