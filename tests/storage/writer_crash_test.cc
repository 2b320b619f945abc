// A writer process killed in the middle of its work, then another process
// taking over the store, with real processes (child_process.h):
//  - a write killed between RocksDB and the arena: after the takeover every
//    reader (the remote read path) sees what RocksDB holds, also in a full
//    arena where markers cover evicted keys;
//  - a process killed inside the segment's allocator (or while holding what
//    used to be its lock): the next writer never blocks;
//  - a failed handoff whose new side claimed the database and died: the old
//    side resumes only when the new one wrote nothing, and never reuses a
//    version.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "child_process.h"
#include "kvnode/storage/arena.h"
#include "kvnode/storage/read_path.h"
#include "kvnode/storage/store.h"
#include "rocksdb/db.h"
#include "test_util.h"

namespace kvnode::storage {
namespace {

using testing::TempStore;

constexpr int kSeedKeys = 10;
std::string Key(int i) { return "key-" + std::to_string(i); }
std::string OldValue(int i) { return "old-" + std::to_string(i) + std::string(i * 40, 'o'); }

StoreOptions ChildOptions() {
  StoreOptions o;
  o.db_path = testing::Env("KVNODE_WC_DB");
  o.shm_name = testing::Env("KVNODE_WC_SHM");
  o.arena_size = 8 << 20;
  o.sync_writes = true;
  return o;
}

std::map<std::string, std::string> ChildEnv(const TempStore& t,
                                            std::map<std::string, std::string> more = {}) {
  more["KVNODE_WC_DB"] = t.options.db_path;
  more["KVNODE_WC_SHM"] = t.options.shm_name;
  return more;
}

// Runs one child test to its end, or kills it at the deadline: -2 then.
int RunChild(const std::string& test, const std::map<std::string, std::string>& env,
             std::chrono::seconds limit) {
  const pid_t pid = testing::SpawnTest(test, env);
  if (pid <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      testing::WaitChild(pid);
      return -2;
    }
    const timespec pause{0, 5'000'000};
    nanosleep(&pause, nullptr);  // polling the child's exit, not synchronising
  }
}

// One walk of the read path over the arena as it is now; a found value
// points into *holder.
ReadResult ReadArena(const Store& s, const std::string& key, std::string* holder) {
  const Geometry& g = s.geometry();
  ReadStep step = FirstRead(g, key);
  ReadResult r;
  do {
    holder->assign(s.arena_base() + step.offset, step.length);
    r = Decode(g, key, step, *holder);
    step = r.next;
  } while (r.outcome == ReadResult::Outcome::kNext);
  return r;
}

// What a remote client reads for `key`: the arena through the read path, and
// the server (Store::Get) when the read path says to ask it.
std::optional<std::string> RemoteGet(Store& s, const std::string& key) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::string holder;
    const ReadResult r = ReadArena(s, key, &holder);
    if (r.outcome == ReadResult::Outcome::kFound) return std::string(r.value);
    if (r.outcome == ReadResult::Outcome::kNotFound) return std::nullopt;
    if (r.outcome == ReadResult::Outcome::kSlowPath) break;
  }
  auto got = s.Get(key);
  if (absl::IsNotFound(got.status())) return std::nullopt;
  EXPECT_TRUE(got.ok()) << key << ": " << got.status();
  return got.ok() ? std::optional<std::string>(got->value) : std::nullopt;
}

// RocksDB's own answer, read-only beside the process that has it open.
std::map<std::string, std::string> DbContents(const std::string& path) {
  rocksdb::DBOptions dbo;
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {"kvnode.meta", rocksdb::ColumnFamilyOptions()}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status st = rocksdb::DB::OpenForReadOnly(dbo, path, cfs, &handles, &raw);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::map<std::string, std::string> out;
  if (!st.ok()) return out;
  std::unique_ptr<rocksdb::DB> db(raw);
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[0]));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    out[it->key().ToString()] = it->value().ToString().substr(8);  // u64 version prefix
  }
  for (auto* h : handles) (void)db->DestroyColumnFamilyHandle(h);
  return out;
}

void DieAt(const char* point) {
  const char* want = std::getenv("KVNODE_WC_POINT");
  if (want != nullptr && std::strcmp(point, want) == 0) kill(getpid(), SIGKILL);
}

