// The session state machine of libkvclient: the handshake with a server
// process (non-blocking TCP connect, Hello, Welcome, QP to RTS, ClientQp,
// Ready), Move to a new process, reconnection after a lost session, and the
// retirement of a session (drain, flush, MoveAck + Goodbye, destroy).
//
// Everything here is driven by Poll: a step runs when its fd is ready or its
// completion has been polled, and each step has a deadline. Nothing waits,
// so the other Clients of the thread keep being polled (a blocking
// re-handshake starved their keep-alives). Only Connect() (Init) and Close()
// block, by their contract.
#include <glog/logging.h>
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <variant>

#include "absl/strings/str_cat.h"
#include "client_impl.h"
#include "kvnode/rdma/errors.h"

namespace kvnode::client {
namespace {

// Bound on the flush of a QP moved to ERR (local work only).
constexpr absl::Duration kFlushTimeout = absl::Seconds(1);

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

std::string TypeName(const proto::ControlMessage& m) {
  return proto::MessageTypeName(static_cast<uint16_t>(proto::TypeOf(m)));
}

}  // namespace

rdma::Deadline ToRdmaDeadline(absl::Time t) {
  const absl::Duration left = t - absl::Now();
  if (left <= absl::ZeroDuration()) return rdma::Clock::now();
  return rdma::Clock::now() + absl::ToChronoNanoseconds(std::min(left, absl::Hours(1)));
}

const char* SessionStateName(SessionState s) {
  switch (s) {
    case SessionState::kConnecting:
      return "connecting";
    case SessionState::kAwaitWelcome:
      return "awaiting Welcome";
    case SessionState::kAwaitReady:
      return "awaiting Ready";
    case SessionState::kUp:
      return "up";
    case SessionState::kDraining:
      return "draining";
    case SessionState::kFlushing:
      return "flushing";
  }
  return "?";
}

// --- driver (from Poll) --------------------------------------------------------------

void Client::Impl::ProgressSessions(absl::Time now) {
  if (current_ != nullptr && current_->broken) OnSessionLost(now);
  if (pending_ != nullptr) StepHandshake(now);
  if (pending_ != nullptr && pending_->state == SessionState::kUp) InstallPending(now);
  if (pending_ == nullptr && SideFree() && now >= next_reconnect_) {
    if (current_ != nullptr && current_->moving) {
      StartHandshake(current_->move.endpoint, /*for_move=*/true, now);
    } else if (current_ == nullptr && need_reconnect_ && outstanding() > 0) {
      StartHandshake(endpoint_, /*for_move=*/false, now);
    }
  }
  if (!retiring_.empty()) StepRetiring(now);
}

// --- handshake: one function per step -------------------------------------------------

void Client::Impl::StartHandshake(const std::string& endpoint, bool for_move, absl::Time now) {
  auto s = std::make_unique<Session>();
  s->epoch = next_epoch_++;
  s->endpoint = endpoint;
  s->for_move = for_move;
  if (for_move) {
    s->move = current_->move;
    s->move_from = current_->welcome;
  }
  s->first = stats_.sessions == 0;  // Connect()'s attempt
  s->side = side_in_use_[0] ? 1 : 0;
  side_in_use_[s->side] = true;
  s->state = SessionState::kConnecting;
  s->step_deadline = now + options_.connect_timeout;
  absl::StatusOr<Fd> fd = TcpConnectStart(endpoint);
  pending_ = std::move(s);
  if (!fd.ok()) {
    HandshakeFailed(fd.status(), now);
    return;
  }
  pending_->fd = *std::move(fd);
  StepHandshake(now);  // a connect to localhost may be done already
}

absl::Duration Client::Impl::AnswerWait(const Session* s) const {
  // Connect() notices a dead or hung server within connect_timeout. A
  // reconnection or Move has its ops' deadlines as the real bound: once the
  // server holds our Hello, a fresh connection would only queue behind the
  // abandoned one (a node still starting accepts them all, in order), and a
  // server that dies closes the connection, which fails the step at once.
  return s->first ? options_.connect_timeout
                  : std::max(options_.connect_timeout, options_.op_timeout);
}

void Client::Impl::StepHandshake(absl::Time now) {
  Session* s = pending_.get();
  absl::Status st;
  switch (s->state) {
    case SessionState::kConnecting:
      st = StepConnect(s, now);
      break;
    case SessionState::kAwaitWelcome:
    case SessionState::kAwaitReady:
      st = StepReceive(s, now);
      break;
    default:
      return;
  }
  if (!st.ok()) HandshakeFailed(std::move(st), now);
}

absl::Status Client::Impl::StepConnect(Session* s, absl::Time now) {
  absl::StatusOr<bool> done = TcpConnectDone(s->fd.get(), s->endpoint);
  if (!done.ok()) return absl::UnavailableError(done.status().message());
  if (*done) return SendHello(s, now);
  if (now >= s->step_deadline) {
    return absl::UnavailableError(absl::StrCat("connect to ", s->endpoint, ": no answer within ",
                                               absl::FormatDuration(options_.connect_timeout)));
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::SendHello(Session* s, absl::Time now) {
  proto::Hello hello;
  hello.client_id = client_id_;
  hello.resume_secret = resume_secret_;
  hello.auth_token = options_.auth_token;
  hello.client_name = options_.client_name;
  hello.features = hello_features_;
  if (absl::Status st = SendFrame(s->fd.get(), hello); !st.ok()) {
    return absl::UnavailableError(absl::StrCat("send Hello to ", s->endpoint, ": ", st.message()));
  }
  s->state = SessionState::kAwaitWelcome;
  s->step_deadline = now + AnswerWait(s);
  return absl::OkStatus();
}

absl::Status Client::Impl::StepReceive(Session* s, absl::Time now) {
  const bool welcome_step = s->state == SessionState::kAwaitWelcome;
  const char* waiting_for = welcome_step ? "Welcome" : "Ready";
  // Bytes that arrived before a close still count (an Error, then close).
  const absl::Status received = ReceiveAvailable(s->fd.get(), &s->assembler);
  absl::StatusOr<std::optional<proto::ControlMessage>> m = s->assembler.Next();
  if (!m.ok()) {
    return absl::UnavailableError(absl::StrCat("bad frame from ", s->endpoint, " waiting for ",
                                               waiting_for, ": ", m.status().message()));
  }
  if (!m->has_value()) {
    if (!received.ok()) {
      return absl::UnavailableError(absl::StrCat("waiting for ", waiting_for, " from ", s->endpoint,
                                                 ": ", received.message()));
    }
    if (now >= s->step_deadline) {
      return absl::UnavailableError(absl::StrCat("waiting for ", waiting_for, " from ", s->endpoint,
                                                 ": nothing within ",
                                                 absl::FormatDuration(AnswerWait(s))));
    }
    return absl::OkStatus();
  }
  const proto::ControlMessage& msg = **m;
  if (const auto* e = std::get_if<proto::Error>(&msg)) {
    return ServerErrorStatus(*e, welcome_step ? "Hello" : "ClientQp");
  }
  if (welcome_step) {
    if (const auto* w = std::get_if<proto::Welcome>(&msg)) return OnWelcome(s, *w);
  } else if (std::holds_alternative<proto::Ready>(msg)) {
    OnReady(s, now);
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat(
      s->endpoint, " answered ", welcome_step ? "Hello" : "ClientQp", " with ", TypeName(msg)));
}

absl::Status Client::Impl::OnWelcome(Session* s, const proto::Welcome& w) {
  const std::string& endpoint = s->endpoint;
  if (w.client_id == 0 || w.max_rpc_credits == 0) {
    return absl::UnavailableError(absl::StrCat("bad Welcome from ", endpoint, ": client_id=",
                                               w.client_id, " credits=", w.max_rpc_credits));
  }
  if (s->for_move) {
    if (absl::Status st = CheckMoveTarget(s->move_from, s->move, w); !st.ok()) {
      s->refused_move = true;
      return absl::FailedPreconditionError(
          absl::StrCat(endpoint, " is not where the Move said: ", st.message()));
    }
  }
  s->welcome = w;
  if (!w.index_geometry.empty() && !options_.rpc_get_only) {
    absl::StatusOr<storage::Geometry> g = storage::Geometry::Decode(w.index_geometry);
    if (!g.ok()) {
      LOG(WARNING) << "kvclient: index geometry from " << endpoint
                   << " unusable, GETs go by RPC: " << g.status();
    } else if (g->arena_size > w.arena_size) {
      LOG(WARNING) << "kvclient: geometry arena_size " << g->arena_size << " > Welcome arena_size "
                   << w.arena_size << ", GETs go by RPC";
    } else {
      s->geometry = *g;
    }
  }
  if ((w.features & hello_features_ & proto::kFeatureSlotWords) != 0) {
    // The node's slot-words table (docs/format.md "Slot words"): every READ
    // of a GET is followed by one of its word. A table outside the arena is
    // a node that cannot be read safely: refused as a bad Welcome.
    if (w.slot_words_size < proto::kMaxSlots || w.slot_words_offset > w.arena_size ||
        w.slot_words_size > w.arena_size - w.slot_words_offset) {
      return absl::UnavailableError(absl::StrCat("bad Welcome from ", endpoint, ": slot words at ",
                                                 w.slot_words_offset, ", ", w.slot_words_size,
                                                 " bytes, arena of ", w.arena_size));
    }
    s->slot_words_offset = w.slot_words_offset;
    s->check_below_epoch = w.check_below_epoch;
  }

  // QP with its receive buffers posted before the server can send. Local
  // verbs calls: they do not wait for the server.
  s->recv_buffers = std::min(slot_count(), w.max_rpc_credits);
  s->credits = s->recv_buffers;
  rdma::QpOptions qopt;
  // One WR per slot in flight (a GET's READ or an RPC's SEND), doubled as
  // headroom: a full queue only defers a post (FlushReads requeues).
  // With slot words a GET's READ is two WRs (its data, then the word).
  qopt.max_send_wr = (s->slot_words_offset != 0 ? 3 : 2) * slot_count();
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
  if (absl::Status st = s->qp->ToRtr(ToPeerInfo(w.server_qp, device_->is_roce())); !st.ok()) {
    return st;
  }
  if (absl::Status st = s->qp->ToRts(); !st.ok()) return st;
  if (absl::Status st = SendFrame(s->fd.get(), proto::ClientQp{ToQpInfo(s->qp->LocalInfo())});
      !st.ok()) {
    return absl::UnavailableError(absl::StrCat("send ClientQp to ", endpoint, ": ", st.message()));
  }
  s->state = SessionState::kAwaitReady;
  // Local setup is not the server's time.
  s->step_deadline = absl::Now() + AnswerWait(s);
  return absl::OkStatus();
}

void Client::Impl::OnReady(Session* s, absl::Time now) {
  if (client_id_ != 0 && client_id_ != s->welcome.client_id) {
    LOG(WARNING) << "kvclient: resumed as client " << client_id_ << " but " << s->endpoint
                 << " assigned " << s->welcome.client_id;
  }
  client_id_ = s->welcome.client_id;
  resume_secret_ = s->welcome.resume_secret;
  generation_ = s->welcome.server_generation;
  s->state = SessionState::kUp;
  s->last_rx = s->last_tx = now;
  ++stats_.sessions;
  VLOG(1) << "kvclient: session " << s->epoch << " to " << s->endpoint << " as client "
          << client_id_ << " generation " << generation_ << " qpn " << s->qp->qp_num() << " -> "
          << s->welcome.server_qp.qpn << (s->geometry ? "" : " (no READ fast path)");
}

void Client::Impl::HandshakeFailed(absl::Status why, absl::Time now) {
  std::unique_ptr<Session> s = std::move(pending_);
  const bool for_move = s->for_move;
  const bool refused_move = s->refused_move;
  last_connect_error_ = why;
  Retire(std::move(s), now);  // flushes the receives of a QP that never got Ready
  if (refused_move) {
    // Another node answered at the Move's endpoint: trying again would find
    // it again. Stay on the old session; when the old process cuts it, the
    // client reconnects to its old endpoint (endpoint_, unchanged), where the
    // next generation listens on the inherited socket.
    ++stats_.moves_refused;
    LOG(WARNING) << "kvclient: client " << client_id_ << " refused a Move: " << why.message()
                 << "; keeping " << endpoint_;
    if (current_ != nullptr) current_->moving = false;
    next_reconnect_ = now;
    return;
  }
  if (for_move && current_ != nullptr && current_->moving) {
    LOG(WARNING) << "kvclient: client " << client_id_ << " cannot move to "
                 << current_->move.endpoint << ": " << why;
    next_reconnect_ = now + options_.reconnect_backoff_min;
    if (now > current_->move_drain_deadline + absl::Seconds(2)) {
      // Give the move up and keep serving where we are; the server cuts us
      // if it must, and then we reconnect.
      LOG(WARNING) << "kvclient: client " << client_id_ << " stays on " << current_->endpoint;
      current_->moving = false;
    }
    return;
  }
  if (absl::IsNotFound(why) && client_id_ != 0) {
    // The node does not know our id (it restarted without the session
    // table): start as a new client. Writes in flight may then be applied
    // again; they carry the same values.
    LOG(WARNING) << "kvclient: " << endpoint_ << " does not know client " << client_id_
                 << "; reconnecting as a new client";
    client_id_ = 0;
    resume_secret_ = {};
    next_reconnect_ = now;
    return;
  }
  VLOG(1) << "kvclient: reconnect to " << endpoint_ << ": " << why;
  next_reconnect_ = now + reconnect_backoff_;
  reconnect_backoff_ = std::min(reconnect_backoff_ * 2, options_.reconnect_backoff_max);
}

void Client::Impl::InstallPending(absl::Time now) {
  const bool for_move = pending_->for_move;
  if (current_ != nullptr) {
    // The session the Move leaves: its outstanding work finishes (or is
    // flushed) and is retried here, then MoveAck and Goodbye.
    current_->moved = current_->moving;
    Retire(std::move(current_), now);
  }
  current_ = std::move(pending_);
  endpoint_ = current_->endpoint;
  need_reconnect_ = false;
  reconnect_backoff_ = options_.reconnect_backoff_min;
  if (for_move) {
    ++stats_.moves;
    LOG(INFO) << "kvclient: client " << client_id_ << " moved to " << endpoint_ << " (generation "
              << generation_ << ")";
  } else if (current_->first) {
    // InitAsync's first session: a connection, not a reconnection.
    VLOG(1) << "kvclient: client " << client_id_ << " connected to " << endpoint_;
  } else {
    ++stats_.reconnects;
    LOG(INFO) << "kvclient: client " << client_id_ << " reconnected to " << endpoint_
              << " (generation " << generation_ << ")";
  }
  RunQueue(now);  // what waited for a session goes now
}

// --- Move target check ------------------------------------------------------------------

absl::Status CheckMoveTarget(const proto::Welcome& from, const proto::Move& move,
                             const proto::Welcome& to) {
  absl::StatusOr<storage::Geometry> was = storage::Geometry::Decode(from.index_geometry);
  absl::StatusOr<storage::Geometry> now = storage::Geometry::Decode(to.index_geometry);
  if (!was.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the old node's arena id is unknown (", was.status().message(), ")"));
  }
  if (!now.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("its arena id is unknown (", now.status().message(), ")"));
  }
  if (now->arena_id != was->arena_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "another node: arena ", absl::Hex(now->arena_id), " (generation ", to.server_generation,
        "), expected arena ", absl::Hex(was->arena_id), " generation ", move.new_generation));
  }
  if (to.server_generation < move.new_generation) {
    return absl::FailedPreconditionError(absl::StrCat("generation ", to.server_generation,
                                                      " of arena ", absl::Hex(now->arena_id),
                                                      ", expected at least ", move.new_generation));
  }
  return absl::OkStatus();
}

