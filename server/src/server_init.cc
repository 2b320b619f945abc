// Starting a node: Init and its steps in order, and the live-upgrade new
// side's two-part start (InitForTakeover, CompleteTakeover).
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "kvnode/base/own_dir.h"
#include "kvnode/base/step_times.h"
#include "server_impl.h"

namespace kvnode::server {
namespace {

// --db_path is where the node creates its write journal by name (and RocksDB
// its files): it must be the node's own, and nobody else may write it
// (reading is left to the operator: the node's files are 0600 whatever its
// umask). Checked at the start, when it exists, to refuse before anything is
// created; and again, creating it 0700 if missing, just before the store
// opens it, so that nobody can create it in between.
absl::Status CheckDbDir(const std::string& db_path, base::MissingDir missing) {
  return base::EnsureOwnDirectory(absl::StrCat("--db_path ", db_path), db_path, 0022, missing);
}

// What is at --pid_file's name must be nothing or this uid's regular file: a
// symbolic link is refused, not replaced or followed, and its target left
// alone. (The directory is checked by EnsureNodeFileDir: only this uid can
// add names to it.)
absl::Status CheckPidFileName(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("--pid_file ", path, ": lstat: ", base::ErrnoText(errno)));
  }
  std::string why;
  if (S_ISLNK(st.st_mode)) {
    why = "is a symbolic link";
  } else if (!S_ISREG(st.st_mode)) {
    why = "is not a regular file";
  } else if (st.st_uid != geteuid()) {
    why = absl::StrCat("is owned by uid ", st.st_uid, ", not by this node's uid ", geteuid());
  }
  if (why.empty()) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("--pid_file ", path, " ", why, ": refusing to replace it"));
}

// Replaces `path` with this process's pid: a temporary file created with
// O_CREAT | O_EXCL | O_NOFOLLOW next to it, renamed over the name, so that a
// reader never sees it empty (an upgrade's new process replaces the old one's)
// and nothing planted under the name is followed.
absl::Status WritePidFile(const std::string& path) {
  if (absl::Status s = CheckPidFileName(path); !s.ok()) return s;
  // Left by a crashed process that had this pid: the directory is ours.
  const std::string tmp = absl::StrCat(path, ".", getpid(), ".tmp");
  (void)unlink(tmp.c_str());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("--pid_file ", path, ": create ", tmp, ": ", base::ErrnoText(errno)));
  }
  const std::string text = absl::StrCat(getpid(), "\n");
  const ssize_t n = write(fd, text.data(), text.size());
  const int write_err = errno;
  if (close(fd) != 0 || n != static_cast<ssize_t>(text.size())) {
    (void)unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("--pid_file ", path, ": write ", tmp, ": ",
                                            base::ErrnoText(n < 0 ? write_err : EIO)));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    (void)unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("--pid_file ", path, ": rename ", tmp, ": ", base::ErrnoText(err)));
  }
  return absl::OkStatus();
}

}  // namespace

ServerImpl::~ServerImpl() {
  // No Publish may post to control_tasks_ once it is gone.
  if (opt_.shard_gate != nullptr) opt_.shard_gate->SetListener({});
  // Normally Shutdown() released everything; this covers a failed Init.
  if (data_ != nullptr) data_->Shutdown();
  data_.reset();
}

