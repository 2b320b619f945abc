// Data plane: setup, teardown and the event loop. The per-completion hot path
// is in data_plane_datapath.cc.
#include "data_plane.h"

#include <glog/logging.h>
#include <poll.h>
#include <sys/random.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "data_plane_internal.h"
#include "kvnode/proto/control.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/rdma/errors.h"
#include "kvnode/server/control_session.h"
#include "kvnode/server/spin_policy.h"

namespace kvnode::server {
namespace {

rdma::PeerInfo ToPeer(const proto::QpInfo& q, bool roce) {
  rdma::PeerInfo p;
  p.qp_num = q.qpn;
  p.psn = q.psn;
  std::copy(q.gid.begin(), q.gid.end(), p.gid);
  p.lid = q.lid;
  p.port = q.port;
  p.mtu = q.mtu;
  p.use_grh = roce ? 1 : 0;
  return p;
}

proto::QpInfo FromPeer(const rdma::PeerInfo& p) {
  proto::QpInfo q;
  q.qpn = p.qp_num;
  q.psn = p.psn;
  std::copy(std::begin(p.gid), std::end(p.gid), q.gid.begin());
  q.lid = p.lid;
  q.mtu = p.mtu;
  q.port = p.port;
  return q;
}

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

rdma::Deadline ToDeadline(absl::Duration d) {
  return rdma::DeadlineIn(absl::ToChronoNanoseconds(d));
}

static_assert(sizeof(ResumeSecret) == proto::kResumeSecretSize);

// Fills `n` bytes from the kernel CSPRNG (blocks only until it is seeded at
// boot).
absl::Status RandomBytes(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

// Constant time in the contents (TokensEqual); a record without a secret
// (all zeros) is never resumed.
bool SecretMatches(const ResumeSecret& stored, const ResumeSecret& presented) {
  if (stored == ResumeSecret{}) return false;
  auto view = [](const ResumeSecret& s) {
    return std::string_view(reinterpret_cast<const char*>(s.data()), s.size());
  };
  return TokensEqual(view(stored), view(presented));
}

}  // namespace

size_t RpcBufferStride() { return (proto::kMaxRpcMessageSize + 63) / 64 * 64; }

size_t RpcPoolBytes(uint32_t max_clients, uint32_t credits) {
  // Per client: `credits` receive slots and 2 x credits send slots (a client
  // may issue its next request before our send completion is polled).
  const size_t bytes = size_t{max_clients} * 3 * credits * RpcBufferStride();
  return (bytes + 4095) / 4096 * 4096;
}

DataPlane::DataPlane(const DataPlaneConfig& config, DataPlaneResources resources,
                     KvBackend* backend, Metrics* metrics, LostFn on_lost)
    : config_(config),
      res_(std::move(resources)),
      backend_(backend),
      metrics_(metrics),
      on_lost_(std::move(on_lost)),
      records_(config.dedupe_window, config.max_client_records),
      response_inline_bytes_(config.response_inline_bytes) {}

absl::StatusOr<std::unique_ptr<DataPlane>> DataPlane::Create(const DataPlaneConfig& config,
                                                             DataPlaneResources resources,
                                                             KvBackend* backend, Metrics* metrics,
                                                             LostFn on_lost) {
  if (resources.pool_mr == nullptr || resources.arena_mr == nullptr || resources.pd == nullptr) {
    return absl::InvalidArgumentError("DataPlane::Create: missing PD or MR");
  }
  if (resources.pool_mr->length() < RpcPoolBytes(config.max_clients, config.credits)) {
    return absl::InvalidArgumentError("DataPlane::Create: RPC pool MR too small");
  }
  std::unique_ptr<DataPlane> dp(
      new DataPlane(config, std::move(resources), backend, metrics, std::move(on_lost)));
  absl::StatusOr<std::unique_ptr<TaskQueue>> q = TaskQueue::Create();
  if (!q.ok()) return q.status();
  dp->tasks_ = std::move(*q);

  // Every signaled WR of every QP, plus one drain marker per QP.
  const int64_t per_qp = 3 * int64_t{config.credits} + 3;
  int64_t depth = int64_t{config.max_clients} * per_qp + 16;
  const int max_cqe = dp->res_.device->caps().max_cqe;
  if (max_cqe > 0 && depth > max_cqe) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CQ would need ", depth, " entries for --max_clients=", config.max_clients,
                     " x --rpc_credits=", config.credits, " but the device allows ", max_cqe,
                     ": lower one of them"));
  }
  rdma::CqOptions co;
  co.depth = static_cast<int>(depth);
  co.with_channel = true;
  co.label = "server-cq";
  absl::StatusOr<std::shared_ptr<rdma::Cq>> cq = rdma::Cq::Create(dp->res_.device, co);
  if (!cq.ok()) return cq.status();
  dp->cq_ = std::move(*cq);
  for (uint32_t b = config.max_clients; b > 0; --b) dp->free_blocks_.push_back(b - 1);
  return dp;
}

