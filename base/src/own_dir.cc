#include "kvnode/base/own_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvnode/base/errno.h"

namespace kvnode::base {
namespace {

// What is wrong with a directory of mode/owner `st`; empty when nothing.
std::string WhatIsWrong(const struct stat& st, mode_t forbidden) {
  const uid_t me = geteuid();
  if (S_ISLNK(st.st_mode)) return "is a symbolic link";
  if (!S_ISDIR(st.st_mode)) return "is not a directory";
  if (st.st_uid != me) {
    return absl::StrCat("is owned by uid ", st.st_uid, ", not by this node's uid ", me);
  }
  if ((st.st_mode & forbidden) == 0) return "";
  return absl::StrFormat("has mode %04o: group/others %s", st.st_mode & 07777,
                         (st.st_mode & forbidden & 0022) != 0 ? "can write it" : "have access");
}

}  // namespace

absl::Status EnsureOwnDirectory(std::string_view what, const std::string& dir_in, mode_t forbidden,
                                MissingDir missing) {
  // "d/" would make lstat follow a link named d.
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (missing == MissingDir::kCreate && mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrCat(Av(what), ": mkdir ", dir, ": ", ErrnoText(errno)));
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT && missing == MissingDir::kAccept) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat(Av(what), ": stat ", dir, ": ", ErrnoText(errno)));
  }
  const std::string why = WhatIsWrong(st, forbidden);
  if (why.empty()) return absl::OkStatus();
  const char* rule = (forbidden & 0077) == 0077 ? "with mode 0700" : "that only it can write";
  return absl::PermissionDeniedError(absl::StrCat(
      Av(what), ": directory ", dir, " ", why, "; it must be a directory owned by uid ", geteuid(),
      " ", rule, " (whoever can write it can replace the node's files)"));
}

}  // namespace kvnode::base
