#include "kvctl_roll.h"

#include <fcntl.h>
#include <gflags/gflags.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "kvnode/cluster/roll_driver.h"

DECLARE_string(binary);
DEFINE_string(build_id, "",
              "cluster roll: the build id the new binary's nodes report (default: what "
              "`BINARY --print_build_id` prints on this machine)");
DEFINE_uint32(max_unavailable, 1, "cluster roll: nodes upgrading at once");
DEFINE_uint32(gate_s, 10,
              "cluster roll: seconds every node must stay healthy (alive, serving, no error "
              "counter rising) after a node's upgrade before the next one starts");
DEFINE_bool(resume, false,
            "cluster roll: go on with the unfinished roll (after a stop, a fix, "
            "or a kvctl that died), from any machine");
DEFINE_bool(abort, false,
            "cluster roll: abort the unfinished roll (an upgrade under way "
            "completes or rolls back on its own)");
DEFINE_bool(dry_run, false,
            "cluster roll|add-node|remove-node|rebalance: show the plan, change nothing");
DEFINE_uint32(node_timeout_s, 300,
              "cluster roll: a node without an outcome this long after its intent fails the roll");
DEFINE_uint32(etcd_wait_s, 60,
              "cluster roll: etcd unreachable this long: exit 3 (paused), --resume later");

extern char** environ;

namespace kvnode::tools {
namespace {

using cluster::RollNodeState;

// `binary --print_build_id`, with a deadline (exec of a large binary is slow
// under emulation).
absl::StatusOr<std::string> ProbeBuildId(const std::string& binary) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  std::string flag = "--print_build_id";
  char* argv[] = {const_cast<char*>(binary.c_str()), flag.data(), nullptr};
  pid_t pid = 0;
  int rc = posix_spawn(&pid, binary.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run ", binary, ": ", std::strerror(rc)));
  }
  std::string out;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool eof = false;
  while (!eof) {
    pollfd p{fds[0], POLLIN, 0};
    int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (left <= 0 || poll(&p, 1, left) <= 0) break;
    char buf[512];
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) out.append(buf, static_cast<size_t>(n));
    eof = n <= 0;
  }
  close(fds[0]);
  int status = 0;
  if (!eof) kill(pid, SIGKILL);  // it printed nothing more within the deadline
  waitpid(pid, &status, 0);
  if (!eof) {
    return absl::DeadlineExceededError(absl::StrCat(binary, " --print_build_id took over 60 s"));
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || out.empty() ||
      out.find('\n') != std::string::npos) {
    return absl::FailedPreconditionError(
        absl::StrCat(binary, " --print_build_id did not print one build id (is it a kvnode?)"));
  }
  return out;
}

std::string Secs(int64_t from_ms, int64_t to_ms) {
  if (from_ms <= 0) return "-";
  if (to_ms <= 0) to_ms = absl::ToUnixMillis(absl::Now());
  return absl::StrFormat("%.1fs", (to_ms - from_ms) / 1000.0);
}

void PrintTable(const cluster::RollSnapshot& s) {
  const cluster::RollPlan& p = s.plan;
  std::printf("roll %s: %s%s%s\n", p.roll_id.c_str(),
              std::string(cluster::RollStateName(p.state)).c_str(), p.reason.empty() ? "" : ": ",
              p.reason.c_str());
  std::printf("binary %s, build '%s'\n", p.binary.c_str(), p.build_id.c_str());
  std::printf("%-16s %-12s %-7s %-11s %-8s %-24s %s\n", "NODE", "STATE", "ATTEMPT", "GEN", "TIME",
              "BUILD NOW", "REASON");
  for (const cluster::RollNode& n : p.nodes) {
    auto it = s.members.find(n.node_id);
    const std::string gen = n.state == RollNodeState::kDone
                                ? absl::StrCat(n.from_generation, "->", n.to_generation)
                            : n.from_generation > 0 ? absl::StrCat(n.from_generation)
                                                    : "-";
    std::printf("%-16s %-12s %-7llu %-11s %-8s %-24s %s\n", n.node_id.c_str(),
                std::string(cluster::RollNodeStateName(n.state)).c_str(),
                static_cast<unsigned long long>(n.attempt), gen.c_str(),
                Secs(n.started_ms, n.ended_ms).c_str(),
                it == s.members.end() ? "(down)" : it->second.build_id.c_str(), n.reason.c_str());
  }
}

