// Small private files in the node's own directory, replaced atomically
// (identity.cc's two files).
#ifndef KVNODE_CLUSTER_SRC_FILE_IO_H_
#define KVNODE_CLUSTER_SRC_FILE_IO_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvnode::cluster {

// Replaces `dir`/`name` by `bytes`: "<name>.tmp" is removed if present,
// created O_EXCL|O_NOFOLLOW mode 0600, written, fsync'd and renamed over
// the name; then the directory is fsync'd. The directory must pass
// base::EnsureOwnDirectory (no group/other write; created 0700 if missing).
absl::Status WriteFileAtomically(const std::string& dir, std::string_view name,
                                 std::string_view bytes);

// The contents of `path` (never through a symbolic link); nullopt when it
// does not exist. Not a regular file, or larger than `max_size`: an error
// naming the path.
absl::StatusOr<std::optional<std::string>> ReadSmallFile(const std::string& path, size_t max_size);

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_SRC_FILE_IO_H_
