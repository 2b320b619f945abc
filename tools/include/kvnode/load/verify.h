// Verified values: every value kvload writes says which key it belongs to and
// which version of that key it is, under a checksum, so every read can be
// judged: corrupt, another key's value, stale (older than a write this
// process saw acknowledged before the read was issued), a version nobody
// wrote, or a lost key.
//
// Value layout (value_size >= kMinVerifiedValueSize = 32 bytes, little
// endian):
//
//   0       u32  magic "KVV1"
//   4       u32  value_size (the whole value)
//   8       u64  key hash    XXH3_64bits(key)
//   16      u64  version     per key, increasing
//   24      ...  filler      deterministic bytes derived from (key hash, version)
//   size-8  u64  checksum    XXH3_64bits(bytes [0, size-8))
#ifndef KVNODE_CLIENT_LOAD_VERIFY_H_
#define KVNODE_CLIENT_LOAD_VERIFY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace kvnode::load {

inline constexpr size_t kMinVerifiedValueSize = 32;

uint64_t KeyHash(std::string_view key);

// Fills `out` (out.size() >= kMinVerifiedValueSize, the value size) with the
// value of `key` at `version`. Writes straight into a registered buffer.
void EncodeVerifiedValue(std::string_view key, uint64_t version, std::span<char> out);
// value_size >= kMinVerifiedValueSize.
std::string EncodeVerifiedValue(std::string_view key, uint64_t version, size_t value_size);

enum class ValueCheck {
  kOk,
  kCorrupt,   // too short, bad magic, size field wrong, or checksum mismatch
  kWrongKey,  // intact, but written for another key
};

struct CheckedValue {
  ValueCheck check = ValueCheck::kCorrupt;
  uint64_t version = 0;  // valid when check == kOk
};

// Checks a value read for `key`. Never trusts `value`.
CheckedValue CheckVerifiedValue(std::string_view key, std::string_view value);

// The judgement of one read.
enum class ReadVerdict {
  kOk,
  kCorrupt,         // see ValueCheck::kCorrupt
  kWrongKey,        // see ValueCheck::kWrongKey
  kStale,           // older than the last write acknowledged before the read was issued
  kMissing,         // NOT_FOUND, but a PUT was acknowledged and no DELETE issued since
  kUnknownVersion,  // newer than any version issued by this process (since its base)
};
inline constexpr int kReadVerdictCount = 6;
std::string_view ReadVerdictName(ReadVerdict v);  // "ok", "corrupt", "wrong_key", ...

// What a reader knew when it issued a read; taken by VersionTracker::Snapshot.
struct ReadSnapshot {
  uint64_t acked_version = 0;  // 0 = no acknowledged write in this process
  bool acked_deleted = false;
};

// Per-key versions of one kvload process, shared by all its threads.
//
// Versions: BeginWrite hands out max(issued, base_version) + 1, so versions
// of a key only grow, and a base_version above anything an earlier run wrote
// (e.g. seconds since the epoch << 24) keeps them growing across runs.
//
// Contract (what makes "stale" meaningful):
//  1. Each key has at most one write in flight at a time (kvload partitions
//     keys among writers or serialises writes per key).
//  2. A reader calls Snapshot(key) before issuing the read and CheckRead()
//     after it completes; a read may legitimately return any version from the
//     snapshot's acknowledged one up to the newest issued by then.
//  3. A failed or timed-out write stays "issued": a later read may see it.
// Thread-safe (per-key atomics); no locks.
class VersionTracker {
 public:
  VersionTracker(uint64_t keys, uint64_t base_version = 0);

  uint64_t keys() const { return keys_; }

  // Returns the version the write must carry (encode it into the value).
  uint64_t BeginWrite(uint64_t key, bool is_delete);
  // The server acknowledged the write of `version` (monotonic per key: an
  // older acknowledgement never overrides a newer one).
  void AckWrite(uint64_t key, uint64_t version, bool is_delete);

  ReadSnapshot Snapshot(uint64_t key) const;
  // `value` is the value read, or nullopt for NOT_FOUND.
  ReadVerdict CheckRead(uint64_t key, std::string_view key_bytes, const ReadSnapshot& at_issue,
                        std::optional<std::string_view> value) const;

  // Latest acknowledged state (for tests and reports).
  ReadSnapshot Acked(uint64_t key) const { return Snapshot(key); }
  uint64_t IssuedMax(uint64_t key) const;

 private:
  struct Entry {
    std::atomic<uint64_t> acked{0};          // version << 1 | deleted
    std::atomic<uint64_t> issued{0};         // highest version issued
    std::atomic<uint64_t> delete_issued{0};  // highest DELETE version issued
  };
  const uint64_t keys_;
  const uint64_t base_;
  std::unique_ptr<Entry[]> entries_;
};

}  // namespace kvnode::load

#endif  // KVNODE_CLIENT_LOAD_VERIFY_H_
