// Hot path: posting work requests and translating their completions. No
// virtual calls, no locks (MR pins are atomics); window bookkeeping, which
// takes the PD's graph lock, happens only for bind/invalidate completions.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvnode/rdma/qp.h"

namespace kvnode::rdma {
namespace {

absl::Status QueueFull(const std::string& label, const char* which) {
  return WithKind(absl::ResourceExhaustedError(absl::StrCat("QP '", label, "': ", which,
                                                            " queue full; poll completions first")),
                  RdmaErrorKind::kQueueFull);
}

}  // namespace

absl::Status Qp::PinLocal(const LocalBuf& b, MrRef* pin) {
  if (b.mr == nullptr) {
    if (b.length != 0) return absl::InvalidArgumentError("LocalBuf without an Mr");
    return absl::OkStatus();
  }
  if (!b.mr->Contains(b.offset, b.length)) {
    return absl::InvalidArgumentError(absl::StrCat("QP '", options_.label, "': [", b.offset, ", +",
                                                   b.length, ") outside MR '", b.mr->label(),
                                                   "' of ", b.mr->length(), " bytes"));
  }
  if (!b.mr->TryPin(Mr::kWrUnit)) {
    return WithKind(absl::FailedPreconditionError(
                        absl::StrCat("QP '", options_.label, "': MR '", b.mr->label(),
                                     "' is being deregistered; no new work request may name it")),
                    RdmaErrorKind::kClosed);
  }
  *pin = MrRef(b.mr->shared_from_this(), Mr::kWrUnit);
  return absl::OkStatus();
}

absl::Status Qp::PostRead(uint64_t wr_id, const LocalBuf& dst, uint64_t remote_addr, uint32_t rkey,
                          Mr* pin_remote) {
  if (send_free_.empty()) return QueueFull(options_.label, "send");
  if (dst.mr == nullptr) return absl::InvalidArgumentError("PostRead: destination without an Mr");
  const uint32_t idx = send_free_.back();
  Slot& s = send_slots_[idx];
  if (absl::Status st = PinLocal(dst, &s.pin); !st.ok()) return st;
  if (pin_remote != nullptr) {
    if (!pin_remote->TryPin(Mr::kWrUnit)) {
      s.pin.Release();
      return WithKind(absl::FailedPreconditionError(
                          absl::StrCat("QP '", options_.label, "': remote MR '",
                                       pin_remote->label(), "' is being deregistered")),
                      RdmaErrorKind::kClosed);
    }
    s.pin_remote = MrRef(pin_remote->shared_from_this(), Mr::kWrUnit);
  }
  ibv_sge sge{dst.mr->iova() + dst.offset, dst.length, dst.mr->lkey()};
  ibv_send_wr wr{};
  wr.wr_id = SendWrId(idx);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    s.pin.Release();
    s.pin_remote.Release();
    return ErrnoStatus(absl::StrCat("ibv_post_send(READ) on QP '", options_.label, "'"), rc);
  }
  s.user_wr_id = wr_id;
  s.kind = WrKind::kRead;
  s.signaled = true;
  send_free_.pop_back();
  PushPosted(idx);
  ++outstanding_sends_;
  return absl::OkStatus();
}

template <typename Fill>
absl::StatusOr<size_t> Qp::PostChain(size_t count, const char* what, Fill fill) {
  if (count == 0) return size_t{0};
  if (send_free_.empty()) return QueueFull(options_.label, "send");
  const size_t n = std::min(count, send_free_.size());
  const size_t top = send_free_.size();
  // Slot of the i-th WR: taken from the top of the free stack downwards,
  // popped only once posted.
  auto slot_of = [&](size_t i) { return send_free_[top - 1 - i]; };
  for (size_t i = 0; i < n; ++i) {
    const uint32_t idx = slot_of(i);
    ibv_send_wr& wr = chain_wrs_[idx];
    if (absl::Status st = fill(i, wr, chain_sges_[idx], send_slots_[idx]); !st.ok()) {
      for (size_t j = 0; j < i; ++j) send_slots_[slot_of(j)].pin.Release();
      return st;
    }
    if (i + 1 == n) wr.send_flags |= IBV_SEND_SIGNALED;
    wr.next = i + 1 == n ? nullptr : &chain_wrs_[slot_of(i + 1)];
  }
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp_, &chain_wrs_[slot_of(0)], &bad);
  size_t posted = n;
  if (rc != 0) {
    posted = 0;
    for (ibv_send_wr* w = &chain_wrs_[slot_of(0)]; w != nullptr && w != bad; w = w->next) ++posted;
    for (size_t i = posted; i < n; ++i) send_slots_[slot_of(i)].pin.Release();
  }
  for (size_t i = 0; i < posted; ++i) {
    const uint32_t idx = slot_of(i);
    send_slots_[idx].signaled = i + 1 == n;
    PushPosted(idx);
  }
  send_free_.resize(top - posted);
  outstanding_sends_ += static_cast<uint32_t>(posted);
  if (posted == 0) {
    return ErrnoStatus(
        absl::StrCat("ibv_post_send(", what, " chain of ", n, ") on QP '", options_.label, "'"),
        rc);
  }
  return posted;
}

