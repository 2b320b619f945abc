// What a cluster member keeps in its database directory:
//
//   <db_path>/cluster-identity  "cluster=<name>\nnode_id=<id>\ninstance=<hex>\n"
//   <db_path>/cluster-map       the last validated map (proto::EncodeShardMap)
//
// Both are mode 0600 and replaced atomically: written to "<name>.tmp"
// (created O_EXCL|O_NOFOLLOW after removing a stale one), fsync'd, renamed
// over the name, the directory fsync'd. The directory must be the node's own
// (base::EnsureOwnDirectory, no group/other write). Reads never follow a
// symbolic link and refuse files larger than a sane bound.
//
// Thread safety: functions; callers serialize writes to one directory.
#ifndef KVNODE_CLUSTER_IDENTITY_H_
#define KVNODE_CLUSTER_IDENTITY_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::cluster {

inline constexpr char kIdentityFileName[] = "cluster-identity";
inline constexpr char kMapFileName[] = "cluster-map";

struct Identity {
  std::string cluster;
  std::string node_id;
  std::string instance;  // 32 lowercase hex digits (128 random bits)
  friend bool operator==(const Identity&, const Identity&) = default;
};

// 128 bits from getrandom(2) as 32 lowercase hex digits.
absl::StatusOr<std::string> NewInstanceId();

// Text form above, and its strict parser (`path` named in errors).
std::string EncodeIdentity(const Identity& identity);
absl::StatusOr<Identity> DecodeIdentity(std::string_view text, std::string_view path);

// The identity file of `db_path`; nullopt when there is none.
absl::StatusOr<std::optional<Identity>> LoadIdentity(const std::string& db_path);
absl::Status StoreIdentity(const std::string& db_path, const Identity& identity);

// Start-up resolution. With a file: `cluster` must match it and `node_id`
// must match or be empty, else FailedPrecondition "database at D belongs to
// node 'a' of cluster 'c1', not node 'b' of cluster 'c1'". Without one: a new
// identity from `cluster`, `node_id` (required then: InvalidArgument naming
// --node_id) and a new instance id, stored.
absl::StatusOr<Identity> LoadOrCreateIdentity(const std::string& db_path, std::string_view cluster,
                                              std::string_view node_id);

// The persisted map of `db_path`; nullopt when there is none. A map of
// another cluster than `cluster`, or one that does not decode, is an error
// naming the file.
absl::StatusOr<std::optional<proto::ShardMap>> LoadMap(const std::string& db_path,
                                                       std::string_view cluster);
absl::Status StoreMap(const std::string& db_path, const proto::ShardMap& map);

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_IDENTITY_H_
