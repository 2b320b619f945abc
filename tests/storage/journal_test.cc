// The write journal (journal.h) and the writer switch of a live upgrade in the
// store: the new side journals writes while RocksDB changes hands, replays
// them when it opens RocksDB, and every start replays a journal left behind;
// a process killed while journaling (a real child process, SIGKILL) loses no
// acknowledged write and applies none twice.
#include "journal.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "child_process.h"
#include "db_layout.h"
#include "kvnode/storage/store.h"
#include "test_util.h"

namespace kvnode::storage {
namespace {

using testing::TempStore;

std::string Key(int i) { return "key-" + std::to_string(i); }
std::string Value(int i, const char* tag) { return std::string(tag) + "-" + std::to_string(i); }

// A side record whose value is the write's outcome: "<version> existed|new".
SideRecord OutcomeRecord(const std::string& key) {
  return SideRecord{key, [](const WriteOutcome& o) {
                      return absl::StrCat(o.version, o.existed ? " existed" : " new");
                    }};
}

std::vector<JournalOp> OneWrite(int i) {
  return {JournalOp{JournalOp::Kind::kPut, 0, Key(i), Value(i, "v")},
          JournalOp{JournalOp::Kind::kDelete, 1, "side/" + Key(i), {}}};
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// RocksDB preallocates nothing on tmpfs (MakeDbOptions): there it would
// only zero pages, seconds of them at a WAL's creation in the TCG guest.
TEST(DbLayoutTest, TmpfsIsRecognised) {
  EXPECT_TRUE(dblayout::OnTmpfs("/dev/shm"));
  EXPECT_TRUE(dblayout::OnTmpfs("/dev/shm/kvnode-not-created-yet"));  // its parent
  EXPECT_FALSE(dblayout::OnTmpfs("/proc"));
  EXPECT_FALSE(dblayout::OnTmpfs("/no/such/place"));
}

TEST(WriteJournalTest, RecordsReadBackInOrder) {
  TempStore t;
  const std::string path = (t.dir() / "journal").string();
  auto j = WriteJournal::Create(path, 4 << 20);
  ASSERT_TRUE(j.ok()) << j.status();
  for (int i = 0; i < 100; ++i) ASSERT_TRUE((*j)->Append(OneWrite(i), /*sync=*/i % 10 == 0).ok());
  EXPECT_EQ((*j)->records(), 100u);
  auto read = WriteJournal::ReadAll(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ((*read)[i], OneWrite(i)) << i;
  // Retired: nothing left to replay at `path`, the records kept aside until
  // the retired file is removed.
  ASSERT_TRUE(WriteJournal::Retire(path).ok());
  EXPECT_FALSE(Exists(path));
  EXPECT_TRUE(WriteJournal::ReadAll(path)->empty());  // no file: nothing to replay
  const std::string retired = WriteJournal::RetiredPathFor(path);
  EXPECT_EQ(WriteJournal::ReadAll(retired)->size(), 100u);
  EXPECT_TRUE(WriteJournal::Retire(path).ok());  // none: nothing to do
  ASSERT_TRUE(WriteJournal::Remove(retired).ok());
  EXPECT_FALSE(Exists(retired));
  EXPECT_TRUE(WriteJournal::Remove(retired).ok());
}

// A reader can take the records in two goes while the writer appends
// (the new side replays most of them before it takes its write lock).
TEST(WriteJournalTest, ReadFromGoesOnWhereTheLastReadEnded) {
  TempStore t;
  const std::string path = (t.dir() / "journal").string();
  auto j = WriteJournal::Create(path, 4 << 20);
  ASSERT_TRUE(j.ok()) << j.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*j)->Append(OneWrite(i), false).ok());
  uint64_t end = 0;
  auto first = WriteJournal::ReadFrom(path, 0, &end);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 3u);
  for (int i = 3; i < 5; ++i) ASSERT_TRUE((*j)->Append(OneWrite(i), false).ok());
  uint64_t end2 = 0;
  auto rest = WriteJournal::ReadFrom(path, end, &end2);
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_EQ(rest->size(), 2u);
  EXPECT_EQ((*rest)[0], OneWrite(3));
  EXPECT_EQ((*rest)[1], OneWrite(4));
  EXPECT_GT(end2, end);
  uint64_t end3 = 0;
  EXPECT_TRUE(WriteJournal::ReadFrom(path, end2, &end3)->empty());
  EXPECT_EQ(end3, end2);
}

// A crash inside an append leaves a torn record: it was never acknowledged,
// and reading stops before it.
TEST(WriteJournalTest, TornTailEndsTheJournal) {
  TempStore t;
  const std::string path = (t.dir() / "journal").string();
  {
    auto j = WriteJournal::Create(path, 4 << 20);
    ASSERT_TRUE(j.ok()) << j.status();
    for (int i = 1; i <= 3; ++i) ASSERT_TRUE((*j)->Append(OneWrite(i), true).ok());
  }
  // Change the last byte written (the third record's last value byte), as a
  // write cut short would leave it.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t last = bytes.find_last_not_of('\0');
  ASSERT_NE(last, std::string::npos);
  FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fseek(f, static_cast<long>(last), SEEK_SET), 0);
  std::fputc(bytes[last] ^ 1, f);
  std::fclose(f);
  auto read = WriteJournal::ReadAll(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u);
  EXPECT_EQ((*read)[1], OneWrite(2));
}

