// ClusterClient: one Client::Impl session per node, each key routed by the
// shard map (cluster_map.h has the rules), WRONG_SHARD answers rerouted.
//
// Ops the client holds itself (not at any node) are "waiting": rerouted
// after WRONG_SHARD, waiting for a map refresh, or for room at their node.
// They are resubmitted at the start of the next Poll, never while a Poll
// hands out results: a Submit on a node session may reuse the buffers that
// the values just returned point into.
//
// Owned by one thread (cluster_client.h); no locks.
#include "kvnode/client/cluster_client.h"

#include <glog/logging.h>
#include <poll.h>

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client_impl.h"
#include "cluster_map.h"
#include "sync_ops.h"

namespace kvnode::client {
namespace {

constexpr uint32_t kNoConn = UINT32_MAX;

void AddStats(const ClientStats& s, ClientStats* sum) {
  sum->gets_by_read += s.gets_by_read;
  sum->gets_by_rpc += s.gets_by_rpc;
  sum->reads_posted += s.reads_posted;
  sum->read_retries += s.read_retries;
  sum->rpc_fallbacks += s.rpc_fallbacks;
  sum->rpcs_sent += s.rpcs_sent;
  sum->rpc_resends += s.rpc_resends;
  sum->busy += s.busy;
  sum->sessions += s.sessions;
  sum->reconnects += s.reconnects;
  sum->moves += s.moves;
  sum->moves_refused += s.moves_refused;
  sum->stale_responses += s.stale_responses;
  sum->location_hits += s.location_hits;
  sum->location_stale += s.location_stale;
  sum->reads_not_served += s.reads_not_served;
}

// A node of the cluster and the session to it.
struct NodeConn {
  std::string node_id;
  std::string endpoint;                // from the map
  std::unique_ptr<Client::Impl> impl;  // null until first use, and once closed
  bool in_map = false;                 // in the current map
  bool alive = false;                  // alive in the current map
  bool endpoint_changed = false;       // impl connects elsewhere: close it
  uint64_t maps_received = 0;          // ShardMap frames from this node
  uint64_t request_mark = UINT64_MAX;  // maps_received when a MapRequest went
  // The highest epoch it claimed that no map backed after a refresh: later
  // answers claiming as much fail at once instead of refreshing again.
  uint64_t refused_epoch = 0;
  uint64_t ops = 0;
};

// One of the caller's operations.
struct ClusterOp {
  enum class State : uint8_t { kFree, kAtNode, kWaiting, kDone };
  State state = State::kFree;
  OpKind kind = OpKind::kGet;
  std::string key;
  std::string value;
  absl::Time deadline;
  absl::Time submitted;
  uint64_t user_data = 0;
  bool force_rpc = false;
  uint32_t conn = kNoConn;  // kAtNode: where it is
  // kWaiting: resubmitted at not_before, or (want_epoch > 0) once the map
  // reaches want_epoch, which node conn claimed in a WRONG_SHARD answer.
  absl::Time not_before;
  uint64_t want_epoch = 0;
  absl::Time refresh_deadline;
  bool refreshed = false;  // one refresh per op, then a higher epoch is refused
  uint32_t retries = 0;    // backoff of WrongShardPlan::kRetry
  uint32_t sends = 0;      // sends at earlier nodes
  absl::Status status;     // kDone
};

}  // namespace

class ClusterClient::Impl {
 public:
  explicit Impl(ClusterClientOptions options) : options_(std::move(options)) {}
  ~Impl();

  absl::Status Connect();
  absl::Status Submit(const OpRequest& op);
  size_t Poll(std::span<OpResult> out);
  void AppendWaitFds(std::vector<pollfd>* fds, absl::Time* until);
  absl::Status Close(absl::Time deadline);
  OpResult Execute(const OpRequest& op);

  uint32_t available() const;
  uint32_t available(OpKind kind) const;
  uint32_t outstanding() const { return static_cast<uint32_t>(ops_.size() - free_.size()); }
  uint32_t writes_held() const;
  uint64_t map_epoch() const { return tracker_.epoch(); }
  const ClientStats& stats() const;
  const ClusterStats& cluster_stats() const;
  const ClusterClientOptions& options() const { return options_; }