absl::Status ServerImpl::Init(InheritedSockets inherited) {
  // Each phase's time on the way to serving, logged in one line: a restart's
  // blackout is their sum.
  base::StepTimes phases;
  if (absl::Status s = InitSignalsAndAuth(); !s.ok()) return s;
  // Sockets first: a second node on the same port fails before it touches
  // the device or the database.
  if (absl::Status s = InitSockets(inherited); !s.ok()) return s;
  if (absl::Status s = InitDevice(); !s.ok()) return s;
  phases.Done("device");

  // Storage (opens RocksDB; takes a matching arena back or rebuilds it).
  if (absl::Status s = CheckDbDir(opt_.db_path, base::MissingDir::kCreate); !s.ok()) return s;
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::unique_ptr<storage::Store>> store = storage::Store::Open(store_options_);
  if (!store.ok()) return store.status();
  store_ = std::move(*store);
  backend_ = std::make_unique<StoreBackend>(store_.get(), opt_.rpc_credits);
  const storage::StoreStats ss = store_->stats();
  LOG(INFO) << "store " << opt_.db_path << ": " << storage::OpenedAsName(store_->opened_as())
            << " in " << absl::FormatDuration(absl::Now() - t0) << ", " << ss.keys << " keys ("
            << ss.resident_keys << " resident), arena " << store_->arena().path() << " "
            << store_->arena_size() << " bytes, generation " << ss.generation << ": "
            << store_->open_reason();
  phases.Done(absl::StrCat("store (", storage::OpenedAsName(store_->opened_as()), ")"));
  EnsureSlotWords();  // before the data plane: it stores the words from the start

  // The arena exists now (this start created, rebuilt or claimed it: it is
  // dirty either way). A start that fails from here on removes its name, so
  // that it does not hold tmpfs memory until someone notices (existing
  // mappings, the MR's included, stay valid until torn down).
  absl::Status s = InitRegistrationAndDataPlane();
  if (s.ok()) phases.Done("registration");
  if (s.ok()) {
    // Dedupe records persisted with the writes (dedupe.h): a client retrying
    // a write applied before a crash gets the answer it missed. (A live
    // upgrade hands the in-memory records over instead.) The data thread
    // does not run yet: this thread owns the data plane.
    absl::StatusOr<std::vector<ClientRecordExport>> recs =
        backend_->LoadClientRecords(opt_.max_client_records);
    if (recs.ok()) {
      data_->ImportRecords(*recs);
      LOG(INFO) << "dedupe: " << recs->size() << " client records loaded from " << opt_.db_path;
    } else {
      s = recs.status();
    }
  }
  if (s.ok()) phases.Done("client records");
  if (s.ok()) s = InitEpoll();
  if (s.ok()) s = AddSocketsToEpoll();
  if (s.ok()) s = WritePidFileAndLog();
  if (s.ok()) {
    phases.Done("listen");
    LOG(INFO) << "start: serving " << absl::FormatDuration(phases.total())
              << " after the start of Init (" << phases.steps() << ")";
  }
  if (!s.ok()) {
    if (absl::Status r = storage::Arena::Remove(store_options_.arena_options()); !r.ok()) {
      LOG(ERROR) << "start failed; removing the arena: " << r;
    } else {
      LOG(INFO) << "start failed: arena segment " << store_->arena().path() << " removed";
    }
  }
  return s;
}

absl::Status ServerImpl::InitForTakeover(const std::function<absl::Status()>& after_attach) {
  if (absl::Status s = InitSignalsAndAuth(); !s.ok()) return s;
  if (absl::Status s = CheckDbDir(opt_.db_path, base::MissingDir::kCreate); !s.ok()) return s;
  // The live arena first (O(1), reads no data): O keeps serving from it.
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::unique_ptr<storage::Store>> store =
      storage::Store::AttachLive(store_options_);
  if (!store.ok()) return store.status();
  store_ = std::move(*store);
  backend_ = std::make_unique<StoreBackend>(store_.get(), opt_.rpc_credits);
  LOG(INFO) << "store: attached the live arena " << store_->arena().path() << " ("
            << store_->arena_size() << " bytes) in " << absl::FormatDuration(absl::Now() - t0);
  if (after_attach) {
    if (absl::Status s = after_attach(); !s.ok()) return s;
  }
  // The write journal (--upgrade_journal_mb) and the arena's registration
  // are both N's work before Ready. The journal is the spare renamed, unless
  // there is none and it must be allocated in full: on another core that
  // overlaps the registration instead of adding up on the way to Ready.
  journal_prep_ = std::async(std::launch::async, [this] { return store_->PrepareJournal(); });
  if (absl::Status s = InitDevice(); !s.ok()) return s;
  const absl::Time t1 = absl::Now();
  if (absl::Status s = InitRegistrationAndDataPlane(); !s.ok()) return s;
  LOG(INFO) << "takeover: arena registered in " << absl::FormatDuration(absl::Now() - t1);
  return InitEpoll();
}