TEST(WriteJournalTest, FullJournalRefusesAndKeepsWhatItHas) {
  TempStore t;
  const std::string path = (t.dir() / "journal").string();
  auto j = WriteJournal::Create(path, 2 << 20);
  ASSERT_TRUE(j.ok()) << j.status();
  const std::vector<JournalOp> big = {
      JournalOp{JournalOp::Kind::kPut, 0, "big", std::string(300 << 10, 'b')}};
  int n = 0;
  absl::Status s;
  while ((s = (*j)->Append(big, false)).ok()) ++n;
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_GT(n, 0);
  EXPECT_EQ(WriteJournal::ReadAll(path)->size(), static_cast<size_t>(n));
}

// A journal with records is never overwritten (its writes may have been
// acknowledged); one without records (a new process that never took writes)
// is replaced.
TEST(WriteJournalTest, CreateRefusesUnreplayedRecords) {
  TempStore t;
  const std::string path = (t.dir() / "journal").string();
  ASSERT_TRUE(WriteJournal::Create(path, 4 << 20).ok());
  ASSERT_TRUE(WriteJournal::Create(path, 4 << 20).ok());
  {
    auto j = WriteJournal::Create(path, 4 << 20);
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->Append(OneWrite(7), true).ok());
  }
  auto again = WriteJournal::Create(path, 4 << 20);
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_EQ(WriteJournal::ReadAll(path)->size(), 1u);
}

ino_t Inode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

off_t SizeOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// Create takes the spare by a rename: no allocation while an upgrade waits.
TEST(WriteJournalTest, CreateTakesTheSpare) {
  TempStore t;
  const std::string path = (t.dir() / "journal").string();
  const std::string spare = WriteJournal::SparePathFor(path);
  ASSERT_TRUE(WriteJournal::MakeSpare(path, 4 << 20).ok());
  const ino_t made = Inode(spare);
  ASSERT_NE(made, 0u);
  ASSERT_TRUE(WriteJournal::MakeSpare(path, 4 << 20).ok());  // there already: kept
  EXPECT_EQ(Inode(spare), made);
  auto j = WriteJournal::Create(path, 4 << 20);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(Inode(path), made);
  EXPECT_FALSE(Exists(spare));
  ASSERT_TRUE((*j)->Append(OneWrite(1), true).ok());
  EXPECT_EQ(WriteJournal::ReadAll(path)->size(), 1u);
}

// A spare of another size (--upgrade_journal_mb changed) is not taken.
TEST(WriteJournalTest, ASpareOfAnotherSizeIsReplaced) {
  TempStore t;
  const std::string path = (t.dir() / "journal").string();
  const std::string spare = WriteJournal::SparePathFor(path);
  ASSERT_TRUE(WriteJournal::MakeSpare(path, 4 << 20).ok());
  ASSERT_TRUE(WriteJournal::MakeSpare(path, 8 << 20).ok());
  EXPECT_EQ(SizeOf(spare), 8 << 20);
  auto j = WriteJournal::Create(path, 2 << 20);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(SizeOf(path), 2 << 20);
  EXPECT_FALSE(Exists(spare));
}

// A recycled journal reads as empty, and none of its old records comes back
// in the journal made from it: the first new record ends where the first old
// one did, so without the zeros the second old one would be read next.
TEST(WriteJournalTest, ARecycledJournalHoldsNoOldRecord) {
  TempStore t;
  const std::string path = (t.dir() / "journal").string();
  const std::string spare = WriteJournal::SparePathFor(path);
  uint64_t written = 0;
  {
    auto j = WriteJournal::Create(path, 4 << 20);
    ASSERT_TRUE(j.ok()) << j.status();
    for (int i = 0; i < 100; ++i) ASSERT_TRUE((*j)->Append(OneWrite(i), false).ok());
    written = (*j)->written_to();
  }
  const ino_t first = Inode(path);
  ASSERT_TRUE(WriteJournal::Retire(path).ok());
  ASSERT_TRUE(WriteJournal::Recycle(path, written).ok());
  EXPECT_FALSE(Exists(WriteJournal::RetiredPathFor(path)));
  EXPECT_EQ(Inode(spare), first);
  EXPECT_TRUE(WriteJournal::ReadAll(spare)->empty());

  auto j = WriteJournal::Create(path, 4 << 20);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(Inode(path), first);
  ASSERT_TRUE((*j)->Append(OneWrite(0), true).ok());
  auto read = WriteJournal::ReadAll(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 1u);
  EXPECT_EQ((*read)[0], OneWrite(0));
}

