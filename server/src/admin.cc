#include "kvnode/server/admin.h"

#include <infiniband/verbs.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"

namespace kvnode::server {
namespace {

using nlohmann::json;

std::string Line(const json& j) {
  // Invalid UTF-8 (e.g. a peer name) is replaced rather than thrown on.
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace

const char* AdminCommandName(AdminCommand c) {
  switch (c) {
    case AdminCommand::kPing:
      return "ping";
    case AdminCommand::kStats:
      return "stats";
    case AdminCommand::kMetrics:
      return "metrics";
    case AdminCommand::kMrs:
      return "mrs";
    case AdminCommand::kClients:
      return "clients";
    case AdminCommand::kMemory:
      return "memory";
    case AdminCommand::kUpgrade:
      return "upgrade";
    case AdminCommand::kDrain:
      return "drain";
    case AdminCommand::kCheck:
      return "check";
    case AdminCommand::kGuard:
      return "guard";
  }
  return "?";
}

absl::StatusOr<AdminRequest> ParseAdminRequest(std::string_view line) {
  if (line.size() > kMaxAdminLine) {
    return absl::InvalidArgumentError(
        absl::StrCat("admin: request line longer than ", kMaxAdminLine, " bytes"));
  }
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  for (char c : line) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u > 0x7e) {
      return absl::InvalidArgumentError("admin: request contains non-printable bytes");
    }
  }
  std::vector<std::string> words =
      absl::StrSplit(absl::string_view(line.data(), line.size()), ' ', absl::SkipEmpty());
  if (words.empty()) return absl::InvalidArgumentError("admin: empty request");
  AdminRequest req;
  const std::string& w = words[0];
  size_t max_args = 0;
  if (w == "ping") {
    req.command = AdminCommand::kPing;
  } else if (w == "stats") {
    req.command = AdminCommand::kStats;
  } else if (w == "metrics") {
    req.command = AdminCommand::kMetrics;
  } else if (w == "mrs") {
    req.command = AdminCommand::kMrs;
  } else if (w == "clients") {
    req.command = AdminCommand::kClients;
  } else if (w == "memory") {
    req.command = AdminCommand::kMemory;
  } else if (w == "upgrade") {
    req.command = AdminCommand::kUpgrade;
    max_args = 1;
    // A binary is an absolute path: "--wait" can only be the option.
    if (words.size() > 1 && words[1] == "--wait") {
      req.wait = true;
      words.erase(words.begin() + 1);
    }
  } else if (w == "drain") {
    req.command = AdminCommand::kDrain;
    max_args = 1;
  } else if (w == "check") {
    req.command = AdminCommand::kCheck;
  } else if (w == "guard") {
    req.command = AdminCommand::kGuard;
    max_args = 2;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("admin: unknown command '", w.substr(0, 64),
                     "' (ping, stats, metrics, mrs, clients, memory, upgrade [--wait] [BINARY], "
                     "drain [SECONDS], check, guard up [SECONDS] | down)"));
  }
  if (words.size() - 1 > max_args) {
    return absl::InvalidArgumentError(
        absl::StrCat("admin: '", w, "' takes at most ", max_args, " argument(s)"));
  }
  req.args.assign(words.begin() + 1, words.end());
  return req;
}

absl::StatusOr<uint32_t> DrainTimeoutSeconds(const AdminRequest& req) {
  if (req.args.empty()) return kDefaultDrainTimeoutS;
  uint32_t s = 0;
  if (!absl::SimpleAtoi(req.args[0], &s) || s < 1 || s > 86400) {
    return absl::InvalidArgumentError(absl::StrCat(
        "admin: drain takes a timeout of 1..86400 s, not '", req.args[0].substr(0, 64), "'"));
  }
  return s;
}

absl::StatusOr<GuardArgs> ParseGuardArgs(const AdminRequest& req) {
  GuardArgs g;
  if (req.args.empty() || (req.args[0] != "up" && req.args[0] != "down")) {
    return absl::InvalidArgumentError("admin: guard takes 'up [SECONDS]' or 'down'");
  }
  g.up = req.args[0] == "up";
  if (req.args.size() == 1) return g;
  if (!g.up) return absl::InvalidArgumentError("admin: 'guard down' takes no argument");
  if (!absl::SimpleAtoi(req.args[1], &g.ack_timeout_s) || g.ack_timeout_s < 1 ||
      g.ack_timeout_s > 60) {
    return absl::InvalidArgumentError(
        absl::StrCat("admin: guard up takes an acknowledgement time-out of 1..60 s, not '",
                     req.args[1].substr(0, 64), "'"));
  }
  return g;
}

