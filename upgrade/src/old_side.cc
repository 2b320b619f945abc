// The old side O of a live upgrade (docs/upgrade.md section 2): one upgrade
// thread per request, talking to the server through its control thread.
#include <glog/logging.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvnode/proto/control.h"
#include "kvnode/server/dedupe.h"
#include "kvnode/upgrade/fault.h"
#include "kvnode/upgrade/node.h"
#include "kvnode/upgrade/sd_notify.h"
#include "node_internal.h"

namespace kvnode::upgrade {

struct OldSide::Attempt {
  std::string binary;
  absl::Time t0;
  absl::Time phase_start;
  uint64_t new_generation = 0;
  std::string header_name;
  std::optional<HandoffChannel> channel;
  std::optional<Process> child;
  bool paused = false;
  bool db_closed = false;
  bool stopped_accepting = false;
  absl::Time paused_at;
  std::vector<std::pair<std::string, uint64_t>> counters_at_handover;
  uint64_t moved = 0;
  uint64_t cut = 0;
  absl::Time dereg_start;
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

OldSide::~OldSide() {
  if (thread_.joinable()) thread_.join();
}

void OldSide::Install() {
  server_->SetUpgradeHandler([this](server::Server&, std::optional<std::string> binary,
                                    std::function<void(std::string)> reply) {
    OnRequest(std::move(binary), std::move(reply));
  });
  server_->SetExtraStats([this] { return metrics_->Render(); });
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

void OldSide::OnRequest(std::optional<std::string> binary, std::function<void(std::string)> reply) {
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
  if (thread_.joinable()) thread_.join();  // the previous (finished) attempt
  LOG(INFO) << "upgrade: starting, binary " << path << ", generation " << server_->generation()
            << " -> " << server_->generation() + 1;
  reply(JsonAnswer(true,
                   absl::StrCat("started: ", path, " as generation ", server_->generation() + 1)));
  thread_ = std::thread([this, path] { RunUpgrade(path); });
}

void OldSide::RunUpgrade(std::string binary) {
  auto a = std::make_unique<Attempt>();
  a->binary = std::move(binary);
  a->t0 = a->phase_start = absl::Now();
  a->new_generation = server_->generation() + 1;
  metrics_->ClearLast();
  server_->SetUpgradeInProgress(true);
  (void)SdNotifyReloading();
  absl::Status s = Handoff(*a);
  if (!s.ok()) {
    Rollback(*a, s);
    busy_.store(false);
    return;
  }
  // Past the point of no return: O now drains, deregisters and exits
  // (Server::Run returns; main calls FinishAfterRun).
  a->phase_start = absl::Now();
  done_ = std::move(a);
  handed_off_.store(true);
  server_->MarkHandedOff();
  server_->RequestShutdown();
}

absl::Status OldSide::Handoff(Attempt& a) {
  auto mark = [&](const char* name) {
    const absl::Time now = absl::Now();
    metrics_->SetLast(name, now - a.phase_start);
    a.phase_start = now;
  };
  // --- header, spawn ---------------------------------------------------------
  absl::StatusOr<std::string> hname = HandoffHeaderShmName(options_.shm_name);
  if (!hname.ok()) return hname.status();
  a.header_name = *hname;
  const server::Server::ArenaInfo ai = server_->arena_info();
  HandoffHeader h = HandoffHeader::For(options_.compat);
  h.capabilities = kCapSessionTable | kCapCounters;
  h.arena_size = ai.arena_size;
  h.arena_id = ai.arena_id;
  h.generation = server_->generation();
  h.o_pid = static_cast<uint32_t>(getpid());
  h.created_unix_ns = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  h.arena_shm_name = options_.shm_name;
  h.build_id = options_.build_id.substr(0, kMaxBuildIdSize);
  if (absl::Status s = WriteHandoffHeader(a.header_name, h); !s.ok()) return s;
  if (absl::Status s = MaybeInjectFault(Phase::kOSpawn); !s.ok()) return s;
  absl::StatusOr<HandoffChannel::Pair> pair = HandoffChannel::CreatePair();
  if (!pair.ok()) return pair.status();
  a.channel.emplace(std::move(pair->parent));
  SpawnRequest req;
  req.binary = a.binary;
  req.argv = options_.argv;
  // N binds this address itself if O dies before HandOver (a --listen with
  // port 0 would otherwise pick another port).
  req.argv.push_back(absl::StrCat("--listen=", server_->listen_address()));
  req.exec_deadline = options_.exec_deadline;
  absl::StatusOr<Process> child = SpawnWithHandoff(req, std::move(pair->child_end));
  if (!child.ok()) return child.status();
  a.child.emplace(std::move(*child));
  a.channel->SetPeerPid(a.child->pid());
  LOG(INFO) << "upgrade: spawned " << a.binary << " as pid " << a.child->pid();
  mark("o_spawn");

  // --- Hello, Ready ------------------------------------------------------------
  absl::StatusOr<ReceivedMessage> m = a.channel->Receive(absl::Now() + options_.hello_deadline);
  if (!m.ok()) return WithContext(m.status(), "waiting for Hello");
  if (const Abort* ab = std::get_if<Abort>(&m->message)) {
    if (ab->code == static_cast<uint32_t>(AbortCode::kIncompatible)) {
      metrics_->Add(UpgradeMetrics::kIncompatibleRefused);
    }
    return absl::AbortedError(absl::StrCat("new process refused: ", ab->message));
  }
  const Hello* hello = std::get_if<Hello>(&m->message);
  if (hello == nullptr) return UnexpectedMessage(m->message, "Hello");
  if (static_cast<pid_t>(hello->pid) != a.child->pid() || hello->generation != a.new_generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("Hello from pid ", hello->pid, " generation ", hello->generation,
                     ", expected pid ", a.child->pid(), " generation ", a.new_generation));
  }
  LOG(INFO) << "upgrade: Hello from pid " << hello->pid << " (build " << hello->build_id << ")";
  m = a.channel->Receive(absl::Now() + options_.ready_deadline);
  if (!m.ok()) return WithContext(m.status(), "waiting for Ready");
  if (const Abort* ab = std::get_if<Abort>(&m->message)) {
    return absl::AbortedError(absl::StrCat("new process aborted: ", ab->message));
  }
  const Ready* ready = std::get_if<Ready>(&m->message);
  if (ready == nullptr) return UnexpectedMessage(m->message, "Ready");
  if (ready->arena_id != ai.arena_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("Ready names arena ", ready->arena_id, ", ours is ", ai.arena_id));
  }
  if (ready->rkey != ai.rkey) metrics_->Add(UpgradeMetrics::kRkeyChanges);
  LOG(INFO) << "upgrade: Ready: rkey " << ready->rkey << " (ours " << ai.rkey << "), "
            << ready->registered_bytes << " bytes "
            << (ready->mr_imported ? "imported" : "registered");
  mark("n_ready_wait");

