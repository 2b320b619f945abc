// Monotonic counters of a kvnode process (ops, bytes, errors by kind) and the
// plain snapshot they export.
//
// Counters are relaxed atomics: any thread may bump them, the admin thread
// reads them; nothing on the data path takes a lock. They are monotonic for
// the node as a service: a live upgrade exports them from the old process
// (Export) and the new one starts from there (Import).
#ifndef KVNODE_SERVER_METRICS_H_
#define KVNODE_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvnode::server {

enum class Counter : int {
  kOpsGetRpc = 0,
  kOpsPut,
  kOpsDelete,
  kOpsPing,
  kBytesIn,           // RPC request bytes received
  kBytesOut,          // RPC response bytes sent
  kSessionsAccepted,  // sessions that reached Ready
  kSessionsClosed,
  kConnectionsAccepted,  // TCP connections accepted
  kRpcBusy,              // writes answered BUSY (paused)
  kDedupeHits,           // retried writes answered from the dedupe window
  kUpgrades,             // completed live upgrades (the upgrade module bumps it)
  kRollbacks,            // failed upgrades rolled back
  kRpcWrongShard,        // GET/PUT/DELETE of a slot this node does not serve
  kCount,                // not a counter
};

// Errors by kind. Names (ErrorKindName) are the keys of stats' "errors"
// object and the `kind` label of kvnode_errors_total.
enum class ErrorKind : int {
  kAuthFailed = 0,
  kUnsupportedVersion,
  kMalformedFrame,
  kUnexpectedMessage,
  kTooManyClients,
  kHandshakeTimeout,
  kKeepaliveTimeout,
  kPeerVanished,      // control connection reset/closed without Goodbye
  kSessionSetup,      // QP/window setup or connect failed
  kQpError,           // a client's QP went to ERR (bad rkey, dead peer, ...)
  kRpcMalformed,      // undecodable request (REJECTED)
  kRpcOversize,       // key or value over the limits (REJECTED)
  kRpcWrongClient,    // request names another client id (REJECTED)
  kRpcUnknownOpcode,  // (REJECTED)
  kRpcTooOld,         // retried write older than the dedupe window (REJECTED)
  kStorage,           // Store error answered INTERNAL
  kAdminBadRequest,
  kIndexChainFull,  // PUT of a new key whose index chain is at its bound (REJECTED)
  kResumeRefused,   // Hello resumed a client id without its secret: given a fresh id
  kCount,           // not a kind
};

const char* CounterName(Counter c);      // "ops_put", ...
const char* ErrorKindName(ErrorKind k);  // "auth_failed", ...

// Plain values of every counter, e.g. for rendering or for the handoff.
struct CounterSnapshot {
  std::array<uint64_t, static_cast<size_t>(Counter::kCount)> counters{};
  std::array<uint64_t, static_cast<size_t>(ErrorKind::kCount)> errors{};

  uint64_t of(Counter c) const { return counters[static_cast<size_t>(c)]; }
  uint64_t of(ErrorKind k) const { return errors[static_cast<size_t>(k)]; }
  uint64_t total_errors() const;
};

class Metrics {
 public:
  void Add(Counter c, uint64_t n = 1) {
    counters_[static_cast<size_t>(c)].fetch_add(n, std::memory_order_relaxed);
  }
  void Error(ErrorKind k) {
    errors_[static_cast<size_t>(k)].fetch_add(1, std::memory_order_relaxed);
  }

  CounterSnapshot Snapshot() const;

  // By name, so that a process with more or fewer counters can import
  // another's: {("ops_put", 12), ("errors.auth_failed", 1), ...}.
  std::vector<std::pair<std::string, uint64_t>> Export() const;
  // Adds the values of known names; unknown names are ignored (returns how
  // many were). Call before serving.
  size_t Import(const std::vector<std::pair<std::string, uint64_t>>& values);

 private:
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Counter::kCount)> counters_{};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(ErrorKind::kCount)> errors_{};
};

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_METRICS_H_
