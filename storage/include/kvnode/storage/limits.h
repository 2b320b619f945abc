// Size limits that every layer agrees on: the store refuses larger keys and
// values, the wire protocol sizes its RPC buffers from them, and clients check
// them before sending. Changing one is a protocol and layout change.
#ifndef KVNODE_STORAGE_LIMITS_H_
#define KVNODE_STORAGE_LIMITS_H_

#include <cstddef>

namespace kvnode::storage {

// Largest key, in bytes. Keys are non-empty byte strings.
inline constexpr size_t kMaxKeySize = 1024;

// Largest value, in bytes. Empty values are allowed.
inline constexpr size_t kMaxValueSize = 16 * 1024;

}  // namespace kvnode::storage

#endif  // KVNODE_STORAGE_LIMITS_H_
