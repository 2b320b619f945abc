// Store::Check: the arena against RocksDB, for `kvctl check` and the crash
// tests. It proves what readers rely on, in both directions: every key the
// database holds is found with its value or sent to the server (never a
// stale value, never a false NotFound), and every object a slot publishes is
// one the database holds at that version.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "db_layout.h"
#include "kvnode/storage/read_path.h"
#include "kvnode/storage/store.h"
#include "store_internal.h"

namespace kvnode::storage {
namespace {

using dblayout::kVersionPrefix;

constexpr size_t kProblemsKept = 20;

void Problem(CheckReport& r, std::string what) {
  if (r.first_problems.size() < kProblemsKept) r.first_problems.push_back(std::move(what));
  ++r.problems;
}

// A key as a log shows it: printable, cut at 40 bytes.
std::string Shown(std::string_view key) {
  const absl::string_view shown(key.data(), std::min<size_t>(key.size(), 40));
  return absl::StrCat("'", absl::CHexEscape(shown), key.size() > 40 ? "...'" : "'");
}

// The arena's bytes at [offset, offset + length), or empty when out of it.
std::string_view Bytes(const Arena& a, uint64_t offset, uint64_t length) {
  const uint64_t size = a.geometry().arena_size;
  if (offset > size || length > size - offset) return {};
  return std::string_view(a.base() + offset, length);
}

// Every key of the database, read as a remote client reads it, on the
// arena's own bytes: nothing writes them while the writer's lock is held.
// The slots found with RocksDB's version and value go to `verified`.
void CheckDbKeys(const Arena& arena, rocksdb::DB* db, rocksdb::ColumnFamilyHandle* data,
                 CheckReport& r, absl::flat_hash_set<uint64_t>& verified) {
  const Geometry& g = arena.geometry();
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro, data));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    ++r.db_keys;
    const std::string_view key(it->key().data(), it->key().size());
    const std::string_view v(it->value().data(), it->value().size());
    if (v.size() < kVersionPrefix) {
      Problem(r, absl::StrCat("key ", Shown(key), ": malformed record in RocksDB"));
      continue;
    }
    const uint64_t version = LoadU64(v.data());
    ReadStep step = FirstRead(g, key);
    ReadResult res;
    for (uint32_t i = 0; i < 2 * kMaxChainLength * (kSlotsPerBucket + 1); ++i) {
      res = Decode(g, key, step, Bytes(arena, step.offset, step.length));
      if (res.outcome != ReadResult::Outcome::kNext) break;
      step = res.next;
    }
    switch (res.outcome) {
      case ReadResult::Outcome::kFound:
        if (res.version != version || res.value != v.substr(kVersionPrefix)) {
          Problem(r, absl::StrCat("key ", Shown(key), ": the arena serves version ", res.version,
                                  ", RocksDB holds version ", version,
                                  res.version == version ? " with other bytes" : ""));
        } else {
          ++r.found;
          verified.insert(res.slot);
        }
        break;
      case ReadResult::Outcome::kSlowPath:
        ++r.sent_to_server;
        break;
      case ReadResult::Outcome::kNotFound:
        Problem(r, absl::StrCat("key ", Shown(key), ": in RocksDB at version ", version,
                                ", but a reader of the arena finds no such key"));
        break;
      default:  // kRetry at rest: a slot naming an object that is not its own
        Problem(r, absl::StrCat("key ", Shown(key), ": readers of the arena retry (",
                                OutcomeName(res.outcome), ") with nothing being written"));
        break;
    }
  }
  if (!it->status().ok()) {
    Problem(r, absl::StrCat("iterating RocksDB failed: ", it->status().ToString()));
  }
}

