// Client setup and teardown, sessions (connect, lose, reconnect, move), the
// control channel and the synchronous API. The per-operation hot path is in
// datapath.cc.
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

namespace kvnode::client {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

rdma::Deadline ToDeadline(absl::Time t) {
  const absl::Duration left = t - absl::Now();
  if (left <= absl::ZeroDuration()) return rdma::Clock::now();
  return rdma::Clock::now() + absl::ToChronoNanoseconds(std::min(left, absl::Hours(1)));
}

size_t PageRound(size_t n) { return (n + 4095) / 4096 * 4096; }

proto::QpInfo ToQpInfo(const rdma::PeerInfo& p) {
  proto::QpInfo q;
  q.qpn = p.qp_num;
  q.psn = p.psn;
  std::memcpy(q.gid.data(), p.gid, sizeof(p.gid));
  q.lid = p.lid;
  q.mtu = p.mtu;
  q.port = p.port;
  return q;
}

rdma::PeerInfo ToPeerInfo(const proto::QpInfo& q, bool roce) {
  rdma::PeerInfo p;
  p.qp_num = q.qpn;
  p.psn = q.psn;
  std::memcpy(p.gid, q.gid.data(), sizeof(p.gid));
  p.lid = q.lid;
  p.port = q.port;
  p.mtu = q.mtu;
  p.use_grh = (roce || q.lid == 0) ? 1 : 0;
  return p;
}

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

absl::Status Client::Impl::Init() {
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
  copt.depth = static_cast<int>(4 * options_.max_outstanding + 16);
  copt.with_channel = true;
  copt.label = "kvclient-cq";
  absl::StatusOr<std::shared_ptr<rdma::Cq>> cq = rdma::Cq::Create(device_, copt);
  if (!cq.ok()) return cq.status();
  cq_ = *std::move(cq);

  const size_t bytes = PageRound(size_t{options_.max_outstanding} * kSlotStride);
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
        rdma::HostMemory::Allocate(PageRound(size_t{options_.max_outstanding} * kRecvBufSize));
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

  slots_.resize(options_.max_outstanding);
  for (uint32_t i = options_.max_outstanding; i > 0; --i) free_.push_back(i - 1);
  for (Slot& s : slots_) s.key.reserve(storage::kMaxKeySize);

  endpoint_ = options_.server;
  reconnect_backoff_ = options_.reconnect_backoff_min;
  absl::StatusOr<std::unique_ptr<Session>> s = OpenSession(endpoint_);
  if (!s.ok()) return s.status();
  current_ = *std::move(s);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Session>> Client::Impl::OpenSession(const std::string& endpoint) {
  auto s = std::make_unique<Session>();
  s->epoch = next_epoch_++;
  s->endpoint = endpoint;
  s->side = side_in_use_[0] ? 1 : 0;
  if (side_in_use_[s->side]) {
    return absl::InternalError("kvclient: both receive sides in use (two sessions already)");
  }
  if (absl::Status st = Handshake(s.get()); !st.ok()) {
    // Flush the receives posted on a QP that never got connected, so it is
    // destroyed drained.
    if (s->qp != nullptr) (void)s->qp->Drain(ToDeadline(absl::Now() + absl::Milliseconds(500)));
    return st;
  }
  side_in_use_[s->side] = true;
  ++stats_.sessions;
  return s;
}

absl::Status Client::Impl::Handshake(Session* s) {
  const std::string& endpoint = s->endpoint;
  absl::Time deadline = absl::Now() + options_.connect_timeout;
  absl::StatusOr<Fd> fd = TcpConnect(endpoint, deadline);
  if (!fd.ok()) {
    if (absl::IsDeadlineExceeded(fd.status())) {
      return absl::UnavailableError(fd.status().message());
    }
    return fd.status();
  }
  s->fd = *std::move(fd);
  const int sock = s->fd.get();
  deadline = absl::Now() + options_.connect_timeout;

  proto::Hello hello;
  hello.client_id = client_id_;
  hello.auth_token = options_.auth_token;
  hello.client_name = options_.client_name;
  if (absl::Status st = proto::WriteControl(sock, hello, deadline); !st.ok()) {
    return absl::UnavailableError(absl::StrCat("send Hello to ", endpoint, ": ", st.message()));
  }
  absl::StatusOr<proto::ControlMessage> m = proto::ReadControl(sock, deadline);
  if (!m.ok()) {
    return absl::UnavailableError(
        absl::StrCat("waiting for Welcome from ", endpoint, ": ", m.status().message()));
  }
  if (const auto* e = std::get_if<proto::Error>(&*m)) return ServerErrorStatus(*e, "Hello");
  const auto* w = std::get_if<proto::Welcome>(&*m);
  if (w == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(endpoint, " answered Hello with ",
                     proto::MessageTypeName(static_cast<uint16_t>(proto::TypeOf(*m)))));
  }
  s->welcome = *w;
  if (w->client_id == 0 || w->max_rpc_credits == 0) {
    return absl::UnavailableError(absl::StrCat("bad Welcome from ", endpoint, ": client_id=",
                                               w->client_id, " credits=", w->max_rpc_credits));
  }
  if (!w->index_geometry.empty() && !options_.rpc_get_only) {
    absl::StatusOr<storage::Geometry> g = storage::Geometry::Decode(w->index_geometry);
    if (!g.ok()) {
      LOG(WARNING) << "kvclient: index geometry from " << endpoint
                   << " unusable, GETs go by RPC: " << g.status();
    } else if (g->arena_size > w->arena_size) {
      LOG(WARNING) << "kvclient: geometry arena_size " << g->arena_size << " > Welcome arena_size "
                   << w->arena_size << ", GETs go by RPC";
    } else {
      s->geometry = *g;
    }
  }

  // QP with its receive buffers posted before the server can send.
  s->recv_buffers = std::min(options_.max_outstanding, w->max_rpc_credits);
  s->credits = s->recv_buffers;
  rdma::QpOptions qopt;
  qopt.max_send_wr = options_.max_outstanding;
  qopt.max_recv_wr = s->recv_buffers;
  qopt.remote_access = 0;  // nobody reads or writes client memory
  qopt.timeout = options_.qp_timeout;
  qopt.retry_cnt = options_.qp_retry_cnt;
  qopt.rnr_retry = 6;
  qopt.label = absl::StrCat("kvclient-qp-", s->epoch);
  s->recv_mr = recv_mr_[s->side].get();
  s->recv_base = static_cast<const uint8_t*>(recv_mem_[s->side].data());
  absl::StatusOr<std::unique_ptr<rdma::Qp>> qp = rdma::Qp::Create(pd_, cq_, cq_, qopt);
  if (!qp.ok()) return qp.status();
  s->qp = *std::move(qp);
  if (absl::Status st = s->qp->ToInit(); !st.ok()) return st;
  for (uint32_t i = 0; i < s->recv_buffers; ++i) {
    absl::Status st =
        s->qp->PostRecv(MakeWrId(s->epoch, true, i),
                        rdma::LocalBuf{s->recv_mr, uint64_t{i} * kRecvBufSize, kRecvBufSize});
    if (!st.ok()) return st;
  }
  if (absl::Status st = s->qp->ToRtr(ToPeerInfo(w->server_qp, device_->is_roce())); !st.ok()) {
    return st;
  }
  if (absl::Status st = s->qp->ToRts(); !st.ok()) return st;

  deadline = absl::Now() + options_.connect_timeout;  // local setup is not the server's time
  if (absl::Status st =
          proto::WriteControl(sock, proto::ClientQp{ToQpInfo(s->qp->LocalInfo())}, deadline);
      !st.ok()) {
    return absl::UnavailableError(absl::StrCat("send ClientQp to ", endpoint, ": ", st.message()));
  }
  m = proto::ReadControl(sock, deadline);
  if (!m.ok()) {
    return absl::UnavailableError(
        absl::StrCat("waiting for Ready from ", endpoint, ": ", m.status().message()));
  }
  if (const auto* e = std::get_if<proto::Error>(&*m)) return ServerErrorStatus(*e, "ClientQp");
  if (!std::holds_alternative<proto::Ready>(*m)) {
    return absl::UnavailableError(
        absl::StrCat(endpoint, " answered ClientQp with ",
                     proto::MessageTypeName(static_cast<uint16_t>(proto::TypeOf(*m)))));
  }
  if (client_id_ != 0 && client_id_ != w->client_id) {
    LOG(WARNING) << "kvclient: resumed as client " << client_id_ << " but " << endpoint
                 << " assigned " << w->client_id;
  }
  client_id_ = w->client_id;
  generation_ = w->server_generation;
  s->last_rx = s->last_tx = absl::Now();
  VLOG(1) << "kvclient: session " << s->epoch << " to " << endpoint << " as client " << client_id_
          << " generation " << generation_ << " qpn " << s->qp->qp_num() << " -> "
          << w->server_qp.qpn << (s->geometry ? "" : " (no READ fast path)");
  return absl::OkStatus();
}

// --- Impl: teardown -----------------------------------------------------------------

void Client::Impl::DestroySession(std::unique_ptr<Session>& holder, bool say_goodbye) {
  Session* s = holder.get();
  if (s == nullptr) return;
  s->broken = true;  // nothing new is posted here
  if (s->qp != nullptr) {
    std::vector<rdma::Completion> comps;
    absl::Status st = s->qp->Drain(ToDeadline(absl::Now() + absl::Seconds(1)), &comps);
    if (!st.ok()) LOG(WARNING) << "kvclient: drain of session " << s->epoch << ": " << st;
    // Successful completions are real results (a response that arrived just
    // before); flushed ones release their slots.
    for (const rdma::Completion& c : comps) OnCompletion(c);
  }
  const absl::Time now = absl::Now();
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    if (slot.epoch != s->epoch) continue;
    // The QP is destroyed below: the device no longer touches our buffers.
    slot.reads_outstanding = 0;
    slot.sends_outstanding = 0;
    if (slot.state == Slot::State::kRpc || slot.state == Slot::State::kReading) {
      slot.awaiting_response = false;
      Requeue(i, now);  // same sequence on the next session
    } else if (slot.state == Slot::State::kDone) {
      MaybeFree(i);
    }
  }
  if (say_goodbye && s->fd.get() >= 0) {
    proto::Goodbye bye;
    bye.reason = proto::GoodbyeReason::kClientClose;
    bye.message = "client closes";
    (void)proto::WriteControl(s->fd.get(), bye, now + absl::Milliseconds(100));
  }
  side_in_use_[s->side] = false;
  holder.reset();  // QP (its receive side is free again), socket
}

