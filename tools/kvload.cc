// kvload: the load generator that proves kvnode's claims.
//
//   kvload --server 127.0.0.1:7000 --workload A --clients 8 --threads 2
//          --depth 4 --duration 20 --verify --ack_log acks.log --report r.json
//   kvload --cluster 10.0.0.1:7000,10.0.0.2:7000 ...   (a cluster: every key
//          to its owner by the shard map, through libkvclient's ClusterClient)
//   kvload --audit acks.log      (every acknowledged write still readable?)
//   kvload ... --history h.tsv   then  kvhistory h.tsv   (linearizable?)
//
// Threads each drive several Clients (libkvclient; ClusterClients with
// --cluster), keeping --depth operations outstanding per client. With --verify every value written
// encodes its key and a per-key version under a checksum, every value read
// is checked (corrupt, wrong key, stale, missing, unknown version), and
// acknowledged writes go to --ack_log. With --history every operation (its
// client, key, value id, call and return times, outcome) goes to a history
// file that kvhistory checks for linearizability (history.h). A progress
// line goes to stderr each second; the summary to stdout, the JSON report to
// --report.
// Exit status: 0 all good; 1 a failed operation or verification (or a failed
// audit); 2 bad flags or no connection.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvnode/base/time_zone.h"
#include "kvnode/client/admin.h"
#include "kvnode/client/client.h"
#include "kvnode/client/cluster_client.h"
#include "kvnode/load/ack_log.h"
#include "kvnode/load/history.h"
#include "kvnode/load/report.h"
#include "kvnode/load/rng.h"
#include "kvnode/load/stall_meter.h"
#include "kvnode/load/verify.h"
#include "kvnode/load/workload.h"
#include "nlohmann/json.hpp"

DECLARE_bool(help);
DECLARE_string(helpmatch);

DEFINE_string(server, "127.0.0.1:7000", "the node's control endpoint HOST:PORT");
DEFINE_string(cluster, "",
              "seed nodes of a cluster, HOST:PORT[,HOST:PORT...] (instead of --server): the "
              "shard map comes from the first that answers and every key goes to its owner");
DEFINE_bool(follow_pushed_maps, true,
            "--cluster: take every shard map the nodes push; false keeps the map held until a "
            "WRONG_SHARD answer asks for a newer one (a client pinned to an old map)");
DEFINE_bool(slot_words, true,
            "--cluster: ask the nodes for slot words and check READs against them while a "
            "node's guard asks (`kvctl guard up`: every READ); false takes READs as they come");
DEFINE_string(auth_token_file, "", "file holding the node's auth token (mode 0600)");
DEFINE_string(rdma_device, "", "verbs device (default: the first ACTIVE one)");
DEFINE_string(workload, "A", "YCSB workload: A (50% reads), B (95%), C (read only)");
DEFINE_double(read_ratio, -1, "fraction of reads in [0,1]; overrides --workload when >= 0");
DEFINE_double(delete_ratio, 0, "fraction of writes that are DELETEs");
DEFINE_string(distribution, "zipfian", "key distribution: uniform | zipfian");
DEFINE_double(zipf_theta, 0.99, "zipfian skew, in (0,1)");
DEFINE_uint64(keys, 100000, "number of distinct keys");
DEFINE_uint64(key_size, 16, "bytes per key");
DEFINE_uint64(value_size, 64, "bytes per value (>= 32 with --verify)");
DEFINE_uint32(clients, 1, "client sessions (each its own QP)");
DEFINE_uint32(threads, 1, "threads driving the clients");
DEFINE_uint32(depth, 4, "outstanding operations per client (1..256)");
DEFINE_double(duration, 10, "seconds to run (ignored when --ops is set)");
DEFINE_uint64(ops, 0, "stop after this many operations in total (0: use --duration)");
DEFINE_bool(preload, false, "write every key once before the measured run");
DEFINE_bool(verify, false, "verify every value read; count stale reads");
DEFINE_string(ack_log, "", "append acknowledged writes to this file (for --audit)");
DEFINE_string(audit, "", "audit mode: check every write acknowledged in this ack log");
DEFINE_string(history, "",
              "write every operation (preload included) to this file, for kvhistory's "
              "linearizability check (value_size >= 32: values carry their version)");
DEFINE_bool(serial_key_writes, true,
            "at most one write of a key in flight (a write drawn for a busy key becomes a "
            "GET); --verify needs it. false: writes of a key race each other (for --history)");
DEFINE_string(report, "", "write the JSON report here");
DEFINE_string(latency_cdf, "",
              "write the GET latency CDF here (text: 'latency_us fraction' per line, "
              "fraction = share of GETs at or below latency_us), for plots");
DEFINE_uint64(seed, 1, "random seed");
DEFINE_uint32(timeout_ms, 10000, "deadline of each operation");
DEFINE_uint32(connect_timeout_ms, 5000,
              "bound on each wait for the node while (re)connecting (a node that died closes "
              "the connection and is noticed at once; this bounds a hung or very busy one)");
DEFINE_uint32(qp_timeout, 12,
              "local ACK timeout exponent of the QPs (4.096 us * 2^N per try, 0..31)");
DEFINE_uint32(qp_retry_cnt, 2, "transport retries of the QPs (0..7)");
DEFINE_bool(progress, true, "print a progress line to stderr every second");
DEFINE_bool(rpc_get, false, "GET by RPC instead of RDMA READ");
DEFINE_int32(location_cache, -1,
             "entries of each client's location cache (heap values' places); -1: four "
             "times --keys (at most 2^20; direct-mapped, so ~80% of the keys fit), 0: none");
DEFINE_bool(warm, false,
            "GET every key once on each client before the measured run (unmeasured): the "
            "location caches then know every heap value's place");
DEFINE_int32(node_pid, 0,
             "the node's pid (same host): its CPU time per operation goes into the report "
             "(from /proc/PID/stat) beside this process's own (getrusage)");
DEFINE_uint32(spin, 64, "idle polls before a thread blocks on its clients' events");