// Every chain from its home bucket: links and tags, and each resident
// slot's object against the database (RocksDB is read only for the slots
// the first pass did not verify: a duplicate, or a key RocksDB lacks).
void CheckChains(const Arena& arena, rocksdb::DB* db, rocksdb::ColumnFamilyHandle* data,
                 CheckReport& r, const absl::flat_hash_set<uint64_t>& verified) {
  const Geometry& g = arena.geometry();
  std::string v;
  for (uint64_t home = 0; home < g.bucket_count; ++home) {
    uint64_t bucket = BucketOffset(g, home);
    uint32_t tag = 0;  // a home bucket's
    for (uint32_t depth = 0;; ++depth) {
      const std::string_view b = Bytes(arena, bucket, g.bucket_size);
      if (depth == kMaxChainLength || b.empty()) {
        Problem(r, absl::StrCat("bucket ", home, ": chain longer than ", kMaxChainLength,
                                " buckets or leaving the arena"));
        break;
      }
      ++r.buckets;
      const uint64_t link = LoadU64(b.data());
      if (MetaTag(LoadU64(b.data() + 8)) != tag) {
        Problem(r, absl::StrCat("bucket ", home, ": overflow bucket at ", bucket,
                                " carries another tag than its link names"));
      }
      for (uint32_t i = 0; i < g.slots_per_bucket; ++i) {
        const uint64_t slot_offset = bucket + (kBucketHeaderWords + i) * 8;
        const Slot s = Slot::Parse(LoadU64(b.data() + (kBucketHeaderWords + i) * 8));
        if (s.type == SlotType::kMarker) ++r.marker_slots;
        if (s.type == SlotType::kInvalid) {
          Problem(r, absl::StrCat("slot at ", slot_offset, ": invalid type"));
        }
        if (s.type != SlotType::kResident) continue;
        ++r.resident_slots;
        absl::StatusOr<ObjectView> o = DecodeObject(g, Bytes(arena, s.offset, s.length));
        if (!o.ok() || o->owner != slot_offset) {
          Problem(r, absl::StrCat("slot at ", slot_offset, ": its object at ", s.offset,
                                  o.ok() ? " names another slot as its owner"
                                         : absl::StrCat(" is not intact: ", o.status().message())));
          continue;
        }
        const KeyHash h = HashKey(g, o->key);
        if (h.bucket != home || h.fingerprint != s.fingerprint) {
          Problem(r, absl::StrCat("key ", Shown(o->key), ": resident in the chain of bucket ", home,
                                  ", not its own (", h.bucket, ") or another fingerprint"));
        }
        if (verified.contains(slot_offset)) continue;
        const rocksdb::Status rs =
            db->Get(rocksdb::ReadOptions(), data, rocksdb::Slice(o->key.data(), o->key.size()), &v);
        if (rs.IsNotFound()) {
          Problem(r, absl::StrCat("key ", Shown(o->key), ": resident at version ", o->version,
                                  ", but RocksDB has no such key"));
        } else if (!rs.ok()) {
          Problem(r, absl::StrCat("key ", Shown(o->key), ": RocksDB read failed: ", rs.ToString()));
        } else if (v.size() < kVersionPrefix || LoadU64(v.data()) != o->version ||
                   std::string_view(v).substr(kVersionPrefix) != o->value) {
          Problem(r, absl::StrCat("key ", Shown(o->key), ": resident at version ", o->version,
                                  ", RocksDB holds another version or value"));
        }
      }
      const uint64_t next = LinkNext(link);
      if (next == 0) break;
      tag = LinkTag(link);
      bucket = next;
    }
  }
}

}  // namespace

absl::StatusOr<CheckReport> Store::Check() {
  const auto start = std::chrono::steady_clock::now();
  absl::MutexLock w(&write_mu_);
  absl::ReaderMutexLock d(&db_mu_);
  if (db_ == nullptr || journal_ != nullptr) {
    return absl::FailedPreconditionError(
        "check: this process is not the writer with RocksDB open (a live upgrade is under way)");
  }
  absl::ReaderMutexLock a(&arena_mu_);
  CheckReport r;
  // With the writer's lock held, an intent left now was left by a dead
  // writer and never reconciled.
  if (HeaderWord(arena_->header()->intent.state).load(std::memory_order_acquire) != 0) {
    Problem(r, "a write intent is pending with no write in progress");
  }
  if (arena_->HeapMayBeTorn()) Problem(r, "the heap is marked as cut inside its allocator");
  absl::flat_hash_set<uint64_t> verified;
  CheckDbKeys(*arena_, db_, cfs_[0], r, verified);
  CheckChains(*arena_, db_, cfs_[0], r, verified);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace kvnode::storage