// --- retirement ------------------------------------------------------------------------

void Client::Impl::Retire(std::unique_ptr<Session> s, absl::Time now) {
  s->broken = true;  // nothing new is posted here, receives are not reposted
  if (s->qp == nullptr) {
    FinishRetire(std::move(s), now);
    return;
  }
  if (s->moved) {
    s->state = SessionState::kDraining;
    s->step_deadline = std::max(now, s->move_drain_deadline);
  } else {
    s->state = SessionState::kFlushing;
    s->step_deadline = now + kFlushTimeout;
  }
  retiring_.push_back(std::move(s));
}

bool Client::Impl::HasOutstandingWork(const Session* s) const {
  for (const Slot& slot : slots_) {
    if (slot.epoch == s->epoch &&
        (slot.reads_outstanding > 0 || slot.sends_outstanding > 0 || slot.awaiting_response)) {
      return true;
    }
  }
  return false;
}

void Client::Impl::StepRetiring(absl::Time now) {
  for (size_t i = 0; i < retiring_.size();) {
    Session* s = retiring_[i].get();
    if (s->state == SessionState::kDraining &&
        (!HasOutstandingWork(s) || now >= s->step_deadline)) {
      s->state = SessionState::kFlushing;  // QP to ERR: the rest is flushed and retried
      s->step_deadline = now + kFlushTimeout;
    }
    if (s->state == SessionState::kFlushing) {
      // Drain with a deadline of now is one non-blocking step: ERR (once),
      // the marker, and whatever completions of this QP are there.
      std::vector<rdma::Completion> comps;
      absl::Status st = s->qp->Drain(rdma::Clock::now(), &comps);
      for (const rdma::Completion& c : comps) OnCompletion(c, now);
      const bool timed_out = now >= s->step_deadline;
      if (st.ok() || timed_out ||
          rdma::GetRdmaErrorKind(st) != rdma::RdmaErrorKind::kDrainTimeout) {
        if (!st.ok()) LOG(WARNING) << "kvclient: flush of session " << s->epoch << ": " << st;
        std::unique_ptr<Session> done = std::move(retiring_[i]);
        retiring_.erase(retiring_.begin() + static_cast<ptrdiff_t>(i));
        FinishRetire(std::move(done), now);
        continue;
      }
    }
    ++i;
  }
}

