// Reliable-connected queue pair with tracked work requests and drain.
//
// Threading: a Qp is owned and used by ONE thread, the same one that polls
// its CQs (cq.h). It takes no lock on the hot path (Post*, Poll). Only the
// MR pins it takes are atomic (Mr may be shared across threads).
//
// Tracking (DESIGN.md rule 2): every work request posted here is signaled
// and occupies a slot until its completion is polled. The slot holds an
// in-flight pin on each Mr it names, so SafeDeregister refuses those MRs
// until then. The wr_id on the wire encodes (CQ table index, generation,
// slot); Cq::Poll translates it back to the caller's wr_id.
//
// Teardown: ~Qp (1) deallocates every type-2 window still bound to it,
// (2) destroys the QP, (3) releases the pins of anything still outstanding
// (the device no longer touches the memory once destroy returned; an
// undrained destroy is counted in Accounting), (4) detaches from its CQs.
// Call Drain() first for an orderly shutdown.
//
// Members are declared in creation order so C++ releases them in teardown
// order: the QP before its CQs and PD.
#ifndef KVNODE_RDMA_QP_H_
#define KVNODE_RDMA_QP_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/rdma/cq.h"
#include "kvnode/rdma/errors.h"
#include "kvnode/rdma/mr.h"
#include "kvnode/rdma/mw.h"
#include "kvnode/rdma/pd.h"

namespace kvnode::rdma {

// What one side tells the other to connect an RC QP. Plain fixed-size
// fields in host byte order; the control protocol copies them field by
// field (its codec owns the wire byte order).
struct PeerInfo {
  uint32_t qp_num = 0;
  uint32_t psn = 0;      // initial packet sequence number (24 bits)
  uint8_t gid[16] = {};  // raw GID (RoCE: the IPv4-mapped GID)
  uint16_t lid = 0;      // InfiniBand LID (0 on RoCE)
  uint8_t port = 1;      // the sender's port number (informational)
  uint8_t mtu = 0;       // the sender's active ibv_mtu (1=256 ... 5=4096)
  uint8_t use_grh = 0;   // 1: address by GID (RoCE, or IB across subnets)

  bool operator==(const PeerInfo&) const = default;
};

struct QpOptions {
  // Send queue entries for the caller's work requests. Default 64. One more
  // entry is reserved for the drain marker.
  uint32_t max_send_wr = 64;
  // Receive queue entries. Default 64.
  uint32_t max_recv_wr = 64;
  // Inline data size for SENDs. Default 0.
  uint32_t max_inline_data = 0;
  // What the REMOTE side may do through this QP (qp_access_flags). Default
  // IBV_ACCESS_REMOTE_READ (a server QP serving READs; harmless on a client).
  int remote_access = IBV_ACCESS_REMOTE_READ;
  // Local ACK timeout exponent: 4.096 us * 2^timeout per try. Default 12
  // (~16.8 ms). Set on RTR->RTS only.
  uint8_t timeout = 12;
  // Transport retries. Default 2: a dead peer fails the first READ with
  // IBV_WC_RETRY_EXC_ERR after ~61 ms on rxe. 7 means FOREVER on rxe.
  uint8_t retry_cnt = 2;
  // RNR retries (receiver had no RECV posted). Default 3; 7 means forever.
  uint8_t rnr_retry = 3;
  // RNR NAK timer code for our receive side. Default 12 (0.64 ms).
  uint8_t min_rnr_timer = 12;
  // READs we may have outstanding as requester. Default 16, clamped to the
  // device's max_qp_init_rd_atom... more READs than this still post fine,
  // the device queues them.
  uint8_t max_rd_atomic = 16;
  // READs the peer may have outstanding against us. Default 16, clamped to
  // the device's max_qp_rd_atom.
  uint8_t max_dest_rd_atomic = 16;
  // Path MTU. Default 0: min(our active MTU, peer's).
  uint8_t path_mtu = 0;
  // GRH hop limit. Default 64.
  uint8_t hop_limit = 64;
  // Default "qp".
  std::string label = "qp";

