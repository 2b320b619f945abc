// Client setup and teardown, the control channel and the synchronous API.
// Sessions (handshake, Move, reconnect, retirement) are in session.cc, the
// per-operation hot path in datapath.cc.
#include <glog/logging.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <variant>

#include "absl/strings/str_cat.h"
#include "client_impl.h"
#include "kvnode/proto/frame_io.h"
#include "kvnode/rdma/errors.h"
#include "sync_ops.h"

namespace kvnode::client {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

size_t PageRound(size_t n) { return (n + 4095) / 4096 * 4096; }

}  // namespace

// --- options ---------------------------------------------------------------------

absl::Status ClientOptions::Validate() const {
  if (absl::StatusOr<proto::HostPort> hp = proto::ParseHostPort(server); !hp.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--server '", server, "': ", hp.status().message()));
  }
  if (auth_token.size() > proto::kMaxAuthTokenSize) {
    return absl::InvalidArgumentError("auth token longer than 1024 bytes");
  }
  if (client_name.size() > proto::kMaxClientNameSize) {
    return absl::InvalidArgumentError("client_name longer than 256 bytes");
  }
  if (max_outstanding < 1 || max_outstanding > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_outstanding (--depth) = ", max_outstanding, ": must be 1..256"));
  }
  if (max_outstanding_writes > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_outstanding_writes = ", max_outstanding_writes, ": must be 0..256"));
  }
  if (op_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("op_timeout must be > 0");
  }
  if (connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("connect_timeout must be > 0");
  }
  if (reconnect_backoff_min <= absl::ZeroDuration() ||
      reconnect_backoff_max < reconnect_backoff_min) {
    return absl::InvalidArgumentError("reconnect backoff: need 0 < min <= max");
  }
  if (busy_backoff_min <= absl::ZeroDuration() || busy_backoff_max < busy_backoff_min) {
    return absl::InvalidArgumentError("busy backoff: need 0 < min <= max");
  }
  if (keepalive_interval <= absl::ZeroDuration() || keepalive_timeout <= keepalive_interval) {
    return absl::InvalidArgumentError("keep-alive: need 0 < interval < timeout");
  }
  if (location_cache_entries > (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("location_cache_entries = ", location_cache_entries, ": must be 0..1048576"));
  }
  if (qp_timeout > 31 || qp_retry_cnt > 7) {
    return absl::InvalidArgumentError("qp_timeout must be 0..31 and qp_retry_cnt 0..7");
  }
  return absl::OkStatus();
}

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kGet:
      return "get";
    case OpKind::kPut:
      return "put";
    case OpKind::kDelete:
      return "delete";
    case OpKind::kPing:
      return "ping";
  }
  return "?";
}

// --- Impl: setup -----------------------------------------------------------------------

void Client::Impl::InitSlots() {
  slots_.resize(slot_count());
  for (uint32_t i = slot_count(); i > 0; --i) free_.push_back(i - 1);
  for (Slot& s : slots_) s.key.reserve(storage::kMaxKeySize);
  endpoint_ = options_.server;
  reconnect_backoff_ = options_.reconnect_backoff_min;
}

absl::Status Client::Impl::InitAsync() {
  InitSlots();
  if (absl::Status st = InitDevice(); !st.ok()) return st;
  // As after a lost session: Submit accepts work, Poll drives the
  // handshake (and retries it with backoff while work waits).
  need_reconnect_ = true;
  next_reconnect_ = absl::Now();
  StartHandshake(endpoint_, /*for_move=*/false, absl::Now());
  return absl::OkStatus();
}

absl::Status Client::Impl::Init() {
  InitSlots();
  // Device, PD, CQ and the registered buffers before the first connect: the
  // server's handshake deadline starts at accept, and opening a device and
  // registering memory are local work that can take seconds on a loaded host.
  if (absl::Status st = InitDevice(); !st.ok()) return st;

  // The first session runs the same state machine as a Move or a reconnect;
  // Connect is synchronous, so here (only) we wait for its fd.
  StartHandshake(endpoint_, /*for_move=*/false, absl::Now());
  while (pending_ != nullptr && pending_->state != SessionState::kUp) {
    pollfd p{pending_->fd.get(),
             static_cast<short>(pending_->state == SessionState::kConnecting ? POLLOUT : POLLIN),
             0};
    PollFds(std::span<pollfd>(&p, 1), pending_->step_deadline);
    StepHandshake(absl::Now());
  }
  if (pending_ == nullptr) {  // failed: flush the QP it may have left, report why
    for (std::unique_ptr<Session>& s : retiring_) DestroySession(s, /*say_goodbye=*/false);
    retiring_.clear();
    return last_connect_error_;
  }
  current_ = std::move(pending_);
  return absl::OkStatus();
}

