#include "kvnode/storage/store.h"

#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "db_layout.h"
#include "glog/logging.h"
#include "index.h"
#include "journal.h"
#include "kvnode/base/step_times.h"
#include "kvnode/storage/read_path.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "store_internal.h"

namespace kvnode::storage {
namespace {

using dblayout::FromRocks;
using dblayout::kArenaIdKey;
using dblayout::kGenerationKey;
using dblayout::kLastVersionKey;
using dblayout::kSidePrefix;
using dblayout::kVersionPrefix;
using dblayout::kWrittenGenerationKey;
using dblayout::U64;

std::atomic<CrashPointHook> crash_point_hook{nullptr};

}  // namespace

void CrashPoint(const char* point) {
  if (CrashPointHook hook = crash_point_hook.load(std::memory_order_relaxed); hook != nullptr) {
    hook(point);
  }
}

absl::Status CheckKey(std::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("empty key");
  if (key.size() > kMaxKeySize) {
    return absl::InvalidArgumentError(
        absl::StrCat("key of ", key.size(), " bytes exceeds the limit of ", kMaxKeySize));
  }
  return absl::OkStatus();
}

void SetCrashPointHookForTesting(CrashPointHook hook) { crash_point_hook.store(hook); }

const char* OpenedAsName(Store::OpenedAs a) {
  switch (a) {
    case Store::OpenedAs::kCreated:
      return "created";
    case Store::OpenedAs::kRebuilt:
      return "rebuilt";
    case Store::OpenedAs::kReattached:
      return "reattached";
    case Store::OpenedAs::kRecovered:
      return "recovered";
    case Store::OpenedAs::kAttachedLive:
      return "attached-live";
  }
  return "?";
}

absl::Status StoreOptions::Validate() const {
  if (db_path.empty()) return absl::InvalidArgumentError("store: db_path is required");
  if (reuse_grace_us > 60ull * 1000 * 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("store: reuse_grace_us ", reuse_grace_us, " is more than a minute"));
  }
  if (max_chain_buckets < 1 || max_chain_buckets > kMaxChainLength) {
    return absl::InvalidArgumentError(absl::StrCat("store: max_chain_buckets ", max_chain_buckets,
                                                   " is not in [1, ", kMaxChainLength, "]"));
  }
  return arena_options().Validate();
}

ArenaOptions StoreOptions::arena_options() const {
  ArenaOptions a;
  a.shm_name = shm_name;
  a.file_path = arena_file;
  a.size = arena_size;
  a.bucket_size = bucket_size;
  a.bucket_count = bucket_count;
  a.limbo_capacity = limbo_capacity;
  a.hash_seed = hash_seed;
  return a;
}

Store::Store(const StoreOptions& options) : options_(options) {}

Store::~Store() {
  if (absl::Status s = CloseReleasedDb(); !s.ok()) LOG(ERROR) << s;
  absl::MutexLock w(&write_mu_);
  absl::MutexLock d(&db_mu_);
  if (db_ != nullptr) {
    if (arena_ != nullptr) {
      LOG(WARNING) << "store destroyed without Close(): arena " << arena_->path()
                   << " left dirty; the next Open takes it back as after a crash";
    }
    CloseRocksDb();
  }
}

namespace {

rocksdb::DBOptions MakeDbOptions(const StoreOptions& o) {
  rocksdb::DBOptions dbo = dblayout::DbOptions();
  dbo.create_if_missing = o.create_if_missing;
  dbo.allow_fallocate = !dblayout::OnTmpfs(o.db_path);
  dbo.create_missing_column_families = true;
  // A live upgrade's new process opens the database while it journals
  // writes (reads of keys not in the arena wait for it), so the open does no
  // work it can skip: no reading of every table's properties for statistics,
  // no size check of every SST, and the WAL's tail is replayed into the
  // memtable instead of being flushed into a new L0 file first.
  dbo.skip_stats_update_on_db_open = true;
  dbo.skip_checking_sst_file_sizes_on_db_open = true;
  dbo.avoid_flush_during_recovery = true;
  return dbo;
}

absl::Status OpenRocksDbAt(const StoreOptions& o, rocksdb::DB** db,
                           std::vector<rocksdb::ColumnFamilyHandle*>* cfs) {
  rocksdb::Status s =
      rocksdb::DB::Open(MakeDbOptions(o), o.db_path, dblayout::ColumnFamilies(), cfs, db);
  return FromRocks(s, absl::StrCat("open database ", o.db_path));
}

void CloseRocksDbHandles(const std::string& path, rocksdb::DB* db,
                         std::vector<rocksdb::ColumnFamilyHandle*>* cfs) {
  for (rocksdb::ColumnFamilyHandle* h : *cfs) {
    rocksdb::Status s = db->DestroyColumnFamilyHandle(h);
    if (!s.ok()) LOG(ERROR) << "destroy column family handle: " << s.ToString();
  }
  cfs->clear();
  rocksdb::Status s = db->Close();
  if (!s.ok()) LOG(ERROR) << "close database " << path << ": " << s.ToString();
  delete db;
}

}  // namespace