DataPlane::~DataPlane() {
  if (thread_.joinable()) {
    Post([this] { stop_ = true; });
    thread_.join();
  }
  // Sessions left (Shutdown not called): their destructors deallocate
  // windows before destroying QPs (kvrdma guarantees the order).
  by_serial_.clear();
  by_client_.clear();
  by_conn_.clear();
}

void DataPlane::Start() {
  if (started_) return;
  started_ = true;
  // The slot words of the view published so far (the persisted map) before
  // the first session (the thread does not run yet: this one owns it).
  RefreshShardView();
  thread_ = std::thread([this] { Loop(); });
}

void DataPlane::Shutdown() {
  if (!thread_.joinable()) return;
  Post([this] {
    std::vector<uint64_t> ids;
    for (const auto& [id, s] : by_conn_) ids.push_back(id);
    for (uint64_t id : ids) CloseSession(id, "node shutting down");
    stop_ = true;
  });
  thread_.join();
}

void DataPlane::Loop() {
  std::array<rdma::Completion, 32> wcs;
  using SteadyClock = std::chrono::steady_clock;
  // last_activity: a completion or a task; the spin window runs from it (and
  // from a wake-up). last_completion: the end of the last poll round that
  // handled completions; a request's gap is measured from it.
  //
  // Clock reads are rationed: on a guest whose clocksource is not the TSC
  // (the HPET under TCG) each one is a syscall and an emulated device read,
  // a few microseconds. With a fixed spin (not adaptive), activity is not
  // timestamped when it ends but at the next empty poll (`unstamped`), which
  // is the spin's first clock read anyway: the window starts one poll later
  // than at the end of the busy round, and a busy node reads no clock at all.
  // While spinning the clock is read every kPollsPerClockRead empty polls:
  // the spin ends at most that many polls late, and a request that lands
  // meanwhile is seen a clock read sooner. The adaptive spin measures gaps
  // from the end of a round, so it stamps every busy round as before.
  constexpr int kPollsPerClockRead = 8;
  auto last_activity = SteadyClock::now();
  auto last_completion = last_activity;
  bool unstamped = false;
  int polls_unread = 0;  // empty polls since the last clock read
  SpinPolicy spin(uint64_t{config_.spin_us} * 1000, uint64_t{config_.spin_max_us} * 1000);
  auto poll_once = [&]() -> int {
    absl::StatusOr<int> n = cq_->Poll(wcs);
    if (!n.ok()) {
      LOG(ERROR) << "data plane: " << n.status();
      return 0;
    }
    if (*n == 0) return 0;
    if (spin.adaptive()) {
      for (int i = 0; i < *n; ++i) {
        if (wcs[i].ok() && WrKindOf(wcs[i].wr_id) == WrTag::kRecv) {
          spin.OnRequest(static_cast<uint64_t>(
              std::chrono::nanoseconds(SteadyClock::now() - last_completion).count()));
          break;
        }
      }
    }
    // A task (a session's set-up or teardown, a Move, a stats snapshot)
    // waits for the writes staged so far, not for the whole round: a client
    // moving in during a live upgrade waits on its session's tasks. The
    // staged writes go first: a task may pause writes or reuse a reaped
    // session's buffers. A task may reap a session whose completions are
    // later in `wcs`; HandleCompletion ignores those, as after any reap.
    for (int i = 0; i < *n; ++i) {
      HandleCompletion(wcs[i]);
      if (tasks_->pending()) {
        FlushRound();
        tasks_->RunAll();
      }
    }
    FlushRound();
    return *n;
  };
  // After a busy round: `n` completions handled.
  auto busy = [&](int n) {
    polls_unread = 0;
    if (!spin.adaptive()) {
      unstamped = true;
      return;
    }
    last_activity = SteadyClock::now();
    if (n > 0) last_completion = last_activity;
  };
  while (!stop_) {
    const int n = poll_once();
    const bool ran = tasks_->pending() && tasks_->RunAll() > 0;
    if (n > 0 || ran) {
      busy(n);
      continue;
    }
    if (!unstamped && ++polls_unread < kPollsPerClockRead) continue;
    polls_unread = 0;
    const auto now = SteadyClock::now();
    if (unstamped) {
      last_activity = now;  // the first empty poll after activity: the window starts here
      unstamped = false;
    }
    if (now - last_activity < std::chrono::nanoseconds(spin.window_ns())) continue;
    // Idle: arm the CQ, then poll once more (a completion that arrived before
    // arming raises no event), then sleep on the channel and the task queue.
    if (absl::Status s = cq_->RequestNotify(); !s.ok()) {
      LOG(ERROR) << "data plane: " << s;
    }
    if (const int m = poll_once(); m > 0 || tasks_->pending()) {
      busy(m);
      continue;
    }
    pollfd fds[2] = {{cq_->channel_fd(), POLLIN, 0}, {tasks_->fd(), POLLIN, 0}};
    const int rc = poll(fds, 2, 1000);
    if (rc > 0 && (fds[0].revents & POLLIN) != 0) {
      // Gets and acknowledges the event (does not block: the fd is readable;
      // a deadline already past).
      absl::StatusOr<bool> ev = cq_->WaitForEvent(rdma::Deadline{});
      if (!ev.ok()) LOG(ERROR) << "data plane: " << ev.status();
    }
    // The window restarts from the wake-up (stamped at the next empty poll
    // unless the adaptive spin needs it now).
    busy(0);
  }
}

