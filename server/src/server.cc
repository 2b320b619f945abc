// The control thread and the process life cycle. See server.h and
// docs/server.md.
#include "kvnode/server/server.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "data_plane.h"
#include "kvnode/base/errno.h"
#include "kvnode/proto/frame_io.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/rdma/accounting.h"
#include "kvnode/rdma/device.h"
#include "kvnode/rdma/errors.h"
#include "kvnode/rdma/memory.h"
#include "kvnode/rdma/mr.h"
#include "kvnode/rdma/pd.h"
#include "kvnode/server/admin.h"
#include "kvnode/server/control_session.h"
#include "kvnode/server/rpc_handler.h"
#include "kvnode/storage/limits.h"
#include "kvnode/storage/store.h"
#include "net.h"
#include "task_queue.h"

namespace kvnode::server {
namespace {

// epoll tags. Control connections use their id (>= kFirstConnId); admin
// connections their id with kAdminBit set.
constexpr uint64_t kTagListen = 1;
constexpr uint64_t kTagAdminListen = 2;
constexpr uint64_t kTagSignal = 3;
constexpr uint64_t kTagTasks = 4;
constexpr uint64_t kTagDeviceEvents = 5;
constexpr uint64_t kFirstConnId = 16;
constexpr uint64_t kAdminBit = uint64_t{1} << 63;
// A client that does not read its control connection gets cut once this
// much is queued for it.
constexpr size_t kMaxControlOutBytes = 1 << 20;
constexpr absl::Duration kAdminTimeout = absl::Seconds(5);

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

// One control connection (a client session's TCP side). Control thread only.
struct Conn {
  uint64_t id = 0;
  int fd = -1;
  std::string peer;
  ControlSession session;
  absl::Time accepted;
  absl::Time last_rx;
  absl::Time last_keepalive;
  uint64_t client_id = 0;
  bool data_session = false;  // a DataPlane session exists (or is being made)
  bool ready = false;
  bool move_pending = false;
  bool want_write = false;  // EPOLLOUT registered
  uint64_t nonce = 0;

  explicit Conn(ControlConfig c) : session(std::move(c)) {}
};

struct AdminConn {
  uint64_t id = 0;
  int fd = -1;
  std::string in;
  std::string out;
  absl::Time deadline;
  bool answered = false;  // request parsed; `out` is (or will be) the answer
  bool want_write = false;
};

class ServerImpl {
 public:
  explicit ServerImpl(const ServerOptions& o) : opt_(o) {}
  ~ServerImpl();

  absl::Status Init(InheritedSockets inherited);
  // Live upgrade, new side: everything but the sockets and RocksDB.
  absl::Status InitForTakeover(const std::function<absl::Status()>& after_attach);
  absl::Status CompleteTakeover(InheritedSockets inherited);
  absl::Status Run();

  // Pieces of Init, in order.
  absl::Status InitSignalsAndAuth();
  absl::Status InitSockets(InheritedSockets inherited);
  absl::Status InitDevice();
  absl::Status InitRegistrationAndDataPlane();
  absl::Status InitEpoll();
  absl::Status AddSocketsToEpoll();
  absl::Status WritePidFileAndLog();

  // --- control thread ---------------------------------------------------------
  void Accept();
  void AcceptAdmin();
  void OnConnReadable(Conn& c);
  void OnConnEvents(Conn& c, std::vector<ControlSession::Event>& events);
  void FlushConn(Conn& c);
  void CloseConn(Conn& c, bool vanished);
  void OnAdminReadable(AdminConn& a);
  void AnswerAdmin(AdminConn& a);
  void FlushAdmin(AdminConn& a);
  void CloseAdmin(AdminConn& a);
  void OnSignal();
  void Timers();
  void StartDrain(AdminConn& a, const AdminRequest& req);
  size_t DrainingClients() const;
  void Shutdown();
  StatsView Stats() const;
  Conn* FindConn(uint64_t id) {
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second.get();
  }

