#include "kvnode/server/dedupe.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

namespace kvnode::server {
namespace {

DedupeEntry E(uint64_t seq, uint64_t version = 0) { return DedupeEntry{seq, 2, 0, version}; }

TEST(DedupeWindow, RemembersRecordedAnswers) {
  DedupeWindow w(1024);
  EXPECT_EQ(w.Find(5), nullptr);
  w.Record(E(5, 77));
  ASSERT_NE(w.Find(5), nullptr);
  EXPECT_EQ(w.Find(5)->version, 77u);
  EXPECT_FALSE(w.TooOld(5));
  EXPECT_FALSE(w.TooOld(4));  // nothing forgotten yet: 4 was never seen, apply it
}

TEST(DedupeWindow, KeepsTheLastCapacityEntriesAndRaisesTheFloor) {
  DedupeWindow w(1024);
  for (uint64_t s = 1; s <= 1500; ++s) w.Record(E(s, s));
  EXPECT_EQ(w.size(), 1024u);
  EXPECT_EQ(w.Find(476), nullptr);
  ASSERT_NE(w.Find(477), nullptr);
  EXPECT_EQ(w.floor(), 476u);
  // Invariant 3: a forgotten sequence must not be applied again.
  EXPECT_TRUE(w.TooOld(100));
  EXPECT_TRUE(w.TooOld(476));
  EXPECT_FALSE(w.TooOld(477));   // in the window: answered from it
  EXPECT_FALSE(w.TooOld(2000));  // new
}

// Invariant 4: a held write (answered BUSY) stays retryable while later
// writes push entries out, and every floor says so until it is recorded.
TEST(DedupeWindow, HeldSequenceCapsEveryFloorUntilItIsRecorded) {
  DedupeWindow w(4);
  w.Record(E(1));
  w.Hold(2);
  for (uint64_t s = 3; s <= 10; ++s) w.Record(E(s));  // forgets 1, 3..6
  EXPECT_FALSE(w.TooOld(2));
  EXPECT_TRUE(w.TooOld(1));
  EXPECT_EQ(w.floor(), 1u);
  EXPECT_EQ(w.Export().floor, 1u);
  EXPECT_EQ(w.Newest(2).floor, 1u);
  EXPECT_FALSE(DedupeWindow::Import(w.Export(), 4).TooOld(2));
  w.Record(E(2));  // the retry, applied: forgets 7
  EXPECT_EQ(w.floor(), 7u);
  EXPECT_NE(w.Find(2), nullptr);
  EXPECT_TRUE(w.TooOld(5));
}

TEST(DedupeWindow, HeldSequencesKeepTheLowestWhenFull) {
  DedupeWindow w(4);
  for (uint64_t s = 1000; s < 1000 + DedupeWindow::kMaxHeld + 10; ++s) w.Hold(s);
  EXPECT_EQ(w.LowestHeld(), 1000u);
  w.Hold(5);
  EXPECT_EQ(w.LowestHeld(), 5u);
  EXPECT_EQ(w.LowestHeld(5), 1000u);
  w.Hold(5);  // once
  w.Record(E(5));
  EXPECT_EQ(w.LowestHeld(), 1000u);
}

TEST(DedupeWindow, OutOfOrderSequencesFloorIsTheHighestForgotten) {
  DedupeWindow w(2);
  w.Record(E(10));
  w.Record(E(3));
  w.Record(E(20));  // forgets 10
  EXPECT_EQ(w.floor(), 10u);
  w.Record(E(30));  // forgets 3; the floor stays 10
  EXPECT_EQ(w.floor(), 10u);
  EXPECT_TRUE(w.TooOld(5));
}

TEST(DedupeWindow, RecordingTheSameSequenceTwiceKeepsOneEntry) {
  DedupeWindow w(4);
  w.Record(E(1, 1));
  w.Record(E(1, 2));
  EXPECT_EQ(w.size(), 1u);
  EXPECT_EQ(w.Find(1)->version, 2u);
}

// Bytes the heap has handed out (glibc's count, every arena).
size_t HeapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

// The node keeps a window per client id it remembers, departed clients
// included (--max_client_records of them): what a full one costs is what
// those cost.
TEST(DedupeWindow, AFullWindowCostsAbout24BytesPerEntry) {
  {
    const size_t before = HeapInUse();
    auto probe = std::make_unique<volatile char[]>(1 << 20);
    probe[0] = 1;
    if (HeapInUse() - before < (1u << 20)) {
      GTEST_SKIP() << "mallinfo2() does not see this allocator (a sanitizer build?)";
    }
  }
  constexpr size_t kWindows = 64;
  constexpr size_t kCapacity = 1024;
  std::vector<DedupeWindow> windows;
  windows.reserve(kWindows);
  const size_t before = HeapInUse();
  for (size_t i = 0; i < kWindows; ++i) {
    DedupeWindow& w = windows.emplace_back(kCapacity);
    for (uint64_t s = 1; s <= 2 * kCapacity; ++s) w.Record(E(s));  // full, and turned over
    ASSERT_EQ(w.size(), kCapacity);
  }
  const double per_entry =
      static_cast<double>(HeapInUse() - before) / static_cast<double>(kWindows * kCapacity);
  EXPECT_LE(per_entry, 32.0) << "sizeof(DedupeEntry) is " << sizeof(DedupeEntry);
}

TEST(DedupeWindow, ExportImportRoundTrip) {
  DedupeWindow w(1024);
  for (uint64_t s = 1; s <= 1100; ++s) w.Record(E(s * 2, s));
  DedupeWindow::Exported ex = w.Export();
  ASSERT_EQ(ex.entries.size(), 1024u);
  EXPECT_EQ(ex.entries.front().sequence, 77u * 2);  // oldest first
  DedupeWindow back = DedupeWindow::Import(ex, 1024);
  EXPECT_EQ(back.size(), w.size());
  EXPECT_EQ(back.floor(), w.floor());
  EXPECT_EQ(back.Export().entries, ex.entries);
  EXPECT_TRUE(back.TooOld(10));
}

DedupeEntry P(uint64_t seq, uint64_t version, uint8_t op = 2, uint8_t st = 0) {
  return DedupeEntry{seq, op, st, version};
}

TEST(DedupeWindow, NewestKeepsTheLastEntriesAndAFloorOverTheRest) {
  DedupeWindow w(1024);
  for (uint64_t s : {5, 9, 7, 20, 21, 22}) w.Record(P(s, s * 10));
  DedupeWindow::Exported n = w.Newest(3);
  ASSERT_EQ(n.entries.size(), 3u);
  EXPECT_EQ(n.entries.front().sequence, 20u);
  EXPECT_TRUE(n.has_floor);
  EXPECT_EQ(n.floor, 9u);  // the highest left out, not the last left out
  DedupeWindow back = DedupeWindow::Import(n, 1024);
  for (uint64_t s : {5, 7, 9}) EXPECT_TRUE(back.TooOld(s)) << s;
  for (uint64_t s : {20, 21, 22}) ASSERT_NE(back.Find(s), nullptr) << s;
  EXPECT_FALSE(back.TooOld(23));
  // Nothing left out: no floor.
  DedupeWindow::Exported all = w.Newest(100);
  EXPECT_FALSE(all.has_floor);
  EXPECT_EQ(all.entries.size(), 6u);
}

// Newest() keeps the floor over the entries it leaves out up to date as
// entries are recorded and forgotten; whatever the history (sequences out of
// order, answered twice, forgotten, n above the capacity, n changing), it
// must equal the full scan of the window it replaced.
DedupeWindow::Exported NewestByScan(const DedupeWindow& w, size_t n) {
  const DedupeWindow::Exported all = w.Export();
  DedupeWindow::Exported out;
  out.has_floor = all.has_floor;
  out.floor = all.floor;
  const size_t skip = all.entries.size() > n ? all.entries.size() - n : 0;
  for (size_t i = 0; i < all.entries.size(); ++i) {
    if (i >= skip) {
      out.entries.push_back(all.entries[i]);
    } else {
      if (!out.has_floor || all.entries[i].sequence > out.floor)
        out.floor = all.entries[i].sequence;
      out.has_floor = true;
    }
  }
  return out;
}

TEST(DedupeWindow, NewestEqualsAFullScanWhateverTheHistory) {
  std::mt19937_64 rng(17);
  for (size_t capacity : {1, 2, 5, 16}) {
    DedupeWindow w(capacity);
    size_t n = 3;
    uint64_t next = 100;
    for (int step = 0; step < 4000; ++step) {
      const uint64_t r = rng() % 100;
      uint64_t seq;
      if (r < 60) {
        seq = next++;  // the usual case: increasing
      } else if (r < 80) {
        seq = next + rng() % 8;  // ahead (depth > 1: answered out of order)
      } else if (r < 90) {
        seq = next - 1 - rng() % std::min<uint64_t>(next, 40);  // behind, maybe recorded
      } else {
        seq = rng() % 1000;  // anything
      }
      w.Record(DedupeEntry{seq, 2, 0, static_cast<uint64_t>(step)});
      if (rng() % 50 == 0) n = rng() % (capacity + 3);  // a new n: rescanned once
      const DedupeWindow::Exported got = w.Newest(n);
      const DedupeWindow::Exported want = NewestByScan(w, n);
      ASSERT_EQ(got.entries, want.entries) << "capacity " << capacity << " step " << step;
      ASSERT_EQ(got.has_floor, want.has_floor) << "capacity " << capacity << " step " << step;
      ASSERT_EQ(got.floor, want.floor) << "capacity " << capacity << " step " << step;
    }
    // A copy (and an imported window) answers the same.
    const DedupeWindow copy = w;
    EXPECT_EQ(copy.Newest(n).floor, NewestByScan(w, n).floor);
    const DedupeWindow back = DedupeWindow::Import(w.Export(), capacity);
    EXPECT_EQ(back.Newest(n).entries, NewestByScan(w, n).entries);
    EXPECT_EQ(back.Newest(n).floor, NewestByScan(w, n).floor);
  }
}

TEST(ClientRecord, SnapshotHoldsTheNextWriteAndTheNewestOthers) {
  DedupeWindow w(1024);
  for (uint64_t s = 1; s <= 10; ++s) w.Record(P(s, s));
  PersistedClient c = PersistedSnapshot(42, w, P(11, 111, 3, 1), 4, 1234);
  EXPECT_EQ(c.client_id, 42u);
  EXPECT_EQ(c.written_unix_ms, 1234u);
  ASSERT_EQ(c.window.entries.size(), 4u);
  EXPECT_EQ(c.window.entries[0].sequence, 8u);
  EXPECT_EQ(c.window.entries[3], P(11, 111, 3, 1));
  EXPECT_TRUE(c.window.has_floor);
  EXPECT_EQ(c.window.floor, 7u);
  // The window the node will have after the write, imported from the record,
  // answers the same for everything the record kept and refuses the rest.
  w.Record(P(11, 111, 3, 1));
  DedupeWindow back = DedupeWindow::Import(c.window, 1024);
  for (uint64_t s = 8; s <= 11; ++s) EXPECT_EQ(*back.Find(s), *w.Find(s)) << s;
  for (uint64_t s = 1; s <= 7; ++s) EXPECT_TRUE(back.TooOld(s)) << s;
}

// A group commit's earlier writes of the client come after the window's
// entries; what does not fit in `keep` goes under the floor.
TEST(ClientRecord, SnapshotHoldsTheGroupsEarlierWrites) {
  DedupeWindow w(1024);
  for (uint64_t s = 1; s <= 10; ++s) w.Record(P(s, s));
  const std::vector<DedupeEntry> earlier = {P(11, 111), P(12, 112)};
  PersistedClient c = PersistedSnapshot(42, w, P(13, 113), 4, 1234, earlier);
  ASSERT_EQ(c.window.entries.size(), 4u);
  EXPECT_EQ(c.window.entries[0].sequence, 10u);
  EXPECT_EQ(c.window.entries[1], P(11, 111));
  EXPECT_EQ(c.window.entries[2], P(12, 112));
  EXPECT_EQ(c.window.entries[3], P(13, 113));
  EXPECT_EQ(c.window.floor, 9u);
  // More earlier writes than `keep`: the newest kept, the rest refused.
  const std::vector<DedupeEntry> many = {P(11, 111), P(12, 112), P(13, 113), P(14, 114)};
  c = PersistedSnapshot(42, w, P(15, 115), 2, 1234, many);
  ASSERT_EQ(c.window.entries.size(), 2u);
  EXPECT_EQ(c.window.entries[0], P(14, 114));
  EXPECT_EQ(c.window.entries[1], P(15, 115));
  EXPECT_TRUE(c.window.has_floor);
  EXPECT_EQ(c.window.floor, 13u);
}

TEST(ClientRecord, EncodeDecodeRoundTrip) {
  PersistedClient c;
  c.client_id = 0xfeedfacecafebeefULL;
  c.written_unix_ms = 1764400000000ULL;
  c.window.has_floor = true;
  c.window.floor = 99;
  c.window.entries = {P(100, 5), P(101, 0, 3, 1), P(102, 0, 2, 2)};
  for (size_t i = 0; i < c.secret.size(); ++i) c.secret[i] = static_cast<uint8_t>(0xc0 + i);
  const std::string b = EncodeClientRecord(c);
  EXPECT_EQ(b.size(), 36u + 3 * 18);  // version 2: the header holds the resume secret
  absl::StatusOr<PersistedClient> d = DecodeClientRecord(c.client_id, b);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->secret, c.secret);
  EXPECT_EQ(d->written_unix_ms, c.written_unix_ms);
  EXPECT_EQ(d->window.has_floor, true);
  EXPECT_EQ(d->window.floor, 99u);
  EXPECT_EQ(d->window.entries, c.window.entries);

