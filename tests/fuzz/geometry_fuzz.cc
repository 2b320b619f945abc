// The index geometry a client receives in Welcome (opaque bytes from the
// server): Geometry::Decode. Input: one flags byte, then the bytes. Flag bit 0
// rewrites the checksum of a 72-byte input so that the fuzzer reaches
// Validate(). A geometry that decodes must re-encode to the input, and every
// first READ it leads a client to must lie inside the arena.
#include <xxhash.h>

#include <string>

#include "fuzz_util.h"
#include "kvnode/storage/read_path.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvnode::storage;
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((flags & 1) && bytes.size() == Geometry::kEncodedSize) {
    StoreU64(bytes.data() + 64, XXH3_64bits_withSeed(bytes.data(), 64, 0));
  }

  absl::StatusOr<Geometry> g = Geometry::Decode(bytes);
  if (!g.ok()) return 0;
  FUZZ_CHECK(g->Validate().ok());
  FUZZ_CHECK(g->Encode() == bytes);
  for (std::string_view key : {std::string_view("k"), std::string_view(bytes).substr(0, 16)}) {
    const ReadStep step = FirstRead(*g, key);
    FUZZ_CHECK(step.kind == ReadStep::Kind::kBucket && step.length == g->bucket_size);
    FUZZ_CHECK(step.offset >= g->index_offset && step.offset % kSlotLineSize == 0);
    FUZZ_CHECK(step.offset <= g->arena_size && step.length <= g->arena_size - step.offset);
  }
  return 0;
}