void Client::Impl::OnSessionLost(std::unique_ptr<Session>& holder) {
  Session* s = holder.get();
  const absl::Status why = s->broken_why;
  const bool was_current = (holder.get() == current_.get());
  LOG(WARNING) << "kvclient: client " << client_id_ << " lost session " << s->epoch << " to "
               << s->endpoint << ": " << why;
  last_connect_error_ = why;
  DestroySession(holder, /*say_goodbye=*/false);
  if (!was_current) return;  // the old session of a Move: the new one carries on
  if (options_.reconnect) {
    if (!need_reconnect_) {
      need_reconnect_ = true;
      next_reconnect_ = absl::Now();
      reconnect_backoff_ = options_.reconnect_backoff_min;
    }
    return;
  }
  // No reconnection: everything outstanding fails now.
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot::State st = slots_[i].state;
    if (st == Slot::State::kQueued || st == Slot::State::kReading || st == Slot::State::kRpc) {
      Finish(i, absl::UnavailableError(absl::StrCat("connection lost: ", why.message())));
    }
  }
}

bool Client::Impl::MaybeReconnect(absl::Time now) {
  if (current_ != nullptr) return true;
  if (!need_reconnect_ || now < next_reconnect_) return false;
  absl::StatusOr<std::unique_ptr<Session>> s = OpenSession(endpoint_);
  if (!s.ok() && absl::IsNotFound(s.status()) && client_id_ != 0) {
    // The node does not know our id (it restarted without the session
    // table): start as a new client. Writes in flight may then be applied
    // again; they carry the same values.
    LOG(WARNING) << "kvclient: " << endpoint_ << " does not know client " << client_id_
                 << "; reconnecting as a new client";
    client_id_ = 0;
    s = OpenSession(endpoint_);
  }
  if (!s.ok()) {
    last_connect_error_ = s.status();
    VLOG(1) << "kvclient: reconnect to " << endpoint_ << ": " << s.status();
    next_reconnect_ = absl::Now() + reconnect_backoff_;
    reconnect_backoff_ = std::min(reconnect_backoff_ * 2, options_.reconnect_backoff_max);
    return false;
  }
  current_ = *std::move(s);
  need_reconnect_ = false;
  ++stats_.reconnects;
  LOG(INFO) << "kvclient: client " << client_id_ << " reconnected to " << endpoint_
            << " (generation " << generation_ << ")";
  return true;
}