void DataPlane::TrimRecords() {
  for (uint64_t id : records_.Trim(Live())) {
    backend_->ForgetClient(id);  // its persisted record goes with it
  }
  client_records_.store(records_.size(), std::memory_order_relaxed);
}

void DataPlane::ForgetRecord(uint64_t client_id) {
  records_.Erase(client_id);
  backend_->ForgetClient(client_id);  // its persisted record goes with it
  client_records_.store(records_.size(), std::memory_order_relaxed);
}

absl::Status DataPlane::NewClientId(uint64_t* client_id) const {
  do {
    if (absl::Status st = RandomBytes(client_id, sizeof(*client_id)); !st.ok()) return st;
  } while (*client_id == 0 || records_.contains(*client_id) || by_client_.contains(*client_id));
  return absl::OkStatus();
}

void DataPlane::WriteSlotWords() {
  if (res_.slot_words == nullptr || config_.shard_gate == nullptr) return;
  const uint32_t changed = StoreSlotWords(shard_view_.get(), res_.slot_words);
  const uint64_t epoch = shard_view_ != nullptr ? shard_view_->map.epoch : 0;
  config_.shard_gate->NoteSlotWords(epoch);
  VLOG(1) << "slot words of map epoch " << epoch << ": " << changed << " changed";
}

void DataPlane::SetSlotWords(uint8_t* words, uint64_t offset) {
  if (res_.slot_words != nullptr || words == nullptr) return;
  res_.slot_words = words;
  res_.slot_words_offset = offset;
  RefreshShardView();
  WriteSlotWords();
}