namespace {

// The u64 record `key` of the meta column family (db_layout.h); 0 when absent.
absl::StatusOr<uint64_t> ReadMetaU64(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* meta,
                                     const char* key, absl::string_view what) {
  std::string v;
  rocksdb::Status rs = db->Get(rocksdb::ReadOptions(), meta, key, &v);
  if (rs.IsNotFound()) return 0;
  if (!rs.ok()) return FromRocks(rs, what);
  return v.size() == 8 ? LoadU64(v.data()) : 0;
}

// The kernel's boot id, hashed (0 if unreadable: then no arena is trusted
// across a start that cannot tell).
uint64_t BootId() {
  static const uint64_t id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string s;
    if (!std::getline(in, s) || s.empty()) return uint64_t{0};
    return XXH3_64bits(s.data(), s.size());
  }();
  return id;
}

}  // namespace

absl::Status Store::OpenRocksDb() { return OpenRocksDbAt(options_, &db_, &cfs_); }

void Store::CloseRocksDb() {
  if (db_ == nullptr) return;
  CloseRocksDbHandles(options_.db_path, db_, &cfs_);
  db_ = nullptr;
}

namespace {

// OpenDb's replay outside the write lock: a pass of at most this many
// records leaves few enough for the lock (one synced batch of about as many,
// milliseconds where a pass of thousands took seconds in the TCG guest).
// Each pass at most halves the last, so the bound on passes is a backstop.
constexpr uint64_t kShortJournalPass = 64;
constexpr int kMaxJournalPasses = 16;

// Writes the journal's whole records from offset `from` into `db` as one
// synced batch; *end = the offset after the last. Returns how many.
absl::StatusOr<uint64_t> ApplyJournal(const std::string& path, rocksdb::DB* db,
                                      const std::vector<rocksdb::ColumnFamilyHandle*>& cfs,
                                      uint64_t from, uint64_t* end) {
  absl::StatusOr<std::vector<std::vector<JournalOp>>> records =
      WriteJournal::ReadFrom(path, from, end);
  if (!records.ok()) return records.status();
  if (records->empty()) return 0;
  WriteSet w;
  w.cfs = &cfs;
  for (const std::vector<JournalOp>& ops : *records) {
    for (const JournalOp& op : ops) {
      if (op.cf >= cfs.size()) {
        return absl::DataLossError(absl::StrCat(path, ": a write to column family ", op.cf));
      }
      if (op.kind == JournalOp::Kind::kPut) {
        w.Put(op.cf, op.key, op.value);
      } else {
        w.Delete(op.cf, op.key);
      }
    }
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  if (absl::Status s = FromRocks(db->Write(wo, &w.batch), "replay the write journal"); !s.ok()) {
    return s;
  }
  return records->size();
}

}  // namespace

absl::StatusOr<uint64_t> Store::ReplayJournal(uint64_t from) {
  const std::string path = WriteJournal::PathFor(options_.db_path);
  uint64_t end = 0;
  absl::StatusOr<uint64_t> n = ApplyJournal(path, db_, cfs_, from, &end);
  if (!n.ok()) return n.status();
  CrashPoint("journal.after_replay");
  // Retired (and the rename synced) before RocksDB takes another write: a
  // later replay of these records would undo it. Once the caller no longer
  // holds the locks it removes the retired file, or keeps it as the spare
  // when this process wrote it (RemoveRetiredJournal, RecycleRetiredJournal).
  if (absl::Status s = WriteJournal::Retire(path); !s.ok()) return s;
  const WriteJournal* mine = journal_ != nullptr ? journal_.get() : prepared_journal_.get();
  retired_written_ = mine != nullptr ? mine->written_to() : 0;
  journal_.reset();
  prepared_journal_.reset();
  replayed_.fetch_add(*n, std::memory_order_relaxed);
  return *n;
}

absl::Status Store::Rebuild() {
  ArenaOptions ao = options_.arena_options();
  absl::StatusOr<std::unique_ptr<Arena>> arena = Arena::Create(ao);
  if (!arena.ok()) return arena.status();
  arena_ = std::move(*arena);
  StartWriting();
  absl::MutexLock a(&arena_mu_);  // uncontended: the store is not handed out yet
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;  // one sequential pass
  ro.readahead_size = 2 << 20;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cfs_[0]));
  uint64_t n = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    const rocksdb::Slice v = it->value();
    if (v.size() < kVersionPrefix || k.size() == 0 || k.size() > kMaxKeySize ||
        v.size() - kVersionPrefix > kMaxValueSize) {
      return absl::DataLossError(absl::StrCat("database ", options_.db_path, ": record ", n,
                                              " has a malformed key or value"));
    }
    writer_->Upsert(std::string_view(k.data(), k.size()),
                    std::string_view(v.data() + kVersionPrefix, v.size() - kVersionPrefix),
                    LoadU64(v.data()), /*existed=*/false, /*allow_evict=*/false);
    ++n;
  }
  if (!it->status().ok()) return FromRocks(it->status(), "rebuild: iterate database");
  rebuilt_keys_ = n;
  return absl::OkStatus();
}