std::string GuardUpAnswer(uint32_t acknowledged, uint32_t cut) {
  return Line(json{{"ok", true}, {"guard", "up"}, {"acknowledged", acknowledged}, {"cut", cut}});
}

std::string GuardDownAnswer(uint64_t check_below_epoch) {
  return Line(json{{"ok", true}, {"guard", "down"}, {"check_below_epoch", check_below_epoch}});
}

std::string AccessFlagsString(int access) {
  static constexpr std::pair<int, const char*> kFlags[] = {
      {IBV_ACCESS_LOCAL_WRITE, "LOCAL_WRITE"}, {IBV_ACCESS_REMOTE_WRITE, "REMOTE_WRITE"},
      {IBV_ACCESS_REMOTE_READ, "REMOTE_READ"}, {IBV_ACCESS_REMOTE_ATOMIC, "REMOTE_ATOMIC"},
      {IBV_ACCESS_MW_BIND, "MW_BIND"},         {IBV_ACCESS_ZERO_BASED, "ZERO_BASED"},
      {IBV_ACCESS_ON_DEMAND, "ON_DEMAND"},
  };
  std::string out;
  for (const auto& [bit, name] : kFlags) {
    if ((access & bit) != 0) absl::StrAppend(&out, out.empty() ? "" : "|", name);
  }
  return out.empty() ? "NONE" : out;
}

std::string AdminErrorAnswer(std::string_view message) {
  return Line(json{{"ok", false}, {"error", std::string(message)}});
}

std::string AdminPingAnswer(uint64_t generation, int64_t pid, std::string_view listen,
                            std::string_view build_id) {
  return Line(json{{"ok", true},
                   {"pong", true},
                   {"generation", generation},
                   {"pid", pid},
                   {"listen", std::string(listen)},
                   {"build_id", std::string(build_id)},
                   {"upgrade_wait", true}});
}

std::string UpgradeOutcomeAnswer(const UpgradeOutcome& o) {
  json j{{"ok", !o.rolled_back},
         {"upgrade", o.rolled_back ? "rolled_back" : "done"},
         {"old_generation", o.old_generation},
         {"new_generation", o.new_generation},
         {"old_pid", o.old_pid},
         {"new_pid", o.new_pid},
         {"old_build", o.old_build},
         {"new_build", o.new_build},
         {"write_pause_ms", o.write_pause_ms},
         {"elapsed_ms", o.elapsed_ms}};
  if (o.rolled_back) {
    j["reason"] = o.reason;
    j["error"] =
        absl::StrCat("rolled back after ", absl::FormatDuration(absl::Milliseconds(o.elapsed_ms)),
                     ": ", o.reason);
  }
  return Line(j);
}

std::string DrainAnswer(uint64_t clients, uint32_t timeout_s) {
  return Line(
      json{{"ok", true}, {"drain", "started"}, {"clients", clients}, {"timeout_s", timeout_s}});
}

std::string StatsAnswer(const StatsView& v) {
  json errors = json::object();
  for (size_t i = 0; i < v.counters.errors.size(); ++i) {
    errors[ErrorKindName(static_cast<ErrorKind>(i))] = v.counters.errors[i];
  }
  const CounterSnapshot& c = v.counters;
  json j{
      {"ok", true},
      {"uptime_s", v.uptime_s},
      {"pid", v.pid},
      {"generation", v.generation},
      {"build_id", v.build_id},
      {"clients", v.clients},
      {"client_records", v.client_records},
      {"qps", v.qps},
      {"mrs", v.mrs},
      {"mws", v.mws},
      {"pinned_bytes", v.pinned_bytes},
      {"ops_get_rpc", c.of(Counter::kOpsGetRpc)},
      {"ops_put", c.of(Counter::kOpsPut)},
      {"ops_delete", c.of(Counter::kOpsDelete)},
      {"ops_ping", c.of(Counter::kOpsPing)},
      {"bytes_in", c.of(Counter::kBytesIn)},
      {"bytes_out", c.of(Counter::kBytesOut)},
      {"sessions_accepted", c.of(Counter::kSessionsAccepted)},
      {"sessions_closed", c.of(Counter::kSessionsClosed)},
      {"connections_accepted", c.of(Counter::kConnectionsAccepted)},
      {"rpc_busy", c.of(Counter::kRpcBusy)},
      {"rpc_wrong_shard", c.of(Counter::kRpcWrongShard)},
      {"dedupe_hits", c.of(Counter::kDedupeHits)},
      {"errors", errors},
      {"errors_total", c.total_errors()},
      {"arena",
       {{"size", v.arena.size},
        {"used", v.arena.used},
        {"keys", v.arena.keys},
        {"resident_keys", v.arena.resident_keys},
        {"evictions", v.arena.evictions},
        {"opened_as", v.arena.opened_as},
        {"open_reason", v.arena.open_reason}}},
      {"journaled_writes", v.journaled_writes},
      {"journal_replayed", v.journal_replayed},
      {"write_commits", v.write_commits},
      {"upgrade_in_progress", v.upgrade_in_progress},
      {"writes_paused", v.writes_paused},
      {"draining", v.draining},
      {"upgrades", c.of(Counter::kUpgrades)},
      {"rollbacks", c.of(Counter::kRollbacks)},
  };
  json extra = json::object();
  for (const ExtraStat& e : v.extra) {
    extra[e.labels.empty() ? e.name : absl::StrCat(e.name, "{", e.labels, "}")] = e.value;
  }
  j["upgrade"] = extra;
  return Line(j);
}

