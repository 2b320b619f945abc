// dedupe_bench: the data plane's per-write work on a client's dedupe window
// (server/include/kvnode/server/dedupe.h), over 64 clients' full windows so
// that they do not all sit in the L1 cache, as on a node with many clients.
//
//   build-X/tests/bench/dedupe_bench [--benchmark_filter=...]
//
// NewWrite: what every applied write costs (Find, TooOld, Newest for its side
// record, Record). RetryFind: a retry of one of the newest 8 writes (a move or
// reconnect). MissFind: a sequence under the newest but not in the window, the
// worst lookup (a scan of the whole window).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "kvnode/server/dedupe.h"

namespace {

using kvnode::server::DedupeEntry;
using kvnode::server::DedupeWindow;

constexpr size_t kClients = 64;
constexpr size_t kWindow = 1024;
constexpr size_t kCredits = 8;

// kClients full windows, each recorded up to `*next` (exclusive).
std::vector<DedupeWindow> FullWindows(uint64_t* next) {
  std::vector<DedupeWindow> ws(kClients, DedupeWindow(kWindow));
  for (*next = 1; *next <= 2 * kWindow; ++*next) {
    for (DedupeWindow& w : ws) w.Record(DedupeEntry{*next, 2, 0, *next});
  }
  return ws;
}

void BM_NewWrite(benchmark::State& state) {
  uint64_t seq = 0;
  std::vector<DedupeWindow> ws = FullWindows(&seq);
  for (auto _ : state) {
    for (DedupeWindow& w : ws) {
      if (w.Find(seq) != nullptr || w.TooOld(seq)) state.SkipWithError("a new sequence was known");
      benchmark::DoNotOptimize(w.Newest(kCredits - 1));
      w.Record(DedupeEntry{seq, 2, 0, seq});
    }
    ++seq;
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kClients));
}
BENCHMARK(BM_NewWrite);

void BM_RetryFind(benchmark::State& state) {
  uint64_t next = 0;
  const std::vector<DedupeWindow> ws = FullWindows(&next);
  for (auto _ : state) {
    for (const DedupeWindow& w : ws) {
      for (uint64_t s = next - kCredits; s < next; ++s) benchmark::DoNotOptimize(w.Find(s));
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kClients * kCredits));
}
BENCHMARK(BM_RetryFind);

void BM_MissFind(benchmark::State& state) {
  uint64_t next = 0;
  const std::vector<DedupeWindow> ws = FullWindows(&next);
  const uint64_t forgotten = next - kWindow - 1;
  for (auto _ : state) {
    for (const DedupeWindow& w : ws) benchmark::DoNotOptimize(w.Find(forgotten));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kClients));
}
BENCHMARK(BM_MissFind);

}  // namespace

BENCHMARK_MAIN();
