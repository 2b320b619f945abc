// A self-verifying object as a client READs it from the arena (possibly torn
// or reused memory): DecodeObject. Input: flags byte, u64 hash seed, then the
// object bytes. Flag bit 0 rewrites the checksum when the header's lengths fit
// the bytes, so that the fuzzer gets past it. A decoded object must point into
// the input and re-encode (EncodeObject) to the same bytes.
#include <xxhash.h>

#include <string>

#include "fuzz_util.h"
#include "kvnode/storage/format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvnode::storage;
  using kvnode::fuzz::Inside;
  if (size < 9) return 0;
  const uint8_t flags = data[0];
  Geometry g;
  g.hash_seed = kvnode::fuzz::Le(data + 1, 8);
  // A heap buffer of exactly the object's size: ASan sees any read past it.
  std::string bytes(reinterpret_cast<const char*>(data + 9), size - 9);
  if ((flags & 1) && bytes.size() >= kObjectHeaderSize) {
    const size_t key_len = kvnode::fuzz::Le(data + 9 + 24, 2);
    const size_t value_len = LoadU32(bytes.data() + 28);
    if (value_len <= kMaxValueSize && ObjectSize(key_len, value_len) <= bytes.size()) {
      StoreU64(bytes.data(), XXH3_64bits_withSeed(bytes.data() + 8,
                                                  ObjectSize(key_len, value_len) - 8, g.hash_seed));
    }
  }

  absl::StatusOr<ObjectView> v = DecodeObject(g, bytes);
  if (!v.ok()) return 0;
  FUZZ_CHECK(Inside(v->key, bytes.data(), bytes.size()));
  FUZZ_CHECK(Inside(v->value, bytes.data(), bytes.size()));
  FUZZ_CHECK(!v->key.empty() && v->key.size() <= kMaxKeySize);
  FUZZ_CHECK(v->value.size() <= kMaxValueSize);
  const size_t used = ObjectSize(v->key.size(), v->value.size());
  std::string again(ObjectFootprint(v->key.size(), v->value.size(), 8), '\x55');
  EncodeObject(g, v->owner, v->version, v->key, v->value, again.data(), again.size());
  FUZZ_CHECK(std::string_view(again).substr(0, used) == std::string_view(bytes).substr(0, used));
  return 0;
}
