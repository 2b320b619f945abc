#include "kvnode/rdma/device.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvnode/rdma/accounting.h"
#include "kvnode/rdma/errors.h"

namespace kvnode::rdma {
namespace {

struct DeviceListDeleter {
  void operator()(ibv_device** l) const { ibv_free_device_list(l); }
};

bool IsIpv4Mapped(const ibv_gid& gid) {
  static constexpr std::array<uint8_t, 12> kPrefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, kPrefix.data(), kPrefix.size()) == 0;
}

// The RoCE GID to use: IPv4-mapped, RoCE v2 preferred over v1. -1 if none.
int ChooseRoceGid(ibv_context* ctx, int port, int table_len) {
  int v1 = -1;
  for (int i = 0; i < table_len; ++i) {
    ibv_gid_entry entry{};
    if (ibv_query_gid_ex(ctx, port, i, &entry, 0) != 0) continue;
    ibv_gid gid{};
    std::memcpy(gid.raw, entry.gid.raw, sizeof(gid.raw));
    if (!IsIpv4Mapped(gid)) continue;
    if (entry.gid_type == IBV_GID_TYPE_ROCE_V2) return i;
    if (v1 < 0) v1 = i;
  }
  return v1;
}

}  // namespace

absl::Status DeviceOptions::Validate() const {
  if (port < 1 || port > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceOptions.port=", port, ": must be 1..255"));
  }
  if (gid_index < -1 || gid_index > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceOptions.gid_index=", gid_index, ": must be -1 (auto) or 0..255"));
  }
  return absl::OkStatus();
}

std::string GidToString(const ibv_gid& gid) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(AF_INET6, gid.raw, buf, sizeof(buf)) == nullptr) return "?";
  return buf;
}

absl::StatusOr<std::shared_ptr<Device>> Device::Open(const DeviceOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  int n = 0;
  std::unique_ptr<ibv_device*, DeviceListDeleter> list(ibv_get_device_list(&n));
  if (list == nullptr) return ErrnoStatus("ibv_get_device_list", errno);
  if (n == 0) return absl::NotFoundError("no verbs device found (ibv_get_device_list is empty)");

  std::string tried;
  for (int i = 0; i < n; ++i) {
    ibv_device* dev = list.get()[i];
    const char* name = ibv_get_device_name(dev);
    if (!options.name.empty() && options.name != name) continue;
    ibv_context* ctx = ibv_open_device(dev);
    if (ctx == nullptr) {
      absl::Status s = ErrnoStatus(absl::StrCat("ibv_open_device(", name, ")"), errno);
      if (!options.name.empty()) return s;
      absl::StrAppend(&tried, " ", name, ": ", s.message(), ";");
      continue;
    }
    std::shared_ptr<Device> d(new Device());
    d->ctx_ = ctx;
    d->name_ = name;
    d->port_ = options.port;
    Accounting::Created(ObjectKind::kDevice, d.get(), absl::StrCat(name, ":", options.port));
    if (int rc = ibv_query_port(ctx, options.port, &d->port_attr_); rc != 0) {
      absl::Status s =
          ErrnoStatus(absl::StrCat("ibv_query_port(", name, ", ", options.port, ")"), rc);
      if (!options.name.empty()) return s;
      absl::StrAppend(&tried, " ", name, ": ", s.message(), ";");
      continue;
    }
    if (d->port_attr_.state != IBV_PORT_ACTIVE) {
      std::string why = absl::StrCat(name, " port ", options.port, " is ",
                                     ibv_port_state_str(d->port_attr_.state), ", not ACTIVE");
      if (!options.name.empty()) return absl::UnavailableError(why);
      absl::StrAppend(&tried, " ", why, ";");
      continue;
    }
    ibv_device_attr_ex attr{};
    if (int rc = ibv_query_device_ex(ctx, nullptr, &attr); rc != 0) {
      return ErrnoStatus(absl::StrCat("ibv_query_device_ex(", name, ")"), rc);
    }
    const ibv_device_attr& a = attr.orig_attr;
    d->caps_.mw_type1 = (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW) != 0;
    d->caps_.mw_type2 =
        (a.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
    d->caps_.max_mw = a.max_mw;
    d->caps_.max_qp_wr = a.max_qp_wr;
    d->caps_.max_sge = a.max_sge;
    d->caps_.max_cqe = a.max_cqe;
    d->caps_.max_qp_rd_atom = a.max_qp_rd_atom;
    d->caps_.max_qp_init_rd_atom = a.max_qp_init_rd_atom;
    d->caps_.max_mr_size = a.max_mr_size;
    d->caps_.page_size_cap = a.page_size_cap;
    d->caps_.odp = (attr.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0;

    if (d->is_roce()) {
      d->gid_index_ = options.gid_index >= 0
                          ? options.gid_index
                          : ChooseRoceGid(ctx, options.port, d->port_attr_.gid_tbl_len);
      if (d->gid_index_ < 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            name, " port ", options.port,
            " is RoCE but has no IPv4-mapped GID; give the netdev an IPv4 address or set "
            "DeviceOptions.gid_index"));
      }
    } else {
      d->gid_index_ = options.gid_index >= 0 ? options.gid_index : 0;
    }
    if (int rc = ibv_query_gid(ctx, options.port, d->gid_index_, &d->gid_); rc != 0) {
      return ErrnoStatus(absl::StrCat("ibv_query_gid(", name, ", index ", d->gid_index_, ")"), rc);
    }
    // Async events are read without blocking (PollAsyncEvent).
    int flags = fcntl(ctx->async_fd, F_GETFL);
    if (flags < 0 || fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
      return ErrnoStatus("fcntl(async_fd, O_NONBLOCK)", errno);
    }
    VLOG(1) << "kvrdma: opened " << name << " port " << options.port << " gid_index "
            << d->gid_index_ << " gid " << GidToString(d->gid_);
    return d;
  }
  if (!options.name.empty()) {
    return absl::NotFoundError(absl::StrCat("no verbs device named '", options.name, "'"));
  }
  return absl::NotFoundError(
      absl::StrCat("no verbs device has an ACTIVE port ", options.port, ":", tried));
}

Device::~Device() {
  if (ctx_ == nullptr) return;
  if (int rc = ibv_close_device(ctx_); rc != 0) {
    Accounting::DestroyFailed(ObjectKind::kDevice, this, std::strerror(errno));
    return;
  }
  Accounting::Destroyed(ObjectKind::kDevice, this);
}

absl::StatusOr<ibv_port_state> Device::QueryPortState() const {
  ibv_port_attr attr{};
  if (int rc = ibv_query_port(ctx_, port_, &attr); rc != 0) {
    return ErrnoStatus(absl::StrCat("ibv_query_port(", name_, ")"), rc);
  }
  return attr.state;
}

std::optional<Device::AsyncEvent> Device::PollAsyncEvent() const {
  ibv_async_event ev{};
  if (ibv_get_async_event(ctx_, &ev) != 0) return std::nullopt;  // EAGAIN: none
  AsyncEvent out{ev.event_type, 0};
  switch (ev.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      out.qp_num = ev.element.qp != nullptr ? ev.element.qp->qp_num : 0;
      break;
    default:
      break;
  }
  ibv_ack_async_event(&ev);
  return out;
}

}  // namespace kvnode::rdma