// A symbolic link planted under any of the journal's names (the spare's
// temporary name is written at every start) is never written through: the
// file it points at keeps its bytes, the link is replaced by a regular file
// or refused with an error that names it.
std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool IsRegularFile(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

TEST(WriteJournalTest, LinksAtItsNamesAreNeverFollowed) {
  TempStore t;
  const std::string path = (t.dir() / "journal").string();
  const std::string spare = WriteJournal::SparePathFor(path);
  const std::string victim = (t.dir() / "victim").string();
  std::ofstream(victim) << "someone else's file";
  const std::string before = Contents(victim);

  // The spare's temporary name, written by MakeSpare: the link is replaced.
  ASSERT_EQ(::symlink(victim.c_str(), (spare + ".tmp").c_str()), 0);
  absl::Status s = WriteJournal::MakeSpare(path, 4 << 20);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(Contents(victim) == before)
      << "written through a link: now " << SizeOf(victim) << " bytes";
  EXPECT_TRUE(IsRegularFile(spare));
  EXPECT_EQ(SizeOf(spare), 4 << 20);

  // The spare's name: MakeSpare and Create put a journal there, not through it.
  ASSERT_EQ(::unlink(spare.c_str()), 0);
  ASSERT_EQ(::symlink(victim.c_str(), spare.c_str()), 0);
  ASSERT_TRUE(WriteJournal::MakeSpare(path, 4 << 20).ok());
  EXPECT_TRUE(IsRegularFile(spare));
  ASSERT_EQ(::unlink(spare.c_str()), 0);
  ASSERT_EQ(::symlink(victim.c_str(), spare.c_str()), 0);
  auto j = WriteJournal::Create(path, 4 << 20);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_TRUE(IsRegularFile(path));
  EXPECT_FALSE(Exists(spare));
  EXPECT_TRUE(Contents(victim) == before)
      << "written through a link: now " << SizeOf(victim) << " bytes";
  j->reset();

  // The journal's own name and the retired one: refused, naming the link.
  ASSERT_EQ(::unlink(path.c_str()), 0);
  ASSERT_EQ(::symlink(victim.c_str(), path.c_str()), 0);
  auto read = WriteJournal::ReadAll(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
  EXPECT_NE(read.status().message().find(path + " is a symbolic link"), std::string::npos)
      << read.status();
  EXPECT_FALSE(WriteJournal::Create(path, 4 << 20).ok());
  const std::string retired = WriteJournal::RetiredPathFor(path);
  ASSERT_EQ(::symlink(victim.c_str(), retired.c_str()), 0);
  s = WriteJournal::Recycle(path, 4 << 20);
  EXPECT_NE(s.message().find(retired + " is a symbolic link"), std::string::npos) << s;
  EXPECT_TRUE(Contents(victim) == before)
      << "written through a link: now " << SizeOf(victim) << " bytes";
}

// The switch as the two processes of an upgrade run it (here in one process,
// two stores on the same database and arena).
// The old side: writes Key(0..99) and lets RocksDB go (closed for the
// handoff); returns its last version.
uint64_t OldSideWritesAndLetsGo(const StoreOptions& options) {
  auto o = Store::Open(options);
  EXPECT_TRUE(o.ok()) << o.status();
  if (!o.ok()) return 0;
  for (int i = 0; i < 100; ++i) EXPECT_TRUE((*o)->Put(Key(i), Value(i, "old")).ok());
  EXPECT_TRUE((*o)->CloseDbForHandoff().ok());
  return (*o)->last_version();
}

// The new side through the writer switch: attached, its journal prepared,
// the journal writer from `last`.
std::unique_ptr<Store> JournalWriter(const StoreOptions& options, uint64_t last) {
  auto n = Store::AttachLive(options);
  EXPECT_TRUE(n.ok()) << n.status();
  if (!n.ok()) return nullptr;
  EXPECT_TRUE((*n)->PrepareJournal().ok());
  EXPECT_TRUE((*n)->BecomeJournalWriter(last).ok());
  return std::move(*n);
}

TEST(WriterSwitchTest, JournaledWritesAreServedAndReplayed) {
  TempStore t;
  auto o = Store::Open(t.options);
  ASSERT_TRUE(o.ok()) << o.status();
  for (int i = 0; i < 50; ++i) ASSERT_TRUE((*o)->Put(Key(i), Value(i, "old")).ok());
  const std::string jpath = WriteJournal::PathFor(t.options.db_path);
  const std::string spare = WriteJournal::SparePathFor(jpath);
  const ino_t made = Inode(spare);  // by the cold start
  ASSERT_NE(made, 0u);
  auto n = Store::AttachLive(t.options);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_TRUE((*n)->PrepareJournal().ok());
  EXPECT_EQ(Inode(jpath), made);
  EXPECT_FALSE(Exists(spare));

  ASSERT_TRUE((*o)->ReleaseDbForHandoff().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition((*o)->Put("x", "y").status()));
  const uint64_t last = (*o)->last_version();
  ASSERT_TRUE((*n)->BecomeJournalWriter(last).ok());
  // RocksDB is still open in O (released): N writes through the journal,
  // side records (the server's dedupe state) with its writes.
  const SideRecord put_side = OutcomeRecord("client-1");
  const SideRecord delete_side = OutcomeRecord("client-2");
  auto v = (*n)->Put(Key(1), Value(1, "new"), &put_side);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, last + 1);
  ASSERT_TRUE((*n)->Delete(Key(2), &delete_side).ok());
  ASSERT_TRUE((*n)->Put("fresh", "f").ok());
  EXPECT_EQ((*n)->Get(Key(1))->value, Value(1, "new"));
  EXPECT_EQ((*o)->Get(Key(1))->value, Value(1, "new"));  // the arena is shared
  EXPECT_TRUE(absl::IsNotFound((*n)->Get(Key(2)).status()));
  EXPECT_EQ((*n)->stats().journaled, 3u);
  EXPECT_TRUE(absl::IsUnavailable((*n)->OpenDb()));  // O still holds RocksDB's lock

  ASSERT_TRUE((*o)->CloseReleasedDb().ok());
  // Too late to roll back: N journaled writes it may have acknowledged.
  EXPECT_TRUE(absl::IsFailedPrecondition((*o)->ReopenDbAfterFailedHandoff()));
  o->reset();
  ASSERT_TRUE((*n)->OpenDb().ok());
  EXPECT_FALSE(Exists(jpath));
  EXPECT_FALSE(Exists(WriteJournal::RetiredPathFor(jpath)));
  EXPECT_EQ(Inode(spare), made);  // the next upgrade's journal, zeroed
  EXPECT_TRUE(WriteJournal::ReadAll(spare)->empty());
  EXPECT_EQ((*n)->stats().replayed, 3u);
  auto after = (*n)->Put(Key(3), Value(3, "new"));
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, last + 3);  // versions go on (a delete takes none), none reused
  ASSERT_TRUE((*n)->Close().ok());
  n->reset();

  // What the replay put into RocksDB (the arena N wrote would show the
  // journaled writes whether or not they reached it).
  auto cold = testing::OpenFromRocksDbAlone(t.options);
  ASSERT_TRUE(cold.ok()) << cold.status();
  EXPECT_EQ((*cold)->Get(Key(1))->value, Value(1, "new"));
  EXPECT_TRUE(absl::IsNotFound((*cold)->Get(Key(2)).status())) << "a journaled delete was lost";
  EXPECT_EQ((*cold)->Get("fresh")->value, "f");
  EXPECT_EQ((*cold)->Get(Key(4))->value, Value(4, "old"));
  EXPECT_EQ((*cold)->Get(Key(1))->version, last + 1);
  auto sides = (*cold)->ReadSideRecords("client-");
  ASSERT_TRUE(sides.ok()) << sides.status();
  const std::vector<std::pair<std::string, std::string>> want = {
      {"client-1", absl::StrCat(last + 1, " existed")}, {"client-2", "0 existed"}};
  EXPECT_EQ(*sides, want) << "journaled side records are not in RocksDB";
}