static_assert(storage::kSlotWordsBytes == proto::kMaxSlots,
              "the slot-words table has one byte per slot of the largest map");

void ServerImpl::EnsureSlotWords() {
  if (opt_.shard_gate == nullptr) return;
  const bool had = store_->arena().slot_words_offset() != 0;
  absl::StatusOr<uint64_t> off = store_->EnsureSlotWords();
  if (!off.ok()) {
    LOG(ERROR) << "cluster: no slot-words table, clients will not be offered kFeatureSlotWords "
                  "(a client on an old map may read a slot this node gave away): "
               << off.status();
    return;
  }
  if (!had) LOG(INFO) << "cluster: slot-words table made at arena offset " << *off;
  if (data_ != nullptr) {
    data_->Post([this, off = *off] {
      data_->SetSlotWords(reinterpret_cast<uint8_t*>(store_->arena_base() + off), off);
    });
  }
}

absl::Status ServerImpl::CompleteSwitch(InheritedSockets inherited, uint64_t last_version) {
  if (absl::Status s = store_->BecomeJournalWriter(last_version); !s.ok()) return s;
  EnsureSlotWords();  // an old process of a build without the table left none
  if (absl::Status s = InitSockets(inherited); !s.ok()) return s;
  if (absl::Status s = AddSocketsToEpoll(); !s.ok()) return s;
  return WritePidFileAndLog();
}

absl::Status ServerImpl::CompleteTakeover(InheritedSockets inherited) {
  const absl::Time t0 = absl::Now();
  if (absl::Status s = store_->OpenDb(); !s.ok()) return s;
  LOG(INFO) << "takeover: RocksDB " << opt_.db_path << " opened in "
            << absl::FormatDuration(absl::Now() - t0);
  EnsureSlotWords();
  // The dedupe records persisted with the writes: all a new process trusts
  // when the old one died before HandOver (records it sent before it died
  // may be older than what it persisted since). The data thread does not
  // run yet: this thread owns the data plane.
  absl::StatusOr<std::vector<ClientRecordExport>> recs =
      backend_->LoadClientRecords(opt_.max_client_records);
  if (!recs.ok()) return recs.status();
  data_->ImportRecords(*recs);
  if (absl::Status s = InitSockets(inherited); !s.ok()) return s;
  if (absl::Status s = AddSocketsToEpoll(); !s.ok()) return s;
  return WritePidFileAndLog();
}

absl::Status ServerImpl::InitSignalsAndAuth() {
  if (absl::Status s = opt_.Validate(); !s.ok()) return s;
  store_options_.db_path = opt_.db_path;
  store_options_.sync_writes = opt_.sync_writes;
  store_options_.shm_name = opt_.shm_name;
  store_options_.arena_file = opt_.arena_path;
  store_options_.arena_size = opt_.arena_size;
  store_options_.max_chain_buckets = opt_.max_chain_buckets;
  store_options_.journal_bytes = uint64_t{opt_.upgrade_journal_mb} << 20;

  // Signals are taken through a signalfd: block them in this thread before
  // any other thread (RocksDB's, the data plane) exists, so all inherit it.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGUSR2);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  signal_fd_.Reset(signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signal_fd_.valid())
    return absl::InternalError(absl::StrCat("signalfd: ", base::ErrnoText(errno)));

  if (opt_.auth_token_file.empty()) {
    LOG(WARNING) << "no --auth_token_file: clients are not authenticated";
  } else {
    absl::StatusOr<std::string> t = ReadAuthTokenFile(opt_.auth_token_file);
    if (!t.ok()) return t.status();
    auth_token_ = std::move(*t);
  }
  // Before anything is created: a pid file in a directory others can write
  // could be replaced, or planted as a link to a file the node would clobber.
  if (!opt_.pid_file.empty()) {
    if (absl::Status s = EnsureNodeFileDir("--pid_file", opt_.pid_file); !s.ok()) return s;
    if (absl::Status s = CheckPidFileName(opt_.pid_file); !s.ok()) return s;
  }
  return CheckDbDir(opt_.db_path, base::MissingDir::kAccept);
}

