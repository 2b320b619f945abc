// NodeSession: the lease thread (connect, register, keep alive, re-register)
// and the watch callbacks feeding a ClusterView (node_session.h has the
// contracts this file keeps).
#include "kvnode/cluster/node_session.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster_view.h"
#include "glog/logging.h"
#include "kvnode/base/annotated_mutex.h"
#include "kvnode/base/errno.h"
#include "kvnode/cluster/etcd_client.h"
#include "kvnode/cluster/keys.h"

namespace kvnode::cluster {
namespace {

using base::Av;

constexpr absl::Duration kMinBackoff = absl::Milliseconds(100);

struct Lockable {
  AnnotatedMutex* mu;
  void lock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu->Lock(); }
  void unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu->Unlock(); }
};

bool IsConnectionError(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s);
}

class NodeSessionImpl final : public NodeSession {
 public:
  NodeSessionImpl(NodeSessionOptions options, NodeSessionCallbacks callbacks,
                  std::unique_ptr<EtcdClient> client)
      : options_(std::move(options)),
        callbacks_(std::move(callbacks)),
        client_(std::move(client)),
        member_key_(MemberKey(options_.cluster, options_.node_id)),
        instance_key_(InstanceKey(options_.cluster, options_.node_id)),
        view_(options_.cluster),
        // Connects now, not at Start: a live upgrade's new process creates
        // its session before Ready and starts it at HandOver, where its
        // first call must renew the adopted lease quickly (a new process's
        // first gRPC call, channel and all, took seconds under TCG).
        warm_([this] { (void)client_->Health(); }) {}
  ~NodeSessionImpl() override { Stop(false); }

  absl::Status Start(Member self, std::optional<int64_t> adopt_lease) override;
  void UpdateMember(Member self) override;
  int64_t HandOffLease() override;
  void ResumeLease() override;
  void Stop(bool revoke) override;
  NodeSessionStatus Status() const override;

 private:
  // What one pass of the lease thread works from, copied under the lock.
  struct Plan {
    int64_t lease = 0;
    std::optional<int64_t> adopt;
    bool write_member = false;
    Member self;
  };

  void Run();
  absl::Status Tick();
  std::optional<Plan> MakePlan();
  absl::Status EnsureLease(Plan* plan);
  absl::Status Claim(const Plan& plan);
  absl::Status Bind();
  absl::Status Refused(const KeyValue& current);
  absl::Status Foreign(const std::string& holder);
  void Deliver(std::optional<proto::ShardMap> map);
  void AfterTick(const absl::Status& s);
  bool WaitFor(absl::Duration d);
  void OnWatchUpdate(const WatchUpdate& update);
  void OnWatchState(const absl::Status& s);

  const NodeSessionOptions options_;
  const NodeSessionCallbacks callbacks_;
  const std::unique_ptr<EtcdClient> client_;
  const std::string member_key_;
  const std::string instance_key_;
  ClusterView view_;  // watch thread only

  mutable AnnotatedMutex mu_;
  std::condition_variable_any cv_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool handed_off_ ABSL_GUARDED_BY(mu_) = false;
  bool ticking_ ABSL_GUARDED_BY(mu_) = false;  // the lease thread is in a pass
  bool member_dirty_ ABSL_GUARDED_BY(mu_) = true;
  bool refused_reported_ ABSL_GUARDED_BY(mu_) = false;
  bool bound_ ABSL_GUARDED_BY(mu_) = false;                   // the instance key holds our instance
  std::optional<absl::Status> foreign_ ABSL_GUARDED_BY(mu_);  // bound to another: final
  std::optional<proto::ShardMap> pending_map_ ABSL_GUARDED_BY(mu_);  // held until bound_
  // Plans changed and not delivered yet (outer nullopt: no change).
  std::optional<std::optional<RollPlan>> pending_roll_ ABSL_GUARDED_BY(mu_);
  std::optional<std::optional<MigrationPlan>> pending_migration_ ABSL_GUARDED_BY(mu_);
  AnnotatedMutex deliver_mu_;  // one on_map at a time, in order, from either thread
  Member self_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> adopt_ ABSL_GUARDED_BY(mu_);
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t registered_lease_ ABSL_GUARDED_BY(mu_) = 0;  // lease of our last member write
  int64_t claimed_revision_ ABSL_GUARDED_BY(mu_) = 0;  // store revision of our last member write
  int64_t seen_revision_ ABSL_GUARDED_BY(mu_) = 0;     // the watch's view revision
  bool own_key_seen_ ABSL_GUARDED_BY(mu_) = false;     // the view holds our member
  std::string session_error_ ABSL_GUARDED_BY(mu_);
  std::string watch_error_ ABSL_GUARDED_BY(mu_);
  std::string map_error_ ABSL_GUARDED_BY(mu_);
  NodeSessionStatus status_ ABSL_GUARDED_BY(mu_);

