// ShardView's ownership bitset and ShardGate's publication (shard_gate.h).
#include "kvnode/server/shard_gate.h"

#include <algorithm>
#include <atomic>
#include <utility>

namespace kvnode::server {

ShardView::ShardView(proto::ShardMap map_in, uint16_t self_in)
    : map(std::move(map_in)), self(self_in) {
  const uint32_t slots = std::min(map.num_slots, proto::kMaxSlots);
  owned_.assign((slots + 63) / 64, 0);
  if (self == kNotInMap) return;
  // Each range runs from its first slot to the next range's (the last to
  // num_slots). Clipped so that an invalid map cannot index out of bounds.
  for (size_t i = 0; i < map.ranges.size(); ++i) {
    if (map.ranges[i].node != self) continue;
    const uint32_t first = std::min(map.ranges[i].first_slot, slots);
    const uint32_t end =
        i + 1 < map.ranges.size() ? std::min(map.ranges[i + 1].first_slot, slots) : slots;
    for (uint32_t s = first; s < end; ++s) {
      const uint64_t bit = uint64_t{1} << (s % 64);
      if ((owned_[s / 64] & bit) == 0) ++slots_owned_;
      owned_[s / 64] |= bit;
    }
  }
}

std::shared_ptr<const ShardView> ShardView::ForNode(proto::ShardMap map, std::string_view node_id) {
  const uint16_t self = map.IndexOf(node_id).value_or(kNotInMap);
  return std::make_shared<const ShardView>(std::move(map), self);
}

bool ShardView::OwnsKey(std::string_view key) const {
  return map.num_slots != 0 && Owns(proto::SlotOf(key, map.num_slots));
}

uint32_t StoreSlotWords(const ShardView* view, uint8_t* words) {
  uint32_t changed = 0;
  for (uint32_t s = 0; s < proto::kMaxSlots; ++s) {
    const uint8_t want = view != nullptr && view->Owns(s) ? 1 : 0;
    std::atomic_ref<uint8_t> word(words[s]);
    if (word.load(std::memory_order_relaxed) == want) continue;
    word.store(want, std::memory_order_release);
    ++changed;
  }
  return changed;
}

void ShardGate::Publish(std::shared_ptr<const ShardView> view) {
  AnnotatedLock lock(&mu_);
  epoch_.store(view != nullptr ? view->map.epoch : 0, std::memory_order_release);
  current_ = std::move(view);
  version_.fetch_add(1, std::memory_order_acq_rel);
  if (listener_) listener_();
}

std::shared_ptr<const ShardView> ShardGate::Current() const {
  AnnotatedLock lock(&mu_);
  return current_;
}

void ShardGate::SetListener(std::function<void()> listener) {
  AnnotatedLock lock(&mu_);
  listener_ = std::move(listener);
}

}  // namespace kvnode::server