absl::StatusOr<SessionSetup> DataPlane::CreateSession(uint64_t conn_id,
                                                      uint64_t requested_client_id,
                                                      const ResumeSecret& presented_secret,
                                                      std::string peer, bool shard_map_feature) {
  if (by_conn_.contains(conn_id)) {
    return absl::AlreadyExistsError(absl::StrCat("connection ", conn_id, " has a session"));
  }
  SessionSetup setup;
  // The words the Welcome offers show the gate's view from here on.
  RefreshShardView();
  setup.slot_words_offset = res_.slot_words != nullptr ? res_.slot_words_offset : 0;
  uint64_t client_id = 0;
  if (requested_client_id != 0) {
    const ClientRecord* rec = records_.Find(requested_client_id);
    if (rec != nullptr && SecretMatches(rec->secret, presented_secret)) {
      client_id = requested_client_id;
    } else {
      // An unknown id (forgotten, or from another node) or a wrong secret:
      // the Hello proves nothing, so it touches nothing of that id.
      setup.resume_refused = true;
    }
  }
  if (client_id != 0) {
    auto live = by_client_.find(client_id);
    if (live != by_client_.end()) {
      // The client reconnected (or moved) while its old session lingers:
      // the old one goes first so that its in-flight writes are recorded in
      // the dedupe window before the new session's retries arrive.
      setup.replaced_conn = live->second->conn_id;
      CloseSession(live->second->conn_id, "replaced by a newer session of the same client id");
    }
  }
  if (free_blocks_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("all ", config_.max_clients, " client slots in use (--max_clients)"));
  }
  if (client_id == 0) {
    if (absl::Status st = NewClientId(&client_id); !st.ok()) return st;
  }
  // Drawn before anything is allocated: used if the record is new.
  ResumeSecret fresh_secret{};
  do {
    if (absl::Status st = RandomBytes(fresh_secret.data(), fresh_secret.size()); !st.ok()) {
      return st;
    }
  } while (fresh_secret == ResumeSecret{});

  auto s = std::make_unique<Session>();
  s->conn_id = conn_id;
  s->client_id = client_id;
  s->serial = next_serial_++;
  if (next_serial_ == 0) next_serial_ = 1;
  s->block = free_blocks_.back();
  s->peer = std::move(peer);
  s->shard_map_feature = shard_map_feature;
  s->created = absl::Now();
  for (uint32_t i = 2 * config_.credits; i > 0; --i) s->free_send.push_back(i - 1);

  rdma::QpOptions qo;
  qo.max_send_wr = 2 * config_.credits + 2;  // responses + bind + invalidate
  qo.max_recv_wr = config_.credits;
  qo.remote_access = IBV_ACCESS_REMOTE_READ;
  qo.timeout = config_.qp_timeout;
  qo.retry_cnt = config_.qp_retry_cnt;
  qo.label = absl::StrCat("client-", client_id);
  // Small responses (every PUT, DELETE and PING answer) go inline: the
  // device copies them at post time instead of reading the buffer later.
  qo.max_inline_data = response_inline_bytes_;
  absl::StatusOr<std::unique_ptr<rdma::Qp>> qp = rdma::Qp::Create(res_.pd, cq_, cq_, qo);
  if (!qp.ok() && qo.max_inline_data > 0) {
    LOG(WARNING) << "creating a client QP with " << qo.max_inline_data
                 << " bytes of inline data failed (" << qp.status()
                 << "); responses are posted without inline data from now on";
    response_inline_bytes_ = 0;
    qo.max_inline_data = 0;
    qp = rdma::Qp::Create(res_.pd, cq_, cq_, qo);
  }
  if (!qp.ok()) return qp.status();
  s->qp = std::move(*qp);
  if (absl::Status st = s->qp->ToInit(); !st.ok()) return st;
  if (config_.use_windows) {
    absl::StatusOr<std::shared_ptr<rdma::Mw>> mw = rdma::Mw::Allocate(
        res_.pd, rdma::MwType::kType2, absl::StrCat("window-client-", client_id));
    if (!mw.ok()) return mw.status();
    s->mw = std::move(*mw);
    // The bind is posted once the QP is RTS (ConnectSession); its rkey is
    // known now (kvrdma binds with ibv_inc_rkey of the current key).
    s->rkey = ibv_inc_rkey(s->mw->rkey());
  } else {
    s->rkey = res_.arena_mr->rkey();
  }
  // Receives may be posted in INIT: they are in place before the client can
  // send (the client sends only after Ready).
  for (uint32_t i = 0; i < config_.credits; ++i) {
    if (absl::Status st = PostRecvSlot(*s, i); !st.ok()) return st;
  }

  free_blocks_.pop_back();
  const size_t records_before = records_.size();
  s->record = records_.Open(client_id, NowNs());
  // A new record may push the oldest idle one out (this one is the newest:
  // --max_client_records >= --max_clients keeps it in).
  if (records_.size() > records_before) TrimRecords();
  // A new id's record (or a resumed id's whose record was aged out while its
  // old session was torn down) gets its secret here; a resumed id keeps its.
  if (s->record->secret == ResumeSecret{}) s->record->secret = fresh_secret;
  setup.client_id = client_id;
  setup.secret = s->record->secret;
  rdma::PeerInfo local = s->qp->LocalInfo();
  local.mtu = static_cast<uint8_t>(res_.device->active_mtu());
  setup.qp = FromPeer(local);
  setup.rkey = s->rkey;
  by_serial_[s->serial] = s.get();
  by_client_[client_id] = s.get();
  by_conn_[conn_id] = std::move(s);
  live_sessions_.store(by_conn_.size(), std::memory_order_relaxed);
  return setup;
}