  // Declared last: destroyed (stopped) before what they use.
  std::thread warm_;  // joined by the lease thread, or by Stop
  std::unique_ptr<Watcher> watcher_;
  std::thread thread_;
};

absl::Status NodeSessionImpl::Start(Member self, std::optional<int64_t> adopt_lease) {
  if (self.node_id != options_.node_id || self.instance != options_.instance) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NodeSession::Start: member '", self.node_id, "' instance ", self.instance,
        " is not the session's node '", options_.node_id, "' instance ", options_.instance));
  }
  {
    AnnotatedLock l(&mu_);
    if (started_) return absl::FailedPreconditionError("NodeSession::Start: already started");
    started_ = true;
    self_ = std::move(self);
    adopt_ = adopt_lease;
  }
  WatchCallbacks cb;
  cb.on_update = [this](const WatchUpdate& u) { OnWatchUpdate(u); };
  cb.on_state = [this](const absl::Status& s) { OnWatchState(s); };
  watcher_ = client_->Watch(ClusterPrefix(options_.cluster), 0, std::move(cb));
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void NodeSessionImpl::UpdateMember(Member self) {
  {
    AnnotatedLock l(&mu_);
    self_ = std::move(self);
    member_dirty_ = true;
  }
  cv_.notify_all();
}

// Waits (bounded) for a pass of the lease thread already under way: it may
// still write the member key, and the new process's writes must come after.
int64_t NodeSessionImpl::HandOffLease() {
  const auto until =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(options_.rpc_deadline * 4);
  int64_t lease = 0;
  {
    AnnotatedLock l(&mu_);
    handed_off_ = true;
    Lockable lk{&mu_};
    while (ticking_) {
      if (cv_.wait_until(lk, until) == std::cv_status::timeout) {
        LOG(WARNING) << "cluster " << options_.cluster
                     << ": handing the lease over while an etcd call is still under way";
        break;
      }
    }
    lease = lease_;
  }
  // A last renewal: the new process gets the lease with its whole TTL ahead.
  if (lease != 0) {
    if (auto ttl = client_->LeaseKeepAliveOnce(lease); !ttl.ok()) {
      LOG(WARNING) << "cluster " << options_.cluster << ": renewing lease " << lease
                   << " before handing it over: " << ttl.status().message();
    }
  }
  return lease;
}

void NodeSessionImpl::ResumeLease() {
  {
    AnnotatedLock l(&mu_);
    handed_off_ = false;
  }
  cv_.notify_all();
}

