// Format round trips, geometry agreement between writer and reader code, and
// malformed input refused.
#include "kvnode/storage/format.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "kvnode/storage/read_path.h"
#include "kvnode/storage/store.h"
#include "test_util.h"

namespace kvnode::storage {
namespace {

Geometry SampleGeometry() {
  Geometry g;
  g.bucket_size = 256;
  g.arena_size = 8 << 20;
  g.index_offset = 4096;
  g.bucket_count = 1024;
  g.hash_seed = 0x1234567890abcdefULL;
  g.arena_id = 42;
  return g;
}

TEST(GeometryTest, EncodeDecodeRoundTrip) {
  const Geometry g = SampleGeometry();
  ASSERT_TRUE(g.Validate().ok());
  const std::string bytes = g.Encode();
  ASSERT_EQ(bytes.size(), Geometry::kEncodedSize);
  auto d = Geometry::Decode(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, g);
}

TEST(GeometryTest, EveryCorruptedByteIsRefused) {
  const std::string good = SampleGeometry().Encode();
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x5a;
    EXPECT_FALSE(Geometry::Decode(bad).ok()) << "byte " << i;
  }
  EXPECT_FALSE(Geometry::Decode(good.substr(0, good.size() - 1)).ok());
  EXPECT_FALSE(Geometry::Decode(good + "x").ok());
  EXPECT_FALSE(Geometry::Decode("").ok());
}

TEST(GeometryTest, InconsistentGeometriesAreRefused) {
  auto expect_bad = [](auto mutate) {
    Geometry g = SampleGeometry();
    mutate(g);
    EXPECT_FALSE(g.Validate().ok());
    EXPECT_FALSE(Geometry::Decode(g.Encode()).ok());
  };
  expect_bad([](Geometry& g) { g.layout_version = kLayoutVersion + 1; });
  expect_bad([](Geometry& g) { g.bucket_size = 96; });
  expect_bad([](Geometry& g) { g.bucket_size = 1024; });
  expect_bad([](Geometry& g) { g.bucket_count = 1000; });
  expect_bad([](Geometry& g) { g.bucket_count = 0; });
  expect_bad([](Geometry& g) { g.index_offset = 100; });
  expect_bad([](Geometry& g) { g.bucket_count = uint64_t{1} << 20; });  // index beyond arena
  expect_bad([](Geometry& g) { g.slots_per_bucket = 7; });
  expect_bad([](Geometry& g) { g.arena_size = 0; });
}

TEST(SlotTest, WordRoundTrip) {
  const uint64_t w = Slot::Resident(0x3abc, uint64_t{1} << 38, 4088);
  const Slot s = Slot::Parse(w);
  EXPECT_EQ(s.type, SlotType::kResident);
  EXPECT_EQ(s.fingerprint, 0x3abc);
  EXPECT_EQ(s.offset, uint64_t{1} << 38);
  EXPECT_EQ(s.length, 4088u);
  EXPECT_EQ(s.Word(), w);
  const Slot m = Slot::Parse(Slot::Marker(0x1234));
  EXPECT_EQ(m.type, SlotType::kMarker);
  EXPECT_EQ(m.fingerprint, 0x1234);
  EXPECT_EQ(Slot::Parse(0).type, SlotType::kEmpty);
  EXPECT_EQ(MakeLink(0, false), 0u);
  EXPECT_EQ(LinkNext(MakeLink(4096 * 3, true)), 4096u * 3);
  EXPECT_TRUE(LinkLossy(MakeLink(64, true)));
}

TEST(ObjectTest, RoundTripAndEveryCorruptionDetected) {
  const Geometry g = SampleGeometry();
  const std::string key = "some-key";
  const std::string value(100, 'v');
  const size_t fp = ObjectFootprint(key.size(), value.size(), 16);
  std::string buf(fp, '\xee');
  EncodeObject(g, 4096 + 16, 77, key, value, buf.data(), fp);
  auto v = DecodeObject(g, buf);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->key, key);
  EXPECT_EQ(v->value, value);
  EXPECT_EQ(v->version, 77u);
  EXPECT_EQ(v->owner, 4096u + 16);
  const size_t used = ObjectSize(key.size(), value.size());
  for (size_t i = 0; i < used; ++i) {
    std::string bad = buf;
    bad[i] ^= 0x01;
    EXPECT_FALSE(DecodeObject(g, bad).ok()) << "byte " << i;
  }
  EXPECT_FALSE(DecodeObject(g, std::string_view(buf).substr(0, used - 1)).ok());
  EXPECT_FALSE(DecodeObject(g, std::string(64, '\0')).ok());
  Geometry other = g;
  other.hash_seed ^= 1;  // another arena's objects do not verify here
  EXPECT_FALSE(DecodeObject(other, buf).ok());
}

