// rdma_bench: costs of the MR lifecycle on the device at hand (a program,
// not a test). Prints one table per question:
//   1. registration / deregistration cost per GiB: 4 KiB vs transparent huge
//      pages vs hugetlb, prefaulted vs not, against raw ibv_reg_mr as baseline;
//      and shared memory filled through another mapping (a new process's
//      view of the arena), with and without MrOptions::populate_first
//   2. registration cache: hit and miss cost
//   3. batch deregistration: serial vs parallel
//   4. drain time vs outstanding READs
//   5. READ latency at depth 1 by target: a small MR (perftest's case), a
//      large MR read at random places, a type-2 window over it (a GET's)
//   6. a client QP's life cycle, step by step: what a Move costs the
//      client's polling thread in synchronous verbs calls
// Run it in the VM (README, "Benchmarks"); absolute numbers on rxe under TCG
// mean little, ratios in the same run do.

#include <gflags/gflags.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvnode/rdma/accounting.h"
#include "kvnode/rdma/batch_dereg.h"
#include "kvnode/rdma/capabilities.h"
#include "kvnode/rdma/cq.h"
#include "kvnode/rdma/device.h"
#include "kvnode/rdma/memory.h"
#include "kvnode/rdma/mr.h"
#include "kvnode/rdma/mw.h"
#include "kvnode/rdma/pd.h"
#include "kvnode/rdma/qp.h"
#include "kvnode/rdma/reg_cache.h"

DEFINE_string(device, "", "verbs device (default: first ACTIVE)");
DEFINE_int32(port, 1, "port");
DEFINE_int32(size_mib, 256, "region size for the registration table");
DEFINE_int32(reps, 3, "repetitions per registration/batch measurement (median reported)");
DEFINE_int32(batch_mrs, 512, "MRs in the batch deregistration table");
DEFINE_int32(batch_mr_kib, 16, "size of each MR in the batch table");
DEFINE_int32(cache_ops, 100000, "cache lookups for the hit cost");
DEFINE_int32(drain_reps, 5, "repetitions per drain measurement");
DEFINE_int32(read_iters, 10000, "READs per cell of the READ latency table");
DEFINE_string(tables, "1234", "which tables to run (digits 1-6)");