void NodeSessionImpl::Stop(bool revoke) {
  int64_t lease = 0;
  {
    AnnotatedLock l(&mu_);
    if (stop_) return;
    stop_ = true;
    if (revoke && !handed_off_) lease = lease_;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (warm_.joinable()) warm_.join();  // never started
  watcher_.reset();
  if (lease == 0) return;
  if (auto s = client_->LeaseRevoke(lease); !s.ok()) {
    LOG(WARNING) << "cluster " << options_.cluster << ": " << s.message()
                 << "; the member key goes when the lease expires";
  }
}

NodeSessionStatus NodeSessionImpl::Status() const {
  AnnotatedLock l(&mu_);
  NodeSessionStatus out = status_;
  out.lease_id = lease_;
  std::vector<std::string> errors;
  for (const std::string* e : {&session_error_, &map_error_, &watch_error_}) {
    if (!e->empty()) errors.push_back(*e);
  }
  out.last_error = absl::StrJoin(errors, "; ");
  return out;
}

// ---- The lease thread ------------------------------------------------------

void NodeSessionImpl::Run() {
  if (warm_.joinable()) warm_.join();
  absl::Duration backoff = kMinBackoff;
  const absl::Duration period = absl::Seconds(options_.lease_ttl_s) / 3;
  while (true) {
    absl::Status s = Tick();
    AfterTick(s);
    if (!WaitFor(s.ok() ? period : backoff)) return;
    backoff = s.ok() ? kMinBackoff : std::min(backoff * 2, options_.max_backoff);
  }
}

// One wait; woken early by UpdateMember, ResumeLease, a lost member key and
// Stop. False once stopped.
bool NodeSessionImpl::WaitFor(absl::Duration d) {
  const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(d);
  AnnotatedLock l(&mu_);
  if (stop_) return false;
  Lockable lk{&mu_};
  cv_.wait_until(lk, until);
  return !stop_;
}

std::optional<NodeSessionImpl::Plan> NodeSessionImpl::MakePlan() {
  AnnotatedLock l(&mu_);
  if (stop_ || handed_off_) return std::nullopt;  // the lease is someone else's now
  Plan plan;
  plan.lease = lease_;
  plan.adopt = adopt_;
  plan.self = self_;
  // Our key vanished from a view that already saw our last write (someone
  // deleted it): write it again.
  bool lost = status_.registered && !own_key_seen_ && seen_revision_ >= claimed_revision_;
  plan.write_member = member_dirty_ || !status_.registered || lost;
  ticking_ = true;
  return plan;
}

absl::Status NodeSessionImpl::Tick() {
  {
    AnnotatedLock l(&mu_);
    if (foreign_) return *foreign_;  // never retried: the id is another database's
  }
  std::optional<Plan> plan = MakePlan();
  if (!plan) return absl::OkStatus();
  if (auto s = EnsureLease(&*plan); !s.ok()) return s;
  if (!plan->write_member) return absl::OkStatus();
  return Claim(*plan);
}

void NodeSessionImpl::AfterTick(const absl::Status& s) {
  AnnotatedLock l(&mu_);
  ticking_ = false;
  cv_.notify_all();  // HandOffLease may wait for this pass
  session_error_ = s.ok() ? "" : std::string(s.message());
  status_.etcd_connected = !IsConnectionError(s);
  if (!s.ok() && IsConnectionError(s)) {
    LOG_EVERY_N(WARNING, 10) << "cluster " << options_.cluster << ": " << s.message();
  }
}

// Leaves plan->lease a live lease: the adopted one while it lives, the
// current one kept alive, or a new one (then the member must be written).
absl::Status NodeSessionImpl::EnsureLease(Plan* plan) {
  bool fresh = false;
  if (plan->lease == 0 && plan->adopt) {
    // Renewed at once, not only read: the old process stopped renewing it
    // before the handoff, and this process's first etcd round may be slow
    // (a new process's channel connects first); a TTL read followed by a
    // renewal a keepalive period later could let it lapse in between.
    auto ttl = client_->LeaseKeepAliveOnce(*plan->adopt);
    if (!ttl.ok() && !absl::IsNotFound(ttl.status())) return ttl.status();
    AnnotatedLock l(&mu_);
    adopt_.reset();
    if (ttl.ok()) {
      lease_ = plan->lease = *plan->adopt;
      status_.lease_ttl_left_ms = *ttl * 1000;
      fresh = true;
    } else {
      LOG(WARNING) << "cluster " << options_.cluster << ": the handed-over "
                   << ttl.status().message() << "; registering with a new lease";
    }
  }
  if (plan->lease != 0 && !fresh) {
    auto ttl = client_->LeaseKeepAliveOnce(plan->lease);
    if (!ttl.ok() && !absl::IsNotFound(ttl.status())) return ttl.status();
    AnnotatedLock l(&mu_);
    if (ttl.ok()) {
      status_.lease_ttl_left_ms = *ttl * 1000;
      return absl::OkStatus();
    }
    LOG(WARNING) << "cluster " << options_.cluster << ": " << ttl.status().message()
                 << "; registering again with a new lease";
    lease_ = plan->lease = 0;
    status_.registered = false;
  }
  if (plan->lease == 0) {
    auto granted = client_->LeaseGrant(options_.lease_ttl_s);
    if (!granted.ok()) return granted.status();
    AnnotatedLock l(&mu_);
    lease_ = plan->lease = granted->id;
    status_.lease_ttl_left_ms = granted->ttl_s * 1000;
    status_.registered = false;
  }
  plan->write_member = true;
  return absl::OkStatus();
}

// Binds the node id to this instance (node_session.h contract 2): creates
// the instance key if there is none (the first registration of the id, or a
// cluster from before the key existed), else requires it to hold ours.
absl::Status NodeSessionImpl::Bind() {
  auto r = client_->PutIfCreateRevision(instance_key_, options_.instance, 0, 0);
  if (!r.ok()) return r.status();
  if (!r->applied) {
    if (!r->current) return absl::UnavailableError("instance key vanished during registration");
    if (r->current->value != options_.instance) return Foreign(r->current->value);
  } else {
    LOG(INFO) << "cluster " << options_.cluster << ": node id '" << options_.node_id
              << "' bound to instance " << options_.instance << " at " << instance_key_;
  }
  {
    AnnotatedLock l(&mu_);
    bound_ = true;
  }
  Deliver(std::nullopt);  // a map the watch held back meanwhile
  return absl::OkStatus();
}

// Writes the member key if it is ours (node_session.h contract 2). Every
// write is guarded by the instance key holding our instance.
absl::Status NodeSessionImpl::Claim(const Plan& plan) {
  if (auto s = Bind(); !s.ok()) return s;
  const std::string value = EncodeMemberJson(plan.self);
  const ValueGuard guard{instance_key_, options_.instance};
  auto r = client_->PutIfGuarded(member_key_, value, true, 0, guard, plan.lease);
  for (int round = 0; r.ok() && !r->applied && round < 2; ++round) {
    if (!r->guard) return absl::UnavailableError("instance key vanished during registration");
    if (r->guard->value != options_.instance) return Foreign(r->guard->value);
    if (!r->current) return absl::UnavailableError("member key vanished during registration");
    auto have = DecodeMemberJson(r->current->value, member_key_, options_.node_id);
    if (!have.ok() || have->instance != options_.instance) return Refused(*r->current);
    if (round == 1) return absl::UnavailableError("member key changed during registration");
    r = client_->PutIfGuarded(member_key_, value, false, r->current->mod_revision, guard,
                              plan.lease);
  }
  if (!r.ok()) return r.status();
  AnnotatedLock l(&mu_);
  if (!status_.registered || registered_lease_ != plan.lease) {
    LOG(INFO) << "cluster " << options_.cluster << ": registered node '" << options_.node_id
              << "' with lease " << plan.lease;
  }
  if (registered_lease_ != plan.lease) ++status_.registrations;
  registered_lease_ = plan.lease;
  claimed_revision_ = r->revision;
  status_.registered = true;
  member_dirty_ = !(self_ == plan.self);
  refused_reported_ = false;
  return absl::OkStatus();
}

absl::Status NodeSessionImpl::Refused(const KeyValue& current) {
  auto other = DecodeMemberJson(current.value, member_key_, "");
  std::string who = other.ok()
                        ? absl::StrCat("instance ", other->instance, " (pid ", other->pid,
                                       ", endpoint ", other->endpoint, ")")
                        : absl::StrCat("an unreadable value (", other.status().message(), ")");
  absl::Status s = absl::FailedPreconditionError(
      absl::StrCat("node id '", options_.node_id, "' is held by another node: ", who,
                   "; this is instance ", options_.instance));
  bool first = false;
  {
    AnnotatedLock l(&mu_);
    status_.registered = false;
    first = !refused_reported_;
    refused_reported_ = true;
  }
  if (first) {
    LOG(ERROR) << "cluster " << options_.cluster << ": " << s.message();
    if (callbacks_.on_refused) callbacks_.on_refused(s);
  }
  return s;
}

// The node id belongs to another database: refused for good (contract 2).
absl::Status NodeSessionImpl::Foreign(const std::string& holder) {
  absl::Status s = absl::PermissionDeniedError(absl::StrCat(
      "node id '", options_.node_id, "' belongs to another database: ", instance_key_,
      " holds instance ", holder, ", this database is instance ", options_.instance,
      "; not registering, ever (if that node is lost for good: kvctl cluster forget-node ",
      options_.node_id, ")"));
  {
    AnnotatedLock l(&mu_);
    status_.registered = false;
    bound_ = false;
    pending_map_.reset();
    foreign_ = s;
  }
  LOG(ERROR) << "cluster " << options_.cluster << ": " << s.message();
  if (callbacks_.on_refused) callbacks_.on_refused(s);
  return s;
}

// Hands a map to on_map, then changed plans to on_roll and on_migration,
// once the node id is bound to this instance; until then the latest ones
// wait (a duplicate must never get a map to serve or a plan to act on).
void NodeSessionImpl::Deliver(std::optional<proto::ShardMap> map) {
  AnnotatedLock d(&deliver_mu_);
  std::optional<std::optional<RollPlan>> roll;
  std::optional<std::optional<MigrationPlan>> migration;
  {
    AnnotatedLock l(&mu_);
    if (!bound_) {
      if (map) pending_map_ = std::move(map);
      return;
    }
    if (!map) map = std::move(pending_map_);
    pending_map_.reset();
    roll = std::exchange(pending_roll_, std::nullopt);
    migration = std::exchange(pending_migration_, std::nullopt);
  }
  if (map && callbacks_.on_map) callbacks_.on_map(std::move(*map));
  if (roll && callbacks_.on_roll) callbacks_.on_roll(*roll);
  if (migration && callbacks_.on_migration) callbacks_.on_migration(*migration);
}

// ---- The watch thread --------------------------------------------------------

void NodeSessionImpl::OnWatchUpdate(const WatchUpdate& update) {
  std::optional<proto::ShardMap> changed = view_.Apply(update);
  const Member* me = view_.member(options_.node_id);
  bool lost = false, plans = false;
  {
    AnnotatedLock l(&mu_);
    seen_revision_ = view_.revision();
    own_key_seen_ = me != nullptr && me->instance == options_.instance;
    map_error_ = view_.map_error();
    status_.map_errors = view_.map_errors();
    if (changed) status_.map_epoch = changed->epoch;
    lost = status_.registered && !own_key_seen_ && seen_revision_ >= claimed_revision_;
    if (auto r = view_.roll().TakeChange()) pending_roll_ = std::move(r);
    if (auto m = view_.migration().TakeChange()) pending_migration_ = std::move(m);
    plans = pending_roll_.has_value() || pending_migration_.has_value();
  }
  if (lost) cv_.notify_all();
  if (changed || plans) Deliver(std::move(changed));
}

void NodeSessionImpl::OnWatchState(const absl::Status& s) {
  AnnotatedLock l(&mu_);
  watch_error_ = s.ok() ? "" : std::string(s.message());
}

}  // namespace

