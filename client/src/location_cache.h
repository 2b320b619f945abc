// Where heap values were found: key -> (slot, slot word), so that a GET of a
// key read before can skip the bucket (storage/read_path.h, CachedRead).
//
// Direct-mapped and bounded: one entry per index, chosen by the key's hash;
// an insert replaces whatever was there. Entries are hints, never trusted:
// a wrong one (another key with the same hash bits, an overwritten, deleted
// or moved key) fails DecodeCached's checks and the GET falls back to the
// bucket, which then refreshes the entry. Owned by one Client (one thread).
#ifndef KVNODE_CLIENT_LIB_LOCATION_CACHE_H_
#define KVNODE_CLIENT_LIB_LOCATION_CACHE_H_

#include <bit>
#include <cstdint>
#include <vector>

#include "kvnode/storage/format.h"
#include "kvnode/storage/read_path.h"

namespace kvnode::client {

class LocationCache {
 public:
  // `entries` rounded up to a power of two; 0 disables the cache.
  explicit LocationCache(uint32_t entries)
      : entries_(entries == 0 ? 0 : std::bit_ceil(entries)),
        mask_(entries_.empty() ? 0 : entries_.size() - 1) {}

  bool enabled() const { return !entries_.empty(); }

  // The arena the entries point into: entries of another arena (a node
  // restarted on a new segment) are dropped.
  void ForArena(uint64_t arena_id) {
    if (arena_id == arena_id_) return;
    Clear();
    arena_id_ = arena_id;
  }

  bool Lookup(const storage::KeyHash& h, storage::CachedLocation* loc) const {
    if (entries_.empty()) return false;
    const Entry& e = entries_[Index(h)];
    if (e.tag != Tag(h)) return false;
    *loc = e.loc;
    return true;
  }
  void Insert(const storage::KeyHash& h, const storage::CachedLocation& loc) {
    if (entries_.empty()) return;
    entries_[Index(h)] = Entry{Tag(h), loc};
  }
  void Erase(const storage::KeyHash& h) {
    if (entries_.empty()) return;
    Entry& e = entries_[Index(h)];
    if (e.tag == Tag(h)) e = Entry{};
  }
  void Clear() {
    for (Entry& e : entries_) e = Entry{};
  }

 private:
  struct Entry {
    uint64_t tag = 0;  // 0: empty
    storage::CachedLocation loc;
  };
  // Non-zero for every key: bucket and fingerprint together.
  static uint64_t Tag(const storage::KeyHash& h) { return ((h.bucket << 14) | h.fingerprint) + 1; }
  // All bits of bucket and fingerprint mixed (multiplicative hashing): an
  // index of the bucket alone would give at most bucket_count entries, and
  // an index holds fewer buckets than a cache of twice the keys has entries.
  size_t Index(const storage::KeyHash& h) const {
    return static_cast<size_t>((Tag(h) * 0x9E3779B97F4A7C15ull) >> 32) & mask_;
  }

  std::vector<Entry> entries_;
  uint64_t mask_ = 0;
  uint64_t arena_id_ = 0;
};

}  // namespace kvnode::client

#endif  // KVNODE_CLIENT_LIB_LOCATION_CACHE_H_
