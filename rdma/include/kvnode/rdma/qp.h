// Reliable-connected queue pair with tracked work requests and drain.
//
// Threading: a Qp is owned and used by ONE thread, the same one that polls
// its CQs (cq.h). It takes no lock on the hot path (Post*, Poll). Only the
// MR pins it takes are atomic (Mr may be shared across threads).
//
// Tracking (docs/rdma.md rule 4): every work request posted here occupies a
// slot until its completion is polled. The slot holds an in-flight pin on
// each Mr it names, so SafeDeregister refuses those MRs until then. The
// wr_id on the wire encodes (CQ table index, generation, slot); Cq::Poll
// translates it back to the caller's wr_id.
//
// Unsignaled work requests (PostReads, PostSends; docs/rdma.md rule 4a):
// only the last WR of a chain asks the device for a completion. Send slots are kept in
// post order (send_fifo_): the send queue of an RC QP completes in order, so
// a completion polled for slot k also retires every slot posted before k
// that is still outstanding. Cq::Poll returns a Completion for each retired
// slot too (before k's, in post order), with k's status when k succeeded and
// IBV_WC_WR_FLUSH_ERR otherwise (its data is then not proven). A WR that
// fails, or is flushed, completes on its own whether signaled or not (the
// verbs spec; rxe does), and the drain marker's completion retires whatever
// is left: the drain and the pins of rule 4 hold as for signaled WRs.
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
#include <span>
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

// One READ of a chain for Qp::PostReads.
struct ReadWr {
  uint64_t wr_id = 0;  // the caller's, returned in its Completion
  LocalBuf dst;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
};

// One SEND of a chain for Qp::PostSends.
struct SendWr {
  uint64_t wr_id = 0;  // the caller's, returned in its Completion
  LocalBuf src;        // length may be 0 with src.mr null
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
  // Posts `reads` as one chain (one ibv_post_send) of which only the last
  // READ posted is signaled (rule 4a in the class comment). Posts the
  // longest prefix the free send entries allow and returns its length (0
  // only for an empty span). Errors (nothing posted): as PostRead, kQueueFull
  // when no entry is free. When the device refuses a WR in the middle of
  // the chain, the prefix before it stays posted without a signaled tail and
  // its length is returned: its completions arrive with the next signaled
  // completion or the drain; a caller seeing fewer posted than it asked and
  // entries free should treat the QP as broken and drain it.
  [[nodiscard]] absl::StatusOr<size_t> PostReads(std::span<const ReadWr> reads);
  // SEND of src (length may be 0 with src.mr null).
  [[nodiscard]] absl::Status PostSend(uint64_t wr_id, const LocalBuf& src);
  // Posts `sends` as one chain, only the last signaled: the contract of
  // PostReads. One doorbell for the chain (on rxe, one write() into the
  // kernel instead of one per SEND) and one completion to poll.
  [[nodiscard]] absl::StatusOr<size_t> PostSends(std::span<const SendWr> sends);
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
    bool signaled = true;
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
  // PostReads and PostSends: posts up to `count` WRs as one chain, the last
  // signaled. `fill(i, wr, sge, slot)` pins the i-th WR's buffer into its
  // slot and sets its opcode, gather entry, flags and the caller's wr_id.
  template <typename Fill>
  absl::StatusOr<size_t> PostChain(size_t count, const char* what, Fill fill);
  // From Cq::Dispatch: fills `out`; false for the drain marker. Appends the
  // completions of the unsignaled slots the completion retires (rule 4a) to
  // `retired`, in post order.
  bool OnCompletion(const ibv_wc& wc, Completion* out, std::vector<Completion>* retired);
  // Send slots in post order (rule 4a).
  void PushPosted(uint32_t slot);
  // Retires the posted slots before `slot` (all of them for kMarkerSlot),
  // then pops `slot` itself.
  void RetireBefore(uint32_t slot, ibv_wc_status status, std::vector<Completion>* retired);
  // Releases a finished send or receive slot and fills its completion.
  void FinishSlot(bool recv, uint32_t idx, Completion* out);
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
  // Posted send slots, oldest first: a ring of max_send_wr entries.
  std::vector<uint32_t> send_fifo_;
  uint32_t fifo_head_ = 0;
  uint32_t fifo_count_ = 0;
  // One prebuilt work request and its gather entry per send slot (wr_id and
  // sg_list fixed at creation): PostChain fills the rest.
  std::vector<ibv_send_wr> chain_wrs_;
  std::vector<ibv_sge> chain_sges_;
  uint32_t outstanding_sends_ = 0;  // caller's WRs, marker excluded
  uint32_t outstanding_recvs_ = 0;
  bool marker_outstanding_ = false;
  bool saw_error_ = false;
  // Type-2 windows bound to this QP (links owned by Mw).
  std::vector<Mw*> windows_ ABSL_GUARDED_BY(pd_->graph_mu());
};

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_QP_H_
