// Memory regions with reference counts and in-flight work tracking.
//
// The rules (docs/rdma.md has the full list):
//  1. An Mr is registered by Mr::Register and lives in a std::shared_ptr. It
//     holds its Pd, so the PD outlives it.
//  2. Users that need the registration to stay valid take an MrRef
//     (Mr::Acquire). Every work request posted through Qp that names an Mr
//     (its local buffer, and optionally a remote Mr of the same process)
//     holds an in-flight pin until its completion is polled (or the QP is
//     destroyed, after which the device no longer touches the memory).
//  3. SafeDeregister(mr, deadline) first closes the Mr: no new reference or
//     work request can name it. It then waits, up to the deadline, until
//     references and in-flight pins are zero; if they are not, it refuses
//     with kFailedPrecondition / RdmaErrorKind::kMrInUse and the Mr stays
//     registered (and closed): poll completions, drop references, call again.
//  4. Memory windows bound to the Mr are deallocated before ibv_dereg_mr
//     (rxe refuses dereg with EINVAL while one is bound; the spec says EBUSY:
//     both map to kMrWindowBound, retryable).
//  5. Dropping the last shared_ptr of a still-registered Mr deregisters it
//     (no pin can exist then: pins hold the shared_ptr). A failure there is
//     logged and counted in Accounting.
//
// Thread safety: Acquire, MrRef, SafeDeregister, the accessors and the
// counters may be used from any thread concurrently.
#ifndef KVNODE_RDMA_MR_H_
#define KVNODE_RDMA_MR_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvnode/rdma/errors.h"
#include "kvnode/rdma/pd.h"
#include "kvnode/rdma/ref_gate.h"

namespace kvnode::rdma {

class Mw;
class MrRef;

struct MrOptions {
  // ibv_access_flags. Default IBV_ACCESS_LOCAL_WRITE: a local READ target or
  // RECV buffer. Give only what is needed: a SEND source needs 0, a READ-only
  // served region IBV_ACCESS_REMOTE_READ, a region exposed through windows
  // IBV_ACCESS_MW_BIND (plus LOCAL_WRITE if windows grant remote write).
  int access = IBV_ACCESS_LOCAL_WRITE;
  // Default nullopt: the MR's iova is its virtual address. Set to register
  // with ibv_reg_mr_iova2 at this iova (e.g. 0, so remote addresses are
  // offsets into the region).
  std::optional<uint64_t> iova;
  // Default true: the address and length must be multiples of the page size
  // (4 KiB pages; huge-page backed memory is aligned anyway).
  bool require_page_aligned = true;
  // Default true: refuse, with a message naming the limit, a registration
  // that would take this process's registered bytes over RLIMIT_MEMLOCK
  // (skipped when the process has CAP_IPC_LOCK, like the kernel does).
  bool check_memlock = true;
  // Default false. Set for memory whose pages exist already (shared memory
  // or a file that another process, or an earlier pass, filled): they are
  // mapped with MADV_POPULATE_READ before registering, 16 pages per fault
  // (the kernel's fault-around), where ibv_reg_mr would fault them one at a
  // time. Not for fresh anonymous memory: a read maps the shared zero page,
  // which a writable registration must then replace page by page.
  bool populate_first = false;
  // Name for logs, leak reports and errors. Default "mr".
  std::string label = "mr";
  // Default null. Anything that must outlive the registration, typically
  // the owner of the memory (e.g. a std::shared_ptr<HostMemory>): released
  // only after ibv_dereg_mr succeeded, so the pages cannot be unmapped while
  // the MR (or a work request naming it) is alive.
  std::shared_ptr<void> backing;

  [[nodiscard]] absl::Status Validate() const;
};

class Mr : public std::enable_shared_from_this<Mr> {
 public:
  static absl::StatusOr<std::shared_ptr<Mr>> Register(std::shared_ptr<Pd> pd, void* addr,
                                                      size_t length, MrOptions options = {});
  ~Mr();
  Mr(const Mr&) = delete;
  Mr& operator=(const Mr&) = delete;

  uint32_t lkey() const { return lkey_; }
  uint32_t rkey() const { return rkey_; }
  void* addr() const { return addr_; }
  size_t length() const { return length_; }
  uint64_t iova() const { return iova_; }
  int access() const { return access_; }
  const std::string& label() const { return label_; }
  const std::shared_ptr<Pd>& pd() const { return pd_; }

  // True if [offset, offset+len) lies inside the region.
  bool Contains(uint64_t offset, uint64_t len) const {
    return offset <= length_ && len <= length_ - offset;
  }

  // A reference that keeps the registration valid. Fails with
  // FailedPrecondition / kClosed once SafeDeregister has started.
  absl::StatusOr<MrRef> Acquire();

  uint32_t references() const;
  uint32_t outstanding_wrs() const;
  // True once SafeDeregister started (no new references or work requests).
  bool closed() const;
  // False once ibv_dereg_mr succeeded.
  bool registered() const;

 private:
  friend class MrRef;
  friend class Mw;
  friend class Qp;
  friend absl::Status SafeDeregister(Mr& mr, Deadline deadline);

  static constexpr uint64_t kRefUnit = RefGate::kRefUnit;
  static constexpr uint64_t kWrUnit = RefGate::kWrUnit;

  Mr() = default;
  bool TryPin(uint64_t unit) { return gate_.TryPin(unit); }
  void Unpin(uint64_t unit) { gate_.Unpin(unit); }
  absl::Status DeregisterNow();  // the device call, counts and windows

  // Declared in creation order (PD first, so it is released last).
  std::shared_ptr<Pd> pd_;
  std::shared_ptr<void> backing_;  // released after deregistration
  ibv_mr* mr_ = nullptr;           // null once deregistered; written under mu_
  void* addr_ = nullptr;
  size_t length_ = 0;
  uint64_t iova_ = 0;
  uint64_t pinned_ = 0;  // bytes counted in Accounting::Pinned
  uint32_t lkey_ = 0;
  uint32_t rkey_ = 0;
  int access_ = 0;
  std::string label_;

  RefGate gate_;
  mutable absl::Mutex mu_;  // guards mr_ (deregistration)
  // Windows currently bound to this MR (links owned by Mw).
  std::vector<Mw*> windows_ ABSL_GUARDED_BY(pd_->graph_mu());
};

// A counted reference to an Mr (see rule 2). Move-only; releases on
// destruction or Release().
class MrRef {
 public:
  MrRef() = default;
  MrRef(MrRef&& o) noexcept : mr_(std::move(o.mr_)), unit_(o.unit_) {}
  MrRef& operator=(MrRef&& o) noexcept;
  ~MrRef() { Release(); }

  Mr* get() const { return mr_.get(); }
  Mr* operator->() const { return mr_.get(); }
  explicit operator bool() const { return mr_ != nullptr; }
  void Release();

 private:
  friend class Mr;
  friend class Qp;
  MrRef(std::shared_ptr<Mr> mr, uint64_t unit) : mr_(std::move(mr)), unit_(unit) {}

  std::shared_ptr<Mr> mr_;
  uint64_t unit_ = 0;
};

// Rules 3 and 4: close, wait for idle up to `deadline`, deallocate bound
// windows, ibv_dereg_mr. Returns OK also when already deregistered.
// Refusals are typed: kMrInUse (references/work outstanding at the
// deadline), kMrWindowBound (device still sees a window), kRetryLater
// (ENOMEM/EAGAIN). Any thread.
[[nodiscard]] absl::Status SafeDeregister(Mr& mr, Deadline deadline);

// The page size used for alignment checks.
size_t PageSize();

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_MR_H_
