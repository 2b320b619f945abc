#include "kvnode/rdma/mr.h"

#include <glog/logging.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvnode/rdma/accounting.h"
#include "kvnode/rdma/memory.h"
#include "kvnode/rdma/mw.h"

namespace kvnode::rdma {
namespace {

constexpr int kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                             IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                             IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND |
                             IBV_ACCESS_RELAXED_ORDERING;

// MrOptions::populate_first, on the page-aligned range [first, last). Only a
// saving: where it fails, ibv_reg_mr faults the pages in itself.
void PopulateForRegistration(uintptr_t first, uintptr_t last, const std::string& label) {
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_READ) != 0) {
    VLOG(1) << "Mr::Register('" << label << "'): MADV_POPULATE_READ: " << std::strerror(errno)
            << "; registering without it";
  }
}

}  // namespace

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

absl::Status MrOptions::Validate() const {
  if ((access & ~kKnownAccess) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MrOptions.access=0x", absl::Hex(access), ": unknown ibv_access_flags bits"));
  }
  // Verbs rule: remote write or atomic access needs local write.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0 &&
      (access & IBV_ACCESS_LOCAL_WRITE) == 0) {
    return absl::InvalidArgumentError(
        "MrOptions.access: REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Mr>> Mr::Register(std::shared_ptr<Pd> pd, void* addr, size_t length,
                                                 MrOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (pd == nullptr) return absl::InvalidArgumentError("Mr::Register: null pd");
  if (addr == nullptr || length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mr::Register('", options.label, "'): empty range"));
  }
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  if (options.require_page_aligned && (a % PageSize() != 0 || length % PageSize() != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Mr::Register('", options.label, "'): address 0x", absl::Hex(a), " / length ", length,
        " not page aligned (", PageSize(), "); use HostMemory or set require_page_aligned=false"));
  }
  // Bytes the kernel pins: whole pages.
  const uintptr_t first = a / PageSize() * PageSize();
  const uintptr_t last = (a + length + PageSize() - 1) / PageSize() * PageSize();
  const uint64_t pinned = last - first;
  if (options.check_memlock) {
    if (absl::Status s = CheckMemlock(pinned, absl::StrCat("registering MR '", options.label, "'"));
        !s.ok()) {
      return s;
    }
  }
  if (options.populate_first) PopulateForRegistration(first, last, options.label);
  ibv_mr* raw = options.iova ? ibv_reg_mr_iova2(pd->pd(), addr, length, *options.iova,
                                                static_cast<unsigned>(options.access))
                             : ibv_reg_mr(pd->pd(), addr, length, options.access);
  if (raw == nullptr) {
    const int err = errno;
    std::string what =
        absl::StrCat(options.iova ? "ibv_reg_mr_iova2" : "ibv_reg_mr", "('", options.label, "', ",
                     length, " bytes, access 0x", absl::Hex(options.access), ")");
    if (err == ENOMEM || err == EFAULT) {
      MemlockInfo m = QueryMemlock();
      if (!m.unlimited && !m.cap_ipc_lock) {
        return WithKind(ErrnoStatus(absl::StrCat(what, "; RLIMIT_MEMLOCK soft limit is ",
                                                 m.soft_limit, " bytes and ", m.pinned_by_kvrdma,
                                                 " are registered already: raise it (`ulimit -l`, "
                                                 "LimitMEMLOCK=, /etc/security/limits.conf)"),
                                    err),
                        RdmaErrorKind::kMemlockLimit);
      }
    }
    return ErrnoStatus(what, err);
  }
  std::shared_ptr<Mr> mr(new Mr());
  mr->pd_ = std::move(pd);
  mr->mr_ = raw;
  mr->addr_ = addr;
  mr->length_ = length;
  mr->iova_ = options.iova.value_or(a);
  mr->pinned_ = pinned;
  mr->lkey_ = raw->lkey;
  mr->rkey_ = raw->rkey;
  mr->access_ = options.access;
  mr->label_ = std::move(options.label);
  mr->backing_ = std::move(options.backing);
  Accounting::Created(
      ObjectKind::kMr, mr.get(),
      absl::StrCat(mr->label_, " (", length, " bytes, lkey 0x", absl::Hex(raw->lkey), ")"));
  Accounting::Pinned(static_cast<int64_t>(pinned));
  return mr;
}