  c.window.has_floor = false;
  c.window.floor = 0;
  d = DecodeClientRecord(c.client_id, EncodeClientRecord(c));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->window.has_floor);
}

TEST(ClientRecord, DecodeRefusesMalformedRecords) {
  PersistedClient c;
  c.window.entries = {P(1, 1), P(2, 2)};
  const std::string good = EncodeClientRecord(c);
  ASSERT_TRUE(DecodeClientRecord(1, good).ok());
  auto bad = [&](std::string b, const char* what) {
    absl::StatusOr<PersistedClient> d = DecodeClientRecord(1, b);
    EXPECT_TRUE(absl::IsDataLoss(d.status())) << what << ": " << d.status();
  };
  bad(good.substr(0, good.size() - 1), "truncated");
  bad(good + "x", "trailing byte");
  bad(good.substr(0, 35), "short header");
  std::string b = good;
  b[0] = 1;  // version 1 had no resume secret
  bad(b, "version 1");
  b[0] = 3;
  bad(b, "version");
  b = good;
  b[1] = 4;
  bad(b, "flags");
  b = good;
  b[36 + 8] = 1;  // GET is never recorded
  bad(b, "opcode");
  b = good;
  b[36 + 9] = 3;  // BUSY is never recorded (invariant 1)
  bad(b, "status");
  b = good;
  b[12] = 1;  // a floor without its flag
  bad(b, "floor");
  PersistedClient dup;
  dup.window.entries = {P(1, 1), P(1, 2)};
  bad(EncodeClientRecord(dup), "duplicate");
}

TEST(ClientRecord, Keys) {
  EXPECT_EQ(ClientRecordKey(0x1234), "dedupe/0000000000001234");
  EXPECT_EQ(ClientRecordKey(0xfeedfacecafebeefULL), "dedupe/feedfacecafebeef");
  EXPECT_EQ(ClientRecordKey(UINT64_MAX), "dedupe/ffffffffffffffff");
  EXPECT_EQ(ClientRecordKey(1), "dedupe/0000000000000001");
  EXPECT_EQ(ParseClientRecordKey(ClientRecordKey(0xfeedfacecafebeefULL)), 0xfeedfacecafebeefULL);
  EXPECT_EQ(ParseClientRecordKey("dedupe/000000000000123"), 0u);
  EXPECT_EQ(ParseClientRecordKey("dedupe/000000000000123G"), 0u);
  EXPECT_EQ(ParseClientRecordKey("other/0000000000001234"), 0u);
}

}  // namespace
}  // namespace kvnode::server