 private:
  // --- connect: the first map ---------------------------------------------------
  absl::Status TrySeed(const std::string& seed);
  absl::Status AwaitMap(Client::Impl* impl, const std::string& seed);
  // --- maps ----------------------------------------------------------------------
  void TakeMaps(NodeConn& c);
  // A node session's Client::Impl, asking for shard maps (and slot words).
  std::unique_ptr<Client::Impl> NewSession(const std::string& endpoint) const;
  void OfferMap(const proto::ShardMap& map, const std::string& from);
  void OnAdopted();
  NodeConn& ConnFor(const std::string& node_id);
  // --- routing -------------------------------------------------------------------
  // Sends op `idx` to its owner now, or completes it locally, or waits.
  void Dispatch(uint32_t idx, absl::Time now);
  absl::StatusOr<uint32_t> TargetOf(const ClusterOp& op);
  absl::Status OpenSession(NodeConn& c);
  void OnWrongShard(uint32_t idx, uint32_t conn, uint64_t node_epoch, absl::Time now);
  // Holds op `idx` in waiting_ until `not_before` (RunWaiting resubmits it).
  void Park(uint32_t idx, absl::Time not_before);
  void RunWaiting(absl::Time now);
  bool StillWaiting(uint32_t idx, absl::Time now);  // false: dispatched or done
  void CloseLeftSessions();
  // FailInFlight (cluster_map.h) on node `c`'s session: called when a map
  // is adopted and after each poll of the session (the map saying the node
  // is not alive and the session's loss may come in either order).
  void FailStranded(NodeConn& c);
  void CloseSession(NodeConn& c, absl::Time deadline);
  // --- completion ----------------------------------------------------------------
  void FinishLocal(uint32_t idx, absl::Status status);
  size_t PollNode(uint32_t conn, std::span<OpResult> out, absl::Time now);
  void CountResult(const absl::Status& st);
  void FreeOp(uint32_t idx);
  std::string What(const ClusterOp& op) const {
    return absl::StrCat(OpKindName(op.kind), " '", op.key, "'");
  }

