// An opened verbs device: the ibv_context plus the port and GID it uses.
//
// Ownership: Device is held by std::shared_ptr. Every child (Pd, Cq, and
// through them Qp, Mr, Mw) holds a shared_ptr to its parent, so the context
// is closed only after the last child is destroyed: the wrong teardown order
// cannot be written.
//
// Thread safety: all const members may be called from any thread.
#ifndef KVNODE_RDMA_DEVICE_H_
#define KVNODE_RDMA_DEVICE_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvnode::rdma {

struct DeviceOptions {
  // Device name, e.g. "rxe0" or "mlx5_0". Default "": the first device whose
  // `port` is ACTIVE.
  std::string name;
  // Port number (1-based). Default 1.
  int port = 1;
  // GID index. Default -1: automatic. On RoCE the IPv4-mapped GID
  // (::ffff:a.b.c.d), RoCE v2 preferred (rxe on lo needs it); on InfiniBand
  // index 0 (addressing uses the LID).
  int gid_index = -1;

  [[nodiscard]] absl::Status Validate() const;
};

// What the device can do, as far as kvrdma cares.
struct DeviceCaps {
  bool mw_type1 = false;  // IBV_DEVICE_MEM_WINDOW
  bool mw_type2 = false;  // IBV_DEVICE_MEM_WINDOW_TYPE_2A or _2B
  int max_mw = 0;
  int max_qp_wr = 0;
  int max_sge = 0;
  int max_cqe = 0;
  int max_qp_rd_atom = 0;       // outstanding READs as requester, per QP
  int max_qp_init_rd_atom = 0;  // outstanding READs as responder, per QP
  uint64_t max_mr_size = 0;
  uint64_t page_size_cap = 0;
  bool odp = false;  // on-demand paging (rxe: no)
};

class Device {
 public:
  static absl::StatusOr<std::shared_ptr<Device>> Open(const DeviceOptions& options);

  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  ibv_context* context() const { return ctx_; }
  const std::string& name() const { return name_; }
  int port() const { return port_; }
  int gid_index() const { return gid_index_; }  // -1 on InfiniBand without GRH
  const ibv_gid& gid() const { return gid_; }
  uint16_t lid() const { return port_attr_.lid; }
  ibv_mtu active_mtu() const { return port_attr_.active_mtu; }
  bool is_roce() const { return port_attr_.link_layer == IBV_LINK_LAYER_ETHERNET; }
  const ibv_port_attr& port_attr() const { return port_attr_; }
  const DeviceCaps& caps() const { return caps_; }

  // Re-reads the port state (ACTIVE, DOWN, ...).
  absl::StatusOr<ibv_port_state> QueryPortState() const;

  // One pending asynchronous event (QP fatal, port change, ...) without
  // blocking, or nullopt. The event is acknowledged before returning.
  struct AsyncEvent {
    ibv_event_type type;
    uint32_t qp_num = 0;  // for QP events
  };
  std::optional<AsyncEvent> PollAsyncEvent() const;

 private:
  Device() = default;

  ibv_context* ctx_ = nullptr;
  std::string name_;
  int port_ = 1;
  int gid_index_ = -1;
  ibv_gid gid_{};
  ibv_port_attr port_attr_{};
  DeviceCaps caps_;
};

// "::ffff:127.0.0.1"-style rendering of a GID, for logs and messages.
std::string GidToString(const ibv_gid& gid);

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_DEVICE_H_