Mr::~Mr() {
  absl::Status s = DeregisterNow();
  if (!s.ok()) LOG(ERROR) << "kvrdma: ~Mr('" << label_ << "'): " << s;
}

absl::StatusOr<MrRef> Mr::Acquire() {
  if (!TryPin(kRefUnit)) {
    return WithKind(absl::FailedPreconditionError(
                        absl::StrCat("MR '", label_, "' is being deregistered: no new references")),
                    RdmaErrorKind::kClosed);
  }
  return MrRef(shared_from_this(), kRefUnit);
}

uint32_t Mr::references() const { return gate_.references(); }

uint32_t Mr::outstanding_wrs() const { return gate_.work_requests(); }

bool Mr::closed() const { return gate_.closed(); }

bool Mr::registered() const {
  absl::MutexLock l(&mu_);
  return mr_ != nullptr;
}

absl::Status Mr::DeregisterNow() {
  std::vector<std::shared_ptr<Mr>> released;  // window links, dropped unlocked
  {
    absl::MutexLock g(&pd_->graph_mu());
    // Rule 4: windows first.
    while (!windows_.empty()) {
      Mw* w = windows_.back();
      w->pd_->graph_mu().AssertHeld();  // same Pd, same lock (PostBindMw checks)
      absl::Status s = w->DeallocLocked();
      std::shared_ptr<Mr> link;
      w->UnlinkLocked(&link);  // also erases it from windows_
      if (link) released.push_back(std::move(link));
      if (!s.ok()) {
        return WithKind(absl::FailedPreconditionError(absl::StrCat(
                            "deregistering MR '", label_, "': deallocating bound window '",
                            w->label(), "' failed: ", s.message())),
                        RdmaErrorKind::kMrWindowBound);
      }
    }
  }
  // `released` holds shared_ptrs to this very Mr; they must not be the last
  // ones (the caller holds one, or we are in ~Mr where none exist).
  released.clear();

  absl::MutexLock l(&mu_);
  if (mr_ == nullptr) return absl::OkStatus();
  if (int rc = ibv_dereg_mr(mr_); rc != 0) {
    std::string what = absl::StrCat("ibv_dereg_mr('", label_, "')");
    switch (rc) {
      case EINVAL:  // rxe: a window is still bound
      case EBUSY:   // spec: a window is still bound
        return WithKind(
            absl::FailedPreconditionError(absl::StrCat(
                what, ": ", std::strerror(rc), " (errno ", rc,
                "): the device still sees a memory window bound; invalidate or deallocate it, "
                "then retry")),
            RdmaErrorKind::kMrWindowBound);
      default:
        return ErrnoStatus(absl::StrCat(what, ", retry later if ENOMEM/EAGAIN"), rc);
    }
  }
  mr_ = nullptr;
  gate_.Close();
  backing_.reset();
  Accounting::Destroyed(ObjectKind::kMr, this);
  Accounting::Pinned(-static_cast<int64_t>(pinned_));
  return absl::OkStatus();
}

absl::Status SafeDeregister(Mr& mr, Deadline deadline) {
  // Window links released below must not drop the last owner under us.
  std::shared_ptr<Mr> keep_alive = mr.weak_from_this().lock();
  // Rule 3: close, then wait for idle.
  mr.gate_.Close();
  const auto left = deadline - Clock::now();
  mr.gate_.WaitIdle(left.count() > 0 ? absl::FromChrono(left) : absl::ZeroDuration());
  if (!mr.gate_.idle()) {
    return WithKind(
        absl::FailedPreconditionError(absl::StrCat(
            "deregistration of MR '", mr.label(), "' refused: ", mr.references(),
            " reference(s) and ", mr.outstanding_wrs(),
            " outstanding work request(s) still name it at the deadline; drop references, "
            "poll completions (or drain the QPs) and retry. The MR stays closed.")),
        RdmaErrorKind::kMrInUse);
  }
  return mr.DeregisterNow();
}

MrRef& MrRef::operator=(MrRef&& o) noexcept {
  if (this != &o) {
    Release();
    mr_ = std::move(o.mr_);
    unit_ = o.unit_;
  }
  return *this;
}

void MrRef::Release() {
  if (mr_ == nullptr) return;
  mr_->Unpin(unit_);
  mr_.reset();
}

}  // namespace kvnode::rdma