// Makes this process the writer: the arena is dirty while we own it, and its
// generation is bumped in RocksDB first, then in the header.
absl::Status Store::Claim() {
  ArenaHeader* h = arena_->header();
  HeaderWord(h->clean).store(0, std::memory_order_release);
  HeaderWord(h->writer_pid).store(static_cast<uint64_t>(getpid()), std::memory_order_relaxed);
  HeaderWord(h->boot_id).store(BootId(), std::memory_order_relaxed);
  uint64_t gen = HeaderWord(h->generation).load(std::memory_order_acquire);
  {
    // A claimer killed between its RocksDB record and the header leaves the
    // database ahead: never hand its generation out again.
    std::string v;
    rocksdb::Status rs = db_->Get(rocksdb::ReadOptions(), cfs_[1], kGenerationKey, &v);
    if (rs.ok() && v.size() == 8) gen = std::max(gen, LoadU64(v.data()));
    if (!rs.ok() && !rs.IsNotFound()) return FromRocks(rs, "read arena generation");
  }
  ++gen;
  rocksdb::WriteOptions wo;
  wo.sync = true;
  rocksdb::WriteBatch claim;
  absl::Status s = FromRocks(claim.Put(cfs_[1], kGenerationKey, U64(gen)), "batch generation");
  if (s.ok()) s = FromRocks(claim.Put(cfs_[1], kArenaIdKey, U64(h->arena_id)), "batch arena id");
  if (s.ok()) s = FromRocks(db_->Write(wo, &claim), "record arena generation");
  if (!s.ok()) return s;
  CrashPoint("claim.after_db");
  HeaderWord(h->generation).store(gen, std::memory_order_release);
  claimed_generation_ = gen;
  generation_written_ = false;
  std::string v;
  rocksdb::Status rs = db_->Get(rocksdb::ReadOptions(), cfs_[1], kLastVersionKey, &v);
  if (rs.ok() && v.size() == 8) {
    last_version_ = LoadU64(v.data());
  } else if (!rs.IsNotFound()) {
    return FromRocks(rs, "read last version");
  }
  return absl::OkStatus();
}

