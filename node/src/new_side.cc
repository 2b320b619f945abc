// The new side N of a live upgrade (docs/upgrade.md section 2).
#include <glog/logging.h>
#include <malloc.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvnode/node/node.h"
#include "kvnode/storage/store.h"
#include "kvnode/upgrade/fault.h"
#include "kvnode/upgrade/sd_notify.h"
#include "node_internal.h"

namespace kvnode::upgrade {
namespace {

void SendAbort(HandoffChannel& ch, AbortCode code, const absl::Status& why) {
  Abort ab;
  ab.code = static_cast<uint32_t>(code);
  ab.message = std::string(why.message()).substr(0, kMaxAbortMessageSize);
  if (absl::Status s = ch.Send(ab, absl::Now() + absl::Seconds(2)); !s.ok()) {
    LOG(WARNING) << "upgrade: could not send Abort to the old process: " << s;
  }
}

// The payload that marks a TakeOver error as one after O's death.
constexpr absl::string_view kColdStartPayload = "kvnode.upgrade/cold-start-generation";

AbortCode CodeFor(const absl::Status& s) {
  if (absl::IsAborted(s) && absl::StrContains(s.message(), "injected")) {
    return AbortCode::kInjectedFault;
  }
  if (absl::IsDeadlineExceeded(s)) return AbortCode::kDeadline;
  return AbortCode::kInternal;
}

// N renews the member's lease from HandOver on (O stopped before it sent
// it), before it becomes the writer: the lease has about two thirds of its
// TTL left when it arrives. When O died before HandOver (no lease), the
// session registers anew.
void StartClusterSession(ClusterMember& cluster, const server::ServerOptions& options,
                         const HandoffHeader& h, pid_t o_pid, const HandOver& ho) {
  // N's --listen is O's bound address (O appends it): the endpoint is O's.
  absl::StatusOr<std::string> endpoint =
      server::AdvertisedEndpoint(options.advertise_address, options.listen);
  if (!endpoint.ok()) LOG(WARNING) << "upgrade: cluster member endpoint: " << endpoint.status();
  cluster.TakeOverStarted(ho.cluster_lease, h.generation, o_pid, h.build_id,
                          endpoint.ok() ? *endpoint : options.listen);
}

}  // namespace

std::optional<uint64_t> ColdStartGeneration(const absl::Status& takeover_error) {
  const auto p = takeover_error.GetPayload(kColdStartPayload);  // absl::optional<absl::Cord>
  uint64_t generation = 0;
  if (!p || !absl::SimpleAtoi(std::string(*p), &generation)) return std::nullopt;
  return generation;
}

absl::StatusOr<std::pair<std::unique_ptr<server::Server>, std::unique_ptr<NewSideTail>>> TakeOver(
    server::ServerOptions options, const std::string& handoff_flag,
    const NodeUpgradeOptions& upgrade, UpgradeMetrics* metrics) {
  absl::Time phase_start = absl::Now();
  std::map<std::string, absl::Duration> phases;
  auto mark = [&](const char* name) {
    const absl::Time now = absl::Now();
    phases[name] = now - phase_start;
    phase_start = now;
  };
  absl::StatusOr<HandoffArg> arg = ParseHandoffArg(handoff_flag);
  if (!arg.ok()) return arg.status();
  absl::StatusOr<HandoffChannel> adopted = HandoffChannel::Adopt(arg->fd, arg->o_pid);
  if (!adopted.ok()) return WithContext(adopted.status(), "adopting the handoff channel");
  HandoffChannel ch = std::move(*adopted);
  absl::StatusOr<Process> old = Process::Open(arg->o_pid, /*is_child=*/false);
  if (!old.ok()) return WithContext(old.status(), "watching the old process");

  // 1. The header, before anything else is touched.
  absl::StatusOr<std::string> hname = HandoffHeaderShmName(options.shm_name);
  if (!hname.ok()) return hname.status();
  HandoffExpectations ex;
  ex.o_pid = arg->o_pid;
  ex.arena_shm_name = options.shm_name;
  std::vector<Mismatch> mismatches;
  absl::StatusOr<HandoffHeader> h =
      ReadAndValidateHandoffHeader(*hname, upgrade.compat, ex, &mismatches);
  if (!h.ok()) {
    LOG(ERROR) << "upgrade: refusing to take over: " << h.status();
    SendAbort(ch, mismatches.empty() ? AbortCode::kInternal : AbortCode::kIncompatible, h.status());
    return h.status();
  }
  options.generation = h->generation + 1;
  Hello hello;
  hello.pid = static_cast<uint32_t>(getpid());
  hello.generation = options.generation;
  hello.capabilities = h->required_capabilities & upgrade.compat.supported_capabilities;
  hello.build_id = upgrade.build_id.substr(0, kMaxBuildIdSize);
  if (absl::Status s = ch.Send(hello, absl::Now() + upgrade.send_deadline); !s.ok()) {
    return WithContext(s, "sending Hello");
  }
  LOG(INFO) << "upgrade: new process " << getpid() << " taking over from pid " << arg->o_pid
            << " as generation " << options.generation << ", version " << h->build_id << " -> "
            << upgrade.build_id;

  // 2. Attach, register, Ready: O serves everything meanwhile.
  if (absl::Status s = MaybeInjectFault(Phase::kNAttach); !s.ok()) {
    SendAbort(ch, CodeFor(s), s);
    return s;
  }
  absl::StatusOr<std::unique_ptr<server::Server>> created =
      server::Server::CreateForTakeover(options, [&]() -> absl::Status {
        mark("n_attach");
        return MaybeInjectFault(Phase::kNRegister);
      });
  if (!created.ok()) {
    SendAbort(ch, CodeFor(created.status()), created.status());
    return created.status();
  }
  std::unique_ptr<server::Server> srv = std::move(*created);
  // alone_ is set when O died before HandOver: from then on an error leaves
  // nothing serving.
  auto tail = std::unique_ptr<NewSideTail>(new NewSideTail());
  // From here on an error leaks `srv` on purpose: the caller _exit()s (or
  // execs) without running destructors that would touch the shared arena.
  auto fail = [&](absl::Status s, bool tell) -> absl::Status {
    if (tell) SendAbort(ch, CodeFor(s), s);
    if (tail->alone_) {
      s.SetPayload(kColdStartPayload, absl::Cord(absl::StrCat(options.generation)));
    }
    (void)srv.release();
    return s;
  };
  const server::Server::ArenaInfo ai = srv->arena_info();
  if (ai.arena_id != h->arena_id) {
    return fail(absl::FailedPreconditionError(
                    absl::StrCat("attached arena ", ai.arena_id, ", header names ", h->arena_id)),
                true);
  }
  mark("n_register");
  // The journal that makes writes durable while RocksDB changes hands,
  // taken (the spare renamed, or allocated) beside the registration so that
  // the writer switch does not wait for it; n_journal_prep is what is left of
  // it after the registration.
  if (absl::Status s = srv->PrepareJournal(); !s.ok()) {
    return fail(WithContext(s, "preparing the write journal"), true);
  }
  mark("n_journal_prep");
  if (absl::Status s = MaybeInjectFault(Phase::kNReady); !s.ok()) return fail(s, true);
  Ready ready;
  ready.rkey = ai.rkey;
  ready.arena_remote_addr = ai.remote_addr;
  ready.arena_id = ai.arena_id;
  ready.registered_bytes = ai.registered_bytes;
  ready.mr_imported = 0;  // rxe has no ibv_import_*: registered anew
  if (absl::Status s = ch.Send(ready, absl::Now() + upgrade.send_deadline); !s.ok()) {
    return fail(WithContext(s, "sending Ready"), false);
  }
  mark("n_ready");
  LOG(INFO) << "upgrade: Ready sent (rkey " << ai.rkey << ", " << ai.registered_bytes
            << " bytes registered)";

  // 3. HandOver, or O's death.
  server::InheritedSockets inherited;
  HandOver ho;
  // Client records come first, in Sessions messages: most of them while O
  // still serves writes. Each is adopted as it arrives (a later record of a
  // client replaces an earlier one) and answered with Adopted, which O
  // waits for before it pauses writes: only what came during the pause is
  // taken in during it.
  uint32_t chunks = 0;
  const absl::Time handover_by = absl::Now() + upgrade.handover_deadline;
  absl::StatusOr<ReceivedMessage> m = ch.Receive(handover_by);
  while (m.ok() && std::holds_alternative<Sessions>(m->message)) {
    if (chunks == kMaxSessionChunks) {
      return fail(absl::InvalidArgumentError("more Sessions messages than the protocol allows"),
                  true);
    }
    ++chunks;
    const std::vector<SessionRecord>& records = std::get<Sessions>(m->message).sessions;
    srv->ImportSessions(FromSessionRecords(records));
    const Adopted adopted{static_cast<uint32_t>(records.size())};
    if (absl::Status s = ch.Send(adopted, absl::Now() + upgrade.send_deadline); !s.ok()) {
      m = WithContext(s, "sending Adopted");  // as a failed receive: O may have died
      break;
    }
    m = ch.Receive(handover_by);
  }
  if (!m.ok()) {
    if (old->WaitExit(absl::Now() + absl::Seconds(2)).ok()) {
      LOG(WARNING) << "upgrade: the old process " << arg->o_pid
                   << " died before HandOver; taking over alone (binding " << options.listen
                   << ", opening RocksDB after it)";
      tail->alone_ = true;
    } else {
      return fail(WithContext(m.status(), "waiting for HandOver"), true);
    }
  } else if (const Abort* ab = std::get_if<Abort>(&m->message)) {
    return fail(absl::AbortedError(absl::StrCat("the old process aborted: ", ab->message)), false);
  } else if (HandOver* got = std::get_if<HandOver>(&m->message)) {
    ho = std::move(*got);
    if (ho.generation != options.generation) {
      return fail(
          absl::FailedPreconditionError(absl::StrCat("HandOver for generation ", ho.generation)),
          true);
    }
    for (size_t i = 0; i < ho.fd_roles.size() && i < m->fds.size(); ++i) {
      if (ho.fd_roles[i] == FdRole::kListenTcp) inherited.listen_fd = m->fds[i].Release();
      if (ho.fd_roles[i] == FdRole::kAdminSocket) inherited.admin_fd = m->fds[i].Release();
      if (ho.fd_roles[i] == FdRole::kMetricsTcp) inherited.metrics_fd = m->fds[i].Release();
    }
    if (chunks != ho.session_chunks) {
      return fail(absl::DataLossError(absl::StrCat("HandOver announces ", ho.session_chunks,
                                                   " Sessions messages, ", chunks, " arrived")),
                  true);
    }
    srv->ImportSessions(FromSessionRecords(ho.sessions.sessions));
    if (absl::Status s = srv->RetainSessions(ho.client_ids); !s.ok()) {
      return fail(WithContext(s, "the session table"), true);
    }
  } else {
    return fail(UnexpectedMessage(m->message, "HandOver"), true);
  }
  mark("n_handover_wait");
  if (upgrade.cluster != nullptr)
    StartClusterSession(*upgrade.cluster, options, *h, arg->o_pid, ho);

  // 4. The writer switch (RocksDB itself when O died), sockets, sessions,
  // counters.
  if (absl::Status s = MaybeInjectFault(Phase::kNOpenDb); !s.ok()) return fail(s, !tail->alone_);
  if (tail->alone_) {
    // Records O sent before it died may be older than what it persisted
    // since: the cold start's records from RocksDB are the ones to trust.
    (void)srv->RetainSessions({});
    if (absl::Status s = srv->CompleteTakeover(inherited); !s.ok()) {
      return fail(WithContext(s, "opening RocksDB / adopting the sockets"), false);
    }
  } else if (absl::Status s = srv->CompleteSwitch(inherited, ho.last_version); !s.ok()) {
    return fail(WithContext(s, "becoming the writer / adopting the sockets"), true);
  }
  mark(tail->alone_ ? "n_open_db" : "n_switch");
  if (!tail->alone_) {
    const std::vector<std::pair<std::string, uint64_t>> counters = FromCounters(ho.counters);
    srv->metrics().Import(counters);
    metrics->ImportFrom(counters);
  } else {
    metrics->Add(UpgradeMetrics::kTakeoversAlone);
  }
  metrics->Add(UpgradeMetrics::kMrBytesRegistered, ai.registered_bytes);
  srv->metrics().Add(server::Counter::kUpgrades);
  srv->SetUpgradeInProgress(true);
  if (absl::Status s = MaybeInjectFault(Phase::kNAccepting); !s.ok()) {
    return fail(s, !tail->alone_);
  }
  if (!tail->alone_) {
    Owned owned;
    owned.generation = options.generation;
    owned.pid = static_cast<uint32_t>(getpid());
    if (absl::Status s = ch.Send(owned, absl::Now() + upgrade.send_deadline); !s.ok()) {
      // O died after HandOver: we own everything anyway.
      LOG(WARNING) << "upgrade: sending Owned: " << s << " (carrying on)";
    }
  }
  mark("n_accepting");
  if (upgrade.cluster != nullptr) upgrade.cluster->TookOver(options.generation);
  for (const auto& [k, d] : phases) metrics->SetLast(k, d);
  // systemd's main PID: O names this process when it has taken Owned in (its
  // point of no return; until then it may still roll back and kill us), or
  // NewSideTail once O has exited. Alone, O is dead already.
  if (tail->alone_) {
    if (absl::Status s = SdNotifyNewMainPid(getpid()); !s.ok()) {
      LOG(WARNING) << "upgrade: sd_notify: " << s;
    }
  }
  LOG(INFO) << "upgrade: generation " << options.generation << " is the writer"
            << (tail->alone_ ? "" : " (journal until the old process releases RocksDB)")
            << " and accepts on " << srv->listen_address();

  tail->server_ = srv.get();
  tail->metrics_ = metrics;
  tail->cluster_ = upgrade.cluster;
  tail->channel_.emplace(std::move(ch));
  tail->old_.emplace(std::move(*old));
  tail->header_name_ = *hname;
  tail->old_exit_deadline = upgrade.old_exit_deadline;
  tail->kill_deadline = upgrade.kill_deadline;
  tail->db_open_deadline =
      upgrade.old_exit_deadline + upgrade.kill_deadline + upgrade.step_deadline;
  tail->started_ = absl::Now();
  return std::make_pair(std::move(srv), std::move(tail));
}

NewSideTail::~NewSideTail() {
  if (thread_.joinable()) thread_.join();
  if (!db_open_.HasBeenNotified()) db_open_.Notify();  // ends the watchdog
  if (watchdog_.joinable()) watchdog_.join();
}

void NewSideTail::Start(std::atomic<bool>* busy) {
  busy_ = busy;
  if (busy_ != nullptr) busy_->store(true);
  if (!alone_) {
    // Journaled writes are durable, but only RocksDB can hold the node's
    // data for long: without it by the deadline this process exits, and a
    // restart replays the journal.
    watchdog_ = std::thread([this] {
      if (db_open_.WaitForNotificationWithTimeout(db_open_deadline)) return;
      LOG(ERROR) << "upgrade: RocksDB not open here " << absl::FormatDuration(db_open_deadline)
                 << " after Owned: exiting so that a restart replays the write journal";
      google::FlushLogFiles(google::GLOG_INFO);
      _exit(kWatchdogExitCode);
    });
  }
  thread_ = std::thread([this] { Wait(); });
  server_->SetBeforeShutdown([this] { Stop(); });
}

void NewSideTail::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    // Wakes a wait for Released or Gone at once (EOF); the thread then stops.
    if (channel_.has_value()) ::shutdown(channel_->fd(), SHUT_RDWR);
  }
  if (thread_.joinable()) thread_.join();
  // The process exits next; the journal waits for the next start, which
  // replays it. The watchdog has nothing left to guard.
  if (!db_open_.HasBeenNotified()) db_open_.Notify();
  if (watchdog_.joinable()) watchdog_.join();
}

