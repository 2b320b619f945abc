#include "kvnode/load/stall_meter.h"

#include <utility>

namespace kvnode::load {

StallMeter::StallMeter(Clock::time_point t0, absl::Duration period, SleepFn sleep)
    : t0_(t0), period_(period), sleep_(std::move(sleep)), thread_([this] { Run(); }) {}

StallMeter::~StallMeter() {
  stop_.store(true, std::memory_order_relaxed);
  thread_.join();
}

StallMeter::Stall StallMeter::Get() const {
  AnnotatedLock l(&mu_);
  return stall_;
}

void StallMeter::Run() {
  while (!stop_.load(std::memory_order_relaxed)) {
    const Clock::time_point due = Clock::now() + absl::ToChronoNanoseconds(period_);
    sleep_(period_);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - due).count();
    if (ms <= 0) continue;
    AnnotatedLock l(&mu_);
    if (ms > 50) ++stall_.over_50ms;
    if (ms > stall_.longest_ms) {
      stall_.longest_ms = ms;
      stall_.start_ms = std::chrono::duration<double, std::milli>(due - t0_).count();
    }
  }
}

}  // namespace kvnode::load