  [[nodiscard]] absl::Status Validate() const;
};

// A range of a registered buffer, addressed by offset into the Mr.
struct LocalBuf {
  Mr* mr = nullptr;  // must outlive the call; the posted WR pins it
  uint64_t offset = 0;
  uint32_t length = 0;
};

class Qp {
 public:
  // send_cq and recv_cq may be the same Cq.
  static absl::StatusOr<std::unique_ptr<Qp>> Create(std::shared_ptr<Pd> pd,
                                                    std::shared_ptr<Cq> send_cq,
                                                    std::shared_ptr<Cq> recv_cq,
                                                    QpOptions options = {});
  ~Qp();
  Qp(const Qp&) = delete;
  Qp& operator=(const Qp&) = delete;

  // --- connection ------------------------------------------------------------
  // What the peer needs to connect to us.
  PeerInfo LocalInfo() const;
  // RESET->INIT->RTR->RTS.
  [[nodiscard]] absl::Status Connect(const PeerInfo& remote);
  [[nodiscard]] absl::Status ToInit();
  [[nodiscard]] absl::Status ToRtr(const PeerInfo& remote);
  [[nodiscard]] absl::Status ToRts();
  // Any state -> ERR: outstanding work is flushed.
  [[nodiscard]] absl::Status ToError();
  // ibv_query_qp.
  absl::StatusOr<ibv_qp_state> QueryState() const;
  static const char* StateName(ibv_qp_state s);
  // True once a completion with an error status was polled for this QP (the
  // QP is in ERR then: reap it). Cheap, no device call.
  bool saw_error() const { return saw_error_; }

  // --- hot path (qp_datapath.cc) -----------------------------------------------
  // RDMA READ of `dst.length` bytes at remote (addr, rkey) into dst.
  // `pin_remote`: optional Mr of this process that the READ targets (tests,
  // loopback); it is pinned too. Errors: InvalidArgument (range outside the
  // Mr), kClosed (an Mr is being deregistered), kQueueFull, or the errno of
  // ibv_post_send.
  [[nodiscard]] absl::Status PostRead(uint64_t wr_id, const LocalBuf& dst, uint64_t remote_addr,
                                      uint32_t rkey, Mr* pin_remote = nullptr);
  // SEND of src (length may be 0 with src.mr null).
  [[nodiscard]] absl::Status PostSend(uint64_t wr_id, const LocalBuf& src);
  [[nodiscard]] absl::Status PostSendWithImm(uint64_t wr_id, const LocalBuf& src, uint32_t imm);
  // RECV into dst.
  [[nodiscard]] absl::Status PostRecv(uint64_t wr_id, const LocalBuf& dst);

  // --- memory windows (mw.h) ---------------------------------------------------
  // Binds `mw` to [offset, offset+length) of `mr` (offset into the Mr, so
  // the window's remote address is mr.iova() + offset) with `access`
  // (e.g. IBV_ACCESS_REMOTE_READ). Type 2: an IBV_WR_BIND_MW on this QP;
  // the window then serves READs on this QP only. Type 1: ibv_bind_mw.
  // Returns the new rkey; the bind's completion carries `wr_id`.
  absl::StatusOr<uint32_t> PostBindMw(uint64_t wr_id, const std::shared_ptr<Mw>& mw,
                                      const std::shared_ptr<Mr>& mr, uint64_t offset,
                                      uint64_t length, int access);
  // Invalidates: LOCAL_INV for type 2, a zero-length bind for type 1 (rxe
  // segfaults on a bind with a null MR).
  [[nodiscard]] absl::Status PostInvalidateMw(uint64_t wr_id, const std::shared_ptr<Mw>& mw);

  // Polls this QP's CQs until the completion of `wr_id` arrives or the
  // deadline passes; other completions stay queued for Cq::Poll.
  absl::StatusOr<Completion> WaitFor(uint64_t wr_id, WrKind kind, Deadline deadline);