std::string ClientsAnswer(const std::vector<ClientRow>& rows) {
  json list = json::array();
  for (const ClientRow& r : rows) {
    list.push_back(json{{"client_id", r.client_id},
                        {"peer", r.peer},
                        {"qpn", r.qpn},
                        {"rkey", r.rkey},
                        {"state", r.state},
                        {"ops", r.ops},
                        {"connected_s", r.connected_s}});
  }
  return Line(json{{"ok", true}, {"clients", list}});
}

std::string MrsAnswer(const std::vector<MrRow>& rows, uint64_t pinned_bytes) {
  json list = json::array();
  for (const MrRow& r : rows) {
    json j{{"kind", r.kind}, {"label", r.label},   {"rkey", r.rkey},
           {"addr", r.addr}, {"length", r.length}, {"access", r.access}};
    if (r.kind == "mr") j["lkey"] = r.lkey;
    if (r.client_id) j["client_id"] = *r.client_id;
    list.push_back(std::move(j));
  }
  return Line(json{{"ok", true}, {"mrs", list}, {"pinned_bytes", pinned_bytes}});
}

std::string MemoryAnswer(const MemoryView& v) {
  return Line(json{{"ok", true},
                   {"malloc_in_use_bytes", v.malloc_in_use_bytes},
                   {"malloc_free_bytes", v.malloc_free_bytes}});
}

std::string CheckAnswer(const absl::StatusOr<storage::CheckReport>& r) {
  if (!r.ok()) return AdminErrorAnswer(std::string(r.status().message()));
  return Line(json{{"ok", true},
                   {"clean", r->clean()},
                   {"db_keys", r->db_keys},
                   {"found", r->found},
                   {"sent_to_server", r->sent_to_server},
                   {"buckets", r->buckets},
                   {"resident_slots", r->resident_slots},
                   {"marker_slots", r->marker_slots},
                   {"problems", r->problems},
                   {"first_problems", r->first_problems},
                   {"seconds", r->seconds}});
}

ExtraStat PrometheusExtra(const ExtraStat& e) {
  ExtraStat p = e;
  if (p.name.empty()) p.name = "unnamed";
  for (char& c : p.name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == ':';
    if (!ok) c = '_';
  }
  if (p.name.front() >= '0' && p.name.front() <= '9') p.name.insert(0, "_");
  if (absl::EndsWith(p.name, "_ms")) {
    p.name.resize(p.name.size() - 3);
    p.name += "_seconds";
    p.value /= 1000;
  }
  if (p.type == "counter" && !absl::EndsWith(p.name, "_total")) p.name += "_total";
  return p;
}