absl::Status Client::Impl::InitDevice() {
  rdma::DeviceOptions dopt;
  dopt.name = options_.rdma_device;
  dopt.port = options_.rdma_port;
  dopt.gid_index = options_.gid_index;
  absl::StatusOr<std::shared_ptr<rdma::Device>> dev = rdma::Device::Open(dopt);
  if (!dev.ok()) return dev.status();
  device_ = *std::move(dev);
  absl::StatusOr<std::shared_ptr<rdma::Pd>> pd = rdma::Pd::Create(device_, "kvclient-pd");
  if (!pd.ok()) return pd.status();
  pd_ = *std::move(pd);
  rdma::CqOptions copt;
  // Two sessions at once while moving, each with one send WR per slot and one
  // receive per slot, plus drain markers.
  copt.depth = static_cast<int>(4 * slot_count() + 16);
  copt.with_channel = true;
  copt.label = "kvclient-cq";
  absl::StatusOr<std::shared_ptr<rdma::Cq>> cq = rdma::Cq::Create(device_, copt);
  if (!cq.ok()) return cq.status();
  cq_ = *std::move(cq);

  const size_t bytes = PageRound(size_t{slot_count()} * kSlotStride);
  absl::StatusOr<rdma::HostMemory> mem = rdma::HostMemory::Allocate(bytes);
  if (!mem.ok()) return mem.status();
  slot_mem_ = *std::move(mem);
  rdma::MrOptions mopt;
  mopt.access = IBV_ACCESS_LOCAL_WRITE;  // READ targets; SEND sources need nothing
  mopt.label = "kvclient-slots";
  absl::StatusOr<std::shared_ptr<rdma::Mr>> mr =
      rdma::Mr::Register(pd_, slot_mem_.data(), slot_mem_.size(), mopt);
  if (!mr.ok()) return mr.status();
  slot_mr_ = *std::move(mr);

  for (int side = 0; side < 2; ++side) {
    absl::StatusOr<rdma::HostMemory> rm =
        rdma::HostMemory::Allocate(PageRound(size_t{slot_count()} * kRecvBufSize));
    if (!rm.ok()) return rm.status();
    recv_mem_[side] = *std::move(rm);
    rdma::MrOptions ropt;
    ropt.access = IBV_ACCESS_LOCAL_WRITE;
    ropt.label = absl::StrCat("kvclient-recv-", side);
    absl::StatusOr<std::shared_ptr<rdma::Mr>> rmr =
        rdma::Mr::Register(pd_, recv_mem_[side].data(), recv_mem_[side].size(), ropt);
    if (!rmr.ok()) return rmr.status();
    recv_mr_[side] = *std::move(rmr);
  }

  return absl::OkStatus();
}

// --- control channel ----------------------------------------------------------------

void Client::Impl::SendControl(Session* s, const proto::ControlMessage& m) {
  if (s->broken) return;
  absl::Status st = SendFrame(s->fd.get(), m);
  if (!st.ok()) {
    s->broken = true;
    s->broken_why = absl::UnavailableError(absl::StrCat("control send: ", st.message()));
    return;
  }
  s->last_tx = absl::Now();
}

