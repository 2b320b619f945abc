// The store's write path: groups of writes made durable by one RocksDB
// batch (or one journal record during the writer switch), then published to
// the arena under a write intent naming every key; and the reconciliation of
// an intent a dead writer left behind.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "db_layout.h"
#include "glog/logging.h"
#include "index.h"
#include "journal.h"
#include "kvnode/storage/store.h"
#include "store_internal.h"

namespace kvnode::storage {

using dblayout::FromRocks;
using dblayout::kLastVersionKey;
using dblayout::kSidePrefix;
using dblayout::kWrittenGenerationKey;
using dblayout::U64;

// The write intent (arena.h) names the keys of one durable write. One key:
// key_len and existed are the key's, as every version of the node has
// written them. Several (a group): key_len is kGroupIntent, existed the
// number of keys, reserved the bytes used in key[]: per key a byte
// "existed", a little-endian u16 length and the key. kGroupIntent is above
// kMaxKeySize, so a binary that predates groups (a rollback) finds such an
// intent untrustworthy and rebuilds the arena from RocksDB.
namespace {
constexpr uint64_t kGroupIntent = ~uint64_t{0};
constexpr size_t kIntentKeyHeader = 3;
constexpr size_t kIntentCapacity = sizeof(WriteIntent::key);

size_t IntentBytes(std::string_view key) { return kIntentKeyHeader + key.size(); }
}  // namespace

absl::Status Store::BeginIntent(std::span<const IntentKey> keys) {
  if (absl::Status s = ReconcileIntent(); !s.ok()) return s;
  WriteIntent& in = arena_->header()->intent;
  if (keys.size() == 1) {
    std::memcpy(in.key, keys[0].key.data(), keys[0].key.size());
    in.key_len = keys[0].key.size();
    in.existed = keys[0].existed ? 1 : 0;
  } else {
    size_t at = 0;
    for (const IntentKey& k : keys) {
      in.key[at] = k.existed ? 1 : 0;
      in.key[at + 1] = static_cast<char>(k.key.size() & 0xff);
      in.key[at + 2] = static_cast<char>(k.key.size() >> 8);
      std::memcpy(in.key + at + kIntentKeyHeader, k.key.data(), k.key.size());
      at += IntentBytes(k.key);
    }
    in.key_len = kGroupIntent;
    in.existed = keys.size();
    in.reserved = at;
  }
  // Release: whoever finds the state set after this process died (SIGKILL
  // leaves every store already made in the shared mapping) finds the keys too.
  // The RocksDB write that follows is a system call, after this store.
  HeaderWord(in.state).store(kIntentPending, std::memory_order_release);
  return absl::OkStatus();
}

void Store::EndIntent() {
  // Release: the publication's stores are in the mapping before the clear.
  HeaderWord(arena_->header()->intent.state).store(0, std::memory_order_release);
}

absl::Status Store::ReconcileIntent() {
  WriteIntent& in = arena_->header()->intent;
  if (HeaderWord(in.state).load(std::memory_order_acquire) == 0) return absl::OkStatus();
  // The keys, checked before anything is republished.
  std::vector<IntentKey> keys;
  if (in.key_len != kGroupIntent) {
    if (in.key_len != 0 && in.key_len <= kMaxKeySize) {
      keys.push_back({std::string_view(in.key, in.key_len), in.existed != 0});
    }
  } else if (in.reserved <= kIntentCapacity) {
    for (size_t at = 0; at + kIntentKeyHeader <= in.reserved && keys.size() < in.existed;) {
      const size_t len = static_cast<uint8_t>(in.key[at + 1]) |
                         (size_t{static_cast<uint8_t>(in.key[at + 2])} << 8);
      if (len == 0 || len > kMaxKeySize || at + kIntentKeyHeader + len > in.reserved) break;
      keys.push_back({std::string_view(in.key + at + kIntentKeyHeader, len), in.key[at] != 0});
      at += kIntentKeyHeader + len;
    }
    if (keys.size() != in.existed) keys.clear();
  }
  if (keys.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "arena ", arena_->path(), ": a malformed pending write intent (key length ", in.key_len,
        "): the arena cannot be trusted; a cold start rebuilds it from ", options_.db_path));
  }
  if (db_ == nullptr) {
    // A journal append that failed: whether it reached the disk is known
    // when the journal is replayed; the reconciliation waits for RocksDB.
    return absl::UnavailableError("a failed write is reconciled once RocksDB is open here");
  }
  for (const IntentKey& k : keys) {
    if (absl::Status s = Republish(k.key, k.existed); !s.ok()) return s;
  }
  EndIntent();
  LOG(WARNING) << "arena " << arena_->path() << ": republished " << keys.size()
               << " key(s) whose write was interrupted between RocksDB and the arena";
  return absl::OkStatus();
}

