// kvctl: talks to a running kvnode over its admin socket.
//
//   kvctl [--admin_socket PATH] [--json] [--timeout_ms N] COMMAND [ARGS]
//
// Commands: ping, stats, metrics (Prometheus text), mrs, clients, memory,
// upgrade [--binary PATH] [--no_wait] [--timeout_s N], drain [SECONDS],
// check (the arena against RocksDB: exit 1 when a problem is found),
// guard up [SECONDS] | down (a cluster node's guard, docs/cluster.md);
// and, against etcd rather than a node, cluster init|status|roll|forget-node|
// add-node|remove-node|rebalance (kvctl_cluster.h, kvctl_roll.h,
// kvctl_migrate.h).
// Human-readable output by default, the node's raw JSON with --json. Exit
// status: 0 ok, 1 the node answered an error (for `upgrade`: refused or
// rolled back), 2 no answer (not running, wrong socket, time-out) or bad
// usage.
//
// `upgrade` waits for the outcome (the unit's ExecReload relies on it, so
// that a failed live upgrade fails `systemctl reload`): the old process
// answers `upgrade --wait` at its point of no return, with the generations,
// pids, builds, write pause and time taken, or when it has rolled back, with
// the reason. A node too old to understand --wait (its ping does not say
// upgrade_wait) is asked the plain `upgrade` and followed: ping on the same
// socket path until the new generation answers, or its stats show the
// rollback.
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvctl_cluster.h"
#include "kvnode/base/version.h"
#include "kvnode/client/admin.h"
#include "nlohmann/json.hpp"

DECLARE_bool(help);
DECLARE_string(helpmatch);

DEFINE_string(admin_socket, "",
              "the node's admin socket (default: the first existing of /run/kvnode/admin.sock, "
              "$XDG_RUNTIME_DIR/kvnode/admin.sock, /tmp/kvnode-$UID/admin.sock)");
DEFINE_bool(json, false,
            "print the node's JSON answer as is (for scripts); cluster status and the "
            "migration dry runs: their JSON");
DEFINE_int32(timeout_ms, 5000, "give up when the node has not answered within this time");
DEFINE_string(binary, "", "upgrade: the new binary (default: the node's --upgrade_binary)");
DEFINE_bool(no_wait, false,
            "upgrade: return once the node has started the upgrade, without its outcome");
DEFINE_int32(timeout_s, 120,
             "upgrade: give up waiting for the outcome after this long (exit 2; the upgrade "
             "may still be running). The unit's TimeoutStartSec (120) bounds a reload alike");

namespace {

using nlohmann::json;

// `check` walks every key and bucket (about a second per million keys on
// the dev host, writes waiting): its wait unless --timeout_ms is given.
constexpr int kCheckTimeoutMs = 600'000;

std::string Scalar(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.3f", v.get<double>());
    return buf;
  }
  return v.dump();
}

std::string HumanBytes(const json& v) {
  if (!v.is_number()) return Scalar(v);
  double b = v.get<double>();
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

void PrintFlat(const json& obj, const std::string& prefix, size_t width) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (it.key() == "ok") continue;
    const std::string name = prefix.empty() ? it.key() : absl::StrCat(prefix, ".", it.key());
    if (it->is_object()) {
      if (it->empty()) {
        std::printf("%-*s (none)\n", static_cast<int>(width), name.c_str());
      } else {
        PrintFlat(*it, name, width);
      }
      continue;
    }
    std::string value = Scalar(*it);
    if (it.key().find("bytes") != std::string::npos || it.key() == "size" || it.key() == "used") {
      value = absl::StrCat(value, " (", HumanBytes(*it), ")");
    }
    std::printf("%-*s %s\n", static_cast<int>(width), name.c_str(), value.c_str());
  }
}

