// Bulk preload of a node's database, offline: writes into a kvnode --db_path
// (no node running on it) exactly the records a node would hold after
// `kvload --preload --keys K --key_size S --value_size V` (every key written
// once), in seconds instead of K network round trips. The node started on
// that directory afterwards finds no arena and builds it from RocksDB, as a
// naive restart does.
//
// What it writes (docs/format.md "Generations and clean shutdown"):
//  - default column family: for i in [0, K): key FormatKey(i, S) (kvload's
//    keys, "k" + zero-padded decimal, all S bytes long, so key order is index
//    order), value = u64 store version (base + i + 1) + kvload's value for
//    that key: EncodeVerifiedValue(key, load_version, V) when V >= 32 (what
//    kvload writes, with or without --verify), else V zero bytes (ditto).
//    Written by storage's BulkLoad (kvnode/storage/bulk_load.h): SST files
//    ingested by RocksDB, no memtable, no WAL.
//  - kvnode.meta: last_version = base + K (base = the previous last_version,
//    0 in a new database), and, when the database already had a generation,
//    generation + 1: an arena left clean by an earlier node then no longer
//    matches the database and is rebuilt instead of re-attached without the
//    new records.
// The data column family must be empty (FailedPrecondition otherwise): the
// tool adds keys, it does not merge with existing ones.
//
// load_version: the version inside the verified values. kvload's versions
// are (its start time in seconds << 24) + n, and a value at or below its own
// base counts as an earlier run's, so the default, (now in seconds << 24),
// keeps `kvload --verify` on the filled node judging reads correctly.
#ifndef KVNODE_FILL_FILL_H_
#define KVNODE_FILL_FILL_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvnode::fill {

struct FillOptions {
  // The node's --db_path (required). Created if missing.
  std::string db_path = "";
  // kvload's --keys, --key_size, --value_size (defaults are kvload's).
  uint64_t keys = 100000;
  uint64_t key_size = 16;
  uint64_t value_size = 64;
  // Version carried inside verified values; 0 = (unix seconds now) << 24.
  uint64_t load_version = 0;
  // Keys per SST file (each file is written, then all are ingested at once).
  // Default 262144 (~25 MiB of 64-byte values).
  uint64_t keys_per_file = 262144;

  // Names the offending field; the key and value rules are kvload's.
  [[nodiscard]] absl::Status Validate() const;
};

struct FillResult {
  uint64_t keys = 0;
  uint64_t files = 0;
  uint64_t sst_bytes = 0;      // bytes of SST written
  uint64_t first_version = 0;  // store version of key 0
  uint64_t last_version = 0;   // the database's last_version afterwards
  uint64_t load_version = 0;   // version inside the values
  bool generation_bumped = false;
};

// `progress(keys_written)` is called after each SST file (may be empty).
[[nodiscard]] absl::StatusOr<FillResult> FillDb(
    const FillOptions& options, const std::function<void(uint64_t keys_done)>& progress = {});

}  // namespace kvnode::fill

#endif  // KVNODE_FILL_FILL_H_
