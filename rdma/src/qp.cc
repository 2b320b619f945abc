#include "kvnode/rdma/qp.h"

#include <glog/logging.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kvnode/rdma/accounting.h"

namespace kvnode::rdma {
namespace {

uint32_t RandomPsn() {
  static thread_local std::mt19937 rng{std::random_device{}()};
  return rng() & 0xffffff;
}

}  // namespace

absl::Status QpOptions::Validate() const {
  if (max_send_wr < 1 || max_send_wr > (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("QpOptions.max_send_wr=", max_send_wr, ": must be 1..2^20"));
  }
  if (max_recv_wr > (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("QpOptions.max_recv_wr=", max_recv_wr, ": must be 0..2^20"));
  }
  if (timeout > 31) {
    return absl::InvalidArgumentError(absl::StrCat("QpOptions.timeout=", timeout, ": 0..31"));
  }
  if (retry_cnt > 7 || rnr_retry > 7) {
    return absl::InvalidArgumentError(
        absl::StrCat("QpOptions.retry_cnt=", retry_cnt, "/rnr_retry=", rnr_retry, ": 0..7"));
  }
  if (min_rnr_timer > 31) {
    return absl::InvalidArgumentError(
        absl::StrCat("QpOptions.min_rnr_timer=", min_rnr_timer, ": 0..31"));
  }
  if (path_mtu > IBV_MTU_4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("QpOptions.path_mtu=", path_mtu, ": 0 (auto) or an ibv_mtu 1..5"));
  }
  if (max_rd_atomic < 1 || max_dest_rd_atomic < 1) {
    return absl::InvalidArgumentError("QpOptions.max_rd_atomic/max_dest_rd_atomic must be >= 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Qp>> Qp::Create(std::shared_ptr<Pd> pd, std::shared_ptr<Cq> send_cq,
                                               std::shared_ptr<Cq> recv_cq, QpOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (pd == nullptr || send_cq == nullptr || recv_cq == nullptr) {
    return absl::InvalidArgumentError("Qp::Create: null pd or cq");
  }
  if (send_cq->device() != pd->device() || recv_cq->device() != pd->device()) {
    return absl::InvalidArgumentError("Qp::Create: PD and CQs belong to different devices");
  }
  const DeviceCaps& caps = pd->device()->caps();
  options.max_rd_atomic = static_cast<uint8_t>(
      std::min<int>(options.max_rd_atomic, std::max(1, caps.max_qp_init_rd_atom)));
  options.max_dest_rd_atomic = static_cast<uint8_t>(
      std::min<int>(options.max_dest_rd_atomic, std::max(1, caps.max_qp_rd_atom)));

  std::unique_ptr<Qp> qp(new Qp());
  qp->pd_ = std::move(pd);
  qp->send_cq_ = std::move(send_cq);
  qp->recv_cq_ = std::move(recv_cq);
  qp->options_ = std::move(options);
  const QpOptions& o = qp->options_;

  ibv_qp_init_attr init{};
  init.qp_context = qp.get();
  init.send_cq = qp->send_cq_->cq();
  init.recv_cq = qp->recv_cq_->cq();
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = o.max_send_wr + 1;  // +1: the drain marker
  init.cap.max_recv_wr = std::max<uint32_t>(o.max_recv_wr, 1);
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = o.max_inline_data;
  qp->qp_ = ibv_create_qp(qp->pd_->pd(), &init);
  if (qp->qp_ == nullptr) {
    return ErrnoStatus(absl::StrCat("ibv_create_qp('", o.label, "', send ", o.max_send_wr + 1,
                                    ", recv ", o.max_recv_wr, ")"),
                       errno);
  }
  Accounting::Created(ObjectKind::kQp, qp.get(),
                      absl::StrCat(o.label, " (qpn ", qp->qp_->qp_num, ")"));
  qp->psn_ = RandomPsn();

  qp->send_slots_.resize(o.max_send_wr);
  qp->recv_slots_.resize(o.max_recv_wr);
  for (uint32_t i = o.max_send_wr; i > 0; --i) qp->send_free_.push_back(i - 1);
  for (uint32_t i = o.max_recv_wr; i > 0; --i) qp->recv_free_.push_back(i - 1);

  absl::StatusOr<uint32_t> tag = qp->send_cq_->Attach(qp.get());
  if (!tag.ok()) return tag.status();
  qp->send_tag_ = *tag;
  qp->send_attached_ = true;
  if (qp->recv_cq_ == qp->send_cq_) {
    qp->recv_tag_ = qp->send_tag_;
  } else {
    tag = qp->recv_cq_->Attach(qp.get());
    if (!tag.ok()) return tag.status();
    qp->recv_tag_ = *tag;
    qp->recv_attached_ = true;
  }
  qp->send_fifo_.resize(o.max_send_wr);
  qp->chain_wrs_.resize(o.max_send_wr);
  qp->chain_sges_.resize(o.max_send_wr);
  for (uint32_t i = 0; i < o.max_send_wr; ++i) {
    ibv_send_wr& wr = qp->chain_wrs_[i];
    wr = ibv_send_wr{};
    wr.wr_id = qp->SendWrId(i);
    wr.sg_list = &qp->chain_sges_[i];
  }
  return qp;
}

Qp::~Qp() {
  if (qp_ != nullptr) {
    // (1) Windows before their QP: rxe blocks ~50 s in destroy_qp otherwise.
    std::vector<std::shared_ptr<Mr>> released;
    {
      absl::MutexLock g(&pd_->graph_mu());
      ReleaseWindowsLocked(&released);
    }
    released.clear();
    if (outstanding_sends_ + outstanding_recvs_ > 0) {
      Accounting::UndrainedDestroy();
      LOG(WARNING) << "kvrdma: destroying QP '" << options_.label << "' (qpn " << qp_->qp_num
                   << ") with " << outstanding_sends_ << " sends and " << outstanding_recvs_
                   << " receives outstanding: call Drain() first";
    }
    // (2) The QP.
    if (int rc = ibv_destroy_qp(qp_); rc != 0) {
      Accounting::DestroyFailed(ObjectKind::kQp, this, std::strerror(rc));
      // The device may still use the buffers: keep their pins forever.
      auto* leaked = new std::vector<Slot>();
      for (auto& s : send_slots_) leaked->push_back(std::move(s));
      for (auto& s : recv_slots_) leaked->push_back(std::move(s));
    } else {
      Accounting::Destroyed(ObjectKind::kQp, this);
    }
  }
  // (4) Completions still queued for this QP become stale.
  if (send_attached_) send_cq_->Detach(send_tag_);
  if (recv_attached_) recv_cq_->Detach(recv_tag_);
  // (3) Slots, and with them the pins, are released by member destruction.
}

void Qp::ReleaseWindowsLocked(std::vector<std::shared_ptr<Mr>>* released) {
  while (!windows_.empty()) {
    Mw* w = windows_.back();
    w->pd_->graph_mu().AssertHeld();  // same Pd, same lock (PostBindMw checks)
    absl::Status s = w->DeallocLocked();
    if (!s.ok()) {
      LOG(ERROR) << "kvrdma: QP '" << options_.label << "': deallocating bound window '"
                 << w->label() << "' before destroying the QP failed: " << s;
    }
    std::shared_ptr<Mr> link;
    w->UnlinkLocked(&link);  // erases w from windows_
    if (link) released->push_back(std::move(link));
  }
}

PeerInfo Qp::LocalInfo() const {
  PeerInfo p;
  const Device& d = *pd_->device();
  p.qp_num = qp_->qp_num;
  p.psn = psn_;
  std::memcpy(p.gid, d.gid().raw, sizeof(p.gid));
  p.lid = d.lid();
  p.port = static_cast<uint8_t>(d.port());
  p.mtu = static_cast<uint8_t>(d.active_mtu());
  p.use_grh = d.is_roce() ? 1 : 0;
  return p;
}

const char* Qp::StateName(ibv_qp_state s) {
  switch (s) {
    case IBV_QPS_RESET:
      return "RESET";
    case IBV_QPS_INIT:
      return "INIT";
    case IBV_QPS_RTR:
      return "RTR";
    case IBV_QPS_RTS:
      return "RTS";
    case IBV_QPS_SQD:
      return "SQD";
    case IBV_QPS_SQE:
      return "SQE";
    case IBV_QPS_ERR:
      return "ERR";
    default:
      return "UNKNOWN";
  }
}

absl::StatusOr<ibv_qp_state> Qp::QueryState() const {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (int rc = ibv_query_qp(qp_, &attr, IBV_QP_STATE, &init); rc != 0) {
    return ErrnoStatus(absl::StrCat("ibv_query_qp('", options_.label, "')"), rc);
  }
  return attr.qp_state;
}

absl::Status Qp::ToInit() {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(pd_->device()->port());
  a.qp_access_flags = static_cast<unsigned>(options_.remote_access);
  if (int rc = ibv_modify_qp(qp_, &a,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      rc != 0) {
    return ErrnoStatus(absl::StrCat("QP '", options_.label, "' RESET->INIT"), rc);
  }
  return absl::OkStatus();
}

absl::Status Qp::ToRtr(const PeerInfo& remote) {
  const Device& d = *pd_->device();
  if (remote.qp_num == 0 || remote.qp_num > 0xffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("QP '", options_.label, "': peer QPN ", remote.qp_num, " out of range"));
  }
  if (remote.mtu < IBV_MTU_256 || remote.mtu > IBV_MTU_4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("QP '", options_.label, "': peer MTU code ", remote.mtu, " out of range"));
  }
  if (d.is_roce() && !remote.use_grh) {
    return absl::InvalidArgumentError(
        absl::StrCat("QP '", options_.label, "': RoCE needs the peer's GID (use_grh=0 given)"));
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(
      options_.path_mtu != 0 ? options_.path_mtu : std::min<int>(d.active_mtu(), remote.mtu));
  a.dest_qp_num = remote.qp_num;
  a.rq_psn = remote.psn & 0xffffff;
  a.max_dest_rd_atomic = options_.max_dest_rd_atomic;
  a.min_rnr_timer = options_.min_rnr_timer;
  a.ah_attr.port_num = static_cast<uint8_t>(d.port());
  a.ah_attr.dlid = remote.lid;
  if (remote.use_grh) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, sizeof(remote.gid));
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(d.gid_index());
    a.ah_attr.grh.hop_limit = options_.hop_limit;
  }
  if (int rc = ibv_modify_qp(qp_, &a,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      rc != 0) {
    return ErrnoStatus(
        absl::StrCat("QP '", options_.label, "' INIT->RTR to peer QPN ", remote.qp_num), rc);
  }
  return absl::OkStatus();
}

absl::Status Qp::ToRts() {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = psn_;
  a.timeout = options_.timeout;
  a.retry_cnt = options_.retry_cnt;
  a.rnr_retry = options_.rnr_retry;
  a.max_rd_atomic = options_.max_rd_atomic;
  if (int rc = ibv_modify_qp(qp_, &a,
                             IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                 IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
      rc != 0) {
    return ErrnoStatus(absl::StrCat("QP '", options_.label, "' RTR->RTS"), rc);
  }
  return absl::OkStatus();
}

absl::Status Qp::Connect(const PeerInfo& remote) {
  if (absl::Status s = ToInit(); !s.ok()) return s;
  if (absl::Status s = ToRtr(remote); !s.ok()) return s;
  return ToRts();
}

absl::Status Qp::ToError() {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (int rc = ibv_modify_qp(qp_, &a, IBV_QP_STATE); rc != 0) {
    return ErrnoStatus(absl::StrCat("QP '", options_.label, "' -> ERR"), rc);
  }
  return absl::OkStatus();
}

absl::StatusOr<Completion> Qp::WaitFor(uint64_t wr_id, WrKind kind, Deadline deadline) {
  std::vector<Completion> mine;
  for (;;) {
    for (size_t i = 0; i < mine.size(); ++i) {
      if (mine[i].wr_id == wr_id && mine[i].kind == kind) {
        Completion c = mine[i];
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));
        // Give the others back, in order, ahead of anything newer.
        for (auto it = mine.rbegin(); it != mine.rend(); ++it) {
          Cq& cq = it->kind == WrKind::kRecv ? *recv_cq_ : *send_cq_;
          cq.backlog_.push_front(*it);
        }
        return c;
      }
    }
    // Look in the backlogs first (an earlier Drain/WaitFor may have kept it).
    for (Cq* cq : {send_cq_.get(), recv_cq_.get()}) {
      for (auto it = cq->backlog_.begin(); it != cq->backlog_.end(); ++it) {
        if (it->qp == this && it->wr_id == wr_id && it->kind == kind) {
          Completion c = *it;
          cq->backlog_.erase(it);
          for (auto m = mine.rbegin(); m != mine.rend(); ++m) {
            Cq& back = m->kind == WrKind::kRecv ? *recv_cq_ : *send_cq_;
            back.backlog_.push_front(*m);
          }
          return c;
        }
      }
    }
    int got = 0;
    for (Cq* cq : {send_cq_.get(), recv_cq_.get()}) {
      absl::StatusOr<int> n = cq->PollFor(this, &mine);
      if (!n.ok()) return n.status();
      got += *n;
      if (recv_cq_ == send_cq_) break;
    }
    if (got == 0) {
      if (Clock::now() >= deadline) {
        for (auto m = mine.rbegin(); m != mine.rend(); ++m) {
          Cq& back = m->kind == WrKind::kRecv ? *recv_cq_ : *send_cq_;
          back.backlog_.push_front(*m);
        }
        return absl::DeadlineExceededError(absl::StrCat("QP '", options_.label,
                                                        "': no completion for work request ", wr_id,
                                                        " by the deadline"));
      }
      std::this_thread::yield();
    }
  }
}