  ClusterClientOptions options_;
  MapTracker tracker_;
  // Never shrinks: a node that left the map keeps its entry (and op count).
  std::vector<std::unique_ptr<NodeConn>> conns_;
  std::vector<uint32_t> conn_of_map_node_;  // the map's node index -> conns_
  std::vector<ClusterOp> ops_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> waiting_;  // ops in State::kWaiting
  std::deque<uint32_t> done_;      // ops in State::kDone, not yet returned
  uint32_t writes_ = 0;            // PUT/DELETE among the ops in use
  uint32_t next_conn_ = 0;         // where Poll starts (fairness) and PING goes
  // The highest epoch a WRONG_SHARD answer claimed: with follow_pushed_maps
  // off, maps are taken only while the held one is older than this.
  uint64_t want_map_epoch_ = 0;
  bool closed_ = false;
  ClientStats closed_stats_;  // of sessions closed
  ClientStats own_;           // ops_completed/ops_failed/timeouts of the caller's ops
  ClusterStats cstats_;
  mutable ClientStats stats_view_;
  mutable ClusterStats cluster_view_;
};

// --- options and connect ------------------------------------------------------------

absl::Status ClusterClientOptions::Validate() const {
  if (seeds.empty()) return absl::InvalidArgumentError("--cluster: no seed node given");
  for (const std::string& s : seeds) {
    if (absl::StatusOr<proto::HostPort> hp = proto::ParseHostPort(s); !hp.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cluster seed '", s, "': ", hp.status().message()));
    }
  }
  if (map_wait <= absl::ZeroDuration()) return absl::InvalidArgumentError("map_wait must be > 0");
  ClientOptions b = base;
  b.server = seeds.front();  // ignored, but Validate checks it
  return b.Validate();
}

absl::Status ClusterClient::Impl::Connect() {
  OpBudget budget(options_.base.max_outstanding, options_.base.max_outstanding_writes);
  ops_.resize(budget.slots());
  for (uint32_t i = budget.slots(); i > 0; --i) free_.push_back(i - 1);
  std::vector<std::string> failures;
  for (const std::string& seed : options_.seeds) {
    absl::Status st = TrySeed(seed);
    if (st.ok()) return st;
    failures.push_back(absl::StrCat(seed, ": ", st.message()));
  }
  return absl::UnavailableError(
      absl::StrCat("no seed gave a shard map (", absl::StrJoin(failures, "; "), ")"));
}

std::unique_ptr<Client::Impl> ClusterClient::Impl::NewSession(const std::string& endpoint) const {
  ClientOptions o = options_.base;
  o.server = endpoint;
  auto impl = std::make_unique<Client::Impl>(std::move(o));
  impl->hello_features_ =
      proto::kFeatureShardMap | (options_.slot_words ? proto::kFeatureSlotWords : 0);
  if (tracker_.has_map()) impl->SetShardMap(tracker_.map().num_slots, tracker_.epoch());
  return impl;
}

absl::Status ClusterClient::Impl::TrySeed(const std::string& seed) {
  std::unique_ptr<Client::Impl> impl = NewSession(seed);
  if (absl::Status st = impl->Init(); !st.ok()) {
    impl->closed_ = true;  // nothing to say goodbye on
    return st;
  }
  if (absl::Status st = AwaitMap(impl.get(), seed); !st.ok()) {
    (void)impl->Close(absl::Now() + absl::Milliseconds(200));
    return st;
  }
  // Keep the session when the map names the seed's endpoint (the node's
  // advertised address); else it is only where the map came from.
  for (const std::unique_ptr<NodeConn>& c : conns_) {
    if (c->in_map && c->endpoint == seed && c->impl == nullptr) {
      impl->SetShardMap(tracker_.map().num_slots, tracker_.epoch());
      c->impl = std::move(impl);
      return absl::OkStatus();
    }
  }
  (void)impl->Close(absl::Now() + absl::Milliseconds(200));
  AddStats(impl->stats_, &closed_stats_);
  return absl::OkStatus();
}

absl::Status ClusterClient::Impl::AwaitMap(Client::Impl* impl, const std::string& seed) {
  if ((impl->session_features() & proto::kFeatureShardMap) == 0) {
    return absl::FailedPreconditionError(
        "not a cluster member (its Welcome does not offer shard maps)");
  }
  const absl::Time ask_at = absl::Now() + options_.map_wait;
  absl::Time give_up = absl::InfiniteFuture();
  for (;;) {
    (void)impl->Poll(std::span<OpResult>());
    impl->PollControlNow();
    for (const proto::ShardMap& m : impl->TakeMaps()) OfferMap(m, seed);
    if (tracker_.has_map()) return absl::OkStatus();
    if (!impl->connected()) return absl::UnavailableError("the session ended before a shard map");
    const absl::Time now = absl::Now();
    if (give_up == absl::InfiniteFuture() && now >= ask_at) {
      // Nothing pushed in time (or it was not valid): ask once.
      ++cstats_.map_requests;
      (void)impl->RequestMap(0);
      give_up = now + options_.base.connect_timeout;
    }
    if (now >= give_up) {
      return absl::UnavailableError(
          absl::StrCat("no valid shard map within ",
                       absl::FormatDuration(options_.map_wait + options_.base.connect_timeout)));
    }
    impl->Wait(std::min({ask_at > now ? ask_at : give_up, now + absl::Milliseconds(10)}));
  }
}

// --- maps ------------------------------------------------------------------------------

void ClusterClient::Impl::TakeMaps(NodeConn& c) {
  if (c.impl == nullptr) return;
  for (const proto::ShardMap& m : c.impl->TakeMaps()) {
    ++c.maps_received;
    if (!options_.follow_pushed_maps && tracker_.has_map() && tracker_.epoch() >= want_map_epoch_) {
      ++cstats_.maps_dropped;
      VLOG(1) << "kvclient: dropped a pushed shard map (epoch " << m.epoch << ") from " << c.node_id
              << ": pinned to epoch " << tracker_.epoch();
      continue;
    }
    OfferMap(m, c.node_id);
  }
}

void ClusterClient::Impl::OfferMap(const proto::ShardMap& map, const std::string& from) {
  const uint64_t was = tracker_.epoch();
  const MapOffer o = tracker_.Offer(map);
  if (o == MapOffer::kSame) return;
  if (o != MapOffer::kAdopted) {
    ++cstats_.maps_ignored;
    LOG_IF(WARNING, o != MapOffer::kOlder)
        << "kvclient: ignored a shard map (epoch " << map.epoch << ", cluster '" << map.cluster
        << "') from " << from << ": " << MapOfferName(o);
    return;
  }
  ++cstats_.maps_adopted;
  if (map.epoch != was) {
    LOG(INFO) << "kvclient: shard map epoch " << map.epoch << " of cluster '" << map.cluster
              << "' from " << from << " (" << map.nodes.size() << " nodes)";
  }
  OnAdopted();
}

NodeConn& ClusterClient::Impl::ConnFor(const std::string& node_id) {
  for (const std::unique_ptr<NodeConn>& c : conns_) {
    if (c->node_id == node_id) return *c;
  }
  conns_.push_back(std::make_unique<NodeConn>());
  conns_.back()->node_id = node_id;
  return *conns_.back();
}

void ClusterClient::Impl::OnAdopted() {
  const proto::ShardMap& map = tracker_.map();
  for (const std::unique_ptr<NodeConn>& c : conns_) c->in_map = c->alive = false;
  conn_of_map_node_.clear();
  for (const proto::MapNode& n : map.nodes) {
    NodeConn& c = ConnFor(n.node_id);
    c.in_map = true;
    c.alive = n.alive;
    // An empty endpoint is "not known now" (no member key): the last known
    // one stays. A node back at another address: the old session cannot
    // follow it (a Move would; this is a restart elsewhere). Reopened on
    // next use.
    if (!n.endpoint.empty()) {
      if (c.endpoint != n.endpoint && c.impl != nullptr) c.endpoint_changed = true;
      c.endpoint = n.endpoint;
    }
    for (uint32_t i = 0; i < conns_.size(); ++i) {
      if (conns_[i].get() == &c) conn_of_map_node_.push_back(i);
    }
  }
  cstats_.map_epoch = map.epoch;
  for (const std::unique_ptr<NodeConn>& c : conns_) {
    if (c->impl != nullptr) c->impl->SetShardMap(map.num_slots, map.epoch);
    FailStranded(*c);
  }
}

// --- submit and routing ----------------------------------------------------------------

absl::Status ClusterClient::Impl::Submit(const OpRequest& op) {
  if (closed_) return absl::UnavailableError("client is closed");
  if (op.kind != OpKind::kPing && (op.key.empty() || op.key.size() > storage::kMaxKeySize)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key of ", op.key.size(), " bytes: must be 1..", storage::kMaxKeySize));
  }
  if ((op.kind == OpKind::kPut || op.kind == OpKind::kPing) &&
      op.value.size() > storage::kMaxValueSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("value of ", op.value.size(), " bytes: must be <= ", storage::kMaxValueSize));
  }
  if (available(op.kind) == 0 || free_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cluster client has ", outstanding(), " operations outstanding (", writes_,
                     " writes, ", writes_held(), " held); Poll first"));
  }
  const uint32_t idx = free_.back();
  free_.pop_back();
  ClusterOp& o = ops_[idx];
  const absl::Time now = absl::Now();
  o.kind = op.kind;
  o.key.assign(op.key.data(), op.key.size());
  o.value.assign(op.value.data(), op.value.size());
  o.submitted = now;
  o.deadline = op.deadline == absl::InfiniteFuture() ? now + options_.base.op_timeout : op.deadline;
  o.user_data = op.user_data;
  o.force_rpc = op.force_rpc;
  o.conn = kNoConn;
  o.want_epoch = 0;
  o.refreshed = false;
  o.retries = 0;
  o.sends = 0;
  o.status = absl::OkStatus();
  if (IsWrite(op.kind)) ++writes_;
  Dispatch(idx, now);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ClusterClient::Impl::TargetOf(const ClusterOp& op) {
  const proto::ShardMap& map = tracker_.map();
  uint16_t node;
  if (op.kind == OpKind::kPing) {
    absl::StatusOr<uint16_t> n = AnyAliveNode(map, next_conn_++);
    if (!n.ok()) return n.status();
    node = *n;
  } else {
    absl::StatusOr<Route> r = RouteKey(map, op.key);
    if (r.ok()) return conn_of_map_node_[r->node];
    // Not alive in the map. But liveness in a map is the pushing node's
    // view, and the same epoch's membership is taken from whoever pushed
    // last: a node cut off from etcd keeps pushing a stale one. A session
    // to the owner that is up right now is better evidence.
    const uint32_t conn = conn_of_map_node_[map.OwnerOf(proto::SlotOf(op.key, map.num_slots))];
    const NodeConn& c = *conns_[conn];
    if (c.impl != nullptr && c.impl->connected() && !c.endpoint_changed) return conn;
    ++cstats_.shard_unavailable;
    return r.status();
  }
  return conn_of_map_node_[node];
}

