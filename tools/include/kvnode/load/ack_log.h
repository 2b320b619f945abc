// The ack log: an append-only file of writes the server acknowledged, so that
// a later `kvload --audit FILE` (after restarts, crashes, live upgrades) can
// check that every one of them is still readable.
//
// File format (little endian):
//
//   file    := header record*
//   header  := magic "KVACKLG1" (8 bytes)
//   record  := checksum u32 | key_len u16 | type u8 | zero u8 | version u64 | key
//              checksum = XXH32(key_len .. end of key, seed 0)
//              type     = 1 PUT, 2 DELETE;  1 <= key_len <= storage::kMaxKeySize
//
// Records are appended whole with write(2) from a buffer; a crash (of kvload
// or the machine) can leave a torn final record. The reader stops at the
// first record that is short or fails its checksum: if no more than one
// maximal record's worth of bytes remain from there it is a torn tail,
// tolerated and reported; otherwise the log is corrupt (DataLoss).
// Opening an existing log for append cuts a torn tail off first.
#ifndef KVNODE_CLIENT_LOAD_ACK_LOG_H_
#define KVNODE_CLIENT_LOAD_ACK_LOG_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace kvnode::load {

inline constexpr std::string_view kAckLogMagic = "KVACKLG1";
inline constexpr size_t kAckRecordHeaderSize = 16;

struct AckRecord {
  std::string key;
  uint64_t version = 0;
  bool deleted = false;
  friend bool operator==(const AckRecord&, const AckRecord&) = default;
};

struct AckLogContents {
  std::vector<AckRecord> records;
  uint64_t valid_bytes = 0;      // header + whole valid records
  uint64_t torn_tail_bytes = 0;  // bytes after them that were ignored
};

// Parses a whole log image. DataLoss on a bad header or on corruption that
// is not a torn tail.
[[nodiscard]] absl::StatusOr<AckLogContents> ParseAckLog(std::string_view data);
[[nodiscard]] absl::StatusOr<AckLogContents> ReadAckLog(const std::string& path);

struct AckLogOptions {
  // Bytes buffered before a write(2). Default 64 KiB. 0 = write every record
  // immediately. Records still in the buffer are lost if kvload crashes
  // (which only makes the audit check fewer writes, never wrongly fail).
  size_t buffer_bytes = 64 * 1024;
  // fdatasync after each write(2) of the buffer. Default false: a crash of
  // kvload keeps what was written; only a machine crash loses the page cache.
  bool sync = false;
};

// Appends records; thread-safe (one mutex around a buffer).
class AckLogWriter {
 public:
  // Creates `path` or appends to an existing log (cutting a torn tail off;
  // torn_tail_bytes() says how much). Fails on a file that is not an ack log.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<AckLogWriter>> Open(
      const std::string& path, const AckLogOptions& options = {});
  ~AckLogWriter();  // flushes; a failure is logged
  AckLogWriter(const AckLogWriter&) = delete;
  AckLogWriter& operator=(const AckLogWriter&) = delete;

  [[nodiscard]] absl::Status Append(std::string_view key, uint64_t version, bool deleted);
  [[nodiscard]] absl::Status Flush();

  uint64_t torn_tail_bytes() const { return torn_tail_bytes_; }
  uint64_t records_appended() const;

 private:
  AckLogWriter(int fd, std::string path, AckLogOptions options, uint64_t torn)
      : fd_(fd), path_(std::move(path)), options_(options), torn_tail_bytes_(torn) {}
  absl::Status FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int fd_;
  const std::string path_;
  const AckLogOptions options_;
  const uint64_t torn_tail_bytes_;
  mutable absl::Mutex mu_;
  std::string buffer_ ABSL_GUARDED_BY(mu_);
  uint64_t appended_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status sticky_error_ ABSL_GUARDED_BY(mu_);
};

// ---- audit ----

// Reads one key from the node: the value, nullopt for NOT_FOUND, or an error
// (timeout, connection lost...).
using AuditReadFn =
    std::function<absl::StatusOr<std::optional<std::string>>(const std::string& key)>;

struct AuditIssue {
  std::string key;
  uint64_t expected_version = 0;
  bool expected_deleted = false;
  std::string problem;  // e.g. "missing", "stale: version 3 < 5"
};

struct AuditReport {
  uint64_t records = 0;  // records in the log
  uint64_t keys = 0;     // distinct keys checked
  uint64_t ok = 0;
  uint64_t missing = 0;            // acknowledged PUT, NOT_FOUND now
  uint64_t stale = 0;              // readable, but older than acknowledged
  uint64_t resurrected = 0;        // acknowledged DELETE, an older value is back
  uint64_t corrupt = 0;            // value fails its checksum
  uint64_t wrong_key = 0;          // another key's value
  uint64_t read_errors = 0;        // the read itself failed
  std::vector<AuditIssue> issues;  // the first max_issues problems

  bool passed() const { return ok == keys; }
  nlohmann::json ToJson() const;
};

// For every key in `records`, takes the acknowledged write with the highest
// version and checks the node against it: a PUT must be readable at that
// version or newer; a DELETE must read NOT_FOUND or a newer version (a later
// write may have been sent but not acknowledged). Keys are read in sorted
// order, one at a time.
AuditReport Audit(const std::vector<AckRecord>& records, const AuditReadFn& read,
                  size_t max_issues = 100);

}  // namespace kvnode::load

#endif  // KVNODE_CLIENT_LOAD_ACK_LOG_H_