namespace {

using kvnode::client::Client;
using kvnode::client::ClientOptions;
using kvnode::client::ClientStats;
using kvnode::client::ClusterClient;
using kvnode::client::ClusterClientOptions;
using kvnode::client::ClusterStats;
using kvnode::client::OpKind;
using kvnode::client::OpRequest;
using kvnode::client::OpResult;
namespace load = kvnode::load;

using SteadyClock = std::chrono::steady_clock;
std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

struct Shared {
  load::WorkloadOptions wopt;
  std::optional<load::KeyChooser> chooser;
  std::unique_ptr<load::VersionTracker> tracker;
  std::unique_ptr<load::AckLogWriter> ack_log;
  std::unique_ptr<std::atomic<uint8_t>[]> write_busy;  // one write in flight per key
  std::atomic<uint64_t> issued{0};
  uint64_t ops_limit = 0;
  SteadyClock::time_point t0;
  absl::Time t0_abs;  // t0 on the clients' clock (their OpResult timestamps)
  SteadyClock::time_point end;
  bool verify = false;
  bool serial_key_writes = true;
  std::unique_ptr<load::HistoryWriter> history;  // --history, or null
  SteadyClock::time_point history_t0;            // its times are ns since this
  uint32_t threads = 1;
  std::atomic<uint64_t> preload_next{0};
  std::atomic<uint64_t> errors_logged{0};
};

// What one outstanding operation was.
struct Pending {
  load::OpType op = load::OpType::kRead;
  uint64_t key = 0;
  uint64_t version = 0;
  load::ReadSnapshot snap;
  bool preload = false;
  uint32_t client = 0;   // for --history: the client's index
  uint64_t call_ns = 0;  // for --history: before Submit
};

// What main() needs of a thread's worker, whichever client type it drives.
class WorkerBase {
 public:
  virtual ~WorkerBase() = default;
  virtual void Preload() = 0;
  virtual void Run() = 0;
  virtual load::LoadStats Snapshot() = 0;  // thread-safe, for the progress line
  virtual load::LoadStats TakeFinal() = 0;
  virtual uint64_t preload_failures() const = 0;
  virtual bool history_failed() const = 0;
  // Every key of [0, keys) read once by each client; returns the failures.
  virtual uint64_t Warm(uint64_t keys, uint64_t key_size) = 0;
  virtual bool fast_get() const = 0;
  // Adds the clients' counters (and, for ClusterClients, the cluster's).
  virtual void AddStats(ClientStats* client, ClusterStats* cluster) const = 0;
  virtual void CloseClients() = 0;
};

bool FastGet(const Client& c) { return c.fast_get(); }
// Node sessions open on first use: READs unless --rpc_get.
bool FastGet(const ClusterClient&) { return !FLAGS_rpc_get; }

void AddClusterStats(const Client&, ClusterStats*) {}
void AddClusterStats(const ClusterClient& c, ClusterStats* sum) {
  const ClusterStats& s = c.cluster_stats();
  sum->map_epoch = std::max(sum->map_epoch, s.map_epoch);
  sum->maps_adopted += s.maps_adopted;
  sum->maps_ignored += s.maps_ignored;
  sum->maps_dropped += s.maps_dropped;
  sum->map_requests += s.map_requests;
  sum->wrong_shard += s.wrong_shard;
  sum->reroutes += s.reroutes;
  sum->shard_unavailable += s.shard_unavailable;
  sum->epochs_refused += s.epochs_refused;
  for (const kvnode::client::ClusterNodeStats& n : s.nodes) {
    auto it = std::find_if(sum->nodes.begin(), sum->nodes.end(),
                           [&](const auto& m) { return m.node_id == n.node_id; });
    if (it == sum->nodes.end()) {
      sum->nodes.push_back(n);
    } else {
      it->ops += n.ops;
      it->connected |= n.connected;
    }
  }
}

// One thread's clients (C: Client, or ClusterClient with --cluster; both
// have the same asynchronous API) and the loop that drives them.
template <class C>
class Worker : public WorkerBase {
 public:
  Worker(Shared* shared, uint32_t index, std::vector<std::unique_ptr<C>> clients)
      : shared_(shared),
        index_(index),
        clients_(std::move(clients)),
        rng_(load::Rng::ForStream(shared->wopt.seed, index)) {
    for (auto& c : clients_) raw_.push_back(c.get());
    // Clients were dealt round-robin to the threads: client j of thread t
    // is client t + j * threads.
    for (uint32_t j = 0; j < raw_.size(); ++j) client_ids_.push_back(index + j * shared->threads);
    // Each client has --depth operations plus up to --depth held writes
    // (libkvclient's max_outstanding_writes) in flight.
    pending_.resize(clients_.size() * FLAGS_depth * 2);
    for (uint32_t i = 0; i < pending_.size(); ++i) free_.push_back(i);
    value_.resize(std::max<size_t>(shared->wopt.value_size, 1));
  }

  // Phase 1 (optional): every key once, keys taken from a shared counter.
  void Preload() override { Loop(/*preload=*/true); }
  void Run() override { Loop(/*preload=*/false); }

  load::LoadStats Snapshot() override {
    std::lock_guard<std::mutex> l(mu_);
    return published_;
  }
  load::LoadStats TakeFinal() override {
    std::lock_guard<std::mutex> l(mu_);
    return stats_;
  }
  uint64_t preload_failures() const override { return preload_failures_; }
  bool history_failed() const override { return history_failed_; }
  bool fast_get() const override { return FastGet(*clients_.front()); }

  uint64_t Warm(uint64_t keys, uint64_t key_size) override {
    std::string key;
    uint64_t failed = 0;
    for (const auto& c : clients_) {
      for (uint64_t k = 0; k < keys; ++k) {
        load::FormatKeyTo(k, key_size, &key);
        absl::StatusOr<kvnode::client::GetResult> g =
            c->Get(key, absl::Now() + absl::Milliseconds(FLAGS_timeout_ms));
        if (!g.ok() && !absl::IsNotFound(g.status())) ++failed;
      }
    }
    return failed;
  }