absl::Status NodeSessionOptions::Validate() const {
  EtcdClientOptions etcd;
  etcd.endpoints = endpoints;
  etcd.rpc_deadline = rpc_deadline;
  if (auto s = etcd.Validate(); !s.ok()) return s;
  if (auto s = proto::CheckName(cluster, proto::kMaxClusterNameSize, "--cluster"); !s.ok()) {
    return s;
  }
  if (auto s = proto::CheckName(node_id, proto::kMaxNodeIdSize, "--node_id"); !s.ok()) return s;
  if (instance.size() != 32) {
    return absl::InvalidArgumentError("cluster instance id must be 32 hex digits");
  }
  if (lease_ttl_s < 2 || lease_ttl_s > 60) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd_lease_ttl_s must be within 2..60 s, not ", lease_ttl_s));
  }
  if (rpc_deadline < absl::Milliseconds(100) || rpc_deadline > absl::Seconds(30)) {
    return absl::InvalidArgumentError("etcd rpc deadline must be within 100 ms..30 s");
  }
  if (max_backoff < kMinBackoff) return absl::InvalidArgumentError("max_backoff below 100 ms");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NodeSession>> NodeSession::Create(NodeSessionOptions options,
                                                                 NodeSessionCallbacks callbacks) {
  if (auto s = options.Validate(); !s.ok()) return s;
  auto client =
      EtcdClient::Connect({.endpoints = options.endpoints, .rpc_deadline = options.rpc_deadline});
  if (!client.ok()) return client.status();
  return std::unique_ptr<NodeSession>(
      new NodeSessionImpl(std::move(options), std::move(callbacks), std::move(*client)));
}

}  // namespace kvnode::cluster