// A group commit during the writer switch is one journal record, never
// more ops than a record may hold (a reader stops at such a record as at a
// torn tail: every version's reader must read every record).
TEST(WriterSwitchTest, AJournaledGroupFitsInARecord) {
  TempStore t;
  const uint64_t last = OldSideWritesAndLetsGo(t.options);
  std::unique_ptr<Store> n = JournalWriter(t.options, last);
  ASSERT_NE(n, nullptr);
  std::vector<SideRecord> sides;
  for (int i = 0; i < 20; ++i) {
    sides.push_back(SideRecord{"client-" + std::to_string(i),
                               [](const WriteOutcome& o) { return std::to_string(o.version); }});
  }
  std::vector<std::string> keys, values;  // the ops' views point into them
  for (int i = 0; i < 20; ++i) {
    keys.push_back(Key(i));
    values.push_back(Value(i, "group"));
  }
  std::vector<WriteOp> ops;
  for (int i = 0; i < 20; ++i) ops.push_back({WriteOp::Kind::kPut, keys[i], values[i], &sides[i]});
  std::vector<WriteResult> results(ops.size());
  n->Write(ops, results);
  for (const WriteResult& r : results) ASSERT_TRUE(r.status.ok()) << r.status;
  // Per write a value and a side record, per group the version: 7 a record.
  EXPECT_EQ(n->stats().journaled, 3u);
  ASSERT_TRUE(n->OpenDb().ok());
  EXPECT_EQ(n->stats().replayed, 3u);
  ASSERT_TRUE(n->Close().ok());
  n.reset();
  auto cold = testing::OpenFromRocksDbAlone(t.options);
  ASSERT_TRUE(cold.ok()) << cold.status();
  for (int i = 0; i < 20; ++i) EXPECT_EQ((*cold)->Get(Key(i))->value, values[i]) << i;
  EXPECT_EQ((*cold)->last_version(), last + 20);
  // Each op's side record, with the version its write got.
  auto read = (*cold)->ReadSideRecords("client-");
  ASSERT_TRUE(read.ok()) << read.status();
  std::map<std::string, std::string> got(read->begin(), read->end());
  ASSERT_EQ(got.size(), 20u) << "journaled side records are not in RocksDB";
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(got["client-" + std::to_string(i)], std::to_string(results[i].version)) << i;
  }
}

