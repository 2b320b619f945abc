// The steps of a long operation (a node's start, the store's open) and the
// time each took, for one log line: "device 43ms, store 2.6s, ...".
#ifndef KVNODE_BASE_STEP_TIMES_H_
#define KVNODE_BASE_STEP_TIMES_H_

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvnode/base/errno.h"

namespace kvnode::base {

class StepTimes {
 public:
  // Ends the step begun at the previous Done (or at construction).
  void Done(std::string_view step) {
    const absl::Time now = absl::Now();
    absl::StrAppend(&steps_, steps_.empty() ? "" : ", ", Av(step), " ",
                    absl::FormatDuration(now - last_));
    last_ = now;
  }
  // From construction to the last Done.
  absl::Duration total() const { return last_ - start_; }
  const std::string& steps() const { return steps_; }

 private:
  absl::Time start_ = absl::Now();
  absl::Time last_ = start_;
  std::string steps_;
};

}  // namespace kvnode::base

#endif  // KVNODE_BASE_STEP_TIMES_H_