namespace {

bool ProcessRuns(uint64_t pid) {
  if (pid == 0 || pid > INT32_MAX || static_cast<pid_t>(pid) == getpid()) return false;
  return kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

// Why the arena found at start must be rebuilt from RocksDB, or "" when it
// can serve as it is. A dirty arena (its writer died: kill -9, a crash) is
// as trustworthy as one a live upgrade takes over from a dead process, which
// is what this start then does: the same checks, the claim, and the write
// intent reconciled from RocksDB (index.h invariant 10).
std::string Store::ReattachRefusal(Arena& arena, uint64_t replayed, uint64_t db_gen,
                                   uint64_t db_arena_id) {
  ArenaHeader* h = arena.header();
  const uint64_t gen = HeaderWord(h->generation).load();
  const uint64_t writer = HeaderWord(h->writer_pid).load();
  if (replayed > 0) return "journaled writes were replayed into the database";
  if (arena.HeapMayBeTorn()) return "a process died inside its heap allocator";
  if (gen != db_gen) return absl::StrCat("its generation ", gen, " is not the database's ", db_gen);
  if (db_arena_id != 0 && db_arena_id != h->arena_id) {
    return absl::StrCat("it is arena ", absl::Hex(h->arena_id), ", the database's is ",
                        absl::Hex(db_arena_id));
  }
  const uint64_t boot = HeaderWord(h->boot_id).load();
  if (boot != BootId() && (boot != 0 || HeaderWord(h->clean).load() != 1)) {
    return "the machine restarted since its last writer claimed it (boot id differs)";
  }
  if (HeaderWord(h->clean).load() != 1 && ProcessRuns(writer)) {
    return absl::StrCat("its writer, pid ", writer, ", still runs");
  }
  return "";
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const StoreOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<Store> store(new Store(options));
  Store& st = *store;
  absl::MutexLock w(&st.write_mu_);
  absl::MutexLock d(&st.db_mu_);
  base::StepTimes phases;
  if (absl::Status s = st.OpenRocksDb(); !s.ok()) return s;
  st.wal_records_replayed_ = st.MemtableRecords();
  phases.Done("rocksdb open");
  absl::StatusOr<uint64_t> replayed = st.ReplayJournal();
  if (!replayed.ok()) return replayed.status();
  st.RemoveRetiredJournal();
  phases.Done("journal");
  st.MakeSpareJournal();
  phases.Done("spare journal");
  if (*replayed > 0) {
    LOG(INFO) << "store " << options.db_path << ": replayed " << *replayed
              << " journaled writes into RocksDB (left by a process that was stopped)";
  }
  absl::StatusOr<uint64_t> stored_gen =
      ReadMetaU64(st.db_, st.cfs_[1], kGenerationKey, "read arena generation");
  if (!stored_gen.ok()) return stored_gen.status();
  const uint64_t db_gen = *stored_gen;

  absl::StatusOr<uint64_t> stored_arena =
      ReadMetaU64(st.db_, st.cfs_[1], kArenaIdKey, "read arena id");
  if (!stored_arena.ok()) return stored_arena.status();

  absl::StatusOr<std::unique_ptr<Arena>> arena = Arena::Attach(options.arena_options());
  std::string why;
  if (arena.ok()) {
    why = ReattachRefusal(**arena, *replayed, db_gen, *stored_arena);
    if (why.empty()) {
      const ArenaHeader* h = (*arena)->header();
      const bool clean = HeaderWord(const_cast<uint64_t&>(h->clean)).load() == 1;
      st.open_reason_ = clean
                            ? absl::StrCat("shut down cleanly, generation ", db_gen, " matches")
                            : absl::StrCat("its writer (pid ", h->writer_pid,
                                           ") died; heap intact, generation ", db_gen, " matches");
      st.arena_ = std::move(*arena);
      st.StartWriting();
      st.opened_as_ = clean ? OpenedAs::kReattached : OpenedAs::kRecovered;
    }
  } else if (arena.status().code() == absl::StatusCode::kNotFound) {
    st.opened_as_ = OpenedAs::kCreated;
  } else if (arena.status().code() == absl::StatusCode::kFailedPrecondition) {
    why = std::string(arena.status().message());
  } else {
    return arena.status();  // e.g. another user's segment: never rebuild over it
  }
  phases.Done("arena checks");
  if (st.arena_ == nullptr) {
    if (!why.empty()) {
      LOG(WARNING) << "rebuilding arena "
                   << (options.arena_file.empty() ? options.shm_name : options.arena_file)
                   << " from " << options.db_path << ": " << why;
      st.opened_as_ = OpenedAs::kRebuilt;
      st.open_reason_ = why;
    } else {
      st.open_reason_ = "no arena";
    }
    arena = absl::StatusOr<std::unique_ptr<Arena>>();  // unmap before re-creating
    absl::Status s = st.Rebuild();
    phases.Done("build");
    // The rebuilt arena inherits the database's generation line.
    if (s.ok()) HeaderWord(st.arena_->header()->generation).store(db_gen);
    if (s.ok()) s = st.Claim();
    phases.Done("claim");
    if (!s.ok()) {
      // Do not leave a half-built segment of ours behind (it holds tmpfs
      // memory); a segment Create refused to touch (another user's) was not
      // created here and stays.
      if (st.arena_ != nullptr) {
        if (absl::Status r = Arena::Remove(options.arena_options()); !r.ok()) {
          LOG(ERROR) << "open failed; removing the arena: " << r;
        }
      }
      return s;
    }
  } else {
    if (absl::Status s = st.Claim(); !s.ok()) return s;
    phases.Done("claim");
    if (absl::Status s = st.ReconcileIntent(); !s.ok()) return s;
    phases.Done("reconcile");
  }
  if (st.wal_records_replayed_ > 0) st.FlushReplayedWal();
  LOG(INFO) << "store " << options.db_path << ": arena " << st.arena_->path() << " "
            << OpenedAsName(st.opened_as_) << " (" << st.open_reason_ << "), generation "
            << st.arena_->header()->generation << ", " << st.arena_->header()->num_keys << " keys, "
            << st.wal_records_replayed_ << " records replayed from the WAL, in "
            << absl::FormatDuration(phases.total()) << " (" << phases.steps() << ")";
  return store;
}

// The WAL a start replayed stays in the memtable (avoid_flush_during_recovery:
// no flush delays serving) and its files stay on disk until the memtable is
// flushed, which overwrites in place put off until max_total_wal_size: each
// start after a crash would replay every WAL written since the last flush
// again, more after each crash. A flush in the background, while the node
// serves, bounds the next start's replay by what is written from now on.
void Store::FlushReplayedWal() {
  rocksdb::FlushOptions fo;
  fo.wait = false;
  fo.allow_write_stall = true;
  const rocksdb::Status s = db_->Flush(fo, cfs_);
  LOG_IF(WARNING, !s.ok()) << "store " << options_.db_path << ": flushing the "
                           << wal_records_replayed_
                           << " records replayed from the WAL: " << s.ToString();
}

uint64_t Store::MemtableRecords() const {
  uint64_t records = 0;
  for (rocksdb::ColumnFamilyHandle* cf : cfs_) {
    for (const std::string& p : {rocksdb::DB::Properties::kNumEntriesActiveMemTable,
                                 rocksdb::DB::Properties::kNumEntriesImmMemTables}) {
      uint64_t n = 0;
      if (db_->GetIntProperty(cf, p, &n)) records += n;
    }
  }
  return records;
}

uint64_t Store::UnflushedRecords() const {
  absl::ReaderMutexLock d(&db_mu_);
  return db_ != nullptr ? MemtableRecords() : 0;
}

absl::StatusOr<std::unique_ptr<Store>> Store::AttachLive(const StoreOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Arena>> arena = Arena::Attach(options.arena_options());
  if (!arena.ok()) return arena.status();
  std::unique_ptr<Store> store(new Store(options));
  store->arena_ = std::move(*arena);  // not the writer: no writer_ (see there)
  store->opened_as_ = OpenedAs::kAttachedLive;
  return store;
}

absl::StatusOr<uint64_t> Store::OpenRocksDbAgain() {
  if (db_ != nullptr) return absl::FailedPreconditionError("database already open");
  if (closed_) return absl::FailedPreconditionError("store closed");
  {
    absl::MutexLock r(&released_mu_);
    if (released_db_ != nullptr) {
      // Released by this process and not closed yet: take it back as it is.
      db_ = std::exchange(released_db_, nullptr);
      cfs_ = std::move(released_cfs_);
      released_cfs_.clear();
    }
  }
  if (db_ == nullptr) {
    if (absl::Status s = OpenRocksDb(); !s.ok()) return s;
  }
  std::string v;
  rocksdb::Status rs = db_->Get(rocksdb::ReadOptions(), cfs_[1], kGenerationKey, &v);
  return rs.ok() && v.size() == 8 ? LoadU64(v.data()) : 0;
}

absl::Status Store::OpenDb() {
  // RocksDB's open (its WAL replay: the larger part of a handoff) runs
  // without the write lock, so that journaled writes go on meanwhile.
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs;
  if (absl::Status s = OpenRocksDbAt(options_, &db, &cfs); !s.ok()) return s;
  // The journal's records go into RocksDB before the write lock is taken
  // too, pass after pass while writes go on into the journal (RocksDB takes
  // no other write): each pass replays what came in during the one before,
  // so that under the lock, where every write waits, only the records of the
  // last short pass remain. Passes stop when one is short, or when one is not
  // half as long as the one before: writes arrive nearly as fast as they are
  // replayed, and more passes would only let them fill the journal.
  const std::string jpath = WriteJournal::PathFor(options_.db_path);
  uint64_t replayed_to = 0;
  uint64_t early = 0;
  uint64_t previous = UINT64_MAX;
  for (int pass = 0; pass < kMaxJournalPasses; ++pass) {
    absl::StatusOr<uint64_t> n = ApplyJournal(jpath, db, cfs, replayed_to, &replayed_to);
    if (!n.ok()) {
      CloseRocksDbHandles(options_.db_path, db, &cfs);
      return n.status();
    }
    early += *n;
    if (options_.after_journal_pass) options_.after_journal_pass();
    if (*n <= kShortJournalPass || *n > previous / 2) break;
    previous = *n;
  }
  switching_.store(true);
  absl::Status s = AdoptDbAndReplayRest(db, std::move(cfs), replayed_to, early);
  switching_.store(false);
  if (s.ok()) RecycleRetiredJournal();
  return s;
}

absl::Status Store::AdoptDbAndReplayRest(rocksdb::DB* db,
                                         std::vector<rocksdb::ColumnFamilyHandle*> cfs,
                                         uint64_t replayed_to, uint64_t early) {
  absl::MutexLock w(&write_mu_);
  absl::MutexLock d(&db_mu_);
  const absl::Time locked_at = absl::Now();  // every write waits from here to our return
  if (db_ != nullptr || closed_) {
    CloseRocksDbHandles(options_.db_path, db, &cfs);
    return absl::FailedPreconditionError(closed_ ? "store closed" : "database already open");
  }
  db_ = db;
  cfs_ = std::move(cfs);
  absl::StatusOr<uint64_t> db_gen =
      ReadMetaU64(db_, cfs_[1], kGenerationKey, "read arena generation");
  if (!db_gen.ok()) {
    CloseRocksDb();
    return db_gen.status();
  }
  const uint64_t gen = HeaderWord(arena_->header()->generation).load();
  if (gen != *db_gen) {
    CloseRocksDb();
    return absl::FailedPreconditionError(absl::StrCat(
        "arena ", arena_->path(), " has generation ", gen, " but database ", options_.db_path,
        " has ", *db_gen, ": the arena does not reflect this database (use Open to rebuild)"));
  }
  const uint64_t journaled_last = last_version_;
  const bool was_journaling = journal_ != nullptr;
  CrashPoint("journal.before_replay");
  absl::StatusOr<uint64_t> late = ReplayJournal(replayed_to);
  if (!late.ok()) {
    CloseRocksDb();  // the journal stays: the next writer replays it
    return late.status();
  }
  replayed_.fetch_add(early, std::memory_order_relaxed);
  replayed_locked_.fetch_add(*late, std::memory_order_relaxed);
  absl::Status s = BecomeWriter();
  if (early + *late > 0) {
    LOG(INFO) << "store " << options_.db_path << ": replayed " << early + *late
              << " journaled writes into RocksDB (" << *late
              << " under the write lock, which was held "
              << absl::FormatDuration(absl::Now() - locked_at) << ")";
  }
  if (s.ok() && was_journaling && last_version_ != journaled_last) {
    LOG(ERROR) << "store " << options_.db_path << ": version " << last_version_
               << " in the database after the journal's replay, " << journaled_last << " journaled";
  }
  return s;
}

void Store::RemoveRetiredJournal() {
  const std::string retired = WriteJournal::RetiredPathFor(WriteJournal::PathFor(options_.db_path));
  // Its records are in RocksDB: a failure only leaves a file the next
  // PrepareJournal or start removes.
  if (absl::Status s = WriteJournal::Remove(retired); !s.ok()) {
    LOG(WARNING) << "store " << options_.db_path << ": " << s;
  }
}

void Store::RecycleRetiredJournal() {
  uint64_t written = 0;
  {
    absl::MutexLock w(&write_mu_);
    written = std::exchange(retired_written_, 0);
  }
  if (written > 0) {
    absl::Status s = WriteJournal::Recycle(WriteJournal::PathFor(options_.db_path), written);
    if (s.ok()) return;
    LOG(WARNING) << "store " << options_.db_path << ": the retired journal is not the spare: " << s;
  }
  RemoveRetiredJournal();
  MakeSpareJournal();
}

void Store::MakeSpareJournal() {
  const std::string path = WriteJournal::PathFor(options_.db_path);
  if (absl::Status s = WriteJournal::MakeSpare(path, options_.journal_bytes); !s.ok()) {
    LOG(WARNING) << "store " << options_.db_path
                 << ": no spare write journal (the next live upgrade allocates one): " << s;
  }
}

absl::Status Store::PrepareJournal() {
  RemoveRetiredJournal();  // one a crash left behind
  absl::StatusOr<std::unique_ptr<WriteJournal>> j =
      WriteJournal::Create(WriteJournal::PathFor(options_.db_path), options_.journal_bytes);
  if (!j.ok()) return j.status();
  absl::MutexLock w(&write_mu_);
  prepared_journal_ = std::move(*j);
  return absl::OkStatus();
}

absl::Status Store::BecomeJournalWriter(uint64_t last_version) {
  absl::MutexLock w(&write_mu_);
  absl::ReaderMutexLock d(&db_mu_);
  if (db_ != nullptr) return absl::FailedPreconditionError("the database is open here");
  if (prepared_journal_ == nullptr) return absl::FailedPreconditionError("no journal prepared");
  if (absl::Status s = CheckHeap(); !s.ok()) return s;
  // The old writer may have died between RocksDB and the arena: it cannot
  // be reconciled without RocksDB, so it is refused like a torn heap.
  if (HeaderWord(arena_->header()->intent.state).load(std::memory_order_acquire) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("arena ", arena_->path(), ": the old writer left a write intent pending"));
  }
  journal_ = std::move(prepared_journal_);
  last_version_ = last_version;
  StartWriting();
  LOG(INFO) << "store " << options_.db_path << ": writer by journal " << journal_->path()
            << " from version " << last_version;
  return absl::OkStatus();
}

uint64_t Store::last_version() {
  absl::MutexLock w(&write_mu_);
  return last_version_;
}

absl::Status Store::ReleaseDbForHandoff() {
  absl::MutexLock w(&write_mu_);
  absl::MutexLock d(&db_mu_);
  if (db_ == nullptr) return absl::FailedPreconditionError("database not open");
  // The new process becomes the writer once this returns: from here on a Get
  // here must not mark its key (writer_).
  StopWriting();
  absl::MutexLock r(&released_mu_);
  released_db_ = std::exchange(db_, nullptr);
  released_cfs_ = std::move(cfs_);
  cfs_.clear();
  return absl::OkStatus();
}

absl::Status Store::CloseReleasedDb() {
  absl::MutexLock r(&released_mu_);
  if (released_db_ == nullptr) return absl::OkStatus();
  // The memtable is flushed first, so that the new process opens RocksDB
  // with no WAL to replay: a replay costs far more than a flush (19 MB of
  // WAL: 12.3 s in the TCG guest, against 0.9 s of CPU to flush its 100,000
  // keys), on CPUs the clients share. Here, after the clients have moved,
  // rather than from the upgrade's start: a flush running beside N's start
  // and the clients' move lengthened both. The new process journals writes
  // meanwhile. If the flush fails the WAL still holds every write, and the
  // open replays it.
  rocksdb::FlushOptions fo;
  fo.allow_write_stall = true;
  if (rocksdb::Status s = released_db_->Flush(fo, released_cfs_); !s.ok()) {
    LOG(WARNING) << "store " << options_.db_path
                 << ": flush before the handoff's close failed (the next open replays the WAL): "
                 << s.ToString();
  }
  CloseRocksDbHandles(options_.db_path, released_db_, &released_cfs_);
  released_db_ = nullptr;
  return absl::OkStatus();
}

absl::Status Store::CloseDbForHandoff() {
  if (absl::Status s = ReleaseDbForHandoff(); !s.ok()) return s;
  return CloseReleasedDb();
}

absl::Status Store::ReopenDbAfterFailedHandoff() {
  absl::MutexLock w(&write_mu_);
  absl::MutexLock d(&db_mu_);
  absl::StatusOr<uint64_t> db_gen = OpenRocksDbAgain();
  if (!db_gen.ok()) return db_gen.status();
  absl::StatusOr<std::vector<std::vector<JournalOp>>> journaled =
      WriteJournal::ReadAll(WriteJournal::PathFor(options_.db_path));
  if (!journaled.ok() || !journaled->empty()) {
    CloseRocksDb();
    if (!journaled.ok()) return journaled.status();
    return absl::FailedPreconditionError(
        absl::StrCat("the new process journaled ", journaled->size(),
                     " writes it may have acknowledged: not resuming (the next start replays "
                     "them)"));
  }
  if (*db_gen != claimed_generation_) {
    // Another process claimed the database after this one. If it wrote, it
    // may have acknowledged those writes (and its clients' dedupe state is not
    // ours): resuming could contradict them. Its first write records its
    // generation in the same batch, so no record means no write.
    absl::StatusOr<uint64_t> read =
        ReadMetaU64(db_, cfs_[1], kWrittenGenerationKey, "read the written generation");
    if (!read.ok()) {
      CloseRocksDb();
      return read.status();
    }
    const uint64_t written = *read;
    if (written > claimed_generation_) {
      CloseRocksDb();
      return absl::FailedPreconditionError(
          absl::StrCat("another process claimed the database since the handoff (generation ",
                       *db_gen, ", ours ", claimed_generation_, ") and wrote to it (generation ",
                       written, "): it may have acknowledged writes; not resuming"));
    }
    LOG(WARNING) << "store " << options_.db_path << ": generation " << *db_gen
                 << " was claimed after ours (" << claimed_generation_
                 << ") but never wrote; taking the database back";
  }
  return BecomeWriter();
}

absl::Status Store::BecomeWriter() {
  absl::Status s = CheckHeap();
  if (s.ok()) StartWriting();
  // A new generation, and the version counter as the database has it.
  if (s.ok()) s = Claim();
  // The previous writer may have died between RocksDB and the arena.
  if (s.ok()) s = ReconcileIntent();
  if (!s.ok()) {
    CloseRocksDb();
    // With neither RocksDB nor a journal this process cannot write.
    if (journal_ == nullptr) StopWriting();
  }
  return s;
}

void Store::StartWriting() {
  absl::MutexLock a(&arena_mu_);
  if (writer_ == nullptr) {
    writer_ = std::make_unique<IndexWriter>(arena_.get(), options_.reuse_grace_us * 1000,
                                            options_.max_chain_buckets);
  }
}

void Store::StopWriting() {
  absl::MutexLock a(&arena_mu_);
  writer_.reset();
}

absl::StatusOr<uint64_t> Store::EnsureSlotWords() {
  absl::MutexLock w(&write_mu_);
  {
    absl::ReaderMutexLock a(&arena_mu_);
    if (writer_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "arena ", arena_->path(), ": the slot words are made by the writer, not this process"));
    }
  }
  return arena_->EnsureSlotWords();
}

