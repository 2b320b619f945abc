// Operation histories: what each client asked, when, and what it was told,
// written by `kvload --history FILE` and judged by kvhistory (linearize.h).
//
// File format (text, one operation per line, fields separated by one TAB):
//
//   # kvnode history v1            first line, exactly
//   client op key call_ns return_ns outcome value
//
//   client     client index (decimal), for the reader only
//   op         GET | PUT | DELETE
//   key        the key's bytes (no TAB, CR or LF; kvload's keys are "k0001...")
//   call_ns    clock reading before the operation was submitted
//   return_ns  clock reading after its completion (or failure) was seen
//              Both from one monotonic clock (kvload: steady_clock, ns since
//              its start): every operation took effect inside
//              [call_ns, return_ns] if it took effect at all.
//   outcome    ok | not_found | failed
//              failed: no answer (deadline, connection lost for good,
//              REJECTED...). A failed GET says nothing; a failed PUT or
//              DELETE may or may not have been applied, at any time after
//              its call: its outcome is unknown.
//   value      PUT: an id of the value written (kvload: its version, unique
//              per key and write); GET ok: the id of the value read (kvload:
//              the version it carries, "corrupt:<hex>" or "wrong_key:<hex>"
//              for one that fails the check, never a written id); else "-".
//
// Lines may come in any order (kvload appends each thread's lines in
// chunks). Other lines starting with '#' and empty lines are ignored.
#ifndef KVNODE_CLIENT_LOAD_HISTORY_H_
#define KVNODE_CLIENT_LOAD_HISTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvnode::load {

inline constexpr std::string_view kHistoryHeader = "# kvnode history v1";

enum class HistoryOpKind : uint8_t { kGet, kPut, kDelete };
enum class HistoryOutcome : uint8_t { kOk, kNotFound, kFailed };

std::string_view HistoryOpKindName(HistoryOpKind k);    // "GET", "PUT", "DELETE"
std::string_view HistoryOutcomeName(HistoryOutcome o);  // "ok", "not_found", "failed"

// One operation as written (views into the caller's bytes).
struct HistoryEvent {
  uint32_t client = 0;
  HistoryOpKind kind = HistoryOpKind::kGet;
  std::string_view key;
  uint64_t call_ns = 0;
  uint64_t return_ns = 0;
  HistoryOutcome outcome = HistoryOutcome::kOk;
  std::string_view value;  // "" is written as "-"
};

// One operation as read back.
struct HistoryOp {
  uint32_t client = 0;
  HistoryOpKind kind = HistoryOpKind::kGet;
  std::string key;
  uint64_t call_ns = 0;
  uint64_t return_ns = 0;
  HistoryOutcome outcome = HistoryOutcome::kOk;
  std::string value;  // empty for "-"
  uint64_t line = 0;  // 1-based line in its file (0: not from a file)
};

// Appends `e` as one line (with its '\n') to *out. No allocation once *out
// has room: kvload's per-operation path.
void AppendHistoryLine(const HistoryEvent& e, std::string* out);

// Parses one line (without its '\n'). Rejects what the format forbids: a
// wrong field count, an unknown op or outcome, call_ns > return_ns, a PUT
// without a value or answered not_found, a GET ok without a value.
[[nodiscard]] absl::StatusOr<HistoryOp> ParseHistoryLine(std::string_view line);

// A whole file's operations; errors name "path:line".
[[nodiscard]] absl::StatusOr<std::vector<HistoryOp>> ParseHistory(std::string_view text,
                                                                  std::string_view name);
[[nodiscard]] absl::StatusOr<std::vector<HistoryOp>> ReadHistory(const std::string& path);

// Writes a history file: the header at Create, then chunks of whole lines
// (each thread buffers its own lines and hands them over in large chunks,
// so the load is not slowed per operation). Thread-safe.
class HistoryWriter {
 public:
  // Creates or truncates `path`.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HistoryWriter>> Create(
      const std::string& path);
  ~HistoryWriter();
  HistoryWriter(const HistoryWriter&) = delete;
  HistoryWriter& operator=(const HistoryWriter&) = delete;

  // Writes `lines` (whole lines) with write(2). The first error sticks.
  [[nodiscard]] absl::Status Append(std::string_view lines);
  // fsync-free close; returns the first error of any Append or the close.
  [[nodiscard]] absl::Status Close();

 private:
  HistoryWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);
  const std::string path_;
  absl::Status sticky_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvnode::load

#endif  // KVNODE_CLIENT_LOAD_HISTORY_H_
