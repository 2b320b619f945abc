// The input layout of read_path_fuzz, shared with the seed generator so that
// the two cannot drift apart.
#ifndef KVNODE_TESTS_FUZZ_READ_PATH_INPUT_H_
#define KVNODE_TESTS_FUZZ_READ_PATH_INPUT_H_

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "kvnode/storage/format.h"

namespace kvnode::fuzz {

inline constexpr size_t kReadPathPrefix = 12;       // flags .. key length
inline constexpr uint64_t kReadPathIndex = 4096;    // index_offset
inline constexpr uint64_t kReadPathHeap = 1 << 20;  // bytes after the index

struct ReadPathInput {
  uint8_t flags = 0;
  storage::Geometry geometry;
  std::string key;
};

inline storage::Geometry ReadPathGeometry(uint8_t size_byte, uint8_t count_byte, uint64_t seed) {
  storage::Geometry g;
  g.bucket_size = 64 * (1 + size_byte % 8);
  g.bucket_count = uint64_t{1} << (count_byte % 11);
  g.index_offset = kReadPathIndex;
  g.arena_size = kReadPathIndex + g.bucket_count * g.bucket_size + kReadPathHeap;
  g.hash_seed = seed;
  g.arena_id = 1;
  return g;
}

// Parses the prefix and key; *pos is where the chunks start.
inline bool ParseReadPathInput(const uint8_t* data, size_t size, ReadPathInput* in, size_t* pos) {
  if (size < kReadPathPrefix) return false;
  in->flags = data[0];
  in->geometry = ReadPathGeometry(data[1], data[2], Le(data + 3, 8));
  const size_t key_len = 1 + data[11] % 64;
  if (size < kReadPathPrefix + key_len) return false;
  in->key.assign(reinterpret_cast<const char*>(data + kReadPathPrefix), key_len);
  *pos = kReadPathPrefix + key_len;
  return true;
}

// The object checksum of format.h (XXH3-64, seed hash_seed, over [8, used)).
inline uint64_t ObjectChecksum(const storage::Geometry& g, const char* obj, size_t used) {
  return XXH3_64bits_withSeed(obj + 8, used - 8, g.hash_seed);
}

}  // namespace kvnode::fuzz

#endif  // KVNODE_TESTS_FUZZ_READ_PATH_INPUT_H_
