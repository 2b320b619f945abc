// Which slots of the cluster's shard map this node serves, as the serving
// path sees it. The node's cluster agent builds a ShardView from each map it
// learns (etcd, or the map persisted in the database directory) and
// Publish()es it on the ShardGate it passed in ServerOptions::shard_gate; the
// server never waits on etcd, it only reads the gate.
//
// Who reads what:
//   1. The data-plane thread checks every PUT/DELETE/RPC GET against the view
//      it holds. It re-reads the gate (Current(), one mutex) only when
//      version() — one atomic load per poll round — has moved since it last
//      looked, so the steady state takes no lock.
//   2. The control thread is woken by Publish() (the listener the server
//      installs) and pushes the new map to every ready session that
//      negotiated kFeatureShardMap.
//
// Thread safety: ShardView is immutable once built, shared by shared_ptr.
// ShardGate's methods may be called from any thread.
#ifndef KVNODE_SERVER_SHARD_GATE_H_
#define KVNODE_SERVER_SHARD_GATE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "kvnode/base/annotated_mutex.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::server {

// One shard map and this node's place in it. Owns() is a bit test into a
// bitset computed once at construction (at most kMaxSlots bits = 8 KiB), so
// the hot path never walks the ranges.
struct ShardView {
  // `self` is this node's index in map.nodes, or kNotInMap: a node the map
  // does not name owns no slot. `map` should be valid (map.Validate()); an
  // invalid one is tolerated (ranges out of bounds are clipped), never
  // trusted to index memory.
  ShardView(proto::ShardMap map, uint16_t self);

  static constexpr uint16_t kNotInMap = UINT16_MAX;

  // The view of node `node_id`: self = map.IndexOf(node_id), or kNotInMap.
  static std::shared_ptr<const ShardView> ForNode(proto::ShardMap map, std::string_view node_id);

  // True iff slot < map.num_slots and this node owns it.
  bool Owns(uint32_t slot) const {
    return slot < map.num_slots && (owned_[slot / 64] >> (slot % 64) & 1) != 0;
  }
  // Owns(SlotOf(key)); false for a map with no slots.
  bool OwnsKey(std::string_view key) const;
  // Number of slots this node owns (cluster_slots_owned).
  uint32_t slots_owned() const { return slots_owned_; }

  const proto::ShardMap map;
  const uint16_t self;

 private:
  std::vector<uint64_t> owned_;  // bit s set: slot s is ours
  uint32_t slots_owned_ = 0;
};

// Stores the slot words of `view` (docs/format.md "Slot words"):
// words[s] = 1 when view->Owns(s), else 0, for every s < proto::kMaxSlots
// (a null view owns nothing). Each byte is one release store, and a byte
// already right is not stored again: a slot whose ownership did not change
// is never seen flipping. The caller is the table's one writer (the
// data-plane thread, DataPlane::RefreshShardView). Returns how many bytes
// changed.
uint32_t StoreSlotWords(const ShardView* view, uint8_t* words);

// The current view, published by the cluster agent, read by the server.
// Created by the node before the Server and shared through
// ServerOptions::shard_gate; it outlives no one in particular (shared_ptr).
class ShardGate {
 public:
  ShardGate() = default;
  ShardGate(const ShardGate&) = delete;
  ShardGate& operator=(const ShardGate&) = delete;

  // Makes `view` current (null clears it: no map, nothing owned) and calls
  // the listener, which wakes the server's control loop. Any thread; never
  // blocks on the serving threads beyond the listener's short post.
  void Publish(std::shared_ptr<const ShardView> view);
  // The current view; null before the first Publish. Any thread.
  std::shared_ptr<const ShardView> Current() const;
  // Epoch of the current map; 0 when there is none. Any thread, lock-free.
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  // Bumped by every Publish (after Current() returns the new view): a
  // reader that cached Current() re-reads it when this has moved. Lock-free.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

  // The server installs its wake-up here at start and clears it (empty
  // function) before it goes away; Publish calls it under the gate's lock,
  // so once SetListener({}) returns the old listener is never called again.
  // It must not call back into the gate.
  void SetListener(std::function<void()> listener);

  // The epoch of the view whose slot words the data plane stored last, and
  // that it did (0 before; stats and tests wait on it). Any thread.
  void NoteSlotWords(uint64_t epoch) { slot_words_epoch_.store(epoch, std::memory_order_release); }
  uint64_t slot_words_epoch() const { return slot_words_epoch_.load(std::memory_order_acquire); }

 private:
  mutable AnnotatedMutex mu_;
  std::shared_ptr<const ShardView> current_ ABSL_GUARDED_BY(mu_);
  std::function<void()> listener_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> epoch_{0};
  std::atomic<uint64_t> version_{0};
  std::atomic<uint64_t> slot_words_epoch_{0};
};

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_SHARD_GATE_H_