absl::StatusOr<size_t> Qp::PostReads(std::span<const ReadWr> reads) {
  return PostChain(reads.size(), "READ",
                   [&](size_t i, ibv_send_wr& wr, ibv_sge& sge, Slot& s) -> absl::Status {
                     const ReadWr& r = reads[i];
                     if (r.dst.mr == nullptr) {
                       return absl::InvalidArgumentError("PostReads: destination without an Mr");
                     }
                     if (absl::Status st = PinLocal(r.dst, &s.pin); !st.ok()) return st;
                     sge = {r.dst.mr->iova() + r.dst.offset, r.dst.length, r.dst.mr->lkey()};
                     wr.num_sge = 1;
                     wr.opcode = IBV_WR_RDMA_READ;
                     wr.send_flags = 0;
                     wr.wr.rdma.remote_addr = r.remote_addr;
                     wr.wr.rdma.rkey = r.rkey;
                     s.user_wr_id = r.wr_id;
                     s.kind = WrKind::kRead;
                     return absl::OkStatus();
                   });
}

absl::StatusOr<size_t> Qp::PostSends(std::span<const SendWr> sends) {
  return PostChain(
      sends.size(), "SEND", [&](size_t i, ibv_send_wr& wr, ibv_sge& sge, Slot& s) -> absl::Status {
        const LocalBuf& src = sends[i].src;
        if (absl::Status st = PinLocal(src, &s.pin); !st.ok()) return st;
        const bool data = src.mr != nullptr && src.length > 0;
        if (data) sge = {src.mr->iova() + src.offset, src.length, src.mr->lkey()};
        wr.num_sge = data ? 1 : 0;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = options_.max_inline_data > 0 && src.length <= options_.max_inline_data
                            ? IBV_SEND_INLINE
                            : 0;
        s.user_wr_id = sends[i].wr_id;
        s.kind = WrKind::kSend;
        return absl::OkStatus();
      });
}

void Qp::PushPosted(uint32_t slot) {
  send_fifo_[(fifo_head_ + fifo_count_) % send_fifo_.size()] = slot;
  ++fifo_count_;
}

void Qp::RetireBefore(uint32_t slot, ibv_wc_status status, std::vector<Completion>* retired) {
  while (fifo_count_ > 0) {
    const uint32_t front = send_fifo_[fifo_head_];
    fifo_head_ = (fifo_head_ + 1) % static_cast<uint32_t>(send_fifo_.size());
    --fifo_count_;
    if (front == slot) return;
    // Posted before `slot` and not completed on its own: unsignaled, and
    // finished when `slot` did (the send queue completes in order).
    Completion c;
    FinishSlot(false, front, &c);
    c.status = status == IBV_WC_SUCCESS ? IBV_WC_SUCCESS : IBV_WC_WR_FLUSH_ERR;
    c.qp_num = qp_->qp_num;
    retired->push_back(c);
  }
}

void Qp::FinishSlot(bool recv, uint32_t idx, Completion* out) {
  Slot& s = (recv ? recv_slots_ : send_slots_)[idx];
  out->wr_id = s.user_wr_id;
  out->kind = s.kind;
  out->qp = this;
  s.pin.Release();
  s.pin_remote.Release();
  s.signaled = true;
  if (recv) {
    recv_free_.push_back(idx);
    --outstanding_recvs_;
  } else {
    send_free_.push_back(idx);
    --outstanding_sends_;
  }
}

absl::Status Qp::PostSend(uint64_t wr_id, const LocalBuf& src) {
  const SendWr send{wr_id, src};
  return PostSends({&send, 1}).status();
}

