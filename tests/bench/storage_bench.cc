// storage_bench: arena GET decode and Store PUT against raw RocksDB Get/Put on
// the same keys (16-byte keys; 64 B and 1 KiB values; 1e5 and 1e6 keys), and
// arena rebuild time per million keys. Prints the ratios at the end.
//
//   build-X/tests/bench/storage_bench [--benchmark_filter=...]
//
// "Arena GET" is what a remote client does after its READs land: copy the
// bucket (and object) bytes out of the mapping and decode them. RocksDB Get is
// the slow path the arena saves. Both run on the host; network costs are not
// included (see the rdma benchmarks for those).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvnode/storage/arena.h"
#include "kvnode/storage/read_path.h"
#include "kvnode/storage/store.h"
#include "rocksdb/db.h"

namespace {

using kvnode::storage::Arena;
using kvnode::storage::Store;
using kvnode::storage::StoreOptions;
namespace ks = kvnode::storage;

std::string Key(uint64_t i) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016lu", static_cast<unsigned long>(i));
  return std::string(buf, 16);
}
std::string Value(uint64_t i, size_t len) {
  return std::string(len, static_cast<char>('a' + i % 26));
}

struct Dataset {
  std::filesystem::path dir;
  StoreOptions options;
  std::unique_ptr<Store> store;
  std::unique_ptr<rocksdb::DB> raw;
  uint64_t keys = 0;
  size_t value_len = 0;
  double load_store_s = 0, load_raw_s = 0;

