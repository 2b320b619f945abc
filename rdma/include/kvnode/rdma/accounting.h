// Process-wide accounting of every live verbs object kvrdma created.
//
// Each owner (Device, Pd, Cq, Qp, Mr, Mw, completion channel) registers
// itself when its ibv_* object is created and unregisters when the matching
// destroy call succeeded. A destroy call that failed leaves the object
// counted (it is still alive in the kernel) and bumps destroy_failures, so a
// teardown that leaks shows up in CheckNoLeaks() with the object's label.
//
// Thread safety: every function may be called from any thread.
#ifndef KVNODE_RDMA_ACCOUNTING_H_
#define KVNODE_RDMA_ACCOUNTING_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvnode::rdma {

enum class ObjectKind : int {
  kDevice = 0,
  kCompChannel,
  kPd,
  kCq,
  kQp,
  kMr,
  kMw,
  kCount,  // not a kind
};

const char* ObjectKindName(ObjectKind kind);

struct LiveCounts {
  std::array<int64_t, static_cast<size_t>(ObjectKind::kCount)> live{};
  int64_t destroy_failures = 0;    // destroy/dereg/dealloc calls that failed
  int64_t undrained_destroys = 0;  // QPs destroyed with work still outstanding
  uint64_t pinned_bytes = 0;       // bytes registered in live MRs

  int64_t of(ObjectKind k) const { return live[static_cast<size_t>(k)]; }
  int64_t total() const;
  std::string ToString() const;  // "device=1 pd=1 ... pinned_bytes=N"
};

class Accounting {
 public:
  // Snapshot of the counters.
  static LiveCounts Snapshot();

  // OK when no object of any kind is alive and no destroy call failed since
  // the process started (or since ResetFailureCounters()); otherwise
  // FailedPrecondition listing each live object with its label.
  [[nodiscard]] static absl::Status CheckNoLeaks();

  // Lists live objects, one per line: "<kind> <label>".
  static std::string Report();

  // Clears destroy_failures and undrained_destroys (tests that provoke them
  // on purpose call this after checking them).
  static void ResetFailureCounters();

  // --- for the owners in kvrdma -------------------------------------------
  static void Created(ObjectKind kind, const void* obj, std::string label);
  static void Destroyed(ObjectKind kind, const void* obj);
  static void DestroyFailed(ObjectKind kind, const void* obj, absl::string_view why);
  static void UndrainedDestroy();
  static void Pinned(int64_t delta_bytes);
  static uint64_t PinnedBytes();
};

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_ACCOUNTING_H_