TEST(ReadPathTest, ShortOrEmptyBytesAreRetried) {
  const Geometry g = SampleGeometry();
  const ReadStep step = FirstRead(g, "k");
  EXPECT_EQ(step.length, g.bucket_size);
  EXPECT_EQ(step.offset % g.bucket_size, g.index_offset % g.bucket_size);
  EXPECT_EQ(Decode(g, "k", step, "").outcome, ReadResult::Outcome::kRetry);
  EXPECT_EQ(Decode(g, "k", step, std::string(10, '\0')).outcome, ReadResult::Outcome::kRetry);
  // An all-zero bucket proves absence.
  EXPECT_EQ(Decode(g, "k", step, std::string(g.bucket_size, '\0')).outcome,
            ReadResult::Outcome::kNotFound);
  // A LOSSY home bucket does not.
  std::string lossy(g.bucket_size, '\0');
  StoreU64(lossy.data(), MakeLink(0, true));
  EXPECT_EQ(Decode(g, "k", step, lossy).outcome, ReadResult::Outcome::kSlowPath);
  // A link outside the arena is garbage.
  std::string wild(g.bucket_size, '\0');
  StoreU64(wild.data(), MakeLink(g.arena_size, false));
  EXPECT_EQ(Decode(g, "k", step, wild).outcome, ReadResult::Outcome::kRetry);
}

// A chain that links back to itself (garbage, or reused memory) ends at the
// reader's bound with the slow path; an overflow bucket whose tag is not the
// one its link named is retried.
TEST(ReadPathTest, CyclesEndAndStaleBucketsAreRetried) {
  const Geometry g = SampleGeometry();
  const ReadStep first = FirstRead(g, "k");
  std::string cycle(g.bucket_size, '\0');
  StoreU64(cycle.data(), MakeLink(first.offset, false));
  ReadStep st = first;
  ReadResult r;
  uint32_t reads = 0;
  for (; reads < 10 * kMaxChainLength; ++reads) {
    r = Decode(g, "k", st, cycle);
    if (r.outcome != ReadResult::Outcome::kNext) break;
    st = r.next;
  }
  EXPECT_EQ(r.outcome, ReadResult::Outcome::kSlowPath);
  EXPECT_EQ(reads + 1, kMaxChainLength);

  const uint64_t next = first.offset + 64 * g.bucket_size;
  std::string home(g.bucket_size, '\0');
  StoreU64(home.data(), MakeLink(next, false, 0x123456));
  r = Decode(g, "k", first, home);
  ASSERT_EQ(r.outcome, ReadResult::Outcome::kNext);
  EXPECT_EQ(r.next.offset, next);
  std::string overflow(g.bucket_size, '\0');
  StoreU64(overflow.data() + 8, uint64_t{0x123457} << kMetaTagShift);  // another tag
  EXPECT_EQ(Decode(g, "k", r.next, overflow).outcome, ReadResult::Outcome::kRetry);
  StoreU64(overflow.data() + 8, 0);  // tag cleared: unlinked
  EXPECT_EQ(Decode(g, "k", r.next, overflow).outcome, ReadResult::Outcome::kRetry);
  StoreU64(overflow.data() + 8, (uint64_t{0x123456} << kMetaTagShift) | 0xff);
  EXPECT_EQ(Decode(g, "k", r.next, overflow).outcome, ReadResult::Outcome::kNotFound);
}

// The reader code, given only the encoded geometry and bytes copied from the
// mapping, finds exactly what the writer stored: one READ for inline values,
// two for heap values.
TEST(ReadPathTest, ReaderAgreesWithWriter) {
  testing::TempStore t;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  auto g = Geometry::Decode((*store)->geometry().Encode());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->arena_size, (*store)->arena_size());
  const char* base = (*store)->arena_base();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % 4096, 0u);
  EXPECT_EQ((*store)->arena_size() % 4096, 0u);
  int one_read = 0, two_reads = 0;
  for (int i = 0; i < 500; ++i) {
    const std::string key = "key-" + std::to_string(i);
    const std::string value(i % 3 == 0 ? 20 : 600, static_cast<char>('a' + i % 26));
    ASSERT_TRUE((*store)->Put(key, value).ok());
  }
  for (int i = 0; i < 500; ++i) {
    const std::string key = "key-" + std::to_string(i);
    ReadStep step = FirstRead(*g, key);
    int reads = 0;
    ReadResult r;
    do {
      ASSERT_LE(step.offset + step.length, g->arena_size);
      ++reads;
      r = Decode(*g, key, step, std::string_view(base + step.offset, step.length));
      step = r.next;
    } while (r.outcome == ReadResult::Outcome::kNext);
    ASSERT_EQ(r.outcome, ReadResult::Outcome::kFound) << key << " " << OutcomeName(r.outcome);
    EXPECT_EQ(r.value, std::string(i % 3 == 0 ? 20 : 600, static_cast<char>('a' + i % 26)));
    (reads == 1 ? one_read : two_reads)++;
  }
  EXPECT_GT(one_read, 100);  // small values inline
  EXPECT_GT(two_reads, 100);
  for (int i = 0; i < 200; ++i) {
    const std::string key = "absent-" + std::to_string(i);
    ReadStep step = FirstRead(*g, key);
    ReadResult r;
    do {
      r = Decode(*g, key, step, std::string_view(base + step.offset, step.length));
      step = r.next;
    } while (r.outcome == ReadResult::Outcome::kNext);
    EXPECT_EQ(r.outcome, ReadResult::Outcome::kNotFound) << key;
  }
}

