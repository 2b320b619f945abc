// How long the data-plane thread busy-polls after its last activity before
// it arms the CQ and sleeps on the completion channel (--spin_us,
// --spin_max_us). Pure arithmetic on nanoseconds: no clock, no device, so the
// decision is unit-tested on its own (tests/server/spin_policy_test.cc).
//
// Why adapt: a client with one request outstanding sends its next request
// one round trip after our response. If that gap is longer than the fixed
// spin, the data thread is asleep when the request lands and every request
// pays a wake-up (completion event, poll() return, the thread scheduled).
// Spinning a little longer than the gap removes that, at the price of the
// CPU burnt while spinning, which is bounded by --spin_max_us per quiet
// spell. Clients slower than the bound (or none) keep today's behaviour.
#ifndef KVNODE_SERVER_SPIN_POLICY_H_
#define KVNODE_SERVER_SPIN_POLICY_H_

#include <cstdint>

namespace kvnode::server {

// No request observed yet (or never adaptive): the estimate is unknown.
inline constexpr uint64_t kNoGapEstimate = UINT64_MAX;

// The estimate of the gap before the next request, after one more observed
// gap `gap_ns` (idle time of the data thread from its last completion to the
// poll that found a request; after a sleep it includes the wake-up). An
// exponentially weighted mean with weight 1/4, of gaps clamped to
// 4 x max_ns: a single long pause (a client that stopped for a while) moves
// the estimate to >= max_ns, which turns adaptive spinning off for the next
// request, and a short gap or two after it turn it back on.
// `estimate_ns` == kNoGapEstimate (the first request): the gap, clamped to
// max_ns, so that a client's first request after an idle spell leaves
// adaptive spinning off and its second, if prompt, turns it on.
uint64_t UpdateGapEstimate(uint64_t estimate_ns, uint64_t gap_ns, uint64_t max_ns);

// The spin window: base_ns, unless adaptive spinning is on (max_ns > base_ns)
// and the gap estimate is below max_ns; then twice the estimate (headroom for
// a gap longer than the mean), within [base_ns, max_ns].
uint64_t SpinWindowNs(uint64_t base_ns, uint64_t max_ns, uint64_t estimate_ns);

// The two above with their state. Owned by the data thread; no locks.
class SpinPolicy {
 public:
  SpinPolicy(uint64_t base_ns, uint64_t max_ns) : base_ns_(base_ns), max_ns_(max_ns) {}

  bool adaptive() const { return max_ns_ > base_ns_; }
  // A poll found at least one request `gap_ns` after the last completion.
  void OnRequest(uint64_t gap_ns) {
    if (!adaptive()) return;
    estimate_ns_ = UpdateGapEstimate(estimate_ns_, gap_ns, max_ns_);
    window_ns_ = SpinWindowNs(base_ns_, max_ns_, estimate_ns_);
  }
  uint64_t window_ns() const { return window_ns_; }
  uint64_t estimate_ns() const { return estimate_ns_; }

 private:
  uint64_t base_ns_;
  uint64_t max_ns_;
  uint64_t estimate_ns_ = kNoGapEstimate;
  uint64_t window_ns_ = base_ns_;
};

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_SPIN_POLICY_H_