namespace kvnode::rdma {
namespace {

using Ms = std::chrono::duration<double, std::milli>;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

template <typename T>
T Must(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "rdma_bench: %s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*v);
}
void Must(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "rdma_bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Table 1's last rows: a memfd of 4 KiB pages filled through one mapping,
// then per repetition mapped afresh and registered, as a new process
// registers the arena the old one filled. The time counted is the
// registration's (with populate_first, the populate's too).
void SharedRegistrationRows(const std::shared_ptr<Pd>& pd, size_t size, double gib) {
  const int fd = memfd_create("rdma-bench-shared", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    std::printf("%-28s %-10s %12s   (skipped: memfd)\n", "shared, filled elsewhere", "-", "-");
    if (fd >= 0) close(fd);
    return;
  }
  auto map = [&] {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) Must(absl::InternalError("mmap of the memfd failed"), "mmap");
    return static_cast<char*>(p);
  };
  char* filler = map();
  for (size_t off = 0; off < size; off += PageSize()) filler[off] = 1;
  munmap(filler, size);
  for (bool populate : {false, true}) {
    std::vector<double> reg, dereg;
    for (int r = 0; r < FLAGS_reps; ++r) {
      char* view = map();
      MrOptions o;
      o.access = IBV_ACCESS_REMOTE_READ;
      o.populate_first = populate;
      auto t0 = std::chrono::steady_clock::now();
      std::shared_ptr<Mr> mr = Must(Mr::Register(pd, view, size, o), "register shared");
      auto t1 = std::chrono::steady_clock::now();
      Must(SafeDeregister(*mr, std::chrono::steady_clock::now()), "dereg");
      auto t2 = std::chrono::steady_clock::now();
      munmap(view, size);
      reg.push_back(Ms(t1 - t0).count());
      dereg.push_back(Ms(t2 - t1).count());
    }
    std::printf("%-28s %-10s %12.1f %12.1f\n", "shared, filled elsewhere",
                populate ? "populate" : "no", Median(reg) / gib, Median(dereg) / gib);
  }
  close(fd);
}

void RegistrationTable(const std::shared_ptr<Pd>& pd) {
  const size_t size = static_cast<size_t>(FLAGS_size_mib) << 20;
  const double gib = static_cast<double>(size) / (1u << 30);
  std::printf("\n== 1. registration cost (%d MiB regions, median of %d, scaled to ms/GiB)\n",
              FLAGS_size_mib, FLAGS_reps);
  std::printf("%-28s %-10s %12s %12s\n", "memory", "prefault", "reg ms/GiB", "dereg ms/GiB");
  struct Case {
    const char* name;
    PageKind pages;
    bool raw;
  };
  const Case cases[] = {{"4 KiB (raw ibv_reg_mr)", PageKind::k4K, true},
                        {"4 KiB", PageKind::k4K, false},
                        {"transparent huge pages", PageKind::kTransparentHuge, false},
                        {"hugetlb (MAP_HUGETLB)", PageKind::kHugetlb, false},
                        {"hugetlb memfd (shared)", PageKind::kHugetlbMemfd, false}};
  for (const Case& c : cases) {
    for (bool prefault : {false, true}) {
      std::vector<double> reg, dereg;
      std::string skip;
      for (int r = 0; r < FLAGS_reps && skip.empty(); ++r) {
        absl::StatusOr<HostMemory> mem =
            HostMemory::Allocate(size, MemoryOptions{c.pages, prefault});
        if (!mem.ok()) {
          skip = std::string(mem.status().message());
          break;
        }
        auto t0 = std::chrono::steady_clock::now();
        if (c.raw) {
          ibv_mr* mr = ibv_reg_mr(pd->pd(), mem->data(), size, IBV_ACCESS_LOCAL_WRITE);
          if (mr == nullptr) {
            skip = "ibv_reg_mr failed";
            break;
          }
          auto t1 = std::chrono::steady_clock::now();
          ibv_dereg_mr(mr);
          auto t2 = std::chrono::steady_clock::now();
          reg.push_back(Ms(t1 - t0).count());
          dereg.push_back(Ms(t2 - t1).count());
        } else {
          absl::StatusOr<std::shared_ptr<Mr>> mr = Mr::Register(pd, mem->data(), size);
          if (!mr.ok()) {
            skip = std::string(mr.status().message());
            break;
          }
          auto t1 = std::chrono::steady_clock::now();
          Must(SafeDeregister(**mr, std::chrono::steady_clock::now()), "dereg");
          auto t2 = std::chrono::steady_clock::now();
          reg.push_back(Ms(t1 - t0).count());
          dereg.push_back(Ms(t2 - t1).count());
        }
      }
      if (!skip.empty()) {
        std::printf("%-28s %-10s %12s   (skipped: %.60s)\n", c.name, prefault ? "yes" : "no", "-",
                    skip.c_str());
        continue;
      }
      std::printf("%-28s %-10s %12.1f %12.1f\n", c.name, prefault ? "yes" : "no", Median(reg) / gib,
                  Median(dereg) / gib);
    }
  }
  SharedRegistrationRows(pd, size, gib);
}

void CacheTable(const std::shared_ptr<Pd>& pd) {
  std::printf("\n== 2. registration cache (4 KiB entries)\n");
  auto cache = Must(RegistrationCache::Create(pd, RegCacheOptions{}), "cache");
  HostMemory mem = Must(HostMemory::Allocate(64u << 20, MemoryOptions{PageKind::k4K, true}), "mem");
  std::vector<double> miss_us, hit_ns;
  for (int i = 0; i < 1000; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    MrRef r =
        Must(cache->Get(mem.bytes() + size_t(i) * 4096, 4096, IBV_ACCESS_LOCAL_WRITE), "miss");
    miss_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  for (int i = 0; i < FLAGS_cache_ops; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    MrRef r = Must(cache->Get(mem.bytes() + size_t(i % 1000) * 4096, 4096, IBV_ACCESS_LOCAL_WRITE),
                   "hit");
    hit_ns.push_back(
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("%-28s %12s %12s %12s\n", "", "p50", "p99", "p99.9");
  std::printf("%-28s %10.0fns %10.0fns %10.0fns\n", "hit (Get + release)", Pct(hit_ns, .5),
              Pct(hit_ns, .99), Pct(hit_ns, .999));
  std::printf("%-28s %10.1fus %10.1fus %10.1fus\n", "miss (ibv_reg_mr 4 KiB)", Pct(miss_us, .5),
              Pct(miss_us, .99), Pct(miss_us, .999));
  Must(cache->Clear(std::chrono::steady_clock::now()), "clear");
}

void BatchTable(const std::shared_ptr<Pd>& pd) {
  const size_t each = static_cast<size_t>(FLAGS_batch_mr_kib) << 10;
  std::printf("\n== 3. batch deregistration (%d MRs of %d KiB, median of %d)\n", FLAGS_batch_mrs,
              FLAGS_batch_mr_kib, FLAGS_reps);
  HostMemory mem =
      Must(HostMemory::Allocate(each * FLAGS_batch_mrs, MemoryOptions{PageKind::k4K, true}), "mem");
  std::printf("%-28s %12s %12s %10s\n", "threads", "total ms", "us per MR", "vs serial");
  double serial = 0;
  for (int threads : {1, 2, 4}) {
    std::vector<double> t;
    for (int r = 0; r < FLAGS_reps; ++r) {
      std::vector<std::shared_ptr<Mr>> mrs;
      for (int i = 0; i < FLAGS_batch_mrs; ++i) {
        mrs.push_back(Must(Mr::Register(pd, mem.bytes() + i * each, each), "reg"));
      }
      auto t0 = std::chrono::steady_clock::now();
      BatchDeregResult res = DeregisterBatch(mrs, std::chrono::steady_clock::now(),
                                             BatchDeregOptions{.threads = threads});
      t.push_back(Ms(std::chrono::steady_clock::now() - t0).count());
      Must(res.overall, "batch");
    }
    const double m = Median(t);
    if (threads == 1) serial = m;
    std::printf("%-28s %12.2f %12.2f %9.2fx\n", absl::StrCat(threads, " (DeregisterBatch)").c_str(),
                m, m * 1000 / FLAGS_batch_mrs, serial / m);
  }
  // Baseline: raw ibv_dereg_mr, serial and split over threads, no kvrdma.
  double raw_serial = 0;
  for (int threads : {1, 2, 4}) {
    std::vector<double> t;
    for (int r = 0; r < FLAGS_reps; ++r) {
      std::vector<ibv_mr*> mrs;
      for (int i = 0; i < FLAGS_batch_mrs; ++i) {
        mrs.push_back(ibv_reg_mr(pd->pd(), mem.bytes() + i * each, each, IBV_ACCESS_LOCAL_WRITE));
        if (mrs.back() == nullptr) Must(absl::InternalError("ibv_reg_mr"), "raw reg");
      }
      auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      const size_t per = (mrs.size() + threads - 1) / threads;
      for (int th = 0; th < threads; ++th) {
        pool.emplace_back([&, th] {
          for (size_t i = th * per; i < std::min(mrs.size(), (th + 1) * per); ++i)
            ibv_dereg_mr(mrs[i]);
        });
      }
      for (auto& p : pool) p.join();
      t.push_back(Ms(std::chrono::steady_clock::now() - t0).count());
    }
    const double m = Median(t);
    if (threads == 1) raw_serial = m;
    std::printf("%-28s %12.2f %12.2f %9.2fx\n",
                absl::StrCat(threads, " (raw ibv_dereg_mr)").c_str(), m, m * 1000 / FLAGS_batch_mrs,
                raw_serial / m);
  }
}

void DrainTable(const std::shared_ptr<Device>& dev, const std::shared_ptr<Pd>& pd) {
  std::printf("\n== 4. drain time vs outstanding 64 KiB READs (loopback, median of %d)\n",
              FLAGS_drain_reps);
  constexpr size_t kLen = 64 * 1024;
  HostMemory remote = Must(HostMemory::Allocate(kLen, MemoryOptions{PageKind::k4K, true}), "mem");
  HostMemory local = Must(HostMemory::Allocate(kLen, MemoryOptions{PageKind::k4K, true}), "mem");
  MrOptions ro;
  ro.access = IBV_ACCESS_REMOTE_READ;
  auto rmr = Must(Mr::Register(pd, remote.data(), kLen, ro), "reg");
  auto lmr = Must(Mr::Register(pd, local.data(), kLen), "reg");
  auto cqa = Must(Cq::Create(dev, CqOptions{}), "cq");
  auto cqb = Must(Cq::Create(dev, CqOptions{}), "cq");
  std::printf("%-28s %12s %12s %12s\n", "outstanding", "p50 ms", "max ms", "completions");
  for (int k : {0, 1, 8, 32, 64}) {
    std::vector<double> t;
    size_t seen = 0;
    for (int r = 0; r < FLAGS_drain_reps; ++r) {
      QpOptions qo;
      qo.max_send_wr = 128;
      auto a = Must(Qp::Create(pd, cqa, cqa, qo), "qp");
      auto b = Must(Qp::Create(pd, cqb, cqb, qo), "qp");
      Must(a->Connect(b->LocalInfo()), "connect");
      Must(b->Connect(a->LocalInfo()), "connect");
      for (int i = 0; i < k; ++i) {
        Must(a->PostRead(i, LocalBuf{lmr.get(), 0, kLen}, rmr->iova(), rmr->rkey()), "read");
      }
      std::vector<Completion> done;
      auto t0 = std::chrono::steady_clock::now();
      Must(a->Drain(std::chrono::steady_clock::now() + std::chrono::seconds(30), &done), "drain");
      t.push_back(Ms(std::chrono::steady_clock::now() - t0).count());
      seen = done.size();
      Must(b->Drain(std::chrono::steady_clock::now() + std::chrono::seconds(30)), "drain b");
    }
    std::printf("%-28d %12.3f %12.3f %12zu\n", k, Median(t), *std::max_element(t.begin(), t.end()),
                seen);
  }
}

// Depth-1 READ round trips on a loopback QP pair, timed from before the post
// to the polled completion, as perftest's ib_read_lat times its own. The
// large region is read at random 256 B-aligned places, as GETs read buckets
// of an arena; the window is what a node gives each client (a type-2 MW
// over the arena's MR).
void ReadLatencyTable(const std::shared_ptr<Device>& dev, const std::shared_ptr<Pd>& pd) {
  const size_t big_len = size_t{static_cast<uint32_t>(FLAGS_size_mib)} << 20;
  std::printf("\n== 5. READ latency at depth 1 (loopback, %d READs per cell; µs)\n",
              FLAGS_read_iters);
  HostMemory small = Must(HostMemory::Allocate(4096, MemoryOptions{PageKind::k4K, true}), "mem");
  HostMemory big = Must(HostMemory::Allocate(big_len, MemoryOptions{PageKind::k4K, true}), "mem");
  HostMemory local = Must(HostMemory::Allocate(4096, MemoryOptions{PageKind::k4K, true}), "mem");
  MrOptions ro;
  ro.access = IBV_ACCESS_REMOTE_READ;
  auto small_mr = Must(Mr::Register(pd, small.data(), small.size(), ro), "reg");
  ro.access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND;
  std::shared_ptr<Mr> big_mr = Must(Mr::Register(pd, big.data(), big_len, ro), "reg");
  auto local_mr = Must(Mr::Register(pd, local.data(), local.size()), "reg");
  auto cqa = Must(Cq::Create(dev, CqOptions{}), "cq");
  auto cqb = Must(Cq::Create(dev, CqOptions{}), "cq");
  auto a = Must(Qp::Create(pd, cqa, cqa), "qp");
  auto b = Must(Qp::Create(pd, cqb, cqb), "qp");
  Must(a->Connect(b->LocalInfo()), "connect");
  Must(b->Connect(a->LocalInfo()), "connect");
  std::shared_ptr<Mw> mw;
  uint32_t mw_rkey = 0;
  if (dev->caps().mw_type2) {
    mw = Must(Mw::Allocate(pd, MwType::kType2), "mw");
    mw_rkey = Must(b->PostBindMw(1, mw, big_mr, 0, big_len, IBV_ACCESS_REMOTE_READ), "bind");
    Must(b->WaitFor(1, WrKind::kBindMw, std::chrono::steady_clock::now() + std::chrono::seconds(10))
             .status(),
         "bind completion");
  }
  struct Target {
    const char* name;
    uint64_t base;
    uint64_t places;  // 256 B-aligned places read at random
    uint32_t rkey;
  };
  const Target targets[] = {{"4 KiB MR", small_mr->iova(), 1, small_mr->rkey()},
                            {"large MR", big_mr->iova(), big_len / 256, big_mr->rkey()},
                            {"type-2 MW over it", big_mr->iova(), big_len / 256, mw_rkey}};
  std::printf("%-20s %8s %10s %10s %10s\n", "target", "bytes", "p10", "p50", "p90");
  uint64_t seed = 1;
  for (uint32_t len : {16u, 256u}) {
    for (const Target& t : targets) {
      if (t.rkey == 0) continue;  // no type-2 windows on this device
      std::vector<double> us;
      us.reserve(static_cast<size_t>(FLAGS_read_iters));
      for (int i = 0; i < FLAGS_read_iters; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const uint64_t addr = t.base + (seed >> 33) % t.places * 256;
        const auto t0 = std::chrono::steady_clock::now();
        Must(a->PostRead(i, LocalBuf{local_mr.get(), 0, len}, addr, t.rkey), "read");
        Completion c;
        for (;;) {
          if (Must(cqa->Poll(std::span<Completion>(&c, 1)), "poll") == 1) break;
        }
        us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
        Must(c.ToStatus(), "read completion");
      }
      std::printf("%-20s %8u %10.1f %10.1f %10.1f\n", t.name, len, Pct(us, 0.1), Pct(us, 0.5),
                  Pct(us, 0.9));
    }
  }
  if (mw != nullptr) Must(mw->Dealloc(), "mw dealloc");
  Must(a->Drain(std::chrono::steady_clock::now() + std::chrono::seconds(10)), "drain a");
  Must(b->Drain(std::chrono::steady_clock::now() + std::chrono::seconds(10)), "drain b");
}

// What a client's polling thread spends in verbs calls when it moves to a
// new process: a QP as libkvclient makes one (send queue twice the slots,
// a receive per RPC credit), taken to RTS against a peer, then moved to ERR,
// drained and destroyed. Each step is one synchronous call into the driver.
void QpLifecycleTable(const std::shared_ptr<Device>& dev, const std::shared_ptr<Pd>& pd) {
  constexpr int kReps = 20;
  constexpr uint32_t kSlots = 4;  // kvload's default depth
  std::printf("\n== 6. QP life cycle of a client with %u slots (median of %d)\n", kSlots, kReps);
  HostMemory recv = Must(HostMemory::Allocate(4096, MemoryOptions{PageKind::k4K, true}), "mem");
  auto recv_mr = Must(Mr::Register(pd, recv.data(), recv.size()), "reg");
  auto cq = Must(Cq::Create(dev, CqOptions{}), "cq");
  auto peer_cq = Must(Cq::Create(dev, CqOptions{}), "cq");
  auto peer = Must(Qp::Create(pd, peer_cq, peer_cq), "qp");
  const char* names[] = {"create", "to INIT",        "post receives", "to RTR",
                         "to RTS", "to ERR + drain", "destroy"};
  std::vector<double> t[std::size(names)];
  for (int r = 0; r < kReps; ++r) {
    QpOptions qo;
    qo.max_send_wr = 2 * kSlots;
    qo.max_recv_wr = kSlots;
    qo.remote_access = 0;
    int step = 0;
    auto lap = [&, t0 = std::chrono::steady_clock::now()]() mutable {
      const auto now = std::chrono::steady_clock::now();
      t[step++].push_back(Ms(now - t0).count());
      t0 = now;
    };
    std::unique_ptr<Qp> qp = Must(Qp::Create(pd, cq, cq, qo), "create");
    lap();
    Must(qp->ToInit(), "init");
    lap();
    for (uint32_t i = 0; i < kSlots; ++i) {
      Must(qp->PostRecv(i, LocalBuf{recv_mr.get(), 0, 64}), "recv");
    }
    lap();
    Must(qp->ToRtr(peer->LocalInfo()), "rtr");
    lap();
    Must(qp->ToRts(), "rts");
    lap();
    Must(qp->Drain(std::chrono::steady_clock::now() + std::chrono::seconds(10)), "drain");
    lap();
    qp.reset();
    lap();
  }
  std::printf("%-20s %10s %10s\n", "step", "p50 ms", "max ms");
  for (size_t i = 0; i < std::size(names); ++i) {
    std::printf("%-20s %10.3f %10.3f\n", names[i], Median(t[i]),
                *std::max_element(t[i].begin(), t[i].end()));
  }
}

}  // namespace
}  // namespace kvnode::rdma

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  using namespace kvnode::rdma;
  {
    DeviceOptions dopt;
    dopt.name = FLAGS_device;
    dopt.port = FLAGS_port;
    auto dev = Must(Device::Open(dopt), "open device");
    auto pd = Must(Pd::Create(dev), "pd");
    auto caps = Must(DetectImportCaps(*dev), "import caps");
    std::printf(
        "device %s port %d gid_index %d gid %s; mw type1 %d type2 %d; odp %d; "
        "import device/pd/mr %d/%d/%d (%s)\n",
        dev->name().c_str(), dev->port(), dev->gid_index(), GidToString(dev->gid()).c_str(),
        dev->caps().mw_type1, dev->caps().mw_type2, caps.odp, caps.import_device, caps.import_pd,
        caps.import_mr, caps.detail.c_str());
    auto want = [](char t) { return FLAGS_tables.find(t) != std::string::npos; };
    if (want('1')) RegistrationTable(pd);
    if (want('2')) CacheTable(pd);
    if (want('3')) BatchTable(pd);
    if (want('4')) DrainTable(dev, pd);
    if (want('5')) ReadLatencyTable(dev, pd);
    if (want('6')) QpLifecycleTable(dev, pd);
  }
  absl::Status leaks = Accounting::CheckNoLeaks();
  std::printf("\naccounting at exit: %s\n",
              leaks.ok() ? "no live objects" : leaks.ToString().c_str());
  return leaks.ok() ? 0 : 1;
}
