#include "kvnode/server/client_records.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"

namespace kvnode::server {
namespace {

constexpr size_t kWindow = 16;

// A record that has answered writes 1..n (PUT, OK, version = 100 + seq).
void Write(ClientRecord* r, uint64_t n) {
  for (uint64_t seq = 1; seq <= n; ++seq) r->window.Record(DedupeEntry{seq, 2, 0, 100 + seq});
}

std::vector<uint64_t> Sorted(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<uint64_t> IdsOf(const std::vector<ClientRecordExport>& records) {
  std::vector<uint64_t> ids;
  for (const ClientRecordExport& r : records) ids.push_back(r.client_id);
  return Sorted(ids);
}

// A session of `id` that comes and goes, writing n times.
void Session(ClientRecords& t, uint64_t id, uint64_t n, uint64_t now) {
  ClientRecord* r = t.Open(id, now);
  Write(r, n);
  t.Closed(r, now);
}

// The upgrade's handover, O to N: idle records first, then what is in
// session or changed since, then the ids O holds. N ends with O's table:
// every record O holds, each as O has it, and nothing O forgot.
TEST(ClientRecords, IdleRecordsAheadThenTheChangedOnesGiveTheWholeTable) {
  ClientRecords o(kWindow, 100);
  absl::flat_hash_set<uint64_t> live;
  auto is_live = [&](uint64_t id) { return live.contains(id); };
  Session(o, 1, 3, 10);     // departed, unchanged later
  Session(o, 2, 3, 11);     // departed, comes back after the idle records went
  Session(o, 3, 3, 12);     // departed, forgotten later (Goodbye "client done")
  Write(o.Open(4, 13), 5);  // in session throughout
  live.insert(4);

  const RecordsExport ahead = o.Export(0, /*with_live=*/false, is_live);
  EXPECT_EQ(IdsOf(ahead.records), (std::vector<uint64_t>{1, 2, 3}));

  // Writes flow until the pause.
  Session(o, 2, 7, 20);
  o.Erase(3);
  Write(o.Open(5, 21), 2);  // a new client, in session
  live.insert(5);
  Write(o.Find(4), 9);

  const RecordsExport pause = o.Export(ahead.mark, /*with_live=*/true, is_live);
  EXPECT_EQ(IdsOf(pause.records), (std::vector<uint64_t>{2, 4, 5}));
  EXPECT_EQ(Sorted(pause.client_ids), (std::vector<uint64_t>{1, 2, 4, 5}));

  ClientRecords n(kWindow, 100);
  auto none = [](uint64_t) { return false; };
  n.Import(ahead.records, 30, none);
  n.Import(pause.records, 31, none);
  ASSERT_TRUE(n.Retain(pause.client_ids).ok());
  const RecordsExport got = n.Export(0, true, none);
  ASSERT_EQ(IdsOf(got.records), (std::vector<uint64_t>{1, 2, 4, 5}));
  for (const ClientRecordExport& r : got.records) {
    const DedupeWindow w = DedupeWindow::Import(r.window, kWindow);
    EXPECT_EQ(w.Export().entries, o.Find(r.client_id)->window.Export().entries)
        << "client " << r.client_id;
  }
  EXPECT_EQ(n.Find(2)->window.size(), 7u)
      << "client 2's record as it came back, not the one sent ahead";
}

TEST(ClientRecords, ExportWithoutChangesSinceTheMarkIsOnlyTheLiveOnes) {
  ClientRecords t(kWindow, 100);
  Session(t, 1, 1, 1);
  t.Open(2, 2);
  auto live = [](uint64_t id) { return id == 2; };
  const RecordsExport first = t.Export(0, false, live);
  EXPECT_EQ(IdsOf(first.records), (std::vector<uint64_t>{1}));
  EXPECT_TRUE(t.Export(first.mark, false, live).records.empty());
  EXPECT_EQ(IdsOf(t.Export(first.mark, true, live).records), (std::vector<uint64_t>{2}));
}

TEST(ClientRecords, RetainRefusesAListedIdWithoutARecordAndDropsNothing) {
  ClientRecords t(kWindow, 100);
  Session(t, 1, 1, 1);
  Session(t, 2, 1, 2);
  const absl::Status s = t.Retain({1, 3});
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(t.size(), 2u);
  ASSERT_TRUE(t.Retain({2}).ok());
  EXPECT_FALSE(t.contains(1));
  EXPECT_TRUE(t.contains(2));
}

// Records adopted in batches may exceed the bound until Retain: trimming
// earlier would pick victims the sender did not, and an id it lists would
// then be missing.
TEST(ClientRecords, ImportDoesNotTrimAndTrimEvictsTheIdleLongestNeverALiveOne) {
  ClientRecords t(kWindow, 2);
  std::vector<ClientRecordExport> in;
  for (uint64_t id = 1; id <= 4; ++id) in.push_back({id, {}, {}});
  auto none = [](uint64_t) { return false; };
  t.Import(in, 5, none);
  EXPECT_EQ(t.size(), 4u);
  t.Closed(t.Find(1), 1);  // idle longest
  t.Closed(t.Find(2), 9);
  t.Closed(t.Find(3), 2);
  t.Closed(t.Find(4), 3);
  auto live = [](uint64_t id) { return id == 1; };
  EXPECT_EQ(Sorted(t.Trim(live)), (std::vector<uint64_t>{3, 4}));
  EXPECT_TRUE(t.contains(1));
  EXPECT_TRUE(t.contains(2));
}

// After an upgrade, the records idle longest in O are evicted first in N,
// before any N stamped since: the records keep the order of their ages.
TEST(ClientRecords, ImportedRecordsKeepTheirAgeForEviction) {
  ClientRecords o(kWindow, 100);
  auto none = [](uint64_t) { return false; };
  const std::vector<uint64_t> idle_longest_first = {7, 3, 9, 1, 5, 8, 2, 6, 4};
  for (size_t i = 0; i < idle_longest_first.size(); ++i) {
    Session(o, idle_longest_first[i], 1, 100 + i);
  }
  // Two departed later, sent at the pause (after the others went ahead).
  const RecordsExport ahead = o.Export(0, /*with_live=*/false, none);
  Session(o, 11, 1, 300);
  Session(o, 10, 1, 301);
  const RecordsExport pause = o.Export(ahead.mark, /*with_live=*/true, none);

  ClientRecords n(kWindow, idle_longest_first.size() + 2);
  n.Import(ahead.records, 5000, none);
  n.Import(pause.records, 5001, none);
  ASSERT_TRUE(n.Retain(pause.client_ids).ok());
  // N's own clients come and go: each new record evicts the idle longest.
  std::vector<uint64_t> evicted;
  for (uint64_t k = 0; k < 11; ++k) {
    Session(n, 100 + k, 1, 6000 + k);
    for (uint64_t id : n.Trim(none)) evicted.push_back(id);
  }
  std::vector<uint64_t> want = idle_longest_first;
  want.push_back(11);
  want.push_back(10);
  EXPECT_EQ(evicted, want);
}

// At a cold start the records loaded from RocksDB come oldest written
// first (StoreBackend::LoadClientRecords): that order is the eviction order.
TEST(ClientRecords, ImportInOneBatchKeepsItsOrder) {
  ClientRecords t(kWindow, 3);
  std::vector<ClientRecordExport> in;
  for (uint64_t id : {4, 2, 3, 1}) in.push_back({id, {}, {}});
  auto none = [](uint64_t) { return false; };
  t.Import(in, 5, none);
  EXPECT_EQ(t.Trim(none), (std::vector<uint64_t>{4}));
  Session(t, 9, 1, 6);
  EXPECT_EQ(t.Trim(none), (std::vector<uint64_t>{2}));
}

TEST(ClientRecords, ImportNeverReplacesTheRecordOfALiveSession) {
  ClientRecords t(kWindow, 100);
  ClientRecord* mine = t.Open(7, 1);
  Write(mine, 2);
  ClientRecordExport other{7, {}, {}};
  t.Import({other}, 2, [](uint64_t id) { return id == 7; });
  EXPECT_EQ(t.Find(7), mine);
  EXPECT_EQ(mine->window.size(), 2u);
}

}  // namespace
}  // namespace kvnode::server