  void AddStats(ClientStats* cs, ClusterStats* cluster) const override {
    for (const auto& c : clients_) {
      const ClientStats& s = c->stats();
      cs->gets_by_read += s.gets_by_read;
      cs->gets_by_rpc += s.gets_by_rpc;
      cs->read_retries += s.read_retries;
      cs->rpc_fallbacks += s.rpc_fallbacks;
      cs->rpc_resends += s.rpc_resends;
      cs->busy += s.busy;
      cs->reconnects += s.reconnects;
      cs->moves += s.moves;
      cs->moves_refused += s.moves_refused;
      cs->timeouts += s.timeouts;
      cs->stale_responses += s.stale_responses;
      cs->location_hits += s.location_hits;
      cs->location_stale += s.location_stale;
      cs->reads_not_served += s.reads_not_served;
      AddClusterStats(*c, cluster);
    }
  }

  void CloseClients() override {
    for (const auto& c : clients_) (void)c->Close();
  }

 private:
  bool NextPreloadKey(uint64_t* key) {
    uint64_t k = shared_->preload_next.fetch_add(1);
    if (k >= shared_->wopt.keys) return false;
    *key = k;
    return true;
  }

  bool MayIssue() {
    if (g_stop.load(std::memory_order_relaxed)) return false;
    if (shared_->ops_limit > 0) {
      return shared_->issued.load(std::memory_order_relaxed) < shared_->ops_limit;
    }
    return SteadyClock::now() < shared_->end;
  }

  // Submits one operation on client c; false if nothing more to issue.
  bool IssueOne(uint32_t ci, bool preload) {
    C* c = raw_[ci];
    Pending p;
    p.client = client_ids_[ci];
    if (preload) {
      if (!NextPreloadKey(&p.key)) return false;
      p.op = load::OpType::kPut;
      p.preload = true;
    } else {
      if (shared_->ops_limit > 0 &&
          shared_->issued.fetch_add(1, std::memory_order_relaxed) >= shared_->ops_limit) {
        return false;
      }
      p.op = load::ChooseOp(shared_->wopt, rng_);
      p.key = shared_->chooser->Next(rng_);
      // Every write this client may have in flight is held (writes paused
      // by a live upgrade): a GET instead, so reads never wait for writes.
      if (p.op != load::OpType::kRead && c->available(OpKind::kPut) == 0) {
        p.op = load::OpType::kRead;
      }
    }
    if (p.op != load::OpType::kRead && shared_->serial_key_writes) {
      uint8_t expected = 0;
      if (!shared_->write_busy[p.key].compare_exchange_strong(expected, 1)) {
        if (preload) return true;    // cannot happen: each key once
        p.op = load::OpType::kRead;  // a write of this key is in flight: read it instead
      }
    }
    load::FormatKeyTo(p.key, shared_->wopt.key_size, &key_);
    OpRequest req;
    req.key = key_;
    // Deadline: the client's op_timeout (--timeout_ms) from its own clock
    // reading at Submit; the latency is measured from that same reading.
    switch (p.op) {
      case load::OpType::kRead:
        req.kind = OpKind::kGet;
        if (shared_->verify) p.snap = shared_->tracker->Snapshot(p.key);
        break;
      case load::OpType::kPut:
        req.kind = OpKind::kPut;
        p.version = shared_->tracker->BeginWrite(p.key, false);
        if (value_.size() >= load::kMinVerifiedValueSize) {
          load::EncodeVerifiedValue(key_, p.version, std::span<char>(value_));
        }
        req.value = std::string_view(value_.data(), shared_->wopt.value_size);
        break;
      case load::OpType::kDelete:
        req.kind = OpKind::kDelete;
        p.version = shared_->tracker->BeginWrite(p.key, true);
        break;
    }
    const uint32_t slot = free_.back();
    req.user_data = slot;
    if (shared_->history != nullptr) p.call_ns = HistoryNow();
    absl::Status st = c->Submit(req);
    if (!st.ok()) {
      if (p.op != load::OpType::kRead) shared_->write_busy[p.key].store(0);
      if (shared_->history != nullptr) RecordHistory(p, HistoryNow(), st, "");
      Fail(p, st);
      return false;  // the client is closed or lost for good: stop issuing
    }
    free_.pop_back();
    pending_[slot] = p;
    return true;
  }