absl::Status DataPlane::ConnectSession(uint64_t conn_id, const proto::QpInfo& client) {
  auto it = by_conn_.find(conn_id);
  if (it == by_conn_.end()) {
    return absl::NotFoundError(absl::StrCat("connection ", conn_id, " has no session"));
  }
  Session& s = *it->second;
  const rdma::PeerInfo peer = ToPeer(client, res_.device->is_roce());
  if (absl::Status st = s.qp->ToRtr(peer); !st.ok()) return st;
  if (absl::Status st = s.qp->ToRts(); !st.ok()) return st;
  if (s.mw != nullptr) {
    const uint64_t wr = MakeWrId(s.serial, WrTag::kBind, 0);
    absl::StatusOr<uint32_t> rkey =
        s.qp->PostBindMw(wr, s.mw, res_.arena_mr, 0, res_.arena_size, IBV_ACCESS_REMOTE_READ);
    if (!rkey.ok()) return rkey.status();
    if (*rkey != s.rkey) {
      return absl::InternalError(
          absl::StrCat("window bound with rkey ", *rkey, " but Welcome announced ", s.rkey));
    }
    absl::StatusOr<rdma::Completion> c =
        s.qp->WaitFor(wr, rdma::WrKind::kBindMw, rdma::DeadlineIn(std::chrono::seconds(2)));
    if (!c.ok()) return c.status();
    if (!c->ok()) return c->ToStatus();
  }
  s.connected = true;
  ready_sessions_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

void DataPlane::CloseSession(uint64_t conn_id, const std::string& why, bool forget_client) {
  auto it = by_conn_.find(conn_id);
  if (it == by_conn_.end()) return;
  const uint64_t client_id = it->second->client_id;
  Reap(*it->second, why, std::nullopt, /*notify=*/false);
  // After Reap: its QP is destroyed, so no request of the client can arrive
  // any more and re-create the record. A newer session of the same id (a
  // resume that replaced this one) keeps it.
  if (forget_client && records_.contains(client_id) && !by_client_.contains(client_id)) {
    ForgetRecord(client_id);
  }
}

void DataPlane::Reap(Session& s, const std::string& why, std::optional<ErrorKind> kind,
                     bool notify) {
  const uint64_t conn_id = s.conn_id;
  const uint32_t qpn = s.qp != nullptr ? s.qp->qp_num() : 0;
  // 1. The window first: its rkey is dead from here on.
  if (s.mw != nullptr) {
    if (absl::Status st = s.mw->Dealloc(); !st.ok()) {
      LOG(WARNING) << "client " << s.client_id << ": window dealloc: " << st;
    }
  }
  // 2-4. QP to ERR, drain, destroy.
  size_t flushed = 0;
  if (s.qp != nullptr) {
    if (absl::Status st = s.qp->ToError(); !st.ok()) {
      LOG(WARNING) << "client " << s.client_id << ": QP " << qpn << " to ERR: " << st;
    }
    std::vector<rdma::Completion> done;
    if (absl::Status st = s.qp->Drain(ToDeadline(config_.drain_timeout), &done); !st.ok()) {
      LOG(WARNING) << "client " << s.client_id << ": drain of QP " << qpn << ": " << st;
    }
    flushed = done.size();
    s.qp.reset();
  }
  s.mw.reset();
  // 5. Buffers back to the pool.
  free_blocks_.push_back(s.block);
  by_serial_.erase(s.serial);
  if (auto c = by_client_.find(s.client_id); c != by_client_.end() && c->second == &s) {
    by_client_.erase(c);
  }
  if (s.record != nullptr) records_.Closed(s.record, NowNs());
  if (s.connected) ready_sessions_.fetch_sub(1, std::memory_order_relaxed);
  metrics_->Add(Counter::kSessionsClosed);
  if (kind.has_value()) metrics_->Error(*kind);
  LOG(INFO) << "session closed: client " << s.client_id << " (" << s.peer << ", conn " << conn_id
            << ", qpn " << qpn << ", " << s.ops << " RPCs, " << flushed << " WRs flushed): " << why;
  std::string why_copy = why;
  by_conn_.erase(conn_id);  // destroys s
  live_sessions_.store(by_conn_.size(), std::memory_order_relaxed);
  TrimRecords();
  if (notify && on_lost_)
    on_lost_(conn_id, std::move(why_copy), kind.value_or(ErrorKind::kQpError));
}

std::vector<ClientRow> DataPlane::ClientRows() const {
  std::vector<ClientRow> rows;
  const absl::Time now = absl::Now();
  for (const auto& [id, s] : by_conn_) {
    ClientRow r;
    r.client_id = s->client_id;
    r.peer = s->peer;
    r.qpn = s->qp != nullptr ? s->qp->qp_num() : 0;
    r.rkey = s->rkey;
    r.state = s->connected ? "ready" : "handshake";
    r.ops = s->ops;
    r.connected_s = absl::ToDoubleSeconds(now - s->created);
    rows.push_back(std::move(r));
  }
  std::sort(rows.begin(), rows.end(),
            [](const ClientRow& a, const ClientRow& b) { return a.client_id < b.client_id; });
  return rows;
}

std::vector<MrRow> DataPlane::WindowRows() const {
  std::vector<MrRow> rows;
  for (const auto& [id, s] : by_conn_) {
    if (s->mw == nullptr) continue;
    MrRow r;
    r.kind = "mw";
    r.label = s->mw->label();
    r.rkey = s->rkey;
    r.addr = res_.arena_mr->iova();
    r.length = res_.arena_size;
    r.access = s->mw->bound() ? "REMOTE_READ" : "NONE (not bound yet)";
    r.client_id = s->client_id;
    rows.push_back(std::move(r));
  }
  return rows;
}

RecordsExport DataPlane::ExportRecords(uint64_t changed_after, bool with_live) const {
  return records_.Export(changed_after, with_live, Live());
}

void DataPlane::ImportRecords(const std::vector<ClientRecordExport>& records) {
  records_.Import(records, NowNs(), Live());
  client_records_.store(records_.size(), std::memory_order_relaxed);
}

absl::Status DataPlane::RetainRecords(const std::vector<uint64_t>& client_ids) {
  if (absl::Status s = records_.Retain(client_ids); !s.ok()) return s;
  TrimRecords();  // a no-op unless this process has a lower --max_client_records
  return absl::OkStatus();
}

}  // namespace kvnode::server
