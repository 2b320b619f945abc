// A node's membership in its cluster: its etcd session.
//
// On its own thread it (1) connects to etcd, retrying forever with backoff
// (100 ms doubling to 2 s); (2) registers the member key with a lease of
// ttl seconds (or the adopted lease of a live upgrade); (3) keeps the lease
// alive every ttl/3 and, when the lease expired anyway, registers again with
// a new one; (4) watches the cluster's prefix (map and members) and calls
// on_map with the assembled map (member.h Assemble) whenever it changes.
//
// Contracts:
//  1. Only valid maps reach on_map. A stored map that does not decode is
//     logged with its reason, put in Status().last_error, and the last good
//     map stays (no call). A malformed member value counts as no member.
//  2. The node id is bound to the database that first registered it: the
//     instance key (keys.h InstanceKey, no lease) is created holding this
//     session's `instance` if absent, and the member key is written only by
//     a Txn that requires the instance key to hold it and the member key to
//     be absent or carry this `instance`. A node id bound to another
//     instance is refused for good: on_refused with PermissionDenied "node
//     id 'b' belongs to another database: ... holds instance <hex>, this
//     database is instance <hex> ...", the session never tries again and
//     never calls on_map (maps are held back until the binding is
//     confirmed). A member key held by another instance of the same binding
//     (not normally possible) is refused with FailedPrecondition "node id
//     'b' is held by another node: instance <hex> (pid P, endpoint E)" and
//     retried. kvctl cluster forget-node (admin.h) removes a binding.
//  3. Nothing here blocks its caller on etcd: every public method returns
//     without an etcd round trip, except Stop(revoke=true), which waits at
//     most one rpc_deadline for the revoke, and HandOffLease (below).
//  4. on_map runs on the session's watch thread, on_refused on its lease
//     thread; each one call at a time, never after Stop returns. Neither may
//     call Stop.
//
// Thread safety: every method may be called from any thread; Start and Stop
// are called once each, by the owner, not concurrently with each other.
#ifndef KVNODE_CLUSTER_NODE_SESSION_H_
#define KVNODE_CLUSTER_NODE_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/cluster/member.h"
#include "kvnode/cluster/migration.h"
#include "kvnode/cluster/roll.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::cluster {

struct NodeSessionOptions {
  std::vector<std::string> endpoints;  // --etcd_endpoints; required
  std::string cluster;                 // --cluster; required
  std::string node_id;                 // --node_id (or the identity file's)
  std::string instance;                // identity.h; required
  // --etcd_lease_ttl_s: member lease TTL, 2..60 s; keepalive every ttl/3.
  int64_t lease_ttl_s = 3;
  // Deadline of each etcd call. Default 1 s; 100 ms..30 s.
  absl::Duration rpc_deadline = absl::Seconds(1);
  // Longest wait between reconnect attempts. Default 2 s.
  absl::Duration max_backoff = absl::Seconds(2);

  // InvalidArgument naming the flag that is wrong.
  absl::Status Validate() const;
};

struct NodeSessionCallbacks {
  // Each new valid assembled map (epoch or membership changed).
  std::function<void(proto::ShardMap)> on_map;
  // The member key is held by another instance (contract 2). Optional.
  std::function<void(const absl::Status&)> on_refused;
  // The fleet roll's plan changed (nullopt: none, or one that does not
  // decode). Held back, like maps, until the binding is confirmed; on the
  // watch thread, after on_map. Optional.
  std::function<void(const std::optional<RollPlan>&)> on_roll;
  // The slot migration's plan changed (nullopt: none, or one that does not
  // decode); like on_roll, after it. Optional.
  std::function<void(const std::optional<MigrationPlan>&)> on_migration;
};

struct NodeSessionStatus {
  bool etcd_connected = false;
  bool registered = false;        // the member key is ours and the lease alive
  int64_t lease_id = 0;           // 0 before the first registration
  int64_t lease_ttl_left_ms = 0;  // as of the last keepalive answer
  uint64_t map_epoch = 0;         // of the last map delivered; 0 none yet
  int64_t registrations = 0;      // times the member key was (re)written with a new lease
  int64_t map_errors = 0;         // stored maps refused (contract 1)
  std::string last_error;         // empty when the last attempt succeeded
};

class NodeSession {
 public:
  static absl::StatusOr<std::unique_ptr<NodeSession>> Create(NodeSessionOptions options,
                                                             NodeSessionCallbacks callbacks);
  virtual ~NodeSession() = default;  // Stop(false) if still running

  // Starts the thread. `self.node_id` and `self.instance` must be the
  // options'. adopt_lease: the lease a live upgrade's old process handed
  // over; used while it lives (a dead one is replaced by a new lease).
  virtual absl::Status Start(Member self, std::optional<int64_t> adopt_lease) = 0;
  // Rewrites the member value (state, generation, ...), asynchronously.
  virtual void UpdateMember(Member self) = 0;
  // Stops keepalives without revoking and returns the lease id (0 if none),
  // for the new process of a live upgrade. Watching continues. Waits for an
  // etcd round of the lease thread already under way (at most 4 rpc
  // deadlines), so that no write of this session follows the new process's.
  virtual int64_t HandOffLease() = 0;
  // Takes the lease back after a rolled-back upgrade (re-registers if it
  // expired meanwhile).
  virtual void ResumeLease() = 0;
  // Stops the threads. revoke: revoke the lease first (deletes the member key).
  virtual void Stop(bool revoke) = 0;

  virtual NodeSessionStatus Status() const = 0;
};

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_NODE_SESSION_H_
