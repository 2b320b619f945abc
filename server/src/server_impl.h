// ServerImpl: the state of a running node and the control thread's
// methods, shared by the files that implement them (private to server/):
//   server_init.cc    Init and its steps, the takeover variants
//   control_loop.cc   Run: the epoll loop, control connections, timers
//   admin_endpoint.cc the admin socket and its requests
//   server.cc         Shutdown and the Server facade
#ifndef KVNODE_SERVER_SRC_SERVER_IMPL_H_
#define KVNODE_SERVER_SRC_SERVER_IMPL_H_

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
#include <future>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "data_plane.h"
#include "kvnode/base/errno.h"
#include "kvnode/base/unique_fd.h"
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
#include "kvnode/server/liveness.h"
#include "kvnode/server/metrics_http.h"
#include "kvnode/server/rpc_handler.h"
#include "kvnode/server/server.h"
#include "kvnode/storage/limits.h"
#include "kvnode/storage/store.h"
#include "net.h"
#include "task_queue.h"

namespace kvnode::server {

// epoll tags. Control connections use their id (>= kFirstConnId); admin
// connections their id with kAdminBit set.
inline constexpr uint64_t kTagListen = 1;
inline constexpr uint64_t kTagAdminListen = 2;
inline constexpr uint64_t kTagSignal = 3;
inline constexpr uint64_t kTagTasks = 4;
inline constexpr uint64_t kTagDeviceEvents = 5;
inline constexpr uint64_t kFirstConnId = 16;
inline constexpr uint64_t kAdminBit = uint64_t{1} << 63;
// A client that does not read its control connection gets cut once this
// much is queued for it.
inline constexpr size_t kMaxControlOutBytes = 1 << 20;
inline constexpr absl::Duration kAdminTimeout = absl::Seconds(5);

// One control connection (a client session's TCP side). Control thread only.
struct Conn {
  uint64_t id = 0;
  base::UniqueFd fd;
  std::string peer;
  ControlSession session;
  absl::Time accepted;
  absl::Time hello_at;  // the handshake's steps, for the "session ready" log line
  absl::Time welcome_at;
  absl::Time client_qp_at;
  Liveness liveness;
  uint64_t client_id = 0;
  bool data_session = false;  // a DataPlane session exists (or is being made)
  bool ready = false;
  bool move_pending = false;
  bool client_done = false;  // said Goodbye{client done}: its dedupe record goes too
  bool want_write = false;   // EPOLLOUT registered
  uint64_t nonce = 0;

  Conn(ControlConfig c, Liveness l) : session(std::move(c)), liveness(l) {}
};

// The node's guard (guard.cc). Control thread only.
struct GuardRaised {
  uint32_t acknowledged = 0;  // sessions that acknowledged the Guard
  uint32_t cut = 0;           // sessions cut instead (no slot words, late, mid-handshake)
};
using GuardDone = std::function<void(absl::StatusOr<GuardRaised>)>;
struct GuardState {
  bool up = false;
  uint64_t nonce = 0;                     // of the last Guard sent
  absl::flat_hash_set<uint64_t> waiting;  // conn ids whose GuardAck is due
  absl::Time deadline;                    // then the waiting are cut
  uint64_t finish_seq = 0;                // FinishGuard's latest round trip
  uint32_t acked = 0;
  uint32_t cut = 0;
  std::vector<GuardDone> done;  // RaiseGuard callers not answered yet
};

struct AdminConn {
  uint64_t id = 0;
  base::UniqueFd fd;
  std::string in;
  std::string out;
  absl::Time deadline;
  bool answered = false;  // request parsed; `out` is (or will be) the answer
  bool peer_eof = false;  // answered, and the client sent EOF: closed at its hang-up
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
  absl::Status CompleteSwitch(InheritedSockets inherited, uint64_t last_version);
  absl::Status Run();