void Client::Impl::PollControl(Session* s, absl::Time now) {
  if (s->broken) return;
  if (absl::Status st = ReceiveAvailable(s->fd.get(), &s->assembler); !st.ok()) {
    s->broken = true;  // the frames that arrived before are still handled
    s->broken_why = std::move(st);
  }
  for (;;) {
    absl::StatusOr<std::optional<proto::ControlMessage>> m = s->assembler.Next();
    if (!m.ok()) {
      s->broken = true;
      s->broken_why = absl::UnavailableError(
          absl::StrCat("bad control frame from the server: ", m.status().message()));
      return;
    }
    if (!m->has_value()) break;
    s->last_rx = now;
    std::visit(Overloaded{
                   [&](const proto::Keepalive& k) { SendControl(s, proto::KeepaliveAck{k.nonce}); },
                   [&](const proto::KeepaliveAck&) {},
                   [&](const proto::Move& mv) {
                     if (s != current_.get() || s->moving) return;
                     LOG(INFO) << "kvclient: client " << client_id_ << " told to move to "
                               << mv.endpoint << " (generation " << mv.new_generation << ")";
                     s->moving = true;
                     s->move = mv;
                     absl::Duration drain = options_.move_drain_timeout;
                     if (mv.deadline_ms > 0) {
                       drain = std::min(drain, absl::Milliseconds(mv.deadline_ms) / 2);
                     }
                     s->move_drain_deadline = now + drain;
                     next_reconnect_ = now;  // the handshake starts at once
                   },
                   [&](const proto::Goodbye& g) {
                     s->broken = true;
                     s->broken_why = absl::UnavailableError(
                         absl::StrCat("server said goodbye (reason ",
                                      static_cast<uint32_t>(g.reason), "): ", g.message));
                   },
                   [&](const proto::Error& e) {
                     s->broken = true;
                     s->broken_why = ServerErrorStatus(e, "the session");
                   },
                   [&](const proto::ShardMapMsg& m) { OnShardMap(s, m); },
                   [&](const proto::Guard& g) { OnGuard(s, g); },
                   [&](const auto& other) {
                     s->broken = true;
                     s->broken_why = absl::UnavailableError(absl::StrCat(
                         "unexpected control message ",
                         proto::MessageTypeName(static_cast<uint16_t>(proto::TypeOf(other)))));
                   },
               },
               **m);
    if (s->broken) return;
  }
  TryAckGuard(s);
  if (now - s->last_tx >= options_.keepalive_interval) {
    SendControl(s, proto::Keepalive{static_cast<uint64_t>(absl::ToUnixNanos(now))});
  }
  if (now - s->last_rx >= options_.keepalive_timeout && !s->broken) {
    s->broken = true;
    s->broken_why = absl::UnavailableError(absl::StrCat(
        "nothing received on the control connection for ", absl::FormatDuration(now - s->last_rx)));
  }
}

bool Client::Impl::SessionAsked(Session* s, uint64_t feature, const char* message,
                                const char* what) {
  if ((s->welcome.features & hello_features_ & feature) != 0) return true;
  s->broken = true;
  s->broken_why = absl::UnavailableError(absl::StrCat(
      "unexpected control message ", message, " (this session did not ask for ", what, ")"));
  return false;
}

void Client::Impl::OnShardMap(Session* s, const proto::ShardMapMsg& m) {
  if (!SessionAsked(s, proto::kFeatureShardMap, "ShardMap", "shard maps")) return;
  maps_.push_back(m.map);
}

void Client::Impl::OnGuard(Session* s, const proto::Guard& g) {
  if (!SessionAsked(s, proto::kFeatureSlotWords, "Guard", "slot words")) return;
  VLOG(1) << "kvclient: client " << client_id_ << ": " << s->endpoint
          << " checks slot words below map epoch " << g.check_below_epoch << " (ours " << map_epoch_
          << ")";
  s->check_below_epoch = g.check_below_epoch;
  s->guard_ack_due = true;
  s->guard_ack_nonce = g.nonce;
  TryAckGuard(s);
}

void Client::Impl::TryAckGuard(Session* s) {
  if (!s->guard_ack_due || s->broken) return;
  // The acknowledgement promises the node that no READ of this session can
  // still read its arena unchecked: a READ posted before the Guard may not
  // have reached the node yet.
  for (const Slot& slot : slots_) {
    if (slot.state == Slot::State::kReading && slot.epoch == s->epoch && !slot.word_read &&
        slot.reads_outstanding > 0) {
      return;
    }
  }
  s->guard_ack_due = false;
  SendControl(s, proto::GuardAck{s->guard_ack_nonce});
}

bool Client::Impl::RequestMap(uint64_t known_epoch) {
  Session* s = current_.get();
  if (s == nullptr || s->broken || (session_features() & proto::kFeatureShardMap) == 0) {
    return false;
  }
  SendControl(s, proto::MapRequest{known_epoch});
  return !s->broken;
}

uint64_t Client::Impl::session_features() const {
  if (current_ == nullptr) return 0;
  return current_->welcome.features & hello_features_;
}

// --- close --------------------------------------------------------------------------

