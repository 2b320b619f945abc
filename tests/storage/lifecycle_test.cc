// Re-attach, rebuild, live-upgrade attach and handoff, permissions and header
// validation.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "child_process.h"
#include "db_layout.h"
#include "kvnode/storage/arena.h"
#include "kvnode/storage/read_path.h"
#include "kvnode/storage/store.h"
#include "rocksdb/db.h"
#include "test_util.h"

namespace kvnode::storage {
namespace {

using testing::TempStore;

std::string Key(int i) { return "key-" + std::to_string(i); }
std::string Value(int i) { return "value-" + std::to_string(i) + std::string(i % 50 * 7, 'v'); }

void Fill(Store& s, int n) {
  for (int i = 0; i < n; ++i) ASSERT_TRUE(s.Put(Key(i), Value(i)).ok());
}
void ExpectAll(Store& s, int n, bool from_arena) {
  for (int i = 0; i < n; ++i) {
    auto g = s.Get(Key(i));
    ASSERT_TRUE(g.ok()) << Key(i) << ": " << g.status();
    EXPECT_EQ(g->value, Value(i));
    if (from_arena) {
      EXPECT_TRUE(g->from_arena) << Key(i);
    }
  }
}

// The database's options (db_layout.h): a PUT of a key whose newest record
// is in the memtable overwrites it in place, so overwrites leave one record
// per key in the memtable, also when a new process replays the WAL into it
// (what a live upgrade's RocksDB open does), and the newest value is the
// one read back.
TEST(DbLayoutTest, OverwritesOfAKeyLeaveOneMemtableRecord) {
  TempStore t;
  constexpr int kWrites = 500;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < kWrites; ++i) {
      ASSERT_TRUE((*s)->Put("hot", absl::StrCat("value-", 1000 + i)).ok());
    }
    // Not closed (Close flushes): the WAL alone holds the writes, as after a
    // crash or a live upgrade's handoff.
  }
  rocksdb::DBOptions dbo = dblayout::DbOptions();
  dbo.avoid_flush_during_recovery = true;  // replay into the memtable, as the store does
  std::vector<rocksdb::ColumnFamilyHandle*> h;
  rocksdb::DB* db = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(dbo, t.options.db_path, dblayout::ColumnFamilies(), &h, &db).ok());
  uint64_t data = 0, meta = 0;
  ASSERT_TRUE(db->GetIntProperty(h[0], "rocksdb.num-entries-active-mem-table", &data));
  ASSERT_TRUE(db->GetIntProperty(h[1], "rocksdb.num-entries-active-mem-table", &meta));
  EXPECT_EQ(data, 1u) << "one record for " << kWrites << " writes of one key";
  EXPECT_LT(meta, 10u) << "last_version and the other meta records, once each";
  std::string v;
  ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), h[0], "hot", &v).ok());
  EXPECT_EQ(v.substr(dblayout::kVersionPrefix), absl::StrCat("value-", 1000 + kWrites - 1));
  EXPECT_EQ(LoadU64(v.data()), uint64_t{kWrites});
  for (auto* c : h) ASSERT_TRUE(db->DestroyColumnFamilyHandle(c).ok());
  ASSERT_TRUE(db->Close().ok());
  delete db;
}

// A start after a crash replays the WAL written since the last flush. It
// flushes what it replayed in the background, so that the next start after a
// crash replays only what was written since: without that, each crash's
// replay would carry every earlier one's (up to max_total_wal_size).
TEST(ReattachTest, AStartFlushesTheWalItReplayed) {
  TempStore t;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    Fill(**s, 1000);
  }  // destroyed without Close: the WAL alone holds the writes
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRecovered) << (*s)->open_reason();
    EXPECT_GE((*s)->stats().wal_records_replayed, 1000u);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((*s)->UnflushedRecords() >= 1000) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the replayed WAL was not flushed";
      std::this_thread::yield();
    }
    ASSERT_TRUE((*s)->Put(Key(1), "after").ok());
  }
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_LT((*s)->stats().wal_records_replayed, 20u)
      << "the first restart's replay was replayed again";
  auto g = (*s)->Get(Key(1));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->value, "after");
  ExpectAll(**s, 1, /*from_arena=*/true);
}

TEST(ReattachTest, CleanArenaIsReattachedWithoutReload) {
  TempStore t;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    Fill(**s, 500);
    ASSERT_TRUE((*s)->Close().ok());
  }
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kReattached);
  EXPECT_EQ((*s)->stats().rebuilt_keys, 0u);
  EXPECT_EQ((*s)->stats().keys, 500u);
  ExpectAll(**s, 500, /*from_arena=*/true);
}