// Every step here may repeat one the dead writer's publication already took
// (index.h invariant 10): it may leave a marker too many, never one too few.
absl::Status Store::Republish(std::string_view key, bool existed) {
  GetResult cur;
  absl::StatusOr<bool> has = ReadFromDb(key, &cur);
  if (!has.ok()) return has.status();
  absl::MutexLock a(&arena_mu_);
  if (writer_ == nullptr) return absl::FailedPreconditionError("not the arena's writer");
  if (*has) {
    // A publication cut short may already have made the key resident (and
    // counted it).
    existed = existed || writer_->Find(key).resident_slot != 0;
    writer_->Upsert(key, cur.value, cur.version, existed, /*allow_evict=*/true);
  } else {
    // Not Remove(key, existed): the publication may already have cleared the
    // key's marker, and a second marker with its fingerprint is another
    // key's cover.
    writer_->RemoveIfResident(key);
  }
  return absl::OkStatus();
}

// Whether a PUT/DELETE of `key` finds it stored: resident in the arena, or
// (when the index cannot rule it out) in RocksDB. The answer decides the
// index's live count and goes into the dedupe side record.
absl::StatusOr<bool> Store::ExistsForWrite(std::string_view key, uint64_t* home_bucket) {
  if (db_ == nullptr && journal_ == nullptr) {
    return absl::FailedPreconditionError("not the writer: database not open in this process");
  }
  IndexWriter::Probe p;
  {
    absl::ReaderMutexLock a(&arena_mu_);
    if (writer_ == nullptr) {
      return absl::FailedPreconditionError(
          "not the writer: this process no longer writes the arena");
    }
    p = writer_->Find(key);
  }
  *home_bucket = p.home_bucket;
  if (p.resident_slot != 0) return true;
  if (!p.maybe_nonresident()) return false;
  if (db_ == nullptr) {
    return absl::UnavailableError(
        "whether the key exists is known to RocksDB only, which is changing hands");
  }
  return DbContains(key);
}

absl::Status Store::Commit(WriteSet& w) {
  if (db_ != nullptr) {
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync_writes;
    return FromRocks(db_->Write(wo, &w.batch), "write");
  }
  if (absl::Status s = journal_->Append(w.ops, options_.sync_writes); !s.ok()) {
    // A full journal: the write waits for RocksDB like a paused one.
    if (absl::IsResourceExhausted(s)) return absl::UnavailableError(s.message());
    return s;
  }
  journaled_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Store::Put(std::string_view key, std::string_view value,
                                    const SideRecord* side) {
  const WriteOp op{WriteOp::Kind::kPut, key, value, side};
  WriteResult r;
  Write({&op, 1}, {&r, 1});
  if (!r.status.ok()) return r.status;
  return r.version;
}

absl::Status Store::Delete(std::string_view key, const SideRecord* side) {
  const WriteOp op{WriteOp::Kind::kDelete, key, {}, side};
  WriteResult r;
  Write({&op, 1}, {&r, 1});
  return r.status;
}

struct Store::Group {
  WriteSet ws;
  std::span<const WriteOp> ops;     // all of Write's
  std::vector<size_t> members;      // indexes into ops, in order
  std::vector<IntentKey> keys;      // members' keys
  std::vector<uint64_t> new_homes;  // home buckets of the members' new keys
  size_t intent_bytes = 0;
  uint64_t last_version = 0;  // of the members' puts; 0: none
  // Side records by key, the last value of each: the batch would keep only
  // it anyway (a server's client writes its record again with every write).
  std::vector<std::pair<std::string_view, std::string>> sides;

  // Whether `op` fits beside the members: in the intent's key list, and in
  // one journal record (its op, its side record, and the group's version).
  bool Holds(const WriteOp& op) const {
    if (intent_bytes + IntentBytes(op.key) > kIntentCapacity) return false;
    const size_t journal_ops = ws.ops.size() + sides.size() + (op.side != nullptr ? 2 : 1) + 1;
    return ws.cfs != nullptr || journal_ops <= WriteJournal::kMaxRecordOps;
  }
  void SetSide(std::string_view key, std::string value) {
    auto it =
        std::find_if(sides.begin(), sides.end(), [&](const auto& s) { return s.first == key; });
    if (it == sides.end()) {
      sides.emplace_back(key, std::move(value));
    } else {
      it->second = std::move(value);
    }
  }
  bool Has(std::string_view key) const {
    return std::any_of(keys.begin(), keys.end(), [&](const IntentKey& k) { return k.key == key; });
  }
  void Clear() {
    ws.batch.Clear();
    ws.ops.clear();
    members.clear();
    keys.clear();
    new_homes.clear();
    intent_bytes = 0;
    last_version = 0;
    sides.clear();
  }
};

namespace {
absl::Status CheckOp(const WriteOp& op) {
  if (absl::Status s = CheckKey(op.key); !s.ok()) return s;
  if (op.kind == WriteOp::Kind::kPut && op.value.size() > kMaxValueSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("value of ", op.value.size(), " bytes exceeds the limit of ", kMaxValueSize));
  }
  return absl::OkStatus();
}
}  // namespace