  const ServerOptions opt_;
  std::string auth_token_;
  std::string admin_path_;
  storage::StoreOptions store_options_;
  absl::Time started_ = absl::Now();
  std::atomic<bool> shutdown_requested_{false};
  std::atomic<bool> handed_off_{false};
  std::atomic<bool> upgrade_in_progress_{false};
  std::atomic<bool> writes_paused_{false};
  // Admin `drain`: no new sessions; Timers() shuts the node down once no
  // client is left or at drain_deadline_ (control thread only).
  std::atomic<bool> draining_{false};
  absl::Time drain_deadline_ = absl::InfiniteFuture();
  bool accepting_ = true;
  // Set by Server::SetUpgradeHandler (bound to the owning Server).
  std::function<void(std::optional<std::string>, std::function<void(std::string)>)>
      upgrade_handler_;
  std::function<void(uint64_t)> on_move_ack_;
  std::function<std::vector<ExtraStat>()> extra_stats_;
  std::function<void()> before_deregister_;
  std::function<bool()> shutdown_hook_;

  // Sockets and event loop.
  int listen_fd_ = -1;
  int admin_fd_ = -1;
  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  std::string listen_addr_;
  std::unique_ptr<TaskQueue> control_tasks_;

  // Verbs objects and storage, declared in creation order (the explicit
  // Shutdown() releases them in reverse: data plane (QPs, windows, CQ) ->
  // RPC pool MR -> arena MR -> PD; then RocksDB closed; then the device).
  Metrics metrics_;
  std::shared_ptr<rdma::Device> device_;
  std::unique_ptr<storage::Store> store_;
  std::unique_ptr<StoreBackend> backend_;
  std::shared_ptr<rdma::Pd> pd_;
  std::shared_ptr<rdma::Mr> arena_mr_;
  rdma::HostMemory pool_mem_;
  std::shared_ptr<rdma::Mr> pool_mr_;
  bool use_windows_ = false;
  std::unique_ptr<DataPlane> data_;