// Prints a list of objects as a table with the union of their keys.
void PrintTable(const json& rows) {
  if (!rows.is_array() || rows.empty()) {
    std::printf("(none)\n");
    return;
  }
  std::vector<std::string> cols;
  for (const json& r : rows) {
    if (!r.is_object()) continue;
    for (auto it = r.begin(); it != r.end(); ++it) {
      if (std::find(cols.begin(), cols.end(), it.key()) == cols.end()) cols.push_back(it.key());
    }
  }
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> width(cols.size());
  for (size_t c = 0; c < cols.size(); ++c) width[c] = cols[c].size();
  for (const json& r : rows) {
    std::vector<std::string> line;
    for (size_t c = 0; c < cols.size(); ++c) {
      std::string v = r.is_object() && r.contains(cols[c]) ? Scalar(r[cols[c]]) : "-";
      if ((cols[c] == "lkey" || cols[c] == "rkey" || cols[c] == "addr") && r.contains(cols[c]) &&
          r[cols[c]].is_number_unsigned()) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "0x%llx",
                      static_cast<unsigned long long>(r[cols[c]].get<uint64_t>()));
        v = buf;
      }
      width[c] = std::max(width[c], v.size());
      line.push_back(std::move(v));
    }
    cells.push_back(std::move(line));
  }
  for (size_t c = 0; c < cols.size(); ++c) {
    std::printf("%-*s  ", static_cast<int>(width[c]), cols[c].c_str());
  }
  std::printf("\n");
  for (const auto& line : cells) {
    for (size_t c = 0; c < cols.size(); ++c) {
      std::printf("%-*s  ", static_cast<int>(width[c]), line[c].c_str());
    }
    std::printf("\n");
  }
}

// The list in an answer: the first array-valued member (e.g. "mrs",
// "clients"), or the answer itself.
const json* FindList(const json& answer) {
  if (answer.is_array()) return &answer;
  for (auto it = answer.begin(); it != answer.end(); ++it) {
    if (it->is_array()) return &*it;
  }
  return nullptr;
}

// An answer of the node as JSON, or why there is none (exit status 2).
absl::StatusOr<json> AskJson(const std::string& socket_path, const std::string& request,
                             absl::Time deadline) {
  absl::StatusOr<std::string> answer = kvnode::client::AdminRequest(socket_path, request, deadline);
  if (!answer.ok()) return answer.status();
  json j = json::parse(*answer, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InternalError(absl::StrCat("the node's answer is not JSON: ", *answer));
  }
  return j;
}

std::string Ms(const json& v) {
  char buf[64];
  const double ms = v.is_number() ? v.get<double>() : 0;
  if (ms < 1000) {
    std::snprintf(buf, sizeof(buf), "%.0f ms", ms);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f s", ms / 1000);
  }
  return buf;
}

// A member of an answer as text, "?" when it has none.
std::string Field(const json& j, const char* key) { return Scalar(j.value(key, json("?"))); }

// Prints an outcome (the node's answer to `upgrade --wait`, or one made up by
// Follow) and returns the exit status: 0 done, 1 rolled back or refused.
int PrintOutcome(const json& j) {
  const bool ok = j.value("ok", false);
  if (FLAGS_json) {
    std::printf("%s\n", j.dump().c_str());
    return ok ? 0 : 1;
  }
  const std::string what = j.value("upgrade", std::string());
  if (ok && what == "done") {
    std::printf("upgraded: generation %s -> %s, pid %s -> %s, in %s",
                Field(j, "old_generation").c_str(), Field(j, "new_generation").c_str(),
                Field(j, "old_pid").c_str(), Field(j, "new_pid").c_str(),
                Ms(j.value("elapsed_ms", json())).c_str());
    if (j.contains("write_pause_ms")) {
      std::printf(" (writes paused %s)", Ms(j.value("write_pause_ms", json())).c_str());
    } else {
      std::printf(" (this node does not report its write pause)");
    }
    std::printf("\n  build: %s -> %s\n", Field(j, "old_build").c_str(),
                Field(j, "new_build").c_str());
    return 0;
  }
  if (what == "rolled_back") {
    std::fprintf(stderr,
                 "kvctl upgrade: rolled back after %s: %s\n  generation %s (pid %s, build %s) "
                 "serves on\n",
                 Ms(j.value("elapsed_ms", json())).c_str(), Field(j, "reason").c_str(),
                 Field(j, "old_generation").c_str(), Field(j, "old_pid").c_str(),
                 Field(j, "old_build").c_str());
    return 1;
  }
  std::fprintf(stderr, "kvctl upgrade: %s\n",
               Scalar(j.value("error", json("the node did not say what happened"))).c_str());
  return ok ? 0 : 1;
}

// --timeout_s passed without an outcome: exit status 2.
int NoOutcomeInTime() {
  std::fprintf(stderr,
               "kvctl upgrade: no outcome within %d s: the upgrade may still be running (kvctl "
               "stats: upgrade_in_progress; kvctl ping: generation)\n",
               FLAGS_timeout_s);
  return 2;
}

