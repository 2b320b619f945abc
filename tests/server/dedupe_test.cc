#include "kvnode/server/dedupe.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvnode::server
