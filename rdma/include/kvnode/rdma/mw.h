// Memory windows: revocable, per-client remote access to part of an MR.
//
// Type 2 (preferred) is bound to one QP by an IBV_WR_BIND_MW work request on
// that QP and then serves only READs arriving on that QP; type 1 is bound with
// ibv_bind_mw and its rkey works from any QP of the PD. Both are bound and
// invalidated through Qp (Qp::PostBindMw, Qp::PostInvalidateMw); see qp.h.
//
// Binding graph (guarded by the Pd's graph_mu()):
//  1. A bound window holds a shared_ptr to its Mr, so the Mr cannot be
//     destroyed under it; SafeDeregister(mr) deallocates the Mr's windows
//     before ibv_dereg_mr.
//  2. A type-2 window bound to a QP is listed by that Qp; the Qp's destructor
//     deallocates the windows still bound to it BEFORE ibv_destroy_qp (rxe
//     blocks ~50 s in destroy_qp otherwise). Windows go before their QP on
//     every path, including forgotten teardown.
//  3. A window counts as bound from the moment its bind is posted until its
//     invalidation (LOCAL_INV, or a type-1 bind of length 0) completes
//     successfully, or it is deallocated. Conservative on purpose.
//
// Ownership: std::shared_ptr (work requests in flight hold one too). The
// destructor deallocates. Thread safety: rkey()/bound()/Dealloc() from any
// thread; binding and invalidating go through the QP owner's thread.
#ifndef KVNODE_RDMA_MW_H_
#define KVNODE_RDMA_MW_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/rdma/pd.h"

namespace kvnode::rdma {

class Mr;
class Qp;

enum class MwType { kType1 = 1, kType2 = 2 };

class Mw {
 public:
  static absl::StatusOr<std::shared_ptr<Mw>> Allocate(std::shared_ptr<Pd> pd, MwType type,
                                                      std::string label = "mw");
  ~Mw();
  Mw(const Mw&) = delete;
  Mw& operator=(const Mw&) = delete;

  MwType type() const { return type_; }
  const std::string& label() const { return label_; }
  // The rkey of the current (or last posted) binding.
  uint32_t rkey() const { return rkey_.load(std::memory_order_acquire); }
  // Rule 3.
  bool bound() const;
  // False once deallocated.
  bool alive() const;

  // Deallocates now (which also invalidates any binding) and unlinks from its
  // Mr and Qp. Idempotent. Any thread.
  [[nodiscard]] absl::Status Dealloc();

 private:
  friend class Mr;
  friend class Qp;
  enum class State { kUnbound, kBound, kDead };

  Mw() = default;
  absl::Status DeallocLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pd_->graph_mu());
  void UnlinkLocked(std::shared_ptr<Mr>* released_mr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pd_->graph_mu());

  std::shared_ptr<Pd> pd_;
  ibv_mw* mw_ = nullptr;  // null once deallocated
  MwType type_ = MwType::kType2;
  std::string label_;
  std::atomic<uint32_t> rkey_{0};
  State state_ ABSL_GUARDED_BY(pd_->graph_mu()) = State::kUnbound;
  std::shared_ptr<Mr> mr_ ABSL_GUARDED_BY(pd_->graph_mu());  // set while bound
  Qp* qp_ ABSL_GUARDED_BY(pd_->graph_mu()) = nullptr;        // type 2 while bound
};

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_MW_H_