  uint64_t HistoryNow() const {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     SteadyClock::now() - shared_->history_t0)
                                     .count());
  }

  // One history line into this thread's buffer, handed to the writer in
  // 256 KiB chunks (and at the end of each phase).
  void RecordHistory(const Pending& p, uint64_t return_ns, const absl::Status& st,
                     std::string_view value) {
    load::HistoryEvent e;
    e.client = p.client;
    e.kind = p.op == load::OpType::kRead  ? load::HistoryOpKind::kGet
             : p.op == load::OpType::kPut ? load::HistoryOpKind::kPut
                                          : load::HistoryOpKind::kDelete;
    load::FormatKeyTo(p.key, shared_->wopt.key_size, &history_key_);
    e.key = history_key_;
    e.call_ns = p.call_ns;
    e.return_ns = std::max(return_ns, p.call_ns);
    e.outcome = st.ok()                ? load::HistoryOutcome::kOk
                : absl::IsNotFound(st) ? load::HistoryOutcome::kNotFound
                                       : load::HistoryOutcome::kFailed;
    history_value_.clear();
    if (p.op == load::OpType::kPut) {
      absl::StrAppend(&history_value_, p.version);
    } else if (p.op == load::OpType::kRead && st.ok()) {
      history_value_.assign(value);
    }
    e.value = history_value_;
    load::AppendHistoryLine(e, &history_buf_);
    if (history_buf_.size() >= (256u << 10)) FlushHistory();
  }

  void FlushHistory() {
    if (history_buf_.empty()) return;
    if (absl::Status st = shared_->history->Append(history_buf_); !st.ok()) {
      if (!history_failed_) LOG(ERROR) << "kvload: --history: " << st;
      history_failed_ = true;
    }
    history_buf_.clear();
  }

  // The id of a value read: the version it carries, or for a value that
  // fails the check its kind and a digest (never equal to a written id).
  std::string ReadValueId(std::string_view key, std::string_view value) const {
    const load::CheckedValue c = load::CheckVerifiedValue(key, value);
    switch (c.check) {
      case load::ValueCheck::kOk:
        return absl::StrCat(c.version);
      case load::ValueCheck::kWrongKey:
        return absl::StrCat("wrong_key:", absl::Hex(load::KeyHash(value)));
      case load::ValueCheck::kCorrupt:
        break;
    }
    return absl::StrCat("corrupt:", absl::Hex(load::KeyHash(value)));
  }

  uint64_t SinceT0(absl::Time t) const {
    const int64_t ns = absl::ToInt64Nanoseconds(t - shared_->t0_abs);
    return ns > 0 ? static_cast<uint64_t>(ns) : 0;
  }

  void Fail(const Pending& p, const absl::Status& st) {
    if (p.preload) {
      ++preload_failures_;
    } else {
      stats_.RecordFailure(kvnode::client::IsShardUnavailable(st));
    }
    if (shared_->errors_logged.fetch_add(1) < 20) {
      LOG(ERROR) << "kvload: " << load::OpTypeName(p.op) << " of key " << p.key
                 << (p.preload ? " (preload)" : "") << " failed: " << st;
    }
  }

  // `return_ns`: the history clock read after the Poll that found it.
  void Complete(const OpResult& r, bool writes_held, uint64_t return_ns) {
    const uint32_t slot = static_cast<uint32_t>(r.user_data);
    const Pending p = pending_[slot];
    if (shared_->history != nullptr) {
      std::string id;
      if (p.op == load::OpType::kRead && r.status.ok()) {
        load::FormatKeyTo(p.key, shared_->wopt.key_size, &key_);
        id = ReadValueId(key_, r.value);
      }
      RecordHistory(p, return_ns, r.status, id);
    }
    if (p.op == load::OpType::kRead && !p.preload && writes_held) {
      ++stats_.reads_while_writes_held;
    }
    free_.push_back(slot);
    // The client's timestamps: its clock reading at Submit and at the Poll
    // that found the completion (one reading per event, shared by all).
    const uint64_t start_ns = SinceT0(r.submitted);
    const uint64_t end_ns = SinceT0(r.completed);
    const bool not_found = absl::IsNotFound(r.status);
    if (p.op != load::OpType::kRead) {
      if (r.status.ok() || (p.op == load::OpType::kDelete && not_found)) {
        const bool del = p.op == load::OpType::kDelete;
        shared_->tracker->AckWrite(p.key, p.version, del);
        if (shared_->ack_log != nullptr) {
          absl::Status st = shared_->ack_log->Append(load::FormatKey(p.key, shared_->wopt.key_size),
                                                     p.version, del);
          if (!st.ok()) LOG(ERROR) << "kvload: ack log: " << st;
        }
        shared_->write_busy[p.key].store(0);
        if (!p.preload) stats_.RecordCompletion(p.op, start_ns, end_ns);
      } else {
        shared_->write_busy[p.key].store(0);
        Fail(p, r.status);
      }
      return;
    }
    if (!r.status.ok() && !not_found) {
      Fail(p, r.status);
      return;
    }
    stats_.RecordCompletion(p.op, start_ns, end_ns, not_found);
    if (shared_->verify) {
      load::FormatKeyTo(p.key, shared_->wopt.key_size, &key_);
      const std::string& key = key_;
      const load::ReadVerdict v = shared_->tracker->CheckRead(
          p.key, key, p.snap, not_found ? std::nullopt : std::optional<std::string_view>(r.value));
      stats_.RecordVerdict(v);
      if (v != load::ReadVerdict::kOk && shared_->errors_logged.fetch_add(1) < 20) {
        LOG(ERROR) << "kvload: read of " << key << ": " << load::ReadVerdictName(v)
                   << " (acked version at issue " << p.snap.acked_version << ", read "
                   << (not_found ? "NOT_FOUND" : absl::StrCat(r.value.size(), " bytes"))
                   << (r.via_rpc ? " by RPC" : " by READ") << ")";
      }
    }
  }

  // Issues on every client what it has room for, then polls each once (a
  // full batch is polled again: no second, empty Poll). The clock is read
  // only when there is room to issue (the end of the run) and every 256
  // rounds (the progress snapshot), never per empty poll.
  void Loop(bool preload) {
    OpResult results[32];
    uint32_t idle = 0;
    uint32_t rounds = 0;
    auto next_publish = SteadyClock::now();
    bool issuing = true;
    for (;;) {
      bool progress = false;
      bool room = false;
      for (C* c : raw_) {
        room |= c->available(preload ? OpKind::kPut : OpKind::kGet) > 0;
      }
      if (issuing && room && !free_.empty()) issuing = preload ? !g_stop.load() : MayIssue();
      for (uint32_t ci = 0; ci < raw_.size(); ++ci) {
        C* c = raw_[ci];
        // The preload only writes; the run picks a GET when writes are held.
        while (issuing && c->available(preload ? OpKind::kPut : OpKind::kGet) > 0 &&
               !free_.empty()) {
          if (!IssueOne(ci, preload)) {
            issuing = false;
            break;
          }
          progress = true;
        }
        size_t n;
        do {
          n = c->Poll(std::span<OpResult>(results));
          if (n == 0) break;
          const bool held = c->writes_held() > 0;
          const uint64_t return_ns = shared_->history != nullptr ? HistoryNow() : 0;
          for (size_t i = 0; i < n; ++i) Complete(results[i], held, return_ns);
          progress = true;
        } while (n == std::size(results));
      }
      if (++rounds % 256 == 0 || !issuing) {
        const auto now = SteadyClock::now();
        if (now >= next_publish) {
          std::lock_guard<std::mutex> l(mu_);
          published_ = stats_;
          next_publish = now + std::chrono::milliseconds(250);
        }
      }
      if (!issuing) {
        bool any = false;
        for (C* c : raw_) any |= c->outstanding() > 0;
        if (!any) break;
      }
      if (progress) {
        idle = 0;
      } else if (++idle > FLAGS_spin) {
        C::WaitAny(raw_, absl::Now() + absl::Milliseconds(issuing ? 2 : 10));
      }
    }
    if (shared_->history != nullptr) FlushHistory();
    std::lock_guard<std::mutex> l(mu_);
    published_ = stats_;
  }

  Shared* shared_;
  uint32_t index_;
  std::vector<std::unique_ptr<C>> clients_;
  std::vector<C*> raw_;
  std::vector<uint32_t> client_ids_;  // raw_[i]'s index among all clients
  load::Rng rng_;
  std::vector<Pending> pending_;
  std::vector<uint32_t> free_;
  std::vector<char> value_;
  std::string key_;
  load::LoadStats stats_;
  uint64_t preload_failures_ = 0;
  std::string history_buf_;
  std::string history_key_;
  std::string history_value_;
  bool history_failed_ = false;
  std::mutex mu_;
  load::LoadStats published_;
};

