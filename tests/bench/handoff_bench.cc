// handoff_bench: what the session table costs to hand over, per stage, at the
// node's bound: --max_client_records (4096) records of full dedupe windows
// (--dedupe_window, 1024 entries). This is the table of a node that has seen
// that many clients vanish; the records of clients without a session travel
// ahead of the write pause (docs/upgrade.md, "Client records ahead of the
// pause"). Stages: SplitSessions, EncodeHandoff of each Sessions message,
// DecodeHandoff. A program, not a test: it prints milliseconds per stage,
// the best of --reps.

#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kvnode/upgrade/messages.h"

DEFINE_uint32(records, 4096, "client records in the table");
DEFINE_uint32(entries, 1024, "dedupe entries per record");
DEFINE_uint32(reps, 3, "repetitions (the best is printed)");

namespace kvnode::upgrade {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::vector<SessionRecord> Table(uint32_t records, uint32_t entries) {
  std::vector<SessionRecord> out(records);
  for (uint32_t c = 0; c < records; ++c) {
    SessionRecord& r = out[c];
    r.client_id = c + 1;
    r.highest_sequence = 100;
    r.window.reserve(entries);
    for (uint64_t i = 0; i < entries; ++i) {
      r.window.push_back(DedupeEntry{101 + i, /*opcode=*/2, /*status=*/0, 7 * i});
    }
  }
  return out;
}

struct Stages {
  double split = 0, encode = 0, decode = 0;
  size_t chunks = 0, bytes = 0;
};

Stages RunOnce() {
  std::vector<SessionRecord> table = Table(FLAGS_records, FLAGS_entries);
  Stages st;
  Clock::time_point t = Clock::now();
  absl::StatusOr<std::vector<Sessions>> chunks = SplitSessions(std::move(table));
  st.split = MsSince(t);
  if (!chunks.ok()) {
    std::fprintf(stderr, "SplitSessions: %s\n", chunks.status().ToString().c_str());
    std::exit(1);
  }
  st.chunks = chunks->size();
  t = Clock::now();
  std::vector<std::string> frames(chunks->size());
  for (size_t i = 0; i < chunks->size(); ++i) {
    const HandoffMessage m(std::move((*chunks)[i]));
    if (absl::Status s = EncodeHandoff(m, &frames[i]); !s.ok()) {
      std::fprintf(stderr, "EncodeHandoff: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    st.bytes += frames[i].size();
  }
  st.encode = MsSince(t);
  t = Clock::now();
  size_t records = 0;
  for (const std::string& f : frames) {
    absl::StatusOr<HandoffMessage> m = DecodeHandoff(AsBytes(f));
    if (!m.ok()) {
      std::fprintf(stderr, "DecodeHandoff: %s\n", m.status().ToString().c_str());
      std::exit(1);
    }
    records += std::get<Sessions>(*m).sessions.size();
  }
  st.decode = MsSince(t);
  if (records != FLAGS_records) {
    std::fprintf(stderr, "decoded %zu records of %u\n", records, FLAGS_records);
    std::exit(1);
  }
  return st;
}

}  // namespace
}  // namespace kvnode::upgrade

int main(int argc, char** argv) {
  gflags::SetUsageMessage("the session table's handover cost per stage (see the file's head)");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  kvnode::upgrade::Stages best;
  for (uint32_t r = 0; r < std::max(1u, FLAGS_reps); ++r) {
    const kvnode::upgrade::Stages s = kvnode::upgrade::RunOnce();
    if (r == 0 || s.split + s.encode + s.decode < best.split + best.encode + best.decode) {
      best = s;
    }
  }
  std::printf("%u records x %u entries: %zu Sessions messages, %.1f MB\n", FLAGS_records,
              FLAGS_entries, best.chunks, static_cast<double>(best.bytes) / 1e6);
  std::printf("split %.1f ms, encode %.1f ms, decode %.1f ms, total %.1f ms\n", best.split,
              best.encode, best.decode, best.split + best.encode + best.decode);
  return 0;
}
