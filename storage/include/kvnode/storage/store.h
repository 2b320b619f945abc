// Store: the node's storage engine. RocksDB is the source of truth; the arena
// (arena.h) is an RDMA-readable cache of it that remote clients read with
// one-sided READs (read_path.h).
//
// Threads: every method may be called from any number of threads. Writes
// (Put, Delete, and promotion of a key into the arena) are serialised inside:
// there is a single writer at a time, which is the invariant the index relies
// on. Get runs concurrently with other Gets and waits only for the short
// publication step of a write, never for its RocksDB write.
//
// Durability: Put and Delete return only after RocksDB accepted the write (WAL
// on, fsync when sync_writes) and the arena was updated; a write that fails in
// RocksDB is not published.
//
// Life cycle, cold and clean:
//   Open()  -> [Put/Delete/Get]* -> Close()           (Close marks the arena clean)
//   Open() re-attaches a clean arena whose generation matches RocksDB's without
//   reading any data; otherwise it rebuilds the arena from RocksDB.
// Live upgrade (old process O, new process N, both alive):
//   N: AttachLive()          maps the arena, validates it, reads nothing else;
//                            N can register it and serve Get from the arena.
//   N: PrepareJournal()      creates the write journal (journal.h), off the
//                            write path
//   O: ReleaseDbForHandoff() stops writes and every use of RocksDB here; the
//                            database stays open (its LOCK held) until
//                            CloseReleasedDb(); the arena stays mapped, readable
//                            and NOT marked clean or lost, and O writes no byte
//                            of it any more (its Gets mark no key for CLOCK)
//   N: BecomeJournalWriter() the writer switch: N is the arena's only writer and
//                            makes each write durable in the journal
//   O: CloseReleasedDb()     flushes the memtable, closes RocksDB
//   N: OpenDb()              opens RocksDB (journal writes go on meanwhile),
//                            replays the journal, keeps it as the next
//                            upgrade's spare, and writes go to RocksDB again
//   O: destroys its Store    (unmaps only). On a failed handoff, once N is dead
//                            (fenced): O: ReopenDbAfterFailedHandoff(), which
//                            refuses when N may have acknowledged a write.
// Every writer's start (Open, OpenDb, ReopenDbAfterFailedHandoff) replays a
// journal left behind before anything else touches RocksDB.
// Crash of a writer at any point of a write: the arena's write intent names
// the key (arena.h); whoever becomes the writer next (OpenDb, the reopen after
// a failed handoff, Open of a clean arena) re-reads that key from RocksDB and
// republishes it, so every reader sees what RocksDB holds. A writer killed
// inside the heap allocator leaves an arena that OpenDb refuses (only a cold
// Open, which rebuilds it, can use the database then).
#ifndef KVNODE_STORAGE_STORE_H_
#define KVNODE_STORAGE_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvnode/storage/arena.h"
#include "kvnode/storage/format.h"
#include "kvnode/storage/limits.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
}  // namespace rocksdb

namespace kvnode::storage {

class IndexWriter;
class WriteJournal;
struct WriteSet;

struct StoreOptions {
  // RocksDB directory (required). Created if missing when create_if_missing.
  std::string db_path = "";
  bool create_if_missing = true;
  // fsync the WAL before a write is acknowledged.
  bool sync_writes = true;

  // Arena segment: a POSIX shared-memory object /dev/shm/<shm_name>, or, if
  // arena_file is set, a managed_mapped_file at that path (a hugetlbfs mount
  // for huge pages). Created with mode 0600.
  std::string shm_name = "kvnode-arena";
  std::string arena_file = "";
  // Mapping size in bytes (rounded up to the page / huge page size).
  uint64_t arena_size = uint64_t{256} << 20;
  // Index geometry, see ArenaOptions. bucket_count 0 = automatic.
  uint32_t bucket_size = 256;
  uint64_t bucket_count = 0;
  uint32_t limbo_capacity = 65536;
  uint64_t hash_seed = 0;  // 0 = random per created arena
  // Most buckets in one chain (the home bucket and its overflow buckets),
  // 1..kMaxChainLength: 6 slots each, so at most 6 x this many keys share a
  // home bucket. A Put of a new key whose chain is full fails with
  // ResourceExhausted. Clients know the hash seed (they compute the bucket),
  // so a client can aim keys at one bucket: the bound caps what that costs the
  // node (heap, and the data thread's walk on every write to that chain).
  // Natural chains stay below the default: with keys hashed at random, a
  // store with 6 times more keys than the index has slots (home buckets x 6)
  // fills a 16-bucket chain with a chance of ~1e-9 (256 MiB arena, automatic
  // bucket count); at 10 times, expect about one full chain. A store that
  // holds that many keys wants a larger index (bucket_count) anyway: every
  // miss walks its chain.
  uint32_t max_chain_buckets = 16;

