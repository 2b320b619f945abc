// kvhistory: is a kvload history linearizable? (linearize.h)
//
//   kvload ... --history h.tsv
//   kvhistory h.tsv                         (exit 0: linearizable)
//   kvhistory --generate 100000 --out g.tsv (a synthetic one, to time the checker)
#include <gflags/gflags.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "kvnode/load/history.h"
#include "kvnode/load/linearize.h"

DECLARE_bool(help);
DECLARE_string(helpmatch);

DEFINE_string(initial, "absent",
              "each key before the history: absent (a node started empty) | any (unknown: the "
              "first GET may read a value the history never writes)");
DEFINE_uint64(max_steps, 200000000, "search steps per key before it is UNDECIDED (0: no limit)");
DEFINE_uint64(context, 4, "linearized operations shown before the point of failure");
DEFINE_bool(quiet, false, "print only keys that are not linearizable, and the summary");
DEFINE_uint64(generate, 0, "write a synthetic linearizable history of this many operations");
DEFINE_string(out, "", "--generate: the file to write");
DEFINE_uint32(keys, 6, "--generate: keys");
DEFINE_uint32(clients, 6, "--generate: clients");
DEFINE_uint32(depth, 4, "--generate: operations in flight per client");
DEFINE_double(failed, 0.001, "--generate: fraction of writes reported failed");
DEFINE_uint64(seed, 1, "--generate: random seed");

namespace {

namespace load = kvnode::load;

int Generate() {
  if (FLAGS_out.empty()) {
    std::fprintf(stderr, "kvhistory: --generate needs --out FILE\n");
    return 2;
  }
  load::GenerateOptions g;
  g.ops = FLAGS_generate;
  g.keys = FLAGS_keys;
  g.clients = FLAGS_clients;
  g.depth = FLAGS_depth;
  g.failed = FLAGS_failed;
  g.seed = FLAGS_seed;
  absl::StatusOr<std::unique_ptr<load::HistoryWriter>> w = load::HistoryWriter::Create(FLAGS_out);
  if (!w.ok()) {
    std::fprintf(stderr, "kvhistory: --out: %s\n", w.status().ToString().c_str());
    return 2;
  }
  std::string text;
  for (const load::HistoryOp& h : load::GenerateHistory(g)) {
    load::AppendHistoryLine({h.client, h.kind, h.key, h.call_ns, h.return_ns, h.outcome, h.value},
                            &text);
  }
  absl::Status st = (*w)->Append(text);
  if (st.ok()) st = (*w)->Close();
  if (!st.ok()) {
    std::fprintf(stderr, "kvhistory: %s\n", st.ToString().c_str());
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "checks that a kvload history (kvload --history FILE) is linearizable.\n"
      "\n"
      "  kvhistory [--initial absent|any] FILE\n"
      "  kvhistory --generate OPS --out FILE [--keys K --clients C --depth D --failed F]\n"
      "\n"
      "Each key is a register checked on its own (value or absent; PUT sets it, DELETE\n"
      "answered ok needs it to exist, not_found needs it absent, GET reads it). A failed GET\n"
      "is ignored; a failed PUT or DELETE may have taken effect at any time after its call,\n"
      "or never. The file format and the search are in tools/include/kvnode/load/\n"
      "{history,linearize}.h and docs/protocol.md section 3.3.\n"
      "\n"
      "Prints one line per key (linearizable or not, operations, search steps) and a\n"
      "summary. For a key that is NOT linearizable it prints the window where the search\n"
      "failed: the last --context operations of the longest linearizable prefix it found (in\n"
      "the order they took effect), the register after them, and every operation that could\n"
      "come next (called before the earliest pending return), each with why it cannot take\n"
      "effect there. Lines are the history file's line numbers; times are seconds.\n"
      "\n"
      "Exit status: 0 linearizable; 1 not linearizable; 2 bad flags or file; 3 undecided\n"
      "(--max_steps reached on some key, none found not linearizable).");
  gflags::ParseCommandLineNonHelpFlags(&argc, &argv, true);
  if (FLAGS_help) {
    FLAGS_help = false;
    FLAGS_helpmatch = __FILE__;
  }
  gflags::HandleCommandLineHelpFlags();
  if (FLAGS_generate > 0) return Generate();
  if (argc != 2) {
    std::fprintf(stderr, "kvhistory: expected one history FILE (see --help)\n");
    return 2;
  }
  load::LinearizeOptions o;
  if (FLAGS_initial == "absent") {
    o.initial = load::LinearizeOptions::Initial::kAbsent;
  } else if (FLAGS_initial == "any") {
    o.initial = load::LinearizeOptions::Initial::kAny;
  } else {
    std::fprintf(stderr, "kvhistory: --initial must be absent or any, not '%s'\n",
                 FLAGS_initial.c_str());
    return 2;
  }
  o.max_steps = FLAGS_max_steps;
  o.context = FLAGS_context;
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<load::HistoryOp>> ops = load::ReadHistory(argv[1]);
  if (!ops.ok()) {
    std::fprintf(stderr, "kvhistory: %s\n", ops.status().ToString().c_str());
    return 2;
  }
  const size_t total = ops->size();
  const auto t_read = std::chrono::steady_clock::now();
  size_t bad = 0, undecided = 0, keys = 0;
  for (const auto& [key, key_ops] : load::SplitByKey(*std::move(ops))) {
    ++keys;
    const load::KeyVerdict v = load::CheckKey(key_ops, o);
    if (v.result == load::KeyVerdict::Result::kNotLinearizable) ++bad;
    if (v.result == load::KeyVerdict::Result::kUndecided) ++undecided;
    if (!FLAGS_quiet || v.result != load::KeyVerdict::Result::kLinearizable) {
      std::printf("%s", load::DescribeVerdict(v, key_ops).c_str());
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  const char* verdict = bad > 0 ? "NOT LINEARIZABLE" : undecided > 0 ? "UNDECIDED" : "linearizable";
  std::printf(
      "history %s: %zu operations, %zu keys: %s (%zu keys not linearizable, %zu "
      "undecided); read %.2f s, checked %.2f s\n",
      argv[1], total, keys, verdict, bad, undecided,
      std::chrono::duration<double>(t_read - t0).count(),
      std::chrono::duration<double>(t1 - t_read).count());
  return bad > 0 ? 1 : undecided > 0 ? 3 : 0;
}