absl::Status Qp::PostRecv(uint64_t wr_id, const LocalBuf& dst) {
  if (recv_free_.empty()) return QueueFull(options_.label, "receive");
  const uint32_t idx = recv_free_.back();
  Slot& s = recv_slots_[idx];
  if (absl::Status st = PinLocal(dst, &s.pin); !st.ok()) return st;
  ibv_sge sge{};
  ibv_recv_wr wr{};
  if (dst.mr != nullptr && dst.length > 0) {
    sge = {dst.mr->iova() + dst.offset, dst.length, dst.mr->lkey()};
    wr.sg_list = &sge;
    wr.num_sge = 1;
  }
  wr.wr_id = RecvWrId(idx);
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(qp_, &wr, &bad); rc != 0) {
    s.pin.Release();
    return ErrnoStatus(absl::StrCat("ibv_post_recv on QP '", options_.label, "'"), rc);
  }
  s.user_wr_id = wr_id;
  s.kind = WrKind::kRecv;
  recv_free_.pop_back();
  ++outstanding_recvs_;
  return absl::OkStatus();
}

bool Qp::OnCompletion(const ibv_wc& wc, Completion* out, std::vector<Completion>* retired) {
  const uint32_t low = static_cast<uint32_t>(wc.wr_id);
  const bool recv = (low & kRecvBit) != 0;
  const uint32_t idx = low & ~kRecvBit;
  if (wc.status != IBV_WC_SUCCESS) saw_error_ = true;
  if (!recv && idx == kMarkerSlot) {
    // Everything posted before the marker has finished: what did not
    // complete on its own is retired here (rule 4a), flushed.
    RetireBefore(kMarkerSlot, IBV_WC_WR_FLUSH_ERR, retired);
    marker_outstanding_ = false;
    return false;
  }
  std::vector<Slot>& slots = recv ? recv_slots_ : send_slots_;
  if (idx >= slots.size()) return false;  // cannot happen for our own wr_ids
  if (!recv) RetireBefore(idx, wc.status, retired);
  Slot& s = slots[idx];
  if (s.mw != nullptr) {
    // Rule 3 of mw.h: a failed bind leaves the window unbound; a successful
    // invalidation unbinds it.
    const bool unbind = (s.kind == WrKind::kBindMw && wc.status != IBV_WC_SUCCESS) ||
                        (s.kind == WrKind::kInvalidateMw && wc.status == IBV_WC_SUCCESS);
    if (unbind) {
      std::shared_ptr<Mr> released;
      {
        absl::MutexLock g(&pd_->graph_mu());
        s.mw->pd_->graph_mu().AssertHeld();  // same Pd, same lock (PostBindMw checks)
        s.mw->UnlinkLocked(&released);
      }
    }
    s.mw.reset();
  }
  out->status = wc.status;
  out->byte_len = wc.byte_len;
  out->qp_num = wc.qp_num;
  out->with_imm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0;
  out->imm_data = out->with_imm ? be32toh(wc.imm_data) : 0;
  out->vendor_err = wc.vendor_err;
  FinishSlot(recv, idx, out);
  return true;
}