// The child: attaches the arena only (the database path given does not even
// exist) and reads every key from it.
TEST(ChildProcess, ReadAllFromArena) {
  const char* shm = testing::Env("KVNODE_CHILD_SHM");
  if (shm == nullptr) GTEST_SKIP() << "runs only as a child of ReattachTest";
  StoreOptions o;
  o.db_path = "/nonexistent/kvnode-child-must-not-open";
  o.shm_name = shm;
  o.arena_size = std::stoull(testing::Env("KVNODE_CHILD_SIZE"));
  auto s = Store::AttachLive(o);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectAll(**s, std::stoi(testing::Env("KVNODE_CHILD_KEYS")), /*from_arena=*/true);
  EXPECT_TRUE(absl::IsFailedPrecondition((*s)->Put("x", "y").status()));
}

TEST(ReattachTest, SecondProcessReadsEveryKeyWithoutRocksDb) {
  TempStore t;
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  Fill(**s, 300);
  ASSERT_TRUE((*s)->Close().ok());
  const pid_t pid = testing::SpawnTest("ChildProcess.ReadAllFromArena",
                                       {{"KVNODE_CHILD_SHM", t.options.shm_name},
                                        {"KVNODE_CHILD_SIZE", std::to_string(t.options.arena_size)},
                                        {"KVNODE_CHILD_KEYS", "300"}});
  ASSERT_GT(pid, 0);
  EXPECT_EQ(testing::WaitChild(pid), 0);
}

// A restart after a crash takes the dirty arena back: no rebuild.
TEST(ReattachTest, DirtyArenaOfADeadWriterIsTakenBack) {
  TempStore t;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    Fill(**s, 200);
    // No Close(): as if the process died.
  }
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRecovered) << (*s)->open_reason();
  EXPECT_NE((*s)->open_reason().find("died"), std::string::npos) << (*s)->open_reason();
  EXPECT_EQ((*s)->stats().rebuilt_keys, 0u);
  EXPECT_EQ((*s)->stats().keys, 200u);
  ExpectAll(**s, 200, true);
}

// A dirty arena whose writer still runs is never taken: it may still write.
TEST(ReattachTest, DirtyArenaOfARunningWriterIsRebuilt) {
  TempStore t;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();  // a process that is not this one and runs
    _exit(0);
  }
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    Fill(**s, 20);
    // The arena says the child is its writer, and the store is not closed.
    auto a = Arena::Attach(t.options.arena_options());
    ASSERT_TRUE(a.ok()) << a.status();
    (*a)->header()->writer_pid = static_cast<uint64_t>(child);
  }
  auto s = Store::Open(t.options);
  kill(child, SIGKILL);
  testing::WaitChild(child);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRebuilt);
  EXPECT_NE((*s)->open_reason().find("still runs"), std::string::npos) << (*s)->open_reason();
  ExpectAll(**s, 20, true);
}

// An arena claimed before the machine restarted (a file-backed one outlives
// a reboot) is rebuilt: what reached its file is unknown.
TEST(ReattachTest, ArenaOfAnotherBootIsRebuilt) {
  TempStore t;
  for (const bool clean : {false, true}) {
    SCOPED_TRACE(clean ? "clean" : "dirty");
    {
      auto s = Store::Open(t.options);
      ASSERT_TRUE(s.ok()) << s.status();
      Fill(**s, 20);
      if (clean) {
        ASSERT_TRUE((*s)->Close().ok());
      }
      auto a = Arena::Attach(t.options.arena_options());
      ASSERT_TRUE(a.ok()) << a.status();
      (*a)->header()->boot_id ^= 1;  // as if written before a reboot
    }
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRebuilt);
    EXPECT_NE((*s)->open_reason().find("boot id"), std::string::npos) << (*s)->open_reason();
    ExpectAll(**s, 20, true);
    ASSERT_TRUE((*s)->Close().ok());
  }
}

// Two databases at the same generation and one shm name: the arena left by
// one is never served for the other, clean or not (the database records
// which arena it last claimed).
TEST(ReattachTest, AnotherDatabasesArenaIsRebuiltNotServed) {
  TempStore a;
  StoreOptions b = a.options;
  b.db_path += "-other";
  {
    auto s = Store::Open(a.options);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->Put("k", "from-a").ok());
    ASSERT_TRUE((*s)->Close().ok());
  }
  ASSERT_TRUE(Arena::Remove(a.options.arena_options()).ok());
  {
    auto s = Store::Open(b);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->Put("k", "from-b").ok());
    ASSERT_TRUE((*s)->Close().ok());
  }
  auto s = Store::Open(a.options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRebuilt) << (*s)->open_reason();
  auto g = (*s)->Get("k");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->value, "from-a");
  std::error_code ec;
  std::filesystem::remove_all(b.db_path, ec);
}