absl::Status Qp::Drain(Deadline deadline, std::vector<Completion>* completions) {
  absl::StatusOr<ibv_qp_state> state = QueryState();
  if (!state.ok()) return state.status();
  if (*state == IBV_QPS_RESET && outstanding_sends_ + outstanding_recvs_ == 0) {
    return absl::OkStatus();  // never used
  }
  if (*state != IBV_QPS_ERR) {
    if (absl::Status s = ToError(); !s.ok()) return s;
  }
  // The marker on the reserved entry. Everything posted before it has
  // completed or flushed once its flush completion is polled.
  if (!marker_outstanding_) {
    ibv_send_wr wr{};
    wr.wr_id = SendWrId(kMarkerSlot);
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
      // Some providers refuse posting in this state; the per-WR counts
      // still prove the drain.
      LOG(WARNING) << "kvrdma: QP '" << options_.label << "': drain marker not posted ("
                   << std::strerror(rc) << "); draining by counts only";
    } else {
      marker_outstanding_ = true;
    }
  }
  std::vector<Completion> mine;
  std::vector<Completion>* sink = completions != nullptr ? completions : &mine;
  // Completions of this QP an earlier WaitFor/Drain kept aside belong to the
  // caller too.
  for (Cq* cq : {send_cq_.get(), recv_cq_.get()}) {
    for (auto it = cq->backlog_.begin(); it != cq->backlog_.end();) {
      if (it->qp == this) {
        sink->push_back(*it);
        it = cq->backlog_.erase(it);
      } else {
        ++it;
      }
    }
    if (recv_cq_ == send_cq_) break;
  }
  for (;;) {
    if (!marker_outstanding_ && outstanding_sends_ == 0 && outstanding_recvs_ == 0) {
      return absl::OkStatus();
    }
    int got = 0;
    for (Cq* cq : {send_cq_.get(), recv_cq_.get()}) {
      absl::StatusOr<int> n = cq->PollFor(this, sink);
      if (!n.ok()) return n.status();
      got += *n;
      if (recv_cq_ == send_cq_) break;
    }
    if (completions == nullptr) mine.clear();
    if (got == 0) {
      if (Clock::now() >= deadline) {
        return WithKind(absl::DeadlineExceededError(absl::StrCat(
                            "drain of QP '", options_.label, "' (qpn ", qp_->qp_num,
                            ") not finished by its deadline: ", outstanding_sends_, " send(s) and ",
                            outstanding_recvs_, " receive(s) outstanding, marker ",
                            marker_outstanding_ ? "not yet flushed" : "done")),
                        RdmaErrorKind::kDrainTimeout);
      }
      std::this_thread::yield();
    }
  }
}

}  // namespace kvnode::rdma
