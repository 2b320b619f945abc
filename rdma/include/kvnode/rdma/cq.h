// Completion queue, optionally with a completion channel.
//
// Threading: a Cq and every Qp that uses it belong to ONE thread (the one
// that polls). Nothing here takes a lock on the hot path.
//
// Poll() is the only way completions leave the device. For each completion
// it finds the Qp and work request slot encoded in the wr_id, releases the
// MR pins the work request held (mr.h rule 2), updates window state, and
// returns the caller's own wr_id. Completions that a Qp::Drain or
// Qp::WaitFor polled for OTHER work requests are kept in a backlog and
// returned first by the next Poll(): nothing is lost.
//
// Ownership: std::shared_ptr; each Qp holds its CQs, so ibv_destroy_cq runs
// after every QP using it is destroyed. The channel (if any) is destroyed
// after the CQ.
#ifndef KVNODE_RDMA_CQ_H_
#define KVNODE_RDMA_CQ_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/rdma/device.h"
#include "kvnode/rdma/errors.h"

namespace kvnode::rdma {

class Qp;

// What a completed work request was.
enum class WrKind : uint8_t { kRead, kSend, kRecv, kBindMw, kInvalidateMw };

struct Completion {
  uint64_t wr_id = 0;  // the caller's wr_id, as given to Post*()
  ibv_wc_status status = IBV_WC_SUCCESS;
  WrKind kind = WrKind::kRead;
  uint32_t byte_len = 0;  // RECV: bytes received
  uint32_t qp_num = 0;
  uint32_t imm_data = 0;  // host order; valid if with_imm
  bool with_imm = false;
  uint32_t vendor_err = 0;
  Qp* qp = nullptr;  // the Qp it belongs to (alive while the Cq is polled by its owner)

  bool ok() const { return status == IBV_WC_SUCCESS; }
  // OK or the mapped status (errors.h WcStatusToStatus).
  absl::Status ToStatus() const;
};

struct CqOptions {
  // Entries. Default 1024. Must cover every signaled WR that can be
  // outstanding on all QPs using this CQ (plus one drain marker per QP).
  int depth = 1024;
  // Default false. True: create a completion channel (WaitForEvent).
  bool with_channel = false;
  // Default 0.
  int comp_vector = 0;
  // Default "cq".
  std::string label = "cq";

  [[nodiscard]] absl::Status Validate() const;
};

class Cq {
 public:
  static absl::StatusOr<std::shared_ptr<Cq>> Create(std::shared_ptr<Device> device,
                                                    CqOptions options = {});
  ~Cq();
  Cq(const Cq&) = delete;
  Cq& operator=(const Cq&) = delete;

  // --- hot path (cq_datapath.cc) -------------------------------------------
  // Up to out.size() completions; returns how many were written (0 if none).
  // Error only if ibv_poll_cq itself fails.
  absl::StatusOr<int> Poll(std::span<Completion> out);

  // --- completion channel ----------------------------------------------------
  // Arms the CQ for the next completion event.
  [[nodiscard]] absl::Status RequestNotify(bool solicited_only = false);
  // Waits for a completion event up to `deadline` and acknowledges it; true
  // if one came. Re-arm and Poll afterwards (the usual verbs pattern).
  absl::StatusOr<bool> WaitForEvent(Deadline deadline);
  int channel_fd() const { return channel_ == nullptr ? -1 : channel_->fd; }

  ibv_cq* cq() const { return cq_; }
  const std::string& label() const { return label_; }
  int depth() const { return depth_; }
  const std::shared_ptr<Device>& device() const { return device_; }
  // Completions that named a destroyed QP and were dropped.
  uint64_t stale_completions() const { return stale_; }

 private:
  friend class Qp;
  struct Entry {
    Qp* qp = nullptr;
    uint16_t gen = 0;
  };

  Cq() = default;
  // Returns the 16-bit table index << 16 | generation, the tag Qp puts in
  // the top 32 bits of its wr_ids.
  absl::StatusOr<uint32_t> Attach(Qp* qp);
  void Detach(uint32_t tag);
  // Translates one raw completion; false if it is internal (a drain marker)
  // or stale. Fills retired_ (cleared first) with the completions of the
  // unsignaled work requests it retires, which come before `out`.
  bool Dispatch(const ibv_wc& wc, Completion* out);
  // Polls the device once; completions that belong to `target` are appended
  // to `mine` (if non-null), all others to the backlog. Returns how many
  // were polled.
  absl::StatusOr<int> PollFor(const Qp* target, std::vector<Completion>* mine);

  // Declared in creation order: device, channel, CQ (destroyed in reverse).
  std::shared_ptr<Device> device_;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::string label_;
  int depth_ = 0;
  uint64_t stale_ = 0;
  std::vector<Entry> table_;
  std::vector<uint16_t> free_;
  std::deque<Completion> backlog_;
  std::vector<Completion> retired_;  // Dispatch's scratch (capacity kept)
};

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_CQ_H_