// RocksDB's open runs while writes go on into the journal: none waits for
// the open, none is lost, and versions stay in order across the replay.
TEST(WriterSwitchTest, WritesGoOnWhileRocksDbOpens) {
  TempStore t;
  const uint64_t last = OldSideWritesAndLetsGo(t.options);
  std::unique_ptr<Store> n = JournalWriter(t.options, last);
  ASSERT_NE(n, nullptr);
  std::atomic<bool> stop{false};
  std::vector<uint64_t> versions;
  absl::Notification journaled;
  std::thread writer([&] {
    // At most 100000 writes (~9 MiB of journal): a writer that outpaces the
    // replay on a fast host would otherwise fill the 32 MiB journal, whose
    // refusal (BUSY) is a test of its own.
    for (int i = 0; (!stop.load() || i < 50) && i < 100000; ++i) {
      auto v = n->Put(Key(i % 100), Value(i, "during"));
      // Refused while the replay's rest holds the write lock: re-sent, as
      // the client re-sends a write answered BUSY.
      while (absl::IsUnavailable(v.status())) v = n->Put(Key(i % 100), Value(i, "during"));
      ASSERT_TRUE(v.ok()) << v.status();
      versions.push_back(*v);
      if (versions.size() == 20) journaled.Notify();
    }
  });
  // Some writes surely go to the journal (the deadline bounds a failed writer).
  const bool some = journaled.WaitForNotificationWithTimeout(absl::Seconds(60));
  const absl::Status opened = n->OpenDb();
  stop.store(true);
  writer.join();
  ASSERT_TRUE(some);
  ASSERT_TRUE(opened.ok()) << opened;
  for (size_t i = 1; i < versions.size(); ++i) ASSERT_EQ(versions[i], versions[i - 1] + 1);
  EXPECT_EQ(versions.front(), last + 1);
  EXPECT_GT(n->stats().replayed, 0u);
  EXPECT_EQ(n->stats().journaled, n->stats().replayed);  // every journaled one
  ASSERT_TRUE(n->Close().ok());
  n.reset();
  auto cold = Store::Open(t.options);
  ASSERT_TRUE(cold.ok()) << cold.status();
  auto next = (*cold)->Put("next", "n");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, versions.back() + 1);
}

