#include "kvnode/server/admin.h"

#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

namespace kvnode::server {
namespace {

using nlohmann::json;

TEST(AdminParse, KnownCommands) {
  EXPECT_EQ(ParseAdminRequest("ping\n")->command, AdminCommand::kPing);
  EXPECT_EQ(ParseAdminRequest("stats")->command, AdminCommand::kStats);
  EXPECT_EQ(ParseAdminRequest("metrics\r\n")->command, AdminCommand::kMetrics);
  EXPECT_EQ(ParseAdminRequest("  mrs  ")->command, AdminCommand::kMrs);
  EXPECT_EQ(ParseAdminRequest("clients")->command, AdminCommand::kClients);
  EXPECT_EQ(ParseAdminRequest("memory")->command, AdminCommand::kMemory);
  EXPECT_EQ(ParseAdminRequest("drain")->command, AdminCommand::kDrain);
  EXPECT_EQ(ParseAdminRequest("check")->command, AdminCommand::kCheck);
  EXPECT_FALSE(ParseAdminRequest("check now").ok());
  absl::StatusOr<AdminRequest> up = ParseAdminRequest("upgrade /usr/bin/kvnode\n");
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->command, AdminCommand::kUpgrade);
  ASSERT_EQ(up->args.size(), 1u);
  EXPECT_EQ(up->args[0], "/usr/bin/kvnode");
  EXPECT_TRUE(ParseAdminRequest("upgrade")->args.empty());
  EXPECT_FALSE(ParseAdminRequest("upgrade")->wait);
  EXPECT_FALSE(up->wait);
}

TEST(AdminParse, UpgradeWaitsForTheOutcomeWhenAsked) {
  absl::StatusOr<AdminRequest> w = ParseAdminRequest("upgrade --wait\n");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->wait);
  EXPECT_TRUE(w->args.empty());
  w = ParseAdminRequest("upgrade --wait /usr/bin/kvnode");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->wait);
  ASSERT_EQ(w->args.size(), 1u);
  EXPECT_EQ(w->args[0], "/usr/bin/kvnode");
  EXPECT_FALSE(ParseAdminRequest("upgrade --wait /a /b").ok());
  EXPECT_FALSE(ParseAdminRequest("drain --wait")->wait);  // upgrade only
}

TEST(AdminParse, RejectsBadRequests) {
  EXPECT_FALSE(ParseAdminRequest("").ok());
  EXPECT_FALSE(ParseAdminRequest("\n").ok());
  EXPECT_FALSE(ParseAdminRequest("   ").ok());
  EXPECT_FALSE(ParseAdminRequest("reboot").ok());
  EXPECT_FALSE(ParseAdminRequest("STATS").ok());
  EXPECT_FALSE(ParseAdminRequest("stats now").ok());
  EXPECT_FALSE(ParseAdminRequest("upgrade a b").ok());
  EXPECT_FALSE(ParseAdminRequest(std::string("sta\0ts", 6)).ok());
  EXPECT_FALSE(ParseAdminRequest("stats\x01").ok());
  EXPECT_FALSE(ParseAdminRequest(std::string(kMaxAdminLine + 1, 'a')).ok());
}

TEST(AdminParse, DrainTakesAnOptionalTimeout) {
  absl::StatusOr<AdminRequest> d = ParseAdminRequest("drain");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*DrainTimeoutSeconds(*d), kDefaultDrainTimeoutS);
  d = ParseAdminRequest("drain 30\n");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*DrainTimeoutSeconds(*d), 30u);
  EXPECT_EQ(*DrainTimeoutSeconds(*ParseAdminRequest("drain 86400")), 86400u);
  EXPECT_FALSE(ParseAdminRequest("drain 30 60").ok());
  for (const char* bad : {"drain 0", "drain 86401", "drain -5", "drain 1.5", "drain soon",
                          "drain 99999999999999999999"}) {
    absl::StatusOr<AdminRequest> r = ParseAdminRequest(bad);
    ASSERT_TRUE(r.ok()) << bad;
    absl::StatusOr<uint32_t> t = DrainTimeoutSeconds(*r);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(t.status().message().find(r->args[0]), std::string::npos) << t.status();
  }
  json j = json::parse(DrainAnswer(3, 60));
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["drain"], "started");
  EXPECT_EQ(j["clients"], 3);
  EXPECT_EQ(j["timeout_s"], 60);
}