  absl::flat_hash_map<uint64_t, std::unique_ptr<Conn>> conns_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<AdminConn>> admins_;
  uint64_t next_conn_id_ = kFirstConnId;
  uint64_t pending_creates_ = 0;  // Hellos sent to the data plane, not answered
};

ServerImpl::~ServerImpl() {
  // Normally Shutdown() released everything; this covers a failed Init.
  if (data_ != nullptr) data_->Shutdown();
  data_.reset();
  for (auto& [id, c] : conns_) close(c->fd);
  for (auto& [id, a] : admins_) close(a->fd);
  if (signal_fd_ >= 0) close(signal_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (listen_fd_ >= 0) close(listen_fd_);
  if (admin_fd_ >= 0) close(admin_fd_);
}

absl::Status ServerImpl::Init(InheritedSockets inherited) {
  if (absl::Status s = InitSignalsAndAuth(); !s.ok()) return s;
  // Sockets first: a second node on the same port fails before it touches
  // the device or the database.
  if (absl::Status s = InitSockets(inherited); !s.ok()) return s;
  if (absl::Status s = InitDevice(); !s.ok()) return s;

  // Storage (opens RocksDB; re-attaches a clean arena or rebuilds it).
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::unique_ptr<storage::Store>> store = storage::Store::Open(store_options_);
  if (!store.ok()) return store.status();
  store_ = std::move(*store);
  backend_ = std::make_unique<StoreBackend>(store_.get(), opt_.rpc_credits);
  const storage::StoreStats ss = store_->stats();
  LOG(INFO) << "store " << opt_.db_path << ": " << storage::OpenedAsName(store_->opened_as())
            << " in " << absl::FormatDuration(absl::Now() - t0) << ", " << ss.keys << " keys ("
            << ss.resident_keys << " resident), arena " << store_->arena().path() << " "
            << store_->arena_size() << " bytes, generation " << ss.generation;

  // The arena exists now (this start created, rebuilt or claimed it: it is
  // dirty either way). A start that fails from here on removes its name, so
  // that it does not hold tmpfs memory until someone notices (existing
  // mappings, the MR's included, stay valid until torn down).
  absl::Status s = InitRegistrationAndDataPlane();
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
  if (s.ok()) s = InitEpoll();
  if (s.ok()) s = AddSocketsToEpoll();
  if (s.ok()) s = WritePidFileAndLog();
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
  if (absl::Status s = InitDevice(); !s.ok()) return s;
  const absl::Time t1 = absl::Now();
  if (absl::Status s = InitRegistrationAndDataPlane(); !s.ok()) return s;
  LOG(INFO) << "takeover: arena registered in " << absl::FormatDuration(absl::Now() - t1);
  return InitEpoll();
}

absl::Status ServerImpl::CompleteTakeover(InheritedSockets inherited) {
  const absl::Time t0 = absl::Now();
  if (absl::Status s = store_->OpenDb(); !s.ok()) return s;
  LOG(INFO) << "takeover: RocksDB " << opt_.db_path << " opened in "
            << absl::FormatDuration(absl::Now() - t0);
  // The dedupe records persisted with the writes: all a new process has when
  // the old one died before HandOver (with HandOver, ImportSessions then
  // replaces them by the old process's table). The data thread does not run
  // yet: this thread owns the data plane.
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
  signal_fd_ = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd_ < 0)
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
  return absl::OkStatus();
}

absl::Status ServerImpl::InitSockets(InheritedSockets inherited) {
  if (inherited.listen_fd >= 0) {
    if (absl::Status s = CheckListening(inherited.listen_fd, "listen"); !s.ok()) return s;
    listen_fd_ = inherited.listen_fd;
  } else {
    absl::StatusOr<int> fd = ListenTcp(opt_.listen);
    if (!fd.ok()) return fd.status();
    listen_fd_ = *fd;
  }
  listen_addr_ = SockName(listen_fd_);
  if (opt_.admin_socket.empty()) {
    absl::StatusOr<std::string> p = DefaultAdminSocketPath();
    if (!p.ok()) return p.status();
    admin_path_ = *p;
  } else {
    admin_path_ = opt_.admin_socket;
  }
  if (inherited.admin_fd >= 0) {
    if (absl::Status s = CheckListening(inherited.admin_fd, "admin"); !s.ok()) return s;
    admin_fd_ = inherited.admin_fd;
  } else {
    if (!opt_.admin_socket.empty()) {
      // The default path's directory is checked by DefaultAdminSocketPath.
      if (absl::Status s = EnsureAdminSocketDir(admin_path_); !s.ok()) return s;
    }
    absl::StatusOr<int> fd = ListenUnix(admin_path_);
    if (!fd.ok()) return fd.status();
    admin_fd_ = *fd;
  }
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

  DataPlaneConfig dc;
  dc.max_clients = opt_.max_clients;
  dc.credits = opt_.rpc_credits;
  dc.dedupe_window = opt_.dedupe_window;
  dc.max_client_records = opt_.max_client_records;
  dc.use_windows = use_windows_;
  dc.spin_us = opt_.spin_us;
  dc.drain_timeout = std::min(absl::Seconds(2), opt_.shutdown_timeout);
  DataPlaneResources res{
      device_, pd_, arena_mr_, pool_mr_, pool_mem_.bytes(), store_->arena_size()};
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
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0)
    return absl::InternalError(absl::StrCat("epoll_create1: ", base::ErrnoText(errno)));
  auto add = [this](int fd, uint64_t tag) -> absl::Status {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return absl::InternalError(absl::StrCat("epoll_ctl ADD: ", base::ErrnoText(errno)));
    }
    return absl::OkStatus();
  };
  for (auto [fd, tag] :
       {std::pair{signal_fd_, kTagSignal}, std::pair{control_tasks_->fd(), kTagTasks},
        std::pair{device_->context()->async_fd, kTagDeviceEvents}}) {
    if (absl::Status s = add(fd, tag); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ServerImpl::AddSocketsToEpoll() {
  for (auto [fd, tag] :
       {std::pair{listen_fd_, kTagListen}, std::pair{admin_fd_, kTagAdminListen}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
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

absl::Status ServerImpl::Run() {
  data_->Start();
  std::array<epoll_event, 64> evs;
  while (!shutdown_requested_.load(std::memory_order_acquire)) {
    const int n = epoll_wait(epoll_fd_, evs.data(), static_cast<int>(evs.size()), 100);
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
  while (read(signal_fd_, &si, sizeof(si)) == sizeof(si)) {
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
          upgrade_handler_(std::nullopt,
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
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
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
    auto c = std::make_unique<Conn>(ControlConfig{auth_token_});
    c->id = next_conn_id_++;
    c->fd = fd;
    c->peer = PeerName(fd);
    c->accepted = c->last_rx = c->last_keepalive = absl::Now();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
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
    const ssize_t n = recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      c.last_rx = absl::Now();
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
      if (!accepting_ || shutdown_requested_.load() || draining_.load()) {
        c.session.Goodbye(proto::GoodbyeReason::kShutdown,
                          draining_.load() ? "node is draining: not accepting new sessions"
                                           : "node is not accepting sessions");
        continue;
      }
      // Admission happens on the data thread (CreateSession): it frees a
      // client slot when it tears a session down, and it runs tasks in the
      // order they were posted, so a slot freed by a connection that closed
      // before this Hello is always seen as free.
      ++pending_creates_;
      c.data_session = true;
      const uint64_t requested = h->hello.client_id;
      const ResumeSecret secret = h->hello.resume_secret;
      VLOG(1) << "Hello from " << c.peer << " (" << h->hello.client_name << "), client id "
              << requested;
      data_->Post([this, id, requested, secret, peer = c.peer] {
        absl::StatusOr<SessionSetup> setup = data_->CreateSession(id, requested, secret, peer);
        control_tasks_->Post([this, id, setup = std::move(setup)]() mutable {
          --pending_creates_;
          Conn* c = FindConn(id);
          if (c == nullptr) {
            if (setup.ok()) data_->Post([this, id] { data_->CloseSession(id, "connection gone"); });
            return;
          }
          if (setup.ok() && setup->replaced_conn.has_value()) {
            if (Conn* old = FindConn(*setup->replaced_conn); old != nullptr) {
              old->data_session = false;
              old->session.Goodbye(proto::GoodbyeReason::kReplaced,
                                   "a newer session of this client id took over");
              LOG(INFO) << "client " << old->client_id << " (" << old->peer
                        << ") replaced by a new session from " << c->peer;
              CloseConn(*old, false);
            }
          }
          if (!setup.ok()) {
            c->data_session = false;
            if (setup.status().code() == absl::StatusCode::kResourceExhausted) {
              metrics_.Error(ErrorKind::kTooManyClients);
              c->session.Fail(proto::ErrorCode::kTooManyClients,
                              std::string(setup.status().message()));
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
            // Not proof of an attack (the id may have aged out), but never
            // another client's state: the Hello starts afresh.
            metrics_.Error(ErrorKind::kResumeRefused);
            LOG(WARNING) << "Hello from " << c->peer << " asked to resume a client id it did not "
                         << "prove it owns (unknown id or wrong resume secret): new client "
                         << setup->client_id;
          }
          c->client_id = setup->client_id;
          proto::Welcome w;
          w.client_id = setup->client_id;
          w.resume_secret = setup->secret;
          w.server_generation = opt_.generation;
          w.features = 0;
          w.server_qp = setup->qp;
          w.server_qp.port = static_cast<uint8_t>(device_->port());
          w.rkey = setup->rkey;
          w.arena_remote_addr = arena_mr_->iova();
          w.arena_size = store_->arena_size();
          w.max_rpc_credits = opt_.rpc_credits;
          w.max_rpc_message_size = static_cast<uint32_t>(proto::kMaxRpcMessageSize);
          w.max_key_size = static_cast<uint32_t>(storage::kMaxKeySize);
          w.max_value_size = static_cast<uint32_t>(storage::kMaxValueSize);
          w.index_geometry = store_->geometry().Encode();
          if (absl::Status s = c->session.SendWelcome(w); !s.ok()) {
            LOG(ERROR) << "Welcome for " << c->peer << ": " << s;
            metrics_.Error(ErrorKind::kSessionSetup);
            CloseConn(*c, false);
            return;
          }
          FlushConn(*c);
        });
      });
    } else if (auto* q = std::get_if<ControlSession::ClientQpEvent>(&ev)) {
      const proto::QpInfo qp = q->qp;
      data_->Post([this, id, qp] {
        absl::Status st = data_->ConnectSession(id, qp);
        control_tasks_->Post([this, id, st] {
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
          c->last_keepalive = absl::Now();
          metrics_.Add(Counter::kSessionsAccepted);
          LOG(INFO) << "session ready: client " << c->client_id << " (" << c->peer << ", "
                    << c->session.client_name() << ")";
          FlushConn(*c);
        });
      });
    } else if (auto* m = std::get_if<ControlSession::MoveAckEvent>(&ev)) {
      (void)m;
      if (c.move_pending) {
        c.move_pending = false;
        if (on_move_ack_) on_move_ack_(c.client_id);
      }
    } else if (auto* cl = std::get_if<ControlSession::ClosedEvent>(&ev)) {
      if (cl->error.has_value()) {
        metrics_.Error(*cl->error);
        LOG(WARNING) << "client " << c.client_id << " (" << c.peer
                     << "): " << ErrorKindName(*cl->error) << ": " << cl->why;
      } else {
        VLOG(1) << "client " << c.client_id << " (" << c.peer << "): " << cl->why;
      }
    }
  }
  if (Conn* still = FindConn(id); still != nullptr && still->session.closed()) {
    CloseConn(*still, false);
  }
}

void ServerImpl::FlushConn(Conn& c) {
  std::string& out = c.session.out();
  while (!out.empty()) {
    const ssize_t n = send(c.fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
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
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
    c.want_write = want;
  }
}

void ServerImpl::CloseConn(Conn& c, bool vanished) {
  // Best effort for what is queued (an Error or Goodbye frame): the socket
  // buffer takes a small frame at once.
  std::string& out = c.session.out();
  if (!vanished && !out.empty()) {
    (void)send(c.fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  close(c.fd);
  const uint64_t id = c.id;
  if (c.data_session) {
    std::string why = vanished ? "control connection lost" : "control connection closed";
    data_->Post([this, id, why] { data_->CloseSession(id, why); });
  }
  if (c.move_pending) {
    LOG(WARNING) << "client " << c.client_id << " went away before acknowledging Move";
  }
  conns_.erase(id);
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
    if (opt_.keepalive_interval <= absl::ZeroDuration()) continue;
    if (now - c->last_rx > opt_.keepalive_interval * opt_.keepalive_misses) {
      LOG(WARNING) << "client " << c->client_id << " (" << c->peer << "): nothing received for "
                   << absl::FormatDuration(now - c->last_rx) << " (" << opt_.keepalive_misses
                   << " keepalives missed); cut";
      metrics_.Error(ErrorKind::kKeepaliveTimeout);
      c->session.Goodbye(proto::GoodbyeReason::kIdleTimeout, "keepalive timeout");
      CloseConn(*c, false);
      continue;
    }
    if (now - c->last_keepalive >= opt_.keepalive_interval) {
      c->last_keepalive = now;
      if (c->session.SendKeepalive(++c->nonce).ok()) FlushConn(*c);
    }
  }
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

void ServerImpl::AcceptAdmin() {
  for (;;) {
    const int fd = accept4(admin_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
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
    a->fd = fd;
    a->deadline = absl::Now() + kAdminTimeout;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = a->id;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      continue;
    }
    admins_.emplace(a->id, std::move(a));
  }
}

void ServerImpl::OnAdminReadable(AdminConn& a) {
  if (a.answered) {
    // Only EOF/HUP is expected now; drain and ignore.
    char sink[256];
    while (recv(a.fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
    }
    return;
  }
  char buf[1024];
  for (;;) {
    const ssize_t n = recv(a.fd, buf, sizeof(buf), MSG_DONTWAIT);
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
      a.out = AdminPingAnswer(opt_.generation, getpid(), listen_addr_);
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
      upgrade_handler_(req->args.empty() ? std::nullopt : std::optional(req->args[0]), reply_later);
      return;
    case AdminCommand::kDrain:
      StartDrain(a, *req);
      break;
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
    const ssize_t n = send(a.fd, a.out.data(), a.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
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
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, a.fd, &ev);
        a.want_write = true;
      }
      return;
    }
    break;  // peer gone
  }
  if (a.answered) CloseAdmin(a);
}

void ServerImpl::CloseAdmin(AdminConn& a) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, a.fd, nullptr);
  close(a.fd);
  admins_.erase(a.id);
}

StatsView ServerImpl::Stats() const {
  StatsView v;
  v.uptime_s = absl::ToDoubleSeconds(absl::Now() - started_);
  v.pid = getpid();
  v.generation = opt_.generation;
  v.build_id = opt_.build_id;
  v.clients = data_ != nullptr ? data_->ready_sessions() : 0;
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
  }
  v.upgrade_in_progress = upgrade_in_progress_.load();
  v.writes_paused = writes_paused_.load();
  v.draining = draining_.load();
  if (extra_stats_) v.extra = extra_stats_();
  return v;
}

// --- shutdown -----------------------------------------------------------------

void ServerImpl::Shutdown() {
  const absl::Time t0 = absl::Now();
  const absl::Time deadline = t0 + opt_.shutdown_timeout;
  LOG(INFO) << "shutdown: " << conns_.size() << " control connections, " << data_->live_sessions()
            << " sessions";
  // 1. Stop accepting.
  if (listen_fd_ >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
    close(listen_fd_);
    listen_fd_ = -1;
  }
  // 2. Goodbye to every client (best effort, bounded), then close.
  for (auto& [id, c] : conns_) {
    c->session.Goodbye(proto::GoodbyeReason::kShutdown, "node shutting down");
    const std::string& out = c->session.out();
    (void)proto::WriteAll(c->fd, proto::AsBytes(out),
                          std::min(deadline, absl::Now() + absl::Milliseconds(200)));
    close(c->fd);
  }
  conns_.clear();
  for (auto& [id, a] : admins_) close(a->fd);
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
  if (admin_fd_ >= 0) {
    close(admin_fd_);
    admin_fd_ = -1;
    if (!handed_off_.load()) unlink(admin_path_.c_str());
  }
  if (!opt_.pid_file.empty() && !handed_off_.load()) unlink(opt_.pid_file.c_str());
  LOG(INFO) << "shutdown took " << absl::FormatDuration(absl::Now() - t0);
}

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
absl::Status Server::FlushDb() { return impl_->store_->FlushDb(); }
void Server::SetExtraStats(std::function<std::vector<ExtraStat>()> f) {
  impl_->extra_stats_ = std::move(f);
}
void Server::SetBeforeDeregister(std::function<void()> f) {
  impl_->before_deregister_ = std::move(f);
}
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
  impl_->upgrade_handler_ = [this, h = std::move(handler)](std::optional<std::string> binary,
                                                           std::function<void(std::string)> reply) {
    h(*this, std::move(binary), std::move(reply));
  };
}
void Server::RunOnControlThread(std::function<void()> task) {
  impl_->control_tasks_->Post(std::move(task));
}
int Server::listen_fd() const { return impl_->listen_fd_; }
int Server::admin_fd() const { return impl_->admin_fd_; }
void Server::StopAccepting() {
  ServerImpl& s = *impl_;
  if (!s.accepting_) return;
  s.accepting_ = false;
  epoll_ctl(s.epoll_fd_, EPOLL_CTL_DEL, s.listen_fd_, nullptr);
  epoll_ctl(s.epoll_fd_, EPOLL_CTL_DEL, s.admin_fd_, nullptr);
}
void Server::ResumeAccepting() {
  ServerImpl& s = *impl_;
  if (s.accepting_) return;
  s.accepting_ = true;
  for (auto [fd, tag] :
       {std::pair{s.listen_fd_, kTagListen}, std::pair{s.admin_fd_, kTagAdminListen}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    epoll_ctl(s.epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
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
absl::Status Server::CloseDbForHandoff() { return impl_->store_->CloseDbForHandoff(); }
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
void Server::ExportSessions(std::function<void(std::vector<ClientRecordExport>)> done) {
  ServerImpl* s = impl_.get();
  s->data_->Post([s, done = std::move(done)] {
    s->control_tasks_->Post([done, r = s->data_->ExportRecords()] { done(r); });
  });
}
void Server::ImportSessions(std::vector<ClientRecordExport> records) {
  // Before Run(): the data thread does not exist yet, so this thread owns it.
  impl_->data_->ImportRecords(records);
}
void Server::MarkHandedOff() { impl_->handed_off_.store(true); }
void Server::SetUpgradeInProgress(bool in_progress) {
  impl_->upgrade_in_progress_.store(in_progress);
}

}  // namespace kvnode::server
