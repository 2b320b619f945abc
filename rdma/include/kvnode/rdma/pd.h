// A protection domain.
//
// Ownership: held by std::shared_ptr; holds its Device. Every Mr, Mw and Qp
// holds a shared_ptr to its Pd, so ibv_dealloc_pd runs only after all of them
// are gone.
//
// The Pd also owns the lock that guards the binding graph between memory
// windows, the MRs they expose and the QPs they are bound to (see mw.h): the
// graph changes only at bind/invalidate/deregister time, never per READ.
#ifndef KVNODE_RDMA_PD_H_
#define KVNODE_RDMA_PD_H_

#include <infiniband/verbs.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvnode/rdma/device.h"

namespace kvnode::rdma {

class Pd {
 public:
  static absl::StatusOr<std::shared_ptr<Pd>> Create(std::shared_ptr<Device> device,
                                                    std::string label = "pd");
  ~Pd();
  Pd(const Pd&) = delete;
  Pd& operator=(const Pd&) = delete;

  ibv_pd* pd() const { return pd_; }
  const std::shared_ptr<Device>& device() const { return device_; }
  const std::string& label() const { return label_; }

  // Guards Mw/Mr/Qp window links (internal to kvrdma).
  absl::Mutex& graph_mu() const ABSL_LOCK_RETURNED(graph_mu_) { return graph_mu_; }

 private:
  Pd() = default;

  // Declared in creation order; destroyed in reverse (PD before device).
  std::shared_ptr<Device> device_;
  ibv_pd* pd_ = nullptr;
  std::string label_;
  mutable absl::Mutex graph_mu_;
};

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_PD_H_
