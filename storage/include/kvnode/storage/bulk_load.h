// Offline bulk ingest into a node's database: writes into a kvnode
// --db_path (no node running on it) the records a node would hold after each
// key was written once, as SST files that RocksDB ingests (no memtable, no
// WAL), in seconds instead of one network round trip per key. A node started
// on the directory afterwards builds its arena from RocksDB, as after a
// restart.
//
// What it writes (docs/format.md "Generations and clean shutdown"):
//  - the data column family: record i's key, value = u64 store version
//    (base + i + 1) + record i's value bytes;
//  - kvnode.meta: last_version = base + count (base = the previous
//    last_version, 0 in a new database), and, when the database already had a
//    generation, generation + 1: an arena left clean by an earlier node then
//    no longer matches the database and is rebuilt instead of re-attached
//    without the new records.
// The data column family must be empty (FailedPrecondition otherwise): bulk
// load adds keys, it does not merge with existing ones. A running node holding
// the database makes it fail with Unavailable (RocksDB's lock).
#ifndef KVNODE_STORAGE_BULK_LOAD_H_
#define KVNODE_STORAGE_BULK_LOAD_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvnode::storage {

struct BulkLoadOptions {
  // The node's --db_path (required). Created if missing.
  std::string db_path = "";
  // Records per SST file (each file is written, then all are ingested at
  // once; progress is reported per file). Default 262144.
  uint64_t records_per_file = 262144;

  // Names the offending field.
  [[nodiscard]] absl::Status Validate() const;
};

struct BulkLoadResult {
  uint64_t records = 0;
  uint64_t files = 0;
  uint64_t sst_bytes = 0;      // bytes of SST written
  uint64_t first_version = 0;  // store version of record 0
  uint64_t last_version = 0;   // the database's last_version afterwards
  bool generation_bumped = false;
};

// Produces record i: sets *key and *value. Keys must be strictly ascending in
// i (bytewise), as SST files require; a key out of order fails the load with
// InvalidArgument.
using BulkRecordFn = std::function<void(uint64_t i, std::string* key, std::string* value)>;

// Writes records 0 .. count-1. `progress(records_written)` is called after
// each SST file (may be empty).
[[nodiscard]] absl::StatusOr<BulkLoadResult> BulkLoad(
    const BulkLoadOptions& options, uint64_t count, const BulkRecordFn& record,
    const std::function<void(uint64_t records_done)>& progress = {});

}  // namespace kvnode::storage

#endif  // KVNODE_STORAGE_BULK_LOAD_H_
