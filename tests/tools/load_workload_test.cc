// Workload mix, key choice (uniform, zipfian skew, scrambling) and key bytes.
#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kvnode/load/workload.h"

namespace kvnode::load {
namespace {

TEST(WorkloadTest, YcsbWorkloads) {
  EXPECT_EQ(*ReadRatioForWorkload("A"), 0.5);
  EXPECT_EQ(*ReadRatioForWorkload("b"), 0.95);
  EXPECT_EQ(*ReadRatioForWorkload("C"), 1.0);
  EXPECT_FALSE(ReadRatioForWorkload("D").ok());
  EXPECT_FALSE(ReadRatioForWorkload("").ok());
  EXPECT_EQ(*ParseKeyDistribution("zipfian"), KeyDistribution::kZipfian);
  EXPECT_EQ(*ParseKeyDistribution("Uniform"), KeyDistribution::kUniform);
  EXPECT_FALSE(ParseKeyDistribution("latest").ok());
}

TEST(WorkloadTest, ValidateNamesTheFlag) {
  WorkloadOptions o;
  EXPECT_TRUE(o.Validate(true).ok());
  auto msg = [](const WorkloadOptions& w, bool verify) {
    return std::string(w.Validate(verify).message());
  };
  WorkloadOptions b = o;
  b.read_ratio = 1.5;
  EXPECT_NE(msg(b, false).find("--read_ratio"), std::string::npos);
  b = o;
  b.keys = 0;
  EXPECT_NE(msg(b, false).find("--keys"), std::string::npos);
  b = o;
  b.key_size = 3;  // cannot name 100000 keys
  EXPECT_NE(msg(b, false).find("--key_size"), std::string::npos);
  b = o;
  b.value_size = 8;
  EXPECT_TRUE(b.Validate(false).ok());
  EXPECT_NE(msg(b, true).find("--value_size"), std::string::npos);
  b = o;
  b.value_size = 1 << 20;
  EXPECT_NE(msg(b, false).find("--value_size"), std::string::npos);
  b = o;
  b.zipf_theta = 1.0;
  EXPECT_NE(msg(b, false).find("--zipf_theta"), std::string::npos);
  b.distribution = KeyDistribution::kUniform;
  EXPECT_TRUE(b.Validate(false).ok());
}

TEST(WorkloadTest, KeyFormatting) {
  EXPECT_EQ(FormatKey(42, 8), "k0000042");
  EXPECT_EQ(FormatKey(0, 2), "k0");
  EXPECT_EQ(FormatKey(12345, 6), "k12345");
  // FormatKeyTo reuses the string: no allocation once it has the capacity.
  std::string k;
  FormatKeyTo(123, 16, &k);
  EXPECT_EQ(k, "k000000000000123");
  const char* buf = k.data();
  FormatKeyTo(9, 16, &k);
  EXPECT_EQ(k, "k000000000000009");
  EXPECT_EQ(k.data(), buf);
  EXPECT_EQ(MinKeySize(1), 2u);
  EXPECT_EQ(MinKeySize(10), 2u);
  EXPECT_EQ(MinKeySize(11), 3u);
  EXPECT_EQ(MinKeySize(100000), 6u);
  for (uint64_t i : {0ull, 7ull, 99999ull, 1ull << 40}) {
    const std::string k = FormatKey(i, 32);
    EXPECT_EQ(k.size(), 32u);
    EXPECT_EQ(ParseKeyIndex(k), i);
  }
  EXPECT_FALSE(ParseKeyIndex("x12").has_value());
  EXPECT_FALSE(ParseKeyIndex("k").has_value());
  EXPECT_FALSE(ParseKeyIndex("k12a").has_value());
}

TEST(WorkloadTest, RngIsDeterministicAndUniformIsBounded) {
  Rng a(7), b(7), c(8);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = a.Next();
    EXPECT_EQ(x, b.Next());
    differs |= x != c.Next();
  }
  EXPECT_TRUE(differs);
  Rng r(1);
  for (uint64_t n : {1ull, 2ull, 3ull, 1000ull, (1ull << 63) + 5}) {
    for (int i = 0; i < 1000; ++i) ASSERT_LT(r.Uniform(n), n);
  }
  for (int i = 0; i < 1000; ++i) {
    const double d = r.NextDouble();
    ASSERT_GE(d, 0.0);
    ASSERT_LT(d, 1.0);
  }
  // Streams of the same seed differ from each other.
  EXPECT_NE(Rng::ForStream(1, 0).Next(), Rng::ForStream(1, 1).Next());
}

std::vector<uint64_t> RankCounts(uint64_t n, double theta, int samples) {
  absl::StatusOr<ZipfianGenerator> z = ZipfianGenerator::Create(n, theta);
  EXPECT_TRUE(z.ok());
  std::vector<uint64_t> counts(n, 0);
  Rng rng(99);
  for (int i = 0; i < samples; ++i) {
    const uint64_t r = z->Next(rng);
    EXPECT_LT(r, n);
    ++counts[std::min(r, n - 1)];
  }
  return counts;
}

TEST(WorkloadTest, ZipfianSkewMatchesTheory) {
  constexpr uint64_t kN = 1000;
  constexpr int kSamples = 400000;
  const double theta = 0.99;
  const std::vector<uint64_t> c = RankCounts(kN, theta, kSamples);
  double zeta = 0;
  for (uint64_t i = 1; i <= kN; ++i) zeta += std::pow(static_cast<double>(i), -theta);
  // P(rank 0) = 1 / zeta(n): within 5% of theory.
  const double p0 = static_cast<double>(c[0]) / kSamples;
  EXPECT_NEAR(p0, 1 / zeta, 0.05 / zeta);
  // P(0) / P(1) = 2^theta.
  EXPECT_NEAR(static_cast<double>(c[0]) / c[1], std::pow(2, theta), 0.15);
  // The hottest 10% of ranks take ~70% of requests (sum_{i<=100} / zeta).
  double head = 0;
  for (uint64_t i = 1; i <= kN / 10; ++i) head += std::pow(static_cast<double>(i), -theta);
  uint64_t top = 0;
  for (uint64_t i = 0; i < kN / 10; ++i) top += c[i];
  EXPECT_NEAR(static_cast<double>(top) / kSamples, head / zeta, 0.03);
  EXPECT_GT(c[0], c[10]);
  EXPECT_GT(c[10], c[500]);
}

TEST(WorkloadTest, ZipfianRejectsBadParameters) {
  EXPECT_FALSE(ZipfianGenerator::Create(0, 0.99).ok());
  EXPECT_FALSE(ZipfianGenerator::Create(10, 1.0).ok());
  EXPECT_FALSE(ZipfianGenerator::Create(10, 0).ok());
  // Tiny key spaces still work.
  for (uint64_t n : {1, 2, 3}) {
    const std::vector<uint64_t> c = RankCounts(n, 0.99, 1000);
    EXPECT_GT(c[0], 0u);
  }
}

TEST(WorkloadTest, LargeKeySpaceZetaIsSane) {
  // Beyond 10^6 terms zeta is extrapolated: compare with the exact sum, then
  // check it keeps growing like n^(1-theta) / (1-theta).
  absl::StatusOr<ZipfianGenerator> z = ZipfianGenerator::Create(3'000'000, 0.99);
  ASSERT_TRUE(z.ok());
  double exact = 0;
  for (uint64_t i = 1; i <= 3'000'000; ++i) exact += std::pow(static_cast<double>(i), -0.99);
  EXPECT_NEAR(z->zeta_n(), exact, 1e-9 * exact);
  absl::StatusOr<ZipfianGenerator> a = ZipfianGenerator::Create(10'000'000, 0.99);
  absl::StatusOr<ZipfianGenerator> b = ZipfianGenerator::Create(1'000'000'000, 0.99);
  ASSERT_TRUE(a.ok() && b.ok());
  const double expected_growth = (std::pow(1e9, 0.01) - std::pow(1e7, 0.01)) / 0.01;
  EXPECT_NEAR(b->zeta_n() - a->zeta_n(), expected_growth, 1e-3 * expected_growth);
  Rng rng(3);
  for (int i = 0; i < 10000; ++i) ASSERT_LT(b->Next(rng), 1'000'000'000u);
}

TEST(WorkloadTest, ScrambleIsABijectionAndSeedDependent) {
  for (uint64_t keys : {1, 2, 3, 10, 64, 97, 1000}) {
    WorkloadOptions o;
    o.keys = keys;
    o.seed = keys;
    absl::StatusOr<KeyChooser> c = KeyChooser::Create(o);
    ASSERT_TRUE(c.ok());
    std::set<uint64_t> seen;
    for (uint64_t r = 0; r < keys; ++r) {
      const uint64_t k = c->KeyForRank(r);
      ASSERT_LT(k, keys);
      seen.insert(k);
    }
    EXPECT_EQ(seen.size(), keys);
  }
  WorkloadOptions o;
  o.keys = 1000000;
  WorkloadOptions o2 = o;
  o2.seed = 2;
  absl::StatusOr<KeyChooser> c1 = KeyChooser::Create(o), c2 = KeyChooser::Create(o2);
  ASSERT_TRUE(c1.ok() && c2.ok());
  EXPECT_NE(c1->KeyForRank(0), c2->KeyForRank(0));
  // Hot ranks land far apart, not on neighbouring keys.
  const uint64_t d = c1->KeyForRank(1) > c1->KeyForRank(0) ? c1->KeyForRank(1) - c1->KeyForRank(0)
                                                           : c1->KeyForRank(0) - c1->KeyForRank(1);
  EXPECT_GT(d, 1u);
}

TEST(WorkloadTest, KeyChooserIsDeterministicUnderASeed) {
  for (KeyDistribution dist : {KeyDistribution::kUniform, KeyDistribution::kZipfian}) {
    WorkloadOptions o;
    o.keys = 5000;
    o.distribution = dist;
    o.seed = 11;
    absl::StatusOr<KeyChooser> a = KeyChooser::Create(o), b = KeyChooser::Create(o);
    ASSERT_TRUE(a.ok() && b.ok());
    Rng ra = Rng::ForStream(o.seed, 3), rb = Rng::ForStream(o.seed, 3);
    for (int i = 0; i < 10000; ++i) {
      const uint64_t k = a->Next(ra);
      ASSERT_EQ(k, b->Next(rb));
      ASSERT_LT(k, o.keys);
    }
  }
}

TEST(WorkloadTest, UniformIsFlat) {
  WorkloadOptions o;
  o.keys = 100;
  o.distribution = KeyDistribution::kUniform;
  absl::StatusOr<KeyChooser> c = KeyChooser::Create(o);
  ASSERT_TRUE(c.ok());
  std::vector<int> counts(100, 0);
  Rng rng(5);
  for (int i = 0; i < 100000; ++i) ++counts[c->Next(rng)];
  const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
  EXPECT_GT(*lo, 800);  // expected 1000 each; 6+ sigma margins
  EXPECT_LT(*hi, 1200);
}

TEST(WorkloadTest, OperationMix) {
  Rng rng(1);
  auto mix = [&](double read_ratio, double delete_ratio) {
    WorkloadOptions o;
    o.read_ratio = read_ratio;
    o.delete_ratio = delete_ratio;
    std::array<int, 3> n{};
    for (int i = 0; i < 100000; ++i) ++n[static_cast<int>(ChooseOp(o, rng))];
    return n;
  };
  std::array<int, 3> a = mix(0.5, 0);
  EXPECT_NEAR(a[0], 50000, 1000);
  EXPECT_EQ(a[2], 0);
  std::array<int, 3> b = mix(0.95, 0);
  EXPECT_NEAR(b[0], 95000, 600);
  std::array<int, 3> c = mix(1.0, 0.5);
  EXPECT_EQ(c[0], 100000);
  std::array<int, 3> d = mix(0.0, 0.25);
  EXPECT_EQ(d[0], 0);
  EXPECT_NEAR(d[2], 25000, 800);
}

}  // namespace
}  // namespace kvnode::load
