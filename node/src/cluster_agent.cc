// The cluster agent (cluster_agent.h): identity, the persisted map, the etcd
// session and the member key's states across live upgrades.
#include "cluster_agent.h"

#include <glog/logging.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kvnode/base/errno.h"
#include "kvnode/base/own_dir.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/proto/control.h"

namespace kvnode::node {
namespace {

using base::Av;

absl::Status BadFlag(std::string_view flag, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", Av(flag), ": ", Av(why)));
}

// "a g3 alive, b g4 alive, c down": the members as the map sees them.
std::string MembersText(const proto::ShardMap& map) {
  std::vector<std::string> parts;
  for (const proto::MapNode& n : map.nodes) {
    parts.push_back(n.alive ? absl::StrCat(n.node_id, " g", n.generation, " alive at ", n.endpoint)
                            : absl::StrCat(n.node_id, " down"));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view e : absl::StrSplit(absl::string_view(list.data(), list.size()), ',')) {
    e = absl::StripAsciiWhitespace(e);
    if (e.empty())
      return BadFlag("etcd_endpoints", absl::StrCat("empty entry in '", Av(list), "'"));
    if (absl::StrContains(e, "://")) {
      return BadFlag(
          "etcd_endpoints",
          absl::StrCat("'", e, "' must be host:port, without a URL scheme (plain gRPC)"));
    }
    absl::StatusOr<proto::HostPort> hp = proto::ParseHostPort(std::string_view(e.data(), e.size()));
    if (!hp.ok()) {
      return BadFlag("etcd_endpoints", absl::StrCat("'", e, "': ", hp.status().message()));
    }
    out.emplace_back(e);
  }
  if (out.empty()) return BadFlag("etcd_endpoints", "no endpoint");
  return out;
}

absl::StatusOr<std::optional<ClusterAgentOptions>> ClusterOptionsFromFlags(
    const ClusterFlags& flags, const std::string& db_path) {
  if (flags.cluster.empty()) {
    const char* without = !flags.etcd_endpoints.empty() ? "etcd_endpoints"
                          : !flags.node_id.empty()      ? "node_id"
                          : flags.etcd_lease_ttl_given  ? "etcd_lease_ttl_s"
                                                        : nullptr;
    if (without != nullptr) {
      return BadFlag(without, "only means something with --cluster (a cluster member)");
    }
    return std::nullopt;
  }
  ClusterAgentOptions o;
  if (absl::Status s = proto::CheckName(flags.cluster, proto::kMaxClusterNameSize, "--cluster");
      !s.ok()) {
    return s;
  }
  o.cluster = flags.cluster;
  if (flags.etcd_endpoints.empty()) {
    return BadFlag("cluster", "needs --etcd_endpoints (host:port of etcd, comma separated)");
  }
  absl::StatusOr<std::vector<std::string>> endpoints = ParseEtcdEndpoints(flags.etcd_endpoints);
  if (!endpoints.ok()) return endpoints.status();
  o.etcd_endpoints = std::move(*endpoints);
  if (!flags.node_id.empty()) {
    if (absl::Status s = proto::CheckName(flags.node_id, proto::kMaxNodeIdSize, "--node_id");
        !s.ok()) {
      return s;
    }
  }
  o.node_id = flags.node_id;
  if (flags.etcd_lease_ttl_s < kMinLeaseTtlS || flags.etcd_lease_ttl_s > kMaxLeaseTtlS) {
    return BadFlag("etcd_lease_ttl_s", absl::StrCat("must be ", kMinLeaseTtlS, "..", kMaxLeaseTtlS,
                                                    " seconds, not ", flags.etcd_lease_ttl_s));
  }
  o.lease_ttl_s = flags.etcd_lease_ttl_s;
  if (db_path.empty()) return BadFlag("db_path", "required (the node's identity lives there)");
  o.db_path = db_path;
  return o;
}

absl::StatusOr<std::unique_ptr<ClusterAgent>> ClusterAgent::Create(ClusterAgentOptions options) {
  // The server checks the same and creates it the same way; the identity
  // file needs it first.
  if (absl::Status s = base::EnsureOwnDirectory(absl::StrCat("--db_path ", options.db_path),
                                                options.db_path, 0022);
      !s.ok()) {
    return s;
  }
  const bool existed = [&] {
    absl::StatusOr<std::optional<cluster::Identity>> i = cluster::LoadIdentity(options.db_path);
    return i.ok() && i->has_value();
  }();
  absl::StatusOr<cluster::Identity> id =
      cluster::LoadOrCreateIdentity(options.db_path, options.cluster, options.node_id);
  if (!id.ok()) return id.status();
  cluster::NodeSessionOptions so;
  so.endpoints = options.etcd_endpoints;
  so.cluster = id->cluster;
  so.node_id = id->node_id;
  so.instance = id->instance;
  so.lease_ttl_s = options.lease_ttl_s;
  so.rpc_deadline = options.rpc_deadline;
  if (absl::Status s = so.Validate(); !s.ok()) return s;
  LOG(INFO) << "cluster: node '" << id->node_id << "' of cluster '" << id->cluster << "', instance "
            << id->instance << " (" << (existed ? "identity of" : "new identity written to") << " "
            << options.db_path << "/" << cluster::kIdentityFileName << "), etcd "
            << absl::StrJoin(options.etcd_endpoints, ",") << ", lease TTL " << options.lease_ttl_s
            << " s";
  auto agent = std::unique_ptr<ClusterAgent>(new ClusterAgent(std::move(options), *std::move(id)));
  agent->LoadPersistedMap("at start");
  // This runs before the server blocks the signals it takes by signalfd;
  // gRPC's threads, started now, would inherit an open mask and a SIGUSR2
  // delivered to one of them would kill the process. They start with every
  // signal blocked instead.
  sigset_t all, before;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &before);
  absl::StatusOr<std::unique_ptr<cluster::NodeSession>> session = agent->MakeSession();
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (!session.ok()) return session.status();
  {
    absl::MutexLock l(&agent->mu_);
    agent->prepared_ = *std::move(session);
  }
  return agent;
}

ClusterAgent::ClusterAgent(ClusterAgentOptions options, cluster::Identity identity)
    : options_(std::move(options)),
      identity_(std::move(identity)),
      gate_(std::make_shared<server::ShardGate>()),
      roll_(
          [this] {
            absl::MutexLock l(&mu_);
            return self_;
          },
          [this](cluster::RollReport r) {
            absl::MutexLock l(&mu_);
            self_.roll = std::move(r);
            UpdateMemberLocked();
          }),
      guard_(identity_.node_id) {}

ClusterAgent::~ClusterAgent() { Stop(); }

void ClusterAgent::LoadPersistedMap(const char* when) {
  absl::StatusOr<std::optional<proto::ShardMap>> m =
      cluster::LoadMap(options_.db_path, identity_.cluster);
  absl::MutexLock l(&persist_mu_);
  if (disowned_) return;
  if (!m.ok()) {
    // Not fatal: etcd's map replaces it; until then nothing is owned.
    LOG(WARNING) << "cluster: persisted map ignored " << when << ": " << m.status();
    return;
  }
  if (!m->has_value()) {
    if (gate_->Current() == nullptr) {
      LOG(INFO) << "cluster: no persisted map " << when << ": no slot is served until etcd "
                << "gives a map";
    }
    return;
  }
  persisted_ = **m;
  std::shared_ptr<const server::ShardView> cur = gate_->Current();
  if (cur != nullptr && cur->map == **m) return;
  Publish(**std::move(m), "the persisted map");
}

void ClusterAgent::OnMap(proto::ShardMap map) {
  absl::MutexLock l(&persist_mu_);
  if (disowned_) return;
  Publish(map, "etcd");
  Persist(map);
}

// A refusal for good (the node id is bound to another database) stops
// serving at once: this database is not that node's, so even its persisted
// map must not be served. The process stays up owning no slot (every key is
// answered WRONG_SHARD) so the error stays visible; it never registers.
void ClusterAgent::OnRefused(const absl::Status& s) {
  if (!absl::IsPermissionDenied(s)) {
    LOG(ERROR) << "cluster: not registered: " << s << " (node '" << identity_.node_id
               << "' serves its last map meanwhile and keeps trying)";
    return;
  }
  absl::MutexLock l(&persist_mu_);
  disowned_ = true;
  persist_ = false;
  LOG(ERROR) << "cluster: REFUSED for good: " << s.message() << " (database at " << options_.db_path
             << ", its instance " << identity_.instance << "); node '" << identity_.node_id
             << "' serves no slot and never registers; stop this process";
  if (std::shared_ptr<const server::ShardView> cur = gate_->Current(); cur != nullptr) {
    gate_->Publish(server::ShardView::ForNode(cur->map, ""));  // owns nothing
  }
}

void ClusterAgent::Publish(proto::ShardMap map, const char* source) {
  std::shared_ptr<const server::ShardView> prev = gate_->Current();
  std::shared_ptr<const server::ShardView> view =
      server::ShardView::ForNode(std::move(map), identity_.node_id);
  gate_->Publish(view);
  guard_.OnView(view);
  const proto::ShardMap& m = view->map;
  const bool ownership_changed = prev == nullptr || prev->map.epoch != m.epoch ||
                                 prev->self != view->self ||
                                 prev->slots_owned() != view->slots_owned();
  if (ownership_changed && view->self == server::ShardView::kNotInMap) {
    LOG(WARNING) << "cluster: map epoch " << m.epoch << " from " << source
                 << " does not name node '" << identity_.node_id
                 << "': it owns no slot (every key is answered WRONG_SHARD)";
  } else if (ownership_changed) {
    LOG(INFO) << "cluster: map epoch " << m.epoch << " adopted from " << source << ": node '"
              << identity_.node_id << "' owns " << view->slots_owned() << " of " << m.num_slots
              << " slots";
  }
  if (prev == nullptr || prev->map.nodes != m.nodes) {
    LOG(INFO) << "cluster: members (map epoch " << m.epoch << "): " << MembersText(m);
  }
}

void ClusterAgent::Persist(const proto::ShardMap& map) {
  if (!persist_ || (persisted_.has_value() && *persisted_ == map)) return;
  if (absl::Status s = cluster::StoreMap(options_.db_path, map); !s.ok()) {
    // The next map tries again; a restart meanwhile serves an older map
    // until etcd answers.
    LOG(WARNING) << "cluster: persisting map epoch " << map.epoch << ": " << s;
    return;
  }
  persisted_ = map;
}

absl::StatusOr<std::unique_ptr<cluster::NodeSession>> ClusterAgent::MakeSession() {
  cluster::NodeSessionOptions so;
  so.endpoints = options_.etcd_endpoints;
  so.cluster = identity_.cluster;
  so.node_id = identity_.node_id;
  so.instance = identity_.instance;
  so.lease_ttl_s = options_.lease_ttl_s;
  so.rpc_deadline = options_.rpc_deadline;
  cluster::NodeSessionCallbacks cb;
  cb.on_map = [this](proto::ShardMap m) { OnMap(std::move(m)); };
  cb.on_refused = [this](const absl::Status& s) { OnRefused(s); };
  cb.on_roll = [this](const std::optional<cluster::RollPlan>& p) { roll_.OnPlan(p); };
  cb.on_migration = [this](const std::optional<cluster::MigrationPlan>& p) { guard_.OnPlan(p); };
  return cluster::NodeSession::Create(std::move(so), std::move(cb));
}

absl::Status ClusterAgent::StartSession(const cluster::Member& self, int64_t lease) {
  absl::StatusOr<std::unique_ptr<cluster::NodeSession>> session = [&] {
    absl::MutexLock l(&mu_);
    return prepared_ != nullptr ? std::move(prepared_) : MakeSession();
  }();
  if (!session.ok()) return session.status();
  if (absl::Status s =
          (*session)->Start(self, lease > 0 ? std::optional<int64_t>(lease) : std::nullopt);
      !s.ok()) {
    return s;
  }
  {
    absl::MutexLock l(&mu_);
    session_ = *std::move(session);
  }
  monitor_ = std::thread([this] { Monitor(); });
  return absl::OkStatus();
}

absl::Status ClusterAgent::Start(const std::string& endpoint, uint64_t generation) {
  cluster::Member self;
  self.node_id = identity_.node_id;
  self.endpoint = endpoint;
  self.generation = generation;
  self.build_id = options_.build_id;
  self.version = options_.version;
  self.state = cluster::MemberState::kStarting;
  self.pid = getpid();
  self.instance = identity_.instance;
  {
    absl::MutexLock l(&mu_);
    self_ = self;
  }
  LOG(INFO) << "cluster: registering member " << cluster::MemberKey(identity_.cluster, self.node_id)
            << " at " << endpoint << " as generation " << generation;
  return StartSession(self, 0);
}

void ClusterAgent::SetState(cluster::MemberState state) {
  absl::MutexLock l(&mu_);
  self_.state = state;
  UpdateMemberLocked();
}

void ClusterAgent::UpdateMemberLocked() {
  if (session_ == nullptr || handed_off_ || stopping_) return;
  session_->UpdateMember(self_);
}

void ClusterAgent::MarkServing() { SetState(cluster::MemberState::kServing); }

void ClusterAgent::UpgradeStarted() { SetState(cluster::MemberState::kUpgrading); }

int64_t ClusterAgent::HandOffLease() {
  {
    // Waits for a map file write under way: after this, none starts here.
    absl::MutexLock l(&persist_mu_);
    persist_ = false;
  }
  std::shared_ptr<cluster::NodeSession> session;
  {
    absl::MutexLock l(&mu_);
    handed_off_ = true;
    session = session_;
  }
  const int64_t lease = session != nullptr ? session->HandOffLease() : 0;
  LOG(INFO) << "cluster: lease " << lease << " handed to the new process (no longer renewed here)";
  return lease;
}

void ClusterAgent::UpgradeRolledBack() {
  {
    absl::MutexLock l(&mu_);
    if (handed_off_) {
      handed_off_ = false;
      if (session_ != nullptr) session_->ResumeLease();
      LOG(INFO) << "cluster: the upgrade rolled back: renewing the member's lease here again";
    }
    self_.state = cluster::MemberState::kServing;
    UpdateMemberLocked();
  }
  absl::MutexLock l(&persist_mu_);
  persist_ = !disowned_;
  // A map that came while the file was the other process's.
  if (std::shared_ptr<const server::ShardView> cur = gate_->Current(); cur != nullptr) {
    Persist(cur->map);
  }
}

void ClusterAgent::TakeOverStarted(int64_t lease, uint64_t old_generation, int64_t old_pid,
                                   const std::string& old_build, const std::string& endpoint) {
  // The old process wrote its last map before it handed the lease over.
  LoadPersistedMap("at the takeover");
  cluster::Member self;
  self.node_id = identity_.node_id;
  self.endpoint = endpoint;
  // Until Owned the old process serves: the key keeps describing it.
  self.generation = old_generation;
  self.build_id = old_build;
  self.version = options_.version;
  self.state = cluster::MemberState::kUpgrading;
  self.pid = old_pid;
  self.instance = identity_.instance;
  {
    absl::MutexLock l(&mu_);
    self_ = self;
  }
  if (lease > 0) {
    LOG(INFO) << "cluster: renewing lease " << lease << " of the old process from now on";
  } else {
    LOG(INFO) << "cluster: no lease from the old process: registering with a new one";
  }
  if (absl::Status s = StartSession(self, lease); !s.ok()) {
    LOG(ERROR) << "cluster: cannot start the etcd session: " << s
               << " (serving the persisted map without membership)";
  }
}

void ClusterAgent::TookOver(uint64_t generation) {
  absl::MutexLock l(&mu_);
  self_.generation = generation;
  self_.pid = getpid();
  self_.build_id = options_.build_id;
  self_.version = options_.version;
  UpdateMemberLocked();
  LOG(INFO) << "cluster: member '" << identity_.node_id << "' is generation " << generation
            << " (pid " << self_.pid << ", build " << self_.build_id << ")";
}

void ClusterAgent::UpgradeFinished() { SetState(cluster::MemberState::kServing); }

void ClusterAgent::ShutdownStarted() {
  absl::MutexLock l(&mu_);
  if (session_ == nullptr || handed_off_) return;
  self_.state = cluster::MemberState::kDraining;
  UpdateMemberLocked();
  LOG(INFO) << "cluster: member '" << identity_.node_id << "' draining";
}

void ClusterAgent::Stop() {
  std::shared_ptr<cluster::NodeSession> session;
  bool revoke;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    session = std::move(session_);
    revoke = !handed_off_;
  }
  if (monitor_.joinable()) monitor_.join();
  if (session == nullptr) return;
  const int64_t lease = session->Status().lease_id;
  session->Stop(revoke);
  if (revoke) {
    LOG(INFO) << "cluster: lease " << lease << " revoked: member key "
              << cluster::MemberKey(identity_.cluster, identity_.node_id) << " deleted";
  } else {
    LOG(INFO) << "cluster: etcd session stopped; the lease stays with the new process";
  }
}