  // Pieces of Init, in order.
  absl::Status InitSignalsAndAuth();
  absl::Status InitSockets(InheritedSockets inherited);
  absl::Status InitMetricsSocket(int inherited_fd);
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
  // One method per session event; a step the data thread does in between
  // (CreateSession, ConnectSession) answers to the On... method after it.
  void OnHello(Conn& c, const proto::Hello& hello);
  void OnSessionCreated(uint64_t id, absl::StatusOr<SessionSetup> setup);
  void CloseReplaced(uint64_t old_id, const Conn& by);
  proto::Welcome MakeWelcome(const SessionSetup& setup, uint64_t hello_features) const;
  // kFeatureShardMap when this node has a shard gate and `hello_features`
  // asks for it, and then kFeatureSlotWords too when asked for.
  uint64_t SessionFeatures(uint64_t hello_features) const;
  void OnClientQp(Conn& c, const proto::QpInfo& qp);
  // A cluster node that is the arena's writer: makes the slot-words table
  // when the arena has none (cold start, a takeover from a build without
  // it) and hands it to the data plane. A failure is logged: the node then
  // serves without offering kFeatureSlotWords.
  void EnsureSlotWords();
  void OnQpConnected(uint64_t id, const absl::Status& st, absl::Time connected_at);
  void OnMoveAck(Conn& c);
  // --- the guard (guard.cc; docs/cluster.md "Slot migration") --------------
  // What a Welcome or Guard tells a client with slot words: check them below
  // this map epoch (kGuardUp while the guard is up, else the node's epoch).
  uint64_t CheckBelowEpoch() const;
  // Tells every session to check the slot words and answers `done` once
  // each has acknowledged or been cut (its QP gone): then no client READs
  // this node's arena unchecked until LowerGuard. A session without slot
  // words, or one in its handshake, is cut at once; one that does not
  // acknowledge within `ack_timeout` is cut then.
  void RaiseGuard(absl::Duration ack_timeout, GuardDone done);
  // Clients on maps older than the node's go on checking; the rest stop.
  void LowerGuard();
  // Why a live upgrade must wait (the guard is up), or nullopt.
  std::optional<std::string> GuardBlocksUpgrade() const;
  void OnGuardAck(Conn& c, uint64_t nonce);
  void GuardLeft(uint64_t conn_id);  // a connection closed
  void GuardTimers(absl::Time now);
  void CutForGuard(Conn& c, std::string_view why);
  void FinishGuard();
  // Shard map (ServerOptions::shard_gate): the current map to one ready
  // session that negotiated kFeatureShardMap (nothing while there is none),
  // and to all of them after a Publish.
  void SendShardMap(Conn& c);
  void OnShardMapPublished();
  void OnClosed(Conn& c, const ControlSession::ClosedEvent& closed);
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
  // The metrics endpoint (--metrics_listen): started at Run, paused by
  // StopAccepting, resumed by ResumeAccepting, stopped at shutdown. Its
  // scrapes are rendered on this thread, as `kvctl metrics` is.
  void StartMetricsHttp();
  void StopMetricsHttp();
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
  std::function<void(Server::UpgradeRequest, std::function<void(std::string)>)> upgrade_handler_;
  std::function<void(uint64_t)> on_move_ack_;
  std::function<std::vector<ExtraStat>()> extra_stats_;
  std::function<void()> before_deregister_;
  std::function<void()> before_shutdown_;
  std::function<bool()> shutdown_hook_;

  // Sockets and event loop.
  base::UniqueFd listen_fd_;
  bool listen_pending_ = false;  // bound by a cold start, listen() once it can serve
  base::UniqueFd admin_fd_;
  base::UniqueFd epoll_fd_;
  base::UniqueFd signal_fd_;
  std::string listen_addr_;
  base::UniqueFd metrics_fd_;  // --metrics_listen: bound or inherited; -1 without
  std::string metrics_addr_;
  std::unique_ptr<TaskQueue> control_tasks_;
  // Control thread only (and destroyed after Run, before the task queue).
  std::unique_ptr<MetricsHttpServer> metrics_http_;

  // Verbs objects and storage, declared in creation order (the explicit
  // Shutdown() releases them in reverse: data plane (QPs, windows, CQ) ->
  // RPC pool MR -> arena MR -> PD; then RocksDB closed; then the device).
  Metrics metrics_;
  std::shared_ptr<rdma::Device> device_;
  std::unique_ptr<storage::Store> store_;
  // Live upgrade, new side: Store::PrepareJournal, started by
  // InitForTakeover beside the registration (joined before store_ goes).
  std::future<absl::Status> journal_prep_;
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
  uint64_t pending_creates_ = 0;     // Hellos sent to the data plane, not answered
  uint64_t pushed_map_version_ = 0;  // the gate's version last pushed to every session
  GuardState guard_;
};

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_SRC_SERVER_IMPL_H_
