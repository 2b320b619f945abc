// Deregistering many MRs at once (shutdown, live upgrade).
//
// Each MR goes through SafeDeregister (refusals stay per MR). With more than
// one thread the list is split into contiguous parts deregistered in
// parallel. Measured with rdma_bench on rxe in the TCG VM (docs/rdma.md):
// parallel kvrdma deregistration was slower than serial in most runs
// (0.13x-1.29x), so the automatic choice is serial; `threads` > 1 is kept for
// devices where a measurement shows parallel wins.
#ifndef KVNODE_RDMA_BATCH_DEREG_H_
#define KVNODE_RDMA_BATCH_DEREG_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kvnode/rdma/mr.h"

namespace kvnode::rdma {

struct BatchDeregOptions {
  // Threads. Default 0 = automatic: serial (see above). 1 = serial; N > 1
  // splits the list over N threads when it has >= parallel_threshold MRs.
  int threads = 0;
  // Below this many MRs the batch stays serial. Default 16.
  int parallel_threshold = 16;

  [[nodiscard]] absl::Status Validate() const;
};

struct BatchDeregResult {
  std::vector<absl::Status> statuses;  // one per MR, in input order
  int threads_used = 1;
  // OK if every MR was deregistered, else the first failure.
  absl::Status overall;
};

// Safe-deregisters every MR (null entries are skipped) by `deadline`.
BatchDeregResult DeregisterBatch(const std::vector<std::shared_ptr<Mr>>& mrs, Deadline deadline,
                                 BatchDeregOptions options = {});

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_BATCH_DEREG_H_