  ~Dataset() {
    store.reset();
    raw.reset();
    (void)Arena::Remove(options.arena_options());
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::map<std::pair<uint64_t, size_t>, std::unique_ptr<Dataset>> cache;

Dataset* Get(uint64_t keys, size_t value_len) {
  auto& slot = cache[{keys, value_len}];
  if (slot) return slot.get();
  // One dataset in memory at a time (1e6 x 1 KiB is ~1 GiB of arena).
  for (auto& [k, v] : cache) {
    if (v.get() != slot.get()) v.reset();
  }
  auto d = std::make_unique<Dataset>();
  d->keys = keys;
  d->value_len = value_len;
  d->dir = std::filesystem::temp_directory_path() /
           ("kvnode-bench-" + std::to_string(getpid()) + "-" + std::to_string(keys) + "-" +
            std::to_string(value_len));
  std::filesystem::create_directories(d->dir);
  d->options.db_path = (d->dir / "store").string();
  d->options.shm_name = "kvnode-bench-" + std::to_string(getpid());
  d->options.sync_writes = false;
  d->options.promote_on_get = false;
  const uint64_t object = ks::ObjectFootprint(16, value_len, 8) + 16;
  uint64_t buckets = std::bit_ceil(keys / 3);
  d->options.bucket_count = buckets;
  d->options.arena_size =
      (keys * object * 13 / 10 + buckets * 256 + (64 << 20) + 4095) / 4096 * 4096;
  auto s = Store::Open(d->options);
  if (!s.ok()) {
    std::fprintf(stderr, "open store: %s\n", s.status().ToString().c_str());
    std::exit(1);
  }
  d->store = std::move(*s);
  rocksdb::Options ro;
  ro.create_if_missing = true;
  rocksdb::DB* db = nullptr;
  rocksdb::Status rs = rocksdb::DB::Open(ro, (d->dir / "raw").string(), &db);
  if (!rs.ok()) {
    std::fprintf(stderr, "open raw rocksdb: %s\n", rs.ToString().c_str());
    std::exit(1);
  }
  d->raw.reset(db);
  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < keys; ++i) {
    if (!d->store->Put(Key(i), Value(i, value_len)).ok()) std::exit(2);
  }
  d->load_store_s = Seconds(t0);
  t0 = std::chrono::steady_clock::now();
  rocksdb::WriteOptions wo;
  for (uint64_t i = 0; i < keys; ++i) {
    if (!d->raw->Put(wo, Key(i), Value(i, value_len)).ok()) std::exit(2);
  }
  d->load_raw_s = Seconds(t0);
  slot = std::move(d);
  return slot.get();
}

std::map<std::string, double> g_ns_per_op;  // for the ratio summary

void Percentiles(benchmark::State& state, std::vector<uint32_t>& lat) {
  if (lat.empty()) return;
  std::sort(lat.begin(), lat.end());
  auto at = [&](double q) {
    return static_cast<double>(lat[static_cast<size_t>(q * (lat.size() - 1))]);
  };
  state.counters["p50_ns"] = at(0.5);
  state.counters["p99_ns"] = at(0.99);
  state.counters["p999_ns"] = at(0.999);
}

std::string Tag(const benchmark::State& state) {
  return std::to_string(state.range(0)) + "/" + std::to_string(state.range(1));
}

void BM_ArenaGetDecode(benchmark::State& state) {
  Dataset* d = Get(state.range(0), state.range(1));
  const ks::Geometry& g = d->store->geometry();
  const char* base = d->store->arena_base();
  std::mt19937_64 rng(1);
  std::vector<char> buf(ks::kMaxObjectSize + 64);
  std::vector<uint32_t> lat;
  lat.reserve(1 << 20);
  uint64_t reads = 0, found = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const std::string key = Key(rng() % d->keys);
    const auto s0 = std::chrono::steady_clock::now();
    ks::ReadStep step = ks::FirstRead(g, key);
    ks::ReadResult r;
    for (;;) {
      std::memcpy(buf.data(), base + step.offset, step.length);  // the READ landing
      ++reads;
      r = ks::Decode(g, key, step, std::string_view(buf.data(), step.length));
      if (r.outcome != ks::ReadResult::Outcome::kNext) break;
      step = r.next;
    }
    found += r.outcome == ks::ReadResult::Outcome::kFound;
    benchmark::DoNotOptimize(r.value.data());
    if (lat.size() < lat.capacity()) {
      lat.push_back(static_cast<uint32_t>(
          std::chrono::nanoseconds(std::chrono::steady_clock::now() - s0).count()));
    }
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  g_ns_per_op["arena_get " + Tag(state)] = ns / state.iterations();
  state.counters["reads_per_get"] = static_cast<double>(reads) / state.iterations();
  state.counters["hit_ratio"] = static_cast<double>(found) / state.iterations();
  Percentiles(state, lat);
}

void BM_RocksDbGet(benchmark::State& state) {
  Dataset* d = Get(state.range(0), state.range(1));
  std::mt19937_64 rng(1);
  std::string v;
  std::vector<uint32_t> lat;
  lat.reserve(1 << 20);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const std::string key = Key(rng() % d->keys);
    const auto s0 = std::chrono::steady_clock::now();
    if (!d->raw->Get(rocksdb::ReadOptions(), key, &v).ok()) state.SkipWithError("missing key");
    benchmark::DoNotOptimize(v.data());
    if (lat.size() < lat.capacity()) {
      lat.push_back(static_cast<uint32_t>(
          std::chrono::nanoseconds(std::chrono::steady_clock::now() - s0).count()));
    }
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  g_ns_per_op["rocksdb_get " + Tag(state)] = ns / state.iterations();
  Percentiles(state, lat);
}

void BM_StorePut(benchmark::State& state) {
  Dataset* d = Get(state.range(0), state.range(1));
  std::mt19937_64 rng(2);
  uint64_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const uint64_t i = rng() % d->keys;
    if (!d->store->Put(Key(i), Value(i + ++n, d->value_len)).ok()) state.SkipWithError("put");
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  g_ns_per_op["store_put " + Tag(state)] = ns / state.iterations();
  state.counters["evictions"] = static_cast<double>(d->store->stats().evictions);
}

void BM_RocksDbPut(benchmark::State& state) {
  Dataset* d = Get(state.range(0), state.range(1));
  std::mt19937_64 rng(2);
  uint64_t n = 0;
  rocksdb::WriteOptions wo;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const uint64_t i = rng() % d->keys;
    if (!d->raw->Put(wo, Key(i), Value(i + ++n, d->value_len)).ok()) state.SkipWithError("put");
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  g_ns_per_op["rocksdb_put " + Tag(state)] = ns / state.iterations();
}

// Cold start: rebuild the whole arena from RocksDB (the dirty path of Open).
void BM_Rebuild(benchmark::State& state) {
  Dataset* d = Get(state.range(0), state.range(1));
  for (auto _ : state) {
    d->store.reset();  // dirty: no Close()
    const auto t0 = std::chrono::steady_clock::now();
    auto s = Store::Open(d->options);
    const double secs = Seconds(t0);
    if (!s.ok() || (*s)->opened_as() != Store::OpenedAs::kRebuilt) {
      state.SkipWithError("rebuild failed");
      break;
    }
    d->store = std::move(*s);
    state.SetIterationTime(secs);
    state.counters["s_per_Mkeys"] = secs * 1e6 / static_cast<double>(d->keys);
    g_ns_per_op["rebuild_per_key keys:" + std::to_string(state.range(0)) +
                "/value:" + std::to_string(state.range(1))] =
        secs * 1e9 / static_cast<double>(d->keys);
  }
}

// Clean restart: re-attach without reading data (what an upgrade relies on).
void BM_Reattach(benchmark::State& state) {
  Dataset* d = Get(state.range(0), state.range(1));
  for (auto _ : state) {
    if (!d->store->Close().ok()) state.SkipWithError("close");
    d->store.reset();
    const auto t0 = std::chrono::steady_clock::now();
    auto s = Store::Open(d->options);
    const double secs = Seconds(t0);
    if (!s.ok() || (*s)->opened_as() != Store::OpenedAs::kReattached) {
      state.SkipWithError("re-attach failed");
      break;
    }
    d->store = std::move(*s);
    state.SetIterationTime(secs);
  }
}

// Registered dataset by dataset (one in memory at a time, loaded once).
void RegisterAll() {
  for (int64_t keys : {100000, 1000000}) {
    for (int64_t v : {64, 1024}) {
      auto named = [&](const char* name, void (*fn)(benchmark::State&)) {
        return benchmark::RegisterBenchmark(name, fn)->Args({keys, v})->ArgNames({"keys", "value"});
      };
      named("BM_ArenaGetDecode", BM_ArenaGetDecode);
      named("BM_RocksDbGet", BM_RocksDbGet);
      named("BM_StorePut", BM_StorePut);
      named("BM_RocksDbPut", BM_RocksDbPut);
      named("BM_Rebuild", BM_Rebuild)
          ->Iterations(1)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
      named("BM_Reattach", BM_Reattach)
          ->Iterations(1)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

// Captures per-run times so the ratios can be printed after the table.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      std::string name = r.benchmark_name();
      cpu_[name] = r.GetAdjustedCPUTime();
      real_[name] = r.GetAdjustedRealTime();
    }
  }
  void Ratios() const {
    std::printf("\nRatios (same keys, same process; CPU time per op, wall time in brackets):\n");
    for (const char* tag : {"keys:100000/value:64", "keys:100000/value:1024",
                            "keys:1000000/value:64", "keys:1000000/value:1024"}) {
      auto ratio = [&](const char* a, const char* b, const std::map<std::string, double>& m) {
        auto x = m.find(std::string(a) + "/" + tag), y = m.find(std::string(b) + "/" + tag);
        return (x == m.end() || y == m.end() || y->second == 0) ? 0.0 : x->second / y->second;
      };
      std::printf(
          "  %-24s rocksdb_get/arena_get %5.1fx [%5.1fx]   store_put/rocksdb_put %4.2fx [%4.2fx]",
          tag, ratio("BM_RocksDbGet", "BM_ArenaGetDecode", cpu_),
          ratio("BM_RocksDbGet", "BM_ArenaGetDecode", real_),
          ratio("BM_StorePut", "BM_RocksDbPut", cpu_),
          ratio("BM_StorePut", "BM_RocksDbPut", real_));
      auto rb = g_ns_per_op.find(std::string("rebuild_per_key ") + tag);
      if (rb != g_ns_per_op.end())
        std::printf("   rebuild %.2f s per 1e6 keys", rb->second / 1000.0);
      std::printf("\n");
    }
  }

 private:
  std::map<std::string, double> cpu_, real_;
};

int main(int argc, char** argv) {
  RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  reporter.Ratios();
  cache.clear();  // before RocksDB's own statics go away
  return 0;
}