absl::Status ClusterClient::Impl::OpenSession(NodeConn& c) {
  std::unique_ptr<Client::Impl> impl = NewSession(c.endpoint);
  if (absl::Status st = impl->InitAsync(); !st.ok()) {
    impl->closed_ = true;
    return st;
  }
  VLOG(1) << "kvclient: opening a session to node '" << c.node_id << "' at " << c.endpoint;
  c.impl = std::move(impl);
  c.request_mark = UINT64_MAX;
  return absl::OkStatus();
}

void ClusterClient::Impl::Dispatch(uint32_t idx, absl::Time now) {
  ClusterOp& o = ops_[idx];
  if (now >= o.deadline) {
    FinishLocal(
        idx, absl::DeadlineExceededError(absl::StrCat(
                 What(o), ": deadline passed while rerouting (map epoch ", tracker_.epoch(), ")")));
    return;
  }
  absl::StatusOr<uint32_t> target = TargetOf(o);
  if (!target.ok()) {
    FinishLocal(idx, target.status());
    return;
  }
  NodeConn& c = *conns_[*target];
  if (c.impl != nullptr && c.endpoint_changed) {
    Park(idx, now + options_.base.busy_backoff_min);  // until the old session is closed
    return;
  }
  if (c.impl == nullptr) {
    if (absl::Status st = OpenSession(c); !st.ok()) {
      FinishLocal(idx, st);
      return;
    }
  }
  OpRequest req;
  req.kind = o.kind;
  req.key = o.key;
  req.value = o.value;
  req.deadline = o.deadline;
  req.user_data = idx;
  req.force_rpc = o.force_rpc;
  absl::Status st = c.impl->Submit(req);
  if (absl::IsResourceExhausted(st)) {
    // The node's slots are still busy with finished ops' work requests.
    Park(idx, now + options_.base.busy_backoff_min);
    return;
  }
  if (!st.ok()) {
    FinishLocal(idx, st);
    return;
  }
  o.state = ClusterOp::State::kAtNode;
  o.conn = *target;
}

