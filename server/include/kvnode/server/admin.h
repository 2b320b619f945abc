// The admin protocol (docs/server.md, contract): one request line on a Unix
// stream socket, one answer, then the server closes.
//
//   request:  WORD [ARG ...] '\n'      (printable ASCII, <= kMaxAdminLine bytes)
//   answer:   one JSON object + '\n':  {"ok":true,...} or {"ok":false,"error":"..."}
//             `metrics` is answered in Prometheus text exposition format.
//
// This header is the pure part (parsing and rendering, unit-tested); the
// socket handling lives in the server's control loop.
#ifndef KVNODE_SERVER_ADMIN_H_
#define KVNODE_SERVER_ADMIN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kvnode/server/metrics.h"
#include "kvnode/storage/store.h"

namespace kvnode::server {

inline constexpr size_t kMaxAdminLine = 4096;

enum class AdminCommand {
  kPing,
  kStats,
  kMetrics,
  kMrs,
  kClients,
  kMemory,
  kUpgrade,
  kDrain,
  kCheck,
  kGuard
};
const char* AdminCommandName(AdminCommand c);

struct AdminRequest {
  AdminCommand command = AdminCommand::kPing;
  std::vector<std::string> args;  // `upgrade [BINARY]`, `drain [SECONDS]`: at most one
  // `upgrade --wait [BINARY]`: answered once the upgrade has passed its point
  // of no return or rolled back (UpgradeOutcomeAnswer), not when it starts.
  bool wait = false;
};

// `drain [SECONDS]`: the node refuses new sessions, keeps serving the ones it
// has, and shuts down (as for SIGTERM) once they have all left, or when
// SECONDS have passed (then the rest get Goodbye). SECONDS: 1..86400,
// default kDefaultDrainTimeoutS. InvalidArgument names the bad value.
inline constexpr uint32_t kDefaultDrainTimeoutS = 300;
[[nodiscard]] absl::StatusOr<uint32_t> DrainTimeoutSeconds(const AdminRequest& req);

// `guard up [SECONDS]` / `guard down` (a cluster node; docs/cluster.md "Slot
// migration"): raise the node's guard, answered once every session checks
// the slot words or was cut (SECONDS, 1..60, default
// kDefaultGuardAckTimeoutS, bound the wait for acknowledgements); lower it.
inline constexpr uint32_t kDefaultGuardAckTimeoutS = 2;
struct GuardArgs {
  bool up = false;
  uint32_t ack_timeout_s = kDefaultGuardAckTimeoutS;
};
[[nodiscard]] absl::StatusOr<GuardArgs> ParseGuardArgs(const AdminRequest& req);
// {"ok":true,"guard":"up","acknowledged":N,"cut":M} or
// {"ok":true,"guard":"down","check_below_epoch":E}
std::string GuardUpAnswer(uint32_t acknowledged, uint32_t cut);
std::string GuardDownAnswer(uint64_t check_below_epoch);

// Parses one request line (with or without its trailing '\n'). InvalidArgument
// for an empty line, an unknown command, bytes outside printable ASCII, too
// many arguments or a line over kMaxAdminLine.
[[nodiscard]] absl::StatusOr<AdminRequest> ParseAdminRequest(std::string_view line);

// A value another module (the live upgrade) adds to `stats` and `metrics`.
struct ExtraStat {
  std::string name;    // metric name without the kvnode_ prefix, e.g. "upgrade_refused_total"
  std::string labels;  // Prometheus labels without braces, e.g. phase="o_pause"; "" = none
  std::string type;    // "counter" | "gauge"
  std::string help;
  double value = 0;
};

// Everything `stats` and `metrics` report, gathered by the server.
struct StatsView {
  double uptime_s = 0;
  int64_t pid = 0;
  uint64_t generation = 0;
  std::string build_id;
  uint64_t clients = 0;         // sessions in Ready
  uint64_t client_records = 0;  // dedupe records held: live and departed client ids
  uint64_t qps = 0;             // live verbs QPs (kvrdma accounting)
  uint64_t mrs = 0;
  uint64_t mws = 0;
  uint64_t pinned_bytes = 0;
  CounterSnapshot counters;
  struct Arena {
    uint64_t size = 0;
    uint64_t used = 0;  // index + live object bytes
    uint64_t keys = 0;
    uint64_t resident_keys = 0;
    uint64_t evictions = 0;
    // How this process's start found the arena (storage::OpenedAsName:
    // created, rebuilt, reattached, recovered; attached-live after a live
    // upgrade) and why.
    std::string opened_as;
    std::string open_reason;
  } arena;
  // This process: writes made durable in the live upgrade's write journal,
  // and journaled writes replayed into RocksDB.
  uint64_t journaled_writes = 0;
  uint64_t journal_replayed = 0;
  // This process: durable writes (RocksDB batches, journal records) that
  // carried its PUTs and DELETEs; (puts + deletes) / this is the group
  // commit's mean group size.
  uint64_t write_commits = 0;
  bool upgrade_in_progress = false;
  bool writes_paused = false;
  bool draining = false;  // admin `drain` was accepted; the node exits once it is done
  // `stats`: object "upgrade" {name or name{labels}: value}; `metrics`: as is.
  std::vector<ExtraStat> extra;
};

// `memory`: this process's malloc heap (glibc's mallinfo2), bytes allocated
// and bytes free but kept by malloc. Beside RssAnon they tell memory in use
// from memory malloc holds on to (fragmentation). Not in `stats`: mallinfo2
// walks every free chunk under its arena's lock, and `stats` is polled.
struct MemoryView {
  uint64_t malloc_in_use_bytes = 0;
  uint64_t malloc_free_bytes = 0;
};

struct ClientRow {
  uint64_t client_id = 0;
  std::string peer;  // "ip:port" of the control connection
  uint32_t qpn = 0;
  uint32_t rkey = 0;
  std::string state;  // "handshake", "ready", "closing"
  uint64_t ops = 0;   // RPCs served on this session
  double connected_s = 0;
};

struct MrRow {
  std::string kind;  // "mr" or "mw"
  std::string label;
  uint32_t lkey = 0;  // mr only
  uint32_t rkey = 0;
  uint64_t addr = 0;  // remote address (iova) the key covers
  uint64_t length = 0;
  std::string access;                 // "REMOTE_READ|MW_BIND", ...
  std::optional<uint64_t> client_id;  // mw: the client it is bound for
};

// "LOCAL_WRITE|REMOTE_READ|..." for ibv_access_flags bits; "NONE" for 0.
std::string AccessFlagsString(int access);

// One line each, with the trailing '\n'.
std::string AdminErrorAnswer(std::string_view message);
// {"ok":true,"pong":true,"generation":G,"pid":P,"listen":"host:port",
//  "build_id":"B","upgrade_wait":true}; upgrade_wait: `upgrade --wait` is
// understood (older nodes do not say it, and take "--wait" for a binary).
std::string AdminPingAnswer(uint64_t generation, int64_t pid, std::string_view listen,
                            std::string_view build_id);
// {"ok":true,"drain":"started","clients":N,"timeout_s":T}
std::string DrainAnswer(uint64_t clients, uint32_t timeout_s);
std::string StatsAnswer(const StatsView& v);
std::string ClientsAnswer(const std::vector<ClientRow>& rows);
std::string MrsAnswer(const std::vector<MrRow>& rows, uint64_t pinned_bytes);
// {"ok":true,"malloc_in_use_bytes":N,"malloc_free_bytes":N}
std::string MemoryAnswer(const MemoryView& v);
// Store::Check's report: {"ok":true,"clean":B,"db_keys":N,"found":N,
// "sent_to_server":N,"buckets":N,"resident_slots":N,"marker_slots":N,
// "problems":N,"first_problems":[...],"seconds":S}; an error when it could
// not run.
std::string CheckAnswer(const absl::StatusOr<storage::CheckReport>& r);
// How a live upgrade ended, for `upgrade --wait`, as the old process saw it.
struct UpgradeOutcome {
  bool rolled_back = false;
  std::string reason;  // rolled back: why
  uint64_t old_generation = 0;
  uint64_t new_generation = 0;  // the one the upgrade was for
  int64_t old_pid = 0;
  int64_t new_pid = 0;  // 0 when none was started
  std::string old_build;
  std::string new_build;      // "" when none said Hello
  double write_pause_ms = 0;  // writes paused -> Owned (0 when never paused)
  double elapsed_ms = 0;      // the request -> Owned, or -> the rollback done
};
// Owned: {"ok":true,"upgrade":"done","old_generation":..,"new_generation":..,
//   "old_pid":..,"new_pid":..,"old_build":..,"new_build":..,
//   "write_pause_ms":..,"elapsed_ms":..}
// rolled back: {"ok":false,"upgrade":"rolled_back","error":"rolled back after
//   T: REASON","reason":REASON, and the same fields}
std::string UpgradeOutcomeAnswer(const UpgradeOutcome& o);

// Prometheus text exposition format (version 0.0.4), names prefixed kvnode_:
// what `kvctl metrics` prints and GET /metrics (--metrics_listen) serves.
// Extra rows follow the fixed families' naming rules (PrometheusExtra) and
// are grouped by family, one HELP/TYPE each.
std::string RenderPrometheus(const StatsView& v);

// An extra row as RenderPrometheus exports it: the name in the fixed
// families' rules (`stats` keeps the name as given):
//   1. base units spelled out: a name ending in "_ms" ends in "_seconds"
//      instead, its value divided by 1000 (cluster_lease_ttl_left_ms ->
//      cluster_lease_ttl_left_seconds), as uptime_s is uptime_seconds;
//   2. a counter's name ends in "_total" (appended when missing);
//   3. a character outside [a-zA-Z0-9_:] becomes '_'; an empty name "unnamed".
ExtraStat PrometheusExtra(const ExtraStat& e);

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_ADMIN_H_