void Client::Impl::ProgressMove(absl::Time now) {
  Session* s = current_.get();
  if (s == nullptr || !s->moving || s->broken) return;
  bool idle = true;
  for (const Slot& slot : slots_) {
    if (slot.epoch == s->epoch &&
        (slot.reads_outstanding > 0 || slot.sends_outstanding > 0 || slot.awaiting_response)) {
      idle = false;
      break;
    }
  }
  if (!idle && now < s->move_drain_deadline) return;
  if (now < next_reconnect_) return;
  absl::StatusOr<std::unique_ptr<Session>> next = OpenSession(s->move.endpoint);
  if (!next.ok()) {
    LOG(WARNING) << "kvclient: client " << client_id_ << " cannot move to " << s->move.endpoint
                 << ": " << next.status();
    last_connect_error_ = next.status();
    next_reconnect_ = absl::Now() + options_.reconnect_backoff_min;
    if (absl::Now() > s->move_drain_deadline + absl::Seconds(2)) {
      // Give the move up and keep serving where we are; the server cuts us
      // if it must, and then we reconnect.
      LOG(WARNING) << "kvclient: client " << client_id_ << " stays on " << s->endpoint;
      s->moving = false;
    }
    return;
  }
  const proto::Move move = s->move;
  old_ = std::move(current_);
  current_ = *std::move(next);
  endpoint_ = move.endpoint;
  ++stats_.moves;
  // Flush what is left on the old QP (requeued with the same sequences).
  Session* o = old_.get();
  o->broken = true;
  {
    std::vector<rdma::Completion> comps;
    absl::Status st = o->qp->Drain(ToDeadline(absl::Now() + absl::Seconds(1)), &comps);
    if (!st.ok()) LOG(WARNING) << "kvclient: drain of moved session " << o->epoch << ": " << st;
    for (const rdma::Completion& c : comps) OnCompletion(c);
  }
  const uint32_t old_epoch = o->epoch;
  const absl::Time t = absl::Now();
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    if (slot.epoch != old_epoch) continue;
    slot.reads_outstanding = 0;
    slot.sends_outstanding = 0;
    if (slot.state == Slot::State::kRpc || slot.state == Slot::State::kReading) {
      slot.awaiting_response = false;
      Requeue(i, t);
    } else if (slot.state == Slot::State::kDone) {
      MaybeFree(i);
    }
  }
  RunQueue(t);  // retry on the new session before acknowledging
  (void)proto::WriteControl(o->fd.get(), proto::MoveAck{move.new_generation},
                            t + absl::Milliseconds(200));
  proto::Goodbye bye;
  bye.reason = proto::GoodbyeReason::kClientClose;
  bye.message = "moved";
  (void)proto::WriteControl(o->fd.get(), bye, t + absl::Milliseconds(100));
  VLOG(1) << "kvclient: client " << client_id_ << " moved to " << endpoint_ << " generation "
          << generation_;
  side_in_use_[o->side] = false;
  old_.reset();
}

