#include "kvnode/server/dedupe.h"

#include <algorithm>

namespace kvnode::server {

DedupeWindow::DedupeWindow(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

const DedupeEntry* DedupeWindow::Find(uint64_t sequence) const {
  auto it = entries_.find(sequence);
  return it == entries_.end() ? nullptr : &it->second;
}

void DedupeWindow::Record(const DedupeEntry& e) {
  auto [it, inserted] = entries_.insert_or_assign(e.sequence, e);
  (void)it;
  if (!inserted) return;  // same sequence answered again: keep its place
  order_.push_back(e.sequence);
  while (order_.size() > capacity_) {
    const uint64_t old = order_.front();
    order_.pop_front();
    entries_.erase(old);
    if (!has_floor_ || old > floor_) floor_ = old;
    has_floor_ = true;
  }
}

DedupeWindow::Exported DedupeWindow::Export() const {
  Exported out;
  out.entries.reserve(order_.size());
  for (uint64_t seq : order_) out.entries.push_back(entries_.at(seq));
  out.has_floor = has_floor_;
  out.floor = floor_;
  return out;
}

DedupeWindow DedupeWindow::Import(const Exported& state, size_t capacity) {
  DedupeWindow w(capacity);
  w.has_floor_ = state.has_floor;
  w.floor_ = state.floor;
  for (const DedupeEntry& e : state.entries) w.Record(e);
  return w;
}

}  // namespace kvnode::server