absl::Status Store::CheckHeap() const {
  if (!arena_->HeapMayBeTorn()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("arena ", arena_->path(),
                   ": a process died inside its heap allocator, whose state cannot be trusted; "
                   "a cold start rebuilds the arena from ",
                   options_.db_path));
}

absl::Status Store::Close() {
  absl::MutexLock w(&write_mu_);
  absl::MutexLock d(&db_mu_);
  if (closed_) return absl::OkStatus();
  closed_ = true;
  StopWriting();
  if (db_ == nullptr) return absl::OkStatus();  // attached only, or handed off: not ours to mark
  rocksdb::FlushOptions fo;
  fo.wait = true;
  absl::Status s = FromRocks(db_->Flush(fo, cfs_), "flush database at close");
  CloseRocksDb();
  if (!s.ok()) return s;
  HeaderWord(arena_->header()->clean).store(1, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<bool> Store::DbContains(std::string_view key) {
  std::string v;
  rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), cfs_[0], rocksdb::Slice(key.data(), key.size()), &v);
  if (s.IsNotFound()) return false;
  if (!s.ok()) return FromRocks(s, "read");
  return true;
}

absl::StatusOr<bool> Store::ReadFromDb(std::string_view key, GetResult* out) {
  std::string v;
  rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), cfs_[0], rocksdb::Slice(key.data(), key.size()), &v);
  if (s.IsNotFound()) return false;
  if (!s.ok()) return FromRocks(s, "read");
  if (v.size() < kVersionPrefix) return absl::DataLossError("database value without version");
  out->version = LoadU64(v.data());
  out->value.assign(v.data() + kVersionPrefix, v.size() - kVersionPrefix);
  out->from_arena = false;
  return true;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Store::ReadSideRecords(
    std::string_view prefix) {
  absl::ReaderMutexLock d(&db_mu_);
  if (db_ == nullptr) return absl::FailedPreconditionError("database not open in this process");
  const std::string start =
      absl::StrCat(kSidePrefix, absl::string_view(prefix.data(), prefix.size()));
  std::vector<std::pair<std::string, std::string>> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cfs_[1]));
  for (it->Seek(start); it->Valid() && it->key().starts_with(start); it->Next()) {
    out.emplace_back(it->key().ToString().substr(sizeof(kSidePrefix) - 1), it->value().ToString());
  }
  if (!it->status().ok()) return FromRocks(it->status(), "read side records");
  return out;
}

