// libkvclient: a client of a kvnode cluster.
//
// A ClusterClient routes every operation to the node that owns its key, by
// the cluster's shard map (docs/cluster.md, docs/protocol.md). It never
// talks to etcd: it learns the map from the nodes.
//
//   - Connect tries the seeds in order; the first node that completes a
//     session (asking for shard maps: Hello.features kFeatureShardMap) and
//     sends its map (pushed after Ready; asked for with MapRequest when none
//     came within map_wait) gives the first map. A seed that is no cluster
//     member, or none answering, fails Connect with each seed's reason.
//   - Each key goes to the owner of its slot: SlotOf(key, num_slots), then
//     the map's range owner. Per node there is one session: an ordinary
//     Client session (with its own client id, sequences, reconnection and
//     live-upgrade Moves) opened on the first operation for that node, so
//     connecting never stops the other nodes' operations.
//   - A slot whose owner the map says is not alive, and to which no session
//     is up, fails at once with kShardUnavailable ("SHARD_UNAVAILABLE: slot
//     S of node 'b' (not alive in map epoch E)"): nothing is sent. (A
//     session that is up wins over the map: liveness is the pushing node's
//     view, which may be stale.) Operations already at such a node (sent,
//     or waiting for its session to reconnect) fail the same way as soon as
//     both are true, in either order, instead of waiting out their
//     deadline; a write's message adds "the write may have been applied".
//     Once a later map says the node is alive, its operations go to it
//     again.
//   - Maps keep coming on every session (pushed on every change). The
//     client keeps the newest valid one: a higher epoch wins; the same
//     epoch may bring new membership (endpoints, liveness); invalid maps,
//     older epochs and other clusters' maps are ignored. Sessions to nodes
//     that left the map are closed once their operations are done.
//     (follow_pushed_maps = false: only the maps an answer asked for.)
//   - GETs go by RDMA READ of the owner's arena. With slot words (the
//     default, when the node offers them) each READ is followed in the
//     same chain by the READ of the node's ownership byte of the key's
//     slot; a 0 there means the node no longer served the slot when the
//     data was read: the data is dropped and the GET asks the node by RPC,
//     which answers WRONG_SHARD (below). So a client on an old map never
//     takes a stale value or a false NotFound from a node that gave the
//     slot away.
//   - A node that no longer owns a key answers WRONG_SHARD with its map
//     epoch, and guarantees nothing was applied. The client then resubmits
//     the operation, inside its deadline: at once when its own map already
//     names another owner; after asking that node for its map (once) when
//     the node's epoch is newer; after a backoff when the node is behind.
//     A resubmitted write is a new request of the target node's session
//     (its own sequence): exactly-once holds because the first node applied
//     nothing. An epoch no node backs after that one refresh (forged, or a
//     node gone mad) fails the op with kRejected and is never retried.
//
// Threading, progress and result lifetimes are Client's (client.h): owned by
// one thread, progress only inside Submit/Poll/Wait and the synchronous
// calls, OpResult.value valid until the next Submit/Poll/Wait/Close.
// Resources: one Client's worth (device context, QP, registered buffers)
// per node it talks to.
#ifndef KVNODE_CLIENT_CLUSTER_CLIENT_H_
#define KVNODE_CLIENT_CLUSTER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/client/client.h"
#include "kvnode/client/errors.h"

namespace kvnode::client {

struct ClusterClientOptions {
  // "host:port" of nodes of the cluster, tried in order for the first map.
  // Default empty; at least one is required.
  std::vector<std::string> seeds;
  // Options of every node session. Default: ClientOptions's defaults;
  // `server` is ignored (each session goes where the map says).
  ClientOptions base;
  // How long after a seed's session is up Connect waits for the pushed map
  // before it asks with MapRequest; then up to base.connect_timeout for the
  // answer. Default 200 ms. > 0.
  absl::Duration map_wait = absl::Milliseconds(200);
  // Default true: take every newer map the nodes push. False: keep the map
  // held until an answer asks for a newer one (a WRONG_SHARD naming a
  // newer epoch: the MapRequest's answer is taken); pushed maps are
  // dropped meanwhile. A client pinned to an old map, for tests.
  bool follow_pushed_maps = true;
  // Default true: ask the nodes for their slot words (kFeatureSlotWords),
  // so that, while the map held is older than a node's guard, a READ of a
  // node that no longer serves the key's slot is recognised in the same
  // round trip and the GET rerouted. False: READ results are taken as they
  // come, as before the feature, and a node that raises its guard cuts the
  // session (tests that show what the words prevent).
  bool slot_words = true;

