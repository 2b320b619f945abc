// Histogram bucketing and percentiles on known data; timeline and gaps.
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvnode/load/histogram.h"

namespace kvnode::load {
namespace {

TEST(HistogramTest, BucketsCoverEveryValueWithBoundedError) {
  std::mt19937_64 rng(1);
  std::vector<uint64_t> values = {0,   1,    127,        128,   129,      255,
                                  256, 1000, 1ull << 40, ~0ull, ~0ull - 1};
  for (int i = 0; i < 100000; ++i) values.push_back(rng() >> (rng() % 64));
  for (uint64_t v : values) {
    const size_t b = LatencyHistogram::BucketOf(v);
    ASSERT_LT(b, LatencyHistogram::kBuckets) << v;
    ASSERT_LE(LatencyHistogram::BucketLow(b), v) << v;
    ASSERT_GE(LatencyHistogram::BucketHigh(b), v) << v;
    // Width / low <= 1/64.
    const uint64_t low = LatencyHistogram::BucketLow(b);
    ASSERT_LE((LatencyHistogram::BucketHigh(b) - low) / 64, low / 64 / 64 + 1) << v;
  }
  for (size_t b = 1; b < LatencyHistogram::kBuckets; ++b) {
    ASSERT_EQ(LatencyHistogram::BucketLow(b), LatencyHistogram::BucketHigh(b - 1) + 1) << b;
  }
}

TEST(HistogramTest, PercentilesOnKnownData) {
  LatencyHistogram h;
  for (uint64_t v = 1; v <= 100000; ++v) h.Record(v);
  EXPECT_EQ(h.count(), 100000u);
  EXPECT_EQ(h.max(), 100000u);
  EXPECT_EQ(h.min(), 1u);
  EXPECT_DOUBLE_EQ(h.mean(), 50000.5);
  auto within = [](uint64_t got, uint64_t want) {
    return got >= want && got <= want + want / 64 + 1;
  };
  EXPECT_TRUE(within(h.Percentile(50), 50000)) << h.Percentile(50);
  EXPECT_TRUE(within(h.Percentile(99), 99000)) << h.Percentile(99);
  EXPECT_TRUE(within(h.Percentile(99.9), 99900)) << h.Percentile(99.9);
  EXPECT_EQ(h.Percentile(100), 100000u);
  EXPECT_EQ(h.Percentile(0), 1u);

  LatencyHistogram small;  // exact below 128
  for (uint64_t v = 1; v <= 100; ++v) small.Record(v);
  EXPECT_EQ(small.Percentile(50), 50u);
  EXPECT_EQ(small.Percentile(99), 99u);

  LatencyHistogram tail;  // 999 fast ops and one slow one
  for (int i = 0; i < 999; ++i) tail.Record(20000);
  tail.Record(5000000);
  EXPECT_LE(tail.Percentile(99.9), 20000u + 20000u / 64);
  EXPECT_EQ(tail.Percentile(99.95), 5000000u);
  EXPECT_EQ(LatencyHistogram().Percentile(50), 0u);
}

TEST(HistogramTest, MergeAndSubtract) {
  LatencyHistogram a, b, all;
  for (uint64_t v = 1; v <= 5000; ++v) {
    (v % 2 ? a : b).Record(v * 37);
    all.Record(v * 37);
  }
  LatencyHistogram m = a;
  m.Merge(b);
  EXPECT_EQ(m.count(), all.count());
  for (double p : {1.0, 50.0, 90.0, 99.0, 99.9, 100.0})
    EXPECT_EQ(m.Percentile(p), all.Percentile(p));
  m.Subtract(a);
  EXPECT_EQ(m.count(), b.count());
  EXPECT_EQ(m.Percentile(50), b.Percentile(50));
}

TEST(TimelineTest, SlotsAndMerge) {
  Timeline a, b;
  a.Record(5'000'000, 100);   // slot 0
  a.Record(15'000'000, 300);  // slot 1
  b.Record(16'000'000, 200);  // slot 1
  b.Record(35'000'000, 50);   // slot 3
  a.Merge(b);
  ASSERT_EQ(a.slots().size(), 4u);
  EXPECT_EQ(a.slots()[0].ops, 1u);
  EXPECT_EQ(a.slots()[1].ops, 2u);
  EXPECT_EQ(a.slots()[1].max_latency_ns, 300u);
  EXPECT_EQ(a.slots()[1].first_ns, 15'000'000u);
  EXPECT_EQ(a.slots()[1].last_ns, 16'000'000u);
  EXPECT_EQ(a.slots()[2].ops, 0u);
  EXPECT_EQ(a.slots()[3].ops, 1u);
}

TEST(TimelineTest, BlackoutIsTheLongestGapBetweenCompletions) {
  // Two threads complete every 1 ms, except for a 250 ms hole in both.
  Timeline t1, t2;
  std::vector<uint64_t> stamps;
  for (uint64_t ms = 0; ms < 1000; ++ms) {
    if (ms > 400 && ms < 650) continue;  // last before: 400 ms, first after: 650 ms
    t1.Record(ms * 1'000'000, 10);
    t2.Record(ms * 1'000'000 + 500'000, 10);
    stamps.push_back(ms * 1'000'000);
    stamps.push_back(ms * 1'000'000 + 500'000);
  }
  t1.Merge(t2);
  const Gap g = LongestGap(t1);
  EXPECT_EQ(g.start_ns, 400'500'000u);
  EXPECT_EQ(g.end_ns, 650'000'000u);
  EXPECT_EQ(g.gap_ns, 249'500'000u);
  const Gap g2 = LongestGap(stamps);
  EXPECT_EQ(g2.gap_ns, g.gap_ns);
  EXPECT_EQ(g2.start_ns, g.start_ns);
  // Restricted to a window without the hole, the longest gap is one step.
  const Gap w = LongestGap(t1, 700'000'000, 900'000'000);
  EXPECT_LT(w.gap_ns, 10'000'000u);
  EXPECT_EQ(LongestGap(Timeline()).gap_ns, 0u);
}

}  // namespace
}  // namespace kvnode::load