absl::Status Store::DeleteSideRecord(std::string_view key) {
  absl::MutexLock w(&write_mu_);
  absl::ReaderMutexLock d(&db_mu_);
  if (db_ == nullptr) return absl::FailedPreconditionError("database not open in this process");
  return FromRocks(
      db_->Delete(rocksdb::WriteOptions(), cfs_[1],
                  absl::StrCat(kSidePrefix, absl::string_view(key.data(), key.size()))),
      "delete side record");
}

absl::Status Store::SwitchingRefusal() {
  return absl::UnavailableError(
      "the writer is moving its journal into RocksDB; retry in a few milliseconds");
}

absl::StatusOr<Store::GetResult> Store::Get(std::string_view key) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  const Geometry& g = arena_->geometry();
  GetResult out;
  {
    // Same decoder as a remote client, on bytes copied under the shared lock.
    // Torn bytes (kRetry) are still possible when another process is the
    // writer (live upgrade), so retry a few times before asking RocksDB.
    absl::ReaderMutexLock a(&arena_mu_);
    char buf[kMaxObjectSize + kInlineGranule];
    ReadStep step = FirstRead(g, key);
    int retries = 0;
    for (int i = 0; i < 4 * static_cast<int>(kMaxChainLength); ++i) {
      if (step.length > sizeof(buf) || step.offset > g.arena_size ||
          step.length > g.arena_size - step.offset) {
        break;
      }
      std::memcpy(buf, arena_->At(step.offset), step.length);
      const ReadResult r = Decode(g, key, step, std::string_view(buf, step.length));
      if (r.outcome == ReadResult::Outcome::kFound) {
        out.value.assign(r.value.data(), r.value.size());
        out.version = r.version;
        out.from_arena = true;
        // CLOCK's mark is a write: only the writer makes it (writer_).
        if (writer_ != nullptr) writer_->Touch(r.slot);
        gets_arena_.fetch_add(1, std::memory_order_relaxed);
        return out;
      }
      if (r.outcome == ReadResult::Outcome::kNotFound) {
        gets_missing_.fetch_add(1, std::memory_order_relaxed);
        return absl::NotFoundError("key not found");
      }
      if (r.outcome == ReadResult::Outcome::kNext) {
        step = r.next;
      } else if (r.outcome == ReadResult::Outcome::kRetry && ++retries <= 3) {
        step = FirstRead(g, key);
      } else {
        break;  // slow path
      }
    }
  }
  if (!db_mu_.ReaderTryLock()) {
    if (switching_.load()) return SwitchingRefusal();
    db_mu_.ReaderLock();
  }
  absl::StatusOr<bool> has =
      db_ != nullptr ? ReadFromDb(key, &out)
                     : absl::UnavailableError(
                           "key not resident in the arena and the database is not open here");
  db_mu_.ReaderUnlock();
  if (!has.ok()) return has.status();
  if (!*has) {
    gets_missing_.fetch_add(1, std::memory_order_relaxed);
    return absl::NotFoundError("key not found");
  }
  gets_db_.fetch_add(1, std::memory_order_relaxed);
  if (options_.promote_on_get) Promote(key);
  return out;
}

