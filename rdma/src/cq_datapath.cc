// Hot path: polling and completion dispatch. No virtual calls, no locks
// (MR pins are atomics).
#include <array>

#include "absl/strings/str_cat.h"
#include "kvnode/rdma/cq.h"
#include "kvnode/rdma/qp.h"

namespace kvnode::rdma {
namespace {
constexpr int kBatch = 16;
}  // namespace

bool Cq::Dispatch(const ibv_wc& wc, Completion* out) {
  const uint32_t tag = static_cast<uint32_t>(wc.wr_id >> 32);
  const uint16_t idx = static_cast<uint16_t>(tag >> 16);
  const uint16_t gen = static_cast<uint16_t>(tag & 0xffff);
  retired_.clear();
  if (idx >= table_.size() || table_[idx].qp == nullptr || table_[idx].gen != gen) {
    ++stale_;
    return false;
  }
  return table_[idx].qp->OnCompletion(wc, out, &retired_);
}

absl::StatusOr<int> Cq::Poll(std::span<Completion> out) {
  size_t n = 0;
  while (n < out.size() && !backlog_.empty()) {
    out[n++] = backlog_.front();
    backlog_.pop_front();
  }
  std::array<ibv_wc, kBatch> wcs;
  while (n < out.size()) {
    const int want = static_cast<int>(std::min<size_t>(kBatch, out.size() - n));
    const int got = ibv_poll_cq(cq_, want, wcs.data());
    if (got < 0) return absl::InternalError(absl::StrCat("ibv_poll_cq('", label_, "') failed"));
    for (int i = 0; i < got; ++i) {
      Completion c;
      const bool own = Dispatch(wcs[i], &c);
      // Retired unsignaled work requests first (post order), then this one;
      // what does not fit waits in the backlog, in order.
      for (const Completion& r : retired_) {
        if (n < out.size() && backlog_.empty()) {
          out[n++] = r;
        } else {
          backlog_.push_back(r);
        }
      }
      if (own) {
        if (n < out.size() && backlog_.empty()) {
          out[n++] = c;
        } else {
          backlog_.push_back(c);
        }
      }
    }
    if (got < want || !backlog_.empty()) break;
  }
  return static_cast<int>(n);
}

absl::StatusOr<int> Cq::PollFor(const Qp* target, std::vector<Completion>* mine) {
  std::array<ibv_wc, kBatch> wcs;
  const int got = ibv_poll_cq(cq_, kBatch, wcs.data());
  if (got < 0) return absl::InternalError(absl::StrCat("ibv_poll_cq('", label_, "') failed"));
  auto route = [&](const Completion& c) {
    if (c.qp == target && mine != nullptr) {
      mine->push_back(c);
    } else if (c.qp != target) {
      backlog_.push_back(c);
    }
  };
  for (int i = 0; i < got; ++i) {
    Completion c;
    const bool own = Dispatch(wcs[i], &c);
    for (const Completion& r : retired_) route(r);
    if (own) route(c);
  }
  return got;
}

}  // namespace kvnode::rdma
