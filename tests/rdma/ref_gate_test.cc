// Host-only: the reference/in-flight counting behind Mr (RefGate), raced by
// 8 threads against a closer that frees the guarded memory once WaitIdle
// says so. Built with -DKVNODE_SANITIZE=thread this is the TSan check; with
// address, a use after free would be caught.

#include "kvnode/rdma/ref_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace kvnode::rdma {
namespace {

TEST(RefGate, CountsAndRefusesAfterClose) {
  RefGate g;
  ASSERT_TRUE(g.TryPin(RefGate::kRefUnit));
  ASSERT_TRUE(g.TryPin(RefGate::kWrUnit));
  ASSERT_TRUE(g.TryPin(RefGate::kWrUnit));
  EXPECT_EQ(g.references(), 1u);
  EXPECT_EQ(g.work_requests(), 2u);
  g.Close();
  EXPECT_FALSE(g.TryPin(RefGate::kRefUnit));
  EXPECT_FALSE(g.WaitIdle(absl::ZeroDuration()));
  g.Unpin(RefGate::kRefUnit);
  g.Unpin(RefGate::kWrUnit);
  EXPECT_FALSE(g.idle());
  g.Unpin(RefGate::kWrUnit);
  EXPECT_TRUE(g.WaitIdle(absl::ZeroDuration()));
}

TEST(RefGate, EightThreadsRacingACloserNeverTouchFreedMemory) {
  for (int round = 0; round < 20; ++round) {
    RefGate gate;
    auto memory = std::make_unique<std::atomic<uint64_t>[]>(8);
    std::atomic<std::atomic<uint64_t>*> guarded{memory.get()};
    std::atomic<int> started{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        started++;
        const uint64_t unit = (t % 2) ? RefGate::kRefUnit : RefGate::kWrUnit;
        while (gate.TryPin(unit)) {
          // While pinned the memory must exist; TSan/ASan check the access.
          std::atomic<uint64_t>* m = guarded.load(std::memory_order_acquire);
          ASSERT_NE(m, nullptr);
          m[t].fetch_add(1, std::memory_order_relaxed);
          gate.Unpin(unit);
        }
      });
    }
    while (started.load() < 8) std::this_thread::yield();
    gate.Close();
    // Waiters may need several tries; the gate stays closed meanwhile.
    while (!gate.WaitIdle(absl::Milliseconds(10))) {
    }
    guarded.store(nullptr, std::memory_order_release);
    memory.reset();  // free: no pin may exist any more (invariant 2)
    for (auto& th : threads) th.join();
    EXPECT_FALSE(gate.TryPin(RefGate::kRefUnit));
  }
}

}  // namespace
}  // namespace kvnode::rdma