void Store::Promote(std::string_view key) {
  if (!write_mu_.TryLock()) return;  // a writer is busy: promotion is optional
  {
    absl::ReaderMutexLock d(&db_mu_);
    if (db_ != nullptr && !closed_) {
      bool wanted = false;  // not resident, and this process writes the arena
      {
        absl::ReaderMutexLock a(&arena_mu_);
        wanted = writer_ != nullptr && writer_->Find(key).resident_slot == 0;
      }
      GetResult cur;
      absl::StatusOr<bool> has = wanted ? ReadFromDb(key, &cur) : false;
      // The intent covers a promotion cut short too (its publication may be
      // half done when the process dies).
      const IntentKey k{key, /*existed=*/true};
      if (has.ok() && *has && BeginIntent({&k, 1}).ok()) {
        {
          absl::MutexLock a(&arena_mu_);
          if (writer_->Upsert(key, cur.value, cur.version, /*existed=*/true,
                              /*allow_evict=*/true) == IndexWriter::Placement::kResident) {
            promotions_.fetch_add(1, std::memory_order_relaxed);
          }
        }
        EndIntent();
      }
    }
  }
  write_mu_.Unlock();
}

char* Store::arena_base() const { return arena_->base(); }
uint64_t Store::arena_size() const { return arena_->size(); }
const Geometry& Store::geometry() const { return arena_->geometry(); }

