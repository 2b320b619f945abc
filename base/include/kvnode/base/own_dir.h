// Directories the node creates files in by name (the database, the admin
// socket's, the pid file's): the one check of their owner and mode.
//
// Whoever can add, remove or rename names in such a directory can replace a
// file the node creates there, or plant a symbolic link under its name that
// the node would then write through (truncating a file of the attacker's
// choice). A local user who creates the directory before the node does owns
// it. So the node uses a directory only when it is its own and nobody else
// can write it.
#ifndef KVNODE_BASE_OWN_DIR_H_
#define KVNODE_BASE_OWN_DIR_H_

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvnode::base {

enum class MissingDir {
  kCreate,  // create it with mode 0700
  kAccept,  // OK without creating it (a later call creates it)
};

// Checks `dir` (trailing slashes ignored), first creating it with mode 0700
// when it does not exist and `missing` is kCreate (its parent must exist).
// OK when it is a directory, not a symbolic link (never followed), owned by
// this process's effective uid, with none of the mode bits in `forbidden`
// (0077: private to its owner; 0022: nobody else may write it).
// Otherwise PermissionDenied: "<what>: directory <dir> is owned by uid U, not
// by this node's uid N; it must be ..." (or "is a symbolic link", "is not a
// directory", "has mode 0777: ..."), `what` naming the flag and its value.
// The directory is never changed (chmod, chown) to make it pass.
[[nodiscard]] absl::Status EnsureOwnDirectory(std::string_view what, const std::string& dir,
                                              mode_t forbidden,
                                              MissingDir missing = MissingDir::kCreate);

}  // namespace kvnode::base

#endif  // KVNODE_BASE_OWN_DIR_H_
