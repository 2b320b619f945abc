// The kvnode server: one object per process that owns the device, the
// Store, the arena and RPC-pool MRs, the control listener, the admin socket
// and the two threads (docs/server.md):
//
//   control thread (the caller of Run): epoll over the listener, every
//     control connection, the admin socket, a signalfd (SIGTERM, SIGINT,
//     SIGUSR2) and its task queue; handshakes, keepalives, admin answers;
//   data-plane thread: the shared CQ with a completion channel, every client
//     QP and window, RPC handling, the dedupe records.
//
// Life cycle: Create() (binds or adopts sockets, opens device and Store,
// registers memory) -> Run() (serves until SIGTERM/SIGINT or
// RequestShutdown(); then stops accepting, says Goodbye, tears every session
// down in the safe order, deregisters MRs, closes RocksDB, checks the verbs
// accounting) -> destroy.
//
// Hooks for the live upgrade (docs/upgrade.md) are below "Upgrade hooks".
// Unless a comment says otherwise they must be called on the control thread,
// i.e. from an UpgradeHandler or a task given to RunOnControlThread().
#ifndef KVNODE_SERVER_SERVER_H_
#define KVNODE_SERVER_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvnode/proto/control.h"
#include "kvnode/server/admin.h"
#include "kvnode/server/dedupe.h"
#include "kvnode/server/metrics.h"
#include "kvnode/server/options.h"

namespace kvnode::server {

class ServerImpl;

// Sockets a new process adopts instead of binding (live upgrade). -1 = bind.
struct InheritedSockets {
  int listen_fd = -1;  // a listening TCP socket
  int admin_fd = -1;   // a listening Unix stream socket at options.admin_socket
  // A listening TCP socket at options.metrics_listen (ignored and closed
  // when that is empty).
  int metrics_fd = -1;
};

class Server {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Server>> Create(
      const ServerOptions& options, InheritedSockets inherited = {});

  // Live upgrade, new side, in two steps while the old process still serves:
  // CreateForTakeover maps the live arena (Store::AttachLive, reads no data),
  // runs `after_attach` (an error aborts), opens the device and registers the
  // arena and the RPC pool; no socket, no RocksDB. Then, before Run, either
  // CompleteSwitch (the old process handed over): adopts the inherited
  // sockets and becomes the writer by journal (Store::BecomeJournalWriter,
  // versions from `last_version`; PrepareJournal must have run), RocksDB
  // opened later by OpenDbAfterSwitch (any thread, while serving);
  // or CompleteTakeover (the old process died before handing over): opens
  // RocksDB (Store::OpenDb), loads the dedupe records and adopts the inherited
  // sockets (or binds --listen / --admin_socket where a fd is -1).
  // Both write the pid file.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Server>> CreateForTakeover(
      const ServerOptions& options, std::function<absl::Status()> after_attach = {});
  // Waits for the write journal CreateForTakeover started to allocate
  // beside the registration (Store::PrepareJournal); once.
  [[nodiscard]] absl::Status PrepareJournal();
  [[nodiscard]] absl::Status CompleteSwitch(InheritedSockets inherited, uint64_t last_version);
  [[nodiscard]] absl::Status OpenDbAfterSwitch();
  [[nodiscard]] absl::Status CompleteTakeover(InheritedSockets inherited);

  // The arena registration (any thread, after Create).
  struct ArenaInfo {
    uint32_t rkey = 0;              // the arena MR's rkey
    uint64_t remote_addr = 0;       // iova of arena offset 0
    uint64_t registered_bytes = 0;  // MR length
    uint64_t arena_size = 0;        // mapping size
    uint64_t arena_id = 0;          // ArenaHeader::arena_id
  };
  ArenaInfo arena_info() const;
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves on the calling thread (it becomes the control thread) until
  // shutdown. OK only for a clean shutdown: every session torn down, RocksDB
  // closed, no verbs object leaked (rdma::Accounting::CheckNoLeaks).
  [[nodiscard]] absl::Status Run();

  // Any thread, any number of times.
  void RequestShutdown();
  // "host:port" actually bound (port resolved when --listen had port 0).
  std::string listen_address() const;
  // Where a live upgrade's Move sends clients: AdvertisedEndpoint() of
  // --advertise_address and listen_address() (options.h).
  [[nodiscard]] absl::StatusOr<std::string> advertised_endpoint() const;
  const std::string& admin_socket_path() const;
  uint64_t generation() const;
  Metrics& metrics();