  // How long retired object memory stays untouched before reuse, so that
  // readers that read a slot just before an update still find the old object.
  uint64_t reuse_grace_us = 50000;
  // A Get served from RocksDB brings the key back into the arena (may evict).
  bool promote_on_get = true;
  // Size of the write journal of a live upgrade (allocated when created):
  // a write that does not fit waits (Unavailable) for RocksDB.
  uint64_t journal_bytes = uint64_t{32} << 20;
  // Called after each pass of OpenDb's replay of the journal outside the
  // write lock (tests: writes that arrive between passes).
  std::function<void()> after_journal_pass;

  [[nodiscard]] absl::Status Validate() const;
  ArenaOptions arena_options() const;
};

struct StoreStats {
  uint64_t keys = 0;           // keys in the store
  uint64_t resident_keys = 0;  // keys readable from the arena
  uint64_t marker_slots = 0;   // non-resident keys with a marker
  uint64_t lossy_buckets = 0;  // chains whose misses must go to the server
  uint64_t evictions = 0;      // since the arena was created
  uint64_t overflow_buckets = 0;
  uint64_t arena_bytes = 0;      // mapping size (the MR length)
  uint64_t index_bytes = 0;      // home buckets
  uint64_t heap_free_bytes = 0;  // free bytes of the segment allocator
  uint64_t heap_object_bytes = 0;
  uint64_t inline_object_bytes = 0;
  uint64_t limbo_entries = 0;  // retired allocations waiting for their grace
  uint64_t generation = 0;
  // This process only:
  uint64_t puts = 0, deletes = 0;
  uint64_t commits = 0;  // durable writes (RocksDB batches, journal records) of puts and deletes
  uint64_t gets_arena = 0, gets_db = 0, gets_missing = 0, promotions = 0;
  uint64_t rebuilt_keys = 0;  // keys loaded by the rebuild at Open (0 if none)
  // Records Open's RocksDB open replayed from the WAL into the memtable
  // (flushed in the background afterwards, so a later start replays none of them).
  uint64_t wal_records_replayed = 0;
  // Write journal records (one per durable write: a group commit's writes
  // share one) appended, and replayed into RocksDB.
  uint64_t journaled = 0;
  uint64_t replayed = 0;
  uint64_t replayed_locked = 0;  // of those, replayed while writes waited
};

// What Store::Check found. A problem is a state a reader could be misled by
// (a stale value, a false NotFound) or one the writer's invariants forbid.
struct CheckReport {
  uint64_t db_keys = 0;         // keys in RocksDB
  uint64_t found = 0;           // of them, read from the arena as a client reads them
  uint64_t sent_to_server = 0;  // of them, not resident: a marker or LOSSY sends readers to RocksDB
  uint64_t buckets = 0;         // buckets walked (home and overflow)
  uint64_t resident_slots = 0;
  uint64_t marker_slots = 0;
  uint64_t problems = 0;
  std::vector<std::string> first_problems;  // the first few, each naming its key or slot
  double seconds = 0;
  bool clean() const { return problems == 0; }
};

// What a Put or Delete did, for a SideRecord's value.
struct WriteOutcome {
  uint64_t version = 0;  // the Put's version (0 for a Delete)
  bool existed = false;  // the key existed before the write (the index's view)
};

// A small record stored in the SAME RocksDB write batch as a Put or Delete:
// both survive a crash or neither does. Kept in the metadata column family
// under "side/" + key (docs/format.md "Side records"), never seen by Get or
// the arena. The server keeps per-client dedupe state there. Of a group
// commit's side records with one key only the last is written (what the
// batch would keep).
struct SideRecord {
  std::string key;  // non-empty
  // Called once, under the write lock, when the write's outcome is known.
  std::function<std::string(const WriteOutcome&)> value;
};

// One write of a group (Store::Write). Views: what they point to must outlive
// the Write call.
struct WriteOp {
  enum class Kind : uint8_t { kPut, kDelete };
  Kind kind = Kind::kPut;
  std::string_view key;
  std::string_view value;            // kPut only
  const SideRecord* side = nullptr;  // written atomically with this op
};

// What became of one WriteOp.
struct WriteResult {
  absl::Status status;   // as Put/Delete would return it
  uint64_t version = 0;  // a Put's version
  bool existed = false;  // the key existed before the op
};

class Store {
 public:
  // kReattached: the arena of a clean shutdown; kRecovered: the arena of a
  // writer that died (kill -9, a crash), taken back as a live upgrade takes
  // over from a dead process (ReattachRefusal says when it may be).
  enum class OpenedAs { kCreated, kRebuilt, kReattached, kRecovered, kAttachedLive };

