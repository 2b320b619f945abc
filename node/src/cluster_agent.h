// The node's side of cluster membership (docs/operations.md, "Cluster
// nodes"): a kvnode started with --cluster serves the slots its shard map
// gives it and keeps a leased member key in etcd.
//
// Life of a cold start (main.cc):
//   1. Create(): the database directory checked, its identity file loaded or
//      created (another cluster's or node's database refused), the persisted
//      map published on the gate. No etcd: the listener that starts next
//      serves this map even when etcd is down.
//   2. Start() once the server listens: the etcd session (NodeSession)
//      registers the member key, state "starting"; MarkServing() when Run()
//      serves.
//   3. Every map the session assembles becomes the gate's ShardView (self by
//      node id; a map without this node owns nothing), and is persisted.
//   4. ShutdownStarted() ("draining") at SIGTERM, Stop() after Run(): the
//      lease is revoked and the member key is gone at once.
// In a live upgrade (upgrade::ClusterMember) the lease passes from the old
// process to the new one in HandOver, and the key is never deleted.
//
// Invariants:
//   1. Only the process that holds the lease writes the member key or the
//      persisted map: the old process stops both in HandOffLease (the new one
//      starts its session only after HandOver) and resumes them only in
//      UpgradeRolledBack, after the new one was killed.
//   2. No method waits on etcd, except Stop(), for at most one rpc deadline
//      (the revoke), and HandOffLease(), for an etcd round of the session
//      already under way (at most 4 rpc deadlines); neither holds a lock
//      another thread's call could wait for meanwhile.
//
// Thread safety: every method may be called from any thread; the map
// callback runs on the session's watch thread.
#ifndef KVNODE_NODE_SRC_CLUSTER_AGENT_H_
#define KVNODE_NODE_SRC_CLUSTER_AGENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "guard_agent.h"
#include "kvnode/cluster/identity.h"
#include "kvnode/cluster/member.h"
#include "kvnode/cluster/node_session.h"
#include "kvnode/node/node.h"
#include "kvnode/proto/shard_map.h"
#include "kvnode/server/admin.h"
#include "kvnode/server/shard_gate.h"
#include "roll_agent.h"

namespace kvnode::node {

// The cluster flags as given on the command line.
struct ClusterFlags {
  std::string cluster;                // --cluster; "" = not a cluster member
  std::string etcd_endpoints;         // --etcd_endpoints: host:port[,host:port...]
  std::string node_id;                // --node_id; "" = the identity file's
  int64_t etcd_lease_ttl_s = 3;       // --etcd_lease_ttl_s
  bool etcd_lease_ttl_given = false;  // --etcd_lease_ttl_s was on the command line
};

struct ClusterAgentOptions {
  std::string cluster;                      // required (proto::CheckName)
  std::vector<std::string> etcd_endpoints;  // required, host:port each
  std::string node_id;                      // "" = the identity file's
  int64_t lease_ttl_s = 3;                  // 2..60; keepalive every third
  std::string db_path;                      // required: identity and persisted map live there
  std::string build_id;                     // the member's build_id (default "")
  std::string version;                      // the member's version (default "")
  absl::Duration rpc_deadline = absl::Seconds(1);  // each etcd call; default 1 s
};

// Lease TTL bounds: etcd's floor with default settings is 2 s.
inline constexpr int64_t kMinLeaseTtlS = 2;
inline constexpr int64_t kMaxLeaseTtlS = 60;

// "host:port[,host:port...]" -> the list; InvalidArgument naming
// --etcd_endpoints and the entry that is wrong (empty, no port, a port out
// of 1..65535, a URL scheme).
absl::StatusOr<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list);

// nullopt without --cluster (then --etcd_endpoints, --node_id and
// --etcd_lease_ttl_s must not be given either); otherwise the options with
// cluster, endpoints, node id and TTL checked. Errors name the flag.
absl::StatusOr<std::optional<ClusterAgentOptions>> ClusterOptionsFromFlags(
    const ClusterFlags& flags, const std::string& db_path);