void ClusterClient::Impl::Park(uint32_t idx, absl::Time not_before) {
  ClusterOp& o = ops_[idx];
  if (o.state != ClusterOp::State::kWaiting) waiting_.push_back(idx);
  o.state = ClusterOp::State::kWaiting;
  o.not_before = not_before;
}

void ClusterClient::Impl::OnWrongShard(uint32_t idx, uint32_t conn, uint64_t node_epoch,
                                       absl::Time now) {
  ++cstats_.wrong_shard;
  ClusterOp& o = ops_[idx];
  NodeConn& c = *conns_[conn];
  std::string owner_now;
  if (o.kind != OpKind::kPing) {
    const proto::ShardMap& map = tracker_.map();
    owner_now = map.nodes[map.OwnerOf(proto::SlotOf(o.key, map.num_slots))].node_id;
  }
  switch (PlanWrongShard(node_epoch, tracker_.epoch(), c.node_id, owner_now)) {
    case WrongShardPlan::kReroute:
      ++cstats_.reroutes;
      Park(idx, now);
      return;
    case WrongShardPlan::kRetry: {
      ++cstats_.reroutes;
      const int shift = static_cast<int>(std::min<uint32_t>(o.retries++, 10));
      Park(idx, now + std::min(options_.base.busy_backoff_min * (1 << shift),
                               options_.base.busy_backoff_max));
      return;
    }
    case WrongShardPlan::kRefresh:
      break;
  }
  if (o.refreshed || node_epoch <= c.refused_epoch) {
    // The one refresh is spent (for this op, or for this claim): refused.
    ++cstats_.epochs_refused;
    FinishLocal(idx, ForgedEpochError(c.node_id, node_epoch, tracker_.epoch(), What(o)));
    return;
  }
  o.refreshed = true;
  o.want_epoch = node_epoch;
  want_map_epoch_ = std::max(want_map_epoch_, node_epoch);
  o.conn = conn;
  // Ops answered together share one MapRequest: one per answer received.
  if (c.request_mark != c.maps_received && c.impl != nullptr &&
      c.impl->RequestMap(tracker_.epoch())) {
    ++cstats_.map_requests;
    c.request_mark = c.maps_received;
  }
  o.refresh_deadline = std::min(o.deadline, now + options_.base.connect_timeout);
  Park(idx, o.refresh_deadline);
}

void ClusterClient::Impl::RunWaiting(absl::Time now) {
  std::vector<uint32_t> still;
  std::vector<uint32_t> waiting = std::exchange(waiting_, {});
  for (uint32_t idx : waiting) {
    if (StillWaiting(idx, now)) still.push_back(idx);
  }
  // Dispatch may have queued new waiters (room, endpoint change).
  for (uint32_t idx : waiting_) still.push_back(idx);
  waiting_ = std::move(still);
}