// Writes that arrive while OpenDb replays the journal outside the write lock
// are replayed by further passes outside it, not under it (where every write
// waits): writes_per_pass[k] writes arrive after pass k.
void ReplayWithWritesBetweenPasses(const std::vector<int>& writes_per_pass,
                                   uint64_t expect_locked) {
  TempStore t;
  const uint64_t last = OldSideWritesAndLetsGo(t.options);
  StoreOptions opts = t.options;
  Store* store = nullptr;
  size_t pass = 0;
  int written = 0;
  opts.after_journal_pass = [&] {
    const int k = pass < writes_per_pass.size() ? writes_per_pass[pass] : writes_per_pass.back();
    ++pass;
    for (int i = 0; i < k; ++i, ++written) {
      ASSERT_TRUE(store->Put(Key(written % 100), Value(written, "between")).ok());
    }
  };
  auto n = Store::AttachLive(opts);
  ASSERT_TRUE(n.ok()) << n.status();
  store = n->get();
  ASSERT_TRUE(store->PrepareJournal().ok());
  ASSERT_TRUE(store->BecomeJournalWriter(last).ok());
  for (; written < 200; ++written) {
    ASSERT_TRUE(store->Put(Key(written % 100), Value(written, "before")).ok());
  }
  ASSERT_TRUE(store->OpenDb().ok());
  EXPECT_EQ(store->stats().journaled, static_cast<uint64_t>(written));
  EXPECT_EQ(store->stats().replayed, static_cast<uint64_t>(written));
  EXPECT_EQ(store->stats().replayed_locked, expect_locked);
  auto next = store->Put("next", "n");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, last + written + 1);
  ASSERT_TRUE(store->Close().ok());
  n->reset();
  auto cold = testing::OpenFromRocksDbAlone(t.options);
  ASSERT_TRUE(cold.ok()) << cold.status();
  for (int i = written - 100; i < written; ++i) {
    auto v = (*cold)->Get(Key(i % 100));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->value, Value(i, i < 200 ? "before" : "between"));
  }
}

TEST(WriterSwitchTest, WritesDuringTheReplayAreReplayedBeforeTheLock) {
  // Passes of 200, 80 and 20 records (short: the last outside the lock).
  ReplayWithWritesBetweenPasses({80, 20, 0}, 0);
}

TEST(WriterSwitchTest, ReplayOutpacedByWritesStillEnds) {
  // 200 records per pass, forever: the second pass is not half as long as
  // the first, so the rest is replayed under the lock.
  ReplayWithWritesBetweenPasses({200}, 200);
}

// An op that arrives while OpenDb replays the journal's rest under its locks
// is refused at once (Unavailable: the server answers BUSY), not made to
// wait: the server thread that sent it serves every client's other requests
// too. RunDuringSwitch runs `op` on another thread from the crash-point hook
// at "journal.before_replay", where both locks are held, and gives it 10 s.
struct OpDuringSwitch {
  std::function<absl::Status()> op;
  std::thread thread;
  absl::Notification done;
  absl::Status result = absl::UnknownError("not run");
  bool answered_in_time = false;
};
OpDuringSwitch* during_switch = nullptr;

absl::Status RunDuringSwitch(Store* store, OpDuringSwitch* d) {
  during_switch = d;
  SetCrashPointHookForTesting([](const char* point) {
    if (std::string_view(point) != "journal.before_replay") return;
    OpDuringSwitch& w = *during_switch;
    w.thread = std::thread([&w] {
      w.result = w.op();
      w.done.Notify();
    });
    w.answered_in_time = w.done.WaitForNotificationWithTimeout(absl::Seconds(10));
  });
  const absl::Status opened = store->OpenDb();
  SetCrashPointHookForTesting(nullptr);
  during_switch = nullptr;
  if (d->thread.joinable()) d->thread.join();
  return opened;
}

TEST(WriterSwitchTest, WritesUnderTheReplayLockAreRefusedNotQueued) {
  TempStore t;
  const uint64_t last = OldSideWritesAndLetsGo(t.options);
  std::unique_ptr<Store> n = JournalWriter(t.options, last);
  ASSERT_NE(n, nullptr);
  Store* store = n.get();
  ASSERT_TRUE(store->Put(Key(1), "journaled").ok());
  OpDuringSwitch w;
  w.op = [store] { return store->Put(Key(2), "during the switch").status(); };
  const absl::Status opened = RunDuringSwitch(store, &w);
  ASSERT_TRUE(opened.ok()) << opened;
  ASSERT_FALSE(absl::IsUnknown(w.result)) << "OpenDb never reached journal.before_replay";
  EXPECT_TRUE(w.answered_in_time) << "the write waited for the replay's lock";
  EXPECT_TRUE(absl::IsUnavailable(w.result)) << w.result;
  // Refused means not applied; the client's retry is.
  auto v = store->Get(Key(2));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_NE(v->value, "during the switch");
  ASSERT_TRUE(store->Put(Key(2), "retried").ok());
  EXPECT_EQ(store->Get(Key(2))->value, "retried");
  ASSERT_TRUE(store->Close().ok());
}

std::string Big(int i) { return std::string(1000, 'v') + std::to_string(i); }

