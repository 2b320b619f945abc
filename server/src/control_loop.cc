// The control thread: the epoll loop, control connections (accept, read,
// session events, flush, close) and the timers.
#include "server_impl.h"

namespace kvnode::server {

absl::Status ServerImpl::Run() {
  data_->Start();
  if (accepting_) StartMetricsHttp();
  std::array<epoll_event, 64> evs;
  while (!shutdown_requested_.load(std::memory_order_acquire)) {
    const int n = epoll_wait(epoll_fd_.get(), evs.data(), static_cast<int>(evs.size()), 100);
    if (n < 0 && errno != EINTR) {
      LOG(ERROR) << "epoll_wait: " << base::ErrnoText(errno);
      break;
    }
    for (int i = 0; i < std::max(n, 0); ++i) {
      const uint64_t tag = evs[i].data.u64;
      const uint32_t e = evs[i].events;
      if (tag == kTagListen) {
        Accept();
      } else if (tag == kTagAdminListen) {
        AcceptAdmin();
      } else if (tag == kTagSignal) {
        OnSignal();
      } else if (tag == kTagTasks) {
        control_tasks_->RunAll();
      } else if (tag == kTagDeviceEvents) {
        // Logged for the record; a client QP in error is reaped from its
        // completions by the data plane, not from here.
        while (std::optional<rdma::Device::AsyncEvent> ae = device_->PollAsyncEvent()) {
          if (ae->type == IBV_EVENT_COMM_EST) continue;
          LOG(WARNING) << "device " << device_->name() << ": async event "
                       << ibv_event_type_str(ae->type)
                       << (ae->qp_num != 0 ? absl::StrCat(" on QP ", ae->qp_num) : "");
        }
      } else if ((tag & kAdminBit) != 0) {
        auto it = admins_.find(tag);
        if (it == admins_.end()) continue;
        AdminConn& a = *it->second;
        if ((e & EPOLLOUT) != 0) FlushAdmin(a);
        if (admins_.contains(tag) && (e & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) OnAdminReadable(a);
      } else {
        Conn* c = FindConn(tag);
        if (c == nullptr) continue;
        if ((e & EPOLLOUT) != 0) FlushConn(*c);
        if ((c = FindConn(tag)) == nullptr) continue;
        if ((e & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) OnConnReadable(*c);
      }
    }
    Timers();
  }
  Shutdown();
  absl::Status leaks = rdma::Accounting::CheckNoLeaks();
  if (leaks.ok()) {
    LOG(INFO) << "clean shutdown: no verbs object left (" << rdma::Accounting::Snapshot().ToString()
              << ")";
  } else {
    LOG(ERROR) << "shutdown left verbs objects behind: " << leaks;
  }
  return leaks;
}

void ServerImpl::OnSignal() {
  signalfd_siginfo si{};
  while (read(signal_fd_.get(), &si, sizeof(si)) == sizeof(si)) {
    switch (si.ssi_signo) {
      case SIGTERM:
      case SIGINT:
        if (shutdown_hook_ && shutdown_hook_()) {
          LOG(INFO) << "signal " << strsignal(static_cast<int>(si.ssi_signo)) << " from pid "
                    << si.ssi_pid << ": shutting down once the live upgrade has finished or "
                    << "rolled back";
          break;
        }
        LOG(INFO) << "signal " << strsignal(static_cast<int>(si.ssi_signo)) << " from pid "
                  << si.ssi_pid << ": shutting down";
        shutdown_requested_.store(true);
        break;
      case SIGUSR2:
        if (draining_.load()) {
          LOG(WARNING) << "SIGUSR2 from pid " << si.ssi_pid
                       << ": live upgrade refused: the node is draining";
        } else if (upgrade_handler_) {
          LOG(INFO) << "SIGUSR2 from pid " << si.ssi_pid << ": live upgrade requested";
          upgrade_handler_(Server::UpgradeRequest{},
                           [](std::string answer) { LOG(INFO) << "upgrade: " << answer; });
        } else {
          LOG(WARNING) << "SIGUSR2: live upgrade is not implemented in this build; ignored";
        }
        break;
      default:
        LOG(INFO) << "signal " << strsignal(static_cast<int>(si.ssi_signo)) << " ignored";
    }
  }
}

void ServerImpl::Accept() {
  for (;;) {
    const int fd = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        LOG_EVERY_N(WARNING, 100) << "accept: " << base::ErrnoText(errno);
      }
      return;
    }
    metrics_.Add(Counter::kConnectionsAccepted);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // Bound the connections that have not been admitted yet, so that a flood
    // of idle sockets cannot exhaust fds.
    if (conns_.size() >= size_t{opt_.max_clients} + 64) {
      std::string frame;
      if (proto::EncodeControl(
              proto::Error{proto::ErrorCode::kTooManyClients, "too many connections"}, &frame)
              .ok()) {
        (void)send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      metrics_.Error(ErrorKind::kTooManyClients);
      close(fd);
      continue;
    }
    auto c = std::make_unique<Conn>(ControlConfig{auth_token_},
                                    Liveness(opt_.keepalive_interval, opt_.keepalive_misses));
    c->id = next_conn_id_++;
    c->fd.Reset(fd);
    c->peer = PeerName(fd);
    c->accepted = absl::Now();
    c->liveness.Accepted(c->accepted);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      LOG(WARNING) << "epoll_ctl ADD conn: " << base::ErrnoText(errno);
      close(fd);
      continue;
    }
    VLOG(1) << "connection " << c->id << " from " << c->peer;
    conns_.emplace(c->id, std::move(c));
  }
}

void ServerImpl::OnConnReadable(Conn& c) {
  uint8_t buf[16384];
  std::vector<ControlSession::Event> events;
  bool eof = false;
  for (int rounds = 0; rounds < 8; ++rounds) {
    const ssize_t n = recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      c.liveness.Heard(absl::Now());
      c.session.OnBytes(std::span<const uint8_t>(buf, static_cast<size_t>(n)), &events);
      if (c.session.closed()) break;
      continue;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) eof = true;
    break;
  }
  const uint64_t id = c.id;
  OnConnEvents(c, events);
  Conn* still = FindConn(id);
  if (still == nullptr) return;
  if (eof && !still->session.closed()) {
    // Gone without Goodbye: the client vanished (crash, kill, mid-request).
    LOG(INFO) << "client " << still->client_id << " (" << still->peer
              << ") closed its control connection in state "
              << SessionStateName(still->session.state()) << " without Goodbye";
    metrics_.Error(ErrorKind::kPeerVanished);
    CloseConn(*still, true);
    return;
  }
  FlushConn(*still);
}

