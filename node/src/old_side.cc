// The old side O of a live upgrade (docs/upgrade.md section 2): one upgrade
// thread per request, talking to the server through its control thread, and
// one watchdog thread per attempt that rolls back in its place when it is
// stuck (section 3, "Watchdog").
#include <glog/logging.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "kvnode/node/node.h"
#include "kvnode/proto/control.h"
#include "kvnode/server/dedupe.h"
#include "kvnode/upgrade/fault.h"
#include "kvnode/upgrade/sd_notify.h"
#include "node_internal.h"

namespace kvnode::upgrade {

// One upgrade attempt, shared by the upgrade thread and the watchdog.
//
// Ownership rule: until `resolved`, only the upgrade thread acts. The first
// of {Owned received, the thread's own rollback, the watchdog} sets
// `resolved` (under mu) and owns the outcome. The watchdog also sets
// `abandoned`: from then on the upgrade thread (stuck, or merely late) must
// not change anything; every side effect it still has pending checks that
// flag first, under mu, on the control thread (tasks run in order, so a
// stale task runs before the watchdog's undo or is skipped), or under
// db_step_mu (RocksDB).
struct OldSide::Attempt {
  std::string binary;
  absl::Time t0;
  absl::Time phase_start;  // upgrade thread only
  uint64_t new_generation = 0;
  std::string header_name;
  absl::Time paused_at;  // upgrade thread only
  // Client records sent ahead of HandOver (upgrade thread only): the
  // Sessions messages so far, and the change mark of the records sent
  // before the pause.
  uint32_t session_chunks = 0;
  uint64_t presend_mark = 0;
  std::vector<std::pair<std::string, uint64_t>> counters_at_handover;
  uint64_t moved = 0;
  uint64_t cut = 0;
  absl::Time dereg_start;
  pid_t child_pid = 0;  // the new process; upgrade thread only

  // Set BEFORE the action they stand for, so that a rollback undoes whatever
  // may have happened; every undo is harmless when nothing happened.
  std::atomic<bool> paused{false};
  std::atomic<bool> stopped_accepting{false};
  bool db_released ABSL_GUARDED_BY(db_step_mu) = false;
  // Held by the upgrade thread across "check abandoned + release RocksDB", by
  // the rollback across "take RocksDB back".
  absl::Mutex db_step_mu;

  absl::Mutex mu;
  std::optional<HandoffChannel> channel ABSL_GUARDED_BY(mu);
  std::optional<Process> child ABSL_GUARDED_BY(mu);
  std::string step ABSL_GUARDED_BY(mu) = "start";
  // The current step must be done by then (InfiniteFuture: not watched).
  absl::Time lease ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
  // Writes paused at + write_pause_limit (InfiniteFuture until the pause).
  absl::Time pause_limit_at ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
  bool handover_sending ABSL_GUARDED_BY(mu) = false;  // N may own RocksDB
  bool owned ABSL_GUARDED_BY(mu) = false;             // the point of no return passed
  bool resolved ABSL_GUARDED_BY(mu) = false;
  bool abandoned ABSL_GUARDED_BY(mu) = false;
  bool finished ABSL_GUARDED_BY(mu) = false;  // outcome complete: nothing of it runs
  bool cancel ABSL_GUARDED_BY(mu) = false;    // SIGTERM/SIGINT: roll back, then shut down
  // A waiting `kvctl upgrade` (admin `upgrade --wait`): answered once, at the
  // point of no return or at the rollback (Report). Empty otherwise.
  std::function<void(std::string)> reply ABSL_GUARDED_BY(mu);
  std::string new_build ABSL_GUARDED_BY(mu);  // from N's Hello

