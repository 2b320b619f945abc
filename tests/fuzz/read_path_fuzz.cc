// The client's GET read path on arbitrary arena bytes (torn, reused or forged
// memory a READ may return): FirstRead, then Decode on bucket and object
// bytes, following kNext as a client does until the GET ends.
//
// Input layout (read_path_input.h builds the seeds):
//   u8 flags | u8 bucket size (64 * (1 + b % 8)) | u8 log2 bucket count (% 11) |
//   u64 hash seed | u8 key length (1 + b % 64) | key | chunk*
// Each READ takes the next step.length bytes of the input (fewer at the end:
// a short read). Flags help the fuzzer past what it cannot guess quickly:
//   bit 0  rewrite the checksum of every object the step will look at
//   bit 1  give every resident/marker slot of a bucket the key's fingerprint
//   bit 2  write the slot's offset into each object's owner field
//
// Checked on every step (read_path.h guarantees 1-3): kFound only with a value
// inside the bytes given, preceded by the key, for the slot followed; kNext
// only to a READ inside the arena; a short read is kRetry; a GET ends within
// the chain bound.
#include <string>

#include "fuzz_util.h"
#include "kvnode/storage/read_path.h"
#include "read_path_input.h"

namespace kvnode::storage {
namespace {

using Outcome = ReadResult::Outcome;

void FixObject(const Geometry& g, uint8_t flags, uint64_t owner, char* obj, size_t len) {
  if (len < kObjectHeaderSize) return;
  if (flags & 4) StoreU64(obj + 16, owner);
  if (flags & 1) {
    const size_t key_len = kvnode::fuzz::Le(reinterpret_cast<const uint8_t*>(obj) + 24, 2);
    const size_t value_len = LoadU32(obj + 28);
    if (value_len > kMaxValueSize || ObjectSize(key_len, value_len) > len) return;
    StoreU64(obj, fuzz::ObjectChecksum(g, obj, ObjectSize(key_len, value_len)));
  }
}

void Assist(const Geometry& g, std::string_view key, uint8_t flags, const ReadStep& step,
            std::string& chunk) {
  if (step.kind == ReadStep::Kind::kObject) {
    FixObject(g, flags, step.owner, chunk.data(), chunk.size());
    return;
  }
  const uint16_t fp = HashKey(g, key).fingerprint;
  for (uint32_t i = 0; i < kSlotsPerBucket; ++i) {
    char* at = chunk.data() + (kBucketHeaderWords + i) * 8;
    uint64_t word = LoadU64(at);
    Slot s = Slot::Parse(word);
    if ((flags & 2) && (s.type == SlotType::kResident || s.type == SlotType::kMarker)) {
      word = (word & ~uint64_t{0xFFFC}) | (uint64_t{fp} << 2);
      StoreU64(at, word);
      s = Slot::Parse(word);
    }
    if (s.type != SlotType::kResident) continue;
    const uint64_t begin = step.offset + kSlotLineSize;
    const uint64_t end = step.offset + step.length;
    if (s.offset < begin || s.offset > end || s.length > end - s.offset) continue;
    FixObject(g, flags, step.offset + (kBucketHeaderWords + i) * 8,
              chunk.data() + (s.offset - step.offset), s.length);
  }
}

}  // namespace
}  // namespace kvnode::storage

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvnode::storage;
  using kvnode::fuzz::Inside;
  kvnode::fuzz::ReadPathInput in;
  size_t pos = 0;
  if (!kvnode::fuzz::ParseReadPathInput(data, size, &in, &pos)) return 0;
  const Geometry& g = in.geometry;
  FUZZ_CHECK(g.Validate().ok());
  const std::string_view key = in.key;

  ReadStep step = FirstRead(g, key);
  // Every bucket of the chain, each with all its slots as candidates, plus one.
  constexpr int kMaxSteps = kMaxChainLength * (kSlotsPerBucket + 1) + 1;
  for (int n = 0; pos < size; ++n) {
    FUZZ_CHECK(n < kMaxSteps);
    const size_t take = std::min<size_t>(step.length, size - pos);
    // A heap buffer of exactly what was "read": ASan sees any read past it.
    std::string chunk(reinterpret_cast<const char*>(data + pos), take);
    pos += take;
    if (take == step.length) Assist(g, key, in.flags, step, chunk);

    const ReadResult r = Decode(g, key, step, chunk);
    FUZZ_CHECK(OutcomeName(r.outcome)[0] != '?');
    if (take < step.length) FUZZ_CHECK(r.outcome == Outcome::kRetry);
    if (r.outcome == Outcome::kFound) {
      FUZZ_CHECK(Inside(r.value, chunk.data(), chunk.size()));
      const char* key_at = r.value.data() - key.size();
      FUZZ_CHECK(key_at >= chunk.data() + kObjectHeaderSize);
      FUZZ_CHECK(std::string_view(key_at, key.size()) == key);
      if (step.kind == ReadStep::Kind::kObject) {
        FUZZ_CHECK(r.slot == step.owner);
      } else {
        FUZZ_CHECK(r.slot >= step.offset + kBucketHeaderWords * 8 &&
                   r.slot < step.offset + kSlotLineSize);
      }
    }
    if (r.outcome != Outcome::kNext) break;
    const ReadStep& next = r.next;
    FUZZ_CHECK(next.length > 0 && next.offset <= g.arena_size &&
               next.length <= g.arena_size - next.offset);
    if (next.kind == ReadStep::Kind::kBucket) {
      FUZZ_CHECK(next.length == g.bucket_size && next.offset % kSlotLineSize == 0);
      FUZZ_CHECK(next.buckets_read <= kMaxChainLength);
    }
    step = next;
  }
  return 0;
}