void Client::Impl::FinishRetire(std::unique_ptr<Session> s, absl::Time now) {
  ReleaseSlots(s.get(), now);
  if (s->moved) {
    RunQueue(now);  // retry on the new session before acknowledging
    FlushPosts(now);
    (void)SendFrame(s->fd.get(), proto::MoveAck{s->move.new_generation});
    proto::Goodbye bye;
    bye.reason = proto::GoodbyeReason::kClientClose;
    bye.message = "moved";
    (void)SendFrame(s->fd.get(), bye);
    VLOG(1) << "kvclient: client " << client_id_ << " left session " << s->epoch << " ("
            << s->endpoint << ")";
  }
  side_in_use_[s->side] = false;
  s.reset();  // QP (drained), socket
}

void Client::Impl::ReleaseSlots(const Session* s, absl::Time now) {
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    if (slot.epoch != s->epoch) continue;
    // The QP is drained (or destroyed next): the device no longer touches
    // our buffers.
    slot.reads_outstanding = 0;
    slot.sends_outstanding = 0;
    if (slot.state == Slot::State::kRpc || slot.state == Slot::State::kReading) {
      slot.awaiting_response = false;
      Requeue(i, now);  // same sequence on the next session
    } else if (slot.state == Slot::State::kDone) {
      MaybeFree(i);
    }
  }
}