// Likewise a GET of a key the arena does not hold, which must read RocksDB.
TEST(WriterSwitchTest, ReadsOfNonResidentKeysUnderTheReplayLockAreRefused) {
  TempStore t;
  t.options.arena_size = 2 << 20;  // too small for every key: some stay in RocksDB only
  constexpr int kKeys = 4000;
  uint64_t last = 0;
  {
    auto o = Store::Open(t.options);
    ASSERT_TRUE(o.ok()) << o.status();
    for (int i = 0; i < kKeys; ++i) ASSERT_TRUE((*o)->Put(Key(i), Big(i)).ok());
    ASSERT_TRUE((*o)->CloseDbForHandoff().ok());
    last = (*o)->last_version();
  }
  std::unique_ptr<Store> n = JournalWriter(t.options, last);
  ASSERT_NE(n, nullptr);
  Store* store = n.get();
  // Without RocksDB open here, a key the arena does not hold is Unavailable.
  int cold = -1;
  for (int i = 0; i < kKeys && cold < 0; ++i) {
    if (absl::IsUnavailable(store->Get(Key(i)).status())) cold = i;
  }
  ASSERT_GE(cold, 0) << "every key is resident: make the arena smaller";
  OpDuringSwitch r;
  r.op = [store, cold] { return store->Get(Key(cold)).status(); };
  const absl::Status opened = RunDuringSwitch(store, &r);
  ASSERT_TRUE(opened.ok()) << opened;
  ASSERT_FALSE(absl::IsUnknown(r.result)) << "OpenDb never reached journal.before_replay";
  EXPECT_TRUE(r.answered_in_time) << "the GET waited for the replay's lock";
  EXPECT_TRUE(absl::IsUnavailable(r.result)) << r.result;
  auto v = store->Get(Key(cold));  // the client's retry
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->value, Big(cold));
  ASSERT_TRUE(store->Close().ok());
}

// The old side's close of its released database flushes the memtable
// first, so that the new side's RocksDB open has no WAL records to replay
// (a replay costs far more than the flush, on the clients' CPUs).
uint64_t WalBytes(const std::string& db_path) {
  uint64_t bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(db_path)) {
    if (e.path().extension() == ".log") bytes += e.file_size();
  }
  return bytes;
}

TEST(WriterSwitchTest, HandoffCloseLeavesNoWalToReplay) {
  TempStore t;
  auto o = Store::Open(t.options);
  ASSERT_TRUE(o.ok()) << o.status();
  for (int i = 0; i < 500; ++i) ASSERT_TRUE((*o)->Put(Key(i), Value(i, "old")).ok());
  ASSERT_GT(WalBytes(t.options.db_path), 0u);
  ASSERT_TRUE((*o)->ReleaseDbForHandoff().ok());
  ASSERT_TRUE((*o)->CloseReleasedDb().ok());
  EXPECT_EQ(WalBytes(t.options.db_path), 0u) << "the new side would replay these";
  o->reset();
  auto cold = Store::Open(t.options);  // the writes are in the flushed tables
  ASSERT_TRUE(cold.ok()) << cold.status();
  EXPECT_EQ((*cold)->Get(Key(499))->value, Value(499, "old"));
}

// A handoff that fails before the new side took a write: the old side takes
// its released database back without reopening it.
TEST(WriterSwitchTest, ReleasedDatabaseIsTakenBack) {
  TempStore t;
  auto o = Store::Open(t.options);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE((*o)->Put(Key(0), "a").ok());
  {
    auto n = Store::AttachLive(t.options);
    ASSERT_TRUE(n.ok());
    ASSERT_TRUE((*n)->PrepareJournal().ok());
  }
  ASSERT_TRUE((*o)->ReleaseDbForHandoff().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition((*o)->Put(Key(0), "b").status()));
  ASSERT_TRUE((*o)->ReopenDbAfterFailedHandoff().ok());
  ASSERT_TRUE((*o)->Put(Key(0), "c").ok());
  EXPECT_EQ((*o)->Get(Key(0))->value, "c");
}

