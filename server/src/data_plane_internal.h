// Private parts of DataPlane shared by data_plane.cc and the hot path
// (data_plane_datapath.cc).
#ifndef KVNODE_SERVER_SRC_DATA_PLANE_INTERNAL_H_
#define KVNODE_SERVER_SRC_DATA_PLANE_INTERNAL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "data_plane.h"

namespace kvnode::server {

// wr_id layout: session serial (32 bits) | kind (8) | slot (24).
enum class WrTag : uint32_t { kRecv = 1, kSend = 2, kBind = 3 };
inline uint64_t MakeWrId(uint32_t serial, WrTag tag, uint32_t slot) {
  return (uint64_t{serial} << 32) | (uint64_t{static_cast<uint32_t>(tag)} << 24) |
         (slot & 0xffffff);
}
inline uint32_t WrSerial(uint64_t wr_id) { return static_cast<uint32_t>(wr_id >> 32); }
inline WrTag WrKindOf(uint64_t wr_id) { return static_cast<WrTag>((wr_id >> 24) & 0xff); }
inline uint32_t WrSlot(uint64_t wr_id) { return static_cast<uint32_t>(wr_id & 0xffffff); }

// One client session on the data plane. Owned by the data thread.
// Member order: the window is released before the QP it is bound to (the
// explicit teardown in DataPlane::Reap does it first anyway).
struct DataPlane::Session {
  uint64_t conn_id = 0;
  uint64_t client_id = 0;
  uint32_t serial = 0;
  uint32_t block = 0;  // index of this session's buffers in the pool
  std::string peer;
  ClientRecord* record = nullptr;
  uint32_t rkey = 0;
  bool connected = false;
  bool shard_map_feature = false;  // kFeatureShardMap negotiated
  uint64_t ops = 0;
  absl::Time created;
  std::vector<uint32_t> free_send;  // send buffer slots not in flight
  // Requests received while every send slot was in flight: (recv slot, bytes).
  std::deque<std::pair<uint32_t, uint32_t>> deferred;
  std::unique_ptr<rdma::Qp> qp;
  std::shared_ptr<rdma::Mw> mw;  // destroyed first (declared last)
};

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_SRC_DATA_PLANE_INTERNAL_H_