  [[nodiscard]] absl::Status Validate() const;
};

// One node of the cluster as this client knows it.
struct ClusterNodeStats {
  std::string node_id;
  std::string endpoint;
  bool alive = false;      // in the current map (false: left the map)
  bool connected = false;  // a session to it is up right now
  uint64_t ops = 0;        // operations it completed for us (OK or failed)
};

// Counters since Connect (monotonic), and the current map's view.
struct ClusterStats {
  uint64_t map_epoch = 0;
  uint64_t maps_adopted = 0;       // newer epochs, or the same epoch's new membership
  uint64_t maps_ignored = 0;       // older, invalid, inconsistent, other cluster
  uint64_t maps_dropped = 0;       // pushed while follow_pushed_maps is off, not taken
  uint64_t map_requests = 0;       // MapRequests sent
  uint64_t wrong_shard = 0;        // WRONG_SHARD answers received
  uint64_t reroutes = 0;           // operations resubmitted after WRONG_SHARD
  uint64_t shard_unavailable = 0;  // operations failed with kShardUnavailable
  uint64_t epochs_refused = 0;     // operations failed on a forged epoch
  // Every node seen in any map, ordered by node id.
  std::vector<ClusterNodeStats> nodes;
};

class ClusterClient {
 public:
  // Validates the options and learns the map from the first seed that
  // answers (each seed's waits bounded by base.connect_timeout and
  // map_wait). Unavailable naming every seed's failure when none does.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ClusterClient>> Connect(
      ClusterClientOptions options);

  ~ClusterClient();  // Close() with a short deadline if not closed yet.
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // --- synchronous API (only while no asynchronous op is outstanding) -------
  [[nodiscard]] absl::StatusOr<GetResult> Get(std::string_view key,
                                              absl::Time deadline = absl::InfiniteFuture());
  [[nodiscard]] absl::StatusOr<uint64_t> Put(std::string_view key, std::string_view value,
                                             absl::Time deadline = absl::InfiniteFuture());
  [[nodiscard]] absl::StatusOr<uint64_t> Delete(std::string_view key,
                                                absl::Time deadline = absl::InfiniteFuture());
  // A PING to some alive node.
  [[nodiscard]] absl::Status Ping(absl::Time deadline = absl::InfiniteFuture());
  [[nodiscard]] OpResult Execute(const OpRequest& op);

  // --- asynchronous API (as Client's) -----------------------------------------
  // base.max_outstanding bounds the operations in flight over all nodes
  // (held writes not counted), max_outstanding_writes the writes.
  uint32_t available() const;
  uint32_t available(OpKind kind) const;
  uint32_t outstanding() const;
  uint32_t writes_held() const;
  // Starts `op`: ResourceExhausted when available(op.kind) == 0,
  // InvalidArgument for a bad key/value, Unavailable once closed. Anything
  // else, kShardUnavailable included, comes back in the op's OpResult.
  [[nodiscard]] absl::Status Submit(const OpRequest& op);
  size_t Poll(std::span<OpResult> out);
  void Wait(absl::Time until);
  static void WaitAny(std::span<ClusterClient* const> clients, absl::Time until);

  // --- session --------------------------------------------------------------------
  // Closes every node session (Client::Close) and fails what is left with
  // Unavailable. Idempotent.
  absl::Status Close(absl::Time deadline = absl::Now() + absl::Seconds(1));

  uint64_t map_epoch() const;
  // Sums over every node session, those closed included. ops_completed and
  // ops_failed count the caller's operations (a rerouted one once).
  const ClientStats& stats() const;
  const ClusterStats& cluster_stats() const;
  const ClusterClientOptions& options() const;

  class Impl;

 private:
  explicit ClusterClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::client

#endif  // KVNODE_CLIENT_CLUSTER_CLIENT_H_
