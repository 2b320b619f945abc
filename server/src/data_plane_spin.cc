// The data thread's spin decision (kvnode/server/spin_policy.h).
#include <algorithm>

#include "kvnode/server/spin_policy.h"

namespace kvnode::server {

uint64_t UpdateGapEstimate(uint64_t estimate_ns, uint64_t gap_ns, uint64_t max_ns) {
  // max_ns <= 1 s (ServerOptions::Validate), so 4 x max_ns and the sums
  // below cannot overflow.
  if (estimate_ns == kNoGapEstimate) return std::min(gap_ns, max_ns);
  const uint64_t gap = std::min(gap_ns, 4 * max_ns);
  return estimate_ns - estimate_ns / 4 + gap / 4;
}

uint64_t SpinWindowNs(uint64_t base_ns, uint64_t max_ns, uint64_t estimate_ns) {
  if (max_ns <= base_ns || estimate_ns >= max_ns) return base_ns;
  return std::clamp(2 * estimate_ns, base_ns, max_ns);
}

}  // namespace kvnode::server
