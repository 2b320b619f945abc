// Latency recording for kvload: a log-linear histogram (HdrHistogram's
// bucketing with 7 significant bits: values below 128 ns are exact, above
// that each power-of-two range is cut into 64 equal buckets, so a reported
// percentile is within 1/64 (1.6%) above the true value), and a timeline of
// completed operations per 10 ms slot.
//
// Each thread records into its own objects (no locks, no atomics); merge them
// at the end or for a progress snapshot. Values are nanoseconds.
#ifndef KVNODE_CLIENT_LOAD_HISTOGRAM_H_
#define KVNODE_CLIENT_LOAD_HISTOGRAM_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace kvnode::load {

class LatencyHistogram {
 public:
  static constexpr int kSubBucketBits = 7;
  static constexpr uint64_t kSubBuckets = 1 << kSubBucketBits;  // 128
  static constexpr uint64_t kHalf = kSubBuckets / 2;            // 64
  static constexpr size_t kBuckets = kSubBuckets + (64 - kSubBucketBits) * kHalf;

  LatencyHistogram() : counts_(kBuckets, 0) {}

  void Record(uint64_t ns) {
    ++counts_[BucketOf(ns)];
    ++count_;
    sum_ += ns;
    if (ns > max_) max_ = ns;
    if (ns < min_) min_ = ns;
  }

  void Merge(const LatencyHistogram& other);
  // Removes `earlier`, a previous snapshot of the same stream, leaving the
  // values recorded since (for a per-second progress line). max() and min()
  // then describe the whole stream, not the interval.
  void Subtract(const LatencyHistogram& earlier);
  void Reset();

  uint64_t count() const { return count_; }
  uint64_t max() const { return max_; }
  uint64_t min() const { return count_ == 0 ? 0 : min_; }
  double mean() const { return count_ == 0 ? 0 : static_cast<double>(sum_) / count_; }

  // The value at percentile p in [0, 100]: the highest value equivalent to
  // the bucket holding the ceil(p/100 * count)-th smallest sample, capped by
  // max(). 0 when empty. Percentile(100) == max().
  uint64_t Percentile(double p) const;

  // Bucket arithmetic (exposed for tests).
  static size_t BucketOf(uint64_t v);
  static uint64_t BucketLow(size_t b);
  static uint64_t BucketHigh(size_t b);  // inclusive

 private:
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  uint64_t sum_ = 0;
  uint64_t max_ = 0;
  uint64_t min_ = std::numeric_limits<uint64_t>::max();
};

// Completed operations per slot of wall time (default 10 ms) since the run's
// start, with the largest latency completed in each slot and the first and
// last completion time in it (so gaps between slots are measured exactly).
class Timeline {
 public:
  static constexpr uint64_t kDefaultSlotNs = 10'000'000;

  struct Slot {
    uint64_t ops = 0;
    uint64_t max_latency_ns = 0;
    uint64_t first_ns = std::numeric_limits<uint64_t>::max();  // since start
    uint64_t last_ns = 0;
  };

  explicit Timeline(uint64_t slot_ns = kDefaultSlotNs) : slot_ns_(slot_ns == 0 ? 1 : slot_ns) {}

  // An operation completed `completion_ns` after the start, taking
  // `latency_ns`.
  void Record(uint64_t completion_ns, uint64_t latency_ns);
  // Slot widths must match (they do unless someone chose otherwise).
  void Merge(const Timeline& other);

  uint64_t slot_ns() const { return slot_ns_; }
  const std::vector<Slot>& slots() const { return slots_; }

 private:
  uint64_t slot_ns_;
  std::vector<Slot> slots_;
};

// The longest stretch without a completed operation: the blackout.
struct Gap {
  uint64_t gap_ns = 0;
  uint64_t start_ns = 0;  // last completion before the gap (since start)
  uint64_t end_ns = 0;    // first completion after it
};

// Longest gap between consecutive completions in the slots that hold
// completions within [from_ns, to_ns] (default: the whole run; the window's
// resolution is one slot). Exact whenever the longest gap spans a slot
// boundary, which every gap longer than one slot does; a gap inside a single
// slot is not visible (the answer is then below one slot width).
Gap LongestGap(const Timeline& t, uint64_t from_ns = 0,
               uint64_t to_ns = std::numeric_limits<uint64_t>::max());

// The same from raw completion timestamps (any order; sorted in place).
Gap LongestGap(std::vector<uint64_t>& completion_ns);

}  // namespace kvnode::load

#endif  // KVNODE_CLIENT_LOAD_HISTOGRAM_H_
