// RefGate: the reference count and in-flight count behind Mr, usable on its
// own (and tested without a device, under TSan).
//
// Invariants:
//  1. Pins (references and in-flight work requests) can be taken only while
//     the gate is open; TryPin after Close() fails.
//  2. Once Close() was called and both counts reached zero, they stay zero:
//     WaitIdle() returning true means no pin exists now or ever again, so
//     the guarded resource may be freed.
//
// Thread safety: every member may be called from any thread.
#ifndef KVNODE_RDMA_REF_GATE_H_
#define KVNODE_RDMA_REF_GATE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "absl/time/time.h"

namespace kvnode::rdma {

class RefGate {
 public:
  // State word: bit 63 = closed, bits 32..62 = work requests, 0..31 = refs.
  static constexpr uint64_t kClosedBit = uint64_t{1} << 63;
  static constexpr uint64_t kRefUnit = 1;
  static constexpr uint64_t kWrUnit = uint64_t{1} << 32;

  // Takes one pin of `unit` (kRefUnit or kWrUnit); false once closed.
  bool TryPin(uint64_t unit) {
    uint64_t s = state_.load(std::memory_order_acquire);
    do {
      if (s & kClosedBit) return false;
    } while (!state_.compare_exchange_weak(s, s + unit, std::memory_order_acq_rel,
                                           std::memory_order_acquire));
    return true;
  }

  // Drops one pin taken by TryPin.
  void Unpin(uint64_t unit) {
    const uint64_t now = state_.fetch_sub(unit, std::memory_order_acq_rel) - unit;
    if (now == kClosedBit) {
      // Idle and closed: wake WaitIdle. Taking the lock orders this after
      // a waiter's predicate check, so the wakeup cannot be lost.
      { std::lock_guard<std::mutex> l(mu_); }
      cv_.notify_all();
    }
  }

  void Close() { state_.fetch_or(kClosedBit, std::memory_order_acq_rel); }

  // After Close(): waits up to `timeout` for both counts to reach zero.
  bool WaitIdle(absl::Duration timeout) {
    if (idle()) return true;
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, absl::ToChronoNanoseconds(timeout), [this] { return idle(); });
  }

  bool idle() const { return state_.load(std::memory_order_acquire) == kClosedBit; }
  bool closed() const { return (state_.load(std::memory_order_acquire) & kClosedBit) != 0; }
  uint32_t references() const {
    return static_cast<uint32_t>(state_.load(std::memory_order_acquire) & 0xffffffffu);
  }
  uint32_t work_requests() const {
    return static_cast<uint32_t>((state_.load(std::memory_order_acquire) & ~kClosedBit) >> 32);
  }

 private:
  std::atomic<uint64_t> state_{0};
  // std primitives rather than absl::Mutex: TSan sees through libstdc++'s
  // pthread calls but not through Debian's uninstrumented libabsl.
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_REF_GATE_H_
