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
  if (idx >= table_.size() || table_[idx].qp == nullptr || table_[idx].gen != gen) {
    ++stale_;
    return false;
  }
  return table_[idx].qp->OnCompletion(wc, out);
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
      if (Dispatch(wcs[i], &out[n])) ++n;
    }
    if (got < want) break;
  }
  return static_cast<int>(n);
}

absl::StatusOr<int> Cq::PollFor(const Qp* target, std::vector<Completion>* mine) {
  std::array<ibv_wc, kBatch> wcs;
  const int got = ibv_poll_cq(cq_, kBatch, wcs.data());
  if (got < 0) return absl::InternalError(absl::StrCat("ibv_poll_cq('", label_, "') failed"));
  for (int i = 0; i < got; ++i) {
    Completion c;
    if (!Dispatch(wcs[i], &c)) continue;
    if (c.qp == target && mine != nullptr) {
      mine->push_back(c);
    } else if (c.qp != target) {
      backlog_.push_back(c);
    }
  }
  return got;
}

}  // namespace kvnode::rdma
