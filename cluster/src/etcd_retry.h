// The etcd retry of kvctl's drivers (the fleet roll's and the slot
// migration's): a call that finds etcd unreachable is retried every `poll`
// for up to `wait`, and the driver is told once when etcd goes and once when
// it answers again. Private to cluster/.
//
// Thread safety: none; owned by its driver's thread.
#ifndef KVNODE_CLUSTER_SRC_ETCD_RETRY_H_
#define KVNODE_CLUSTER_SRC_ETCD_RETRY_H_

#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvnode::cluster {

// etcd did not answer (as opposed to answering no).
inline bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

class EtcdRetry {
 public:
  // `say` gets "etcd unavailable (<why>): <lost>retrying for <wait>" when a
  // call first finds etcd unreachable, and `back` when one succeeds (or
  // fails otherwise) after that.
  EtcdRetry(absl::Duration wait, absl::Duration poll, std::string lost, std::string back,
            std::function<void(const std::string&)> say)
      : wait_(wait),
        poll_(poll),
        lost_(std::move(lost)),
        back_(std::move(back)),
        say_(std::move(say)) {}

  // f(): an etcd call returning absl::StatusOr. Its last result: OK, not
  // Retryable, or Retryable for longer than `wait`.
  template <typename F>
  auto Call(F f) -> decltype(f()) {
    const absl::Time start = absl::Now();
    for (;;) {
      auto r = f();
      if (r.ok() || !Retryable(r.status())) {
        if (etcd_lost_) {
          etcd_lost_ = false;
          say_(back_);
        }
        return r;
      }
      if (!etcd_lost_) {
        etcd_lost_ = true;
        say_(absl::StrCat("etcd unavailable (", r.status().message(), "): ", lost_, "retrying for ",
                          absl::FormatDuration(wait_)));
      }
      if (absl::Now() - start > wait_) return r;
      absl::SleepFor(poll_);  // retry backoff, not a synchronisation
    }
  }

 private:
  const absl::Duration wait_;
  const absl::Duration poll_;
  const std::string lost_;
  const std::string back_;
  const std::function<void(const std::string&)> say_;
  bool etcd_lost_ = false;
};

}  // namespace kvnode::cluster

#endif  // KVNODE_CLUSTER_SRC_ETCD_RETRY_H_
