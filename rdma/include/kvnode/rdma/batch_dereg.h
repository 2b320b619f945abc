// Deregistering many MRs at once (shutdown, live upgrade).
//
// Each MR goes through SafeDeregister (refusals stay per MR). With more than
// one thread the list is split into contiguous parts deregistered in
// parallel: rdma_bench measured on rxe that 2 threads beat serial for many
// small MRs (docs/rdma.md has the table), so kAuto uses
// min(2, hardware threads) when there are at least kParallelThreshold MRs.
#ifndef KVNODE_RDMA_BATCH_DEREG_H_
#define KVNODE_RDMA_BATCH_DEREG_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kvnode/rdma/mr.h"

namespace kvnode::rdma {

struct BatchDeregOptions {
  // Threads. Default 0 = automatic (see above); 1 = serial.
  int threads = 0;
  // Below this many MRs kAuto stays serial (thread start costs more).
  // Default 16.
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