// The old process: re-attaches the clean arena, then does one write and is
// killed at KVNODE_WC_POINT inside it. KVNODE_WC_OVERWRITE and
// KVNODE_WC_DELETE name the keys it overwrites and deletes.
TEST(WriterCrashChild, WriteAndDie) {
  if (testing::Env("KVNODE_WC_DB") == nullptr) GTEST_SKIP() << "runs only as a child";
  auto s = Store::Open(ChildOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ((*s)->opened_as(), Store::OpenedAs::kReattached);
  SetCrashPointHookForTesting(&DieAt);
  const std::string op = testing::Env("KVNODE_WC_OP");
  const std::string overwritten = testing::Env("KVNODE_WC_OVERWRITE");
  const std::string deleted = testing::Env("KVNODE_WC_DELETE");
  if (op == "overwrite") {
    ASSERT_TRUE((*s)->Put(overwritten, "new-3").ok());
  } else if (op == "create") {
    ASSERT_TRUE((*s)->Put("key-new", std::string(700, 'n')).ok());
  } else if (op == "group") {             // all three in one group commit
    const std::string created(700, 'n');  // the ops' views
    const std::vector<WriteOp> ops = {{WriteOp::Kind::kPut, overwritten, "new-3", nullptr},
                                      {WriteOp::Kind::kPut, "key-new", created, nullptr},
                                      {WriteOp::Kind::kDelete, deleted, {}, nullptr}};
    std::vector<WriteResult> results(ops.size());
    (*s)->Write(ops, results);
  } else {
    ASSERT_TRUE((*s)->Delete(deleted).ok());
  }
  FAIL() << "not killed at " << testing::Env("KVNODE_WC_POINT");
}

// What a crash case's store holds before the write that is killed, and the
// keys that write overwrites and deletes.
struct Seeded {
  std::vector<std::string> keys;
  std::string overwritten;
  std::string deleted;
};

// Ten keys: every one resident, no marker in the arena.
Seeded SeedFew(Store& s) {
  Seeded out{{}, Key(3), Key(5)};
  for (int i = 0; i < kSeedKeys; ++i) {
    EXPECT_TRUE(s.Put(Key(i), OldValue(i)).ok());
    out.keys.push_back(Key(i));
  }
  return out;
}

// A full arena: enough keys that many were evicted (each leaves a marker),
// and a resident key V that shares its chain and fingerprint with an evicted
// key C, whose cover is a marker with V's fingerprint. The killed write
// deletes V: a removal of V repeated by the reconciliation must leave C's
// marker alone.
Seeded SeedFull(Store& s) {
  Seeded out{{}, Key(3), ""};
  const std::string big(3000, 'b');
  for (int i = 0; s.stats().evictions < 500; ++i) {
    if (i == 20000) {
      ADD_FAILURE() << "nothing was evicted from the arena";
      return out;
    }
    EXPECT_TRUE(s.Put(Key(i), big + std::to_string(i)).ok());
    out.keys.push_back(Key(i));
  }
  // The evicted keys (the read path finds only a marker), by chain and
  // fingerprint.
  const Geometry& g = s.geometry();
  std::map<std::pair<uint64_t, uint16_t>, std::string> evicted;
  for (const std::string& k : out.keys) {
    std::string holder;
    if (ReadArena(s, k, &holder).outcome == ReadResult::Outcome::kSlowPath) {
      const KeyHash h = HashKey(g, k);
      evicted[{h.bucket, h.fingerprint}] = k;
    }
  }
  if (evicted.empty()) {
    ADD_FAILURE() << "no key reads as evicted";
    return out;
  }
  for (uint64_t i = 0; out.deleted.empty(); ++i) {
    const std::string v = "victim-" + std::to_string(i);
    const KeyHash h = HashKey(g, v);
    if (evicted.count({h.bucket, h.fingerprint}) != 0) out.deleted = v;
  }
  EXPECT_TRUE(s.Put(out.deleted, "victim").ok());
  out.keys.push_back(out.deleted);
  return out;
}

// Who takes the store over from the killed writer: a live upgrade's new
// process whose old one died before HandOver, or a restart (Store::Open),
// which takes the dirty arena back instead of rebuilding it.
enum class Successor { kLiveTakeover, kRestart };

std::unique_ptr<Store> TakeOver(const StoreOptions& o, Successor how) {
  if (how == Successor::kRestart) {
    auto s = Store::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
    EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRecovered) << (*s)->open_reason();
    // The start flushes the WAL it replayed in the background: a read-only
    // open of the database (DbContents) meanwhile may miss a WAL file the
    // flush removes. Wait for it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((*s)->UnflushedRecords() > 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "the WAL the restart replayed was not flushed within 30 s";
        break;
      }
      std::this_thread::yield();
    }
    return std::move(*s);
  }
  auto n = Store::AttachLive(o);
  EXPECT_TRUE(n.ok()) << n.status();
  if (!n.ok()) return nullptr;
  absl::Status st = (*n)->OpenDb();
  EXPECT_TRUE(st.ok()) << st;
  return st.ok() ? std::move(*n) : nullptr;
}