TEST(ReattachTest, GenerationMismatchIsRebuiltAndRefusedLive) {
  TempStore t;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    Fill(**s, 100);
    ASSERT_TRUE((*s)->Close().ok());
  }
  // The database is used with another arena meanwhile (and changes).
  StoreOptions other = t.options;
  other.shm_name += "-other";
  {
    auto s = Store::Open(other);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->Put(Key(0), "changed").ok());
    ASSERT_TRUE((*s)->Close().ok());
  }
  ASSERT_TRUE(Arena::Remove(other.arena_options()).ok());
  {
    // The old arena is clean but stale: attaching it live must be refused.
    auto live = Store::AttachLive(t.options);
    ASSERT_TRUE(live.ok()) << live.status();
    absl::Status st = (*live)->OpenDb();
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_NE(st.message().find("generation"), std::string::npos) << st;
  }
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRebuilt);
  auto g = (*s)->Get(Key(0));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->value, "changed");
}

TEST(ReattachTest, DifferentSizeIsRefusedLiveAndRebuiltCold) {
  TempStore t;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    Fill(**s, 50);
    ASSERT_TRUE((*s)->Close().ok());
  }
  StoreOptions bigger = t.options;
  bigger.arena_size *= 2;
  auto live = Store::AttachLive(bigger);
  ASSERT_FALSE(live.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(live.status())) << live.status();
  EXPECT_NE(live.status().message().find("bytes"), std::string::npos) << live.status();
  StoreOptions other_buckets = t.options;
  other_buckets.bucket_size = 128;
  EXPECT_TRUE(absl::IsFailedPrecondition(Store::AttachLive(other_buckets).status()));
  auto s = Store::Open(bigger);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRebuilt);
  EXPECT_EQ((*s)->arena_size(), bigger.arena_size);
  ExpectAll(**s, 50, true);
}

TEST(LiveUpgradeTest, AttachWhileOldServesThenHandOff) {
  TempStore t;
  auto old_s = Store::Open(t.options);
  ASSERT_TRUE(old_s.ok()) << old_s.status();
  Store& o = **old_s;
  Fill(o, 400);

  auto new_s = Store::AttachLive(t.options);
  ASSERT_TRUE(new_s.ok()) << new_s.status();
  Store& n = **new_s;
  EXPECT_EQ(n.opened_as(), Store::OpenedAs::kAttachedLive);
  EXPECT_EQ(n.stats().keys, 400u);
  EXPECT_EQ(n.geometry(), o.geometry());
  ExpectAll(n, 400, true);
  EXPECT_TRUE(absl::IsFailedPrecondition(n.Put("x", "y").status()));
  // The old process still owns RocksDB.
  absl::Status st = n.OpenDb();
  EXPECT_FALSE(st.ok());
  // The old process keeps writing; the new one sees it through the arena.
  ASSERT_TRUE(o.Put(Key(1), "from-old").ok());
  EXPECT_EQ(n.Get(Key(1))->value, "from-old");

  ASSERT_TRUE(o.CloseDbForHandoff().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(o.Put("x", "y").status()));
  EXPECT_EQ(o.Get(Key(2))->value, Value(2));  // still readable
  ASSERT_TRUE(n.OpenDb().ok());
  ASSERT_TRUE(n.Put(Key(3), "from-new").ok());
  EXPECT_EQ(o.Get(Key(3))->value, "from-new");
  // Too late to roll back: the new side took the database.
  EXPECT_FALSE(o.ReopenDbAfterFailedHandoff().ok());
  old_s->reset();
  EXPECT_EQ(n.stats().keys, 400u);
  ASSERT_TRUE(n.Close().ok());
  new_s->reset();

  auto again = Store::Open(t.options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->opened_as(), Store::OpenedAs::kReattached);
  EXPECT_EQ((*again)->Get(Key(1))->value, "from-old");
  EXPECT_EQ((*again)->Get(Key(3))->value, "from-new");
}

TEST(LiveUpgradeTest, FailedHandoffRollsBack) {
  TempStore t;
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  Fill(**s, 10);
  ASSERT_TRUE((*s)->CloseDbForHandoff().ok());
  ASSERT_TRUE((*s)->ReopenDbAfterFailedHandoff().ok());
  ASSERT_TRUE((*s)->Put(Key(0), "after-rollback").ok());
  EXPECT_EQ((*s)->Get(Key(0))->value, "after-rollback");
  ASSERT_TRUE((*s)->Close().ok());
  auto again = Store::Open(t.options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->opened_as(), Store::OpenedAs::kReattached);
}

