#include "kvnode/server/dedupe.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvnode/proto/rpc.h"

namespace kvnode::server {
namespace {

// Client record layout, little-endian (docs/format.md "Client records").
// Version 2 added the resume secret (version 1 records are refused, and
// deleted, at load: without a secret their client could not resume anyway).
constexpr uint8_t kRecordVersion = 2;
// u8 version, u8 flags, u16 count, u64 time, u64 floor, 16 bytes secret
constexpr size_t kRecordHeader = 36;
constexpr size_t kSecretAt = 20;
constexpr size_t kRecordEntry = 18;  // u64 sequence, u8 opcode, u8 status, u64 version
constexpr size_t kMaxRecordEntries = 4096;
constexpr uint8_t kFlagHasFloor = 1;

// Writes at `p` (the string is sized first: one allocation per record).
char* PutU64(char* p, uint64_t v) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &v, sizeof(v));
    p += sizeof(v);
  } else {
    for (int i = 0; i < 8; ++i) *p++ = static_cast<char>(v >> (8 * i));
  }
  return p;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

DedupeWindow::DedupeWindow(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

const DedupeEntry* DedupeWindow::Find(uint64_t sequence) const {
  if (order_.empty() || sequence > max_recorded_) return nullptr;
  // From the newest end: a retry is of a recent write. A client that sends
  // old sequences on purpose costs itself one scan of the window each.
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    if (it->sequence == sequence) return &*it;
  }
  return nullptr;
}

DedupeEntry* DedupeWindow::FindEntry(uint64_t sequence) {
  return const_cast<DedupeEntry*>(std::as_const(*this).Find(sequence));
}

void DedupeWindow::Record(const DedupeEntry& e) {
  if (!held_.empty()) {
    auto h = std::lower_bound(held_.begin(), held_.end(), e.sequence);
    if (h != held_.end() && *h == e.sequence) held_.erase(h);
  }
  if (DedupeEntry* same = FindEntry(e.sequence); same != nullptr) {
    *same = e;  // same sequence answered again: keep its place
    return;
  }
  order_.push_back(e);
  max_recorded_ = std::max(max_recorded_, e.sequence);
  // The entry newest_n_ places back from the end has just left Newest()'s
  // n newest: its floor covers it from now on.
  if (newest_n_ != kNoNewestCache && order_.size() > newest_n_) {
    const uint64_t left = order_[order_.size() - 1 - newest_n_].sequence;
    if (!has_newest_floor_ || left > newest_floor_) newest_floor_ = left;
    has_newest_floor_ = true;
  }
  while (order_.size() > capacity_) {
    const uint64_t old = order_.front().sequence;
    order_.pop_front();
    if (!has_floor_ || old > floor_) floor_ = old;
    has_floor_ = true;
    // Newest()'s floor already covers `old` unless it was one of the n
    // newest (n >= capacity); either way it covers floor_, which now does.
    if (newest_n_ != kNoNewestCache) {
      if (!has_newest_floor_ || old > newest_floor_) newest_floor_ = old;
      has_newest_floor_ = true;
    }
  }
}

void DedupeWindow::Hold(uint64_t sequence) {
  auto at = std::lower_bound(held_.begin(), held_.end(), sequence);
  if (at != held_.end() && *at == sequence) return;
  if (held_.size() >= kMaxHeld) {
    // Only the lowest held sequence caps the floor: keep the lowest ones.
    if (sequence > held_.back()) return;
    held_.pop_back();
    at = std::lower_bound(held_.begin(), held_.end(), sequence);
  }
  held_.insert(at, sequence);
}

uint64_t DedupeWindow::LowestHeld(uint64_t except, std::span<const DedupeEntry> recording) const {
  for (uint64_t h : held_) {
    if (h == except) continue;
    if (std::any_of(recording.begin(), recording.end(),
                    [h](const DedupeEntry& e) { return e.sequence == h; })) {
      continue;
    }
    return h;
  }
  return 0;
}

DedupeWindow::Exported DedupeWindow::Export() const {
  Exported out;
  out.entries.assign(order_.begin(), order_.end());
  std::tie(out.has_floor, out.floor) = Capped(has_floor_, floor_, LowestHeld());
  return out;
}

