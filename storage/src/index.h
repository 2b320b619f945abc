// Writer side of the bucketized index (internal to kvnode::storage).
//
// Not thread-safe: exactly one thread of one process mutates an arena at a
// time (the Store serialises its writers with a mutex; see store.h). Readers
// in any process copy bytes and run read_path.h; everything here is ordered
// so that each step they can observe is valid for them:
//  1. An object is written completely (owner word 0, invariant 9) before the
//     8-byte release store of the slot word that publishes it.
//  2. Every state change of one key is one 8-byte store to that key's slot
//     (resident -> resident, resident <-> marker, -> empty): a reader sees
//     the old or the new word, never a state in between. The one exception is
//     a promotion that moves the key (6b): it publishes the new slot before it
//     clears the old marker, so a reader sees one or both.
//  3. A retired object's memory is not reused before the grace period has
//     passed (except under memory pressure); a reader that lands on reused
//     memory sees a bad checksum, another owner, or another key.
//  4. An overflow bucket is zeroed and given a fresh non-zero tag (meta word)
//     before the link that publishes it, and that link carries the same tag.
//     A bucket is only ever appended at the end of its chain, so along any
//     chain (and along the frozen link of an unlinked bucket) the buckets
//     come in the order they were appended.
//  5. Every key of a chain that exists in the store but has no resident slot is
//     covered by a marker slot with its fingerprint, or the chain's home
//     bucket is LOSSY (sticky until the arena is rebuilt).
//  6. Markers do not name their key: any marker with fingerprint f covers every
//     non-resident key with fingerprint f. So that a reader walking the chain
//     forward (bucket by bucket, each READ at a later time) always meets a
//     cover of a key that exists throughout its walk — the key's resident slot
//     or a marker with its fingerprint — no key is ever published in an
//     earlier bucket than the last cover it had:
//     a. A resident key keeps its slot (update and eviction are in place, 2).
//     b. Promoting a non-resident key (Upsert of an existing key): when its
//        fingerprint has one marker in the chain, that marker becomes the
//        resident slot in place. With several, the key is published in a free
//        slot of the LAST marker's bucket or of a later bucket (a new overflow
//        bucket if need be), and only then is the FIRST marker cleared; with no
//        such slot the key stays non-resident and nothing changes.
//     c. Removing a non-resident key clears the FIRST marker of its fingerprint.
//     In a LOSSY chain the key may have had no marker, so b and c clear none
//     (b always publishes in or after the last marker's bucket): a marker too
//     many only sends readers to the server, as LOSSY does anyway.
//     Why it holds: markers with f are only added (eviction, a failed
//     allocation) or taken away by b and c. b and c never take away the last
//     one while another exists, and the last one is what a non-resident key
//     relies on, so a non-resident key's last cover never moves back. When b or
//     c takes the only marker, every other key with f is resident (5): if a
//     reader has already passed such a key's slot without seeing it there, the
//     key became resident there after the reader passed, i.e. by b while the
//     reader was relying on a marker after that slot — which b forbids. So
//     "NotFound" from a walk is a proof of absence (read_path.h guarantee 2).
//  7. Chains are bounded: at most max_chain_buckets buckets (home included).
//     A new key whose chain has no free slot and is at the bound is refused
//     before anything is written (CheckRoomForNewKey); during a rebuild it
//     makes the chain LOSSY instead.
//  8. An overflow bucket whose slots are all empty is unlinked (its
//     predecessor's link takes its own link, tag included), then its tag is
//     cleared, then it is retired to the ring like an object and freed after
//     the grace period (earlier under memory pressure, as in 3). A reader that
//     followed the old link reads a bucket whose tag is no longer the link's
//     (cleared; or a new bucket's there: tags are 24-bit and repeat only after
//     2^24 - 1 appends; or an object's bytes there, equal to the tag only by
//     chance) and retries from the home bucket; one that read it before the
//     clear sees a bucket with no slot in use and a link to the rest of the
//     chain. Whatever it reads, it stops after kMaxChainLength buckets.
//     Inline objects of the bucket were retired before it, and the ring
//     releases in order, so none of them is released into memory the bucket
//     no longer owns.
//  9. An object's owner word (format.h) names its slot exactly while the slot
//     publishes it: it is stored after the slot store that publishes the
//     object and cleared before the slot store that replaces, deletes or
//     evicts it (SetSlot, the only place slot words change). So a reader
//     that finds an intact object naming slot S read it while S published
//     it, whenever it learnt the object's place: a remembered place needs no
//     READ of the slot (read_path.h, CachedRead). A writer killed between
//     an owner store and its slot store leaves a slot naming an unowned
//     object: readers retry and then ask the server, which reads RocksDB,
//     until the key is written again (a write in the intent is republished
//     at once).
// 10. The reconciliation of a write intent a dead writer left (Store::
//     ReconcileIntent) publishes the intent's keys again, and cannot know
//     whether the first publication ran not at all, in part or in full. So
//     each step it repeats may leave a marker too many (harmless: it only
//     sends readers to the server, as in 6) and never one too few (a false
//     NotFound). It never clears a marker: markers do not name their key
//     (6), and once the first publication removed the key's own cover, a
//     marker with its fingerprint covers another non-resident key, whose
//     last one it may be. Its removal (RemoveIfResident) clears the key's
//     resident slot if there is one and nothing else; a DELETE of a
//     non-resident key whose publication never ran leaves its marker. Its
//     Upsert of a key the publication made resident updates it in place; of
//     a new key whose publication left a marker (the object did not fit), it
//     adds another marker or a slot and the first marker stays. Such markers
//     stay until their fingerprint is promoted or removed in that chain, or
//     the arena is rebuilt. The header's counters (num_keys, marker_slots)
//     may then be off by the keys of one intent: they are statistics, which
//     no decision here reads.
#ifndef KVNODE_STORAGE_SRC_INDEX_H_
#define KVNODE_STORAGE_SRC_INDEX_H_

