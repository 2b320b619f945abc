#include "file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "kvnode/base/own_dir.h"
#include "kvnode/base/unique_fd.h"

namespace kvnode::cluster {
namespace {

using base::Av;

absl::Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return base::ErrnoStatus(errno, absl::StrCat("write ", path));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  if (::fsync(fd) != 0) return base::ErrnoStatus(errno, absl::StrCat("fsync ", path));
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  base::UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return base::ErrnoStatus(errno, absl::StrCat("open ", dir));
  if (::fsync(fd.get()) != 0) return base::ErrnoStatus(errno, absl::StrCat("fsync ", dir));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& dir, std::string_view name,
                                 std::string_view bytes) {
  if (auto s = base::EnsureOwnDirectory("database directory", dir, 022); !s.ok()) return s;
  const std::string path = absl::StrCat(dir, "/", Av(name));
  const std::string tmp = absl::StrCat(path, ".tmp");
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) {
    return base::ErrnoStatus(errno, absl::StrCat("unlink ", tmp));
  }
  {
    base::UniqueFd fd(
        ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) return base::ErrnoStatus(errno, absl::StrCat("create ", tmp));
    if (auto s = WriteAll(fd.get(), bytes, tmp); !s.ok()) return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return base::ErrnoStatus(errno, absl::StrCat("rename ", tmp, " to ", path));
  }
  return SyncDir(dir);
}

absl::StatusOr<std::optional<std::string>> ReadSmallFile(const std::string& path, size_t max_size) {
  base::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid() && errno == ENOENT) return std::nullopt;
  if (!fd.valid()) return base::ErrnoStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return base::ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  if (static_cast<size_t>(st.st_size) > max_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " has ", st.st_size, " bytes, more than ", max_size));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd.get(), out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return base::ErrnoStatus(errno, absl::StrCat("read ", path));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

}  // namespace kvnode::cluster
