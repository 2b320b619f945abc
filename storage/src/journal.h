// The write journal: where a new process makes writes durable during a live
// upgrade while RocksDB changes hands (docs/upgrade.md "The writer switch").
//
// A file in the database directory, allocated to its full size when it is
// created (before the writer switch: fallocate, or zeros written where that
// is not supported), so that an append never grows the file and never finds
// the disk full. Each record is the RocksDB batch one write would have
// written, as a list of puts and deletes by column family index. Layout (little-endian,
// docs/format.md):
//
//   file    "KVJRNL01" u64 0 | record* | zeros
//   record  u32 payload_size (> 0) | u32 0 | u64 XXH3(payload) | payload
//   payload u32 op_count | op*
//   op      u8 kind (1 put, 2 delete) | u8 cf | u16 0 | u32 key_size |
//           u32 value_size | key | value
//
// A record is acknowledged only after its append returned, so a torn tail
// (a crash inside an append: size past the end, or a checksum mismatch) was
// never acknowledged: reading stops there.
//
// Replay order (store.cc): every start of a writer reads the journal, writes
// its records into RocksDB in order (synced batches; the new process of an
// upgrade, still appending, writes them in passes, the last under its write
// lock), then retires the file (renamed, the directory synced) before
// RocksDB takes any other write, and removes the retired file later.
// Replaying the same records twice (a crash between a batch and the rename) writes
// the same values again, so it is harmless; replaying them after a newer
// write would not be, hence the order.
//
// Thread safety: a WriteJournal is used by the store's single writer only.
#ifndef KVNODE_STORAGE_SRC_JOURNAL_H_
#define KVNODE_STORAGE_SRC_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/base/unique_fd.h"

namespace kvnode::storage {

struct JournalOp {
  enum class Kind : uint8_t { kPut = 1, kDelete = 2 };
  Kind kind = Kind::kPut;
  uint8_t cf = 0;  // index into the store's column families (db_layout.h)
  std::string key;
  std::string value;  // empty for a delete
  friend bool operator==(const JournalOp&, const JournalOp&) = default;
};

class WriteJournal {
 public:
  // Ops in one record, at most: what every version's reader accepts (a
  // record with more reads as the journal's end). A group commit journaled
  // during the writer switch is bounded by it.
  static constexpr size_t kMaxRecordOps = 16;
  // "KVJRNL01" u64 0: the file's first bytes, before any record.
  static constexpr uint64_t kHeaderSize = 16;

  // The journal of the database at db_path.
  static std::string PathFor(const std::string& db_path);

  // Creates the journal at `path`, `bytes` long (allocated, synced, and the
  // directory synced): by renaming the spare (below) when it has `bytes`,
  // else by allocating. Replaces a journal without records (one left by a
  // new process that never took writes); FailedPrecondition when the file
  // there holds records (they must be replayed first).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<WriteJournal>> Create(const std::string& path,
                                                                            uint64_t bytes);

  // The spare of the journal at `path`: a journal without records, allocated
  // in full, that the next Create takes by a rename. Allocating 32 MiB zeroes
  // every page on tmpfs (100-200 ms of CPU in the TCG guest) and freeing it
  // costs again; with a spare neither happens while an upgrade is under way.
  // No start replays a spare (only `path` is replayed).
  static std::string SparePathFor(const std::string& path);
  // Makes the spare of `path`, `bytes` long, unless one of that size is there
  // (allocated under a temporary name, synced, then renamed).
  [[nodiscard]] static absl::Status MakeSpare(const std::string& path, uint64_t bytes);
  // Makes the retired journal of `path` its spare: zeros over bytes
  // [header, written) -- every byte its writer wrote, records and a torn
  // tail alike (written_to()) -- synced before the rename, so that no old
  // record can be read in a later journal at an offset a new one ends on.
  // Only the process that wrote the journal knows `written`.
  [[nodiscard]] static absl::Status Recycle(const std::string& path, uint64_t written);

  // Appends one write's ops as one record; with `sync`, returns after
  // fdatasync. ResourceExhausted when the record does not fit.
  [[nodiscard]] absl::Status Append(std::span<const JournalOp> ops, bool sync);
  uint64_t records() const { return records_; }
  // The end of every byte this journal ever wrote, whole records or not.
  uint64_t written_to() const { return written_to_; }
  const std::string& path() const { return path_; }

  // Every whole record of the journal at `path`, in order; empty when there
  // is no file. DataLoss for a file that is not a journal.
  [[nodiscard]] static absl::StatusOr<std::vector<std::vector<JournalOp>>> ReadAll(
      const std::string& path);
  // The whole records from byte offset `from` (0: the first; else an `end`
  // returned before), and in *end the offset after the last one. The file
  // is read only as far as its records go, and may be appended to meanwhile
  // (a record not yet whole ends the read).
  [[nodiscard]] static absl::StatusOr<std::vector<std::vector<JournalOp>>> ReadFrom(
      const std::string& path, uint64_t from, uint64_t* end);
  // Removes the journal and syncs the directory. OK when there is none.
  [[nodiscard]] static absl::Status Remove(const std::string& path);
  // Renames the journal to RetiredPathFor(path) and syncs the directory: from
  // then on no start replays it. O(1), where removing a file allocated in full
  // frees every block (seconds for 32 MiB on the TCG guest's tmpfs): a writer
  // retires it under its write lock and removes the retired file after.
  [[nodiscard]] static absl::Status Retire(const std::string& path);
  static std::string RetiredPathFor(const std::string& path);

 private:
  WriteJournal(std::string path, base::UniqueFd fd, uint64_t size)
      : path_(std::move(path)),
        fd_(std::move(fd)),
        size_(size),
        end_(kHeaderSize),
        written_to_(kHeaderSize) {}
  // The spare of `path` renamed to `path`, or null when there is none of
  // `bytes` (one of another size is removed).
  static absl::StatusOr<std::unique_ptr<WriteJournal>> TakeSpare(const std::string& path,
                                                                 uint64_t bytes);

  std::string path_;
  base::UniqueFd fd_;
  uint64_t size_;
  uint64_t end_;         // offset of the next record
  uint64_t written_to_;  // see written_to()
  uint64_t records_ = 0;
  std::string buf_;  // reused by Append
};

}  // namespace kvnode::storage

#endif  // KVNODE_STORAGE_SRC_JOURNAL_H_