bool ClusterClient::Impl::StillWaiting(uint32_t idx, absl::Time now) {
  ClusterOp& o = ops_[idx];
  if (o.want_epoch > 0) {
    if (tracker_.epoch() >= o.want_epoch) {
      o.want_epoch = 0;
      ++cstats_.reroutes;
    } else if (now >= o.refresh_deadline) {
      // No node gave the epoch claimed within the refresh: refused, never
      // retried. (Not decided on the first map after the request: a push
      // the node sent before it took the new map may arrive after its
      // WRONG_SHARD answer, which came by RDMA.)
      ++cstats_.epochs_refused;
      NodeConn& c = *conns_[o.conn];
      c.refused_epoch = std::max(c.refused_epoch, o.want_epoch);
      FinishLocal(idx, ForgedEpochError(c.node_id, o.want_epoch, tracker_.epoch(), What(o)));
      return false;
    } else {
      return true;
    }
  } else if (o.not_before > now) {
    return true;
  }
  // Out of waiting_ (the caller drops it): Dispatch parks it again if need be.
  o.state = ClusterOp::State::kAtNode;
  Dispatch(idx, now);
  return false;
}

void ClusterClient::Impl::CloseLeftSessions() {
  for (const std::unique_ptr<NodeConn>& c : conns_) {
    if (c->impl == nullptr || (c->in_map && !c->endpoint_changed)) continue;
    if (c->impl->outstanding() > 0) continue;  // its ops finish (or WRONG_SHARD) first
    LOG(INFO) << "kvclient: closing the session to node '" << c->node_id << "' ("
              << (c->in_map ? "moved to " + c->endpoint : std::string("left the map")) << ")";
    CloseSession(*c, absl::Now() + absl::Milliseconds(200));
    c->endpoint_changed = false;
  }
}

void ClusterClient::Impl::FailStranded(NodeConn& c) {
  if (c.alive || !c.in_map || c.impl == nullptr || c.impl->outstanding() == 0) return;
  const uint32_t failed = FailInFlight(tracker_.map(), c.node_id, *c.impl);
  if (failed == 0) return;
  cstats_.shard_unavailable += failed;
  LOG(WARNING) << "kvclient: failed " << failed << " operations in flight at node '" << c.node_id
               << "': not alive in map epoch " << tracker_.epoch() << " and its session is down";
}

void ClusterClient::Impl::CloseSession(NodeConn& c, absl::Time deadline) {
  absl::Status st = c.impl->Close(deadline);
  if (!st.ok()) LOG(WARNING) << "kvclient: close of node '" << c.node_id << "': " << st;
  AddStats(c.impl->stats_, &closed_stats_);
  c.impl.reset();
}

// --- completion -------------------------------------------------------------------------

void ClusterClient::Impl::CountResult(const absl::Status& st) {
  if (st.ok() || absl::IsNotFound(st)) {
    ++own_.ops_completed;
  } else {
    ++own_.ops_failed;
    if (absl::IsDeadlineExceeded(st)) ++own_.timeouts;
  }
}

void ClusterClient::Impl::FinishLocal(uint32_t idx, absl::Status status) {
  ClusterOp& o = ops_[idx];
  o.state = ClusterOp::State::kDone;
  o.status = std::move(status);
  done_.push_back(idx);
}

void ClusterClient::Impl::FreeOp(uint32_t idx) {
  ClusterOp& o = ops_[idx];
  if (IsWrite(o.kind)) --writes_;
  o.state = ClusterOp::State::kFree;
  free_.push_back(idx);
}

size_t ClusterClient::Impl::PollNode(uint32_t conn, std::span<OpResult> out, absl::Time now) {
  NodeConn& c = *conns_[conn];
  const size_t got = c.impl->Poll(out);
  size_t kept = 0;
  for (size_t i = 0; i < got; ++i) {
    OpResult& r = out[i];
    const uint32_t idx = static_cast<uint32_t>(r.user_data);
    ClusterOp& o = ops_[idx];
    o.sends += r.sends;
    if (std::optional<uint64_t> epoch = WrongShardEpochOf(r.status); epoch.has_value()) {
      OnWrongShard(idx, conn, *epoch, now);
      continue;
    }
    ++c.ops;
    CountResult(r.status);
    r.user_data = o.user_data;
    r.submitted = o.submitted;
    r.sends = o.sends;
    FreeOp(idx);
    if (kept != i) out[kept] = std::move(r);
    ++kept;
  }
  return kept;
}

