// Hot path: posting work requests and translating their completions. No
// virtual calls, no locks (MR pins are atomics); window bookkeeping, which
// takes the PD's graph lock, happens only for bind/invalidate completions.
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
  send_free_.pop_back();
  ++outstanding_sends_;
  return absl::OkStatus();
}

absl::Status Qp::PostSendImpl(uint64_t wr_id, const LocalBuf& src, bool with_imm, uint32_t imm) {
  if (send_free_.empty()) return QueueFull(options_.label, "send");
  const uint32_t idx = send_free_.back();
  Slot& s = send_slots_[idx];
  if (absl::Status st = PinLocal(src, &s.pin); !st.ok()) return st;
  ibv_sge sge{};
  ibv_send_wr wr{};
  if (src.mr != nullptr && src.length > 0) {
    sge = {src.mr->iova() + src.offset, src.length, src.mr->lkey()};
    wr.sg_list = &sge;
    wr.num_sge = 1;
  }
  wr.wr_id = SendWrId(idx);
  wr.opcode = with_imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (with_imm) wr.imm_data = htobe32(imm);
  if (options_.max_inline_data > 0 && src.length <= options_.max_inline_data) {
    wr.send_flags |= IBV_SEND_INLINE;
  }
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    s.pin.Release();
    return ErrnoStatus(absl::StrCat("ibv_post_send(SEND) on QP '", options_.label, "'"), rc);
  }
  s.user_wr_id = wr_id;
  s.kind = WrKind::kSend;
  send_free_.pop_back();
  ++outstanding_sends_;
  return absl::OkStatus();
}

absl::Status Qp::PostSend(uint64_t wr_id, const LocalBuf& src) {
  return PostSendImpl(wr_id, src, false, 0);
}

absl::Status Qp::PostSendWithImm(uint64_t wr_id, const LocalBuf& src, uint32_t imm) {
  return PostSendImpl(wr_id, src, true, imm);
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

bool Qp::OnCompletion(const ibv_wc& wc, Completion* out) {
  const uint32_t low = static_cast<uint32_t>(wc.wr_id);
  const bool recv = (low & kRecvBit) != 0;
  const uint32_t idx = low & ~kRecvBit;
  if (wc.status != IBV_WC_SUCCESS) saw_error_ = true;
  if (!recv && idx == kMarkerSlot) {
    marker_outstanding_ = false;
    return false;
  }
  std::vector<Slot>& slots = recv ? recv_slots_ : send_slots_;
  if (idx >= slots.size()) return false;  // cannot happen for our own wr_ids
  Slot& s = slots[idx];
  out->wr_id = s.user_wr_id;
  out->status = wc.status;
  out->kind = s.kind;
  out->byte_len = wc.byte_len;
  out->qp_num = wc.qp_num;
  out->with_imm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0;
  out->imm_data = out->with_imm ? be32toh(wc.imm_data) : 0;
  out->vendor_err = wc.vendor_err;
  out->qp = this;
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
  s.pin.Release();
  s.pin_remote.Release();
  if (recv) {
    recv_free_.push_back(idx);
    --outstanding_recvs_;
  } else {
    send_free_.push_back(idx);
    --outstanding_sends_;
  }
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
  send_free_.pop_back();
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
  send_free_.pop_back();
  ++outstanding_sends_;
  return absl::OkStatus();
}

}  // namespace kvnode::rdma