void ServerImpl::OnConnEvents(Conn& c, std::vector<ControlSession::Event>& events) {
  const uint64_t id = c.id;
  for (ControlSession::Event& ev : events) {
    if (auto* h = std::get_if<ControlSession::HelloEvent>(&ev)) {
      OnHello(c, h->hello);
    } else if (auto* q = std::get_if<ControlSession::ClientQpEvent>(&ev)) {
      OnClientQp(c, q->qp);
    } else if (std::holds_alternative<ControlSession::MoveAckEvent>(ev)) {
      OnMoveAck(c);
    } else if (std::holds_alternative<ControlSession::MapRequestEvent>(ev)) {
      SendShardMap(c);
    } else if (auto* g = std::get_if<ControlSession::GuardAckEvent>(&ev)) {
      OnGuardAck(c, g->nonce);
    } else if (auto* cl = std::get_if<ControlSession::ClosedEvent>(&ev)) {
      OnClosed(c, *cl);
    }
  }
  if (Conn* still = FindConn(id); still != nullptr && still->session.closed()) {
    CloseConn(*still, false);
  }
}

void ServerImpl::OnHello(Conn& c, const proto::Hello& hello) {
  if (!accepting_ || shutdown_requested_.load() || draining_.load()) {
    c.session.Goodbye(proto::GoodbyeReason::kShutdown,
                      draining_.load() ? "node is draining: not accepting new sessions"
                                       : "node is not accepting sessions");
    return;
  }
  // Admission happens on the data thread (CreateSession): it frees a client
  // slot when it tears a session down, and it runs tasks in the order they
  // were posted, so a slot freed by a connection that closed before this
  // Hello is always seen as free. The answer comes back to OnSessionCreated.
  ++pending_creates_;
  c.data_session = true;
  c.hello_at = absl::Now();
  VLOG(1) << "Hello from " << c.peer << " (" << hello.client_name << "), client id "
          << hello.client_id;
  const bool shard_map = (SessionFeatures(hello.features) & proto::kFeatureShardMap) != 0;
  data_->Post([this, id = c.id, requested = hello.client_id, secret = hello.resume_secret,
               peer = c.peer, shard_map] {
    absl::StatusOr<SessionSetup> setup =
        data_->CreateSession(id, requested, secret, peer, shard_map);
    control_tasks_->Post(
        [this, id, setup = std::move(setup)]() mutable { OnSessionCreated(id, std::move(setup)); });
  });
}