// A write killed at each point, then a successor: every key reads as RocksDB
// holds it, through the remote read path and Store::Get.
void KillWritesAndTakeOver(Seeded (*seed)(Store&), Successor how) {
  for (const char* point :
       {"write.after_db", "write.before_db", "write.inside_publish", "write.after_publish"}) {
    for (const char* op : {"overwrite", "create", "delete", "group"}) {
      // Only a group has a publication to be inside of.
      if (std::string(point) == "write.inside_publish" && std::string(op) != "group") continue;
      SCOPED_TRACE(std::string(point) + " " + op);
      TempStore t;  // its store seeds unsynced: Close flushes RocksDB
      Seeded seeded;
      {
        auto s = Store::Open(t.options);
        ASSERT_TRUE(s.ok()) << s.status();
        seeded = seed(**s);
        ASSERT_FALSE(seeded.deleted.empty());
        ASSERT_TRUE((*s)->Close().ok());
      }
      ASSERT_EQ(RunChild("WriterCrashChild.WriteAndDie",
                         ChildEnv(t, {{"KVNODE_WC_POINT", point},
                                      {"KVNODE_WC_OP", op},
                                      {"KVNODE_WC_OVERWRITE", seeded.overwritten},
                                      {"KVNODE_WC_DELETE", seeded.deleted}}),
                         std::chrono::seconds(60)),
                128 + SIGKILL);
      std::unique_ptr<Store> n = TakeOver(t.options, how);
      ASSERT_NE(n, nullptr);
      const std::map<std::string, std::string> db = DbContents(t.options.db_path);
      const bool applied = std::string(point) != "write.before_db";
      const bool group = std::string(op) == "group";
      EXPECT_EQ(db.count("key-new"), applied && (group || std::string(op) == "create") ? 1u : 0u);
      EXPECT_EQ(db.count(seeded.deleted),
                applied && (group || std::string(op) == "delete") ? 0u : 1u);
      std::vector<std::string> keys = seeded.keys;
      keys.push_back("key-new");
      int wrong = 0;
      for (const std::string& key : keys) {
        const auto it = db.find(key);
        const std::optional<std::string> want =
            it == db.end() ? std::nullopt : std::optional<std::string>(it->second);
        const std::optional<std::string> got = RemoteGet(*n, key);
        if (got != want && ++wrong <= 5) {
          ADD_FAILURE() << key << " reads " << (got ? "a value" : "as absent") << ", RocksDB has "
                        << (want ? "a value" : "none");
        }
      }
      EXPECT_EQ(wrong, 0) << "keys that read otherwise than RocksDB holds them";
      ASSERT_TRUE(n->Close().ok());
    }
  }
}

TEST(WriterCrashTest, WriteKilledBetweenRocksDbAndArenaIsRepublishedAtTakeover) {
  KillWritesAndTakeOver(&SeedFew, Successor::kLiveTakeover);
}

// A restart after the crash takes the dirty arena back (no rebuild) and is as
// right as the takeover: the same kill points, the same checks.
TEST(WriterCrashTest, RestartAfterAKilledWriteTakesTheArenaBack) {
  KillWritesAndTakeOver(&SeedFew, Successor::kRestart);
}

TEST(WriterCrashTest, RestartInAFullArenaNeverMakesAnEvictedKeyAbsent) {
  KillWritesAndTakeOver(&SeedFull, Successor::kRestart);
}

// The same in a full arena, where markers cover evicted keys: repeating a
// publication step at the takeover must not make an evicted key read as
// absent (index.h invariant 10).
TEST(WriterCrashTest, TakeoverInAFullArenaNeverMakesAnEvictedKeyAbsent) {
  KillWritesAndTakeOver(&SeedFull, Successor::kLiveTakeover);
}