  // --- pause writes, close RocksDB ----------------------------------------------
  if (absl::Status s = server_->FlushDb(); !s.ok()) {
    LOG(WARNING) << "upgrade: pre-flush of the memtable failed (continuing): " << s;
  }
  if (absl::Status s = MaybeInjectFault(Phase::kOPause); !s.ok()) return s;
  a.paused = true;  // from here a rollback resumes writes (harmless if not paused yet)
  if (absl::Status s = OnControlWithDone(
          server_,
          [](server::Server* sv, std::function<void()> done) { sv->PauseWrites(std::move(done)); },
          options_.pause_deadline);
      !s.ok()) {
    return WithContext(s, "pausing writes");
  }
  a.paused_at = absl::Now();
  mark("o_pause");
  if (absl::Status s = MaybeInjectFault(Phase::kOFlush); !s.ok()) return s;
  if (absl::Status s = server_->CloseDbForHandoff(); !s.ok()) {
    // Store may have closed it partially: reopening on rollback is safe either way.
    a.db_closed = true;
    return WithContext(s, "closing RocksDB");
  }
  a.db_closed = true;
  mark("o_flush");

  // --- HandOver -------------------------------------------------------------------
  a.stopped_accepting = true;
  if (absl::Status s = OnControl(
          server_, [](server::Server* sv) { sv->StopAccepting(); }, absl::Seconds(5));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = MaybeInjectFault(Phase::kOHandover); !s.ok()) return s;
  absl::StatusOr<std::vector<server::ClientRecordExport>> records =
      ExportSessionsBlocking(server_, absl::Seconds(5));
  if (!records.ok()) return records.status();
  HandOver ho;
  ho.generation = a.new_generation;
  ho.fd_roles = {FdRole::kListenTcp, FdRole::kAdminSocket};
  ho.sessions = ToSessionTable(*records);
  mark("o_handover_prep");
  a.counters_at_handover = server_->metrics().Export();
  metrics_->ExportTo(&a.counters_at_handover);
  ho.counters = ToCounters(a.counters_at_handover);
  const int fds[2] = {server_->listen_fd(), server_->admin_fd()};
  if (absl::Status s = a.channel->Send(ho, fds, absl::Now() + absl::Seconds(10)); !s.ok()) {
    return WithContext(s, "sending HandOver");
  }
  LOG(INFO) << "upgrade: HandOver sent (" << ho.sessions.sessions.size() << " client records, "
            << ho.counters.counters.size() << " counters)";