absl::Status ServerImpl::InitSockets(InheritedSockets inherited) {
  if (inherited.listen_fd >= 0) {
    if (absl::Status s = CheckListening(inherited.listen_fd, "listen"); !s.ok()) return s;
    listen_fd_.Reset(inherited.listen_fd);
  } else {
    absl::StatusOr<int> fd = BindTcp(opt_.listen);
    if (!fd.ok()) return fd.status();
    listen_fd_.Reset(*fd);
    listen_pending_ = true;
  }
  listen_addr_ = SockName(listen_fd_.get());
  // Before the admin socket: a taken metrics port leaves no socket file.
  if (absl::Status s = InitMetricsSocket(inherited.metrics_fd); !s.ok()) return s;
  if (opt_.admin_socket.empty()) {
    absl::StatusOr<std::string> p = DefaultAdminSocketPath();
    if (!p.ok()) return p.status();
    admin_path_ = *p;
  } else {
    admin_path_ = opt_.admin_socket;
  }
  if (inherited.admin_fd >= 0) {
    if (absl::Status s = CheckListening(inherited.admin_fd, "admin"); !s.ok()) return s;
    admin_fd_.Reset(inherited.admin_fd);
  } else {
    if (!opt_.admin_socket.empty()) {
      // The default path's directory is checked by DefaultAdminSocketPath.
      if (absl::Status s = EnsureAdminSocketDir(admin_path_); !s.ok()) return s;
    }
    absl::StatusOr<int> fd = ListenUnix(admin_path_);
    if (!fd.ok()) return fd.status();
    admin_fd_.Reset(*fd);
  }
  return absl::OkStatus();
}

// The metrics endpoint's socket: bound here, at start, so that a taken port
// stops the start with the flag named; or the one a live upgrade's old
// process served it on (the same address, never a gap).
absl::Status ServerImpl::InitMetricsSocket(int inherited_fd) {
  if (opt_.metrics_listen.empty()) {
    if (inherited_fd >= 0) close(inherited_fd);
    return absl::OkStatus();
  }
  if (inherited_fd >= 0) {
    if (absl::Status s = CheckListening(inherited_fd, "metrics"); !s.ok()) return s;
    metrics_fd_.Reset(inherited_fd);
  } else {
    // Listening at once, unlike --listen: a scraper's own time-out bounds
    // its wait in the backlog until Run serves it, and nothing is lost.
    absl::StatusOr<int> fd = BindTcp(opt_.metrics_listen, "--metrics_listen");
    if (!fd.ok()) return fd.status();
    metrics_fd_.Reset(*fd);
    if (absl::Status s = StartListening(*fd, opt_.metrics_listen, "--metrics_listen"); !s.ok()) {
      return s;
    }
  }
  metrics_addr_ = SockName(metrics_fd_.get());
  return absl::OkStatus();
}

