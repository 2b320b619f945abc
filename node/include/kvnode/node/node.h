// The live-upgrade state machines of a kvnode process (docs/upgrade.md):
//
//   OldSide  installed in every serving process: answers SIGUSR2 and the admin
//            `upgrade [BINARY]`, runs the old side O of one upgrade at a time
//            on an upgrade thread (spawn N, wait for Hello/Ready, pause
//            writes, close RocksDB, HandOver, wait for Owned, move clients),
//            rolls back on any failure before Owned, and, once Server::Run
//            returned after a handoff, sends Gone (FinishAfterRun).
//   TakeOver the new side N, called by main() when --upgrade_handoff is set:
//            validates the header, says Hello, attaches and registers the
//            arena, sends Ready, waits for HandOver (or O's death), opens
//            RocksDB, adopts the sockets and sessions, sends Owned. It
//            returns a Server ready to Run() and a NewSideTail that waits,
//            in the background, for O's Gone and exit.
//
// This is a library of its own (kvnode::node, in node/) on top of the server and the
// upgrade foundation, so that the server does not depend on the upgrade
// protocol and the foundation does not depend on the server (docs/upgrade.md
// section 10 says why).
//
// Thread safety: OldSide's handler runs on the server's control thread and
// starts at most one upgrade thread; FinishAfterRun is called by main() after
// Run() returned. UpgradeMetrics may be read from any thread.
#ifndef KVNODE_UPGRADE_NODE_H_
#define KVNODE_UPGRADE_NODE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "kvnode/server/admin.h"
#include "kvnode/server/options.h"
#include "kvnode/server/server.h"
#include "kvnode/upgrade/channel.h"
#include "kvnode/upgrade/header.h"
#include "kvnode/upgrade/messages.h"
#include "kvnode/upgrade/process.h"

namespace kvnode::upgrade {

// A cluster member's part in its live upgrades and shutdown (implemented by
// the node's cluster agent, node/src/cluster_agent.h). The member key's lease
// passes from O to N in HandOver, so that the key is never deleted across an
// upgrade (docs/upgrade.md, "The cluster lease"). None of these blocks on
// etcd.
//
// Thread safety: any thread (the upgrade thread, the watchdog, the control
// thread).
class ClusterMember {
 public:
  virtual ~ClusterMember() = default;
  // O: an upgrade starts (member state "upgrading").
  virtual void UpgradeStarted() = 0;
  // O, right before it sends HandOver: stops renewing the member's lease and
  // returns its id for HandOver.cluster_lease (0: not registered). From here
  // O writes nothing to etcd or to the persisted map unless it rolls back.
  virtual int64_t HandOffLease() = 0;
  // O: the upgrade rolled back: renews the lease again if it was handed off
  // (a new one if it expired), state "serving".
  virtual void UpgradeRolledBack() = 0;
  // N, at HandOver (or when O died before it): starts the etcd session with
  // O's `lease` (0: a new one), still describing O (`old_generation`,
  // `old_pid`, `old_build`), state "upgrading", at `endpoint`.
  virtual void TakeOverStarted(int64_t lease, uint64_t old_generation, int64_t old_pid,
                               const std::string& old_build, const std::string& endpoint) = 0;
  // N, Owned sent: the member key names this process and `generation`.
  virtual void TookOver(uint64_t generation) = 0;
  // N: the old process released RocksDB (it moved every client first) or is
  // gone, before N's own RocksDB open, which clients do not see: state
  // "serving".
  virtual void UpgradeFinished() = 0;
  // SIGTERM/SIGINT is stopping the node: state "draining" (nothing once the
  // lease was handed off).
  virtual void ShutdownStarted() = 0;
};

// Deadlines and identity of a node's upgrades (docs/upgrade.md section 5).
struct NodeUpgradeOptions {
  // Binary the next upgrade execs (ResolveStartBinary(argv[0]) or
  // --upgrade_binary). Default "": upgrades are refused.
  std::string binary = "";
  // The node's argv as started (argv[0] included). Default empty: refused.
  std::vector<std::string> argv;
  // This binary's compatibility (after ApplyTestIncompatibility).
  // Default: the foundation's, with the arena fields unset (Validate fails).
  Compat compat;
  // Build identification, for Hello and logs. Default "".
  std::string build_id = "";
  // The arena's shm name (the handoff header is "/<name>.handoff"). Default "".
  std::string shm_name = "";
  // The node's cluster membership (not owned; outlives the OldSide and
  // NewSideTail). Default null: not a cluster member, HandOver carries no
  // lease and kCapClusterLease is not required of N.
  ClusterMember* cluster = nullptr;