DedupeWindow DedupeWindow::Import(const Exported& state, size_t capacity) {
  DedupeWindow w(capacity);
  w.has_floor_ = state.has_floor;
  w.floor_ = state.floor;
  for (const DedupeEntry& e : state.entries) w.Record(e);
  return w;
}

void DedupeWindow::SetNewestCache(size_t n) const {
  newest_n_ = n;
  has_newest_floor_ = has_floor_;
  newest_floor_ = floor_;
  const size_t skip = order_.size() > n ? order_.size() - n : 0;
  for (size_t i = 0; i < skip; ++i) {
    const uint64_t seq = order_[i].sequence;
    if (!has_newest_floor_ || seq > newest_floor_) newest_floor_ = seq;
    has_newest_floor_ = true;
  }
}

DedupeWindow::Exported DedupeWindow::Newest(size_t n) const {
  Exported out = NewestUncapped(n);
  std::tie(out.has_floor, out.floor) = Capped(out.has_floor, out.floor, LowestHeld());
  return out;
}

DedupeWindow::Exported DedupeWindow::NewestUncapped(size_t n) const {
  if (n != newest_n_) SetNewestCache(n);
  Exported out;
  out.has_floor = has_newest_floor_;
  out.floor = newest_floor_;
  const size_t skip = order_.size() > n ? order_.size() - n : 0;
  out.entries.assign(order_.begin() + static_cast<std::ptrdiff_t>(skip), order_.end());
  return out;
}

PersistedClient PersistedSnapshot(uint64_t client_id, const DedupeWindow& window,
                                  const DedupeEntry& next, size_t keep, uint64_t now_unix_ms,
                                  std::span<const DedupeEntry> earlier) {
  keep = std::max<size_t>(keep, 1);
  PersistedClient c;
  c.client_id = client_id;
  c.written_unix_ms = now_unix_ms;
  if (window.Find(next.sequence) != nullptr) {
    // Record() replaces in place (not reached from HandleRpc, which answers a
    // known sequence from the window): the order does not change.
    c.window = window.Newest(keep);
    for (DedupeEntry& e : c.window.entries) {
      if (e.sequence == next.sequence) e = next;
    }
    return c;
  }
  // Newest(keep - 1) whatever `earlier` holds: the window's cache serves
  // one n; what is more than `keep` then goes under the floor, which stops
  // below the sequences still held once this group is recorded (invariant 4).
  std::vector<DedupeEntry>& entries = c.window.entries;
  c.window = window.NewestUncapped(keep - 1);
  entries.insert(entries.end(), earlier.begin(), earlier.end());
  entries.push_back(next);
  if (entries.size() > keep) {
    const auto drop = static_cast<std::ptrdiff_t>(entries.size() - keep);
    for (auto it = entries.begin(); it != entries.begin() + drop; ++it) {
      if (!c.window.has_floor || it->sequence > c.window.floor) c.window.floor = it->sequence;
      c.window.has_floor = true;
    }
    entries.erase(entries.begin(), entries.begin() + drop);
  }
  std::tie(c.window.has_floor, c.window.floor) = DedupeWindow::Capped(
      c.window.has_floor, c.window.floor, window.LowestHeld(next.sequence, earlier));
  return c;
}

std::string ClientRecordKey(uint64_t client_id) {
  // By hand rather than StrFormat("%016x"): one per write, on the data thread.
  static constexpr char kHex[] = "0123456789abcdef";
  std::string key(kClientRecordPrefix.size() + 16, '0');
  std::copy(kClientRecordPrefix.begin(), kClientRecordPrefix.end(), key.begin());
  for (size_t i = key.size(); i-- > kClientRecordPrefix.size(); client_id >>= 4) {
    key[i] = kHex[client_id & 0xf];
  }
  return key;
}

uint64_t ParseClientRecordKey(std::string_view key) {
  if (key.size() != kClientRecordPrefix.size() + 16 ||
      key.substr(0, kClientRecordPrefix.size()) != kClientRecordPrefix) {
    return 0;
  }
  uint64_t id = 0;
  for (char ch : key.substr(kClientRecordPrefix.size())) {
    int d = -1;
    if (ch >= '0' && ch <= '9') d = ch - '0';
    if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
    if (d < 0) return 0;
    id = (id << 4) | static_cast<uint64_t>(d);
  }
  return id;
}

