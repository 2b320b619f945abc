#include "kvnode/storage/format.h"

// The state type of the streaming API (XXH3_state_t) on the stack.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvnode::storage {
namespace {

constexpr uint64_t kGeometryMagic = 0x314d4f4547564b4bULL;  // "KKVGEOM1"

uint64_t Checksum(const void* p, size_t n, uint64_t seed) {
  return XXH3_64bits_withSeed(p, n, seed);
}

}  // namespace

absl::Status Geometry::Validate() const {
  if (layout_version != kLayoutVersion) {
    return absl::FailedPreconditionError(absl::StrCat("geometry: layout version ", layout_version,
                                                      ", this build understands ", kLayoutVersion));
  }
  if (bucket_size % kSlotLineSize != 0 || bucket_size < kMinBucketSize ||
      bucket_size > kMaxBucketSize) {
    return absl::InvalidArgumentError(absl::StrCat("geometry: bucket size ", bucket_size,
                                                   " is not a multiple of 64 in [64, 512]"));
  }
  if (slots_per_bucket != kSlotsPerBucket || inline_granule != kInlineGranule) {
    return absl::InvalidArgumentError(absl::StrCat("geometry: ", slots_per_bucket,
                                                   " slots per bucket and inline granule ",
                                                   inline_granule, " (expected 6 and 16)"));
  }
  if (arena_size == 0 || arena_size > kMaxArenaSize || arena_size % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry: arena size ", arena_size, " not a multiple of 8 in (0, 2^39]"));
  }
  if (bucket_count == 0 || !std::has_single_bit(bucket_count) ||
      bucket_count > (uint64_t{1} << 36)) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry: bucket count ", bucket_count, " is not a power of two <= 2^36"));
  }
  if (index_offset % kSlotLineSize != 0 || index_offset > arena_size ||
      bucket_count * bucket_size > arena_size - index_offset) {
    return absl::InvalidArgumentError(absl::StrCat("geometry: index [", index_offset, ", +",
                                                   bucket_count * bucket_size,
                                                   ") does not fit an arena of ", arena_size));
  }
  return absl::OkStatus();
}

std::string Geometry::Encode() const {
  std::string out(kEncodedSize, '\0');
  char* p = out.data();
  StoreU64(p + 0, kGeometryMagic);
  StoreU32(p + 8, layout_version);
  StoreU32(p + 12, bucket_size);
  StoreU32(p + 16, slots_per_bucket);
  StoreU32(p + 20, inline_granule);
  StoreU64(p + 24, arena_size);
  StoreU64(p + 32, index_offset);
  StoreU64(p + 40, bucket_count);
  StoreU64(p + 48, hash_seed);
  StoreU64(p + 56, arena_id);
  StoreU64(p + 64, Checksum(p, 64, 0));
  return out;
}

absl::StatusOr<Geometry> Geometry::Decode(std::string_view bytes) {
  if (bytes.size() != kEncodedSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry: ", bytes.size(), " bytes, expected ", kEncodedSize));
  }
  const char* p = bytes.data();
  if (LoadU64(p) != kGeometryMagic) return absl::InvalidArgumentError("geometry: bad magic");
  if (LoadU64(p + 64) != Checksum(p, 64, 0)) {
    return absl::DataLossError("geometry: checksum mismatch");
  }
  Geometry g;
  g.layout_version = LoadU32(p + 8);
  g.bucket_size = LoadU32(p + 12);
  g.slots_per_bucket = LoadU32(p + 16);
  g.inline_granule = LoadU32(p + 20);
  g.arena_size = LoadU64(p + 24);
  g.index_offset = LoadU64(p + 32);
  g.bucket_count = LoadU64(p + 40);
  g.hash_seed = LoadU64(p + 48);
  g.arena_id = LoadU64(p + 56);
  if (absl::Status s = g.Validate(); !s.ok()) return s;
  return g;
}

KeyHash HashKey(const Geometry& g, std::string_view key) {
  const uint64_t h = XXH3_64bits_withSeed(key.data(), key.size(), g.hash_seed);
  KeyHash kh;
  kh.bucket = h & (g.bucket_count - 1);
  kh.fingerprint = static_cast<uint16_t>((h >> 50) & 0x3FFF);
  return kh;
}

