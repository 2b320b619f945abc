// kvload's counters, its one-second progress line and its JSON report.
//
// Each worker thread owns a LoadStats and records into it without locks;
// merge them (Merge) for the progress line and the final report.
#ifndef KVNODE_CLIENT_LOAD_REPORT_H_
#define KVNODE_CLIENT_LOAD_REPORT_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvnode/load/histogram.h"
#include "kvnode/load/verify.h"
#include "kvnode/load/workload.h"
#include "nlohmann/json.hpp"

namespace kvnode::load {

struct LoadStats {
  // Operations that got an answer from the node (whatever the verdict):
  // reads (GET; NOT_FOUND included) and writes (PUT and DELETE).
  uint64_t reads = 0;
  uint64_t writes = 0;
  uint64_t deletes = 0;    // subset of writes
  uint64_t not_found = 0;  // subset of reads
  // Operations that ended in an error (deadline, connection lost, rejected,
  // internal...) after any retries; not in reads/writes or the histograms.
  uint64_t failed_ops = 0;
  // Of failed_ops: failed at once because the key's shard was unavailable
  // (kvload --cluster: the slot's node is not alive in the shard map).
  uint64_t shard_unavailable = 0;
  // Read verdicts other than kOk, by kind (index = ReadVerdict).
  std::array<uint64_t, kReadVerdictCount> verdicts{};

  // GETs that completed while their client had at least one write held
  // (answered BUSY and waiting to be re-sent): reads served during a pause
  // of writes.
  uint64_t reads_while_writes_held = 0;

  LatencyHistogram read_latency;
  LatencyHistogram write_latency;
  Timeline timeline;        // every completion
  Timeline read_timeline;   // GETs only
  Timeline write_timeline;  // PUTs and DELETEs only

  uint64_t ops() const { return reads + writes; }
  // Every failed verification, stale reads included.
  uint64_t verify_errors() const;
  uint64_t stale_reads() const { return verdicts[static_cast<int>(ReadVerdict::kStale)]; }

  // An operation of type `op` issued at start_ns completed at end_ns (both
  // since the run's start). `not_found` for a GET answered NOT_FOUND.
  void RecordCompletion(OpType op, uint64_t start_ns, uint64_t end_ns, bool not_found = false);
  void RecordFailure(bool shard_unavailable_ = false) {
    ++failed_ops;
    if (shard_unavailable_) ++shard_unavailable;
  }
  void RecordVerdict(ReadVerdict v) {
    if (v != ReadVerdict::kOk) ++verdicts[static_cast<int>(v)];
  }

  void Merge(const LoadStats& other);
};

// One progress line, e.g.
//   "[  12s] 10523 ops/s  p50 24.1us  p99 80.3us  failed 0  verify_err 0  stale 0"
// from cumulative stats now and one interval earlier.
std::string FormatProgressLine(double elapsed_s, double interval_s, const LoadStats& now,
                               const LoadStats& before);

// The JSON report. Keys: ops, reads, writes, deletes, not_found, failed_ops,
// shard_unavailable (of failed_ops), verify_errors, stale_reads, verify {corrupt, wrong_key, stale,
// missing, unknown_version}, duration_s, ops_per_s, latency_us {p50, p99, p999, max, mean, read
// {...}, write {...}}, blackout_ms, blackout_start_ms, blackout_read_ms, blackout_write_ms (the
// same over GETs only, writes only), blackout_write_start_ms, reads_in_write_blackout (GETs
// completed inside the longest gap between writes, at timeline slot resolution),
// reads_while_writes_held, timeline_slot_ms, timeline [{t_ms, ops, reads, writes, max_latency_us},
// ...] (one entry
// per slot from 0 to the last completion), and `config` = the given object.
nlohmann::json BuildReport(const LoadStats& stats, double duration_s,
                           const nlohmann::json& config = nlohmann::json::object());

// A few human-readable lines summarising a BuildReport() result.
std::string FormatSummary(const nlohmann::json& report);

// CPU time a process has used (user + system), in seconds.
struct CpuTimes {
  double self_s = 0;  // this process (getrusage RUSAGE_SELF: every thread)
  double node_s = 0;  // the node, from /proc/<pid>/stat; 0 when not sampled
  bool node_ok = false;
};
// Samples both; node_pid <= 0 samples only this process. A node that cannot
// be read (gone, another user's under hidepid) leaves node_ok false.
CpuTimes SampleCpu(int node_pid);
// utime + stime of a /proc/<pid>/stat line, in clock ticks; -1 when the line
// is malformed. The comm field may hold spaces and parentheses: the fields
// are counted after its LAST ')'.
int64_t ProcStatCpuTicks(std::string_view stat_line);
// The report's "cpu" object for `ops` operations between two samples:
// client_s, client_us_per_op, and node_s, node_us_per_op when the node was
// sampled both times (else node_us_per_op is null).
nlohmann::json CpuJson(const CpuTimes& before, const CpuTimes& after, uint64_t ops);

// kvload's exit condition: no failed operation and no failed verification.
inline bool RunSucceeded(const LoadStats& s) { return s.failed_ops == 0 && s.verify_errors() == 0; }

}  // namespace kvnode::load

#endif  // KVNODE_CLIENT_LOAD_REPORT_H_
