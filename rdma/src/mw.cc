#include "kvnode/rdma/mw.h"

#include <glog/logging.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvnode/rdma/accounting.h"
#include "kvnode/rdma/errors.h"
#include "kvnode/rdma/mr.h"
#include "kvnode/rdma/qp.h"

namespace kvnode::rdma {
namespace {

// Every live window, so that a process that exits with windows still bound
// (a forgotten or leaked owner) deallocates them before the kernel tears
// the QPs down: rxe spends ~50 s per QP with a bound type-2 window
// otherwise. Lock order: registry, then a Pd's graph lock.
struct Registry {
  absl::Mutex mu;
  absl::flat_hash_set<Mw*> live ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* r = new Registry();
  return *r;
}

void DeallocAllAtExit() {
  Registry& r = GetRegistry();
  absl::MutexLock l(&r.mu);
  for (Mw* w : r.live) {
    absl::Status s = w->Dealloc();
    if (!s.ok()) LOG(ERROR) << "kvrdma: at exit: " << s;
  }
}

void Track(Mw* w) {
  static const bool installed = [] {
    std::atexit(DeallocAllAtExit);
    return true;
  }();
  (void)installed;
  Registry& r = GetRegistry();
  absl::MutexLock l(&r.mu);
  r.live.insert(w);
}

void Untrack(Mw* w) {
  Registry& r = GetRegistry();
  absl::MutexLock l(&r.mu);
  r.live.erase(w);
}

}  // namespace

absl::StatusOr<std::shared_ptr<Mw>> Mw::Allocate(std::shared_ptr<Pd> pd, MwType type,
                                                 std::string label) {
  if (pd == nullptr) return absl::InvalidArgumentError("Mw::Allocate: null pd");
  const DeviceCaps& caps = pd->device()->caps();
  if ((type == MwType::kType2 && !caps.mw_type2) || (type == MwType::kType1 && !caps.mw_type1)) {
    return absl::UnimplementedError(absl::StrCat("Mw::Allocate('", label, "'): device ",
                                                 pd->device()->name(), " has no type-",
                                                 static_cast<int>(type), " memory windows"));
  }
  ibv_mw* raw = ibv_alloc_mw(pd->pd(), type == MwType::kType2 ? IBV_MW_TYPE_2 : IBV_MW_TYPE_1);
  if (raw == nullptr) {
    return ErrnoStatus(
        absl::StrCat("ibv_alloc_mw('", label, "', type ", static_cast<int>(type), ")"), errno);
  }
  std::shared_ptr<Mw> mw(new Mw());
  mw->pd_ = std::move(pd);
  mw->mw_ = raw;
  mw->type_ = type;
  mw->label_ = std::move(label);
  mw->rkey_.store(raw->rkey, std::memory_order_release);
  Accounting::Created(ObjectKind::kMw, mw.get(),
                      absl::StrCat(mw->label_, " (type ", static_cast<int>(type), ")"));
  Track(mw.get());
  return mw;
}

Mw::~Mw() {
  Untrack(this);  // before the graph lock (lock order)
  std::shared_ptr<Mr> released;
  {
    absl::MutexLock g(&pd_->graph_mu());
    absl::Status s = DeallocLocked();
    if (!s.ok()) LOG(ERROR) << "kvrdma: ~Mw('" << label_ << "'): " << s;
    UnlinkLocked(&released);
  }
}

bool Mw::bound() const {
  absl::MutexLock g(&pd_->graph_mu());
  return state_ == State::kBound;
}

bool Mw::alive() const {
  absl::MutexLock g(&pd_->graph_mu());
  return mw_ != nullptr;
}

absl::Status Mw::Dealloc() {
  std::shared_ptr<Mr> released;
  absl::Status s;
  {
    absl::MutexLock g(&pd_->graph_mu());
    s = DeallocLocked();
    if (s.ok()) UnlinkLocked(&released);
  }
  return s;
}

absl::Status Mw::DeallocLocked() {
  if (mw_ == nullptr) return absl::OkStatus();
  if (int rc = ibv_dealloc_mw(mw_); rc != 0) {
    Accounting::DestroyFailed(ObjectKind::kMw, this, std::strerror(rc));
    return ErrnoStatus(absl::StrCat("ibv_dealloc_mw('", label_, "')"), rc);
  }
  mw_ = nullptr;
  state_ = State::kDead;
  Accounting::Destroyed(ObjectKind::kMw, this);
  return absl::OkStatus();
}

void Mw::UnlinkLocked(std::shared_ptr<Mr>* released_mr) {
  if (mr_ != nullptr) {
    mr_->pd_->graph_mu().AssertHeld();  // same Pd, same lock (PostBindMw checks)
    auto& v = mr_->windows_;
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
    *released_mr = std::move(mr_);
    mr_ = nullptr;
  }
  if (qp_ != nullptr) {
    qp_->pd_->graph_mu().AssertHeld();  // same Pd, same lock (PostBindMw checks)
    auto& v = qp_->windows_;
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
    qp_ = nullptr;
  }
  if (state_ == State::kBound) state_ = State::kUnbound;
}

}  // namespace kvnode::rdma