absl::StatusOr<uint32_t> Qp::PostBindMw(uint64_t wr_id, const std::shared_ptr<Mw>& mw,
                                        const std::shared_ptr<Mr>& mr, uint64_t offset,
                                        uint64_t length, int access) {
  if (mw == nullptr || mr == nullptr) return absl::InvalidArgumentError("PostBindMw: null mw/mr");
  if (mw->pd_ != pd_ || mr->pd() != pd_) {
    return absl::InvalidArgumentError("PostBindMw: window, MR and QP must share one PD");
  }
  if (!mr->Contains(offset, length) || length == 0) {
    return absl::InvalidArgumentError(absl::StrCat("PostBindMw: [", offset, ", +", length,
                                                   ") empty or outside MR '", mr->label(), "'"));
  }
  if ((mr->access() & IBV_ACCESS_MW_BIND) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PostBindMw: MR '", mr->label(), "' was registered without MW_BIND"));
  }
  if (send_free_.empty()) return QueueFull(options_.label, "send");
  if (mr->closed()) {
    return WithKind(absl::FailedPreconditionError(
                        absl::StrCat("PostBindMw: MR '", mr->label(), "' is being deregistered")),
                    RdmaErrorKind::kClosed);
  }
  const uint32_t idx = send_free_.back();
  Slot& s = send_slots_[idx];
  uint32_t new_rkey = 0;
  absl::MutexLock g(&pd_->graph_mu());
  mw->pd_->graph_mu().AssertHeld();  // the same lock: one Pd (checked above)
  mr->pd_->graph_mu().AssertHeld();
  if (mw->mw_ == nullptr) {
    return WithKind(absl::FailedPreconditionError(
                        absl::StrCat("PostBindMw: window '", mw->label(), "' was deallocated")),
                    RdmaErrorKind::kClosed);
  }
  if (mw->state_ == Mw::State::kBound) {
    return absl::FailedPreconditionError(
        absl::StrCat("PostBindMw: window '", mw->label(), "' is bound; invalidate it first"));
  }
  if (mw->type_ == MwType::kType2) {
    new_rkey = ibv_inc_rkey(mw->rkey());
    ibv_send_wr wr{};
    wr.wr_id = SendWrId(idx);
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw->mw_;
    wr.bind_mw.rkey = new_rkey;
    wr.bind_mw.bind_info.mr = mr->mr_;
    wr.bind_mw.bind_info.addr = mr->iova() + offset;
    wr.bind_mw.bind_info.length = length;
    wr.bind_mw.bind_info.mw_access_flags = static_cast<unsigned>(access);
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
      return ErrnoStatus(absl::StrCat("ibv_post_send(BIND_MW '", mw->label(), "')"), rc);
    }
    mw->qp_ = this;
    windows_.push_back(mw.get());
  } else {
    ibv_mw_bind bind{};
    bind.wr_id = SendWrId(idx);
    bind.send_flags = IBV_SEND_SIGNALED;
    bind.bind_info.mr = mr->mr_;
    bind.bind_info.addr = mr->iova() + offset;
    bind.bind_info.length = length;
    bind.bind_info.mw_access_flags = static_cast<unsigned>(access);
    if (int rc = ibv_bind_mw(qp_, mw->mw_, &bind); rc != 0) {
      return ErrnoStatus(absl::StrCat("ibv_bind_mw('", mw->label(), "')"), rc);
    }
    new_rkey = mw->mw_->rkey;
  }
  mw->rkey_.store(new_rkey, std::memory_order_release);
  mw->state_ = Mw::State::kBound;
  mw->mr_ = mr;
  mr->windows_.push_back(mw.get());
  s.user_wr_id = wr_id;
  s.kind = WrKind::kBindMw;
  s.mw = mw;
  s.signaled = true;
  send_free_.pop_back();
  PushPosted(idx);
  ++outstanding_sends_;
  return new_rkey;
}

absl::Status Qp::PostInvalidateMw(uint64_t wr_id, const std::shared_ptr<Mw>& mw) {
  if (mw == nullptr) return absl::InvalidArgumentError("PostInvalidateMw: null mw");
  if (mw->pd_ != pd_) {
    return absl::InvalidArgumentError("PostInvalidateMw: window and QP must share one PD");
  }
  if (send_free_.empty()) return QueueFull(options_.label, "send");
  const uint32_t idx = send_free_.back();
  Slot& s = send_slots_[idx];
  absl::MutexLock g(&pd_->graph_mu());
  mw->pd_->graph_mu().AssertHeld();  // the same lock: one Pd (checked above)
  if (mw->mw_ == nullptr) {
    return WithKind(absl::FailedPreconditionError(absl::StrCat("PostInvalidateMw: window '",
                                                               mw->label(), "' was deallocated")),
                    RdmaErrorKind::kClosed);
  }
  if (mw->type_ == MwType::kType2) {
    ibv_send_wr wr{};
    wr.wr_id = SendWrId(idx);
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = mw->rkey();
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
      return ErrnoStatus(absl::StrCat("ibv_post_send(LOCAL_INV '", mw->label(), "')"), rc);
    }
  } else {
    if (mw->mr_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("PostInvalidateMw: type-1 window '",
                                                        mw->label(), "' is not bound to an MR"));
    }
    // Unbind = bind with the MR and length 0 (a null MR crashes librxe).
    ibv_mw_bind bind{};
    bind.wr_id = SendWrId(idx);
    bind.send_flags = IBV_SEND_SIGNALED;
    bind.bind_info.mr = mw->mr_->mr_;
    bind.bind_info.addr = mw->mr_->iova();
    bind.bind_info.length = 0;
    bind.bind_info.mw_access_flags = 0;
    if (int rc = ibv_bind_mw(qp_, mw->mw_, &bind); rc != 0) {
      return ErrnoStatus(absl::StrCat("ibv_bind_mw(unbind '", mw->label(), "')"), rc);
    }
    mw->rkey_.store(mw->mw_->rkey, std::memory_order_release);
  }
  s.user_wr_id = wr_id;
  s.kind = WrKind::kInvalidateMw;
  s.mw = mw;
  s.signaled = true;
  send_free_.pop_back();
  PushPosted(idx);
  ++outstanding_sends_;
  return absl::OkStatus();
}

}  // namespace kvnode::rdma
