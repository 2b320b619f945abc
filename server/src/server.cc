// Shutdown in the safe order, and the Server facade (server.h; docs/server.md).
#include "server_impl.h"

namespace kvnode::server {

void ServerImpl::Shutdown() {
  const absl::Time t0 = absl::Now();
  const absl::Time deadline = t0 + opt_.shutdown_timeout;
  LOG(INFO) << "shutdown: " << conns_.size() << " control connections, " << data_->live_sessions()
            << " sessions";
  // 0. Nothing else may use the store once step 5 frees it (Server::SetBeforeShutdown).
  if (before_shutdown_) before_shutdown_();
  StopMetricsHttp();
  // 1. Stop accepting.
  if (listen_fd_.valid()) {
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, listen_fd_.get(), nullptr);
    listen_fd_.Reset();
  }
  // 2. Goodbye to every client (best effort, bounded), then close.
  for (auto& [id, c] : conns_) {
    c->session.Goodbye(proto::GoodbyeReason::kShutdown, "node shutting down");
    const std::string& out = c->session.out();
    (void)proto::WriteAll(c->fd.get(), proto::AsBytes(out),
                          std::min(deadline, absl::Now() + absl::Milliseconds(200)));
    c->fd.Reset();
  }
  conns_.clear();
  admins_.clear();
  // 3. Every session: window, QP to ERR, drain, destroy, buffers back. Then
  //    the CQ (DataPlane owns it).
  data_->Shutdown();
  data_.reset();
  if (before_deregister_) before_deregister_();
  // 4. MRs, in order: the RPC pool, then the arena (no window can be bound
  //    to it any more), then the PD.
  const rdma::Deadline mr_deadline = rdma::DeadlineIn(std::chrono::seconds(2));
  for (std::shared_ptr<rdma::Mr>* mr : {&pool_mr_, &arena_mr_}) {
    if (*mr == nullptr) continue;
    if (absl::Status s = rdma::SafeDeregister(**mr, mr_deadline); !s.ok()) {
      LOG(ERROR) << "deregistering " << (*mr)->label() << ": " << s;
    }
    mr->reset();
  }
  pool_mem_ = rdma::HostMemory();
  pd_.reset();
  // 5. RocksDB (marks the arena clean), then the arena segment.
  backend_.reset();
  if (store_ != nullptr) {
    if (!handed_off_.load()) {
      if (absl::Status s = store_->Close(); !s.ok()) LOG(ERROR) << "closing the store: " << s;
    }
    store_.reset();
    if (!handed_off_.load() && !opt_.keep_arena) {
      if (absl::Status s = storage::Arena::Remove(store_options_.arena_options()); !s.ok()) {
        LOG(ERROR) << "removing the arena: " << s;
      } else {
        LOG(INFO) << "arena segment removed (use --keep_arena to keep it)";
      }
    } else if (opt_.keep_arena) {
      LOG(INFO) << "arena segment kept (--keep_arena)";
    }
  }
  // 6. The device.
  device_.reset();
  if (admin_fd_.valid()) {
    admin_fd_.Reset();
    if (!handed_off_.load()) unlink(admin_path_.c_str());
  }
  if (!opt_.pid_file.empty() && !handed_off_.load()) unlink(opt_.pid_file.c_str());
  LOG(INFO) << "shutdown took " << absl::FormatDuration(absl::Now() - t0);
}

void ServerImpl::StartMetricsHttp() {
  if (!metrics_fd_.valid() || metrics_http_ != nullptr) return;
  // The scrape is rendered here, on the control thread, as for `kvctl
  // metrics`: the HTTP thread only waits for the answer (with a deadline).
  auto render = [this](MetricsHttpServer::Reply reply) {
    control_tasks_->Post([this, reply = std::move(reply)] { reply(RenderPrometheus(Stats())); });
  };
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> m =
      MetricsHttpServer::Start(metrics_fd_.get(), std::move(render));
  if (!m.ok()) {
    // The socket was bound at start; what fails here (a thread, a dup) is
    // no reason to stop serving clients.
    LOG(ERROR) << "--metrics_listen " << metrics_addr_ << ": not serving metrics: " << m.status();
    return;
  }
  metrics_http_ = std::move(*m);
}