void NewSideTail::LeaveForShutdown() {
  // RocksDB open here: O released it and finishes on its own.
  if (db_open_.HasBeenNotified()) return;
  if (!old_->HasExited()) {
    // O may hang in its close, and its lock would keep RocksDB from the next
    // start; its clients are moving here anyway.
    LOG(WARNING) << "upgrade: shutting down before the old process " << old_->pid()
                 << " released RocksDB: killing it";
    (void)old_->Signal(SIGKILL);
    metrics_->Add(UpgradeMetrics::kOldKilled);
    if (absl::Status s = old_->WaitExit(absl::Now() + kill_deadline); !s.ok()) {
      LOG(ERROR) << "upgrade: the old process " << old_->pid() << " is still alive: " << s;
    }
  }
  LOG(WARNING) << "upgrade: shutting down before RocksDB was open here: the write journal "
               << "stays for the next start";
}

bool NewSideTail::stopping() {
  absl::MutexLock l(&mu_);
  return stopping_;
}

void NewSideTail::OpenDb() {
  if (db_open_.HasBeenNotified()) return;
  absl::Status s = MaybeInjectFault(Phase::kNReplay);
  if (s.ok()) s = server_->OpenDbAfterSwitch();
  if (!s.ok()) {
    if (absl::StrContains(s.message(), "store closed")) {
      LOG(WARNING) << "upgrade: shutting down before RocksDB was open here: the write journal "
                   << "stays for the next start";
    } else {
      LOG(ERROR) << "upgrade: cannot open RocksDB and replay the write journal: " << s
                 << ": exiting so that a restart replays it";
      google::FlushLogFiles(google::GLOG_INFO);
      _exit(kWatchdogExitCode);
    }
  }
  metrics_->SetLast("n_open_db", absl::Now() - started_);
  db_open_.Notify();
}