  absl::Duration exec_deadline = absl::Seconds(10);       // default 10 s
  absl::Duration hello_deadline = absl::Seconds(30);      // default 30 s
  absl::Duration ready_deadline = absl::Seconds(60);      // default 60 s
  absl::Duration pause_deadline = absl::Seconds(10);      // writes in flight; default 10 s
  absl::Duration owned_deadline = absl::Seconds(30);      // default 30 s
  absl::Duration move_deadline = absl::Seconds(5);        // MoveAck per client; default 5 s
  absl::Duration handover_deadline = absl::Seconds(120);  // N waits for HandOver; default 120 s
  // N, after Owned: O must have said Gone and exited by then, else N
  // SIGKILLs it (its clients then reconnect to N). Default 30 s.
  absl::Duration old_exit_deadline = absl::Seconds(30);
  // O: steps of the upgrade thread without a deadline of their own (the
  // memtable pre-flush, closing RocksDB, calls onto the control thread).
  // Default 30 s.
  absl::Duration step_deadline = absl::Seconds(30);
  // O: longest write pause. Every wait after the pause is cut to it; without
  // Owned by then O rolls back and resumes writes. Default 20 s.
  absl::Duration write_pause_limit = absl::Seconds(20);
  // O's watchdog: fires when the upgrade thread is this long past the
  // deadline of its current step (before Owned), and rolls back in its place.
  // Default 2 s.
  absl::Duration watchdog_grace = absl::Seconds(2);
  // A watchdog rollback not done by then (e.g. RocksDB's close hangs): O exits
  // with kWatchdogExitCode, so that N, if alive, or a restart takes over.
  // Default 20 s.
  absl::Duration watchdog_rollback_deadline = absl::Seconds(20);
  // Sending one small handoff message (Hello, Ready, Owned, Gone). Default 5 s.
  absl::Duration send_deadline = absl::Seconds(5);
  // O: sending the session table and HandOver (capped by the pause limit).
  // Default 10 s.
  absl::Duration handover_send_deadline = absl::Seconds(10);
  // O: a task on the server's control thread (stop/resume accepting, resume
  // writes, export the sessions). Default 5 s.
  absl::Duration control_task_deadline = absl::Seconds(5);
  // Killing and reaping the other process (N on a rollback, O after
  // old_exit_deadline). Default 10 s.
  absl::Duration kill_deadline = absl::Seconds(10);

  [[nodiscard]] absl::Status Validate() const;
};

// Upgrade metrics: monotonic counters (carried across upgrades with the
// counters of the handoff, under "upgrade.<name>") and the phase durations of
// the last upgrade ("upgrade.last_us.<phase>", replaced, not added).
class UpgradeMetrics {
 public:
  enum Count : int {
    kRefused = 0,          // requests refused (one already running, bad binary)
    kClientsMigrated,      // MoveAck received
    kClientsCut,           // no MoveAck by the deadline
    kMrBytesRegistered,    // arena bytes registered anew by a new process
    kMrBytesImported,      // arena bytes imported (ibv_import_mr)
    kRkeyChanges,          // upgrades after which the arena rkey differed
    kTakeoversAlone,       // N took over from an O that died before HandOver
    kOldKilled,            // N killed an O that overran old_exit_deadline
    kIncompatibleRefused,  // N refused the header (rolled back)
    kWatchdogRollbacks,    // O's watchdog rolled back for a stuck upgrade thread
    kCanceled,             // upgrades canceled by SIGTERM/SIGINT (rolled back)
    kCountEnd,
  };
  static const char* Name(Count c);

  void Add(Count c, uint64_t n = 1) { counts_[c].fetch_add(n, std::memory_order_relaxed); }
  uint64_t Get(Count c) const { return counts_[c].load(std::memory_order_relaxed); }
  // Phase (or "total", "write_pause") duration of the current/last upgrade.
  void SetLast(const std::string& name, absl::Duration d);
  void ClearLast();

  // Appends "upgrade.*" counters and "upgrade.last_us.*" to `out`.
  void ExportTo(std::vector<std::pair<std::string, uint64_t>>* out) const;
  // Takes "upgrade.*" entries: counters are added, last_us.* replaced.
  void ImportFrom(const std::vector<std::pair<std::string, uint64_t>>& in);
  // For stats/metrics (Server::SetExtraStats).
  std::vector<server::ExtraStat> Render() const;
  // The last upgrade's phases for a log line: "name=ms name=ms ...", by name.
  std::string LastPhasesText() const;