std::string EncodeClientRecord(const PersistedClient& c) {
  const size_t n = std::min(c.window.entries.size(), kMaxRecordEntries);
  const size_t first = c.window.entries.size() - n;  // keep the newest
  uint8_t flags = c.window.has_floor ? kFlagHasFloor : 0;
  uint64_t floor = c.window.floor;
  for (size_t i = 0; i < first; ++i) {  // dropped here: the floor covers them
    floor = (flags & kFlagHasFloor) ? std::max(floor, c.window.entries[i].sequence)
                                    : c.window.entries[i].sequence;
    flags |= kFlagHasFloor;
  }
  std::string out(kRecordHeader + n * kRecordEntry, '\0');
  char* p = out.data();
  *p++ = static_cast<char>(kRecordVersion);
  *p++ = static_cast<char>(flags);
  *p++ = static_cast<char>(n & 0xff);
  *p++ = static_cast<char>(n >> 8);
  p = PutU64(p, c.written_unix_ms);
  p = PutU64(p, floor);
  std::memcpy(p, c.secret.data(), c.secret.size());
  p += c.secret.size();
  for (size_t i = first; i < c.window.entries.size(); ++i) {
    const DedupeEntry& e = c.window.entries[i];
    p = PutU64(p, e.sequence);
    *p++ = static_cast<char>(e.opcode);
    *p++ = static_cast<char>(e.status);
    p = PutU64(p, e.version);
  }
  return out;
}

absl::StatusOr<PersistedClient> DecodeClientRecord(uint64_t client_id, std::string_view b) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(
        absl::StrCat("client record ", absl::StrFormat("%016x", client_id), ": ", why));
  };
  if (b.size() < kRecordHeader) return bad(absl::StrCat("only ", b.size(), " bytes"));
  if (static_cast<uint8_t>(b[0]) != kRecordVersion) {
    return bad(absl::StrCat("unknown version ", static_cast<int>(static_cast<uint8_t>(b[0]))));
  }
  const uint8_t flags = static_cast<uint8_t>(b[1]);
  if ((flags & ~kFlagHasFloor) != 0) return bad("unknown flags");
  const size_t n = static_cast<uint8_t>(b[2]) | (size_t{static_cast<uint8_t>(b[3])} << 8);
  if (n > kMaxRecordEntries || b.size() != kRecordHeader + n * kRecordEntry) {
    return bad(absl::StrCat(b.size(), " bytes for ", n, " entries"));
  }
  PersistedClient c;
  c.client_id = client_id;
  c.written_unix_ms = GetU64(b.data() + 4);
  c.window.has_floor = (flags & kFlagHasFloor) != 0;
  c.window.floor = GetU64(b.data() + 12);
  if (!c.window.has_floor && c.window.floor != 0) return bad("floor without its flag");
  std::copy_n(reinterpret_cast<const uint8_t*>(b.data()) + kSecretAt, c.secret.size(),
              c.secret.begin());
  for (size_t i = 0; i < n; ++i) {
    const char* p = b.data() + kRecordHeader + i * kRecordEntry;
    DedupeEntry e{GetU64(p), static_cast<uint8_t>(p[8]), static_cast<uint8_t>(p[9]),
                  GetU64(p + 10)};
    const auto op = static_cast<proto::Opcode>(e.opcode);
    const auto st = static_cast<proto::RpcStatus>(e.status);
    if (op != proto::Opcode::kPut && op != proto::Opcode::kDelete) return bad("entry opcode");
    if (st != proto::RpcStatus::kOk && st != proto::RpcStatus::kNotFound &&
        st != proto::RpcStatus::kRejected) {
      return bad("entry status");  // invariant 1: only definitive answers
    }
    c.window.entries.push_back(e);
  }
  // Sorted copy, not a pairwise scan: a corrupted record of 4096 entries must
  // not cost a cold start 16 M comparisons.
  std::vector<uint64_t> seqs;
  seqs.reserve(n);
  for (const DedupeEntry& e : c.window.entries) seqs.push_back(e.sequence);
  std::sort(seqs.begin(), seqs.end());
  if (std::adjacent_find(seqs.begin(), seqs.end()) != seqs.end()) return bad("duplicate sequence");
  return c;
}

}  // namespace kvnode::server
