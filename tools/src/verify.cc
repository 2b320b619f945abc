#include "kvnode/load/verify.h"

#include <xxhash.h>

#include <cstring>

#include "kvnode/load/rng.h"

namespace kvnode::load {
namespace {

constexpr uint32_t kValueMagic = 0x3156564b;  // "KVV1"
constexpr size_t kChecksumOffsetFromEnd = 8;

void Store(char* p, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

uint64_t Load(const char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Monotonic max on an atomic.
void StoreMax(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v &&
         !a.compare_exchange_weak(cur, v, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

}  // namespace

uint64_t KeyHash(std::string_view key) { return XXH3_64bits(key.data(), key.size()); }

void EncodeVerifiedValue(std::string_view key, uint64_t version, std::span<char> out) {
  const size_t n = out.size();
  if (n < kMinVerifiedValueSize) return;  // documented precondition
  char* p = out.data();
  const uint64_t kh = KeyHash(key);
  Store(p, kValueMagic, 4);
  Store(p + 4, n, 4);
  Store(p + 8, kh, 8);
  Store(p + 16, version, 8);
  uint64_t state = kh ^ (version * 0x9e3779b97f4a7c15ull);
  for (size_t off = 24; off < n - kChecksumOffsetFromEnd; off += 8) {
    Store(p + off, SplitMix64(state), std::min<size_t>(8, n - kChecksumOffsetFromEnd - off));
  }
  Store(p + n - 8, XXH3_64bits(p, n - kChecksumOffsetFromEnd), 8);
}

std::string EncodeVerifiedValue(std::string_view key, uint64_t version, size_t value_size) {
  std::string v(std::max(value_size, kMinVerifiedValueSize), '\0');
  EncodeVerifiedValue(key, version, std::span<char>(v.data(), v.size()));
  return v;
}

CheckedValue CheckVerifiedValue(std::string_view key, std::string_view value) {
  CheckedValue r;
  const size_t n = value.size();
  if (n < kMinVerifiedValueSize) return r;
  const char* p = value.data();
  if (Load(p, 4) != kValueMagic || Load(p + 4, 4) != n) return r;
  if (Load(p + n - 8, 8) != XXH3_64bits(p, n - kChecksumOffsetFromEnd)) return r;
  if (Load(p + 8, 8) != KeyHash(key)) {
    r.check = ValueCheck::kWrongKey;
    return r;
  }
  r.check = ValueCheck::kOk;
  r.version = Load(p + 16, 8);
  return r;
}

std::string_view ReadVerdictName(ReadVerdict v) {
  switch (v) {
    case ReadVerdict::kOk:
      return "ok";
    case ReadVerdict::kCorrupt:
      return "corrupt";
    case ReadVerdict::kWrongKey:
      return "wrong_key";
    case ReadVerdict::kStale:
      return "stale";
    case ReadVerdict::kMissing:
      return "missing";
    case ReadVerdict::kUnknownVersion:
      return "unknown_version";
  }
  return "?";
}

VersionTracker::VersionTracker(uint64_t keys, uint64_t base_version)
    : keys_(keys), base_(base_version), entries_(new Entry[keys]) {}

uint64_t VersionTracker::BeginWrite(uint64_t key, bool is_delete) {
  Entry& e = entries_[key];
  uint64_t cur = e.issued.load(std::memory_order_relaxed);
  uint64_t next;
  do {
    next = std::max(cur, base_) + 1;
  } while (!e.issued.compare_exchange_weak(cur, next, std::memory_order_acq_rel,
                                           std::memory_order_relaxed));
  if (is_delete) StoreMax(e.delete_issued, next);
  return next;
}

void VersionTracker::AckWrite(uint64_t key, uint64_t version, bool is_delete) {
  StoreMax(entries_[key].acked, (version << 1) | (is_delete ? 1 : 0));
}

ReadSnapshot VersionTracker::Snapshot(uint64_t key) const {
  const uint64_t a = entries_[key].acked.load(std::memory_order_acquire);
  return ReadSnapshot{a >> 1, (a & 1) != 0};
}

uint64_t VersionTracker::IssuedMax(uint64_t key) const {
  return entries_[key].issued.load(std::memory_order_acquire);
}

ReadVerdict VersionTracker::CheckRead(uint64_t key, std::string_view key_bytes,
                                      const ReadSnapshot& at_issue,
                                      std::optional<std::string_view> value) const {
  const Entry& e = entries_[key];
  if (!value.has_value()) {
    // NOT_FOUND is right if nothing was acknowledged before the read, if the
    // last acknowledged write was a DELETE, or if a DELETE newer than it was
    // issued (it may have been applied before the read).
    if (at_issue.acked_version == 0 || at_issue.acked_deleted) return ReadVerdict::kOk;
    if (e.delete_issued.load(std::memory_order_acquire) > at_issue.acked_version) {
      return ReadVerdict::kOk;
    }
    return ReadVerdict::kMissing;
  }
  const CheckedValue c = CheckVerifiedValue(key_bytes, *value);
  if (c.check == ValueCheck::kCorrupt) return ReadVerdict::kCorrupt;
  if (c.check == ValueCheck::kWrongKey) return ReadVerdict::kWrongKey;
  // A DELETE's version names no value; seeing a value at or below the last
  // acknowledged version (PUT or DELETE) means the read went back in time.
  if (c.version < at_issue.acked_version ||
      (at_issue.acked_deleted && c.version <= at_issue.acked_version)) {
    return ReadVerdict::kStale;
  }
  // Versions at or below the base belong to earlier runs: only reachable
  // when nothing newer was acknowledged, which the check above covers.
  if (c.version > base_ && c.version > e.issued.load(std::memory_order_acquire)) {
    return ReadVerdict::kUnknownVersion;
  }
  return ReadVerdict::kOk;
}

}  // namespace kvnode::load