void ServerImpl::OnSessionCreated(uint64_t id, absl::StatusOr<SessionSetup> setup) {
  --pending_creates_;
  Conn* c = FindConn(id);
  if (c == nullptr) {  // the connection went away meanwhile
    if (setup.ok()) data_->Post([this, id] { data_->CloseSession(id, "connection gone"); });
    return;
  }
  if (setup.ok() && setup->replaced_conn.has_value()) CloseReplaced(*setup->replaced_conn, *c);
  if (!setup.ok()) {
    c->data_session = false;
    if (setup.status().code() == absl::StatusCode::kResourceExhausted) {
      metrics_.Error(ErrorKind::kTooManyClients);
      c->session.Fail(proto::ErrorCode::kTooManyClients, std::string(setup.status().message()));
    } else {
      metrics_.Error(ErrorKind::kSessionSetup);
      c->session.Fail(proto::ErrorCode::kInternal,
                      absl::StrCat("session setup failed: ", setup.status().message()));
    }
    LOG(WARNING) << "session setup for " << c->peer << " failed: " << setup.status();
    CloseConn(*c, false);
    return;
  }
  if (setup->resume_refused) {
    // Not proof of an attack (the id may have aged out), but never another
    // client's state: the Hello starts afresh.
    metrics_.Error(ErrorKind::kResumeRefused);
    LOG(WARNING) << "Hello from " << c->peer << " asked to resume a client id it did not "
                 << "prove it owns (unknown id or wrong resume secret): new client "
                 << setup->client_id;
  }
  c->client_id = setup->client_id;
  c->welcome_at = absl::Now();
  if (absl::Status s = c->session.SendWelcome(MakeWelcome(*setup, c->session.hello_features()));
      !s.ok()) {
    LOG(ERROR) << "Welcome for " << c->peer << ": " << s;
    metrics_.Error(ErrorKind::kSessionSetup);
    CloseConn(*c, false);
    return;
  }
  FlushConn(*c);
}

void ServerImpl::CloseReplaced(uint64_t old_id, const Conn& by) {
  Conn* old = FindConn(old_id);
  if (old == nullptr) return;
  old->data_session = false;  // the data plane already moved the session to `by`
  old->session.Goodbye(proto::GoodbyeReason::kReplaced,
                       "a newer session of this client id took over");
  LOG(INFO) << "client " << old->client_id << " (" << old->peer
            << ") replaced by a new session from " << by.peer;
  CloseConn(*old, false);
}

uint64_t ServerImpl::SessionFeatures(uint64_t hello_features) const {
  // kFeatureSlotWords only with kFeatureShardMap (MakeWelcome drops it when
  // the data plane has no table to offer).
  if (opt_.shard_gate == nullptr || (hello_features & proto::kFeatureShardMap) == 0) return 0;
  return hello_features & (proto::kFeatureShardMap | proto::kFeatureSlotWords);
}

proto::Welcome ServerImpl::MakeWelcome(const SessionSetup& setup, uint64_t hello_features) const {
  proto::Welcome w;
  w.client_id = setup.client_id;
  w.resume_secret = setup.secret;
  w.server_generation = opt_.generation;
  w.features = SessionFeatures(hello_features);
  w.server_qp = setup.qp;
  w.server_qp.port = static_cast<uint8_t>(device_->port());
  w.rkey = setup.rkey;
  w.arena_remote_addr = arena_mr_->iova();
  w.arena_size = store_->arena_size();
  w.max_rpc_credits = opt_.rpc_credits;
  w.max_rpc_message_size = static_cast<uint32_t>(proto::kMaxRpcMessageSize);
  w.max_key_size = static_cast<uint32_t>(storage::kMaxKeySize);
  w.max_value_size = static_cast<uint32_t>(storage::kMaxValueSize);
  w.index_geometry = store_->geometry().Encode();
  if ((w.features & proto::kFeatureSlotWords) != 0) {
    if (setup.slot_words_offset == 0) {
      w.features &= ~proto::kFeatureSlotWords;
    } else {
      w.slot_words_offset = setup.slot_words_offset;
      w.slot_words_size = proto::kMaxSlots;
      w.check_below_epoch = CheckBelowEpoch();
    }
  }
  // While the guard is up a session that cannot check the words gets no
  // index geometry: it GETs by RPC, which the node answers for the slots it
  // serves only.
  if (guard_.up && (w.features & proto::kFeatureSlotWords) == 0) w.index_geometry.clear();
  return w;
}