ClientOptions MakeClientOptions(const std::string& token, uint32_t depth) {
  ClientOptions o;
  o.server = FLAGS_server;
  o.auth_token = token;
  o.client_name = "kvload";
  o.rdma_device = FLAGS_rdma_device;
  o.max_outstanding = depth;
  o.op_timeout = absl::Milliseconds(FLAGS_timeout_ms);
  o.connect_timeout = absl::Milliseconds(FLAGS_connect_timeout_ms);
  o.rpc_get_only = FLAGS_rpc_get;
  // Out-of-range values are left to ClientOptions::Validate to reject.
  o.qp_timeout = static_cast<uint8_t>(std::min<uint32_t>(FLAGS_qp_timeout, 255));
  o.qp_retry_cnt = static_cast<uint8_t>(std::min<uint32_t>(FLAGS_qp_retry_cnt, 255));
  o.location_cache_entries =
      FLAGS_location_cache >= 0
          ? static_cast<uint32_t>(std::min<int64_t>(FLAGS_location_cache, 1 << 20))
          : static_cast<uint32_t>(std::min<uint64_t>(4 * FLAGS_keys, 1 << 20));
  return o;
}

std::vector<std::string> SplitSeeds(const std::string& list) {
  std::vector<std::string> seeds;
  size_t from = 0;
  while (from <= list.size()) {
    const size_t comma = std::min(list.find(',', from), list.size());
    if (comma > from) seeds.push_back(list.substr(from, comma - from));
    from = comma + 1;
  }
  return seeds;
}

// Where the clients go: --server, or --cluster's seeds.
std::string Target() {
  return FLAGS_cluster.empty() ? FLAGS_server : absl::StrCat("cluster ", FLAGS_cluster);
}

// Connects one client of type C (Client to --server, ClusterClient to the
// --cluster seeds).
template <class C>
absl::StatusOr<std::unique_ptr<C>> ConnectOne(const std::string& token, uint32_t depth) {
  if constexpr (std::is_same_v<C, ClusterClient>) {
    ClusterClientOptions o;
    o.seeds = SplitSeeds(FLAGS_cluster);
    o.base = MakeClientOptions(token, depth);
    o.follow_pushed_maps = FLAGS_follow_pushed_maps;
    o.slot_words = FLAGS_slot_words;
    return ClusterClient::Connect(std::move(o));
  } else {
    return Client::Connect(MakeClientOptions(token, depth));
  }
}