void NewSideTail::Wait() {
  if (!alone_) {
    if (absl::Status s = MaybeInjectFault(Phase::kNJournal); !s.ok()) {
      LOG(ERROR) << "upgrade: " << s << ": exiting so that a restart replays the write journal";
      google::FlushLogFiles(google::GLOG_INFO);
      _exit(kWatchdogExitCode);
    }
    const absl::Time end = started_ + old_exit_deadline;
    bool gone = false;
    // Every client is on this process once O has released RocksDB (it
    // moved them first) or is gone: the member says "serving" then, before
    // this process's RocksDB open, which clients do not see (writes go to
    // the journal meanwhile; a new upgrade is refused until it is done).
    // A fleet roll moves on to the next node at that point.
    bool serving = false;
    auto say_serving = [&] {
      if (serving || cluster_ == nullptr || stopping()) return;
      serving = true;
      cluster_->UpgradeFinished();
    };
    for (;;) {
      absl::StatusOr<ReceivedMessage> m = channel_->Receive(end);
      if (!m.ok()) {
        if (absl::IsDeadlineExceeded(m.status()) && !old_->HasExited()) {
          LOG(ERROR) << "upgrade: the old process " << old_->pid() << " did not finish within "
                     << absl::FormatDuration(old_exit_deadline) << " of Owned: killing it";
          (void)old_->Signal(SIGKILL);
          metrics_->Add(UpgradeMetrics::kOldKilled);
        } else if (!gone && !stopping()) {
          LOG(WARNING) << "upgrade: the old process " << old_->pid()
                       << " went away without Gone: " << m.status();
        }
        break;
      }
      if (stopping()) break;
      if (const Released* r = std::get_if<Released>(&m->message)) {
        LOG(INFO) << "upgrade: the old process released RocksDB (generation " << r->generation
                  << ")";
        say_serving();
        OpenDb();
        continue;
      }
      if (const Gone* g = std::get_if<Gone>(&m->message)) {
        gone = true;
        const std::vector<std::pair<std::string, uint64_t>> delta = FromCounters(g->counters_delta);
        server_->metrics().Import(delta);
        metrics_->ImportFrom(delta);
        LOG(INFO) << "upgrade: Gone from pid " << old_->pid() << ": " << g->clients_moved
                  << " clients moved, " << g->clients_cut << " cut";
        continue;  // then EOF when it exits
      }
      LOG(WARNING) << "upgrade: unexpected "
                   << HandoffTypeName(static_cast<uint16_t>(TypeOf(m->message)))
                   << " from the old process";
    }
    if (stopping()) {
      LeaveForShutdown();
    } else {
      if (absl::Status s = old_->WaitExit(absl::Now() + kill_deadline); !s.ok()) {
        LOG(ERROR) << "upgrade: the old process " << old_->pid() << " is still alive: " << s;
      } else {
        LOG(INFO) << "upgrade: the old process " << old_->pid() << " has exited";
        // O named us at its commit; if it died before (after HandOver), nobody
        // did, and nothing can roll back any more.
        if (absl::Status s = SdNotifyNewMainPid(getpid()); !s.ok()) {
          LOG(WARNING) << "upgrade: sd_notify: " << s;
        }
      }
      say_serving();
      // Its exit released RocksDB's lock if it never said Released.
      OpenDb();
    }
  }
  {
    absl::MutexLock l(&mu_);
    channel_.reset();
  }
  (void)RemoveHandoffHeader(header_name_);
  server_->SetUpgradeInProgress(false);
  // Alone (O died before HandOver), the RocksDB open came first and the
  // member is "serving" only now. Stopping, the shutdown has said
  // "draining" already.
  if (cluster_ != nullptr && alone_ && !stopping()) cluster_->UpgradeFinished();
  if (busy_ != nullptr) busy_->store(false);
  // One line with every phase (ms), O's included (they came with Gone): what
  // the metrics say, kept in the log for each upgrade, not just the last.
  LOG(INFO) << "upgrade: generation " << server_->generation()
            << " complete; phases (ms): " << metrics_->LastPhasesText();
  // The handoff's transient copies (the session table's messages and
  // records, journal batches) were freed among long-lived allocations (the
  // dedupe windows imported from them): malloc keeps such pages, and RssAnon
  // grew with every upgrade though the bytes in use did not. Give them back,
  // off the write path (milliseconds).
  const absl::Time t0 = absl::Now();
  malloc_trim(0);
  LOG(INFO) << "upgrade: malloc_trim in " << absl::FormatDuration(absl::Now() - t0);
}

}  // namespace kvnode::upgrade