  bool Abandoned() {
    absl::MutexLock l(&mu);
    return abandoned;
  }
  // `d` capped at the pause limit once writes are paused.
  absl::Time Cap(absl::Time d) {
    absl::MutexLock l(&mu);
    return std::min(d, pause_limit_at);
  }
  // Enters step `name`, which must be done by `deadline` (capped at the pause
  // limit). Fails when the watchdog took over or a cancel must be honoured.
  absl::Status Step(const char* name, absl::Time deadline) {
    absl::MutexLock l(&mu);
    if (abandoned) return absl::AbortedError("the upgrade watchdog took over");
    if (cancel && !handover_sending) return absl::CancelledError("canceled by a shutdown signal");
    step = name;
    lease = std::min(deadline, pause_limit_at);
    return absl::OkStatus();
  }
};

// What SendRecords sent.
struct OldSide::SentRecords {
  size_t records = 0;                // records sent
  size_t messages = 0;               // Sessions messages they took
  uint64_t mark = 0;                 // server::RecordsExport::mark
  std::vector<uint64_t> client_ids;  // of every record held
};

namespace {

std::string JsonAnswer(bool ok, const std::string& text) {
  std::string esc;
  for (char c : text) {
    if (c == '"' || c == '\\') esc.push_back('\\');
    esc.push_back(c == '\n' ? ' ' : c);
  }
  return ok ? absl::StrCat("{\"ok\":true,\"upgrade\":\"", esc, "\"}\n")
            : absl::StrCat("{\"ok\":false,\"error\":\"", esc, "\"}\n");
}

}  // namespace

OldSide::OldSide(server::Server* server, NodeUpgradeOptions options, UpgradeMetrics* metrics)
    : server_(server), options_(std::move(options)), metrics_(metrics) {}

OldSide::~OldSide() { ReapThreads(); }

void OldSide::ReapThreads() {
  std::shared_ptr<Attempt> a;
  {
    absl::MutexLock l(&mu_);
    a = current_;
  }
  bool abandoned = false;
  if (a != nullptr) abandoned = a->Abandoned();
  if (thread_.joinable()) {
    if (abandoned) {
      // Stuck for good as far as we know; it holds the attempt alive and
      // will not act on it (abandoned).
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  if (watchdog_.joinable()) watchdog_.join();
}

void OldSide::Install() {
  server_->SetUpgradeHandler([this](server::Server&, server::Server::UpgradeRequest request,
                                    std::function<void(std::string)> reply) {
    OnRequest(std::move(request), std::move(reply));
  });
  server_->SetExtraStats([this] { return metrics_->Render(); });
  server_->SetShutdownHook([this] { return OnShutdownSignal(); });
  server_->SetBeforeDeregister([this] {
    if (!handed_off_.load() || done_ == nullptr) return;
    Attempt& a = *done_;
    const absl::Time now = absl::Now();
    metrics_->SetLast("o_drain", now - a.phase_start);
    if (absl::Status s = MaybeInjectFault(Phase::kODereg); !s.ok()) {
      LOG(WARNING) << "upgrade: " << s << " (past the point of no return: deregistering anyway)";
    }
    a.dereg_start = absl::Now();
  });
}

bool OldSide::OnShutdownSignal() {
  std::shared_ptr<Attempt> a;
  {
    absl::MutexLock l(&mu_);
    a = current_;
  }
  if (a == nullptr) return ShutdownNow();
  absl::MutexLock l(&a->mu);
  if (a->finished) return ShutdownNow();  // no upgrade running
  a->cancel = true;
  if (a->owned) {
    // N serves now and O is on its way out: the signal meant "stop the
    // node", so N gets it too (systemd's MAINPID may not have moved yet).
    if (a->child.has_value()) {
      LOG(INFO) << "upgrade: shutdown requested after the point of no return: passing it on to "
                << "the new process " << a->child->pid();
      (void)a->child->Signal(SIGTERM);
    }
    return true;  // O's own shutdown follows the handoff (RunUpgrade requests it)
  }
  if (!a->handover_sending && a->channel.has_value()) {
    // Wake a wait for Hello/Ready at once; the upgrade thread then rolls back.
    ::shutdown(a->channel->fd(), SHUT_RDWR);
  }
  LOG(WARNING) << "upgrade: shutdown requested during the upgrade (step " << a->step
               << "): rolling it back first";
  return true;
}

bool OldSide::ShutdownNow() {
  if (options_.cluster != nullptr) options_.cluster->ShutdownStarted();
  return false;
}

void OldSide::Request(std::string binary, std::function<void(std::string)> reply) {
  server_->RunOnControlThread([this, binary = std::move(binary), reply = std::move(reply)] {
    OnRequest(server::Server::UpgradeRequest{binary, /*wait=*/true}, reply);
  });
}

void OldSide::OnRequest(server::Server::UpgradeRequest request,
                        std::function<void(std::string)> reply) {
  const std::optional<std::string>& binary = request.binary;
  if (std::optional<std::string> why = server_->UpgradeBlocker(); why.has_value()) {
    metrics_->Add(UpgradeMetrics::kRefused);
    LOG(WARNING) << "upgrade: refused: " << *why;
    reply(JsonAnswer(false, *why));
    return;
  }
  if (busy_.exchange(true)) {
    metrics_->Add(UpgradeMetrics::kRefused);
    LOG(WARNING) << "upgrade: refused: an upgrade is already in progress";
    reply(JsonAnswer(false, "an upgrade is already in progress"));
    return;
  }
  std::string path = options_.binary;
  if (binary.has_value()) {
    absl::StatusOr<std::string> p = CheckUpgradeBinary(*binary);
    if (!p.ok()) {
      busy_.store(false);
      metrics_->Add(UpgradeMetrics::kRefused);
      LOG(WARNING) << "upgrade: refused: " << p.status();
      reply(JsonAnswer(false, std::string(p.status().message())));
      return;
    }
    path = *p;
  } else if (absl::Status s = CheckUpgradeBinary(path).status(); path.empty() || !s.ok()) {
    busy_.store(false);
    metrics_->Add(UpgradeMetrics::kRefused);
    LOG(WARNING) << "upgrade: refused: no usable binary ('" << path << "'): " << s;
    reply(JsonAnswer(false, absl::StrCat("no usable upgrade binary '", path, "'")));
    return;
  }
  ReapThreads();  // the previous attempt is finished (busy_ was false)
  LOG(INFO) << "upgrade: starting, binary " << path << ", generation " << server_->generation()
            << " -> " << server_->generation() + 1;
  auto a = std::make_shared<Attempt>();
  if (request.wait) {
    // Report() answers at the outcome. No other thread has `a` yet, but the
    // lock analysis cannot know that.
    absl::MutexLock l(&a->mu);
    a->reply = std::move(reply);
  } else {
    reply(JsonAnswer(
        true, absl::StrCat("started: ", path, " as generation ", server_->generation() + 1)));
  }
  a->binary = std::move(path);
  a->t0 = a->phase_start = absl::Now();
  a->new_generation = server_->generation() + 1;
  {
    absl::MutexLock l(&mu_);
    current_ = a;
  }
  // Set here, on the control thread, so that nothing this thread does next
  // (a guard raised for a slot migration) can slip in before the upgrade.
  server_->SetUpgradeInProgress(true);
  watchdog_ = std::thread([this, a] { Watchdog(a); });
  thread_ = std::thread([this, a] { RunUpgrade(a); });
}

void OldSide::RunUpgrade(std::shared_ptr<Attempt> ap) {
  Attempt& a = *ap;
  metrics_->ClearLast();
  (void)SdNotifyReloading();
  if (options_.cluster != nullptr) options_.cluster->UpgradeStarted();
  absl::Status s = Handoff(ap);
  if (!s.ok()) {
    {
      absl::MutexLock l(&a.mu);
      if (a.resolved) {
        // The watchdog owns the outcome (and has rolled back or exited).
        LOG(WARNING) << "upgrade: the upgrade thread resumed after the watchdog took over (" << s
                     << "); it leaves everything to the watchdog's rollback";
        return;
      }
      a.resolved = true;
    }
    Rollback(a, s, /*by_watchdog=*/false);
    return;
  }
  // Past the point of no return: O now drains, deregisters and exits
  // (Server::Run returns; main calls FinishAfterRun).
  a.phase_start = absl::Now();
  done_ = ap;
  server_->RequestShutdown();
}

absl::Status OldSide::Handoff(std::shared_ptr<Attempt> ap) {
  Attempt& a = *ap;
  if (absl::Status s = SpawnNewProcess(a); !s.ok()) return s;
  if (absl::Status s = AwaitHelloAndReady(a); !s.ok()) return s;
  if (absl::Status s = SendIdleSessions(a); !s.ok()) return s;
  if (absl::Status s = PauseWritesAndReleaseDb(ap); !s.ok()) return s;
  if (absl::Status s = SendHandOver(ap); !s.ok()) return s;
  if (absl::Status s = AwaitOwned(a); !s.ok()) return s;
  MoveClients(a);
  CloseDbAndSayReleased(a);
  if (absl::Status s = MaybeInjectFault(Phase::kODrain); !s.ok()) {
    LOG(WARNING) << "upgrade: " << s << " (past the point of no return: draining anyway)";
  }
  return absl::OkStatus();
}

void OldSide::Mark(Attempt& a, const char* name) {
  const absl::Time now = absl::Now();
  metrics_->SetLast(name, now - a.phase_start);
  a.phase_start = now;
}

absl::Status OldSide::LocalStep(Attempt& a, const char* name) {
  return a.Step(name, absl::Now() + options_.step_deadline);
}

absl::StatusOr<ReceivedMessage> OldSide::Receive(Attempt& a, absl::Time deadline) {
  // Only the upgrade thread reads the channel; the watchdog or a shutdown
  // signal may shut it down to wake us.
  HandoffChannel* ch;
  {
    absl::MutexLock l(&a.mu);
    ch = &*a.channel;
  }
  absl::StatusOr<ReceivedMessage> m = ch->Receive(deadline);
  absl::MutexLock l(&a.mu);
  if (a.cancel && !a.handover_sending) return absl::CancelledError("canceled by a shutdown signal");
  return m;
}

template <typename T>
absl::StatusOr<T> OldSide::ReceiveAs(Attempt& a, absl::Time deadline, const char* name) {
  absl::StatusOr<ReceivedMessage> m = Receive(a, deadline);
  if (!m.ok()) return WithContext(m.status(), absl::StrCat("waiting for ", name));
  if (const Abort* ab = std::get_if<Abort>(&m->message)) {
    return absl::AbortedError(absl::StrCat("new process aborted: ", ab->message));
  }
  T* t = std::get_if<T>(&m->message);
  if (t == nullptr) return UnexpectedMessage(m->message, name);
  return std::move(*t);
}

// Writes the handoff header and starts the new binary with its end of the
// channel.
absl::Status OldSide::SpawnNewProcess(Attempt& a) {
  absl::StatusOr<std::string> hname = HandoffHeaderShmName(options_.shm_name);
  if (!hname.ok()) return hname.status();
  a.header_name = *hname;
  const server::Server::ArenaInfo ai = server_->arena_info();
  HandoffHeader h = HandoffHeader::For(options_.compat);
  h.capabilities = kCapSessionTable | kCapCounters;
  if (options_.cluster != nullptr) {
    // N must carry the member's lease on: one that cannot refuses here,
    // before anything is disturbed.
    h.capabilities |= kCapClusterLease;
    h.required_capabilities |= kCapClusterLease;
  }
  h.arena_size = ai.arena_size;
  h.arena_id = ai.arena_id;
  h.generation = server_->generation();
  h.o_pid = static_cast<uint32_t>(getpid());
  h.created_unix_ns = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  h.arena_shm_name = options_.shm_name;
  h.build_id = options_.build_id.substr(0, kMaxBuildIdSize);
  if (absl::Status s = LocalStep(a, "o_spawn"); !s.ok()) return s;
  if (absl::Status s = WriteHandoffHeader(a.header_name, h); !s.ok()) return s;
  if (absl::Status s = MaybeInjectFault(Phase::kOSpawn); !s.ok()) return s;
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  if (!pair.ok()) return pair.status();
  SpawnRequest req;
  req.binary = a.binary;
  req.argv = options_.argv;
  // N binds this address itself if O dies before HandOver (a --listen with
  // port 0 would otherwise pick another port).
  req.argv.push_back(absl::StrCat("--listen=", server_->listen_address()));
  if (!server_->metrics_address().empty()) {
    req.argv.push_back(absl::StrCat("--metrics_listen=", server_->metrics_address()));
  }
  if (absl::Status s = a.Step("o_spawn", absl::Now() + options_.exec_deadline); !s.ok()) return s;
  absl::StatusOr<Process> child = SpawnWithHandoff(req, std::move(pair->child_end));
  if (!child.ok()) return child.status();
  a.child_pid = child->pid();
  {
    absl::MutexLock l(&a.mu);
    a.channel.emplace(std::move(pair->parent));
    a.channel->SetPeerPid(a.child_pid);
    a.child.emplace(std::move(*child));
    // The watchdog's rollback (if it fired during the exec) kills and reaps
    // the child: it reads `child` under mu after the spawn returned... or
    // not at all; then we do it here.
    if (a.abandoned) {
      (void)a.child->KillAndReap(absl::Now() + options_.kill_deadline);
      return absl::AbortedError("the upgrade watchdog took over during the spawn");
    }
  }
  LOG(INFO) << "upgrade: spawned " << a.binary << " as pid " << a.child_pid;
  Mark(a, "o_spawn");
  return absl::OkStatus();
}

// Waits for the new process's Hello (is it the one we started, for this
// generation?) and Ready (the arena registered or imported). Nothing is paused.
absl::Status OldSide::AwaitHelloAndReady(Attempt& a) {
  const server::Server::ArenaInfo ai = server_->arena_info();
  absl::Time deadline = absl::Now() + options_.hello_deadline;
  if (absl::Status s = a.Step("n_hello", deadline); !s.ok()) return s;
  absl::StatusOr<ReceivedMessage> m = Receive(a, deadline);
  if (!m.ok()) return WithContext(m.status(), "waiting for Hello");
  if (const Abort* ab = std::get_if<Abort>(&m->message)) {
    if (ab->code == static_cast<uint32_t>(AbortCode::kIncompatible)) {
      metrics_->Add(UpgradeMetrics::kIncompatibleRefused);
    }
    return absl::AbortedError(absl::StrCat("new process refused: ", ab->message));
  }
  const Hello* hello = std::get_if<Hello>(&m->message);
  if (hello == nullptr) return UnexpectedMessage(m->message, "Hello");
  if (static_cast<pid_t>(hello->pid) != a.child_pid || hello->generation != a.new_generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("Hello from pid ", hello->pid, " generation ", hello->generation,
                     ", expected pid ", a.child_pid, " generation ", a.new_generation));
  }
  // Versions are not compared (the header's layout and protocol versions
  // decide); the log says which version replaces which.
  LOG(INFO) << "upgrade: Hello from pid " << hello->pid << ", version " << options_.build_id
            << " -> " << hello->build_id;
  {
    absl::MutexLock l(&a.mu);
    a.new_build = hello->build_id;
  }
  deadline = absl::Now() + options_.ready_deadline;
  if (absl::Status s = a.Step("n_ready", deadline); !s.ok()) return s;
  absl::StatusOr<Ready> ready = ReceiveAs<Ready>(a, deadline, "Ready");
  if (!ready.ok()) return ready.status();
  if (ready->arena_id != ai.arena_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("Ready names arena ", ready->arena_id, ", ours is ", ai.arena_id));
  }
  if (ready->rkey != ai.rkey) metrics_->Add(UpgradeMetrics::kRkeyChanges);
  LOG(INFO) << "upgrade: Ready: rkey " << ready->rkey << " (ours " << ai.rkey << "), "
            << ready->registered_bytes << " bytes "
            << (ready->mr_imported ? "imported" : "registered");
  Mark(a, "n_ready_wait");
  return absl::OkStatus();
}

absl::StatusOr<OldSide::SentRecords> OldSide::SendRecords(Attempt& a, const char* step,
                                                          uint64_t changed_after, bool with_live) {
  absl::StatusOr<server::RecordsExport> e =
      ExportSessionsBlocking(server_, changed_after, with_live,
                             a.Cap(absl::Now() + options_.control_task_deadline) - absl::Now());
  if (!e.ok()) return e.status();
  SentRecords sent{e->records.size(), 0, e->mark, std::move(e->client_ids)};
  absl::StatusOr<std::vector<Sessions>> chunks = SplitSessions(ToSessionTable(e->records).sessions);
  e->records.clear();
  if (!chunks.ok()) return WithContext(chunks.status(), "splitting the session table");
  // Sending and N's taking in: O(records), up to ~75 MB at the defaults'
  // bound, so the generic step deadline (capped by the pause limit once
  // writes wait) rather than a send's.
  const absl::Time deadline = a.Cap(absl::Now() + options_.step_deadline);
  if (absl::Status s = a.Step(step, deadline); !s.ok()) return s;
  HandoffChannel* ch;
  {
    absl::MutexLock l(&a.mu);
    ch = &*a.channel;
  }
  for (size_t i = 0; i < chunks->size(); ++i) {
    // Moved into the message: a chunk holds up to 64 MiB of windows.
    const HandoffMessage m(std::move((*chunks)[i]));
    if (absl::Status s = ch->Send(m, deadline); !s.ok()) {
      return WithContext(s, absl::StrCat("sending Sessions ", i + 1, " of ", chunks->size()));
    }
  }
  sent.messages = chunks->size();
  a.session_chunks += static_cast<uint32_t>(chunks->size());
  // N answers each with Adopted once it has taken the records in: the
  // caller's next step (the pause, HandOver) does not wait behind that work.
  for (size_t i = 0; i < chunks->size(); ++i) {
    if (absl::StatusOr<Adopted> ad = ReceiveAs<Adopted>(a, deadline, "Adopted"); !ad.ok()) {
      return ad.status();
    }
  }
  return sent;
}

// Sends the records of clients without a session before writes pause. They
// change only when their client comes back, and they are most of the table
// of a node whose clients come and go: up to --max_client_records windows
// of --dedupe_window entries, tens of megabytes. HandOver then carries only
// what changed since, so that their size is not the writes' wait.
absl::Status OldSide::SendIdleSessions(Attempt& a) {
  if (absl::Status s = LocalStep(a, "o_presend"); !s.ok()) return s;
  absl::StatusOr<SentRecords> sent =
      SendRecords(a, "o_presend", /*changed_after=*/0, /*with_live=*/false);
  if (!sent.ok()) return WithContext(sent.status(), "sending the idle clients' records");
  a.presend_mark = sent->mark;
  LOG(INFO) << "upgrade: " << sent->records << " records of clients without a session sent ("
            << sent->messages << " Sessions messages)";
  Mark(a, "o_presend");
  return absl::OkStatus();
}

// Pauses writes (from here every wait is capped by the pause limit) and
// releases RocksDB: this process writes no more, but keeps the database open
// (its close, which flushes the memtable first, is off the write path,
// after Owned: the new process journals writes meanwhile).
absl::Status OldSide::PauseWritesAndReleaseDb(const std::shared_ptr<Attempt>& ap) {
  Attempt& a = *ap;
  if (absl::Status s = LocalStep(a, "o_pause"); !s.ok()) return s;
  if (absl::Status s = MaybeInjectFault(Phase::kOPause); !s.ok()) return s;
  {
    // From here writes may be paused: every later wait, and the watchdog,
    // are bounded by the pause limit.
    absl::MutexLock l(&a.mu);
    a.pause_limit_at = absl::Now() + options_.write_pause_limit;
  }
  const absl::Time deadline = a.Cap(absl::Now() + options_.pause_deadline);
  if (absl::Status s = a.Step("o_pause", deadline); !s.ok()) return s;
  a.paused = true;  // from here a rollback resumes writes (harmless if not paused yet)
  if (absl::Status s = OnControlWithDone(
          server_,
          [ap](server::Server* sv, std::function<void()> done) {
            if (ap->Abandoned()) return done();
            sv->PauseWrites(std::move(done));
          },
          deadline - absl::Now());
      !s.ok()) {
    return WithContext(s, "pausing writes");
  }
  a.paused_at = absl::Now();
  Mark(a, "o_pause");
  if (absl::Status s = LocalStep(a, "o_flush"); !s.ok()) return s;
  if (absl::Status s = MaybeInjectFault(Phase::kOFlush); !s.ok()) return s;
  {
    absl::MutexLock g(&a.db_step_mu);
    if (a.Abandoned()) return absl::AbortedError("the upgrade watchdog took over");
    a.db_released = true;  // a rollback takes it back (Store refuses harmlessly if not released)
    if (absl::Status s = server_->ReleaseDbForHandoff(); !s.ok()) {
      return WithContext(s, "releasing RocksDB");
    }
  }
  Mark(a, "o_flush");
  return absl::OkStatus();
}

// Stops accepting, sends the client records that changed since
// SendIdleSessions or have a session (Sessions messages), and then HandOver
// with the listening and admin sockets and the ids of every record. From
// HandOver on, the new process may own RocksDB.
absl::Status OldSide::SendHandOver(const std::shared_ptr<Attempt>& ap) {
  Attempt& a = *ap;
  if (absl::Status s = LocalStep(a, "o_handover"); !s.ok()) return s;
  a.stopped_accepting = true;
  // Does nothing once the watchdog took over (its undo runs after it).
  auto stop_accepting = [ap](server::Server* sv) {
    if (!ap->Abandoned()) sv->StopAccepting();
  };
  if (absl::Status s = OnControl(server_, stop_accepting,
                                 a.Cap(absl::Now() + options_.control_task_deadline) - absl::Now());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = MaybeInjectFault(Phase::kOHandover); !s.ok()) return s;
  absl::StatusOr<SentRecords> sent =
      SendRecords(a, "o_handover_prep", a.presend_mark, /*with_live=*/true);
  if (!sent.ok()) return sent.status();
  HandOver ho;
  ho.generation = a.new_generation;
  // Writes are paused and RocksDB released: nothing moves it any more.
  ho.last_version = server_->last_version();
  ho.fd_roles = {FdRole::kListenTcp, FdRole::kAdminSocket};
  std::vector<int> fds = {server_->listen_fd(), server_->admin_fd()};
  // The metrics listener too, rather than N binding the address again
  // once O has closed it: no moment without a listener (a scrape waits in
  // the backlog for N instead of being refused) and no other process can
  // take the port in between. Only with --metrics_listen (FdRole).
  if (server_->metrics_fd() >= 0) {
    ho.fd_roles.push_back(FdRole::kMetricsTcp);
    fds.push_back(server_->metrics_fd());
  }
  // The records travel in Sessions messages before HandOver, as many as
  // their size needs: HandOver itself stays small whatever the number of
  // clients (8 bytes an id).
  ho.session_chunks = a.session_chunks;
  ho.client_ids = std::move(sent->client_ids);
  Mark(a, "o_handover_prep");
  a.counters_at_handover = server_->metrics().Export();
  metrics_->ExportTo(&a.counters_at_handover);
  ho.counters = ToCounters(a.counters_at_handover);
  const absl::Time deadline = a.Cap(absl::Now() + options_.handover_send_deadline);
  HandoffChannel* ch;
  {
    // From here N may open RocksDB: a rollback must kill N first.
    absl::MutexLock l(&a.mu);
    if (a.abandoned) return absl::AbortedError("the upgrade watchdog took over");
    if (a.cancel) return absl::CancelledError("canceled by a shutdown signal");
    a.handover_sending = true;
    a.step = "o_handover";
    a.lease = deadline;
    ch = &*a.channel;
  }
  if (options_.cluster != nullptr) {
    // After handover_sending: a rollback from here fences N before it takes
    // the lease back (UpgradeRolledBack). HandOffLease may wait for an etcd
    // round under way, so not under mu.
    ho.cluster_lease = options_.cluster->HandOffLease();
    if (a.Abandoned()) {
      // The watchdog's rollback may have taken the lease back before it was
      // handed off here: take it back (again). One that comes after this
      // check comes after the handoff too.
      options_.cluster->UpgradeRolledBack();
      return absl::AbortedError("the upgrade watchdog took over");
    }
  }
  if (absl::Status s = ch->Send(ho, fds, deadline); !s.ok()) {
    return WithContext(s, "sending HandOver");
  }
  LOG(INFO) << "upgrade: HandOver sent (" << sent->records << " client records sent in the pause, "
            << ho.client_ids.size() << " held; " << ho.session_chunks
            << " Sessions messages in all, " << ho.counters.counters.size() << " counters"
            << (options_.cluster != nullptr ? absl::StrCat("; cluster lease ", ho.cluster_lease)
                                            : std::string())
            << ")";
  return absl::OkStatus();
}

// Waits for Owned: the point of no return. From here nothing rolls back.
absl::Status OldSide::AwaitOwned(Attempt& a) {
  const absl::Time deadline = a.Cap(absl::Now() + options_.owned_deadline);
  if (absl::Status s = a.Step("n_owned", deadline); !s.ok()) return s;
  absl::StatusOr<Owned> owned = ReceiveAs<Owned>(a, deadline, "Owned");
  if (!owned.ok()) return owned.status();
  // Owned is here, but until `resolved` below the watchdog may still roll
  // back (and kill N): the window the o_owned fault widens.
  if (absl::Status s = MaybeInjectFault(Phase::kOOwned); !s.ok()) return s;
  bool forward_term = false;
  {
    absl::MutexLock l(&a.mu);
    if (a.resolved) return absl::AbortedError("the upgrade watchdog took over before Owned");
    a.resolved = true;
    a.owned = true;
    a.lease = absl::InfiniteFuture();
    forward_term = a.cancel;
  }
  // From here on, nothing rolls back: only now may systemd take N for the
  // service's main process (had N said so itself at Owned, a rollback in
  // between would leave systemd watching a process O killed, and it would
  // stop the unit, O included). The server must not remove what N owns now
  // (arena name, admin socket path, pid file) even if it stops early.
  if (absl::Status s = SdNotifyNewMainPid(a.child_pid); !s.ok()) {
    LOG(WARNING) << "upgrade: " << s;
  }
  handed_off_.store(true);
  server_->MarkHandedOff();
  const absl::Time owned_at = absl::Now();
  metrics_->SetLast("write_pause", owned_at - a.paused_at);
  // What a user asks of an upgrade: how long writes waited for a writer, and
  // how long after the signal the new process took writes.
  metrics_->SetLast("writer_switch", owned_at - a.paused_at);
  metrics_->SetLast("signal_to_n_writes", owned_at - a.t0);
  Mark(a, "o_handover");
  LOG(INFO) << "upgrade: Owned by pid " << owned->pid << " generation " << owned->generation
            << " after " << absl::FormatDuration(owned_at - a.t0) << " (writes paused "
            << absl::FormatDuration(owned_at - a.paused_at) << ")";
  server::UpgradeOutcome o = OutcomeOf(a, a.child_pid);
  o.write_pause_ms = absl::ToDoubleMilliseconds(owned_at - a.paused_at);
  o.elapsed_ms = absl::ToDoubleMilliseconds(owned_at - a.t0);
  Report(a, o);
  if (forward_term) {
    absl::MutexLock l(&a.mu);
    LOG(INFO) << "upgrade: a shutdown was requested during the upgrade: passing it on to the new "
              << "process " << a.child_pid;
    (void)a.child->Signal(SIGTERM);
  }
  return absl::OkStatus();
}

// Tells every client to move to the new process and counts who did.
void OldSide::MoveClients(Attempt& a) {
  // Clients go to the advertised address, not to the bound one: a listener on
  // 0.0.0.0 would send each remote client to its own host. N listens on the
  // same socket (inherited) and advertises the same address (same argv).
  absl::StatusOr<std::string> endpoint = server_->advertised_endpoint();
  if (absl::Status s = MaybeInjectFault(Phase::kOMoveClients); !s.ok()) {
    LOG(WARNING) << "upgrade: " << s << ": clients are cut instead of moved";
  } else if (!endpoint.ok()) {
    // Validate() refuses such options at start; never send a Move to nowhere.
    LOG(ERROR) << "upgrade: " << endpoint.status() << ": clients are cut instead of moved";
  } else {
    MoveResult r =
        MoveClientsBlocking(server_, *endpoint, a.new_generation, options_.move_deadline);
    a.moved = r.acked;
    a.cut = r.sent - std::min(r.sent, r.acked);
    LOG(INFO) << "upgrade: " << r.sent << " clients told to move to " << *endpoint << ", "
              << a.moved << " acknowledged, " << a.cut << " cut";
  }
  metrics_->Add(UpgradeMetrics::kClientsMigrated, a.moved);
  metrics_->Add(UpgradeMetrics::kClientsCut, a.cut);
  Mark(a, "o_move_clients");
}

// Closes the RocksDB this process released, its memtable flushed first so
// that N's open has no WAL to replay, and tells N, which opens it then (N
// journals writes meanwhile). Past the point of no return: on a failure
// the database stays open until this process exits, which N notices too.
void OldSide::CloseDbAndSayReleased(Attempt& a) {
  if (absl::Status s = MaybeInjectFault(Phase::kOCloseDb); !s.ok()) {
    LOG(WARNING) << "upgrade: " << s << ": RocksDB stays open until this process exits";
    return;
  }
  if (absl::Status s = server_->CloseReleasedDb(); !s.ok()) {
    LOG(ERROR) << "upgrade: closing RocksDB: " << s;
    return;
  }
  Released r;
  r.generation = a.new_generation;
  {
    absl::MutexLock l(&a.mu);
    if (absl::Status s = a.channel->Send(r, absl::Now() + options_.send_deadline); !s.ok()) {
      LOG(WARNING) << "upgrade: sending Released: " << s << " (the new process sees our exit)";
    }
  }
  Mark(a, "o_close_db");
}

void OldSide::Rollback(Attempt& a, const absl::Status& why, bool by_watchdog) {
  LOG(WARNING) << "upgrade: rolling back" << (by_watchdog ? " (watchdog)" : "") << ": " << why;
  // The main process stays (or is again) this one, before N is killed: a
  // systemd that was told N (by a new process of an older build, at its
  // Owned) would otherwise stop the unit when N dies.
  if (absl::Status s = SdNotifyMainPid(getpid()); !s.ok()) LOG(WARNING) << "upgrade: " << s;
  bool n_may_own_db;
  std::optional<Process> child;
  int channel_fd = -1;
  pid_t child_pid = 0;
  {
    absl::MutexLock l(&a.mu);
    n_may_own_db = a.handover_sending;
    if (a.child.has_value()) child_pid = a.child->pid();
    if (a.child.has_value()) child.emplace(std::move(*a.child));
    a.child.reset();
    if (a.channel.has_value()) channel_fd = a.channel->fd();
  }
  auto fence = [&] {
    // N sees EOF at once; the fd itself is closed below or with the attempt
    // (a stuck upgrade thread may still hold it).
    if (channel_fd >= 0) ::shutdown(channel_fd, SHUT_RDWR);
    if (!child.has_value()) return;
    // Fencing: N must be dead before O takes RocksDB back.
    absl::StatusOr<ExitStatus> es = child->KillAndReap(absl::Now() + options_.kill_deadline);
    LOG(INFO) << "upgrade: new process " << child->pid() << " "
              << (es.ok() ? es->ToString() : es.status().ToString());
    child.reset();
  };
  // Normally N is killed first. The watchdog, when N cannot have RocksDB
  // (HandOver never left), reopens first: if that hangs too, O exits and N,
  // still alive and registered, takes over alone.
  if (!by_watchdog || n_may_own_db) fence();
  {
    absl::MutexLock g(&a.db_step_mu);
    if (a.db_released) {
      if (absl::Status s = server_->ReopenDbAfterFailedHandoff(); !s.ok()) {
        LOG(ERROR) << "upgrade: reopening RocksDB after the failed handoff: " << s;
        // Resuming now would accept writes that cannot be made durable (no
        // RocksDB here), or contradict writes the new process may have
        // acknowledged (it claimed the database and wrote): exit instead.
        if (!absl::StrContains(s.message(), "already open")) {
          LOG(ERROR) << "upgrade" << (by_watchdog ? " watchdog" : "")
                     << ": RocksDB cannot be taken back: exiting so that "
                     << (child.has_value() ? "the new process" : "a restart") << " takes over";
          google::FlushLogFiles(google::GLOG_INFO);
          _exit(kWatchdogExitCode);
        }
      }
      a.db_released = false;
    }
  }
  fence();
  {
    // The channel is closed here unless the upgrade thread may still use it.
    absl::MutexLock l(&a.mu);
    if (!by_watchdog && a.channel.has_value()) a.channel->Close();
  }
  if (a.stopped_accepting) {
    (void)OnControl(
        server_, [](server::Server* sv) { sv->ResumeAccepting(); }, options_.control_task_deadline);
  }
  if (a.paused) {
    (void)OnControlWithDone(
        server_,
        [](server::Server* sv, std::function<void()> done) { sv->ResumeWrites(std::move(done)); },
        options_.control_task_deadline);
  }
  if (!a.header_name.empty()) (void)RemoveHandoffHeader(a.header_name);
  // N is dead (fenced above) if it ever had the lease.
  if (options_.cluster != nullptr) options_.cluster->UpgradeRolledBack();
  server_->metrics().Add(server::Counter::kRollbacks);
  if (by_watchdog) metrics_->Add(UpgradeMetrics::kWatchdogRollbacks);
  server_->SetUpgradeInProgress(false);
  (void)SdNotifyReady();
  bool cancel;
  {
    absl::MutexLock l(&a.mu);
    a.finished = true;
    cancel = a.cancel;
  }
  if (cancel) metrics_->Add(UpgradeMetrics::kCanceled);
  const absl::Duration took = absl::Now() - a.t0;
  LOG(WARNING) << "upgrade: rolled back after " << absl::FormatDuration(took) << "; generation "
               << server_->generation() << " serves on"
               << (cancel ? " until the requested shutdown" : "");
  busy_.store(false);
  server::UpgradeOutcome o = OutcomeOf(a, child_pid);
  o.rolled_back = true;
  o.reason = std::string(why.message());
  if (cancel) absl::StrAppend(&o.reason, "; the node shuts down as requested");
  o.elapsed_ms = absl::ToDoubleMilliseconds(took);
  Report(a, o);
  if (cancel) {
    if (options_.cluster != nullptr) options_.cluster->ShutdownStarted();
    server_->RequestShutdown();
  }
}

server::UpgradeOutcome OldSide::OutcomeOf(Attempt& a, pid_t child_pid) {
  server::UpgradeOutcome o;
  o.old_generation = server_->generation();
  o.new_generation = a.new_generation;
  o.old_pid = getpid();
  o.new_pid = child_pid;
  o.old_build = options_.build_id;
  absl::MutexLock l(&a.mu);
  o.new_build = a.new_build;
  return o;
}

void OldSide::Report(Attempt& a, const server::UpgradeOutcome& o) {
  std::function<void(std::string)> reply;
  {
    absl::MutexLock l(&a.mu);
    reply = std::exchange(a.reply, nullptr);
  }
  if (!reply) return;
  reply(server::UpgradeOutcomeAnswer(o));
  // The answer is written by the control thread, in task order: once a task
  // posted after it has run, it has left, even if this process exits next.
  (void)OnControl(
      server_, [](server::Server*) {}, options_.control_task_deadline);
}

void OldSide::Watchdog(std::shared_ptr<Attempt> ap) {
  Attempt& a = *ap;
  std::string step;
  absl::Time lease;
  {
    absl::MutexLock l(&a.mu);
    for (;;) {
      if (a.resolved) return;
      const absl::Time now = absl::Now();
      const absl::Time fire = a.lease == absl::InfiniteFuture() ? absl::InfiniteFuture()
                                                                : a.lease + options_.watchdog_grace;
      if (now >= fire) break;
      // Re-read the lease at least every second (the thread renews it).
      a.mu.AwaitWithDeadline(absl::Condition(&a.resolved), std::min(fire, now + absl::Seconds(1)));
    }
    a.resolved = true;
    a.abandoned = true;
    step = a.step;
    lease = a.lease;
  }
  const absl::Status why = absl::DeadlineExceededError(
      absl::StrCat("the upgrade thread is stuck in step ", step, ", ",
                   absl::FormatDuration(absl::Now() - lease), " past its deadline"));
  LOG(ERROR) << "upgrade watchdog: " << why.message() << ": rolling back in its place";
  auto done = std::make_shared<absl::Notification>();
  std::thread([this, ap, done, why] {
    Rollback(*ap, why, /*by_watchdog=*/true);
    done->Notify();
  }).detach();
  if (!done->WaitForNotificationWithTimeout(options_.watchdog_rollback_deadline)) {
    LOG(ERROR) << "upgrade watchdog: the rollback did not finish within "
               << absl::FormatDuration(options_.watchdog_rollback_deadline)
               << ": exiting so that the new process (if alive) or a restart takes over";
    google::FlushLogFiles(google::GLOG_INFO);
    _exit(kWatchdogExitCode);
  }
}

int OldSide::FinishAfterRun(const absl::Status& run_status) {
  const int code = run_status.ok() ? 0 : 3;
  ReapThreads();
  if (!handed_off_.load()) return code;
  Attempt& a = *done_;
  metrics_->SetLast("o_dereg",
                    absl::Now() - (a.dereg_start == absl::Time() ? a.phase_start : a.dereg_start));
  // What O counted after the HandOver snapshot.
  std::vector<std::pair<std::string, uint64_t>> now = server_->metrics().Export();
  metrics_->ExportTo(&now);
  absl::flat_hash_map<std::string, uint64_t> before;
  for (const auto& [k, v] : a.counters_at_handover) before[k] = v;
  std::vector<std::pair<std::string, uint64_t>> delta;
  for (const auto& [k, v] : now) {
    if (k.rfind("upgrade.last_us.", 0) == 0) {
      delta.emplace_back(k, v);  // replaced on N's side, not added
      continue;
    }
    const uint64_t b = before.contains(k) ? before[k] : 0;
    if (v > b) delta.emplace_back(k, v - b);
  }
  delta.emplace_back("upgrade.last_us.total",
                     static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - a.t0)));
  Gone g;
  g.clients_moved = a.moved;
  g.clients_cut = a.cut;
  g.counters_delta = ToCounters(delta);
  {
    absl::MutexLock l(&a.mu);
    if (absl::Status s = a.channel->Send(g, absl::Now() + options_.send_deadline); !s.ok()) {
      LOG(WARNING) << "upgrade: sending Gone: " << s;
    }
    a.finished = true;
  }
  if (absl::Status s = MaybeInjectFault(Phase::kOExit); !s.ok()) {
    LOG(WARNING) << "upgrade: " << s << " (exiting anyway)";
  }
  (void)RemoveHandoffHeader(a.header_name);
  LOG(INFO) << "upgrade: old process " << getpid() << " done after "
            << absl::FormatDuration(absl::Now() - a.t0) << " (" << a.moved << " clients moved, "
            << a.cut << " cut)";
  return code;
}

}  // namespace kvnode::upgrade