// The child: the new side of a switch, journaling writes; it records each
// acknowledged one (key, version) in a file once its Put returned, then
// waits to be killed.
TEST(JournalChild, JournalUntilKilled) {
  const char* acks = testing::Env("KVNODE_JC_ACKS");
  if (acks == nullptr) GTEST_SKIP() << "runs only as a child of WriterSwitchTest";
  StoreOptions opts;
  opts.db_path = testing::Env("KVNODE_JC_DB");
  opts.shm_name = testing::Env("KVNODE_JC_SHM");
  opts.arena_size = 8 << 20;
  opts.journal_bytes = 4 << 20;
  auto n = Store::AttachLive(opts);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_TRUE((*n)->PrepareJournal().ok());
  ASSERT_TRUE((*n)->BecomeJournalWriter(std::stoull(testing::Env("KVNODE_JC_LAST"))).ok());
  std::ofstream out(acks);
  for (int i = 0; i < 200; ++i) {
    auto v = (*n)->Put(Key(i), Value(i, "journaled"));
    ASSERT_TRUE(v.ok()) << v.status();
    out << i << " " << *v << std::endl;
  }
  ASSERT_TRUE((*n)->Delete(Key(299)).ok());  // acknowledged with "done"
  out << "done" << std::endl;
  if (const char* at = testing::Env("KVNODE_JC_CRASH_AT"); at != nullptr) {
    // Dies at that point of OpenDb's replay, as a SIGKILL would leave it.
    static std::string point;
    point = at;
    SetCrashPointHookForTesting([](const char* p) {
      if (point == p) _exit(3);
    });
    (void)(*n)->OpenDb();
    _exit(4);  // the point was never reached
  }
  for (;;) pause();
}

// The new side journals 200 acknowledged writes and a delete, then dies: SIGKILLed before
// it opened RocksDB (crash_at empty), or killed at a point of OpenDb's replay.
// Then a cold start: every acknowledged write is there, with the version it
// was acknowledged with, and no version is handed out twice.
void JournalThenDie(const std::string& crash_at) {
  TempStore t;
  uint64_t last = 0;
  {
    auto o = Store::Open(t.options);
    ASSERT_TRUE(o.ok()) << o.status();
    for (int i = 0; i < 300; ++i) ASSERT_TRUE((*o)->Put(Key(i), Value(i, "old")).ok());
    ASSERT_TRUE((*o)->CloseDbForHandoff().ok());
    last = (*o)->last_version();
  }  // O exits after its handoff: the arena stays dirty, as after an upgrade
  const std::string acks = (t.dir() / "acks").string();
  std::map<std::string, std::string> env = {{"KVNODE_JC_ACKS", acks},
                                            {"KVNODE_JC_DB", t.options.db_path},
                                            {"KVNODE_JC_SHM", t.options.shm_name},
                                            {"KVNODE_JC_LAST", std::to_string(last)}};
  if (!crash_at.empty()) env["KVNODE_JC_CRASH_AT"] = crash_at;
  const pid_t child = testing::SpawnTest("JournalChild.JournalUntilKilled", env);
  ASSERT_GT(child, 0);
  if (crash_at.empty()) {
    // Wait (with a deadline) for the child to acknowledge its writes.
    bool done = false;
    for (int i = 0; i < 6000 && !done; ++i) {
      std::ifstream in(acks);
      std::string line, tail;
      while (std::getline(in, line)) tail = line;
      done = tail == "done";
      if (!done) usleep(10000);  // polls a file with a deadline
    }
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    testing::WaitChild(child);
    ASSERT_TRUE(done) << "the child did not journal its writes";
  } else {
    ASSERT_EQ(testing::WaitChild(child), 3) << "the child did not die at " << crash_at;
  }

  auto cold = Store::Open(t.options);
  ASSERT_TRUE(cold.ok()) << cold.status();
  EXPECT_EQ((*cold)->opened_as(), Store::OpenedAs::kRebuilt);
  std::ifstream in(acks);
  int key = 0;
  uint64_t version = 0;
  int n = 0;
  while (in >> key >> version) {
    auto g = (*cold)->Get(Key(key));
    ASSERT_TRUE(g.ok()) << Key(key) << ": " << g.status();
    EXPECT_EQ(g->value, Value(key, "journaled"));
    EXPECT_EQ(g->version, version);
    ++n;
  }
  EXPECT_EQ(n, 200);
  EXPECT_EQ((*cold)->Get(Key(250))->value, Value(250, "old"));
  EXPECT_TRUE(absl::IsNotFound((*cold)->Get(Key(299)).status())) << "a journaled delete was lost";
  auto v = (*cold)->Put("next", "n");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, last + 201);
  EXPECT_FALSE(Exists(WriteJournal::PathFor(t.options.db_path)));
}

TEST(WriterSwitchTest, KilledJournalWriterLosesNothing) { JournalThenDie(""); }
// Killed with the journal's last records not yet replayed, resp. all
// replayed but the journal not removed: the next start replays (again).
TEST(WriterSwitchTest, KilledBeforeTheReplayUnderTheLock) {
  JournalThenDie("journal.before_replay");
}
TEST(WriterSwitchTest, KilledBeforeTheJournalIsRemoved) { JournalThenDie("journal.after_replay"); }

}  // namespace
}  // namespace kvnode::storage
