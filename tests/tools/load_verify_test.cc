// Verified values and the stale-read judgement.
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvnode/load/verify.h"
#include "kvnode/storage/limits.h"

namespace kvnode::load {
namespace {

TEST(VerifyTest, ValuesRoundTripAtEverySize) {
  for (size_t size : {kMinVerifiedValueSize, kMinVerifiedValueSize + 1, size_t{39}, size_t{100},
                      storage::kMaxValueSize}) {
    const std::string v = EncodeVerifiedValue("k0001", 77, size);
    ASSERT_EQ(v.size(), size);
    const CheckedValue c = CheckVerifiedValue("k0001", v);
    EXPECT_EQ(c.check, ValueCheck::kOk) << size;
    EXPECT_EQ(c.version, 77u);
  }
  // The same (key, version, size) always gives the same bytes.
  EXPECT_EQ(EncodeVerifiedValue("a", 1, 64), EncodeVerifiedValue("a", 1, 64));
  EXPECT_NE(EncodeVerifiedValue("a", 1, 64), EncodeVerifiedValue("a", 2, 64));
}

TEST(VerifyTest, WrongKeyIsNotCorruption) {
  const std::string v = EncodeVerifiedValue("k0001", 5, 64);
  EXPECT_EQ(CheckVerifiedValue("k0002", v).check, ValueCheck::kWrongKey);
}

TEST(VerifyTest, EveryBitFlipAndTruncationIsCorruption) {
  const std::string v = EncodeVerifiedValue("key", 9, 48);
  for (size_t i = 0; i < v.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = v;
      bad[i] ^= static_cast<char>(1 << bit);
      EXPECT_EQ(CheckVerifiedValue("key", bad).check, ValueCheck::kCorrupt) << i << "/" << bit;
    }
  }
  for (size_t len = 0; len < v.size(); ++len) {
    EXPECT_EQ(CheckVerifiedValue("key", v.substr(0, len)).check, ValueCheck::kCorrupt) << len;
  }
  EXPECT_EQ(CheckVerifiedValue("key", std::string(48, '\0')).check, ValueCheck::kCorrupt);
  EXPECT_EQ(CheckVerifiedValue("key", v + "x").check, ValueCheck::kCorrupt);
}

TEST(VerifyTest, TrackerHandsOutIncreasingVersionsAboveTheBase) {
  VersionTracker t(4, /*base_version=*/1000);
  EXPECT_EQ(t.BeginWrite(0, false), 1001u);
  EXPECT_EQ(t.BeginWrite(0, false), 1002u);
  EXPECT_EQ(t.BeginWrite(1, true), 1001u);
  EXPECT_EQ(t.IssuedMax(0), 1002u);
  EXPECT_EQ(t.Snapshot(0).acked_version, 0u);
}

// The kinds of wrong read are told apart.
TEST(VerifyTest, ReadVerdicts) {
  VersionTracker t(2);
  const std::string key = "k0";
  auto value = [&](uint64_t v) { return EncodeVerifiedValue(key, v, 40); };

  // Nothing acknowledged yet: NOT_FOUND is fine.
  EXPECT_EQ(t.CheckRead(0, key, t.Snapshot(0), std::nullopt), ReadVerdict::kOk);

  const uint64_t v1 = t.BeginWrite(0, false);
  t.AckWrite(0, v1, false);
  const uint64_t v2 = t.BeginWrite(0, false);
  t.AckWrite(0, v2, false);
  ReadSnapshot snap = t.Snapshot(0);
  EXPECT_EQ(snap.acked_version, v2);
  std::string v = value(v2);
  EXPECT_EQ(t.CheckRead(0, key, snap, v), ReadVerdict::kOk);
  v = value(v1);
  EXPECT_EQ(t.CheckRead(0, key, snap, v), ReadVerdict::kStale);
  EXPECT_EQ(t.CheckRead(0, key, snap, std::nullopt), ReadVerdict::kMissing);
  std::string corrupt = value(v2);
  corrupt[20] ^= 1;
  EXPECT_EQ(t.CheckRead(0, key, snap, corrupt), ReadVerdict::kCorrupt);
  v = EncodeVerifiedValue("k1", v2, 40);
  EXPECT_EQ(t.CheckRead(0, key, snap, v), ReadVerdict::kWrongKey);
  v = value(v2 + 5);  // nobody issued that
  EXPECT_EQ(t.CheckRead(0, key, snap, v), ReadVerdict::kUnknownVersion);

  // A write in flight may or may not be visible: both are fine.
  const uint64_t v3 = t.BeginWrite(0, false);
  v = value(v3);
  EXPECT_EQ(t.CheckRead(0, key, snap, v), ReadVerdict::kOk);
  v = value(v2);
  EXPECT_EQ(t.CheckRead(0, key, snap, v), ReadVerdict::kOk);

  // A read issued before an acknowledgement may return the older value.
  ReadSnapshot before_ack = t.Snapshot(0);
  t.AckWrite(0, v3, false);
  v = value(v2);
  EXPECT_EQ(t.CheckRead(0, key, before_ack, v), ReadVerdict::kOk);
  EXPECT_EQ(t.CheckRead(0, key, t.Snapshot(0), v), ReadVerdict::kStale);

  // Deletes: in flight, NOT_FOUND is fine; acknowledged, an old value is stale.
  const uint64_t d = t.BeginWrite(0, true);
  snap = t.Snapshot(0);
  EXPECT_EQ(t.CheckRead(0, key, snap, std::nullopt), ReadVerdict::kOk);
  t.AckWrite(0, d, true);
  snap = t.Snapshot(0);
  EXPECT_TRUE(snap.acked_deleted);
  EXPECT_EQ(t.CheckRead(0, key, snap, std::nullopt), ReadVerdict::kOk);
  v = value(v3);
  EXPECT_EQ(t.CheckRead(0, key, snap, v), ReadVerdict::kStale);
  const uint64_t v5 = t.BeginWrite(0, false);
  v = value(v5);
  EXPECT_EQ(t.CheckRead(0, key, snap, v), ReadVerdict::kOk);
}

TEST(VerifyTest, ValuesFromEarlierRunsAreAcceptedUntilSomethingNewerIsAcked) {
  VersionTracker t(1, /*base_version=*/500);
  std::string old = EncodeVerifiedValue("k0", 123, 40);
  EXPECT_EQ(t.CheckRead(0, "k0", t.Snapshot(0), old), ReadVerdict::kOk);
  t.AckWrite(0, t.BeginWrite(0, false), false);
  EXPECT_EQ(t.CheckRead(0, "k0", t.Snapshot(0), old), ReadVerdict::kStale);
}

TEST(VerifyTest, AcknowledgementsArriveInAnyOrder) {
  VersionTracker t(1);
  std::vector<uint64_t> versions;
  for (int i = 0; i < 1000; ++i) versions.push_back(t.BeginWrite(0, false));
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (size_t i = th; i < versions.size(); i += 4) t.AckWrite(0, versions[i], false);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.Snapshot(0).acked_version, versions.back());
}

}  // namespace
}  // namespace kvnode::load