absl::Status Client::Impl::Close(absl::Time deadline) {
  if (closed_) return absl::OkStatus();
  // Let what is outstanding finish (results are dropped: Poll them before).
  std::vector<OpResult> sink(8);
  while (outstanding() > 0 && absl::Now() < deadline) {
    if (Poll(std::span<OpResult>(sink)) == 0)
      Wait(std::min(deadline, absl::Now() + absl::Milliseconds(5)));
  }
  closed_ = true;
  FailOutstanding([](const Slot&) { return absl::UnavailableError("client closed"); });
  DestroySession(pending_, /*say_goodbye=*/false);
  for (std::unique_ptr<Session>& s : retiring_) DestroySession(s, /*say_goodbye=*/false);
  retiring_.clear();
  DestroySession(current_, /*say_goodbye=*/true);
  done_.clear();
  absl::Status result;
  if (slot_mr_ != nullptr) {
    result = rdma::SafeDeregister(*slot_mr_, ToRdmaDeadline(absl::Now() + absl::Seconds(1)));
    slot_mr_.reset();
  }
  slot_mem_ = rdma::HostMemory();
  for (int side = 0; side < 2; ++side) {
    if (recv_mr_[side] != nullptr) {
      absl::Status st =
          rdma::SafeDeregister(*recv_mr_[side], ToRdmaDeadline(absl::Now() + absl::Seconds(1)));
      if (result.ok()) result = st;
      recv_mr_[side].reset();
    }
    recv_mem_[side] = rdma::HostMemory();
  }
  cq_.reset();
  pd_.reset();
  device_.reset();
  return result;
}

Client::Impl::~Impl() {
  if (!closed_) {
    absl::Status st = Close(absl::Now() + absl::Milliseconds(500));
    if (!st.ok()) LOG(WARNING) << "kvclient: close: " << st;
  }
}

// --- synchronous API ------------------------------------------------------------------

OpResult Client::Impl::Execute(const OpRequest& op) {
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
  int spins = 0;
  for (;;) {
    if (Poll(std::span<OpResult>(out)) == 1) return out[0];
    if (++spins > 256) Wait(absl::Now() + absl::Milliseconds(10));
  }
}

// --- public face ---------------------------------------------------------------------

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (absl::Status st = options.Validate(); !st.ok()) return st;
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status st = impl->Init(); !st.ok()) {
    impl->closed_ = true;  // nothing to say goodbye on; members release in order
    return st;
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<GetResult> Client::Get(std::string_view key, absl::Time deadline) {
  return internal::AsGet(impl_->Execute(internal::SyncOp(OpKind::kGet, key, {}, deadline)));
}

absl::StatusOr<uint64_t> Client::Put(std::string_view key, std::string_view value,
                                     absl::Time deadline) {
  return internal::AsVersion(impl_->Execute(internal::SyncOp(OpKind::kPut, key, value, deadline)));
}

absl::StatusOr<uint64_t> Client::Delete(std::string_view key, absl::Time deadline) {
  return internal::AsVersion(impl_->Execute(internal::SyncOp(OpKind::kDelete, key, {}, deadline)));
}

absl::Status Client::Ping(absl::Time deadline) {
  return impl_->Execute(internal::SyncOp(OpKind::kPing, {}, {}, deadline)).status;
}

OpResult Client::Execute(const OpRequest& op) { return impl_->Execute(op); }
uint32_t Client::available() const { return impl_->available(); }
uint32_t Client::available(OpKind kind) const { return impl_->available(kind); }
uint32_t Client::writes_held() const { return impl_->held_writes(); }
uint32_t Client::outstanding() const { return impl_->outstanding(); }
absl::Status Client::Submit(const OpRequest& op) { return impl_->Submit(op); }
size_t Client::Poll(std::span<OpResult> out) { return impl_->Poll(out); }
void Client::Wait(absl::Time until) { impl_->Wait(until); }
absl::Status Client::Close(absl::Time deadline) { return impl_->Close(deadline); }
uint64_t Client::client_id() const { return impl_->client_id_; }
uint64_t Client::server_generation() const { return impl_->generation_; }
bool Client::connected() const { return impl_->current_ != nullptr && !impl_->current_->broken; }
bool Client::fast_get() const {
  return impl_->current_ != nullptr && impl_->current_->geometry.has_value();
}
const std::string& Client::endpoint() const { return impl_->endpoint_; }
const ClientStats& Client::stats() const { return impl_->stats_; }
const ClientOptions& Client::options() const { return impl_->options_; }

void Client::WaitAny(std::span<Client* const> clients, absl::Time until) {
  std::vector<pollfd> fds;
  fds.reserve(clients.size() * 3);
  for (Client* c : clients) c->impl_->AppendWaitFds(&fds, &until);
  PollFds(std::span<pollfd>(fds), until);
}

}  // namespace kvnode::client