// A node without `upgrade --wait`: after its "started" answer, ping the same
// path until the new generation answers (the admin socket is handed over
// with the rest), or the old process's stats show one more rollback and no
// upgrade in progress.
int Follow(const std::string& socket_path, const json& ping, const json& stats0, absl::Time t0,
           absl::Time deadline) {
  const uint64_t generation = ping.value("generation", uint64_t{0});
  const uint64_t rollbacks = stats0.value("rollbacks", uint64_t{0});
  json out{{"old_generation", generation},
           {"new_generation", generation + 1},
           {"old_pid", ping.value("pid", json(0))},
           {"old_build", ping.value("build_id", json(""))}};
  for (;;) {
    const absl::Time ask_by =
        std::min(deadline, absl::Now() + absl::Milliseconds(FLAGS_timeout_ms));
    absl::StatusOr<json> p = AskJson(socket_path, "ping", ask_by);
    if (p.ok() && p->value("generation", uint64_t{0}) > generation) {
      out.update(json{{"ok", true},
                      {"upgrade", "done"},
                      {"new_generation", (*p)["generation"]},
                      {"new_pid", p->value("pid", json(0))},
                      {"new_build", p->value("build_id", json(""))},
                      {"elapsed_ms", absl::ToDoubleMilliseconds(absl::Now() - t0)}});
      return PrintOutcome(out);
    }
    absl::StatusOr<json> s = AskJson(socket_path, "stats", ask_by);
    if (s.ok() && s->value("pid", json(0)) == ping.value("pid", json(0)) &&
        s->value("rollbacks", uint64_t{0}) > rollbacks && !s->value("upgrade_in_progress", true)) {
      out.update(json{{"ok", false},
                      {"upgrade", "rolled_back"},
                      {"reason", "this node's version does not say why: see its log"},
                      {"elapsed_ms", absl::ToDoubleMilliseconds(absl::Now() - t0)}});
      return PrintOutcome(out);
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(200));  // the poll interval of a wait with a deadline
  }
  return NoOutcomeInTime();
}

// The answer to `check`; exit 0 when clean, 1 when not.
int PrintCheck(const json& j) {
  auto n = [&](const char* k) { return j.value(k, json(0)).dump(); };
  if (j.value("clean", false)) {
    std::printf(
        "check: clean in %s s: %s keys in RocksDB, %s read from the arena as a client reads "
        "them, %s sent to the server by a marker; %s buckets, %s resident slots, %s markers\n",
        n("seconds").c_str(), n("db_keys").c_str(), n("found").c_str(), n("sent_to_server").c_str(),
        n("buckets").c_str(), n("resident_slots").c_str(), n("marker_slots").c_str());
    return 0;
  }
  std::printf("check: %s problem(s) between the arena and RocksDB (%s keys); the first:\n",
              n("problems").c_str(), n("db_keys").c_str());
  for (const json& p : j.value("first_problems", json::array())) {
    std::printf("  %s\n", Scalar(p).c_str());
  }
  return 1;
}