// The plan a roll would write, and what it would do with each node now.
void PrintDryRun(const cluster::RollSnapshot& s) {
  const cluster::RollPlan& p = s.plan;
  std::printf("dry run (nothing written): a roll to %s, build '%s', in this order:\n",
              p.binary.c_str(), p.build_id.c_str());
  std::string down;
  for (const cluster::RollNode& n : p.nodes) {
    auto it = s.members.find(n.node_id);
    std::string what;
    if (it == s.members.end()) {
      what = "down: the roll would stop before its first intent";
      down += " " + n.node_id;
    } else if (it->second.build_id == p.build_id) {
      what = "already on the build: done without an upgrade";
    } else {
      what = absl::StrCat("live upgrade from generation ", it->second.generation, ", build '",
                          it->second.build_id, "'");
    }
    std::printf("  %-16s %s\n", n.node_id.c_str(), what.c_str());
  }
  std::printf("then %u s of health gate after each %u node(s)%s\n", p.gate_s, p.max_unavailable,
              down.empty() ? "" : absl::StrCat("; not now: down:", down).c_str());
}

int ExitCode(cluster::RollResult r) {
  switch (r) {
    case cluster::RollResult::kDone:
      return 0;
    case cluster::RollResult::kStopped:
    case cluster::RollResult::kRefused:
      return 1;
    case cluster::RollResult::kPaused:
      return 3;
    case cluster::RollResult::kInvalid:
      break;
  }
  return 2;
}

}  // namespace

int RollCommand(cluster::EtcdClient& etcd, const std::string& cluster_name) {
  cluster::RollOptions o;
  o.cluster = cluster_name;
  if (FLAGS_resume + FLAGS_abort + FLAGS_dry_run > 1) {
    std::fprintf(stderr,
                 "kvctl cluster roll: --resume, --abort and --dry_run exclude each other\n");
    return 2;
  }
  o.mode = FLAGS_resume    ? cluster::RollMode::kResume
           : FLAGS_abort   ? cluster::RollMode::kAbort
           : FLAGS_dry_run ? cluster::RollMode::kDryRun
                           : cluster::RollMode::kStart;
  if (o.mode == cluster::RollMode::kStart || o.mode == cluster::RollMode::kDryRun) {
    if (FLAGS_binary.empty() || FLAGS_binary[0] != '/') {
      std::fprintf(stderr,
                   "kvctl cluster roll: --binary must be the new binary's absolute path "
                   "(the same on every node's machine)\n");
      return 2;
    }
    o.binary = FLAGS_binary;
    o.build_id = FLAGS_build_id;
    if (o.build_id.empty()) {
      absl::StatusOr<std::string> b = ProbeBuildId(o.binary);
      if (!b.ok()) {
        std::fprintf(stderr, "kvctl cluster roll: %s; give --build_id\n",
                     std::string(b.status().message()).c_str());
        return 2;
      }
      o.build_id = *b;
    }
  }
  o.max_unavailable = FLAGS_max_unavailable;
  o.gate_s = FLAGS_gate_s;
  o.node_timeout = absl::Seconds(FLAGS_node_timeout_s);
  o.etcd_wait = absl::Seconds(FLAGS_etcd_wait_s);
  o.lock_wait = absl::Seconds(10);
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  o.holder = absl::StrCat("kvctl on ", host, " pid ", getpid());

  const absl::Time t0 = absl::Now();
  auto progress = [&](const cluster::RollSnapshot& s, const std::string& event) {
    size_t done = 0;
    for (const auto& n : s.plan.nodes) done += n.state == RollNodeState::kDone;
    std::printf("[%6.1fs] roll %s: %s (%zu of %zu nodes done)\n",
                absl::ToDoubleSeconds(absl::Now() - t0), s.plan.roll_id.c_str(), event.c_str(),
                done, s.plan.nodes.size());
    std::fflush(stdout);
  };
  cluster::RollOutcome out = cluster::RunRoll(etcd, o, progress);
  if (o.mode == cluster::RollMode::kDryRun && out.result == cluster::RollResult::kDone) {
    PrintDryRun(out.last);
  } else if (!out.last.plan.roll_id.empty()) {
    PrintTable(out.last);
  }
  if (!out.message.empty()) std::fprintf(stderr, "kvctl cluster roll: %s\n", out.message.c_str());
  return ExitCode(out.result);
}

}  // namespace kvnode::tools
