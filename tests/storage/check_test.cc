// Store::Check: clean on what the store wrote itself (a full arena with
// markers, deletes, a restart that took the arena back), and each kind of
// disagreement between the arena and RocksDB a reader could be misled by is
// found and named: the database changed behind a reattached arena.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "db_layout.h"
#include "kvnode/storage/store.h"
#include "rocksdb/db.h"
#include "test_util.h"

namespace kvnode::storage {
namespace {

using testing::TempStore;

std::string Key(int i) { return absl::StrCat("key-", i); }
std::string Value(int i) { return std::string(1000 + i % 300, static_cast<char>('a' + i % 26)); }

CheckReport MustCheck(Store& s) {
  absl::StatusOr<CheckReport> r = s.Check();
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : CheckReport{};
}

std::string Problems(const CheckReport& r) { return absl::StrJoin(r.first_problems, "\n"); }

// Runs `f` on the store's database, opened directly while no Store holds it:
// a change the arena never saw.
void BehindTheArena(const StoreOptions& o,
                    const std::function<void(rocksdb::DB*, rocksdb::ColumnFamilyHandle*)>& f) {
  std::vector<rocksdb::ColumnFamilyHandle*> h;
  rocksdb::DB* db = nullptr;
  ASSERT_TRUE(
      rocksdb::DB::Open(dblayout::DbOptions(), o.db_path, dblayout::ColumnFamilies(), &h, &db)
          .ok());
  f(db, h[0]);
  for (auto* c : h) ASSERT_TRUE(db->DestroyColumnFamilyHandle(c).ok());
  ASSERT_TRUE(db->Close().ok());
  delete db;
}

std::string Record(uint64_t version, const std::string& value) {
  std::string v(dblayout::kVersionPrefix, '\0');
  StoreU64(v.data(), version);
  return v + value;
}

TEST(CheckTest, AFullArenaWithDeletesAndARestartIsClean) {
  TempStore t;
  t.options.arena_size = 2 << 20;  // ~3.5 MB of values do not all fit
  t.options.promote_on_get = false;
  constexpr int kKeys = 3000;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < kKeys; ++i) ASSERT_TRUE((*s)->Put(Key(i), Value(i)).ok()) << i;
    for (int i = 0; i < kKeys; i += 7) ASSERT_TRUE((*s)->Delete(Key(i)).ok()) << i;
    for (int i = 1; i < kKeys; i += 10) ASSERT_TRUE((*s)->Put(Key(i), Value(i + 1)).ok()) << i;
    const CheckReport r = MustCheck(**s);
    EXPECT_TRUE(r.clean()) << Problems(r);
    // Deleted: every 7th key but those written again (i = 1 mod 10).
    uint64_t deleted = 0;
    for (int i = 0; i < kKeys; i += 7) deleted += i % 10 != 1;
    EXPECT_EQ(r.db_keys, kKeys - deleted);
    EXPECT_EQ(r.found + r.sent_to_server, r.db_keys);
    EXPECT_GT(r.sent_to_server, 0u) << "the arena was meant to overflow";
    EXPECT_EQ(r.resident_slots, r.found);
    EXPECT_GT(r.marker_slots, 0u);
    // Not closed: the next Open takes the dirty arena of a dead writer back.
  }
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ((*s)->opened_as(), Store::OpenedAs::kRecovered) << (*s)->open_reason();
  const CheckReport r = MustCheck(**s);
  EXPECT_TRUE(r.clean()) << Problems(r);
  EXPECT_EQ(r.found + r.sent_to_server, r.db_keys);
}

// The three ways a reattached arena could disagree with its database, made
// by changing RocksDB behind a clean arena's back (its generation unchanged,
// so the next Open trusts the arena): each is a problem naming its key.
TEST(CheckTest, AnArenaThatDisagreesWithRocksDbIsFoundKeyByKey) {
  TempStore t;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < 100; ++i) ASSERT_TRUE((*s)->Put(Key(i), Value(i)).ok());
    ASSERT_TRUE((*s)->Close().ok());
  }
  BehindTheArena(t.options, [](rocksdb::DB* db, rocksdb::ColumnFamilyHandle* data) {
    ASSERT_TRUE(db->Delete(rocksdb::WriteOptions(), data, Key(3)).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), data, Key(4), Record(1000, "newer")).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), data, "never-published", Record(1001, "x")).ok());
  });
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ((*s)->opened_as(), Store::OpenedAs::kReattached) << (*s)->open_reason();
  const CheckReport r = MustCheck(**s);
  const std::string p = Problems(r);
  EXPECT_EQ(r.problems, 4u) << p;  // key-4 by both passes
  EXPECT_NE(p.find("key 'key-3': resident at version 4, but RocksDB has no such key"),
            std::string::npos)
      << p;
  EXPECT_NE(p.find("key 'key-4': the arena serves version 5, RocksDB holds version 1000"),
            std::string::npos)
      << p;
  EXPECT_NE(p.find("key 'key-4': resident at version 5, RocksDB holds another version or value"),
            std::string::npos)
      << p;
  EXPECT_NE(p.find("key 'never-published': in RocksDB at version 1001, but a reader of the "
                   "arena finds no such key"),
            std::string::npos)
      << p;
  EXPECT_EQ(r.db_keys, 100u);
}

}  // namespace
}  // namespace kvnode::storage