 private:
  std::atomic<uint64_t> counts_[kCountEnd] = {};
  mutable absl::Mutex mu_;
  std::map<std::string, uint64_t> last_us_ ABSL_GUARDED_BY(mu_);
};

// Exit code of an old process that could not roll back: its watchdog did not
// finish in time, or RocksDB could not be taken back (the new process claimed
// and wrote to it, or it failed to reopen), so writes must not resume here.
inline constexpr int kWatchdogExitCode = 5;

// Compat of this build (storage's layout constants), with
// --upgrade_test_incompatible applied when `test_incompatible` is not empty.
[[nodiscard]] absl::StatusOr<Compat> NodeCompat(const std::string& test_incompatible);

class OldSide {
 public:
  OldSide(server::Server* server, NodeUpgradeOptions options, UpgradeMetrics* metrics);
  ~OldSide();
  OldSide(const OldSide&) = delete;
  OldSide& operator=(const OldSide&) = delete;

  // Server::SetUpgradeHandler + SetExtraStats + SetBeforeDeregister. Before Run().
  void Install();

  // Call after Server::Run() returned with `run_status`. After a handoff:
  // sends Gone (moved/cut, counter delta), fires o_exit, removes the header
  // and returns 0 (or 3 if the run was unclean). Otherwise returns the exit
  // code for `run_status` (0 / 3). Joins the upgrade thread when it ended.
  int FinishAfterRun(const absl::Status& run_status);

  // Starts a live upgrade to `binary` as the admin request `upgrade --wait
  // BINARY` does (a fleet roll's intent): `reply` gets the same answer line,
  // at the outcome or the refusal. Any thread; the request runs on the
  // control thread.
  void Request(std::string binary, std::function<void(std::string)> reply);

  // True while an upgrade runs here (requests are refused). A new process
  // hands it to its NewSideTail, so that it refuses until O is gone.
  std::atomic<bool>* busy_flag() { return &busy_; }

 private:
  struct Attempt;
  struct SentRecords;
  void OnRequest(server::Server::UpgradeRequest request, std::function<void(std::string)> reply);
  void RunUpgrade(std::shared_ptr<Attempt> a);
  // The upgrade thread's work until the point of no return, one method per
  // step in this order; an error from any of them rolls back.
  absl::Status Handoff(std::shared_ptr<Attempt> ap);
  absl::Status SpawnNewProcess(Attempt& a);
  absl::Status AwaitHelloAndReady(Attempt& a);
  absl::Status SendIdleSessions(Attempt& a);
  absl::Status PauseWritesAndReleaseDb(const std::shared_ptr<Attempt>& ap);
  absl::Status SendHandOver(const std::shared_ptr<Attempt>& ap);
  absl::Status AwaitOwned(Attempt& a);
  // Past the point of no return: cannot fail.
  void MoveClients(Attempt& a);
  void CloseDbAndSayReleased(Attempt& a);
  // Exports client records (Server::ExportSessions) and sends them in
  // Sessions messages, in step `step`.
  absl::StatusOr<SentRecords> SendRecords(Attempt& a, const char* step, uint64_t changed_after,
                                          bool with_live);
  // Records how long the phase that ends now took, for `kvctl stats`.
  void Mark(Attempt& a, const char* name);
  // Enters step `name` with options_.step_deadline.
  absl::Status LocalStep(Attempt& a, const char* name);
  // The next message from N (upgrade thread only).
  absl::StatusOr<ReceivedMessage> Receive(Attempt& a, absl::Time deadline);
  // The same, which must be a T (`name`); N's Abort is an error.
  template <typename T>
  absl::StatusOr<T> ReceiveAs(Attempt& a, absl::Time deadline, const char* name);
  // Undoes whatever the attempt did before Owned. By the upgrade thread, or
  // by the watchdog when that thread is stuck (then the order of the steps
  // changes so that N can still take over if O has to exit).
  void Rollback(Attempt& a, const absl::Status& why, bool by_watchdog);
  // The outcome's figures known to every path (generations, pids, builds).
  server::UpgradeOutcome OutcomeOf(Attempt& a, pid_t child_pid);
  // Answers the attempt's waiting admin request, if any (once), and returns
  // when the control thread has written it.
  void Report(Attempt& a, const server::UpgradeOutcome& o);
  // One per attempt: fires when the upgrade thread overruns the deadline of
  // its current step, rolls back in its place (bounded), or exits.
  void Watchdog(std::shared_ptr<Attempt> a);
  // SIGTERM/SIGINT on the control thread (Server::SetShutdownHook).
  bool OnShutdownSignal();
  // OnShutdownSignal's answer when no upgrade defers the shutdown: false,
  // the cluster member told first.
  bool ShutdownNow();
  // Joins the threads of a finished attempt; detaches an abandoned (stuck)
  // upgrade thread instead.
  void ReapThreads();