void Client::Impl::OnSessionLost(absl::Time now) {
  std::unique_ptr<Session> s = std::move(current_);
  const absl::Status why = s->broken_why;
  LOG(WARNING) << "kvclient: client " << client_id_ << " lost session " << s->epoch << " to "
               << s->endpoint << ": " << why;
  last_connect_error_ = why;
  // Lost in the middle of a Move: endpoint_ stays. The Move's endpoint is
  // taken only by a Move handshake that found the same node there
  // (CheckMoveTarget); a reconnection is not checked, so it must not go to
  // an address only the Move named.
  Retire(std::move(s), now);
  if (options_.reconnect && !need_reconnect_) {
    need_reconnect_ = true;  // unless a Move's handshake, still running, succeeds first
    next_reconnect_ = now;
    reconnect_backoff_ = options_.reconnect_backoff_min;
  }
  if (options_.reconnect || pending_ != nullptr) return;
  // No reconnection: everything outstanding fails now.
  const absl::Status lost =
      absl::UnavailableError(absl::StrCat("connection lost: ", why.message()));
  FailOutstanding([&](const Slot&) { return lost; });
}

// --- blocking teardown (Close) -------------------------------------------------------------

void Client::Impl::DestroySession(std::unique_ptr<Session>& holder, bool say_goodbye) {
  Session* s = holder.get();
  if (s == nullptr) return;
  s->broken = true;  // nothing new is posted here
  if (s->qp != nullptr) {
    std::vector<rdma::Completion> comps;
    absl::Status st = s->qp->Drain(ToRdmaDeadline(absl::Now() + absl::Seconds(1)), &comps);
    if (!st.ok()) LOG(WARNING) << "kvclient: drain of session " << s->epoch << ": " << st;
    // Successful completions are real results (a response that arrived just
    // before); flushed ones release their slots.
    for (const rdma::Completion& c : comps) OnCompletion(c, absl::Now());
  }
  const absl::Time now = absl::Now();
  ReleaseSlots(s, now);
  if (say_goodbye && s->state == SessionState::kUp && s->fd.get() >= 0) {
    // Close is final: this Client never resumes its id, so the node need not
    // keep the id's dedupe record for a retry (nor hand it to every later
    // process of a live upgrade).
    proto::Goodbye bye;
    bye.reason = proto::GoodbyeReason::kClientDone;
    bye.message = "client closes";
    (void)SendFrame(s->fd.get(), bye);
  }
  side_in_use_[s->side] = false;
  holder.reset();  // QP (its receive side is free again), socket
}

}  // namespace kvnode::client