std::string RenderPrometheus(const StatsView& v) {
  std::string out;
  auto metric = [&out](absl::string_view name, absl::string_view type, absl::string_view help,
                       auto value) {
    absl::StrAppend(&out, "# HELP kvnode_", name, " ", help, "\n# TYPE kvnode_", name, " ", type,
                    "\nkvnode_", name, " ", value, "\n");
  };
  const CounterSnapshot& c = v.counters;
  metric("uptime_seconds", "gauge", "Seconds since this process started.", v.uptime_s);
  metric("upgrade_generation", "gauge", "Upgrade generation of the serving process.", v.generation);
  metric("upgrade_in_progress", "gauge", "1 while a live upgrade runs.",
         v.upgrade_in_progress ? 1 : 0);
  metric("writes_paused", "gauge", "1 while writes are answered BUSY.", v.writes_paused ? 1 : 0);
  metric("draining", "gauge", "1 once `drain` was accepted: no new sessions, exit when empty.",
         v.draining ? 1 : 0);
  metric("upgrades_total", "counter", "Completed live upgrades.", c.of(Counter::kUpgrades));
  metric("rollbacks_total", "counter", "Live upgrades rolled back.", c.of(Counter::kRollbacks));
  metric("clients", "gauge", "Client sessions in Ready.", v.clients);
  metric("client_records", "gauge",
         "Dedupe records held (live and departed client ids, at most --max_client_records).",
         v.client_records);
  metric("qps", "gauge", "Live verbs queue pairs.", v.qps);
  metric("mrs", "gauge", "Live memory regions.", v.mrs);
  metric("mws", "gauge", "Live memory windows.", v.mws);
  metric("pinned_bytes", "gauge", "Bytes registered in live memory regions.", v.pinned_bytes);
  absl::StrAppend(&out,
                  "# HELP kvnode_ops_total RPC operations served, by type.\n"
                  "# TYPE kvnode_ops_total counter\n");
  absl::StrAppend(&out, "kvnode_ops_total{op=\"get_rpc\"} ", c.of(Counter::kOpsGetRpc), "\n");
  absl::StrAppend(&out, "kvnode_ops_total{op=\"put\"} ", c.of(Counter::kOpsPut), "\n");
  absl::StrAppend(&out, "kvnode_ops_total{op=\"delete\"} ", c.of(Counter::kOpsDelete), "\n");
  absl::StrAppend(&out, "kvnode_ops_total{op=\"ping\"} ", c.of(Counter::kOpsPing), "\n");
  metric("rpc_bytes_in_total", "counter", "RPC request bytes received.", c.of(Counter::kBytesIn));
  metric("rpc_bytes_out_total", "counter", "RPC response bytes sent.", c.of(Counter::kBytesOut));
  metric("sessions_accepted_total", "counter", "Sessions that reached Ready.",
         c.of(Counter::kSessionsAccepted));
  metric("sessions_closed_total", "counter", "Sessions closed.", c.of(Counter::kSessionsClosed));
  metric("rpc_busy_total", "counter", "Writes answered BUSY.", c.of(Counter::kRpcBusy));
  metric("rpc_wrong_shard_total", "counter",
         "Requests for a slot this node does not serve (WRONG_SHARD or REJECTED).",
         c.of(Counter::kRpcWrongShard));
  metric("dedupe_hits_total", "counter", "Retried writes answered from the dedupe window.",
         c.of(Counter::kDedupeHits));
  absl::StrAppend(&out,
                  "# HELP kvnode_errors_total Errors, by kind.\n"
                  "# TYPE kvnode_errors_total counter\n");
  for (size_t i = 0; i < c.errors.size(); ++i) {
    absl::StrAppend(&out, "kvnode_errors_total{kind=\"", ErrorKindName(static_cast<ErrorKind>(i)),
                    "\"} ", c.errors[i], "\n");
  }
  metric("arena_size_bytes", "gauge", "Bytes in the arena mapping.", v.arena.size);
  metric("arena_used_bytes", "gauge", "Index and live object bytes.", v.arena.used);
  metric("arena_keys", "gauge", "Keys in the store.", v.arena.keys);
  metric("arena_resident_keys", "gauge", "Keys readable from the arena.", v.arena.resident_keys);
  metric("arena_evictions_total", "counter", "Keys evicted from the arena.", v.arena.evictions);
  metric("journaled_writes_total", "counter",
         "Durable writes (group commits) this process made in a live upgrade's write journal.",
         v.journaled_writes);
  metric("journal_replayed_total", "counter", "Journal records this process replayed into RocksDB.",
         v.journal_replayed);
  metric("write_commits_total", "counter",
         "Durable writes (group commits) that carried this process's PUTs and DELETEs.",
         v.write_commits);
  std::vector<ExtraStat> extra;
  extra.reserve(v.extra.size());
  for (const ExtraStat& e : v.extra) extra.push_back(PrometheusExtra(e));
  // One family, one HELP/TYPE block: rows of a name together (a name given
  // twice apart would be a second block, which Prometheus refuses).
  std::stable_sort(extra.begin(), extra.end(),
                   [](const ExtraStat& a, const ExtraStat& b) { return a.name < b.name; });
  std::string last_name;
  for (const ExtraStat& e : extra) {
    if (e.name != last_name) {
      absl::StrAppend(&out, "# HELP kvnode_", e.name, " ", e.help, "\n# TYPE kvnode_", e.name, " ",
                      e.type, "\n");
      last_name = e.name;
    }
    absl::StrAppend(&out, "kvnode_", e.name,
                    e.labels.empty() ? "" : absl::StrCat("{", e.labels, "}"), " ", e.value, "\n");
  }
  return out;
}

}  // namespace kvnode::server
