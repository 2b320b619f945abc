// How long kvload's machine could not run it at all.
//
// A thread sleeps `period` at a time and records how late each sleep ended.
// A busy CPU delays a waking sleeper by the scheduler's slice (milliseconds;
// tens under TCG when a kernel path does not yield); a machine that stands
// still delays it by the whole stall. The TCG guest of deploy/vm/rxe-vm stood
// still for 115-296 ms at a time (docs/upgrade.md, "The long GET gaps are
// the emulator standing still"), so kvload reports the longest late wake-up
// beside its blackout: a blackout inside such a stall is not the node's.
#ifndef KVNODE_LOAD_STALL_METER_H_
#define KVNODE_LOAD_STALL_METER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvnode/base/annotated_mutex.h"

namespace kvnode::load {

class StallMeter {
 public:
  struct Stall {
    double longest_ms = 0;   // the latest end of a sleep, beyond `period`
    double start_ms = 0;     // when that sleep should have ended, since t0
    uint64_t over_50ms = 0;  // sleeps that ended more than 50 ms late
  };
  using Clock = std::chrono::steady_clock;
  using SleepFn = std::function<void(absl::Duration)>;

  // Starts measuring; times are reported since t0. `sleep` is for tests.
  explicit StallMeter(Clock::time_point t0, absl::Duration period = absl::Milliseconds(5),
                      SleepFn sleep = absl::SleepFor);
  ~StallMeter();  // stops the thread
  StallMeter(const StallMeter&) = delete;
  StallMeter& operator=(const StallMeter&) = delete;

  Stall Get() const;

 private:
  void Run();

  const Clock::time_point t0_;
  const absl::Duration period_;
  const SleepFn sleep_;
  std::atomic<bool> stop_{false};
  mutable AnnotatedMutex mu_;
  Stall stall_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: started once the rest is set
};

}  // namespace kvnode::load

#endif  // KVNODE_LOAD_STALL_METER_H_