#include <atomic>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "kvnode/storage/arena.h"
#include "kvnode/storage/format.h"

namespace kvnode::storage {

class IndexWriter {
 public:
  // grace_ns: how long a retired allocation stays untouched.
  // max_chain_buckets: the chain bound of invariant 7, 1..kMaxChainLength.
  IndexWriter(Arena* arena, uint64_t grace_ns, uint32_t max_chain_buckets)
      : arena_(arena),
        g_(arena->geometry()),
        grace_ns_(grace_ns),
        max_chain_buckets_(max_chain_buckets) {}

  // What the chain holds for a key. When the key is resident, Find stops
  // there and only resident_*, home_bucket and lossy are meaningful.
  struct Probe {
    uint64_t resident_slot = 0;  // slot offset where the key is resident
    uint64_t resident_word = 0;
    uint64_t marker_slot = 0;       // the first marker with the key's fingerprint
    uint64_t last_marker_slot = 0;  // the last one
    uint32_t markers = 0;           // markers with the key's fingerprint
    uint64_t free_slot = 0;         // first empty slot of the chain
    uint64_t free_slot_late = 0;    // first empty slot in or after the last marker's bucket
    uint64_t last_bucket = 0;       // last bucket of the chain
    uint64_t home_bucket = 0;
    uint32_t chain_buckets = 0;  // buckets in the chain, home included
    bool lossy = false;
    // The key may exist without a resident slot: ask RocksDB to be sure.
    bool maybe_nonresident() const { return resident_slot == 0 && (marker_slot != 0 || lossy); }
  };
  Probe Find(std::string_view key) const;

  // ResourceExhausted when a new key could not get a slot without its chain
  // growing past the bound (invariant 7). Call before writing a new key.
  [[nodiscard]] absl::Status CheckRoomForNewKey(std::string_view key) const;
  uint32_t max_chain_buckets() const { return max_chain_buckets_; }

  enum class Placement { kResident, kNotResident };
  // Publishes key=value@version. `existed`: the key exists in the store
  // before this write (the caller knows it from Find and, if needed, RocksDB).
  // allow_evict: may evict other keys to make room (false during rebuild).
  Placement Upsert(std::string_view key, std::string_view value, uint64_t version, bool existed,
                   bool allow_evict);
  // Removes the key (existed: it was in the store before). Not idempotent:
  // a non-resident key's removal clears a marker with its fingerprint
  // (invariant 6c), so a second call may clear another key's cover.
  void Remove(std::string_view key, bool existed);
  // The removal of a reconciliation (invariant 10): clears the key's resident
  // slot if it has one, never a marker. Idempotent.
  void RemoveIfResident(std::string_view key);
  // CLOCK: marks a resident key as recently used. A write to the arena like
  // any other here: only the writer process may make it (the Store holds an
  // IndexWriter only while it is the writer), from any of its threads (an
  // atomic OR, racy with the writer thread by design).
  void Touch(uint64_t slot_offset);

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
  // The one store of invariant 2, with invariant 9's owner words around it;
  // the object the old word published goes to the retire ring (invariant 3).
  void SetSlot(uint64_t slot_offset, uint64_t word);
  void Retire(const Slot& s, uint64_t slot_offset);
  void PushLimbo(uint64_t offset, uint64_t bucket_offset, uint64_t length);
  // Invariant 8: unlinks and retires `bucket` if it is an overflow bucket of
  // the chain at `home` with no slot in use.
  void MaybeUnlink(uint64_t bucket, uint64_t home);
  uint32_t NextBucketTag();
  // Empties the resident slot `p` found (a removal's one store, invariant 2).
  void ClearResident(const Probe& p);
  void ReleaseLimbo(const LimboEntry& e);
  bool ReclaimOldest();
  bool EvictOne(uint64_t protect);
  void SetRef(uint64_t slot_offset, bool on) const;
  void Add(uint64_t ArenaHeader::*field, int64_t delta) const;

  Arena* arena_;
  Geometry g_;
  uint64_t grace_ns_;
  uint32_t max_chain_buckets_;
};

uint64_t MonotonicNanos();

}  // namespace kvnode::storage

#endif  // KVNODE_STORAGE_SRC_INDEX_H_