  // --- Upgrade hooks (the live upgrade, docs/upgrade.md) ---------------------
  // Called on the control thread for SIGUSR2 (binary = nullopt) and for the
  // admin command `upgrade [--wait] [BINARY]`; `reply` (call once, any
  // thread) takes the admin answer line (JSON + '\n'): at the start, or with
  // `wait` at the outcome (the admin connection is then kept open without a
  // deadline: the handler's own deadlines bound it); for SIGUSR2 it only
  // logs. Without a handler, `upgrade` is answered {"ok":false,"error":"not
  // implemented yet"}.
  struct UpgradeRequest {
    std::optional<std::string> binary;  // nullopt: the node's --upgrade_binary
    bool wait = false;
  };
  using UpgradeHandler = std::function<void(Server& server, UpgradeRequest request,
                                            std::function<void(std::string)> reply)>;
  void SetUpgradeHandler(UpgradeHandler handler);  // before Run()
  // Why a live upgrade must not start now (the node's guard is up: a slot
  // migration is moving slots away from it), or nullopt. Control thread.
  std::optional<std::string> UpgradeBlocker() const;

  // --- The guard (docs/cluster.md "Slot migration", protocol.md 1.5) -------
  // Control thread (RunOnControlThread), a cluster node. RaiseGuard tells
  // every session to check the slot words and answers `done` once each has
  // acknowledged or been cut (at `ack_timeout`), or with why it could not
  // (not a cluster node, a live upgrade under way). LowerGuard: clients on
  // maps older than the node's go on checking, the rest stop.
  void RaiseGuard(absl::Duration ack_timeout, std::function<void(absl::Status)> done);
  void LowerGuard();

  // Runs `task` on the control thread. Any thread.
  void RunOnControlThread(std::function<void()> task);

  // The listening sockets, for passing with SCM_RIGHTS (still owned here).
  int listen_fd() const;
  int admin_fd() const;
  // -1 without --metrics_listen.
  int metrics_fd() const;
  // "host:port" the metrics endpoint is bound to; "" without one.
  std::string metrics_address() const;
  // Stops accepting control connections, admin requests and metrics
  // scrapes (fds stay open; a scrape waits in the backlog for whichever
  // process accepts next).
  void StopAccepting();
  // Resumes accepting (rollback).
  void ResumeAccepting();
  // New PUT/DELETE are answered BUSY once `done` runs (on the control thread):
  // every write received before was applied and answered.
  void PauseWrites(std::function<void()> done);
  void ResumeWrites(std::function<void()> done);
  // Any thread. Store::ReleaseDbForHandoff / CloseReleasedDb /
  // ReopenDbAfterFailedHandoff / last_version: the arena stays mapped and
  // registered; READs and resident GETs keep working.
  [[nodiscard]] absl::Status ReleaseDbForHandoff();
  [[nodiscard]] absl::Status CloseReleasedDb();
  [[nodiscard]] absl::Status ReopenDbAfterFailedHandoff();
  uint64_t last_version() const;
  // Sends Move to every Ready client; `on_ack(client_id)` runs on the control
  // thread for each MoveAck received. Returns how many Moves were sent.
  size_t SendMoveToAll(const proto::Move& move, std::function<void(uint64_t)> on_ack);
  // Ready sessions that have not acknowledged the last Move.
  size_t PendingMoveAcks() const;
  // Session table (client ids + dedupe windows), taken on the data thread
  // at one instant; `done` runs on the control thread. The records of
  // clients with a live session (when `with_live`) and of every other client
  // whose record changed after `changed_after` (0: all), and every id held.
  void ExportSessions(uint64_t changed_after, bool with_live,
                      std::function<void(RecordsExport)> done);
  // Before Run(): adopt records of the previous process; each replaces any
  // record of its id adopted before.
  void ImportSessions(const std::vector<ClientRecordExport>& records);
  // Before Run(): keep only the records of `client_ids`. DataLoss when one
  // of them has none.
  absl::Status RetainSessions(const std::vector<uint64_t>& client_ids);
  // Counters: metrics().Export() / metrics().Import() (monotonic across
  // upgrades). Marks the process as handed off: at shutdown it neither
  // closes RocksDB (it released it) nor removes the arena, the pid
  // file or the admin socket path (they belong to the new process now).
  void MarkHandedOff();
  void SetUpgradeInProgress(bool in_progress);
  // Before Run(): extra rows for `stats` (object "upgrade") and `metrics`,
  // gathered on the control thread at each request.
  void SetExtraStats(std::function<std::vector<ExtraStat>()> f);
  // Before shutdown: runs at shutdown after every session is drained and
  // destroyed, before the MRs are deregistered (the upgrade's o_dereg phase).
  void SetBeforeDeregister(std::function<void()> f);
  // Before Run(): runs on the control thread first thing at shutdown, while
  // the store and the sessions still serve. Whatever uses the store from
  // another thread (a live upgrade's waiter, which opens RocksDB once the
  // old process releases it) must stop there: the shutdown then closes and
  // frees the store.
  void SetBeforeShutdown(std::function<void()> f);
  // Before Run(): called on the control thread for SIGTERM/SIGINT. Returning
  // true defers the shutdown: the hook's owner calls RequestShutdown() once
  // it is safe (an upgrade in progress finishes or rolls back first).
  void SetShutdownHook(std::function<bool()> hook);

 private:
  explicit Server(std::unique_ptr<ServerImpl> impl);
  std::unique_ptr<ServerImpl> impl_;
};

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_SERVER_H_
