#include <atomic>
#include <chrono>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "kvnode/load/stall_meter.h"

namespace kvnode::load {
namespace {

// A deadline for a condition; the meter's thread is waited for by notification.
constexpr absl::Duration kDeadline = absl::Seconds(30);

TEST(StallMeter, ASleepThatEndsLateIsTheLongestStallAndCounted) {
  // The third sleep lasts 120 ms instead of 1 ms, as if the machine stood
  // still; every other sleep is on time.
  std::atomic<int> sleeps{0};
  absl::Notification late_done;
  const StallMeter::Clock::time_point t0 = StallMeter::Clock::now();
  StallMeter meter(t0, absl::Milliseconds(1), [&](absl::Duration d) {
    const int n = ++sleeps;
    absl::SleepFor(n == 3 ? absl::Milliseconds(120) : d);
    if (n == 4) late_done.Notify();
  });
  ASSERT_TRUE(late_done.WaitForNotificationWithTimeout(kDeadline));
  const StallMeter::Stall s = meter.Get();
  EXPECT_GE(s.longest_ms, 110);
  EXPECT_GE(s.over_50ms, 1u);  // more only if the test machine itself stalls
  EXPECT_GE(s.start_ms, 0);
  const double since_t0 =
      std::chrono::duration<double, std::milli>(StallMeter::Clock::now() - t0).count();
  EXPECT_LE(s.start_ms + s.longest_ms, since_t0);
}

}  // namespace
}  // namespace kvnode::load