// --- a process killed inside the allocator ---------------------------------

// Loops on the heap allocator of the arena (as a writer's publication does),
// saying once that it runs, until it is killed.
TEST(WriterCrashChild, AllocateForever) {
  if (testing::Env("KVNODE_WC_DB") == nullptr) GTEST_SKIP() << "runs only as a child";
  // Never outlive the test that kills it.
  ASSERT_EQ(prctl(PR_SET_PDEATHSIG, SIGKILL), 0);
  if (getppid() == 1) return;
  auto a = Arena::Attach(ChildOptions().arena_options());
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<uint64_t> held;
  for (uint64_t i = 0;; ++i) {
    if (i == 1000) std::ofstream(testing::Env("KVNODE_WC_READY")) << "ready\n";
    for (int k = 0; k < 32; ++k) {
      const uint64_t off = (*a)->Allocate(64 + (i * 7 + k * 13) % 2000, 8);
      if (off != 0) held.push_back(off);
    }
    for (uint64_t off : held) (*a)->Deallocate(off);
    held.clear();
  }
}

// The next writer: takes over (live path), or, when the arena cannot be
// trusted, starts cold (rebuild); then writes values that live in the heap.
TEST(WriterCrashChild, TakeOverAndWrite) {
  if (testing::Env("KVNODE_WC_DB") == nullptr) GTEST_SKIP() << "runs only as a child";
  std::unique_ptr<Store> s;
  auto live = Store::AttachLive(ChildOptions());
  ASSERT_TRUE(live.ok()) << live.status();
  if (absl::Status st = (*live)->OpenDb(); st.ok()) {
    s = std::move(*live);
  } else {
    ASSERT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_NE(st.message().find("heap allocator"), std::string::npos) << st;
    live = absl::StatusOr<std::unique_ptr<Store>>();
    auto cold = Store::Open(ChildOptions());
    ASSERT_TRUE(cold.ok()) << cold.status();
    EXPECT_EQ((*cold)->opened_as(), Store::OpenedAs::kRebuilt);
    s = std::move(*cold);
  }
  for (int i = 0; i < 50; ++i) {
    const std::string v(300 + i * 50, static_cast<char>('a' + i % 26));
    ASSERT_TRUE(s->Put(Key(i), v).ok());
    EXPECT_EQ(RemoteGet(*s, Key(i)), v);
  }
  ASSERT_TRUE(s->Close().ok());
}

bool WaitForFile(const std::string& path, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (access(path.c_str(), F_OK) != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    const timespec pause{0, 1'000'000};
    nanosleep(&pause, nullptr);  // polling a condition, not synchronising
  }
  return true;
}

// Starts `child`, waits until it runs its loop, kills it after a random
// moment; returns whether the arena says it died inside the allocator.
bool KillInLoop(const TempStore& t, const std::string& child, std::mt19937& rng) {
  const std::string ready = (t.dir() / "ready").string();
  unlink(ready.c_str());
  const pid_t pid = testing::SpawnTest(child, ChildEnv(t, {{"KVNODE_WC_READY", ready}}));
  EXPECT_GT(pid, 0);
  EXPECT_TRUE(WaitForFile(ready, std::chrono::seconds(60))) << child << " did not start";
  const timespec pause{0, std::uniform_int_distribution<long>(0, 3'000'000)(rng)};
  nanosleep(&pause, nullptr);  // a random kill moment
  EXPECT_EQ(kill(pid, SIGKILL), 0);
  EXPECT_EQ(testing::WaitChild(pid), 128 + SIGKILL);
  auto a = Arena::Attach(t.options.arena_options());
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() && (*a)->HeapMayBeTorn();
}