StoreStats Store::stats() const {
  StoreStats s;
  ArenaHeader* h = arena_->header();
  auto ld = [](uint64_t& f) {
    return std::atomic_ref<uint64_t>(f).load(std::memory_order_relaxed);
  };
  s.keys = ld(h->num_keys);
  s.resident_keys = ld(h->resident_keys);
  s.marker_slots = ld(h->marker_slots);
  s.lossy_buckets = ld(h->lossy_buckets);
  s.evictions = ld(h->evictions);
  s.overflow_buckets = ld(h->overflow_buckets);
  s.arena_bytes = arena_->size();
  s.index_bytes = arena_->geometry().index_bytes();
  {
    absl::ReaderMutexLock a(&arena_mu_);
    s.heap_free_bytes = arena_->HeapFreeBytes();
  }
  s.heap_object_bytes = ld(h->heap_bytes);
  s.inline_object_bytes = ld(h->inline_bytes);
  s.limbo_entries = ld(h->limbo_tail) - ld(h->limbo_head);
  s.generation = ld(h->generation);
  s.puts = puts_.load(std::memory_order_relaxed);
  s.deletes = deletes_.load(std::memory_order_relaxed);
  s.commits = commits_.load(std::memory_order_relaxed);
  s.gets_arena = gets_arena_.load(std::memory_order_relaxed);
  s.gets_db = gets_db_.load(std::memory_order_relaxed);
  s.gets_missing = gets_missing_.load(std::memory_order_relaxed);
  s.promotions = promotions_.load(std::memory_order_relaxed);
  s.rebuilt_keys = rebuilt_keys_;
  s.wal_records_replayed = wal_records_replayed_;
  s.journaled = journaled_.load(std::memory_order_relaxed);
  s.replayed = replayed_.load(std::memory_order_relaxed);
  s.replayed_locked = replayed_locked_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace kvnode::storage