  server::Server* const server_;
  const NodeUpgradeOptions options_;
  UpgradeMetrics* const metrics_;
  std::atomic<bool> busy_{false};
  std::atomic<bool> handed_off_{false};
  std::thread thread_;
  std::thread watchdog_;
  absl::Mutex mu_;
  // The current or last attempt (shared with its threads).
  std::shared_ptr<Attempt> current_ ABSL_GUARDED_BY(mu_);
  // Valid once handed off; used by FinishAfterRun.
  std::shared_ptr<Attempt> done_;
};

// What main() keeps after TakeOver: waits for O's Gone and exit in the
// background, then marks the upgrade finished.
class NewSideTail {
 public:
  ~NewSideTail();
  // Starts the waiting thread; *busy is true until O is gone. Call right
  // before Server::Run(). The server's shutdown calls Stop() first.
  void Start(std::atomic<bool>* busy);
  // Stops the waiting thread and joins it (idempotent); runs on the control
  // thread at the start of the server's shutdown, which frees the store the
  // thread would open. A wait for O's Released is given up: O, if still
  // alive, is killed (it would keep RocksDB's lock from the next start) and
  // RocksDB is not opened here; the write journal stays, and the next start
  // replays it. An open already under way is waited for; once RocksDB is
  // open here, O (which released it) is left to finish alone.
  void Stop();

 private:
  friend absl::StatusOr<std::pair<std::unique_ptr<server::Server>, std::unique_ptr<NewSideTail>>>
  TakeOver(server::ServerOptions, const std::string&, const NodeUpgradeOptions&, UpgradeMetrics*);
  NewSideTail() = default;
  // Waits for O's Released (then opens RocksDB), Gone and exit.
  void Wait();
  // Opens RocksDB and replays the write journal (Server::OpenDbAfterSwitch),
  // once; exits the process when it cannot (a restart replays the journal).
  void OpenDb();
  // Wait()'s end once Stop() was called: kills an O that has not released
  // RocksDB (and waits for its exit); leaves the journal to the next start.
  void LeaveForShutdown();
  bool stopping();

  server::Server* server_ = nullptr;
  UpgradeMetrics* metrics_ = nullptr;
  ClusterMember* cluster_ = nullptr;
  std::optional<HandoffChannel> channel_;
  std::optional<Process> old_;
  std::string header_name_;
  absl::Duration old_exit_deadline;
  absl::Duration kill_deadline;  // after a SIGKILL, for the exit
  // After Owned, RocksDB must be open here by then (watchdog_ exits if not).
  absl::Duration db_open_deadline;
  absl::Notification db_open_;
  std::thread watchdog_;
  absl::Time started_;
  bool alone_ = false;  // O died before HandOver: nothing to wait for
  std::atomic<bool>* busy_ = nullptr;
  std::thread thread_;
  // Stop() sets it and shuts the channel down to wake a Receive; the thread
  // resets channel_ under mu_ so that Stop never touches a closed fd.
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

// The new side. `handoff_flag` is --upgrade_handoff's value ("FD:PID").
// `options.generation` is replaced by the header's + 1. On an error that
// leaves O in charge (incompatible header, O aborted, deadline), the caller
// exits non-zero without touching anything: RocksDB was never opened here.
// On an error after O died before HandOver nothing serves: the error carries
// ColdStartGeneration, and the caller starts again cold with it.
absl::StatusOr<std::pair<std::unique_ptr<server::Server>, std::unique_ptr<NewSideTail>>> TakeOver(
    server::ServerOptions options, const std::string& handoff_flag,
    const NodeUpgradeOptions& upgrade, UpgradeMetrics* metrics);

// The generation a TakeOver that failed after O's death would have served
// as; nullopt for every other error (O is alive and serves).
std::optional<uint64_t> ColdStartGeneration(const absl::Status& takeover_error);

}  // namespace kvnode::upgrade

#endif  // KVNODE_UPGRADE_NODE_H_
