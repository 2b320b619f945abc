#include "kvnode/server/metrics.h"

#include <string_view>

namespace kvnode::server {

const char* CounterName(Counter c) {
  switch (c) {
    case Counter::kOpsGetRpc:
      return "ops_get_rpc";
    case Counter::kOpsPut:
      return "ops_put";
    case Counter::kOpsDelete:
      return "ops_delete";
    case Counter::kOpsPing:
      return "ops_ping";
    case Counter::kBytesIn:
      return "bytes_in";
    case Counter::kBytesOut:
      return "bytes_out";
    case Counter::kSessionsAccepted:
      return "sessions_accepted";
    case Counter::kSessionsClosed:
      return "sessions_closed";
    case Counter::kConnectionsAccepted:
      return "connections_accepted";
    case Counter::kRpcBusy:
      return "rpc_busy";
    case Counter::kDedupeHits:
      return "dedupe_hits";
    case Counter::kUpgrades:
      return "upgrades";
    case Counter::kRollbacks:
      return "rollbacks";
    case Counter::kRpcWrongShard:
      return "rpc_wrong_shard";
    case Counter::kCount:
      break;
  }
  return "?";
}

const char* ErrorKindName(ErrorKind k) {
  switch (k) {
    case ErrorKind::kAuthFailed:
      return "auth_failed";
    case ErrorKind::kUnsupportedVersion:
      return "unsupported_version";
    case ErrorKind::kMalformedFrame:
      return "malformed_frame";
    case ErrorKind::kUnexpectedMessage:
      return "unexpected_message";
    case ErrorKind::kTooManyClients:
      return "too_many_clients";
    case ErrorKind::kHandshakeTimeout:
      return "handshake_timeout";
    case ErrorKind::kKeepaliveTimeout:
      return "keepalive_timeout";
    case ErrorKind::kPeerVanished:
      return "peer_vanished";
    case ErrorKind::kSessionSetup:
      return "session_setup";
    case ErrorKind::kQpError:
      return "qp_error";
    case ErrorKind::kRpcMalformed:
      return "rpc_malformed";
    case ErrorKind::kRpcOversize:
      return "rpc_oversize";
    case ErrorKind::kRpcWrongClient:
      return "rpc_wrong_client";
    case ErrorKind::kRpcUnknownOpcode:
      return "rpc_unknown_opcode";
    case ErrorKind::kRpcTooOld:
      return "rpc_too_old";
    case ErrorKind::kStorage:
      return "storage";
    case ErrorKind::kAdminBadRequest:
      return "admin_bad_request";
    case ErrorKind::kIndexChainFull:
      return "index_chain_full";
    case ErrorKind::kResumeRefused:
      return "resume_refused";
    case ErrorKind::kCount:
      break;
  }
  return "?";
}

uint64_t CounterSnapshot::total_errors() const {
  uint64_t t = 0;
  for (uint64_t e : errors) t += e;
  return t;
}

CounterSnapshot Metrics::Snapshot() const {
  CounterSnapshot s;
  for (size_t i = 0; i < counters_.size(); ++i) {
    s.counters[i] = counters_[i].load(std::memory_order_relaxed);
  }
  for (size_t i = 0; i < errors_.size(); ++i) {
    s.errors[i] = errors_[i].load(std::memory_order_relaxed);
  }
  return s;
}

std::vector<std::pair<std::string, uint64_t>> Metrics::Export() const {
  const CounterSnapshot s = Snapshot();
  std::vector<std::pair<std::string, uint64_t>> out;
  for (size_t i = 0; i < s.counters.size(); ++i) {
    out.emplace_back(CounterName(static_cast<Counter>(i)), s.counters[i]);
  }
  for (size_t i = 0; i < s.errors.size(); ++i) {
    out.emplace_back(std::string("errors.") + ErrorKindName(static_cast<ErrorKind>(i)),
                     s.errors[i]);
  }
  return out;
}

size_t Metrics::Import(const std::vector<std::pair<std::string, uint64_t>>& values) {
  size_t unknown = 0;
  for (const auto& [name, v] : values) {
    bool found = false;
    for (size_t i = 0; i < counters_.size() && !found; ++i) {
      if (name == CounterName(static_cast<Counter>(i))) {
        counters_[i].fetch_add(v, std::memory_order_relaxed);
        found = true;
      }
    }
    constexpr std::string_view kPrefix = "errors.";
    if (!found && std::string_view(name).substr(0, kPrefix.size()) == kPrefix) {
      const std::string_view kind = std::string_view(name).substr(kPrefix.size());
      for (size_t i = 0; i < errors_.size() && !found; ++i) {
        if (kind == ErrorKindName(static_cast<ErrorKind>(i))) {
          errors_[i].fetch_add(v, std::memory_order_relaxed);
          found = true;
        }
      }
    }
    if (!found) ++unknown;
  }
  return unknown;
}

}  // namespace kvnode::server
