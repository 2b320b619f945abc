// The GET read path as a remote client runs it: pure functions on bytes that
// were copied out of the arena (by RDMA READ, or memcpy), with no pointers into
// the arena and no locks. Usable from the client library (target
// kvnode::storage_read: needs only Abseil and xxHash).
//
// Usage:
//   ReadStep step = FirstRead(geometry, key);
//   for (int attempt = 0; ; ) {
//     bytes = RDMA_READ(remote offset step.offset, step.length);
//     ReadResult r = Decode(geometry, key, step, bytes);
//     switch (r.outcome) {
//       case kFound:    use r.value (points into `bytes`), r.version; done
//       case kNotFound: the key does not exist; done
//       case kNext:     step = r.next; continue            (object or overflow bucket)
//       case kRetry:    if (++attempt > N) ask the server; else step = FirstRead(...)
//       case kSlowPath: ask the server by RPC GET
//     }
//   }
//
// Guarantees (for any bytes whatsoever, including torn and reused memory):
//  1. kFound is returned only for an intact object (checksum verified) whose
//     key equals `key` and which was published by the slot the reader followed.
//  2. kNotFound is returned only when the buckets read prove the key is absent:
//     no slot with the key's fingerprint (resident or marker) in the whole
//     chain and the home bucket not LOSSY.
//  3. Nothing here crashes or reads outside `bytes` on malformed input.
//  4. A GET ends: at most kMaxChainLength buckets, each followed by at most
//     kSlotsPerBucket object READs, then kSlowPath (a cycle in garbage or
//     reused memory ends there too). An overflow bucket whose tag is not the
//     one its link named (unlinked, or its memory reused) is kRetry.
// A GET is one READ when the value is inline in the home bucket, two when it
// lives in the heap; overflow buckets add one READ each.
//
// A reader that remembers where a heap value was (CachedLocation, from a
// kFound of a kObject step) can skip the bucket: CachedRead gives the one
// READ of the object, and DecodeCached accepts it only if it is intact,
// names loc.slot as its owner and holds `key`. That is guarantee 1 without
// the bucket: the writer clears an object's owner word before the slot store
// that replaces, deletes or evicts it, and sets it only after the store that
// publishes it (format.h; src/index.h, invariant 9), so an intact object
// naming loc.slot was what that slot published when the READ executed.
// Anything else is kRetry: the caller drops the location and starts over
// with FirstRead.
#ifndef KVNODE_STORAGE_READ_PATH_H_
#define KVNODE_STORAGE_READ_PATH_H_

#include <array>
#include <cstdint>
#include <string_view>

#include "kvnode/storage/format.h"

namespace kvnode::storage {

// One READ to issue: `length` bytes at arena offset `offset`, plus the context
// Decode needs to continue. A plain value; copy it freely.
struct ReadStep {
  enum class Kind : uint8_t { kBucket, kObject, kCached };
  Kind kind = Kind::kBucket;
  uint64_t offset = 0;
  uint32_t length = 0;

  // The key's fingerprint, computed once by FirstRead (kNoFingerprint: a
  // step built by hand; Decode hashes the key then).
  static constexpr uint32_t kNoFingerprint = 0xFFFFFFFF;
  uint32_t fingerprint = kNoFingerprint;

  // Context (opaque to callers).
  uint64_t owner = 0;            // kObject, kCached: slot offset the object must name
  uint64_t word = 0;             // kObject, kCached: the slot word that named the object
  uint64_t next_bucket = 0;      // bucket to read after the pending candidates
  uint32_t next_bucket_tag = 0;  // the tag the link to next_bucket names
  uint32_t bucket_tag = 0;       // kBucket, overflow: the tag it must carry
  uint32_t buckets_read = 0;     // chain length so far
  bool must_ask_server = false;  // a marker or LOSSY seen: a miss is not a proof
  uint8_t pending = 0;           // candidates still to try after this one
  std::array<uint64_t, kSlotsPerBucket> pending_slot_offset{};
  std::array<uint64_t, kSlotsPerBucket> pending_slot_word{};
};

struct ReadResult {
  enum class Outcome : uint8_t { kFound, kNotFound, kRetry, kNext, kSlowPath };
  Outcome outcome = Outcome::kRetry;
  std::string_view value;  // kFound: points into the bytes given to Decode
  uint64_t version = 0;    // kFound
  uint64_t slot = 0;       // kFound: offset of the slot word that published it
  uint64_t slot_word = 0;  // kFound of a kObject or kCached step: that word
  ReadStep next;           // kNext
};

// The first READ of a GET: the key's home bucket.
ReadStep FirstRead(const Geometry& g, std::string_view key);
// The same with the key's hash already computed (HashKey(g, key)).
ReadStep FirstRead(const Geometry& g, const KeyHash& hash);

// Where a heap value was found: the slot that published it and the slot
// word then. A plain value; any bytes are safe (DecodeCached checks them).
struct CachedLocation {
  uint64_t slot = 0;
  uint64_t word = 0;
};
// The one READ of a GET through `loc` (kind kCached: the object). length 0
// when `loc` cannot name an object of this geometry (not resident, out of
// the arena): drop it.
ReadStep CachedRead(const Geometry& g, const CachedLocation& loc);
// kFound (as Decode's) or kRetry: see the file comment.
ReadResult DecodeCached(const Geometry& g, std::string_view key, const ReadStep& step,
                        std::string_view object_bytes);

// Interprets `bytes` (exactly what was read for `step`; fewer bytes -> kRetry).
ReadResult Decode(const Geometry& g, std::string_view key, const ReadStep& step,
                  std::string_view bytes);

const char* OutcomeName(ReadResult::Outcome o);

}  // namespace kvnode::storage

#endif  // KVNODE_STORAGE_READ_PATH_H_
