#include "kvnode/base/errno.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvnode::base {

std::string ErrnoText(int err) { return absl::StrCat(std::strerror(err), " (errno ", err, ")"); }

absl::Status ErrnoStatus(int err, std::string_view what) {
  const std::string msg = absl::StrCat(Av(what), ": ", ErrnoText(err));
  switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
    case ECONNREFUSED:
    case ETIMEDOUT:
      return absl::UnavailableError(msg);
    default:
      return absl::Status(absl::ErrnoToStatusCode(err), msg);
  }
}

}  // namespace kvnode::base