// A cached location (read_path.h) is one READ of the object: trusted only
// while the object is owned, i.e. while its slot publishes it (the writer
// stores the owner word after publishing and clears it before replacing).
TEST(ReadPathTest, CachedLocationIsTrustedOnlyWhileTheObjectIsOwned) {
  const Geometry g = SampleGeometry();
  const std::string key = "cached-key";
  const std::string value(300, 'v');
  const uint16_t fp = HashKey(g, key).fingerprint;
  const uint64_t slot = BucketOffset(g, HashKey(g, key).bucket) + (kBucketHeaderWords + 2) * 8;
  const uint64_t heap = g.index_offset + g.index_bytes() + 4096;
  const size_t foot = ObjectFootprint(key.size(), value.size(), 8);
  const uint64_t word = Slot::Resident(fp, heap, static_cast<uint32_t>(foot));
  using O = ReadResult::Outcome;

  const ReadStep st = CachedRead(g, CachedLocation{slot, word});
  ASSERT_EQ(st.kind, ReadStep::Kind::kCached);
  ASSERT_EQ(st.offset, heap);
  ASSERT_EQ(st.length, foot);
  // Written, not yet published: the owner word is 0 and the checksum is the
  // owned object's, so it fails; once owned it is found.
  std::string obj(foot, '\0');
  EncodeUnownedObject(g, slot, /*version=*/7, key, value, obj.data(), foot);
  EXPECT_EQ(LoadU64(obj.data() + kObjectOwnerOffset), 0u);
  EXPECT_EQ(DecodeCached(g, key, st, obj).outcome, O::kRetry);
  StoreU64(obj.data() + kObjectOwnerOffset, slot);
  std::string whole(foot, '\0');
  EncodeObject(g, slot, 7, key, value, whole.data(), foot);
  EXPECT_EQ(obj, whole);
  ReadResult r = DecodeCached(g, key, st, obj);
  ASSERT_EQ(r.outcome, O::kFound);
  EXPECT_EQ(r.value, value);
  EXPECT_EQ(r.version, 7u);
  EXPECT_EQ(r.slot, slot);
  EXPECT_EQ(r.slot_word, word);

  // Replaced, deleted or evicted: the owner word cleared, the rest intact.
  std::string retired = obj;
  StoreU64(retired.data() + kObjectOwnerOffset, 0);
  EXPECT_EQ(DecodeCached(g, key, st, retired).outcome, O::kRetry);
  // The memory reused: by another slot's object with the same key, by
  // another key, or torn.
  std::string other(foot, '\0');
  EncodeObject(g, slot + 8, 8, key, value, other.data(), foot);
  EXPECT_EQ(DecodeCached(g, key, st, other).outcome, O::kRetry);
  EXPECT_EQ(DecodeCached(g, "another-key", st, obj).outcome, O::kRetry);
  std::string torn = obj;
  torn[40] ^= 1;
  EXPECT_EQ(DecodeCached(g, key, st, torn).outcome, O::kRetry);
  // A short read.
  EXPECT_EQ(DecodeCached(g, key, st, obj.substr(0, foot - 8)).outcome, O::kRetry);
  // Locations that cannot name an object here: no READ at all.
  EXPECT_EQ(CachedRead(g, CachedLocation{slot, 0}).length, 0u);
  EXPECT_EQ(CachedRead(g, CachedLocation{slot, Slot::Marker(fp)}).length, 0u);
  EXPECT_EQ(CachedRead(g, CachedLocation{g.arena_size, word}).length, 0u);
  EXPECT_EQ(CachedRead(g, CachedLocation{slot + 3, word}).length, 0u);
  EXPECT_EQ(CachedRead(g, CachedLocation{slot, Slot::Resident(fp, g.arena_size - 8, 64)}).length,
            0u);
  // Decode does not take a cached step (DecodeCached does).
  EXPECT_EQ(Decode(g, key, st, obj).outcome, O::kRetry);
}

// The fingerprint FirstRead computed is the one the bucket is searched for;
// a step built by hand (no fingerprint) hashes the key itself.
TEST(ReadPathTest, FirstReadCarriesTheFingerprint) {
  const Geometry g = SampleGeometry();
  const KeyHash h = HashKey(g, "k1");
  const ReadStep a = FirstRead(g, "k1");
  const ReadStep b = FirstRead(g, h);
  EXPECT_EQ(a.fingerprint, h.fingerprint);
  EXPECT_EQ(b.offset, a.offset);
  EXPECT_EQ(b.fingerprint, a.fingerprint);
}

}  // namespace
}  // namespace kvnode::storage