TEST(AdminParse, GuardUpWithAnOptionalTimeoutOrDown) {
  absl::StatusOr<GuardArgs> g = ParseGuardArgs(*ParseAdminRequest("guard up"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->up);
  EXPECT_EQ(g->ack_timeout_s, kDefaultGuardAckTimeoutS);
  g = ParseGuardArgs(*ParseAdminRequest("guard up 60\n"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->ack_timeout_s, 60u);
  g = ParseGuardArgs(*ParseAdminRequest("guard down"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(g->up);
  EXPECT_FALSE(ParseAdminRequest("guard up 1 2").ok());
  for (const char* bad :
       {"guard", "guard sideways", "guard up 0", "guard up 61", "guard up x", "guard down 5"}) {
    absl::StatusOr<AdminRequest> r = ParseAdminRequest(bad);
    ASSERT_TRUE(r.ok()) << bad;
    EXPECT_EQ(ParseGuardArgs(*r).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  json up = json::parse(GuardUpAnswer(3, 1));
  EXPECT_EQ(up["guard"], "up");
  EXPECT_EQ(up["acknowledged"], 3);
  EXPECT_EQ(up["cut"], 1);
  EXPECT_EQ(json::parse(GuardDownAnswer(7))["check_below_epoch"], 7);
}

StatsView SampleStats() {
  StatsView v;
  v.uptime_s = 12.5;
  v.pid = 4242;
  v.generation = 3;
  v.build_id = "test\"build";
  v.clients = 2;
  v.client_records = 5;
  v.qps = 2;
  v.mrs = 2;
  v.mws = 2;
  v.pinned_bytes = 1 << 20;
  v.counters.counters[static_cast<size_t>(Counter::kOpsPut)] = 10;
  v.counters.counters[static_cast<size_t>(Counter::kUpgrades)] = 1;
  v.counters.errors[static_cast<size_t>(ErrorKind::kAuthFailed)] = 4;
  v.arena = {64 << 20, 1000, 7, 6, 1, "recovered", "its writer (pid 9) died"};
  return v;
}

TEST(AdminRender, StatsHasTheContractKeys) {
  const std::string line = StatsAnswer(SampleStats());
  ASSERT_EQ(line.back(), '\n');
  ASSERT_EQ(line.find('\n'), line.size() - 1) << "one line";
  json j = json::parse(line);
  EXPECT_EQ(j["ok"], true);
  for (const char* k :
       {"uptime_s", "pid",       "generation",   "build_id",    "clients", "qps",
        "mrs",      "mws",       "pinned_bytes", "ops_get_rpc", "ops_put", "ops_delete",
        "ops_ping", "bytes_in",  "bytes_out",    "errors",      "arena",   "upgrade_in_progress",
        "upgrades", "rollbacks", "draining"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  for (const char* k :
       {"size", "used", "keys", "resident_keys", "evictions", "opened_as", "open_reason"}) {
    EXPECT_TRUE(j["arena"].contains(k)) << k;
  }
  EXPECT_FALSE(j.contains("malloc_in_use_bytes")) << "mallinfo2 is not paid by stats polls";
  EXPECT_EQ(j["ops_put"], 10);
  EXPECT_EQ(j["errors"]["auth_failed"], 4);
  EXPECT_EQ(j["build_id"], "test\"build");
  EXPECT_EQ(j["generation"], 3);
  EXPECT_EQ(j["upgrades"], 1);
  EXPECT_EQ(j["arena"]["keys"], 7);
  EXPECT_EQ(j["arena"]["opened_as"], "recovered");
  EXPECT_EQ(j["client_records"], 5);
}

TEST(AdminRender, ErrorAndPing) {
  json e = json::parse(AdminErrorAnswer("not implemented yet"));
  EXPECT_EQ(e["ok"], false);
  EXPECT_EQ(e["error"], "not implemented yet");
  json p = json::parse(AdminPingAnswer(5, 99, "127.0.0.1:7000", "0.1.0 (build g123)"));
  EXPECT_EQ(p["ok"], true);
  EXPECT_EQ(p["generation"], 5);
  EXPECT_EQ(p["listen"], "127.0.0.1:7000");
  EXPECT_EQ(p["build_id"], "0.1.0 (build g123)");
  EXPECT_EQ(p["upgrade_wait"], true);  // kvctl upgrade asks `upgrade --wait` then
}

TEST(AdminRender, UpgradeOutcome) {
  UpgradeOutcome o;
  o.old_generation = 2;
  o.new_generation = 3;
  o.old_pid = 100;
  o.new_pid = 200;
  o.old_build = "build-a";
  o.new_build = "build-b";
  o.write_pause_ms = 78;
  o.elapsed_ms = 1234.5;
  json done = json::parse(UpgradeOutcomeAnswer(o));
  EXPECT_EQ(done["ok"], true);
  EXPECT_EQ(done["upgrade"], "done");
  EXPECT_EQ(done["old_generation"], 2);
  EXPECT_EQ(done["new_generation"], 3);
  EXPECT_EQ(done["new_pid"], 200);
  EXPECT_EQ(done["new_build"], "build-b");
  EXPECT_EQ(done["write_pause_ms"], 78);
  EXPECT_FALSE(done.contains("error"));
  o.rolled_back = true;
  o.reason = "waiting for Hello: connection closed";
  o.elapsed_ms = 160;
  json rb = json::parse(UpgradeOutcomeAnswer(o));
  EXPECT_EQ(rb["ok"], false);
  EXPECT_EQ(rb["upgrade"], "rolled_back");
  EXPECT_EQ(rb["reason"], o.reason);
  EXPECT_EQ(rb["error"], "rolled back after 160ms: waiting for Hello: connection closed");
}

TEST(AdminRender, InvalidUtf8DoesNotThrow) {
  ClientRow r;
  r.peer = std::string("\xff\xfe", 2);
  EXPECT_NO_THROW(json::parse(ClientsAnswer({r})));
}

TEST(AdminRender, ClientsAndMrs) {
  ClientRow c{42, "127.0.0.1:5555", 17, 0x1234, "ready", 100, 1.5};
  json j = json::parse(ClientsAnswer({c}));
  ASSERT_EQ(j["clients"].size(), 1u);
  EXPECT_EQ(j["clients"][0]["client_id"], 42);
  EXPECT_EQ(j["clients"][0]["qpn"], 17);
  EXPECT_EQ(j["clients"][0]["state"], "ready");
  MrRow mr{"mr", "arena", 1, 2, 0, 4096, "MW_BIND", std::nullopt};
  MrRow mw{"mw", "window", 0, 3, 0, 4096, "REMOTE_READ", 42};
  json m = json::parse(MrsAnswer({mr, mw}, 8192));
  ASSERT_EQ(m["mrs"].size(), 2u);
  EXPECT_EQ(m["mrs"][0]["lkey"], 1);
  EXPECT_FALSE(m["mrs"][0].contains("client_id"));
  EXPECT_EQ(m["mrs"][1]["client_id"], 42);
  EXPECT_FALSE(m["mrs"][1].contains("lkey"));
  EXPECT_EQ(m["pinned_bytes"], 8192);
}

TEST(AdminRender, Memory) {
  MemoryView v;
  v.malloc_in_use_bytes = 4096;
  v.malloc_free_bytes = 512;
  json j = json::parse(MemoryAnswer(v));
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["malloc_in_use_bytes"], 4096);
  EXPECT_EQ(j["malloc_free_bytes"], 512);
}

TEST(AdminRender, Check) {
  storage::CheckReport r;
  r.db_keys = 10;
  r.found = 9;
  r.sent_to_server = 1;
  json j = json::parse(CheckAnswer(r));
  EXPECT_TRUE(j["ok"]);
  EXPECT_TRUE(j["clean"]);
  EXPECT_EQ(j["db_keys"], 10);
  r.problems = 1;
  r.first_problems = {"key 'k': resident at version 2, but RocksDB has no such key"};
  j = json::parse(CheckAnswer(r));
  EXPECT_FALSE(j["clean"]);
  EXPECT_EQ(j["first_problems"][0], r.first_problems[0]);
  j = json::parse(CheckAnswer(absl::FailedPreconditionError("not the writer")));
  EXPECT_FALSE(j["ok"]);
  EXPECT_EQ(j["error"], "not the writer");
}

TEST(AdminRender, AccessFlags) {
  EXPECT_EQ(AccessFlagsString(0), "NONE");
  EXPECT_EQ(AccessFlagsString(IBV_ACCESS_LOCAL_WRITE), "LOCAL_WRITE");
  EXPECT_EQ(AccessFlagsString(IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND), "REMOTE_READ|MW_BIND");
}

TEST(AdminRender, PrometheusExposition) {
  const std::string text = RenderPrometheus(SampleStats());
  EXPECT_NE(text.find("# TYPE kvnode_ops_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("kvnode_ops_total{op=\"put\"} 10\n"), std::string::npos);
  EXPECT_NE(text.find("kvnode_errors_total{kind=\"auth_failed\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("kvnode_upgrade_generation 3\n"), std::string::npos);
  EXPECT_NE(text.find("kvnode_arena_keys 7\n"), std::string::npos);
  // Every non-comment line is "name[{labels}] value".
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    ASSERT_NE(nl, std::string::npos) << "ends with a newline";
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.rfind("# ", 0) == 0) continue;
    EXPECT_EQ(line.rfind("kvnode_", 0), 0u) << line;
    EXPECT_EQ(std::count(line.begin(), line.end(), ' '), 1) << line;
  }
}

TEST(AdminRender, ExtraRowsFollowTheFixedFamiliesNamingRules) {
  ExtraStat ttl{"cluster_lease_ttl_left_ms", "", "gauge", "Lease time left.", 2500};
  ExtraStat p = PrometheusExtra(ttl);
  EXPECT_EQ(p.name, "cluster_lease_ttl_left_seconds");
  EXPECT_DOUBLE_EQ(p.value, 2.5);
  EXPECT_EQ(PrometheusExtra({"cluster_map_epoch", "", "gauge", "h", 7}).name, "cluster_map_epoch");
  EXPECT_EQ(PrometheusExtra({"moves", "", "counter", "h", 1}).name, "moves_total");
  EXPECT_EQ(PrometheusExtra({"upgrade_refused_total", "", "counter", "h", 1}).name,
            "upgrade_refused_total");
  EXPECT_EQ(PrometheusExtra({"bad-name.x", "", "gauge", "h", 1}).name, "bad_name_x");
  EXPECT_EQ(PrometheusExtra({"9lives", "", "gauge", "h", 1}).name, "_9lives");
  EXPECT_EQ(PrometheusExtra({"", "", "gauge", "h", 1}).name, "unnamed");

  // `stats` keeps the names as given; the Prometheus text has one block a
  // family even when its rows come apart.
  StatsView v = SampleStats();
  v.extra = {{"upgrade_last_phase_seconds", "phase=\"o_pause\"", "gauge", "Phase.", 0.5},
             ttl,
             {"upgrade_last_phase_seconds", "phase=\"n_attach\"", "gauge", "Phase.", 0.25}};
  json j = json::parse(StatsAnswer(v));
  EXPECT_EQ(j["upgrade"]["cluster_lease_ttl_left_ms"], 2500);
  const std::string text = RenderPrometheus(v);
  EXPECT_NE(text.find("kvnode_cluster_lease_ttl_left_seconds 2.5\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("_ms"), std::string::npos) << text;
  const std::string type = "# TYPE kvnode_upgrade_last_phase_seconds gauge\n";
  const size_t first = text.find(type);
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(text.find(type, first + 1), std::string::npos) << "a second block: " << text;
}

// The text passes Prometheus's own checker (format and naming lints), with
// the contract's cluster rows and the upgrade's rows in it.
TEST(AdminRender, PromtoolAcceptsTheText) {
  if (std::system("promtool --version >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no promtool (Debian package prometheus)";
  }
  StatsView v = SampleStats();
  v.build_id = "build";
  v.extra = {{"upgrade_refused_total", "", "counter", "Upgrades refused.", 1},
             {"upgrade_last_phase_seconds", "phase=\"o_pause\"", "gauge", "Phase.", 0.5},
             {"cluster_map_epoch", "", "gauge", "Epoch of the shard map served.", 4},
             {"cluster_slots_owned", "", "gauge", "Slots this node owns.", 1366},
             {"cluster_etcd_connected", "", "gauge", "1 while etcd answers.", 1},
             {"cluster_lease_ttl_left_ms", "", "gauge", "Lease time left.", 2100}};
  char path[] = "/tmp/kvnode-promtool-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text = RenderPrometheus(v);
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  const std::string cmd = std::string("promtool check metrics <") + path + " 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int rc = pclose(p);
  unlink(path);
  EXPECT_EQ(rc, 0) << out << "\n" << text;
}

TEST(Metrics, ExportImportIsMonotonicAcrossProcesses) {
  Metrics old_process;
  old_process.Add(Counter::kOpsPut, 5);
  old_process.Error(ErrorKind::kQpError);
  Metrics next;
  next.Add(Counter::kOpsPut, 1);
  auto exported = old_process.Export();
  exported.emplace_back("ops_from_the_future", 9);
  EXPECT_EQ(next.Import(exported), 1u);  // one unknown name, ignored
  const CounterSnapshot s = next.Snapshot();
  EXPECT_EQ(s.of(Counter::kOpsPut), 6u);
  EXPECT_EQ(s.of(ErrorKind::kQpError), 1u);
  EXPECT_EQ(s.total_errors(), 1u);
}

}  // namespace
}  // namespace kvnode::server
