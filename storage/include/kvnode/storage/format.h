// The byte formats of the arena that outlive a process and cross the network:
// the index geometry a client learns at connect, bucket and slot words, and
// self-verifying objects. Pure code on bytes: no Boost, no RocksDB, no
// pointers into the arena. docs/format.md is the prose version of this file;
// changing anything here is a layout change (bump kLayoutVersion).
//
// All integers are little-endian. All offsets are byte offsets from the base
// of the arena mapping (the mapping is registered as one MR at iova 0, so a
// remote address is simply an offset).
#ifndef KVNODE_STORAGE_FORMAT_H_
#define KVNODE_STORAGE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/storage/limits.h"

namespace kvnode::storage {

// Version of everything in this file and of the arena header. A process that
// finds another version in a segment or a geometry refuses it.
// 2: the segment has no process-shared mutex (null_mutex_family), and the
// header has heap_busy and the write intent; overflow buckets carry a tag
// that the link to them repeats (they are freed when empty, and a reader must
// notice a bucket it reached by a stale link); a key is never published in an
// earlier bucket of its chain.
// 3: an object's owner word is its publication state (0 before the slot store
// that publishes it and from before the one that replaces it), so one READ of
// a remembered object proves it current (read_path.h, CachedRead).
inline constexpr uint32_t kLayoutVersion = 3;

// ---------------------------------------------------------------------------
// Geometry: what a remote reader needs to compute where to READ.
// ---------------------------------------------------------------------------

// Slots are 8-byte words, a bucket starts with two header words and has its
// slot line in its first 64 bytes; the rest of the bucket is inline storage.
inline constexpr uint32_t kSlotLineSize = 64;
inline constexpr uint32_t kSlotsPerBucket = 6;
inline constexpr uint32_t kBucketHeaderWords = 2;
inline constexpr uint32_t kInlineGranule = 16;
inline constexpr uint32_t kMinBucketSize = 64;   // no inline area
inline constexpr uint32_t kMaxBucketSize = 512;  // 28 inline granules
// Upper bound on the buckets a reader follows in one chain before it gives
// up (garbage, or a cycle in reused memory): then it asks the server. The
// writer keeps every chain within its own, smaller bound
// (StoreOptions::max_chain_buckets <= kMaxChainLength), so a reader meets
// this one only on bytes no writer produced.
inline constexpr uint32_t kMaxChainLength = 64;
// Largest arena a slot can address (36-bit offset in 8-byte units).
inline constexpr uint64_t kMaxArenaSize = uint64_t{1} << 39;

struct Geometry {
  uint32_t layout_version = kLayoutVersion;
  uint32_t bucket_size = 256;  // bytes; multiple of 64 in [64, 512]
  uint32_t slots_per_bucket = kSlotsPerBucket;
  uint32_t inline_granule = kInlineGranule;
  uint64_t arena_size = 0;    // bytes in the mapping (the MR length)
  uint64_t index_offset = 0;  // offset of bucket 0; 64-byte aligned
  uint64_t bucket_count = 0;  // power of two
  uint64_t hash_seed = 0;     // seeds the key hash (bucket and fingerprint)
  uint64_t arena_id = 0;      // random per created segment: tells arenas apart

  // Checks internal consistency; never trusts a geometry from the wire
  // without it (Decode calls it).
  [[nodiscard]] absl::Status Validate() const;

  // Fixed-size wire form (kEncodedSize bytes), with a magic and a checksum.
  static constexpr size_t kEncodedSize = 72;
  std::string Encode() const;
  [[nodiscard]] static absl::StatusOr<Geometry> Decode(std::string_view bytes);

  uint64_t index_bytes() const { return bucket_count * bucket_size; }
  uint32_t inline_granules() const { return (bucket_size - kSlotLineSize) / inline_granule; }