size_t ClusterClient::Impl::Poll(std::span<OpResult> out) {
  if (closed_) return 0;
  const absl::Time now = absl::Now();
  CloseLeftSessions();
  if (!waiting_.empty()) RunWaiting(now);
  size_t n = 0;
  while (n < out.size() && !done_.empty()) {
    const uint32_t idx = done_.front();
    done_.pop_front();
    ClusterOp& o = ops_[idx];
    OpResult& r = out[n++];
    r = OpResult();
    r.user_data = o.user_data;
    r.kind = o.kind;
    r.status = o.status;
    r.sends = o.sends;
    r.submitted = o.submitted;
    r.completed = now;
    CountResult(o.status);
    FreeOp(idx);
  }
  // Every session is polled (an empty span still makes progress), from a
  // rotating start so that a full `out` does not always favour one node.
  const uint32_t count = static_cast<uint32_t>(conns_.size());
  for (uint32_t k = 0; k < count; ++k) {
    const uint32_t i = (next_conn_ + k) % count;
    if (conns_[i]->impl == nullptr) continue;
    n += PollNode(i, out.subspan(n), now);
    TakeMaps(*conns_[i]);
    FailStranded(*conns_[i]);  // its session may have been lost just now
  }
  if (count > 0) next_conn_ = (next_conn_ + 1) % count;
  return n;
}

void ClusterClient::Impl::AppendWaitFds(std::vector<pollfd>* fds, absl::Time* until) {
  if (closed_) return;
  const absl::Time now = absl::Now();
  if (!done_.empty()) *until = now;
  for (uint32_t idx : waiting_) {
    const ClusterOp& o = ops_[idx];
    *until = std::min(*until, o.want_epoch > 0 ? o.refresh_deadline : o.not_before);
  }
  for (const std::unique_ptr<NodeConn>& c : conns_) {
    if (c->impl == nullptr) continue;
    c->impl->AppendWaitFds(fds, until);
    if (!c->in_map || c->endpoint_changed) *until = std::min(*until, now + absl::Milliseconds(5));
  }
  *until = std::max(*until, now);
}

// --- budget and views ----------------------------------------------------------------------

uint32_t ClusterClient::Impl::writes_held() const {
  uint32_t held = 0;
  for (const std::unique_ptr<NodeConn>& c : conns_) {
    if (c->impl != nullptr) held += c->impl->held_writes();
  }
  return held;
}

uint32_t ClusterClient::Impl::available() const {
  if (free_.empty()) return 0;
  // As Client's OpBudget: held writes wait outside max_outstanding.
  const uint32_t active = outstanding() - std::min(outstanding(), writes_held());
  return options_.base.max_outstanding - std::min(options_.base.max_outstanding, active);
}

uint32_t ClusterClient::Impl::available(OpKind kind) const {
  if (!IsWrite(kind)) return available();
  const uint32_t max_writes = options_.base.max_outstanding_writes == 0
                                  ? options_.base.max_outstanding
                                  : options_.base.max_outstanding_writes;
  return std::min(available(), max_writes - std::min(max_writes, writes_));
}

const ClientStats& ClusterClient::Impl::stats() const {
  ClientStats s = closed_stats_;
  for (const std::unique_ptr<NodeConn>& c : conns_) {
    if (c->impl != nullptr) AddStats(c->impl->stats_, &s);
  }
  s.ops_completed = own_.ops_completed;
  s.ops_failed = own_.ops_failed;
  s.timeouts = own_.timeouts;
  stats_view_ = s;
  return stats_view_;
}

const ClusterStats& ClusterClient::Impl::cluster_stats() const {
  cluster_view_ = cstats_;
  cluster_view_.nodes.clear();
  for (const std::unique_ptr<NodeConn>& c : conns_) {
    ClusterNodeStats n;
    n.node_id = c->node_id;
    n.endpoint = c->endpoint;
    n.alive = c->in_map && c->alive;
    n.connected = c->impl != nullptr && c->impl->connected();
    n.ops = c->ops;
    cluster_view_.nodes.push_back(std::move(n));
  }
  std::sort(
      cluster_view_.nodes.begin(), cluster_view_.nodes.end(),
      [](const ClusterNodeStats& a, const ClusterNodeStats& b) { return a.node_id < b.node_id; });
  return cluster_view_;
}

// --- close and synchronous API -------------------------------------------------------------

absl::Status ClusterClient::Impl::Close(absl::Time deadline) {
  if (closed_) return absl::OkStatus();
  std::vector<OpResult> sink(8);  // results are dropped: Poll them before
  while (outstanding() > 0 && absl::Now() < deadline) {
    if (Poll(std::span<OpResult>(sink)) == 0) {
      std::vector<pollfd> fds;
      absl::Time until = std::min(deadline, absl::Now() + absl::Milliseconds(5));
      AppendWaitFds(&fds, &until);
      PollFds(std::span<pollfd>(fds), until);
    }
  }
  closed_ = true;
  absl::Status result;
  for (const std::unique_ptr<NodeConn>& c : conns_) {
    if (c->impl == nullptr) continue;
    absl::Status st = c->impl->Close(std::max(deadline, absl::Now() + absl::Milliseconds(100)));
    if (result.ok() && !st.ok()) result = st;
    AddStats(c->impl->stats_, &closed_stats_);
    c->impl.reset();
  }
  waiting_.clear();
  done_.clear();
  return result;
}