  // --- Owned: the point of no return ----------------------------------------------
  m = a.channel->Receive(absl::Now() + options_.owned_deadline);
  if (!m.ok()) return WithContext(m.status(), "waiting for Owned");
  if (const Abort* ab = std::get_if<Abort>(&m->message)) {
    return absl::AbortedError(absl::StrCat("new process aborted: ", ab->message));
  }
  const Owned* owned = std::get_if<Owned>(&m->message);
  if (owned == nullptr) return UnexpectedMessage(m->message, "Owned");
  const absl::Time owned_at = absl::Now();
  metrics_->SetLast("write_pause", owned_at - a.paused_at);
  mark("o_handover");
  LOG(INFO) << "upgrade: Owned by pid " << owned->pid << " generation " << owned->generation
            << " after " << absl::FormatDuration(owned_at - a.t0) << " (writes paused "
            << absl::FormatDuration(owned_at - a.paused_at) << ")";
  // From here on, nothing rolls back.
  handed_off_.store(true);

  // --- move the clients --------------------------------------------------------------
  if (absl::Status s = MaybeInjectFault(Phase::kOMoveClients); !s.ok()) {
    LOG(WARNING) << "upgrade: " << s << ": clients are cut instead of moved";
  } else {
    MoveResult r = MoveClientsBlocking(server_, server_->listen_address(), a.new_generation,
                                       options_.move_deadline);
    a.moved = r.acked;
    a.cut = r.sent - std::min(r.sent, r.acked);
    LOG(INFO) << "upgrade: " << r.sent << " clients told to move, " << a.moved << " acknowledged, "
              << a.cut << " cut";
  }
  metrics_->Add(UpgradeMetrics::kClientsMigrated, a.moved);
  metrics_->Add(UpgradeMetrics::kClientsCut, a.cut);
  mark("o_move_clients");
  if (absl::Status s = MaybeInjectFault(Phase::kODrain); !s.ok()) {
    LOG(WARNING) << "upgrade: " << s << " (past the point of no return: draining anyway)";
  }
  return absl::OkStatus();
}

void OldSide::Rollback(Attempt& a, const absl::Status& why) {
  LOG(WARNING) << "upgrade: rolling back: " << why;
  if (a.child.has_value()) {
    // Fencing: N must be dead before O takes RocksDB back.
    absl::StatusOr<ExitStatus> es = a.child->KillAndReap(absl::Now() + absl::Seconds(10));
    LOG(INFO) << "upgrade: new process " << a.child->pid() << " "
              << (es.ok() ? es->ToString() : es.status().ToString());
  }
  if (a.channel.has_value()) a.channel->Close();
  if (a.db_closed) {
    if (absl::Status s = server_->ReopenDbAfterFailedHandoff(); !s.ok()) {
      LOG(ERROR) << "upgrade: reopening RocksDB after the failed handoff: " << s;
    }
  }
  if (a.stopped_accepting) {
    (void)OnControl(
        server_, [](server::Server* sv) { sv->ResumeAccepting(); }, absl::Seconds(5));
  }
  if (a.paused) {
    (void)OnControlWithDone(
        server_,
        [](server::Server* sv, std::function<void()> done) { sv->ResumeWrites(std::move(done)); },
        absl::Seconds(5));
  }
  if (!a.header_name.empty()) (void)RemoveHandoffHeader(a.header_name);
  server_->metrics().Add(server::Counter::kRollbacks);
  server_->SetUpgradeInProgress(false);
  (void)SdNotifyReady();
  LOG(WARNING) << "upgrade: rolled back after " << absl::FormatDuration(absl::Now() - a.t0)
               << "; generation " << server_->generation() << " serves on";
}

int OldSide::FinishAfterRun(const absl::Status& run_status) {
  const int code = run_status.ok() ? 0 : 3;
  if (!handed_off_.load()) {
    if (thread_.joinable()) thread_.join();
    return code;
  }
  if (thread_.joinable()) thread_.join();
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
  if (absl::Status s = a.channel->Send(g, absl::Now() + absl::Seconds(5)); !s.ok()) {
    LOG(WARNING) << "upgrade: sending Gone: " << s;
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