  // Cold start or restart: opens RocksDB, then re-attaches a matching arena
  // (clean, or dirty with a dead writer) or (re)builds one from RocksDB. An arena of another user,
  // or with group/other permissions, is an error (never rebuilt over). Leaves a spare write journal
  // (journal_bytes) for the first live upgrade.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Store>> Open(const StoreOptions& options);
  // Live upgrade, new side: maps the existing arena only (O(1), no data read).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Store>> AttachLive(
      const StoreOptions& options);

  ~Store();  // without Close(): the arena is left dirty (next Open rebuilds)
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Live upgrade, new side: opens RocksDB (fails while the old owner holds
  // it) and takes over as the writer. Fails with FailedPrecondition when the
  // arena's generation is not the database's.
  [[nodiscard]] absl::Status OpenDb();
  // Live upgrade, new side, before the writer switch: creates the write
  // journal (WriteJournal::Create, allocated to journal_bytes).
  [[nodiscard]] absl::Status PrepareJournal();
  // Live upgrade, new side, at the writer switch (the old side released the
  // database): this process becomes the arena's only writer, versions go on
  // from `last_version` (the old writer's last), and each write is made
  // durable in the journal until OpenDb. A write whose key's existence only
  // RocksDB knows (a lossy index chain) is Unavailable until then, as is a
  // Get of a key not resident in the arena.
  [[nodiscard]] absl::Status BecomeJournalWriter(uint64_t last_version);
  // Live upgrade, old side: waits for in-flight writes, refuses new ones and
  // every later use of RocksDB by this process (Get of a non-resident key is
  // Unavailable), but keeps the database open (fast; a failed handoff takes
  // it back without an open). The arena stays mapped and readable.
  [[nodiscard]] absl::Status ReleaseDbForHandoff();
  // Flushes the memtable of the database ReleaseDbForHandoff kept open (so
  // that the next open has no WAL to replay), then closes it. OK if none.
  [[nodiscard]] absl::Status CloseReleasedDb();
  // ReleaseDbForHandoff, then CloseReleasedDb.
  [[nodiscard]] absl::Status CloseDbForHandoff();
  // The version of the last write (the writer switch passes it on).
  uint64_t last_version();
  // Old side, after a failed handoff, with the new side dead. Takes the
  // released database back (or opens it again) and becomes the writer under a
  // new generation, with the version counter reloaded. Refuses
  // (FailedPrecondition, database closed again) when another process claimed
  // the database and wrote to it since this one did, or left journaled
  // writes (it may have acknowledged those writes), or when the arena's heap
  // was left torn: the caller must then not resume writes.
  [[nodiscard]] absl::Status ReopenDbAfterFailedHandoff();
  // Clean shutdown: closes RocksDB, then marks the arena clean.
  [[nodiscard]] absl::Status Close();

  // Returns the version given to this write (increasing across the store's
  // life). InvalidArgument for an empty or oversize key or an oversize value;
  // FailedPrecondition when this process is not the writer (DB not open).
  // `side`, when given, is written atomically with the value.
  [[nodiscard]] absl::StatusOr<uint64_t> Put(std::string_view key, std::string_view value,
                                             const SideRecord* side = nullptr);
  // Deleting an absent key is OK (and still writes `side`).
  [[nodiscard]] absl::Status Delete(std::string_view key, const SideRecord* side = nullptr);
  // Group commit: applies `ops` in order, results[i] for ops[i] (same
  // sizes), each op as Put or Delete would, but with one durable write
  // (RocksDB batch and WAL sync, or journal record) for as many consecutive
  // ops as a group can hold. A group ends before an op on a key already in
  // it, before a second new key with the same home bucket (the chain bound is
  // checked per key against the published index), and when the write
  // intent's key list is full, or (during the writer switch) one journal
  // record's ops (WriteJournal::kMaxRecordOps). An op refused on its own (bad key, full chain)
  // leaves the group going; a failed durable write fails its group and every
  // later op with the same status. Side record values are computed in op
  // order, under the write lock.
  // While OpenDb moves the journal's last records into RocksDB (the end of a
  // writer switch, under the write lock: tens of milliseconds) every op is
  // refused with Unavailable, not queued: the server answers BUSY, its
  // thread goes on serving, and the client re-sends the write later outside
  // the slots its GETs use.
  void Write(std::span<const WriteOp> ops, std::span<WriteResult> results)
      ABSL_LOCKS_EXCLUDED(write_mu_);

  // Side records whose key starts with `prefix`, in key order, as (key,
  // value). FailedPrecondition when the DB is not open here.
  [[nodiscard]] absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadSideRecords(
      std::string_view prefix);
  // Removes one side record (not synced: a removal lost in a crash only keeps
  // a stale record). OK if absent.
  [[nodiscard]] absl::Status DeleteSideRecord(std::string_view key);

  struct GetResult {
    std::string value;
    uint64_t version = 0;
    bool from_arena = false;
  };
  // The arena if the key is resident, else RocksDB. NotFound if absent;
  // Unavailable when the key is not resident and the DB is not open here, or
  // while OpenDb takes it over (retry).
  [[nodiscard]] absl::StatusOr<GetResult> Get(std::string_view key);

  // The arena against RocksDB (`kvctl check`): every key of the database is
  // read from the arena as a remote client reads it (a stale value or a
  // NotFound is a problem; a marker or LOSSY, which send the reader to the
  // server, are not), and every resident slot's object is checked against
  // the database (intact, owned by its slot, in its home chain, the
  // database's version and value). Holds the writer's lock: writes wait
  // while it runs, reads go on. FailedPrecondition when this process is not
  // the writer with RocksDB open.
  [[nodiscard]] absl::StatusOr<CheckReport> Check() ABSL_LOCKS_EXCLUDED(write_mu_);

  // The mapping to register (one MR, iova 0: remote address = arena offset).
  char* arena_base() const;
  uint64_t arena_size() const;
  // What clients need to read (send Geometry::Encode() at connect).
  const Geometry& geometry() const;
  const Arena& arena() const { return *arena_; }
  // Writer only: the offset of the arena's slot-words table
  // (Arena::EnsureSlotWords), created when the arena has none yet, under
  // the write lock. FailedPrecondition when this process is not the writer.
  [[nodiscard]] absl::StatusOr<uint64_t> EnsureSlotWords() ABSL_LOCKS_EXCLUDED(write_mu_);
  OpenedAs opened_as() const { return opened_as_; }
  // Why Open did what it did (logged; `kvctl stats` shows it), e.g. "its
  // writer died; heap intact, generation 7 matches".
  const std::string& open_reason() const { return open_reason_; }
  StoreStats stats() const;
  // Records in RocksDB's memtables, held by the WAL alone: what a start after
  // a crash now would replay (0 when the database is not open here). Not in
  // stats(): it takes the database's lock, which an open holds for seconds,
  // and stats() is polled by the control thread.
  uint64_t UnflushedRecords() const ABSL_LOCKS_EXCLUDED(db_mu_);

 private:
  explicit Store(const StoreOptions& options);
  absl::Status OpenRocksDb() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  void CloseRocksDb() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // Writes the records of a journal left in the database directory from
  // offset `from` (0: all) into RocksDB (one synced batch) and retires it
  // (journal.h); returns how many.
  absl::StatusOr<uint64_t> ReplayJournal(uint64_t from = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_);
  // Removes the journal ReplayJournal retired, if any (outside the locks:
  // freeing its blocks may take long).
  void RemoveRetiredJournal();
  // The spare journal for the next live upgrade's new process (journal.h):
  // its own retired journal when this process wrote it (retired_written_),
  // else the retired one removed and a spare allocated. Outside the locks.
  // A failure leaves the next upgrade to allocate its journal, as it would
  // without a spare.
  void RecycleRetiredJournal();
  void MakeSpareJournal();
  // OpenDb's part under the locks: takes the RocksDB it opened, replays the
  // journal's records from `replayed_to` (`early` were replayed before) and
  // becomes the writer.
  absl::Status AdoptDbAndReplayRest(rocksdb::DB* db, std::vector<rocksdb::ColumnFamilyHandle*> cfs,
                                    uint64_t replayed_to, uint64_t early)
      ABSL_LOCKS_EXCLUDED(write_mu_, db_mu_);
  void WriteLocked(std::span<const WriteOp> ops, std::span<WriteResult> results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Makes this process the arena's writer (creates writer_ if absent), and
  // ends that (drops it; any Get's CLOCK mark in flight ends first).
  void StartWriting() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_LOCKS_EXCLUDED(arena_mu_);
  void StopWriting() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_LOCKS_EXCLUDED(arena_mu_);
  // Makes one write's mutations durable: RocksDB, or the journal during the
  // writer switch.
  absl::Status Commit(WriteSet& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // OpenRocksDb in a store that has its arena (OpenDb, ReopenDbAfterFailedHandoff);
  // returns the generation the database records (0: none).
  absl::StatusOr<uint64_t> OpenRocksDbAgain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_);
  absl::Status Rebuild() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_);
  absl::Status Claim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_);
  // After RocksDB opened on an arena another process wrote (OpenDb, the
  // reopen after a failed handoff): refuse a heap torn inside the allocator,
  // Claim, reconcile a pending write intent. Closes RocksDB on failure.
  absl::Status BecomeWriter() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, db_mu_);
  // One durable write of Write() under construction.
  struct Group;
  // Makes `g` durable and publishes it; false (every op of the group given
  // the error) when the durable write failed.
  bool CommitGroup(Group& g, std::span<WriteResult> results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // Write intent (arena.h): Begin reconciles a pending one first.
  struct IntentKey {
    std::string_view key;
    bool existed = false;
  };
  absl::Status BeginIntent(std::span<const IntentKey> keys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // Reads `key` from RocksDB and shows that in the arena (ReconcileIntent).
  absl::Status Republish(std::string_view key, bool existed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  void EndIntent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status ReconcileIntent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // FailedPrecondition when a writer died inside the heap allocator.
  absl::Status CheckHeap() const;
  // Records in the memtables: at Open, those replayed from the WAL.
  uint64_t MemtableRecords() const ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  void FlushReplayedWal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // Open's test of an arena found at start: "" to take it, else why not.
  static std::string ReattachRefusal(Arena& arena, uint64_t replayed, uint64_t db_gen,
                                     uint64_t db_arena_id);
  absl::StatusOr<bool> DbContains(std::string_view key) ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // *home_bucket: the key's home bucket in the index (a group's new keys
  // must not share one).
  absl::StatusOr<bool> ExistsForWrite(std::string_view key, uint64_t* home_bucket)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  static absl::Status SwitchingRefusal();
  absl::StatusOr<bool> ReadFromDb(std::string_view key, GetResult* out)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  void Promote(std::string_view key);

  const StoreOptions options_;
  // Lock order: write_mu_, then db_mu_, then released_mu_ or arena_mu_.
  absl::Mutex write_mu_;          // the single writer
  mutable absl::Mutex db_mu_;     // db_ lifetime (shared: use, exclusive: open/close)
  mutable absl::Mutex arena_mu_;  // index words (shared: Get, exclusive: publish)
  std::unique_ptr<Arena> arena_;  // set once in Open/AttachLive, then immutable
  // The arena's index writer: present exactly while this process is the
  // arena's one writer (docs/format.md), from Open, BecomeJournalWriter, or
  // the claim of OpenDb or ReopenDbAfterFailedHandoff, until
  // ReleaseDbForHandoff, Close, or a takeover that failed without a journal.
  // Without it this process has nothing that writes the arena: Get reads it
  // through read_path.h and marks no key for CLOCK. Set and reset only with
  // write_mu_ held as well, so a write holding write_mu_ sees it stay.
  std::unique_ptr<IndexWriter> writer_ ABSL_GUARDED_BY(arena_mu_);
  rocksdb::DB* db_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs_ ABSL_GUARDED_BY(db_mu_);  // data, meta
  // The database ReleaseDbForHandoff kept open for CloseReleasedDb or a
  // failed handoff (guarded by its own mutex: closing takes long and must not
  // hold up readers, which see db_ == nullptr meanwhile).
  absl::Mutex released_mu_;
  rocksdb::DB* released_db_ ABSL_GUARDED_BY(released_mu_) = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> released_cfs_ ABSL_GUARDED_BY(released_mu_);
  // PrepareJournal's journal; BecomeJournalWriter makes it the write path
  // (journal_), OpenDb replays and drops it.
  std::unique_ptr<WriteJournal> prepared_journal_ ABSL_GUARDED_BY(write_mu_);
  std::unique_ptr<WriteJournal> journal_ ABSL_GUARDED_BY(write_mu_);
  // How far this process wrote the journal ReplayJournal retired (0: it did
  // not write it); what RecycleRetiredJournal zeroes.
  uint64_t retired_written_ ABSL_GUARDED_BY(write_mu_) = 0;
  uint64_t last_version_ ABSL_GUARDED_BY(write_mu_) = 0;
  // The generation this process claimed (0: none), and whether a write under
  // it is in RocksDB yet (the first one records it: kWrittenGenerationKey).
  uint64_t claimed_generation_ ABSL_GUARDED_BY(write_mu_) = 0;
  bool generation_written_ ABSL_GUARDED_BY(write_mu_) = false;
  bool closed_ ABSL_GUARDED_BY(write_mu_) = false;
  // Set while OpenDb holds (or waits for) write_mu_ and db_mu_ to replay the
  // journal's rest, tens of milliseconds: Write, and a Get that must read
  // RocksDB, answer SwitchingRefusal() instead of waiting, since their caller
  // is the server's data thread, which serves every client. Set before the
  // locks are taken, so an op that finds one taken then sees it set.
  std::atomic<bool> switching_{false};
  OpenedAs opened_as_ = OpenedAs::kCreated;
  std::string open_reason_;
  uint64_t rebuilt_keys_ = 0;
  uint64_t wal_records_replayed_ = 0;  // set by Open
  mutable std::atomic<uint64_t> puts_{0}, deletes_{0}, commits_{0}, gets_arena_{0}, gets_db_{0},
      gets_missing_{0}, promotions_{0}, journaled_{0}, replayed_{0}, replayed_locked_{0};
};

const char* OpenedAsName(Store::OpenedAs a);

// Test seam: called with the name of each crash point of a write, on the
// writer thread with the write lock held: "write.before_db" (intent recorded,
// RocksDB not written), "write.after_db" (RocksDB written, arena not yet),
// "write.after_publish" (arena updated, intent not yet cleared), of a
// claim: "claim.after_db" (generation in RocksDB, not yet in the arena header),
// and of OpenDb after a writer switch: "journal.before_replay" (RocksDB open,
// the journal's last records not yet in it), "journal.after_replay" (all in
// RocksDB, the journal not yet removed).
// nullptr (the
// default): none. Crash tests kill the process there.
using CrashPointHook = void (*)(const char* point);
void SetCrashPointHookForTesting(CrashPointHook hook);

}  // namespace kvnode::storage

#endif  // KVNODE_STORAGE_STORE_H_