void ClusterAgent::SetUpgrade(RollAgent::UpgradeFn upgrade) {
  roll_.SetUpgrade(std::move(upgrade));
}

void ClusterAgent::SetGuard(GuardAgent::GuardFn guard) { guard_.SetGuard(std::move(guard)); }

void ClusterAgent::SetHealth(std::function<cluster::MemberHealth()> health) {
  absl::MutexLock l(&mu_);
  health_ = std::move(health);
  UpdateHealthLocked();
}

void ClusterAgent::UpdateHealthLocked() {
  if (!health_) return;
  cluster::MemberHealth h = health_();
  if (self_.health == h) return;
  self_.health = h;
  UpdateMemberLocked();
}

void ClusterAgent::Monitor() {
  cluster::NodeSessionStatus prev;
  absl::MutexLock l(&mu_);
  for (;;) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(200));
    if (stopping_ || session_ == nullptr) return;
    UpdateHealthLocked();
    const cluster::NodeSessionStatus s = session_->Status();
    if (s.etcd_connected != prev.etcd_connected) {
      if (s.etcd_connected) {
        LOG(INFO) << "cluster: etcd " << (prev.lease_id != 0 ? "regained" : "connected") << " ("
                  << absl::StrJoin(options_.etcd_endpoints, ",") << ")";
      } else {
        LOG(WARNING) << "cluster: etcd lost: " << s.last_error << " (serving map epoch "
                     << gate_->epoch() << " meanwhile)";
      }
    }
    // The session logs each registration with its lease; this says when
    // the node stopped holding one.
    if (!s.registered && prev.registered) {
      LOG(WARNING) << "cluster: member key not held (lease " << prev.lease_id
                   << "): " << s.last_error;
    }
    if (s.map_errors > prev.map_errors) {
      LOG(WARNING) << "cluster: stored map refused, keeping epoch " << gate_->epoch() << ": "
                   << s.last_error;
    }
    prev = s;
  }
}