template <class C>
int RunAudit(const std::string& token) {
  absl::StatusOr<load::AckLogContents> log = load::ReadAckLog(FLAGS_audit);
  if (!log.ok()) {
    std::fprintf(stderr, "kvload --audit: %s\n", log.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<C>> c = ConnectOne<C>(token, 1);
  if (!c.ok()) {
    std::fprintf(stderr, "kvload --audit: connect to %s: %s\n", Target().c_str(),
                 c.status().ToString().c_str());
    return 2;
  }
  C* client = c->get();
  load::AuditReport rep = load::Audit(
      log->records, [&](const std::string& key) -> absl::StatusOr<std::optional<std::string>> {
        absl::StatusOr<kvnode::client::GetResult> g =
            client->Get(key, absl::Now() + absl::Milliseconds(FLAGS_timeout_ms));
        if (absl::IsNotFound(g.status())) return std::optional<std::string>();
        if (!g.ok()) return g.status();
        return std::optional<std::string>(std::move(g->value));
      });
  nlohmann::json j = rep.ToJson();
  j["ack_log"] = FLAGS_audit;
  j["torn_tail_bytes"] = log->torn_tail_bytes;
  j["passed"] = rep.passed();
  std::printf(
      "audit of %s: %llu records, %llu keys: %llu ok, %llu missing, %llu stale, "
      "%llu resurrected, %llu corrupt, %llu wrong key, %llu read errors -> %s\n",
      FLAGS_audit.c_str(), static_cast<unsigned long long>(rep.records),
      static_cast<unsigned long long>(rep.keys), static_cast<unsigned long long>(rep.ok),
      static_cast<unsigned long long>(rep.missing), static_cast<unsigned long long>(rep.stale),
      static_cast<unsigned long long>(rep.resurrected),
      static_cast<unsigned long long>(rep.corrupt), static_cast<unsigned long long>(rep.wrong_key),
      static_cast<unsigned long long>(rep.read_errors), rep.passed() ? "PASSED" : "FAILED");
  for (const auto& issue : rep.issues) {
    std::printf("  %s: %s\n", issue.key.c_str(), issue.problem.c_str());
  }
  if (!FLAGS_report.empty()) {
    std::ofstream(FLAGS_report) << j.dump(2) << "\n";
  }
  (void)client->Close();
  return rep.passed() ? 0 : 1;
}

// --clients clients of type C dealt round-robin to `threads` workers.
template <class C>
absl::StatusOr<std::vector<std::unique_ptr<WorkerBase>>> MakeWorkers(Shared* shared,
                                                                     const std::string& token,
                                                                     uint32_t threads) {
  std::vector<std::vector<std::unique_ptr<C>>> per_thread(threads);
  for (uint32_t i = 0; i < FLAGS_clients; ++i) {
    absl::StatusOr<std::unique_ptr<C>> c = ConnectOne<C>(token, FLAGS_depth);
    if (!c.ok()) {
      return absl::Status(c.status().code(), absl::StrCat("client ", i, ": connect to ", Target(),
                                                          ": ", c.status().message()));
    }
    per_thread[i % threads].push_back(*std::move(c));
  }
  std::vector<std::unique_ptr<WorkerBase>> workers;
  for (uint32_t t = 0; t < threads; ++t) {
    workers.push_back(std::make_unique<Worker<C>>(shared, t, std::move(per_thread[t])));
  }
  return workers;
}

// The report's "cluster" object and "nodes" (ops per node id, of the
// measured run: the preload and --warm are taken off).
void AddClusterReport(const ClusterStats& c, const ClusterStats& before, nlohmann::json* report) {
  (*report)["cluster"] = {
      {"seeds", FLAGS_cluster},
      {"map_epoch", c.map_epoch},
      {"maps_adopted", c.maps_adopted},
      {"maps_ignored", c.maps_ignored},
      {"maps_dropped", c.maps_dropped},
      {"map_requests", c.map_requests},
      {"wrong_shard", c.wrong_shard - before.wrong_shard},
      {"reroutes", c.reroutes - before.reroutes},
      {"epochs_refused", c.epochs_refused - before.epochs_refused},
  };
  nlohmann::json nodes = nlohmann::json::object();
  for (const kvnode::client::ClusterNodeStats& n : c.nodes) {
    uint64_t earlier = 0;
    for (const auto& b : before.nodes) {
      if (b.node_id == n.node_id) earlier = b.ops;
    }
    nodes[n.node_id] = {{"ops", n.ops - earlier}, {"endpoint", n.endpoint}, {"alive", n.alive}};
  }
  (*report)["nodes"] = std::move(nodes);
}

// "cluster: map epoch 3, 0 shard_unavailable, 12 WRONG_SHARD, 12 reroutes;
// ops per node: a 1200, b 1180, c 1230"
std::string FormatClusterLine(const nlohmann::json& r) {
  const nlohmann::json& c = r["cluster"];
  std::string line = absl::StrCat(
      "cluster: map epoch ", c["map_epoch"].get<uint64_t>(), ", ",
      r["shard_unavailable"].get<uint64_t>(), " shard_unavailable, ",
      c["wrong_shard"].get<uint64_t>(), " WRONG_SHARD, ", c["reroutes"].get<uint64_t>(),
      " reroutes, ", c["epochs_refused"].get<uint64_t>(), " epochs refused; ops per node:");
  const char* sep = " ";
  for (const auto& [id, n] : r["nodes"].items()) {
    absl::StrAppend(&line, sep, id, " ", n["ops"].get<uint64_t>());
    sep = ", ";
  }
  return line;
}

// The CDF of `h` as (latency, cumulative fraction) points: every 0.1% up to
// 99.9%, then the tail more finely, then the max. Each latency is the
// histogram's bucket bound (within 1.6% above the true value).
bool WriteLatencyCdf(const std::string& path, const load::LatencyHistogram& h) {
  std::ofstream out(path);
  out << "# GET latency CDF from kvload: latency_us cumulative_fraction (" << h.count()
      << " GETs)\n";
  if (h.count() > 0) {
    std::vector<double> ps;
    for (int i = 1; i < 1000; ++i) ps.push_back(i * 0.1);
    for (int i = 1; i < 100; ++i) ps.push_back(99.9 + i * 0.001);
    ps.push_back(100.0);
    out << static_cast<double>(h.min()) / 1e3 << " 0\n";
    for (double p : ps) {
      out << static_cast<double>(h.Percentile(p)) / 1e3 << " " << p / 100 << "\n";
    }
  }
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  // A client logs its Move on its polling thread: no log line may read
  // /etc/localtime under glibc's time-zone lock (base/time_zone.h).
  kvnode::base::PinLocalTimeZone();
  gflags::SetUsageMessage(
      "load generator and verifier for kvnode.\n"
      "  kvload [--server HOST:PORT] [--workload A|B|C] [--clients N --threads T --depth D] "
      "[--duration S | --ops N] [--preload] [--verify --ack_log FILE] [--report FILE.json] "
      "[--history FILE]\n"
      "  kvload --cluster HOST:PORT[,HOST:PORT...] ...   (a cluster, instead of --server)\n"
      "  kvload --audit ACK_LOG [--server HOST:PORT | --cluster SEEDS]");
  // --help lists this program's own flags; --helpfull adds gflags' and glog's.
  gflags::ParseCommandLineNonHelpFlags(&argc, &argv, true);
  if (FLAGS_help) {
    FLAGS_help = false;
    FLAGS_helpmatch = __FILE__;
  }
  gflags::HandleCommandLineHelpFlags();
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);

  std::string token;
  if (!FLAGS_auth_token_file.empty()) {
    absl::StatusOr<std::string> t = kvnode::client::ReadAuthTokenFile(FLAGS_auth_token_file);
    if (!t.ok()) {
      std::fprintf(stderr, "kvload: %s\n", t.status().ToString().c_str());
      return 2;
    }
    token = *t;
  }
  // --server has a default: only an explicit one conflicts with --cluster.
  if (!FLAGS_cluster.empty() && !gflags::GetCommandLineFlagInfoOrDie("server").is_default) {
    std::fprintf(stderr,
                 "kvload: --cluster and --server exclude each other (--cluster takes the seed "
                 "nodes; the shard map says where each key goes)\n");
    return 2;
  }
  if (!FLAGS_cluster.empty() && SplitSeeds(FLAGS_cluster).empty()) {
    std::fprintf(stderr, "kvload: --cluster '%s' names no seed HOST:PORT\n", FLAGS_cluster.c_str());
    return 2;
  }
  if (!FLAGS_audit.empty()) {
    return FLAGS_cluster.empty() ? RunAudit<Client>(token) : RunAudit<ClusterClient>(token);
  }

  Shared shared;
  load::WorkloadOptions& w = shared.wopt;
  if (FLAGS_read_ratio >= 0) {
    w.read_ratio = FLAGS_read_ratio;
  } else {
    absl::StatusOr<double> r = load::ReadRatioForWorkload(FLAGS_workload);
    if (!r.ok()) {
      std::fprintf(stderr, "kvload: --workload: %s\n", r.status().ToString().c_str());
      return 2;
    }
    w.read_ratio = *r;
  }
  w.delete_ratio = FLAGS_delete_ratio;
  w.keys = FLAGS_keys;
  w.key_size = FLAGS_key_size;
  w.value_size = FLAGS_value_size;
  absl::StatusOr<load::KeyDistribution> dist = load::ParseKeyDistribution(FLAGS_distribution);
  if (!dist.ok()) {
    std::fprintf(stderr, "kvload: --distribution: %s\n", dist.status().ToString().c_str());
    return 2;
  }
  w.distribution = *dist;
  w.zipf_theta = FLAGS_zipf_theta;
  w.seed = FLAGS_seed;
  if (absl::Status st = w.Validate(FLAGS_verify); !st.ok()) {
    std::fprintf(stderr, "kvload: %s\n", st.ToString().c_str());
    return 2;
  }
  if (FLAGS_clients < 1 || FLAGS_threads < 1 || FLAGS_depth < 1 || FLAGS_depth > 256) {
    std::fprintf(stderr, "kvload: need --clients >= 1, --threads >= 1, --depth 1..256\n");
    return 2;
  }
  if (!FLAGS_ack_log.empty() && !FLAGS_verify) {
    std::fprintf(stderr, "kvload: --ack_log needs --verify (values must carry versions)\n");
    return 2;
  }
  if (FLAGS_verify && !FLAGS_serial_key_writes) {
    std::fprintf(stderr,
                 "kvload: --verify needs --serial_key_writes (its stale check assumes one "
                 "write per key in flight)\n");
    return 2;
  }
  if (!FLAGS_history.empty() && w.value_size < load::kMinVerifiedValueSize) {
    std::fprintf(stderr, "kvload: --history needs --value_size >= %zu (values carry versions)\n",
                 load::kMinVerifiedValueSize);
    return 2;
  }
  absl::StatusOr<load::KeyChooser> chooser = load::KeyChooser::Create(w);
  if (!chooser.ok()) {
    std::fprintf(stderr, "kvload: %s\n", chooser.status().ToString().c_str());
    return 2;
  }
  shared.chooser.emplace(*std::move(chooser));
  // Versions keep growing across runs that share an ack log and a node.
  const uint64_t base = static_cast<uint64_t>(absl::ToUnixSeconds(absl::Now())) << 24;
  shared.tracker = std::make_unique<load::VersionTracker>(w.keys, base);
  shared.write_busy = std::make_unique<std::atomic<uint8_t>[]>(w.keys);
  shared.verify = FLAGS_verify;
  shared.serial_key_writes = FLAGS_serial_key_writes;
  shared.ops_limit = FLAGS_ops;
  if (!FLAGS_history.empty()) {
    absl::StatusOr<std::unique_ptr<load::HistoryWriter>> h =
        load::HistoryWriter::Create(FLAGS_history);
    if (!h.ok()) {
      std::fprintf(stderr, "kvload: --history: %s\n", h.status().ToString().c_str());
      return 2;
    }
    shared.history = *std::move(h);
  }
  if (!FLAGS_ack_log.empty()) {
    absl::StatusOr<std::unique_ptr<load::AckLogWriter>> a = load::AckLogWriter::Open(FLAGS_ack_log);
    if (!a.ok()) {
      std::fprintf(stderr, "kvload: --ack_log: %s\n", a.status().ToString().c_str());
      return 2;
    }
    shared.ack_log = *std::move(a);
  }

  // Connect every client up front (a node that is not there fails fast).
  const uint32_t threads = std::min(FLAGS_threads, FLAGS_clients);
  shared.threads = threads;
  absl::StatusOr<std::vector<std::unique_ptr<WorkerBase>>> made =
      FLAGS_cluster.empty() ? MakeWorkers<Client>(&shared, token, threads)
                            : MakeWorkers<ClusterClient>(&shared, token, threads);
  if (!made.ok()) {
    std::fprintf(stderr, "kvload: %s\n", made.status().ToString().c_str());
    return 2;
  }
  std::vector<std::unique_ptr<WorkerBase>> workers = *std::move(made);
  std::fprintf(stderr, "kvload: %u clients on %u threads, depth %u, %s GETs, to %s\n",
               FLAGS_clients, threads, FLAGS_depth, workers[0]->fast_get() ? "RDMA READ" : "RPC",
               Target().c_str());

  auto run_phase = [&](bool preload) {
    std::vector<std::thread> ts;
    for (auto& wk : workers) {
      ts.emplace_back([&wk, preload] { preload ? wk->Preload() : wk->Run(); });
    }
    return ts;
  };

  // The history's clock starts before the preload, whose writes it holds
  // too (the --warm phase's GETs it does not).
  shared.history_t0 = SteadyClock::now();
  uint64_t preload_failures = 0;
  if (FLAGS_preload) {
    const auto p0 = SteadyClock::now();
    shared.t0 = p0;
    shared.t0_abs = absl::Now();
    for (auto& t : run_phase(true)) t.join();
    for (auto& wk : workers) preload_failures += wk->preload_failures();
    std::fprintf(stderr, "kvload: preloaded %llu keys in %.2fs (%llu failed)\n",
                 static_cast<unsigned long long>(w.keys),
                 std::chrono::duration<double>(SteadyClock::now() - p0).count(),
                 static_cast<unsigned long long>(preload_failures));
  }

  if (FLAGS_warm) {
    const auto w0 = SteadyClock::now();
    uint64_t failed = 0;
    for (auto& wk : workers) failed += wk->Warm(w.keys, w.key_size);
    std::fprintf(stderr, "kvload: warmed (every key read once per client) in %.2fs, %llu failed\n",
                 std::chrono::duration<double>(SteadyClock::now() - w0).count(),
                 static_cast<unsigned long long>(failed));
  }
  ClientStats before_run;
  ClusterStats cluster_before;
  for (auto& wk : workers) wk->AddStats(&before_run, &cluster_before);
  const load::CpuTimes cpu0 = load::SampleCpu(FLAGS_node_pid);
  shared.t0 = SteadyClock::now();
  shared.t0_abs = absl::Now();
  shared.end = shared.t0 + std::chrono::microseconds(static_cast<int64_t>(FLAGS_duration * 1e6));
  std::optional<load::StallMeter> stall_meter(std::in_place, shared.t0);
  std::vector<std::thread> ts = run_phase(false);
  // Progress line each second until every worker is done.
  std::atomic<int> running{static_cast<int>(ts.size())};
  std::vector<std::thread> joiners;
  std::mutex done_mu;
  std::condition_variable done_cv;
  for (auto& t : ts) {
    joiners.emplace_back([&t, &running, &done_mu, &done_cv] {
      t.join();
      std::lock_guard<std::mutex> l(done_mu);
      running.fetch_sub(1);
      done_cv.notify_all();
    });
  }
  load::LoadStats before;
  auto last = shared.t0;
  for (;;) {
    std::unique_lock<std::mutex> l(done_mu);
    done_cv.wait_until(l, last + std::chrono::seconds(1), [&] { return running.load() == 0; });
    if (running.load() == 0) break;
    l.unlock();
    const auto now = SteadyClock::now();
    load::LoadStats cur;
    for (auto& wk : workers) cur.Merge(wk->Snapshot());
    if (FLAGS_progress) {
      std::fprintf(
          stderr, "%s\n",
          load::FormatProgressLine(std::chrono::duration<double>(now - shared.t0).count(),
                                   std::chrono::duration<double>(now - last).count(), cur, before)
              .c_str());
    }
    before = std::move(cur);
    last = now;
  }
  for (auto& j : joiners) j.join();
  const double duration_s = std::chrono::duration<double>(SteadyClock::now() - shared.t0).count();
  const load::CpuTimes cpu1 = load::SampleCpu(FLAGS_node_pid);
  const load::StallMeter::Stall stall = stall_meter->Get();
  stall_meter.reset();

  load::LoadStats total;
  ClientStats cs;
  ClusterStats cluster;
  for (auto& wk : workers) {
    total.Merge(wk->TakeFinal());
    wk->AddStats(&cs, &cluster);
  }
  if (shared.ack_log != nullptr) {
    if (absl::Status st = shared.ack_log->Flush(); !st.ok()) {
      LOG(ERROR) << "kvload: ack log flush: " << st;
      total.RecordFailure();
    }
  }
  bool history_ok = true;
  if (shared.history != nullptr) {
    for (auto& wk : workers) history_ok &= !wk->history_failed();
    if (absl::Status st = shared.history->Close(); !st.ok()) {
      LOG(ERROR) << "kvload: --history: " << st;
      history_ok = false;
    }
  }
  nlohmann::json config = {
      {"server", FLAGS_cluster.empty() ? FLAGS_server : ""},
      {"cluster", FLAGS_cluster},
      {"workload", FLAGS_workload},
      {"read_ratio", w.read_ratio},
      {"distribution", FLAGS_distribution},
      {"zipf_theta", w.zipf_theta},
      {"keys", w.keys},
      {"key_size", w.key_size},
      {"value_size", w.value_size},
      {"clients", FLAGS_clients},
      {"threads", threads},
      {"depth", FLAGS_depth},
      {"duration", FLAGS_duration},
      {"ops_limit", FLAGS_ops},
      {"preload", FLAGS_preload},
      {"verify", FLAGS_verify},
      {"rpc_get", FLAGS_rpc_get},
  };
  nlohmann::json report = load::BuildReport(total, duration_s, config);
  report["client"] = {
      {"gets_by_read", cs.gets_by_read},
      {"gets_by_rpc", cs.gets_by_rpc},
      {"read_retries", cs.read_retries},
      {"rpc_fallbacks", cs.rpc_fallbacks},
      {"rpc_resends", cs.rpc_resends},
      {"busy", cs.busy},
      {"reconnects", cs.reconnects},
      {"moves", cs.moves},
      {"timeouts", cs.timeouts},
      {"stale_responses", cs.stale_responses},
      {"preload_failures", preload_failures},
  };
  report["client"]["moves_refused"] = cs.moves_refused;
  // Of the measured run only (a --warm phase's GETs are not counted).
  report["client"]["location_hits"] = cs.location_hits - before_run.location_hits;
  report["client"]["location_stale"] = cs.location_stale - before_run.location_stale;
  // GETs whose READs showed the node no longer served the slot (slot words).
  report["client"]["reads_not_served"] = cs.reads_not_served;
  report["cpu"] = load::CpuJson(cpu0, cpu1, total.ops());
  if (!FLAGS_cluster.empty()) AddClusterReport(cluster, cluster_before, &report);
  // The timeline's t = 0 on the wall clock, to set its gaps against the
  // node's log lines.
  report["start_unix_s"] = absl::ToDoubleSeconds(shared.t0_abs - absl::UnixEpoch());
  // This process's machine standing still (load::StallMeter): the longest
  // late wake-up of a 5 ms sleeper, when it began, and how many exceeded 50 ms.
  report["stall_ms"] = stall.longest_ms;
  report["stall_start_ms"] = stall.start_ms;
  report["stalls_over_50ms"] = stall.over_50ms;
  std::printf("%s", load::FormatSummary(report).c_str());
  std::printf(
      "client: %llu GETs by READ, %llu by RPC (%llu fallbacks, %llu torn-read retries), "
      "%llu resends, %llu BUSY, %llu reconnects, %llu moves\n",
      static_cast<unsigned long long>(cs.gets_by_read),
      static_cast<unsigned long long>(cs.gets_by_rpc),
      static_cast<unsigned long long>(cs.rpc_fallbacks),
      static_cast<unsigned long long>(cs.read_retries),
      static_cast<unsigned long long>(cs.rpc_resends), static_cast<unsigned long long>(cs.busy),
      static_cast<unsigned long long>(cs.reconnects), static_cast<unsigned long long>(cs.moves));
  if (!FLAGS_cluster.empty()) std::printf("%s\n", FormatClusterLine(report).c_str());
  const nlohmann::json& cpu = report["cpu"];
  std::printf("cpu: client %.2f us/op", cpu["client_us_per_op"].get<double>());
  if (!cpu["node_us_per_op"].is_null()) {
    std::printf(", node %.2f us/op", cpu["node_us_per_op"].get<double>());
  }
  std::printf("\n");
  if (!FLAGS_report.empty()) {
    std::ofstream out(FLAGS_report);
    out << report.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "kvload: cannot write --report %s\n", FLAGS_report.c_str());
      return 2;
    }
  }
  if (!FLAGS_latency_cdf.empty() && !WriteLatencyCdf(FLAGS_latency_cdf, total.read_latency)) {
    std::fprintf(stderr, "kvload: cannot write --latency_cdf %s\n", FLAGS_latency_cdf.c_str());
    return 2;
  }
  for (auto& wk : workers) wk->CloseClients();
  const bool ok = load::RunSucceeded(total) && preload_failures == 0 && history_ok;
  if (!ok) {
    std::fprintf(stderr,
                 "kvload: FAILED (failed ops, verification errors or history not "
                 "written)\n");
  }
  return ok ? 0 : 1;
}