Slot Slot::Parse(uint64_t word) {
  Slot s;
  s.type = static_cast<SlotType>(word & 3);
  s.fingerprint = static_cast<uint16_t>((word >> 2) & 0x3FFF);
  s.length = static_cast<uint32_t>((word >> 16) & 0xFFF) * 8;
  s.offset = (word >> 28) * 8;
  return s;
}

uint64_t Slot::Word() const {
  return static_cast<uint64_t>(type) | (uint64_t{fingerprint} & 0x3FFF) << 2 |
         (uint64_t{length / 8} & 0xFFF) << 16 | (offset / 8) << 28;
}

uint64_t Slot::Resident(uint16_t fp, uint64_t offset, uint32_t length) {
  return Slot{SlotType::kResident, fp, length, offset}.Word();
}

uint64_t Slot::Marker(uint16_t fp) { return Slot{SlotType::kMarker, fp, 0, 0}.Word(); }

void EncodeUnownedObject(const Geometry& g, uint64_t owner_slot, uint64_t version,
                         std::string_view key, std::string_view value, char* dst,
                         size_t footprint) {
  StoreU64(dst + 8, version);
  StoreU64(dst + kObjectOwnerOffset, 0);
  dst[24] = static_cast<char>(key.size() & 0xFF);
  dst[25] = static_cast<char>(key.size() >> 8);
  dst[26] = 0;
  dst[27] = 0;
  StoreU32(dst + 28, static_cast<uint32_t>(value.size()));
  std::memcpy(dst + kObjectHeaderSize, key.data(), key.size());
  if (!value.empty()) std::memcpy(dst + kObjectHeaderSize + key.size(), value.data(), value.size());
  const size_t used = ObjectSize(key.size(), value.size());
  if (footprint > used) std::memset(dst + used, 0, footprint - used);
  // The checksum of the object as it will be once owned: the owner word goes
  // into the hash from a local copy, never into dst.
  char owner[8];
  StoreU64(owner, owner_slot);
  XXH3_state_t st;
  XXH3_64bits_reset_withSeed(&st, g.hash_seed);
  XXH3_64bits_update(&st, dst + 8, kObjectOwnerOffset - 8);
  XXH3_64bits_update(&st, owner, sizeof(owner));
  XXH3_64bits_update(&st, dst + kObjectOwnerOffset + 8, used - kObjectOwnerOffset - 8);
  StoreU64(dst, XXH3_64bits_digest(&st));
}

void EncodeObject(const Geometry& g, uint64_t owner_slot, uint64_t version, std::string_view key,
                  std::string_view value, char* dst, size_t footprint) {
  EncodeUnownedObject(g, owner_slot, version, key, value, dst, footprint);
  StoreU64(dst + kObjectOwnerOffset, owner_slot);
}

absl::StatusOr<ObjectView> DecodeObject(const Geometry& g, std::string_view bytes) {
  if (bytes.size() < kObjectHeaderSize) return absl::DataLossError("object: shorter than header");
  const char* p = bytes.data();
  const size_t key_len =
      static_cast<uint8_t>(p[24]) | static_cast<size_t>(static_cast<uint8_t>(p[25])) << 8;
  const size_t value_len = LoadU32(p + 28);
  if (key_len == 0 || key_len > kMaxKeySize || value_len > kMaxValueSize || p[26] != 0 ||
      p[27] != 0) {
    return absl::DataLossError("object: bad lengths");
  }
  const size_t used = ObjectSize(key_len, value_len);
  if (used > bytes.size()) return absl::DataLossError("object: longer than its slot");
  if (LoadU64(p) != Checksum(p + 8, used - 8, g.hash_seed)) {
    return absl::DataLossError("object: checksum mismatch");
  }
  ObjectView v;
  v.version = LoadU64(p + 8);
  v.owner = LoadU64(p + kObjectOwnerOffset);
  v.key = bytes.substr(kObjectHeaderSize, key_len);
  v.value = bytes.substr(kObjectHeaderSize + key_len, value_len);
  return v;
}

}  // namespace kvnode::storage
