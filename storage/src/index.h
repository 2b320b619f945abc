// Writer side of the bucketized index (internal to kvnode::storage).
//
// Not thread-safe: exactly one thread of one process mutates an arena at a
// time (the Store serialises its writers with a mutex; see store.h). Readers
// in any process copy bytes and run read_path.h; everything here is ordered
// so that each step they can observe is valid for them:
//  1. An object is written completely before the 8-byte release store of the
//     slot word that publishes it.
//  2. Every state change of one key is one 8-byte store to that key's slot
//     (resident -> resident, resident <-> marker, -> empty): a reader sees
//     the old or the new word, never a state in between.
//  3. A retired object's memory is not reused before the grace period has
//     passed (except under memory pressure); a reader that lands on reused
//     memory sees a bad checksum, another owner, or another key.
//  4. An overflow bucket is zeroed before the link that publishes it; overflow
//     buckets are never freed while the arena lives.
//  5. Every key of a chain that exists in the store but has no resident slot is
//     covered by a marker slot with its fingerprint, or the chain's home
//     bucket is LOSSY (sticky until the arena is rebuilt).
#ifndef KVNODE_STORAGE_SRC_INDEX_H_
#define KVNODE_STORAGE_SRC_INDEX_H_

#include <atomic>
#include <cstdint>
#include <string_view>

#include "kvnode/storage/arena.h"
#include "kvnode/storage/format.h"

namespace kvnode::storage {

class IndexWriter {
 public:
  // grace_ns: how long a retired allocation stays untouched.
  IndexWriter(Arena* arena, uint64_t grace_ns)
      : arena_(arena), g_(arena->geometry()), grace_ns_(grace_ns) {}

  struct Probe {
    uint64_t resident_slot = 0;  // slot offset where the key is resident
    uint64_t resident_word = 0;
    uint64_t marker_slot = 0;  // a marker with the key's fingerprint
    uint64_t free_slot = 0;    // first empty slot of the chain
    uint64_t last_bucket = 0;  // last bucket of the chain
    uint64_t home_bucket = 0;
    bool lossy = false;
    // The key may exist without a resident slot: ask RocksDB to be sure.
    bool maybe_nonresident() const { return resident_slot == 0 && (marker_slot != 0 || lossy); }
  };
  Probe Find(std::string_view key) const;

  enum class Placement { kResident, kNotResident };
  // Publishes key=value@version. `existed`: the key exists in the store
  // before this write (the caller knows it from Find and, if needed, RocksDB).
  // allow_evict: may evict other keys to make room (false during rebuild).
  Placement Upsert(std::string_view key, std::string_view value, uint64_t version, bool existed,
                   bool allow_evict);
  // Removes the key (existed: it was in the store before).
  void Remove(std::string_view key, bool existed);
  // CLOCK: marks a resident key as recently used (any thread, racy by design).
  void Touch(uint64_t slot_offset) const;

  // Frees retired allocations whose grace has passed.
  void ReclaimExpired();

 private:
  struct Loc {
    uint64_t offset = 0;
    uint32_t length = 0;
    bool is_inline = false;
  };
  uint64_t BucketOf(uint64_t slot_offset) const;
  std::atomic_ref<uint64_t> Word(uint64_t offset) const {
    return std::atomic_ref<uint64_t>(*arena_->At<uint64_t>(offset));
  }
  bool AllocateObject(uint64_t bucket, size_t key_len, size_t value_len, uint64_t protect,
                      bool allow_evict, Loc* loc);
  uint64_t AllocateHeap(uint64_t n, uint64_t align, uint64_t protect, bool allow_evict);
  uint64_t AddOverflowBucket(uint64_t last_bucket, bool allow_evict);
  void Retire(const Slot& s, uint64_t slot_offset);
  void ReleaseLimbo(const LimboEntry& e);
  bool ReclaimOldest();
  bool EvictOne(uint64_t protect);
  void SetRef(uint64_t slot_offset, bool on) const;
  void Add(uint64_t ArenaHeader::*field, int64_t delta) const;

  Arena* arena_;
  Geometry g_;
  uint64_t grace_ns_;
};

uint64_t MonotonicNanos();

}  // namespace kvnode::storage

#endif  // KVNODE_STORAGE_SRC_INDEX_H_