void ServerImpl::OnClientQp(Conn& c, const proto::QpInfo& qp) {
  // The QP is connected on the data thread; the answer comes back to
  // OnQpConnected.
  c.client_qp_at = absl::Now();
  data_->Post([this, id = c.id, qp] {
    absl::Status st = data_->ConnectSession(id, qp);
    control_tasks_->Post([this, id, st, at = absl::Now()] { OnQpConnected(id, st, at); });
  });
}

void ServerImpl::OnQpConnected(uint64_t id, const absl::Status& st, absl::Time connected_at) {
  Conn* c = FindConn(id);
  if (c == nullptr) return;
  if (!st.ok()) {
    LOG(WARNING) << "client " << c->client_id << " (" << c->peer
                 << "): connecting its QP failed: " << st;
    metrics_.Error(ErrorKind::kSessionSetup);
    c->session.Fail(proto::ErrorCode::kInternal,
                    absl::StrCat("connecting the QP failed: ", st.message()));
    CloseConn(*c, false);
    return;
  }
  if (absl::Status s = c->session.SendReady(); !s.ok()) {
    CloseConn(*c, false);
    return;
  }
  c->ready = true;
  c->liveness.Ready(absl::Now());
  metrics_.Add(Counter::kSessionsAccepted);
  // Each step's time since accept: a slow Welcome is this node's session
  // set-up, a slow ClientQp the client's QP set-up, a slow Ready the QP's
  // connection here.
  auto since = [&](absl::Time t) {
    return absl::FormatDuration(absl::Trunc(t - c->accepted, absl::Microseconds(100)));
  };
  LOG(INFO) << "session ready: client " << c->client_id << " (" << c->peer << ", "
            << c->session.client_name() << ") " << since(absl::Now()) << " after accept (Hello "
            << since(c->hello_at) << ", Welcome " << since(c->welcome_at) << ", ClientQp "
            << since(c->client_qp_at) << ", QP connected " << since(connected_at) << ")";
  SendShardMap(*c);
  FlushConn(*c);
}

void ServerImpl::SendShardMap(Conn& c) {
  if (opt_.shard_gate == nullptr || !c.ready || !c.session.shard_map_feature()) return;
  const std::shared_ptr<const ShardView> view = opt_.shard_gate->Current();
  if (view == nullptr) return;  // the first Publish sends it
  if (absl::Status s = c.session.SendShardMap(view->map); !s.ok()) {
    LOG_EVERY_N(ERROR, 100) << "shard map (epoch " << view->map.epoch << ") for client "
                            << c.client_id << ": " << s;
  }
}

void ServerImpl::OnShardMapPublished() {
  // Publishes in a burst post one task each; the first pushes the newest.
  const uint64_t version = opt_.shard_gate->version();
  if (version == pushed_map_version_) return;
  // The slot words follow the map now, not at the data plane's next RPC.
  if (data_ != nullptr) data_->Post([this] { data_->AdoptShardView(); });
  pushed_map_version_ = version;
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : conns_) {
    if (c->ready && c->session.shard_map_feature()) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    Conn* c = FindConn(id);
    if (c == nullptr) continue;
    SendShardMap(*c);
    FlushConn(*c);  // may close it
  }
}

void ServerImpl::OnMoveAck(Conn& c) {
  if (!c.move_pending) return;
  c.move_pending = false;
  if (on_move_ack_) on_move_ack_(c.client_id);
}

void ServerImpl::OnClosed(Conn& c, const ControlSession::ClosedEvent& closed) {
  c.client_done = closed.client_done;
  if (closed.error.has_value()) {
    metrics_.Error(*closed.error);
    LOG(WARNING) << "client " << c.client_id << " (" << c.peer
                 << "): " << ErrorKindName(*closed.error) << ": " << closed.why;
  } else {
    VLOG(1) << "client " << c.client_id << " (" << c.peer << "): " << closed.why;
  }
}