absl::Status ServerImpl::InitDevice() {
  absl::StatusOr<WindowMode> wm = ParseWindowMode(opt_.memory_windows);
  if (!wm.ok()) return wm.status();
  rdma::DeviceOptions dopt;
  dopt.name = opt_.rdma_device;
  dopt.port = opt_.rdma_port;
  dopt.gid_index = opt_.gid_index;
  absl::StatusOr<std::shared_ptr<rdma::Device>> dev = rdma::Device::Open(dopt);
  if (!dev.ok()) return dev.status();
  device_ = std::move(*dev);
  const rdma::DeviceCaps& caps = device_->caps();
  switch (*wm) {
    case WindowMode::kOff:
      use_windows_ = false;
      break;
    case WindowMode::kAuto:
      use_windows_ = caps.mw_type2;
      break;
    case WindowMode::kOn:
      if (!caps.mw_type2) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--memory_windows=on but device ", device_->name(), " has no type-2 windows"));
      }
      use_windows_ = true;
      break;
  }
  LOG(INFO) << "device " << device_->name() << " port " << device_->port() << " gid "
            << rdma::GidToString(device_->gid()) << " (index " << device_->gid_index()
            << "), type-2 windows " << (caps.mw_type2 ? "supported" : "unsupported")
            << ", serving the arena through "
            << (use_windows_ ? "a type-2 window per client" : "the arena MR's rkey");
  return absl::OkStatus();
}

absl::Status ServerImpl::InitRegistrationAndDataPlane() {
  // Memory registration: the arena once, at iova 0 (remote address = arena
  // offset); the RPC pool once (receives and responses, LOCAL_WRITE only).
  absl::StatusOr<std::shared_ptr<rdma::Pd>> pd = rdma::Pd::Create(device_, "server-pd");
  if (!pd.ok()) return pd.status();
  pd_ = std::move(*pd);
  rdma::MrOptions aopt;
  // With windows the MR itself grants no remote access: a client's own
  // type-2 window (bound to its QP) is its only way in.
  aopt.access = use_windows_ ? IBV_ACCESS_MW_BIND : IBV_ACCESS_REMOTE_READ;
  aopt.iova = 0;
  aopt.label = "arena";
  // The arena's pages exist: the old process (or Open) wrote them. Mapping
  // them first halves the registration's CPU (docs/rdma.md: 445 against 961
  // ms per GiB of 4 KiB pages), CPU that a new process takes from the
  // clients while the old one serves them.
  aopt.populate_first = true;
  absl::StatusOr<std::shared_ptr<rdma::Mr>> amr =
      rdma::Mr::Register(pd_, store_->arena_base(), store_->arena_size(), aopt);
  if (!amr.ok()) return amr.status();
  arena_mr_ = std::move(*amr);
  const size_t pool_bytes = RpcPoolBytes(opt_.max_clients, opt_.rpc_credits);
  absl::StatusOr<rdma::HostMemory> mem = rdma::HostMemory::Allocate(pool_bytes);
  if (!mem.ok()) return mem.status();
  pool_mem_ = std::move(*mem);
  rdma::MrOptions popt;
  popt.access = IBV_ACCESS_LOCAL_WRITE;
  popt.label = "rpc-pool";
  absl::StatusOr<std::shared_ptr<rdma::Mr>> pmr =
      rdma::Mr::Register(pd_, pool_mem_.data(), pool_mem_.size(), popt);
  if (!pmr.ok()) return pmr.status();
  pool_mr_ = std::move(*pmr);

  absl::StatusOr<std::unique_ptr<TaskQueue>> q = TaskQueue::Create();
  if (!q.ok()) return q.status();
  control_tasks_ = std::move(*q);
  if (opt_.shard_gate != nullptr) {
    // Publish may come from any thread (the cluster agent's); the push
    // happens here, on the control thread.
    opt_.shard_gate->SetListener(
        [this, ctq = control_tasks_.get()] { ctq->Post([this] { OnShardMapPublished(); }); });
  }

  DataPlaneConfig dc;
  dc.max_clients = opt_.max_clients;
  dc.credits = opt_.rpc_credits;
  dc.dedupe_window = opt_.dedupe_window;
  dc.max_client_records = opt_.max_client_records;
  dc.use_windows = use_windows_;
  dc.spin_us = opt_.spin_us;
  dc.spin_max_us = opt_.spin_max_us;
  dc.group_commit = opt_.group_commit;
  dc.qp_timeout = static_cast<uint8_t>(opt_.qp_timeout);
  dc.qp_retry_cnt = static_cast<uint8_t>(opt_.qp_retry_cnt);
  dc.drain_timeout = std::min(absl::Seconds(2), opt_.shutdown_timeout);
  dc.shard_gate = opt_.shard_gate;
  DataPlaneResources res{
      device_, pd_, arena_mr_, pool_mr_, pool_mem_.bytes(), store_->arena_size()};
  if (opt_.shard_gate != nullptr && store_->arena().slot_words_offset() != 0) {
    // Made by this process (a cold start) or found at attach (the old
    // process's): the data plane stores the words, and only it.
    res.slot_words_offset = store_->arena().slot_words_offset();
    res.slot_words = reinterpret_cast<uint8_t*>(store_->arena_base() + res.slot_words_offset);
  }
  TaskQueue* ctq = control_tasks_.get();
  absl::StatusOr<std::unique_ptr<DataPlane>> dp =
      DataPlane::Create(dc, std::move(res), backend_.get(), &metrics_,
                        [this, ctq](uint64_t conn_id, std::string why, ErrorKind kind) {
                          ctq->Post([this, conn_id, why = std::move(why), kind] {
                            Conn* c = FindConn(conn_id);
                            if (c == nullptr) return;
                            c->data_session = false;  // already reaped
                            (void)kind;               // counted by the data plane
                            c->session.Fail(proto::ErrorCode::kInternal,
                                            absl::StrCat("session closed by the server: ", why));
                            CloseConn(*c, false);
                          });
                        });
  if (!dp.ok()) return dp.status();
  data_ = std::move(*dp);
  return absl::OkStatus();
}