  // --- drain (like the kernel's ib_drain_qp) -----------------------------------
  // Moves the QP to ERR and waits until every work request posted before has
  // completed or flushed: a marker SEND on the reserved send entry must
  // flush, and the count of posted RECVs must reach zero (rxe never
  // completes a RECV marker posted after ERR, so receives are counted).
  //
  // The caller must:
  //  1. own the QP's thread and not post to the QP while draining;
  //  2. keep polling nothing else on these CQs meanwhile (Drain polls them;
  //     other QPs' completions are kept for the next Cq::Poll);
  //  3. treat the QP as dead afterwards (it stays in ERR): destroy it.
  // Completions of this QP seen while draining are appended to `completions`
  // (caller's wr_ids; flushed ones have IBV_WC_WR_FLUSH_ERR) if non-null.
  // At the deadline: DeadlineExceeded / kDrainTimeout with what is missing;
  // the pins stay (their MRs are still refused) until the QP is destroyed.
  [[nodiscard]] absl::Status Drain(Deadline deadline,
                                   std::vector<Completion>* completions = nullptr);

  uint32_t outstanding_sends() const { return outstanding_sends_; }
  uint32_t outstanding_recvs() const { return outstanding_recvs_; }
  // Free send entries for the caller (the marker's is not counted).
  uint32_t send_slots_free() const { return static_cast<uint32_t>(send_free_.size()); }
  uint32_t recv_slots_free() const { return static_cast<uint32_t>(recv_free_.size()); }

  ibv_qp* qp() const { return qp_; }
  uint32_t qp_num() const { return qp_->qp_num; }
  uint32_t psn() const { return psn_; }
  const std::string& label() const { return options_.label; }
  const std::shared_ptr<Pd>& pd() const { return pd_; }
  const std::shared_ptr<Cq>& send_cq() const { return send_cq_; }
  const std::shared_ptr<Cq>& recv_cq() const { return recv_cq_; }

 private:
  friend class Cq;
  friend class Mw;

  struct Slot {
    uint64_t user_wr_id = 0;
    MrRef pin;               // the local buffer
    MrRef pin_remote;        // optional
    std::shared_ptr<Mw> mw;  // bind/invalidate
    WrKind kind = WrKind::kRead;
  };

  static constexpr uint32_t kRecvBit = 1u << 31;
  static constexpr uint32_t kMarkerSlot = kRecvBit - 1;

  Qp() = default;
  uint64_t SendWrId(uint32_t slot) const { return (uint64_t{send_tag_} << 32) | slot; }
  uint64_t RecvWrId(uint32_t slot) const { return (uint64_t{recv_tag_} << 32) | kRecvBit | slot; }
  absl::Status PinLocal(const LocalBuf& b, MrRef* pin);
  absl::Status PostSendImpl(uint64_t wr_id, const LocalBuf& src, bool with_imm, uint32_t imm);
  // From Cq::Dispatch: fills `out`; false for the drain marker.
  bool OnCompletion(const ibv_wc& wc, Completion* out);
  void ReleaseWindowsLocked(std::vector<std::shared_ptr<Mr>>* released)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pd_->graph_mu());

  // Declared in creation order (released in reverse): PD and CQs outlive
  // the QP, slots (and their pins) are released after the QP is destroyed.
  std::shared_ptr<Pd> pd_;
  std::shared_ptr<Cq> send_cq_;
  std::shared_ptr<Cq> recv_cq_;
  std::vector<Slot> send_slots_;
  std::vector<Slot> recv_slots_;
  ibv_qp* qp_ = nullptr;
  QpOptions options_;
  uint32_t psn_ = 0;
  uint32_t send_tag_ = 0;  // Cq::Attach tag in send_cq_
  uint32_t recv_tag_ = 0;  // Cq::Attach tag in recv_cq_
  bool send_attached_ = false;
  bool recv_attached_ = false;
  std::vector<uint32_t> send_free_;
  std::vector<uint32_t> recv_free_;
  uint32_t outstanding_sends_ = 0;  // caller's WRs, marker excluded
  uint32_t outstanding_recvs_ = 0;
  bool marker_outstanding_ = false;
  bool saw_error_ = false;
  // Type-2 windows bound to this QP (links owned by Mw).
  std::vector<Mw*> windows_ ABSL_GUARDED_BY(pd_->graph_mu());
};

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_QP_H_
