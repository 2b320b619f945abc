// A cluster member as stored at MemberKey(cluster, node_id), attached to the
// node's lease, and the assembly of the clients' map from the stored map and
// the live members.
//
//   {"node_id":"a","endpoint":"10.0.0.1:7000","generation":3,
//    "build_id":"v0.1-12-gabc","version":"0.1.0","state":"serving",
//    "pid":1234,"instance":"<32 hex digits>",
//    "health":{"rejected":0,"qp_errors":0,"upgrade_failures":0},
//    "roll":{"id":"r-...","attempt":1,"outcome":"rolled_back","reason":"..."},
//    "migration":{"id":"m-...","first":1024,"attempt":1,"state":"copying",
//                 "keys":10,"bytes":4096,"reason":""}}
// (health, roll and migration optional)
//
// Thread safety: pure values and functions.
#ifndef KVNODE_CLUSTER_MEMBER_H_
#define KVNODE_CLUSTER_MEMBER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::cluster {

// A member value larger than this is refused before parsing.
inline constexpr size_t kMaxMemberJsonSize = 16 << 10;
// Longest endpoint, build id and version string accepted.
inline constexpr size_t kMaxMemberFieldSize = 256;

enum class MemberState { kStarting, kServing, kDraining, kUpgrading };

// "starting", "serving", "draining", "upgrading".
std::string_view MemberStateName(MemberState state);
std::optional<MemberState> ParseMemberState(std::string_view name);

// The error counters a fleet roll's health gate watches (docs/cluster.md,
// "A member"); monotonic across live upgrades.
struct MemberHealth {
  uint64_t rejected = 0;          // RPCs answered REJECTED
  uint64_t qp_errors = 0;         // client QPs gone to the error state
  uint64_t upgrade_failures = 0;  // live upgrades rolled back or refused
  friend bool operator==(const MemberHealth&, const MemberHealth&) = default;
};

// A node's answer to a roll's intent it could not carry out.
struct RollReport {
  std::string id;  // the plan's roll_id
  uint64_t attempt = 0;
  std::string outcome;  // "rolled_back" | "refused"
  std::string reason;
  friend bool operator==(const RollReport&, const RollReport&) = default;
};

// A move's target node's word on the attempt it runs (docs/cluster.md,
// "Slot migration"): its progress while it copies, or its failure. The
// driver reads it; only the move's target writes it.
enum class MoveReportState { kCopying, kFailed };

// "copying", "failed".
std::string_view MoveReportStateName(MoveReportState state);
std::optional<MoveReportState> ParseMoveReportState(std::string_view name);

struct MigrationReport {
  std::string id;        // the plan's migration_id
  uint32_t first = 0;    // the move's first slot, which names it in the plan
  uint64_t attempt = 0;  // the move's attempt this report is about
  MoveReportState state = MoveReportState::kCopying;
  uint64_t keys = 0;   // copied so far by this attempt
  uint64_t bytes = 0;  // keys and values, likewise
  std::string reason;  // kFailed: why
  friend bool operator==(const MigrationReport&, const MigrationReport&) = default;
};

struct Member {
  std::string node_id;      // proto::CheckName rules
  std::string endpoint;     // control endpoint clients connect to, host:port
  uint64_t generation = 0;  // upgrade generation of the serving process
  std::string build_id;     // `git describe` of the binary
  std::string version;      // project version of the binary
  MemberState state = MemberState::kStarting;
  int64_t pid = 0;
  std::string instance;                      // identity.h: the database's random instance id
  std::optional<MemberHealth> health;        // absent in a member of an older build
  std::optional<RollReport> roll;            // the last intent it could not carry out
  std::optional<MigrationReport> migration;  // the move it copies or failed, as target
  friend bool operator==(const Member&, const Member&) = default;
};

std::string EncodeMemberJson(const Member& member);

// Parses a member value read at `key` (named in every error, with what is
// wrong: not JSON, a field missing or of the wrong type, a bad node id or
// state, a field too long). When `expected_node_id` is not empty the value's
// node_id must equal it (the key's last component).
absl::StatusOr<Member> DecodeMemberJson(std::string_view json, std::string_view key,
                                        std::string_view expected_node_id);

// The clients' map: `stored` (a valid map from DecodeMapJson) with each node's
// endpoint and generation taken from its live member and alive set when it
// has one. Members not in the map are ignored; nodes without a member keep an
// empty endpoint, generation 0 and alive false.
proto::ShardMap Assemble(const proto::ShardMap& stored, const std::vector<Member>& live);

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_MEMBER_H_