// --- control channel ----------------------------------------------------------------

void Client::Impl::SendControl(Session* s, const proto::ControlMessage& m) {
  if (s->broken) return;
  absl::Status st = proto::WriteControl(s->fd.get(), m, absl::Now() + absl::Milliseconds(200));
  if (!st.ok()) {
    s->broken = true;
    s->broken_why = absl::UnavailableError(absl::StrCat("control send: ", st.message()));
    return;
  }
  s->last_tx = absl::Now();
}

void Client::Impl::PollControl(Session* s, absl::Time now) {
  if (s->broken) return;
  char buf[4096];
  for (;;) {
    ssize_t n = recv(s->fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      s->assembler.Append(std::string_view(buf, static_cast<size_t>(n)));
      if (static_cast<size_t>(n) < sizeof(buf)) break;
      continue;
    }
    if (n == 0) {
      s->broken = true;
      s->broken_why = absl::UnavailableError("the server closed the control connection");
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    s->broken = true;
    s->broken_why = absl::UnavailableError(
        absl::StrCat("control connection: ", strerror(errno), " (errno ", errno, ")"));
    break;
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
  if (now - s->last_tx >= options_.keepalive_interval) {
    SendControl(s, proto::Keepalive{static_cast<uint64_t>(absl::ToUnixNanos(now))});
  }
  if (now - s->last_rx >= options_.keepalive_timeout && !s->broken) {
    s->broken = true;
    s->broken_why = absl::UnavailableError(absl::StrCat(
        "nothing received on the control connection for ", absl::FormatDuration(now - s->last_rx)));
  }
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
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot::State st = slots_[i].state;
    if (st == Slot::State::kQueued || st == Slot::State::kReading || st == Slot::State::kRpc) {
      Finish(i, absl::UnavailableError("client closed"));
    }
  }
  DestroySession(old_, /*say_goodbye=*/true);
  DestroySession(current_, /*say_goodbye=*/true);
  done_.clear();
  absl::Status result;
  if (slot_mr_ != nullptr) {
    result = rdma::SafeDeregister(*slot_mr_, ToDeadline(absl::Now() + absl::Seconds(1)));
    slot_mr_.reset();
  }
  slot_mem_ = rdma::HostMemory();
  for (int side = 0; side < 2; ++side) {
    if (recv_mr_[side] != nullptr) {
      absl::Status st =
          rdma::SafeDeregister(*recv_mr_[side], ToDeadline(absl::Now() + absl::Seconds(1)));
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
  OpRequest op;
  op.kind = OpKind::kGet;
  op.key = key;
  op.deadline = deadline;
  OpResult r = impl_->Execute(op);
  if (!r.status.ok()) return r.status;
  return GetResult{std::string(r.value), r.version};
}

absl::StatusOr<uint64_t> Client::Put(std::string_view key, std::string_view value,
                                     absl::Time deadline) {
  OpRequest op;
  op.kind = OpKind::kPut;
  op.key = key;
  op.value = value;
  op.deadline = deadline;
  OpResult r = impl_->Execute(op);
  if (!r.status.ok()) return r.status;
  return r.version;
}

absl::StatusOr<uint64_t> Client::Delete(std::string_view key, absl::Time deadline) {
  OpRequest op;
  op.kind = OpKind::kDelete;
  op.key = key;
  op.deadline = deadline;
  OpResult r = impl_->Execute(op);
  if (!r.status.ok()) return r.status;
  return r.version;
}

absl::Status Client::Ping(absl::Time deadline) {
  OpRequest op;
  op.kind = OpKind::kPing;
  op.deadline = deadline;
  return impl_->Execute(op).status;
}

OpResult Client::Execute(const OpRequest& op) { return impl_->Execute(op); }
uint32_t Client::available() const { return impl_->available(); }
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
  const absl::Duration left = until - absl::Now();
  if (left <= absl::ZeroDuration()) return;
  const int ms = static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(left + absl::Microseconds(999)), 1000));
  int n;
  do {
    n = poll(fds.data(), fds.size(), ms);
  } while (n < 0 && errno == EINTR);
}

}  // namespace kvnode::client
