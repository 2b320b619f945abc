#include "kvnode/load/histogram.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace kvnode::load {

size_t LatencyHistogram::BucketOf(uint64_t v) {
  if (v < kSubBuckets) return static_cast<size_t>(v);
  const int shift = std::bit_width(v) - kSubBucketBits;  // >= 1
  return kSubBuckets + static_cast<size_t>(shift - 1) * kHalf + ((v >> shift) - kHalf);
}

uint64_t LatencyHistogram::BucketLow(size_t b) {
  if (b < kSubBuckets) return b;
  const size_t shift = (b - kSubBuckets) / kHalf + 1;
  const uint64_t sub = (b - kSubBuckets) % kHalf + kHalf;
  return sub << shift;
}

uint64_t LatencyHistogram::BucketHigh(size_t b) {
  if (b < kSubBuckets) return b;
  const size_t shift = (b - kSubBuckets) / kHalf + 1;
  return BucketLow(b) + ((uint64_t{1} << shift) - 1);
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  for (size_t i = 0; i < kBuckets; ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ += other.sum_;
  max_ = std::max(max_, other.max_);
  min_ = std::min(min_, other.min_);
}

void LatencyHistogram::Subtract(const LatencyHistogram& earlier) {
  for (size_t i = 0; i < kBuckets; ++i) {
    counts_[i] -= std::min(counts_[i], earlier.counts_[i]);
  }
  count_ -= std::min(count_, earlier.count_);
  sum_ -= std::min(sum_, earlier.sum_);
}

void LatencyHistogram::Reset() { *this = LatencyHistogram(); }

uint64_t LatencyHistogram::Percentile(double p) const {
  if (count_ == 0) return 0;
  p = std::clamp(p, 0.0, 100.0);
  // The relative nudge keeps 99.9% of 1000 at rank 999, not 1000, despite
  // 0.999 * 1000 being 999.0000000000001 in binary floating point.
  const double x = p / 100.0 * static_cast<double>(count_);
  uint64_t rank = static_cast<uint64_t>(std::ceil(x - x * 1e-12));
  rank = std::clamp<uint64_t>(rank, 1, count_);
  uint64_t seen = 0;
  for (size_t b = 0; b < kBuckets; ++b) {
    seen += counts_[b];
    if (seen >= rank) return std::min(BucketHigh(b), max_);
  }
  return max_;
}

void Timeline::Record(uint64_t completion_ns, uint64_t latency_ns) {
  const uint64_t i = completion_ns / slot_ns_;
  // A timestamp absurdly far out (clock jump) is clamped rather than
  // allocating gigabytes: ~11.6 days of 10 ms slots.
  const uint64_t idx = std::min<uint64_t>(i, uint64_t{1} << 27);
  if (idx >= slots_.size()) slots_.resize(idx + 1);
  Slot& s = slots_[idx];
  ++s.ops;
  s.max_latency_ns = std::max(s.max_latency_ns, latency_ns);
  s.first_ns = std::min(s.first_ns, completion_ns);
  s.last_ns = std::max(s.last_ns, completion_ns);
}

void Timeline::Merge(const Timeline& other) {
  if (other.slots_.size() > slots_.size()) slots_.resize(other.slots_.size());
  for (size_t i = 0; i < other.slots_.size(); ++i) {
    const Slot& o = other.slots_[i];
    if (o.ops == 0) continue;
    Slot& s = slots_[i];
    s.ops += o.ops;
    s.max_latency_ns = std::max(s.max_latency_ns, o.max_latency_ns);
    s.first_ns = std::min(s.first_ns, o.first_ns);
    s.last_ns = std::max(s.last_ns, o.last_ns);
  }
}

Gap LongestGap(const Timeline& t, uint64_t from_ns, uint64_t to_ns) {
  Gap best;
  bool have_prev = false;
  uint64_t prev_last = 0;
  for (const Timeline::Slot& s : t.slots()) {
    if (s.ops == 0 || s.last_ns < from_ns || s.first_ns > to_ns) continue;
    if (have_prev && s.first_ns > prev_last && s.first_ns - prev_last > best.gap_ns) {
      best = Gap{s.first_ns - prev_last, prev_last, s.first_ns};
    }
    prev_last = s.last_ns;
    have_prev = true;
  }
  return best;
}

Gap LongestGap(std::vector<uint64_t>& completion_ns) {
  std::sort(completion_ns.begin(), completion_ns.end());
  Gap best;
  for (size_t i = 1; i < completion_ns.size(); ++i) {
    const uint64_t g = completion_ns[i] - completion_ns[i - 1];
    if (g > best.gap_ns) best = Gap{g, completion_ns[i - 1], completion_ns[i]};
  }
  return best;
}

}  // namespace kvnode::load