void ServerImpl::FlushConn(Conn& c) {
  std::string& out = c.session.out();
  while (!out.empty()) {
    const ssize_t n = send(c.fd.get(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // The peer is gone.
    if (!c.session.closed()) metrics_.Error(ErrorKind::kPeerVanished);
    out.clear();
    CloseConn(c, true);
    return;
  }
  if (out.size() > kMaxControlOutBytes) {
    LOG(WARNING) << "client " << c.client_id << " (" << c.peer
                 << ") does not read its control connection; cut";
    out.clear();
    metrics_.Error(ErrorKind::kKeepaliveTimeout);
    CloseConn(c, true);
    return;
  }
  if (c.session.closed() && out.empty()) {
    CloseConn(c, false);
    return;
  }
  const bool want = !out.empty();
  if (want != c.want_write) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | (want ? uint32_t{EPOLLOUT} : 0u);
    ev.data.u64 = c.id;
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
    c.want_write = want;
  }
}

void ServerImpl::CloseConn(Conn& c, bool vanished) {
  // Best effort for what is queued (an Error or Goodbye frame): the socket
  // buffer takes a small frame at once.
  std::string& out = c.session.out();
  if (!vanished && !out.empty()) {
    (void)send(c.fd.get(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  c.fd.Reset();
  const uint64_t id = c.id;
  if (c.data_session) {
    std::string why = vanished ? "control connection lost" : "control connection closed";
    const bool forget = c.client_done;
    data_->Post([this, id, why, forget] { data_->CloseSession(id, why, forget); });
  }
  if (c.move_pending) {
    LOG(WARNING) << "client " << c.client_id << " went away before acknowledging Move";
  }
  conns_.erase(id);
  GuardLeft(id);
}

void ServerImpl::Timers() {
  const absl::Time now = absl::Now();
  std::vector<uint64_t> ids;
  ids.reserve(conns_.size());
  for (const auto& [id, c] : conns_) ids.push_back(id);
  for (uint64_t id : ids) {
    Conn* c = FindConn(id);
    if (c == nullptr) continue;
    if (!c->ready) {
      if (now - c->accepted > opt_.handshake_timeout) {
        LOG(WARNING) << "client " << c->peer << ": handshake not finished within "
                     << absl::FormatDuration(opt_.handshake_timeout) << " (state "
                     << SessionStateName(c->session.state()) << "); cut";
        metrics_.Error(ErrorKind::kHandshakeTimeout);
        c->session.Goodbye(proto::GoodbyeReason::kIdleTimeout, "handshake timeout");
        CloseConn(*c, false);
      }
      continue;
    }
    if (c->liveness.Silent(now)) {
      LOG(WARNING) << "client " << c->client_id << " (" << c->peer << "): nothing received for "
                   << absl::FormatDuration(c->liveness.SilentFor(now)) << " ("
                   << c->liveness.misses() << " keepalives missed); cut";
      metrics_.Error(ErrorKind::kKeepaliveTimeout);
      c->session.Goodbye(proto::GoodbyeReason::kIdleTimeout, "keepalive timeout");
      CloseConn(*c, false);
      continue;
    }
    if (c->liveness.KeepaliveDue(now)) {
      c->liveness.Sent(now);
      if (c->session.SendKeepalive(++c->nonce).ok()) FlushConn(*c);
    }
  }
  GuardTimers(now);
  std::vector<uint64_t> late;
  for (const auto& [id, a] : admins_) {
    if (now > a->deadline) late.push_back(id);
  }
  for (uint64_t id : late) {
    metrics_.Error(ErrorKind::kAdminBadRequest);
    CloseAdmin(*admins_.at(id));
  }
  if (draining_.load() && !shutdown_requested_.load()) {
    if (const size_t left = DrainingClients(); left == 0) {
      LOG(INFO) << "drain: every client has left; shutting down";
      shutdown_requested_.store(true);
    } else if (now >= drain_deadline_) {
      LOG(WARNING) << "drain: " << left << " client(s) still connected at the deadline; "
                   << "shutting down (they are told Goodbye)";
      shutdown_requested_.store(true);
    }
  }
}

// --- admin ------------------------------------------------------------------

}  // namespace kvnode::server