ClusterClient::Impl::~Impl() {
  if (!closed_) {
    absl::Status st = Close(absl::Now() + absl::Milliseconds(500));
    if (!st.ok()) LOG(WARNING) << "kvclient: close: " << st;
  }
}

OpResult ClusterClient::Impl::Execute(const OpRequest& op) {
  OpResult r;
  r.kind = op.kind;
  r.user_data = op.user_data;
  if (outstanding() > 0) {
    r.status = absl::FailedPreconditionError(
        "synchronous call while asynchronous operations are outstanding");
    return r;
  }
  if (absl::Status st = Submit(op); !st.ok()) {
    r.status = st;
    return r;
  }
  OpResult out[1];
  for (int spins = 0;; ++spins) {
    if (Poll(std::span<OpResult>(out)) == 1) return out[0];
    if (spins > 256) {
      std::vector<pollfd> fds;
      absl::Time until = absl::Now() + absl::Milliseconds(10);
      AppendWaitFds(&fds, &until);
      PollFds(std::span<pollfd>(fds), until);
    }
  }
}

// --- public face -----------------------------------------------------------------------------

ClusterClient::ClusterClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClusterClient::~ClusterClient() = default;

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Connect(
    ClusterClientOptions options) {
  if (absl::Status st = options.Validate(); !st.ok()) return st;
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status st = impl->Connect(); !st.ok()) {
    (void)impl->Close(absl::Now() + absl::Milliseconds(200));
    return st;
  }
  return std::unique_ptr<ClusterClient>(new ClusterClient(std::move(impl)));
}

absl::StatusOr<GetResult> ClusterClient::Get(std::string_view key, absl::Time deadline) {
  return internal::AsGet(impl_->Execute(internal::SyncOp(OpKind::kGet, key, {}, deadline)));
}

absl::StatusOr<uint64_t> ClusterClient::Put(std::string_view key, std::string_view value,
                                            absl::Time deadline) {
  return internal::AsVersion(impl_->Execute(internal::SyncOp(OpKind::kPut, key, value, deadline)));
}

absl::StatusOr<uint64_t> ClusterClient::Delete(std::string_view key, absl::Time deadline) {
  return internal::AsVersion(impl_->Execute(internal::SyncOp(OpKind::kDelete, key, {}, deadline)));
}

absl::Status ClusterClient::Ping(absl::Time deadline) {
  return impl_->Execute(internal::SyncOp(OpKind::kPing, {}, {}, deadline)).status;
}

OpResult ClusterClient::Execute(const OpRequest& op) { return impl_->Execute(op); }
uint32_t ClusterClient::available() const { return impl_->available(); }
uint32_t ClusterClient::available(OpKind kind) const { return impl_->available(kind); }
uint32_t ClusterClient::outstanding() const { return impl_->outstanding(); }
uint32_t ClusterClient::writes_held() const { return impl_->writes_held(); }
absl::Status ClusterClient::Submit(const OpRequest& op) { return impl_->Submit(op); }
size_t ClusterClient::Poll(std::span<OpResult> out) { return impl_->Poll(out); }
absl::Status ClusterClient::Close(absl::Time deadline) { return impl_->Close(deadline); }
uint64_t ClusterClient::map_epoch() const { return impl_->map_epoch(); }
const ClientStats& ClusterClient::stats() const { return impl_->stats(); }
const ClusterStats& ClusterClient::cluster_stats() const { return impl_->cluster_stats(); }
const ClusterClientOptions& ClusterClient::options() const { return impl_->options(); }

void ClusterClient::Wait(absl::Time until) {
  std::vector<pollfd> fds;
  impl_->AppendWaitFds(&fds, &until);
  PollFds(std::span<pollfd>(fds), until);
}

void ClusterClient::WaitAny(std::span<ClusterClient* const> clients, absl::Time until) {
  std::vector<pollfd> fds;
  for (ClusterClient* c : clients) c->impl_->AppendWaitFds(&fds, &until);
  PollFds(std::span<pollfd>(fds), until);
}

}  // namespace kvnode::client