class ClusterAgent final : public upgrade::ClusterMember {
 public:
  // Step 1 above. FailedPrecondition when the database belongs to another
  // node or cluster ("database at D belongs to node 'a' of cluster 'c1', not
  // node 'b' of cluster 'c1'"); InvalidArgument when --node_id is needed.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ClusterAgent>> Create(
      ClusterAgentOptions options);
  ~ClusterAgent() override;  // Stop()
  ClusterAgent(const ClusterAgent&) = delete;
  ClusterAgent& operator=(const ClusterAgent&) = delete;

  // For ServerOptions::shard_gate.
  const std::shared_ptr<server::ShardGate>& gate() const { return gate_; }
  const cluster::Identity& identity() const { return identity_; }

  // Cold start, once the server listens at `endpoint` (the advertised one):
  // the session registers this process as `generation`, state "starting".
  [[nodiscard]] absl::Status Start(const std::string& endpoint, uint64_t generation);
  // The server serves: state "serving".
  void MarkServing();
  // After Server::Run() returned: revokes the lease (the member key goes at
  // once) unless it was handed to a new process. Idempotent.
  void Stop();
  // cluster_map_epoch, cluster_slots_owned, cluster_etcd_connected,
  // cluster_lease_ttl_left_ms, cluster_guard_wanted, cluster_guard_held
  // (Server::SetExtraStats).
  std::vector<server::ExtraStat> Stats() const;

  // Once the process can run a live upgrade: the fleet roll's hook
  // (roll_agent.h), and the error counters the member key carries for the
  // roll's health gate (polled every 200 ms, written when they change).
  void SetUpgrade(RollAgent::UpgradeFn upgrade);
  // Once the server runs: how the migration's guard agent raises and lowers
  // the server's guard (guard_agent.h).
  void SetGuard(GuardAgent::GuardFn guard);
  void SetHealth(std::function<cluster::MemberHealth()> health);

  // upgrade::ClusterMember (node.h).
  void UpgradeStarted() override;
  int64_t HandOffLease() override;
  void UpgradeRolledBack() override;
  void TakeOverStarted(int64_t lease, uint64_t old_generation, int64_t old_pid,
                       const std::string& old_build, const std::string& endpoint) override;
  void TookOver(uint64_t generation) override;
  void UpgradeFinished() override;
  void ShutdownStarted() override;

 private:
  ClusterAgent(ClusterAgentOptions options, cluster::Identity identity);
  // The persisted map, published when it differs from the gate's (at Create
  // and when a new process takes over).
  void LoadPersistedMap(const char* when);
  // The session's on_map (watch thread): publish, then persist.
  void OnMap(proto::ShardMap map);
  // The session's on_refused (lease thread).
  void OnRefused(const absl::Status& s);
  // Publishes `map` as this node's view and logs what changed (under
  // persist_mu_: one publisher at a time, so the log compares in order).
  void Publish(proto::ShardMap map, const char* source) ABSL_EXCLUSIVE_LOCKS_REQUIRED(persist_mu_);
  // Writes the map file unless the lease was handed off or it holds `map`.
  void Persist(const proto::ShardMap& map) ABSL_EXCLUSIVE_LOCKS_REQUIRED(persist_mu_);
  // Creates and starts the session for `self` (adopting `lease` if > 0).
  absl::StatusOr<std::unique_ptr<cluster::NodeSession>> MakeSession();
  absl::Status StartSession(const cluster::Member& self, int64_t lease);
  // Sets the member's state and rewrites the key (if a session runs and the
  // lease was not handed off).
  void SetState(cluster::MemberState state);
  void UpdateMemberLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs the session's registration and etcd connectivity as they change,
  // and rewrites the member's health when it changed.
  void Monitor();
  void UpdateHealthLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClusterAgentOptions options_;
  const cluster::Identity identity_;
  const std::shared_ptr<server::ShardGate> gate_;

  mutable absl::Mutex mu_;
  // Shared: HandOffLease calls it outside mu_ (it may wait for an etcd
  // round under way), possibly from an upgrade thread that outlives Stop().
  std::shared_ptr<cluster::NodeSession> session_ ABSL_GUARDED_BY(mu_);
  // Made at Create, so that its etcd channel connects while the process
  // gets ready; started by StartSession.
  std::unique_ptr<cluster::NodeSession> prepared_ ABSL_GUARDED_BY(mu_);
  cluster::Member self_ ABSL_GUARDED_BY(mu_);
  bool handed_off_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
  std::function<cluster::MemberHealth()> health_ ABSL_GUARDED_BY(mu_);
  // Acts on the fleet roll's plan; uses self_ and the session (mu_).
  RollAgent roll_;
  GuardAgent guard_;

  // Held across the map file's write, so that HandOffLease returns only once
  // no write is under way (invariant 1).
  absl::Mutex persist_mu_;
  bool persist_ ABSL_GUARDED_BY(persist_mu_) = true;
  // The node id is bound to another database (NodeSession contract 2): no
  // map is published or persisted any more; the node owns no slot.
  bool disowned_ ABSL_GUARDED_BY(persist_mu_) = false;
  std::optional<proto::ShardMap> persisted_ ABSL_GUARDED_BY(persist_mu_);
};

}  // namespace kvnode::node

#endif  // KVNODE_NODE_SRC_CLUSTER_AGENT_H_