absl::Status ServerImpl::InitEpoll() {
  epoll_fd_.Reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_.valid())
    return absl::InternalError(absl::StrCat("epoll_create1: ", base::ErrnoText(errno)));
  auto add = [this](int fd, uint64_t tag) -> absl::Status {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return absl::InternalError(absl::StrCat("epoll_ctl ADD: ", base::ErrnoText(errno)));
    }
    return absl::OkStatus();
  };
  for (auto [fd, tag] :
       {std::pair{signal_fd_.get(), kTagSignal}, std::pair{control_tasks_->fd(), kTagTasks},
        std::pair{device_->context()->async_fd, kTagDeviceEvents}}) {
    if (absl::Status s = add(fd, tag); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ServerImpl::AddSocketsToEpoll() {
  // A cold start listens only now that it can serve (BindTcp says why).
  if (listen_pending_) {
    if (absl::Status s = StartListening(listen_fd_.get(), opt_.listen); !s.ok()) return s;
    listen_pending_ = false;
  }
  for (auto [fd, tag] :
       {std::pair{listen_fd_.get(), kTagListen}, std::pair{admin_fd_.get(), kTagAdminListen}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return absl::InternalError(absl::StrCat("epoll_ctl ADD: ", base::ErrnoText(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status ServerImpl::WritePidFileAndLog() {
  const size_t pool_bytes = RpcPoolBytes(opt_.max_clients, opt_.rpc_credits);
  if (!opt_.pid_file.empty()) {
    if (absl::Status s = WritePidFile(opt_.pid_file); !s.ok()) return s;
  }
  LOG(INFO) << "kvnode generation " << opt_.generation << " (" << opt_.build_id << ") listening on "
            << listen_addr_ << ", admin socket " << admin_path_ << ", max_clients "
            << opt_.max_clients << " x " << opt_.rpc_credits << " RPC credits, RPC pool "
            << pool_bytes << " bytes";
  return absl::OkStatus();
}

}  // namespace kvnode::server
