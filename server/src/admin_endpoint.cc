// The admin socket: accepting, reading a request, answering it, drain.
#include <malloc.h>

#include "server_impl.h"

namespace kvnode::server {

void ServerImpl::AcceptAdmin() {
  for (;;) {
    const int fd = accept4(admin_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        (cred.uid != geteuid() && cred.uid != 0)) {
      LOG(WARNING) << "admin: refused a connection from uid " << cred.uid;
      metrics_.Error(ErrorKind::kAdminBadRequest);
      close(fd);
      continue;
    }
    if (admins_.size() >= 64 || !accepting_) {
      const std::string busy =
          AdminErrorAnswer(accepting_ ? "too many admin connections" : "node is handing over");
      (void)send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
      continue;
    }
    auto a = std::make_unique<AdminConn>();
    a->id = kAdminBit | next_conn_id_++;
    a->fd.Reset(fd);
    a->deadline = absl::Now() + kAdminTimeout;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = a->id;
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      continue;
    }
    admins_.emplace(a->id, std::move(a));
  }
}

void ServerImpl::OnAdminReadable(AdminConn& a) {
  if (a.answered) {
    // Only EOF/HUP is expected now. An answer may still be coming (`clients`,
    // `upgrade --wait`): after the client's EOF the connection is watched
    // for its hang-up only (no busy loop on a readable EOF), and closed then.
    char sink[256];
    ssize_t n;
    while ((n = recv(a.fd.get(), sink, sizeof(sink), MSG_DONTWAIT)) > 0) {
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      if (a.peer_eof) return CloseAdmin(a);  // a hang-up reported again: gone
      a.peer_eof = true;
      epoll_event ev{};
      ev.data.u64 = a.id;  // no events asked for: EPOLLHUP/EPOLLERR only
      epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, a.fd.get(), &ev);
    }
    return;
  }
  char buf[1024];
  for (;;) {
    const ssize_t n = recv(a.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      a.in.append(buf, static_cast<size_t>(n));
      if (a.in.find('\n') != std::string::npos || a.in.size() > kMaxAdminLine) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // EOF or error: a request without '\n' at EOF is still answered.
    if (a.in.empty()) {
      CloseAdmin(a);
      return;
    }
    break;
  }
  AnswerAdmin(a);
}

void ServerImpl::AnswerAdmin(AdminConn& a) {
  a.answered = true;
  const size_t nl = a.in.find('\n');
  const std::string line = a.in.substr(0, nl == std::string::npos ? a.in.size() : nl);
  absl::StatusOr<AdminRequest> req = a.in.size() > kMaxAdminLine && nl == std::string::npos
                                         ? absl::InvalidArgumentError("admin: request too long")
                                         : ParseAdminRequest(line);
  if (!req.ok()) {
    metrics_.Error(ErrorKind::kAdminBadRequest);
    a.out = AdminErrorAnswer(std::string(req.status().message()));
    FlushAdmin(a);
    return;
  }
  const uint64_t id = a.id;
  // Answers that need the data thread come back through the task queue.
  auto reply_later = [this, id](std::string answer) {
    control_tasks_->Post([this, id, answer = std::move(answer)] {
      auto it = admins_.find(id);
      if (it == admins_.end()) return;
      it->second->out = answer;
      FlushAdmin(*it->second);
    });
  };
  switch (req->command) {
    case AdminCommand::kPing:
      a.out = AdminPingAnswer(opt_.generation, getpid(), listen_addr_, opt_.build_id);
      break;
    case AdminCommand::kStats:
      a.out = StatsAnswer(Stats());
      break;
    case AdminCommand::kMetrics:
      a.out = RenderPrometheus(Stats());
      break;
    case AdminCommand::kClients:
      data_->Post([this, reply_later] { reply_later(ClientsAnswer(data_->ClientRows())); });
      return;
    case AdminCommand::kMemory: {
      // Walks every free chunk, each arena under its lock (3 ms for 200,000
      // free chunks on the dev host): allocations of the data thread wait
      // meanwhile. Hence a command of its own, asked for, not polled.
      const struct mallinfo2 mi = mallinfo2();
      MemoryView m;
      m.malloc_in_use_bytes = mi.uordblks + mi.hblkhd;  // heap chunks + mmap()ed ones
      m.malloc_free_bytes = mi.fordblks;
      a.out = MemoryAnswer(m);
      break;
    }
    case AdminCommand::kMrs: {
      std::vector<MrRow> mrs;
      for (const auto& mr : {arena_mr_, pool_mr_}) {
        if (mr == nullptr) continue;
        MrRow r;
        r.kind = "mr";
        r.label = mr->label();
        r.lkey = mr->lkey();
        r.rkey = mr->rkey();
        r.addr = mr->iova();
        r.length = mr->length();
        r.access = AccessFlagsString(mr->access());
        mrs.push_back(std::move(r));
      }
      const uint64_t pinned = rdma::Accounting::PinnedBytes();
      data_->Post([this, reply_later, mrs = std::move(mrs), pinned]() mutable {
        std::vector<MrRow> w = data_->WindowRows();
        mrs.insert(mrs.end(), w.begin(), w.end());
        reply_later(MrsAnswer(mrs, pinned));
      });
      return;
    }
    case AdminCommand::kUpgrade:
      if (draining_.load()) {
        a.out = AdminErrorAnswer("the node is draining: no live upgrade");
        break;
      }
      if (!upgrade_handler_) {
        a.out = AdminErrorAnswer("not implemented yet");
        break;
      }
      // Waiting for the outcome: the upgrade's own deadlines bound the wait,
      // not the admin time-out.
      if (req->wait) a.deadline = absl::InfiniteFuture();
      upgrade_handler_(
          Server::UpgradeRequest{req->args.empty() ? std::nullopt : std::optional(req->args[0]),
                                 req->wait},
          reply_later);
      return;
    case AdminCommand::kDrain:
      StartDrain(a, *req);
      break;
    case AdminCommand::kGuard: {
      absl::StatusOr<GuardArgs> g = ParseGuardArgs(*req);
      if (!g.ok()) {
        metrics_.Error(ErrorKind::kAdminBadRequest);
        a.out = AdminErrorAnswer(std::string(g.status().message()));
        break;
      }
      if (!g->up) {
        LowerGuard();
        a.out = GuardDownAnswer(CheckBelowEpoch());
        break;
      }
      a.deadline = absl::Now() + absl::Seconds(g->ack_timeout_s) + kAdminTimeout;
      RaiseGuard(absl::Seconds(g->ack_timeout_s), [reply_later](absl::StatusOr<GuardRaised> r) {
        reply_later(r.ok() ? GuardUpAnswer(r->acknowledged, r->cut)
                           : AdminErrorAnswer(std::string(r.status().message())));
      });
      return;
    }
    case AdminCommand::kCheck:
      // Runs on the data thread, which writes: nothing is written meanwhile
      // (RPC GETs and sessions wait too; one-sided READs go on). Its length
      // is the store's size, not the admin time-out.
      a.deadline = absl::InfiniteFuture();
      data_->Post([this, reply_later] { reply_later(CheckAnswer(store_->Check())); });
      return;
  }
  FlushAdmin(a);
}