TEST(WriterCrashTest, ProcessKilledInsideTheAllocatorDoesNotBlockTheNextWriter) {
  // KVNODE_WC_SEED=<seed> replays a run's kill moments.
  const char* fixed = testing::Env("KVNODE_WC_SEED");
  const uint32_t seed =
      fixed != nullptr ? static_cast<uint32_t>(std::stoul(fixed)) : std::random_device{}();
  std::cerr << "seed " << seed << " (KVNODE_WC_SEED to replay)\n";
  std::mt19937 rng(seed);
  TempStore t;
  t.options.sync_writes = false;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->Close().ok());
  }
  // A writer killed at random inside Allocate/Deallocate.
  int torn = 0;
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE("writer round " + std::to_string(round));
    if (KillInLoop(t, "WriterCrashChild.AllocateForever", rng)) ++torn;
    ASSERT_EQ(RunChild("WriterCrashChild.TakeOverAndWrite", ChildEnv(t), std::chrono::seconds(20)),
              0)
        << "the next writer did not finish (-2: blocked past the deadline, 128+N: signal N)";
  }
  // Proof that the kills did land inside the allocator (else this tested nothing).
  std::cerr << torn << " of 8 writers were killed inside the allocator\n";
  EXPECT_GT(torn, 0);
}

// --- a failed handoff whose new side claimed the database ------------------

// The new process of a live upgrade: attaches, opens the database (its
// claim), writes if KVNODE_WC_WRITE=1, and is killed.
TEST(WriterCrashChild, ClaimAndDie) {
  if (testing::Env("KVNODE_WC_DB") == nullptr) GTEST_SKIP() << "runs only as a child";
  auto n = Store::AttachLive(ChildOptions());
  ASSERT_TRUE(n.ok()) << n.status();
  SetCrashPointHookForTesting(&DieAt);
  ASSERT_TRUE((*n)->OpenDb().ok());
  if (std::string(testing::Env("KVNODE_WC_WRITE")) == "1") {
    ASSERT_TRUE((*n)->Put("from-new", "acknowledged by the new process").ok());
  }
  kill(getpid(), SIGKILL);
}

TEST(WriterCrashTest, RollbackResumesOnlyIfTheNewSideNeverWrote) {
  struct Case {
    bool n_wrote;
    const char* die_at;  // "": after OpenDb (and the write)
  };
  for (const Case c : {Case{false, ""}, Case{false, "claim.after_db"}, Case{true, ""}}) {
    const bool n_wrote = c.n_wrote;
    SCOPED_TRACE(std::string(n_wrote ? "new side wrote" : "new side only claimed") + " " +
                 c.die_at);
    TempStore t;
    t.options.sync_writes = true;
    auto o = Store::Open(t.options);
    ASSERT_TRUE(o.ok()) << o.status();
    uint64_t last = 0;
    for (int i = 0; i < kSeedKeys; ++i) {
      auto v = (*o)->Put(Key(i), OldValue(i));
      ASSERT_TRUE(v.ok()) << v.status();
      last = *v;
    }
    const uint64_t o_generation = (*o)->stats().generation;
    ASSERT_TRUE((*o)->CloseDbForHandoff().ok());
    ASSERT_EQ(RunChild("WriterCrashChild.ClaimAndDie",
                       ChildEnv(t, {{"KVNODE_WC_WRITE", n_wrote ? "1" : "0"},
                                    {"KVNODE_WC_POINT", c.die_at}}),
                       std::chrono::seconds(60)),
              128 + SIGKILL);
    absl::Status reopened = (*o)->ReopenDbAfterFailedHandoff();
    if (n_wrote) {
      // The new process may have acknowledged that write: the old one must not
      // write again (it would reuse its version and ignore its dedupe state).
      EXPECT_TRUE(absl::IsFailedPrecondition(reopened)) << reopened;
      EXPECT_FALSE((*o)->Put(Key(1), "after a refused rollback").ok());
      EXPECT_EQ(DbContents(t.options.db_path).at("from-new"), "acknowledged by the new process");
    } else {
      ASSERT_TRUE(reopened.ok()) << reopened;
      // Past the generation the new side claimed (o_generation + 1), even when
      // it died before writing it into the arena header.
      EXPECT_EQ((*o)->stats().generation, o_generation + 2);
      auto v = (*o)->Put(Key(1), "after the rollback");
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_GT(*v, last);
      // The arena follows the database's generation again (a cold start
      // re-attaches it).
      ASSERT_TRUE((*o)->Close().ok());
      o = Store::Open(t.options);
      ASSERT_TRUE(o.ok()) << o.status();
      EXPECT_EQ((*o)->opened_as(), Store::OpenedAs::kReattached);
      EXPECT_EQ(RemoteGet(**o, Key(1)), "after the rollback");
    }
  }
}

}  // namespace
}  // namespace kvnode::storage