// `kvctl upgrade` without --no_wait: the outcome, waited for up to --timeout_s.
int Upgrade(const std::string& socket_path, const std::vector<std::string>& args) {
  const absl::Time t0 = absl::Now();
  const absl::Time deadline = t0 + absl::Seconds(FLAGS_timeout_s);
  const absl::Time ask_by = std::min(deadline, t0 + absl::Milliseconds(FLAGS_timeout_ms));
  absl::StatusOr<json> ping = AskJson(socket_path, "ping", ask_by);
  if (!ping.ok()) {
    std::fprintf(stderr, "kvctl: %s\n", std::string(ping.status().message()).c_str());
    return 2;
  }
  if (ping->value("upgrade_wait", false)) {
    std::vector<std::string> words = {"upgrade", "--wait"};
    words.insert(words.end(), args.begin(), args.end());
    absl::StatusOr<json> outcome = AskJson(socket_path, absl::StrJoin(words, " "), deadline);
    if (absl::IsDeadlineExceeded(outcome.status())) return NoOutcomeInTime();
    if (!outcome.ok()) {
      std::fprintf(stderr,
                   "kvctl upgrade: no outcome: %s (the node may have exited: kvctl ping says "
                   "which generation serves)\n",
                   std::string(outcome.status().message()).c_str());
      return 2;
    }
    return PrintOutcome(*outcome);
  }
  absl::StatusOr<json> stats0 = AskJson(socket_path, "stats", ask_by);
  std::vector<std::string> words = {"upgrade"};
  words.insert(words.end(), args.begin(), args.end());
  absl::StatusOr<json> started = AskJson(socket_path, absl::StrJoin(words, " "), ask_by);
  if (!stats0.ok() || !started.ok()) {
    const absl::Status& s = stats0.ok() ? started.status() : stats0.status();
    std::fprintf(stderr, "kvctl: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (!started->value("ok", false)) return PrintOutcome(*started);
  if (!FLAGS_json) {
    std::printf("%s (following it: this node does not report the outcome)\n",
                Scalar(started->value("upgrade", json(""))).c_str());
    std::fflush(stdout);  // before the outcome, which may go to stderr
  }
  return Follow(socket_path, *ping, *stats0, t0, deadline);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetVersionString(kvnode::base::kVersionString);
  gflags::SetUsageMessage(
      "admin tool of a running kvnode.\n"
      "  kvctl [--admin_socket PATH] [--json] COMMAND\n"
      "  commands: ping | stats | metrics | mrs | clients | memory (malloc's heap) |\n"
      "            upgrade [--binary PATH] [--no_wait] [--timeout_s N]  (waits for the\n"
      "                              outcome: exit 1 when the upgrade rolled back) |\n"
      "            drain [SECONDS]  (refuse new sessions; the node exits once its clients\n"
      "                              have left, or after SECONDS, default 300) |\n"
      "            check  (the arena against RocksDB, key by key; writes wait meanwhile;\n"
      "                    exit 1 naming the first problems) |\n"
      "            guard up [SECONDS] | down  (a cluster node: every client checks the slot\n"
      "                    words of its READs, or is cut after SECONDS, default 2; what a\n"
      "                    slot migration's source does before it stops serving a slot)\n"
      "  kvctl cluster init --etcd_endpoints E --cluster NAME --nodes a,b,c [--slots N]\n"
      "  kvctl cluster status --etcd_endpoints E --cluster NAME [--json]\n"
      "  kvctl cluster forget-node ID --etcd_endpoints E --cluster NAME  (unbind a lost\n"
      "                              node's id from its database; refused while it is alive)\n"
      "  kvctl cluster roll --binary PATH [--build_id ID] [--max_unavailable 1] [--gate_s 10]\n"
      "                     [--dry_run] --etcd_endpoints E --cluster NAME  (live-upgrade every\n"
      "                              node in turn; exit 0 done, 1 stopped or refused, 3 paused)\n"
      "  kvctl cluster roll --resume | --abort --etcd_endpoints E --cluster NAME\n"
      "  kvctl cluster add-node ID | remove-node ID | rebalance --dry_run\n"
      "                     [--max_slots_per_move 64] [--rate_mb_s 0] [--json]\n"
      "                     --etcd_endpoints E --cluster NAME  (the slot-migration plan: which\n"
      "                              slots would move from which node to which, and each\n"
      "                              node's slots before and after; nothing is written. Moving\n"
      "                              slots is not built yet: without --dry_run, exit 2)");
  // --help lists this program's own flags; --helpfull adds gflags' and glog's.
  gflags::ParseCommandLineNonHelpFlags(&argc, &argv, true);
  if (FLAGS_help) {
    FLAGS_help = false;
    FLAGS_helpmatch = "tools/kvctl";  // kvctl.cc and kvctl_cluster.cc
  }
  gflags::HandleCommandLineHelpFlags();
  if (argc < 2) {
    std::fprintf(stderr,
                 "kvctl: no command (ping, stats, metrics, mrs, clients, memory, upgrade, drain, "
                 "check, cluster)\n");
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "cluster") {
    return kvnode::tools::ClusterCommand(std::vector<std::string>(argv + 2, argv + argc),
                                         FLAGS_json);
  }
  static const std::vector<std::string> kCommands = {
      "ping", "stats", "metrics", "mrs", "clients", "memory", "upgrade", "drain", "check", "guard"};
  if (std::find(kCommands.begin(), kCommands.end(), cmd) == kCommands.end()) {
    std::fprintf(stderr, "kvctl: unknown command '%s'\n", cmd.c_str());
    return 2;
  }
  std::vector<std::string> words = {cmd};
  if (cmd == "upgrade") {
    if (!FLAGS_binary.empty()) words.push_back(FLAGS_binary);
    for (int i = 2; i < argc; ++i) words.push_back(argv[i]);
  } else if (cmd == "drain" && argc == 3) {
    words.push_back(argv[2]);
  } else if (cmd == "guard" && argc >= 3 && argc <= 4) {
    for (int i = 2; i < argc; ++i) words.push_back(argv[i]);
  } else if (cmd == "guard") {
    std::fprintf(stderr, "kvctl: guard takes 'up [SECONDS]' or 'down'\n");
    return 2;
  } else if (argc > 2) {
    std::fprintf(stderr, "kvctl: '%s' takes no arguments\n", cmd.c_str());
    return 2;
  }
  const std::string socket_path =
      FLAGS_admin_socket.empty() ? kvnode::client::DefaultAdminSocketPath() : FLAGS_admin_socket;
  if (cmd == "upgrade" && FLAGS_timeout_s < 1) {
    std::fprintf(stderr, "kvctl: --timeout_s must be at least 1, not %d\n", FLAGS_timeout_s);
    return 2;
  }
  if (cmd == "upgrade" && !FLAGS_no_wait) {
    return Upgrade(socket_path, std::vector<std::string>(words.begin() + 1, words.end()));
  }
  // A check walks the whole store: its own default wait.
  int timeout_ms = FLAGS_timeout_ms;
  if (gflags::GetCommandLineFlagInfoOrDie("timeout_ms").is_default) {
    // A guard's answer waits for its clients' acknowledgements (at most 60 s).
    if (cmd == "check") timeout_ms = kCheckTimeoutMs;
    if (cmd == "guard") timeout_ms = 65'000;
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::string> answer = kvnode::client::AdminRequest(
      socket_path, absl::StrJoin(words, " "), t0 + absl::Milliseconds(timeout_ms));
  if (!answer.ok()) {
    std::fprintf(stderr, "kvctl: %s\n", std::string(answer.status().message()).c_str());
    return 2;
  }
  if (cmd == "metrics") {
    std::printf("%s\n", answer->c_str());
    return 0;
  }
  json j = json::parse(*answer, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    std::fprintf(stderr, "kvctl: the node's answer is not JSON: %s\n", answer->c_str());
    return 2;
  }
  const bool ok = j.is_object() && j.value("ok", false);
  if (FLAGS_json) {
    std::printf("%s\n", j.dump().c_str());
    return ok && (cmd != "check" || j.value("clean", false)) ? 0 : 1;
  }
  if (!ok) {
    std::fprintf(
        stderr, "kvctl %s: %s\n", cmd.c_str(),
        j.is_object() && j.contains("error") ? Scalar(j["error"]).c_str() : answer->c_str());
    return 1;
  }
  if (cmd == "ping") {
    std::printf("pong from %s in %s", socket_path.c_str(),
                absl::FormatDuration(absl::Now() - t0).c_str());
    if (j.contains("pid")) std::printf(" (pid %s)", Scalar(j["pid"]).c_str());
    if (j.contains("generation")) std::printf(" generation %s", Scalar(j["generation"]).c_str());
    // The node's version and build (its --build_id); older nodes do not say.
    if (j.contains("build_id")) std::printf(" version %s", Scalar(j["build_id"]).c_str());
    std::printf("\n");
    return 0;
  }
  if (cmd == "check") return PrintCheck(j);
  if (cmd == "guard") {
    if (j.value("guard", "") == "up") {
      std::printf("guard up: %s session(s) check the slot words, %s cut\n",
                  Scalar(j.value("acknowledged", json(0))).c_str(),
                  Scalar(j.value("cut", json(0))).c_str());
    } else {
      std::printf("guard down: clients on a shard map older than epoch %s go on checking\n",
                  Scalar(j.value("check_below_epoch", json(0))).c_str());
    }
    return 0;
  }
  if (cmd == "drain") {
    std::printf(
        "draining: new sessions are refused; the node exits once its %s client(s) have "
        "left, or in %s s\n",
        Scalar(j.value("clients", json(0))).c_str(), Scalar(j.value("timeout_s", json(0))).c_str());
    return 0;
  }
  if (cmd == "mrs" || cmd == "clients") {
    const json* list = FindList(j);
    if (list == nullptr) {
      PrintFlat(j, "", 24);
    } else {
      PrintTable(*list);
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (it.key() != "ok" && !it->is_array()) {
          std::printf("%s: %s\n", it.key().c_str(), Scalar(*it).c_str());
        }
      }
    }
    return 0;
  }
  PrintFlat(j, "", 28);
  return 0;
}