// Connections with a data-plane session, made or being made (Hello accepted).
size_t ServerImpl::DrainingClients() const {
  size_t n = 0;
  for (const auto& [id, c] : conns_) n += c->data_session ? 1 : 0;
  return n;
}

void ServerImpl::StartDrain(AdminConn& a, const AdminRequest& req) {
  absl::StatusOr<uint32_t> timeout_s = DrainTimeoutSeconds(req);
  if (!timeout_s.ok()) {
    metrics_.Error(ErrorKind::kAdminBadRequest);
    a.out = AdminErrorAnswer(std::string(timeout_s.status().message()));
    return;
  }
  if (upgrade_in_progress_.load()) {
    a.out = AdminErrorAnswer("a live upgrade is in progress: drain once it has finished");
    return;
  }
  if (draining_.load()) {
    a.out = AdminErrorAnswer(absl::StrCat(
        "already draining: ", DrainingClients(), " client(s) left, shutdown in at most ",
        absl::FormatDuration(absl::Trunc(drain_deadline_ - absl::Now(), absl::Seconds(1)))));
    return;
  }
  draining_.store(true);
  drain_deadline_ = absl::Now() + absl::Seconds(*timeout_s);
  const size_t clients = DrainingClients();
  LOG(INFO) << "drain: new sessions are refused; shutting down when the " << clients
            << " connected client(s) have left, or in " << *timeout_s << " s";
  a.out = DrainAnswer(clients, *timeout_s);
}

void ServerImpl::FlushAdmin(AdminConn& a) {
  while (!a.out.empty()) {
    const ssize_t n = send(a.fd.get(), a.out.data(), a.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      a.out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!a.want_write) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLOUT;
        ev.data.u64 = a.id;
        epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, a.fd.get(), &ev);
        a.want_write = true;
      }
      return;
    }
    break;  // peer gone
  }
  if (a.answered) CloseAdmin(a);
}

void ServerImpl::CloseAdmin(AdminConn& a) {
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, a.fd.get(), nullptr);
  a.fd.Reset();
  admins_.erase(a.id);
}

StatsView ServerImpl::Stats() const {
  StatsView v;
  v.uptime_s = absl::ToDoubleSeconds(absl::Now() - started_);
  v.pid = getpid();
  v.generation = opt_.generation;
  v.build_id = opt_.build_id;
  v.clients = data_ != nullptr ? data_->ready_sessions() : 0;
  v.client_records = data_ != nullptr ? data_->client_records() : 0;
  const rdma::LiveCounts lc = rdma::Accounting::Snapshot();
  v.qps = static_cast<uint64_t>(lc.of(rdma::ObjectKind::kQp));
  v.mrs = static_cast<uint64_t>(lc.of(rdma::ObjectKind::kMr));
  v.mws = static_cast<uint64_t>(lc.of(rdma::ObjectKind::kMw));
  v.pinned_bytes = lc.pinned_bytes;
  v.counters = metrics_.Snapshot();
  if (store_ != nullptr) {
    const storage::StoreStats s = store_->stats();
    v.arena.size = s.arena_bytes;
    v.arena.used = s.index_bytes + s.heap_object_bytes;
    v.arena.keys = s.keys;
    v.arena.resident_keys = s.resident_keys;
    v.arena.evictions = s.evictions;
    v.arena.opened_as = storage::OpenedAsName(store_->opened_as());
    v.arena.open_reason = store_->open_reason();
    v.journaled_writes = s.journaled;
    v.journal_replayed = s.replayed;
    v.write_commits = s.commits;
  }
  v.upgrade_in_progress = upgrade_in_progress_.load();
  v.writes_paused = writes_paused_.load();
  v.draining = draining_.load();
  if (extra_stats_) v.extra = extra_stats_();
  return v;
}

// --- shutdown -----------------------------------------------------------------

}  // namespace kvnode::server