void ServerImpl::StopMetricsHttp() { metrics_http_.reset(); }

// --- Server -------------------------------------------------------------------

Server::Server(std::unique_ptr<ServerImpl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options,
                                                       InheritedSockets inherited) {
  auto impl = std::make_unique<ServerImpl>(options);
  if (absl::Status s = impl->Init(inherited); !s.ok()) return s;
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Server>> Server::CreateForTakeover(
    const ServerOptions& options, std::function<absl::Status()> after_attach) {
  auto impl = std::make_unique<ServerImpl>(options);
  if (absl::Status s = impl->InitForTakeover(after_attach); !s.ok()) return s;
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}
absl::Status Server::CompleteTakeover(InheritedSockets inherited) {
  return impl_->CompleteTakeover(inherited);
}
absl::Status Server::PrepareJournal() {
  if (!impl_->journal_prep_.valid()) return absl::FailedPreconditionError("no journal being made");
  return impl_->journal_prep_.get();
}
absl::Status Server::CompleteSwitch(InheritedSockets inherited, uint64_t last_version) {
  return impl_->CompleteSwitch(inherited, last_version);
}
absl::Status Server::OpenDbAfterSwitch() {
  const absl::Time t0 = absl::Now();
  absl::Status s = impl_->store_->OpenDb();
  if (s.ok()) {
    LOG(INFO) << "takeover: RocksDB " << impl_->opt_.db_path << " opened and "
              << impl_->store_->stats().replayed << " journaled writes replayed in "
              << absl::FormatDuration(absl::Now() - t0);
  }
  return s;
}
Server::ArenaInfo Server::arena_info() const {
  ArenaInfo a;
  if (impl_->arena_mr_ != nullptr) {
    a.rkey = impl_->arena_mr_->rkey();
    a.remote_addr = impl_->arena_mr_->iova();
    a.registered_bytes = impl_->arena_mr_->length();
  }
  if (impl_->store_ != nullptr) {
    a.arena_size = impl_->store_->arena_size();
    a.arena_id = impl_->store_->arena().header()->arena_id;
  }
  return a;
}
void Server::SetExtraStats(std::function<std::vector<ExtraStat>()> f) {
  impl_->extra_stats_ = std::move(f);
}
void Server::SetBeforeDeregister(std::function<void()> f) {
  impl_->before_deregister_ = std::move(f);
}
void Server::SetBeforeShutdown(std::function<void()> f) { impl_->before_shutdown_ = std::move(f); }
void Server::SetShutdownHook(std::function<bool()> hook) {
  impl_->shutdown_hook_ = std::move(hook);
}
absl::Status Server::Run() { return impl_->Run(); }
void Server::RequestShutdown() {
  impl_->shutdown_requested_.store(true);
  if (impl_->control_tasks_ != nullptr) impl_->control_tasks_->Post([] {});
}
std::string Server::listen_address() const { return impl_->listen_addr_; }
absl::StatusOr<std::string> Server::advertised_endpoint() const {
  return AdvertisedEndpoint(impl_->opt_.advertise_address, impl_->listen_addr_);
}
const std::string& Server::admin_socket_path() const { return impl_->admin_path_; }
uint64_t Server::generation() const { return impl_->opt_.generation; }
Metrics& Server::metrics() { return impl_->metrics_; }
void Server::SetUpgradeHandler(UpgradeHandler handler) {
  impl_->upgrade_handler_ = [this, h = std::move(handler)](UpgradeRequest request,
                                                           std::function<void(std::string)> reply) {
    h(*this, std::move(request), std::move(reply));
  };
}
std::optional<std::string> Server::UpgradeBlocker() const { return impl_->GuardBlocksUpgrade(); }
void Server::RaiseGuard(absl::Duration ack_timeout, std::function<void(absl::Status)> done) {
  impl_->RaiseGuard(ack_timeout,
                    [done = std::move(done)](absl::StatusOr<GuardRaised> r) { done(r.status()); });
}
void Server::LowerGuard() { impl_->LowerGuard(); }
void Server::RunOnControlThread(std::function<void()> task) {
  impl_->control_tasks_->Post(std::move(task));
}
int Server::listen_fd() const { return impl_->listen_fd_.get(); }
int Server::admin_fd() const { return impl_->admin_fd_.get(); }
int Server::metrics_fd() const { return impl_->metrics_fd_.get(); }
std::string Server::metrics_address() const { return impl_->metrics_addr_; }
void Server::StopAccepting() {
  ServerImpl& s = *impl_;
  if (!s.accepting_) return;
  s.accepting_ = false;
  // Scrapes it accepted are still answered (this thread renders them once
  // it is back in its loop); new ones wait in the backlog.
  if (s.metrics_http_ != nullptr) s.metrics_http_->Pause();
  epoll_ctl(s.epoll_fd_.get(), EPOLL_CTL_DEL, s.listen_fd_.get(), nullptr);
  epoll_ctl(s.epoll_fd_.get(), EPOLL_CTL_DEL, s.admin_fd_.get(), nullptr);
}
void Server::ResumeAccepting() {
  ServerImpl& s = *impl_;
  if (s.accepting_) return;
  s.accepting_ = true;
  if (s.metrics_http_ != nullptr) s.metrics_http_->Resume();
  for (auto [fd, tag] :
       {std::pair{s.listen_fd_.get(), kTagListen}, std::pair{s.admin_fd_.get(), kTagAdminListen}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    epoll_ctl(s.epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
}
void Server::PauseWrites(std::function<void()> done) {
  ServerImpl* s = impl_.get();
  s->data_->Post([s, done = std::move(done)] {
    // Writes run to completion on this thread: none is in flight now.
    s->data_->SetWritesPaused(true);
    s->writes_paused_.store(true);
    s->control_tasks_->Post(done);
  });
}
void Server::ResumeWrites(std::function<void()> done) {
  ServerImpl* s = impl_.get();
  s->data_->Post([s, done = std::move(done)] {
    s->data_->SetWritesPaused(false);
    s->writes_paused_.store(false);
    s->control_tasks_->Post(done);
  });
}
absl::Status Server::ReleaseDbForHandoff() { return impl_->store_->ReleaseDbForHandoff(); }
absl::Status Server::CloseReleasedDb() { return impl_->store_->CloseReleasedDb(); }
uint64_t Server::last_version() const { return impl_->store_->last_version(); }
absl::Status Server::ReopenDbAfterFailedHandoff() {
  return impl_->store_->ReopenDbAfterFailedHandoff();
}
size_t Server::SendMoveToAll(const proto::Move& move, std::function<void(uint64_t)> on_ack) {
  ServerImpl& s = *impl_;
  s.on_move_ack_ = std::move(on_ack);
  size_t sent = 0;
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : s.conns_) ids.push_back(id);
  for (uint64_t id : ids) {
    Conn* c = s.FindConn(id);
    if (c == nullptr || !c->ready) continue;
    if (c->session.SendMove(move).ok()) {
      c->move_pending = true;
      ++sent;
      s.FlushConn(*c);
    }
  }
  return sent;
}
size_t Server::PendingMoveAcks() const {
  size_t n = 0;
  for (const auto& [id, c] : impl_->conns_) n += c->move_pending ? 1 : 0;
  return n;
}
void Server::ExportSessions(uint64_t changed_after, bool with_live,
                            std::function<void(RecordsExport)> done) {
  ServerImpl* s = impl_.get();
  s->data_->Post([s, changed_after, with_live, done = std::move(done)]() mutable {
    s->control_tasks_->Post(
        [done = std::move(done), r = s->data_->ExportRecords(changed_after, with_live)]() mutable {
          done(std::move(r));
        });
  });
}
// Before Run(): the data thread does not exist yet, so this thread owns it.
void Server::ImportSessions(const std::vector<ClientRecordExport>& records) {
  impl_->data_->ImportRecords(records);
}
absl::Status Server::RetainSessions(const std::vector<uint64_t>& client_ids) {
  return impl_->data_->RetainRecords(client_ids);
}
void Server::MarkHandedOff() { impl_->handed_off_.store(true); }
void Server::SetUpgradeInProgress(bool in_progress) {
  impl_->upgrade_in_progress_.store(in_progress);
}

}  // namespace kvnode::server
