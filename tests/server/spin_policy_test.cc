#include "kvnode/server/spin_policy.h"

#include <gtest/gtest.h>

namespace kvnode::server {
namespace {

constexpr uint64_t kUs = 1000;
constexpr uint64_t kBase = 20 * kUs;
constexpr uint64_t kMax = 200 * kUs;

TEST(SpinWindow, FixedWhenNotAdaptive) {
  // --spin_max_us 0, or not above --spin_us: today's fixed spin whatever the gaps.
  EXPECT_EQ(SpinWindowNs(kBase, 0, 1 * kUs), kBase);
  EXPECT_EQ(SpinWindowNs(kBase, kBase, 1 * kUs), kBase);
  EXPECT_EQ(SpinWindowNs(kBase, kBase / 2, kNoGapEstimate), kBase);
}

TEST(SpinWindow, UnknownOrSlowClientsSleepAfterTheBaseSpin) {
  EXPECT_EQ(SpinWindowNs(kBase, kMax, kNoGapEstimate), kBase);
  EXPECT_EQ(SpinWindowNs(kBase, kMax, kMax), kBase);
  EXPECT_EQ(SpinWindowNs(kBase, kMax, 10 * kMax), kBase);
}

TEST(SpinWindow, ActiveClientsGetTwiceTheGapWithinTheBounds) {
  EXPECT_EQ(SpinWindowNs(kBase, kMax, 40 * kUs), 80 * kUs);
  EXPECT_EQ(SpinWindowNs(kBase, kMax, 2 * kUs), kBase);   // never below --spin_us
  EXPECT_EQ(SpinWindowNs(kBase, kMax, 150 * kUs), kMax);  // never above --spin_max_us
  EXPECT_EQ(SpinWindowNs(0, kMax, 30 * kUs), 60 * kUs);   // --spin_us 0 too
}

TEST(GapEstimate, FirstGapIsTakenClampedToTheBound) {
  EXPECT_EQ(UpdateGapEstimate(kNoGapEstimate, 30 * kUs, kMax), 30 * kUs);
  EXPECT_EQ(UpdateGapEstimate(kNoGapEstimate, 5'000'000 * kUs, kMax), kMax);
}

TEST(GapEstimate, MovesAQuarterOfTheWayToEachGap) {
  EXPECT_EQ(UpdateGapEstimate(40 * kUs, 80 * kUs, kMax), 50 * kUs);
  EXPECT_EQ(UpdateGapEstimate(40 * kUs, 0, kMax), 30 * kUs);
}

TEST(SpinPolicy, FixedSpinIgnoresRequests) {
  SpinPolicy p(kBase, 0);
  EXPECT_FALSE(p.adaptive());
  for (int i = 0; i < 10; ++i) p.OnRequest(5 * kUs);
  EXPECT_EQ(p.window_ns(), kBase);
}

TEST(SpinPolicy, ADepthOneClientIsCaughtByTheSpin) {
  SpinPolicy p(kBase, kMax);
  EXPECT_EQ(p.window_ns(), kBase);  // nothing seen yet
  // Its first request found the thread asleep (gap with the wake-up), the
  // next ones come one round trip (~50 us) after each answer.
  p.OnRequest(120 * kUs);
  EXPECT_EQ(p.window_ns(), kMax);
  for (int i = 0; i < 20; ++i) p.OnRequest(50 * kUs);
  EXPECT_GE(p.window_ns(), 100 * kUs);  // > the gap: the next request finds it spinning
  EXPECT_LE(p.window_ns(), 110 * kUs);  // ... and no more than about twice it
}

TEST(SpinPolicy, AClientSlowerThanTheBoundKeepsTheBaseSpin) {
  SpinPolicy p(kBase, kMax);
  for (int i = 0; i < 20; ++i) p.OnRequest(1000 * kUs);
  EXPECT_EQ(p.window_ns(), kBase);
}

TEST(SpinPolicy, OnePauseTurnsItOffAndPromptRequestsBackOn) {
  SpinPolicy p(kBase, kMax);
  for (int i = 0; i < 40; ++i) p.OnRequest(30 * kUs);
  ASSERT_EQ(p.window_ns(), 60 * kUs);
  p.OnRequest(3'000'000 * kUs);  // the client stopped for 3 s
  EXPECT_EQ(p.window_ns(), kBase);
  p.OnRequest(30 * kUs);
  EXPECT_GT(p.window_ns(), kBase);
}

TEST(SpinPolicy, LargestBoundDoesNotOverflow) {
  const uint64_t max = 1'000'000 * kUs;  // ServerOptions' bound on --spin_max_us
  SpinPolicy p(0, max);
  for (int i = 0; i < 5; ++i) p.OnRequest(UINT64_MAX - 1);
  EXPECT_GE(p.estimate_ns(), max);
  EXPECT_LE(p.estimate_ns(), 4 * max);
  EXPECT_EQ(p.window_ns(), 0u);
}

}  // namespace
}  // namespace kvnode::server
