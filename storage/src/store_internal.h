// What the store's two files share: store.cc (life cycle, handoff, reads)
// and write_path.cc (writes and the write intent).
#ifndef KVNODE_STORAGE_SRC_STORE_INTERNAL_H_
#define KVNODE_STORAGE_SRC_STORE_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "journal.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

namespace kvnode::storage {

// Calls the hook SetCrashPointHookForTesting installed, if any.
void CrashPoint(const char* point);

// InvalidArgument for an empty key or one over kMaxKeySize.
absl::Status CheckKey(std::string_view key);

// A mutable ArenaHeader field, as other processes read it.
inline std::atomic_ref<uint64_t> HeaderWord(uint64_t& field) {
  return std::atomic_ref<uint64_t>(field);
}

// One write's mutations, built once for where it is made durable: a RocksDB
// batch, or journal ops (by column family index) during the writer switch.
struct WriteSet {
  const std::vector<rocksdb::ColumnFamilyHandle*>* cfs = nullptr;  // null: journal
  rocksdb::WriteBatch batch;
  std::vector<JournalOp> ops;

  void Put(uint8_t cf, std::string_view key, std::string_view value) {
    if (cfs != nullptr) {
      batch.Put((*cfs)[cf], rocksdb::Slice(key.data(), key.size()),
                rocksdb::Slice(value.data(), value.size()));
    } else {
      ops.push_back(JournalOp{JournalOp::Kind::kPut, cf, std::string(key), std::string(value)});
    }
  }
  void Delete(uint8_t cf, std::string_view key) {
    if (cfs != nullptr) {
      batch.Delete((*cfs)[cf], rocksdb::Slice(key.data(), key.size()));
    } else {
      ops.push_back(JournalOp{JournalOp::Kind::kDelete, cf, std::string(key), {}});
    }
  }
};

}  // namespace kvnode::storage

#endif  // KVNODE_STORAGE_SRC_STORE_INTERNAL_H_