// A start that fails after the segment was created must not leave it in
// /dev/shm (it would hold tmpfs memory until someone removed it).
TEST(FailedOpenTest, RebuildFailureRemovesTheSegmentItCreated) {
  TempStore t;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    Fill(**s, 20);
    ASSERT_TRUE((*s)->Close().ok());
  }
  ASSERT_TRUE(Arena::Remove(t.options.arena_options()).ok());
  {
    // A record shorter than its version prefix: the rebuild reports data loss.
    rocksdb::DBOptions dbo;
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
        {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
        {"kvnode.meta", rocksdb::ColumnFamilyOptions()}};
    std::vector<rocksdb::ColumnFamilyHandle*> h;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(dbo, t.options.db_path, cfs, &h, &db).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), h[0], "torn", "xy").ok());
    for (auto* c : h) ASSERT_TRUE(db->DestroyColumnFamilyHandle(c).ok());
    ASSERT_TRUE(db->Close().ok());
    delete db;
  }
  const std::string path = "/dev/shm/" + t.options.shm_name;
  auto o = Store::Open(t.options);
  ASSERT_FALSE(o.ok());
  EXPECT_TRUE(absl::IsDataLoss(o.status())) << o.status();
  EXPECT_NE(access(path.c_str(), F_OK), 0) << path << " left behind by a failed open";
  EXPECT_EQ(errno, ENOENT);
}

TEST(PermissionTest, SegmentIsPrivate) {
  TempStore t;
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->Close().ok());
  s->reset();
  const std::string path = "/dev/shm/" + t.options.shm_name;
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, geteuid());

  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  auto a = Arena::Attach(t.options.arena_options());
  EXPECT_TRUE(absl::IsPermissionDenied(a.status())) << a.status();
  auto o = Store::Open(t.options);  // never rebuilt over
  EXPECT_TRUE(absl::IsPermissionDenied(o.status())) << o.status();
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);

  if (geteuid() == 0) {
    ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
    a = Arena::Attach(t.options.arena_options());
    EXPECT_TRUE(absl::IsPermissionDenied(a.status())) << a.status();
    EXPECT_NE(a.status().message().find("owned by uid 65534"), std::string::npos);
    EXPECT_TRUE(absl::IsPermissionDenied(Store::Open(t.options).status()));
    ASSERT_EQ(chown(path.c_str(), 0, 0), 0);
  }
}

TEST(PermissionTest, MappedFileIsPrivate) {
  TempStore t;
  t.options.arena_file = (t.dir() / "arena").string();
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  Fill(**s, 20);
  ASSERT_TRUE((*s)->Close().ok());
  s->reset();
  struct stat st;
  ASSERT_EQ(stat(t.options.arena_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto again = Store::Open(t.options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->opened_as(), Store::OpenedAs::kReattached);
  ExpectAll(**again, 20, true);
}

// Pokes a field of the header of a closed arena.
template <typename F>
void PokeHeader(const StoreOptions& o, F f) {
  auto a = Arena::Attach(o.arena_options());
  ASSERT_TRUE(a.ok()) << a.status();
  f((*a)->header());
}

TEST(HeaderTest, WrongLayoutVersionOrMagicIsRefused) {
  TempStore t;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    Fill(**s, 30);
    ASSERT_TRUE((*s)->Close().ok());
  }
  PokeHeader(t.options, [](ArenaHeader* h) { h->layout_version = 99; });
  auto a = Arena::Attach(t.options.arena_options());
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(a.status()));
  EXPECT_NE(a.status().message().find("layout version 99"), std::string::npos) << a.status();
  EXPECT_FALSE(Store::AttachLive(t.options).ok());
  {
    auto s = Store::Open(t.options);  // cold start: rebuilt from RocksDB
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRebuilt);
    ExpectAll(**s, 30, true);
    ASSERT_TRUE((*s)->Close().ok());
  }
  auto held = Arena::Attach(t.options.arena_options());  // pokes through this mapping
  ASSERT_TRUE(held.ok()) << held.status();
  (*held)->header()->magic ^= 1;
  a = Arena::Attach(t.options.arena_options());
  EXPECT_NE(a.status().message().find("bad magic"), std::string::npos) << a.status();
  (*held)->header()->magic ^= 1;
  (*held)->header()->bucket_count *= 2;
  a = Arena::Attach(t.options.arena_options());
  EXPECT_NE(a.status().message().find("checksum"), std::string::npos) << a.status();
  (*held)->header()->bucket_count /= 2;
  EXPECT_TRUE(Arena::Attach(t.options.arena_options()).ok());
}

TEST(HeaderTest, ForeignSegmentIsRefusedWithoutHanging) {
  TempStore t;
  const std::string name = "/" + t.options.shm_name;
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(t.options.arena_size)), 0);
  close(fd);
  // All zeroes: Boost alone would spin forever on it.
  auto a = Arena::Attach(t.options.arena_options());
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(a.status())) << a.status();
  EXPECT_FALSE(Store::AttachLive(t.options).ok());
  auto s = Store::Open(t.options);  // ours to replace: same owner, 0600
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRebuilt);
}

}  // namespace
}  // namespace kvnode::storage