void Store::Write(std::span<const WriteOp> ops, std::span<WriteResult> results) {
  if (!write_mu_.TryLock()) {
    if (switching_.load()) {
      for (WriteResult& r : results) r = WriteResult{SwitchingRefusal()};
      return;
    }
    write_mu_.Lock();
  }
  WriteLocked(ops, results);
  write_mu_.Unlock();
}

void Store::WriteLocked(std::span<const WriteOp> ops, std::span<WriteResult> results) {
  absl::ReaderMutexLock d(&db_mu_);
  Group g;
  g.ops = ops;
  if (db_ != nullptr) g.ws.cfs = &cfs_;
  // After a failed durable write the rest is not tried: it would fail alike.
  auto FailFrom = [&](size_t first, const absl::Status& s) {
    for (size_t j = first; j < ops.size(); ++j) results[j] = WriteResult{s};
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const WriteOp& op = ops[i];
    WriteResult& r = results[i];
    r = WriteResult{};
    if (r.status = CheckOp(op); !r.status.ok()) continue;
    // The group ends before what it cannot hold; the op then sees the index
    // with the group published.
    const bool full = !g.members.empty() && (g.Has(op.key) || !g.Holds(op));
    if (full && !CommitGroup(g, results)) {
      return FailFrom(i, results[g.members[0]].status);
    }
    uint64_t home = 0;
    absl::StatusOr<bool> has = ExistsForWrite(op.key, &home);
    if (!has.ok()) {
      r.status = has.status();
      continue;
    }
    r.existed = *has;
    if (!r.existed) {
      const bool shared =
          std::find(g.new_homes.begin(), g.new_homes.end(), home) != g.new_homes.end();
      if (shared && !CommitGroup(g, results)) {
        return FailFrom(i, results[g.members[0]].status);
      }
      // Refused before anything is written (index.h invariant 7).
      {
        absl::ReaderMutexLock a(&arena_mu_);
        r.status = writer_->CheckRoomForNewKey(op.key);
      }
      if (!r.status.ok()) continue;
      g.new_homes.push_back(home);
    }
    if (op.kind == WriteOp::Kind::kPut) {
      r.version = (g.last_version != 0 ? g.last_version : last_version_) + 1;
      g.last_version = r.version;
      std::string record = U64(r.version);
      record.append(op.value.data(), op.value.size());
      g.ws.Put(0, op.key, record);
    } else {
      g.ws.Delete(0, op.key);
    }
    if (op.side != nullptr) g.SetSide(op.side->key, op.side->value({r.version, r.existed}));
    g.members.push_back(i);
    g.keys.push_back({op.key, r.existed});
    g.intent_bytes += IntentBytes(op.key);
  }
  (void)CommitGroup(g, results);
}

bool Store::CommitGroup(Group& g, std::span<WriteResult> results) {
  if (g.members.empty()) return true;
  for (const auto& [key, value] : g.sides) {
    g.ws.Put(1, absl::StrCat(kSidePrefix, absl::string_view(key.data(), key.size())), value);
  }
  if (g.last_version != 0) g.ws.Put(1, kLastVersionKey, U64(g.last_version));
  // The written generation records a claim's first write in RocksDB; a
  // journal writer has not claimed (its replay is followed by its claim).
  if (!generation_written_ && db_ != nullptr) {
    g.ws.Put(1, kWrittenGenerationKey, U64(claimed_generation_));
  }
  absl::Status s = BeginIntent(g.keys);
  if (s.ok()) {
    CrashPoint("write.before_db");
    s = Commit(g.ws);
    // The write may still have reached the WAL: show what RocksDB holds.
    if (!s.ok()) {
      if (absl::Status r = ReconcileIntent(); !r.ok()) LOG(ERROR) << "after a failed write: " << r;
    }
  }
  if (!s.ok()) {
    for (size_t i : g.members) results[i] = WriteResult{s};
    return false;
  }
  CrashPoint("write.after_db");
  commits_.fetch_add(1, std::memory_order_relaxed);
  if (g.last_version != 0) last_version_ = g.last_version;
  if (db_ != nullptr) generation_written_ = true;
  {
    absl::MutexLock a(&arena_mu_);
    for (size_t n = 0; n < g.members.size(); ++n) {
      const WriteOp& op = g.ops[g.members[n]];
      const WriteResult& r = results[g.members[n]];
      if (op.kind == WriteOp::Kind::kPut) {
        writer_->Upsert(op.key, op.value, r.version, r.existed, /*allow_evict=*/true);
        puts_.fetch_add(1, std::memory_order_relaxed);
      } else {
        writer_->Remove(op.key, r.existed);
        deletes_.fetch_add(1, std::memory_order_relaxed);
      }
      if (n == 0 && g.members.size() > 1) CrashPoint("write.inside_publish");
    }
  }
  CrashPoint("write.after_publish");
  EndIntent();
  g.Clear();
  return true;
}

}  // namespace kvnode::storage
