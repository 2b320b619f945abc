// The store's RocksDB layout (docs/format.md), shared by the store and the
// offline fill tool (storage/tools/fill.cc), which writes the same records
// without a node. Internal to storage/.
#ifndef KVNODE_STORAGE_SRC_DB_LAYOUT_H_
#define KVNODE_STORAGE_SRC_DB_LAYOUT_H_

#include <linux/magic.h>
#include <sys/vfs.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kvnode/storage/format.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/status.h"

namespace kvnode::storage::dblayout {

// Column families: [0] the data (key -> u64 version + value bytes), [1] meta.
inline constexpr char kMetaCf[] = "kvnode.meta";
inline constexpr char kGenerationKey[] = "generation";
inline constexpr char kLastVersionKey[] = "last_version";
// ArenaHeader::arena_id of the arena the last claimer wrote (with the
// generation): a dirty arena is taken back after a crash only if it is this
// database's.
inline constexpr char kArenaIdKey[] = "arena_id";
// Generation of the writer whose write is the latest in the database (written
// with its first write): tells an old process whether a newer one wrote.
inline constexpr char kWrittenGenerationKey[] = "written_generation";
inline constexpr char kSidePrefix[] = "side/";  // + SideRecord::key (docs/format.md)
inline constexpr size_t kVersionPrefix = 8;     // RocksDB value = u64 version + value bytes

// A PUT of a key whose newest record is in the memtable overwrites that
// record in place when the new one is no longer (every value record of a
// fixed-size workload, a client's dedupe record, last_version) instead of
// inserting another: the memtable holds one record per key, not one per
// write, so an insert searches a skip list of the live keys (log n of
// thousands, not of the hundreds of thousands of versions a 64 MiB memtable
// held), and a new process's WAL replay builds that small table too. It
// costs what the node does not use: snapshots and iterators concurrent with
// writes see no consistent point in time (the node iterates only before it
// serves: the rebuild, the dedupe records at start). Measured in
// docs/BENCHMARKS.md, "PUT: where a PUT's CPU goes".
inline std::vector<rocksdb::ColumnFamilyDescriptor> ColumnFamilies() {
  rocksdb::ColumnFamilyOptions cfo;
  cfo.inplace_update_support = true;
  return {{rocksdb::kDefaultColumnFamilyName, cfo}, {kMetaCf, cfo}};
}

// The options every opener of the database uses with ColumnFamilies().
inline rocksdb::DBOptions DbOptions() {
  rocksdb::DBOptions dbo;
  // In-place updates require a single memtable writer (the store has one).
  dbo.allow_concurrent_memtable_write = false;
  // Overwrites no longer fill the memtable, so memtable size no longer
  // bounds the WAL: at this total the column families holding the oldest
  // WAL are flushed. A live upgrade's new process replays the WAL when it
  // opens the database: this bounds that work (RocksDB's default would be
  // 4 x the write buffers, 1 GiB here).
  dbo.max_total_wal_size = 64 << 20;
  return dbo;
}

// Whether `path` (or its parent, when it does not exist yet) is on tmpfs.
// There RocksDB's fallocate buys nothing (no blocks to keep contiguous) and
// costs the zeroing of every preallocated page: a new WAL's preallocation
// (blocks sized from the write buffer, tens of MiB) stalled the first writes
// after a live upgrade's RocksDB open for 1.6-2.5 s in the TCG guest.
inline bool OnTmpfs(const std::string& path) {
  struct statfs st {};
  if (::statfs(path.c_str(), &st) != 0) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return false;
    const std::string parent = slash == 0 ? "/" : path.substr(0, slash);
    if (::statfs(parent.c_str(), &st) != 0) return false;
  }
  return st.f_type == TMPFS_MAGIC;
}

// A u64 meta record's bytes.
inline std::string U64(uint64_t v) {
  std::string s(8, '\0');
  StoreU64(s.data(), v);
  return s;
}

// A RocksDB status as a Status saying `what` failed; the database's lock held
// by another process is Unavailable.
inline absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": rocksdb: ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
    return absl::UnavailableError(msg);  // held by another process
  }
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

}  // namespace kvnode::storage::dblayout

#endif  // KVNODE_STORAGE_SRC_DB_LAYOUT_H_