  friend bool operator==(const Geometry&, const Geometry&) = default;
};

// Where a key lives in the index.
struct KeyHash {
  uint64_t bucket = 0;       // home bucket number
  uint16_t fingerprint = 0;  // 14 bits
};
KeyHash HashKey(const Geometry& g, std::string_view key);

inline uint64_t BucketOffset(const Geometry& g, uint64_t bucket) {
  return g.index_offset + bucket * g.bucket_size;
}

// ---------------------------------------------------------------------------
// Bucket header word 0 ("link"), read by clients:
//   bits  0..35  offset of the next (overflow) bucket in 8-byte units; 0 = none
//   bits 36..59  tag of the next bucket (0 when there is none)
//   bit   63     LOSSY (home bucket only): some key of this chain may exist
//                without a slot; a miss in this chain is not a proof of absence.
// Bucket header word 1 ("meta"):
//   bits  0..27  inline granule allocation bitmap (writer-private)
//   bits 32..37  CLOCK reference bits, one per slot (writer-private)
//   bits 40..63  this bucket's tag: 0 in home buckets; in an overflow bucket a
//                non-zero value set before the link that publishes the bucket
//                and cleared when the bucket is unlinked. A reader that
//                followed a link accepts the bucket only if its tag equals the
//                link's (else the bucket was unlinked or its memory reused).
// ---------------------------------------------------------------------------
inline constexpr uint64_t kLinkLossyBit = uint64_t{1} << 63;
inline constexpr uint64_t kOffsetMask36 = (uint64_t{1} << 36) - 1;
inline constexpr int kBucketTagBits = 24;
inline constexpr uint32_t kBucketTagMask = (uint32_t{1} << kBucketTagBits) - 1;
inline constexpr int kLinkTagShift = 36;
inline constexpr int kMetaTagShift = 40;
inline constexpr int kMetaRefShift = 32;
inline constexpr uint64_t kMetaRefMask = ((uint64_t{1} << kSlotsPerBucket) - 1) << kMetaRefShift;
inline uint64_t LinkNext(uint64_t link) { return (link & kOffsetMask36) * 8; }
inline uint32_t LinkTag(uint64_t link) {
  return static_cast<uint32_t>(link >> kLinkTagShift) & kBucketTagMask;
}
inline bool LinkLossy(uint64_t link) { return (link & kLinkLossyBit) != 0; }
inline uint64_t MakeLink(uint64_t next_offset, bool lossy, uint32_t next_tag = 0) {
  return ((next_offset / 8) & kOffsetMask36) |
         (uint64_t{next_tag & kBucketTagMask} << kLinkTagShift) | (lossy ? kLinkLossyBit : 0);
}
inline uint32_t MetaTag(uint64_t meta) {
  return static_cast<uint32_t>(meta >> kMetaTagShift) & kBucketTagMask;
}
inline constexpr uint64_t kMetaTagMask = uint64_t{kBucketTagMask} << kMetaTagShift;

// ---------------------------------------------------------------------------
// Slot word:
//   bits  0..1   type: 0 empty, 1 resident, 2 non-resident marker, 3 invalid
//   bits  2..15  fingerprint (14 bits of the key hash)
//   bits 16..27  object length in 8-byte units (resident only)
//   bits 28..63  object offset in 8-byte units (resident only)
// A marker says "one key with this fingerprint exists in the store but not in
// the arena": a reader that meets one must ask the server.
// ---------------------------------------------------------------------------
enum class SlotType : uint8_t { kEmpty = 0, kResident = 1, kMarker = 2, kInvalid = 3 };

struct Slot {
  SlotType type = SlotType::kEmpty;
  uint16_t fingerprint = 0;
  uint32_t length = 0;  // bytes, multiple of 8
  uint64_t offset = 0;  // bytes, multiple of 8

  static Slot Parse(uint64_t word);
  uint64_t Word() const;
  static uint64_t Resident(uint16_t fp, uint64_t offset, uint32_t length);
  static uint64_t Marker(uint16_t fp);
};

// ---------------------------------------------------------------------------
// Object (8-byte aligned in the heap, 16-byte aligned inline):
//   0  u64 checksum   XXH3-64 (seed = hash_seed) over bytes [8, 32 + k + v)
//   8  u64 version    the store's version of this write
//  16  u64 owner      offset of the slot word that publishes this object, while
//                     it does: 0 before (the checksum is that of the owned
//                     object, so an unowned one fails it) and after
//  24  u16 key_len    1..kMaxKeySize
//  26  u16 reserved   0
//  28  u32 value_len  0..kMaxValueSize
//  32  key bytes, then value bytes, then zero padding to the slot length
// The writer stores the owner word after the slot store that publishes the
// object and clears it before the slot store that replaces, deletes or
// evicts it (src/index.h, invariant 9): an intact object that names slot S
// was published by S at the time it was read.
// ---------------------------------------------------------------------------
inline constexpr size_t kObjectHeaderSize = 32;
inline constexpr size_t kObjectOwnerOffset = 16;
inline constexpr size_t kMaxObjectSize = kObjectHeaderSize + kMaxKeySize + kMaxValueSize;

inline size_t ObjectSize(size_t key_len, size_t value_len) {
  return kObjectHeaderSize + key_len + value_len;
}
// Bytes an object occupies with padding (what the slot length says).
inline size_t ObjectFootprint(size_t key_len, size_t value_len, size_t align) {
  return (ObjectSize(key_len, value_len) + align - 1) / align * align;
}

// Writes an object into dst (which must have `footprint` bytes; padding is
// zeroed) with its owner word 0 and the checksum of the object owned by
// `owner_slot`: it passes DecodeObject only once the writer has stored the
// owner word. Key and value must be within the limits (the caller checked).
void EncodeUnownedObject(const Geometry& g, uint64_t owner_slot, uint64_t version,
                         std::string_view key, std::string_view value, char* dst, size_t footprint);
// The same with the owner word stored: a complete object at once.
void EncodeObject(const Geometry& g, uint64_t owner_slot, uint64_t version, std::string_view key,
                  std::string_view value, char* dst, size_t footprint);

struct ObjectView {
  uint64_t version = 0;
  uint64_t owner = 0;
  std::string_view key;
  std::string_view value;
};
// Verifies lengths and checksum of an object at the start of `bytes`.
// Returns DataLoss on a torn, reused or malformed object.
[[nodiscard]] absl::StatusOr<ObjectView> DecodeObject(const Geometry& g, std::string_view bytes);

// Little-endian helpers (the arena is only ever used on little-endian hosts,
// but the wire geometry is explicit).
inline uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline void StoreU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline void StoreU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

}  // namespace kvnode::storage

#endif  // KVNODE_STORAGE_FORMAT_H_
