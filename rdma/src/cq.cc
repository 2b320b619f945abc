#include "kvnode/rdma/cq.h"

#include <glog/logging.h>
#include <poll.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvnode/rdma/accounting.h"
#include "kvnode/rdma/qp.h"

namespace kvnode::rdma {

absl::Status Completion::ToStatus() const {
  return WcStatusToStatus(absl::StrCat("work request ", wr_id, " on QP ", qp_num), status,
                          vendor_err);
}

absl::Status CqOptions::Validate() const {
  if (depth < 1) {
    return absl::InvalidArgumentError(absl::StrCat("CqOptions.depth=", depth, ": must be >= 1"));
  }
  if (comp_vector < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CqOptions.comp_vector=", comp_vector, ": must be >= 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Cq>> Cq::Create(std::shared_ptr<Device> device, CqOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (device == nullptr) return absl::InvalidArgumentError("Cq::Create: null device");
  if (device->caps().max_cqe > 0 && options.depth > device->caps().max_cqe) {
    return absl::InvalidArgumentError(absl::StrCat("CqOptions.depth=", options.depth,
                                                   " exceeds the device's max_cqe ",
                                                   device->caps().max_cqe));
  }
  std::shared_ptr<Cq> cq(new Cq());
  cq->device_ = std::move(device);
  cq->label_ = std::move(options.label);
  ibv_context* ctx = cq->device_->context();
  if (options.with_channel) {
    cq->channel_ = ibv_create_comp_channel(ctx);
    if (cq->channel_ == nullptr) return ErrnoStatus("ibv_create_comp_channel", errno);
    Accounting::Created(ObjectKind::kCompChannel, cq->channel_, cq->label_);
  }
  cq->cq_ = ibv_create_cq(ctx, options.depth, cq.get(), cq->channel_, options.comp_vector);
  if (cq->cq_ == nullptr) {
    return ErrnoStatus(absl::StrCat("ibv_create_cq('", cq->label_, "', depth ", options.depth, ")"),
                       errno);
  }
  cq->depth_ = cq->cq_->cqe;
  Accounting::Created(ObjectKind::kCq, cq.get(), cq->label_);
  return cq;
}

Cq::~Cq() {
  if (cq_ != nullptr) {
    if (int rc = ibv_destroy_cq(cq_); rc != 0) {
      Accounting::DestroyFailed(ObjectKind::kCq, this, std::strerror(rc));
      return;  // the channel is still in use by the CQ: leave it too
    }
    Accounting::Destroyed(ObjectKind::kCq, this);
  }
  if (channel_ != nullptr) {
    if (int rc = ibv_destroy_comp_channel(channel_); rc != 0) {
      Accounting::DestroyFailed(ObjectKind::kCompChannel, channel_, std::strerror(errno));
      return;
    }
    Accounting::Destroyed(ObjectKind::kCompChannel, channel_);
  }
}

absl::StatusOr<uint32_t> Cq::Attach(Qp* qp) {
  uint16_t idx;
  if (!free_.empty()) {
    idx = free_.back();
    free_.pop_back();
  } else {
    if (table_.size() >= 0xffff) {
      return absl::ResourceExhaustedError(
          absl::StrCat("CQ '", label_, "' already serves 65535 QPs"));
    }
    idx = static_cast<uint16_t>(table_.size());
    table_.emplace_back();
  }
  Entry& e = table_[idx];
  e.qp = qp;
  ++e.gen;
  return (uint32_t{idx} << 16) | e.gen;
}

void Cq::Detach(uint32_t tag) {
  const uint16_t idx = static_cast<uint16_t>(tag >> 16);
  if (idx >= table_.size()) return;
  table_[idx].qp = nullptr;
  ++table_[idx].gen;  // completions still queued for the old QP are stale now
  free_.push_back(idx);
  // Completions of the detached QP already in the backlog would name a dead
  // Qp: drop them.
  for (auto it = backlog_.begin(); it != backlog_.end();) {
    if (it->qp != nullptr && ((it->qp->send_tag_ == tag && it->qp->send_cq_.get() == this) ||
                              (it->qp->recv_tag_ == tag && it->qp->recv_cq_.get() == this))) {
      it = backlog_.erase(it);
      ++stale_;
    } else {
      ++it;
    }
  }
}

absl::Status Cq::RequestNotify(bool solicited_only) {
  if (channel_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CQ '", label_, "' has no completion channel (CqOptions.with_channel)"));
  }
  if (int rc = ibv_req_notify_cq(cq_, solicited_only ? 1 : 0); rc != 0) {
    return ErrnoStatus(absl::StrCat("ibv_req_notify_cq('", label_, "')"), rc);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Cq::WaitForEvent(Deadline deadline) {
  if (channel_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CQ '", label_, "' has no completion channel (CqOptions.with_channel)"));
  }
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd pfd{channel_->fd, POLLIN, 0};
    int n = poll(&pfd, 1, left.count() > 0 ? static_cast<int>(left.count()) : 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("poll(completion channel)", errno);
    }
    if (n == 0) return false;
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    if (ibv_get_cq_event(channel_, &ev_cq, &ev_ctx) != 0) {
      return ErrnoStatus("ibv_get_cq_event", errno);
    }
    ibv_ack_cq_events(ev_cq, 1);
    return true;
  }
}

}  // namespace kvnode::rdma