std::vector<server::ExtraStat> ClusterAgent::Stats() const {
  std::shared_ptr<const server::ShardView> view = gate_->Current();
  cluster::NodeSessionStatus st;
  {
    absl::MutexLock l(&mu_);
    if (session_ != nullptr) st = session_->Status();
  }
  return {
      {"cluster_map_epoch", "", "gauge", "Epoch of the shard map this node serves (0: none).",
       static_cast<double>(gate_->epoch())},
      {"cluster_slots_owned", "", "gauge", "Slots of the shard map this node owns.",
       static_cast<double>(view != nullptr ? view->slots_owned() : 0)},
      {"cluster_slot_words_epoch", "", "gauge",
       "Epoch of the map whose slot ownership the arena's slot words show (0: none yet).",
       static_cast<double>(gate_->slot_words_epoch())},
      {"cluster_etcd_connected", "", "gauge", "1 while the node's etcd session is connected.",
       st.etcd_connected ? 1.0 : 0.0},
      {"cluster_lease_ttl_left_ms", "", "gauge",
       "Time left on the member key's lease at its last keepalive (ms).",
       static_cast<double>(st.lease_ttl_left_ms)},
      {"cluster_guard_wanted", "", "gauge",
       "1 while a slot migration moves slots from this node (its guard must be up).",
       guard_.wanted() ? 1.0 : 0.0},
      {"cluster_guard_held", "", "gauge",
       "1 while the node's guard is up and every client session acknowledged it or was cut.",
       guard_.held() ? 1.0 : 0.0},
  };
}

}  // namespace kvnode::node
