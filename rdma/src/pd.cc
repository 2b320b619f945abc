#include "kvnode/rdma/pd.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvnode/rdma/accounting.h"
#include "kvnode/rdma/errors.h"

namespace kvnode::rdma {

absl::StatusOr<std::shared_ptr<Pd>> Pd::Create(std::shared_ptr<Device> device, std::string label) {
  if (device == nullptr) return absl::InvalidArgumentError("Pd::Create: null device");
  ibv_pd* raw = ibv_alloc_pd(device->context());
  if (raw == nullptr) return ErrnoStatus(absl::StrCat("ibv_alloc_pd on ", device->name()), errno);
  std::shared_ptr<Pd> pd(new Pd());
  pd->device_ = std::move(device);
  pd->pd_ = raw;
  pd->label_ = std::move(label);
  Accounting::Created(ObjectKind::kPd, pd.get(), pd->label_);
  return pd;
}

Pd::~Pd() {
  if (pd_ == nullptr) return;
  if (int rc = ibv_dealloc_pd(pd_); rc != 0) {
    Accounting::DestroyFailed(ObjectKind::kPd, this, std::strerror(rc));
    return;
  }
  Accounting::Destroyed(ObjectKind::kPd, this);
}

}  // namespace kvnode::rdma
