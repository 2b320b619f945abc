// The index writer against a reader that walks a chain while it changes:
// every interleaving here is built step by step (READ, writes, READ), with
// fingerprint collisions found by brute force for a fixed hash seed, and with
// markers forced by a full heap (the test holds every free heap byte, so an
// object allocation fails exactly when the test wants it to).
//
// Drives storage/src/index.h directly (a test seam: the target gets the
// library's private include directory), and the chain bound through the Store.
#include "index.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kvnode/storage/arena.h"
#include "kvnode/storage/read_path.h"
#include "kvnode/storage/store.h"
#include "test_util.h"

namespace kvnode::storage {
namespace {

using Outcome = ReadResult::Outcome;

constexpr uint64_t kSeed = 0x5eed5eed5eed5eedULL;

// An arena of one home bucket: every key shares one chain.
class OneChain {
 public:
  explicit OneChain(uint32_t bucket_size, uint32_t max_chain_buckets = 16, uint64_t grace_ns = 0) {
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    opt_.shm_name = std::string("kvnode-index-test-") + std::to_string(getpid()) + "-" + t->name();
    opt_.size = 1 << 20;
    opt_.bucket_size = bucket_size;
    opt_.bucket_count = 1;
    opt_.hash_seed = kSeed;
    auto a = Arena::Create(opt_);
    EXPECT_TRUE(a.ok()) << a.status();
    arena_ = std::move(*a);
    index_ = std::make_unique<IndexWriter>(arena_.get(), grace_ns, max_chain_buckets);
  }
  ~OneChain() {
    index_.reset();
    arena_.reset();
    (void)Arena::Remove(opt_);
  }
  const Geometry& g() const { return arena_->geometry(); }
  IndexWriter& index() { return *index_; }
  Arena& arena() const { return *arena_; }
  const ArenaHeader& header() const { return *arena_->header(); }

  // One READ, as a NIC would do it: the bytes as they are now.
  std::string Read(const ReadStep& st) const {
    return std::string(arena_->At(st.offset), st.length);
  }

  // A whole GET with no writes in between.
  ReadResult Get(const std::string& key) const {
    ReadStep st = FirstRead(g(), key);
    ReadResult r;
    std::string holder;
    for (int hop = 0; hop < 1000; ++hop) {
      holder = Read(st);
      r = Decode(g(), key, st, holder);
      if (r.outcome != Outcome::kNext) break;
      st = r.next;
    }
    if (r.outcome == Outcome::kFound) found_value_.assign(r.value.data(), r.value.size());
    return r;
  }
  const std::string& found_value() const { return found_value_; }

  // Takes every free heap byte (small blocks last), so the next object
  // allocation fails; Release gives them back.
  void Hold() {
    for (uint64_t n = 1 << 16; n >= 8; n /= 2) {
      for (uint64_t off; (off = arena_->Allocate(n, 8)) != 0;) held_.push_back(off);
    }
  }
  // Hold() except the free block that contains `offset`.
  void HoldAllBut(uint64_t offset) {
    for (uint64_t n = 1 << 16; n >= 8; n /= 2) {
      for (uint64_t off; (off = arena_->Allocate(n, 8)) != 0;) {
        if (off <= offset && offset < off + n) {
          spared_ = off;
        } else {
          held_.push_back(off);
        }
      }
    }
    if (spared_ != 0) arena_->Deallocate(spared_);
  }
  void Release() {
    for (uint64_t off : held_) arena_->Deallocate(off);
    held_.clear();
  }

 private:
  ArenaOptions opt_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<IndexWriter> index_;
  std::vector<uint64_t> held_;
  uint64_t spared_ = 0;
  mutable std::string found_value_;
};

// `n` keys "<prefix><i>" whose fingerprint is `fp` (or, with `same` false,
// is not).
std::vector<std::string> KeysWithFingerprint(const Geometry& g, const std::string& prefix,
                                             uint16_t fp, bool same, size_t n) {
  std::vector<std::string> out;
  for (uint64_t i = 0; out.size() < n; ++i) {
    std::string k = prefix + std::to_string(i);
    if ((HashKey(g, k).fingerprint == fp) == same) out.push_back(std::move(k));
  }
  return out;
}

Slot SlotAt(const OneChain& c, uint64_t bucket, uint32_t i) {
  return Slot::Parse(*c.arena().At<uint64_t>(bucket + (kBucketHeaderWords + i) * 8));
}
uint64_t NextBucket(const OneChain& c, uint64_t bucket) {
  return LinkNext(*c.arena().At<uint64_t>(bucket));
}

// Markers do not name their key. K is non-resident with a marker in the
// overflow bucket; a reader READs the home bucket (no slot with K's
// fingerprint there), then K2 (same fingerprint, new) gets a marker in the
// home bucket, K is written (promoted), K2 is written (promoted); then the
// reader READs the overflow bucket. K existed throughout, so the reader must
// not answer NotFound. Before the fix, K took the home bucket's marker (an
// earlier bucket) and K2 the overflow bucket's: the reader saw neither K.
TEST(IndexInterleavingTest, PromotionNeverMovesAKeyBehindAReader) {
  OneChain c(/*bucket_size=*/64);  // no inline area: every object is a heap allocation
  const Geometry& g = c.g();
  const std::string k = "the-key";
  const uint16_t fp = HashKey(g, k).fingerprint;
  const std::string k2 = KeysWithFingerprint(g, "collider-", fp, true, 1)[0];
  ASSERT_NE(k2, k);
  const std::vector<std::string> fillers = KeysWithFingerprint(g, "filler-", fp, false, 7);
  IndexWriter& ix = c.index();
  const uint64_t home = BucketOffset(g, 0);

  // Home bucket: six fillers. Overflow bucket: a seventh filler, then K as a
  // marker (its allocation fails: the heap is held).
  for (const std::string& f : fillers) {
    ASSERT_EQ(ix.Upsert(f, "f", 1, false, false), IndexWriter::Placement::kResident);
  }
  const uint64_t overflow = NextBucket(c, home);
  ASSERT_NE(overflow, 0u);
  c.Hold();
  ASSERT_EQ(ix.Upsert(k, "v1", 2, false, false), IndexWriter::Placement::kNotResident);
  c.Release();
  EXPECT_EQ(SlotAt(c, overflow, 1).type, SlotType::kMarker);
  // A free slot in the home bucket.
  ix.Remove(fillers[0], true);
  ix.ReclaimExpired();
  ASSERT_EQ(c.Get(k).outcome, Outcome::kSlowPath);

  // The reader's first READ: the home bucket.
  const ReadStep first = FirstRead(g, k);
  const std::string home_bytes = c.Read(first);
  ReadResult r = Decode(g, k, first, home_bytes);
  ASSERT_EQ(r.outcome, Outcome::kNext);
  ASSERT_EQ(r.next.kind, ReadStep::Kind::kBucket);
  ASSERT_EQ(r.next.offset, overflow);
  const ReadStep second = r.next;

  // The writes between the reader's two READs.
  c.Hold();
  ASSERT_EQ(ix.Upsert(k2, "w1", 3, false, false), IndexWriter::Placement::kNotResident);
  c.Release();
  ASSERT_EQ(SlotAt(c, home, 0).type, SlotType::kMarker);  // K2's marker, in the home bucket
  EXPECT_EQ(ix.Upsert(k, "v2", 4, true, false), IndexWriter::Placement::kResident);
  EXPECT_EQ(ix.Upsert(k2, "w2", 5, true, false), IndexWriter::Placement::kResident);

  // The reader's second READ (and the object READs it asks for).
  ReadStep st = second;
  std::string holder;
  for (int hop = 0; hop < 100; ++hop) {
    holder = c.Read(st);
    r = Decode(g, k, st, holder);
    if (r.outcome != Outcome::kNext) break;
    st = r.next;
  }
  EXPECT_NE(r.outcome, Outcome::kNotFound) << "a key that exists read as absent";
  ASSERT_EQ(r.outcome, Outcome::kFound) << OutcomeName(r.outcome);
  EXPECT_EQ(r.value, "v2");

  // And from the start, both keys are found, and the counters agree.
  ASSERT_EQ(c.Get(k).outcome, Outcome::kFound);
  EXPECT_EQ(c.found_value(), "v2");
  ASSERT_EQ(c.Get(k2).outcome, Outcome::kFound);
  EXPECT_EQ(c.found_value(), "w2");
  EXPECT_EQ(c.header().marker_slots, 0u);
  EXPECT_EQ(c.header().num_keys, 8u);
  EXPECT_EQ(c.header().resident_keys, 8u);
}

// Removing a non-resident key clears the first marker of its fingerprint, so
// the last one (the one a reader past the first still relies on) stays.
TEST(IndexInterleavingTest, RemovingANonResidentKeyKeepsTheLastMarker) {
  OneChain c(64);
  const Geometry& g = c.g();
  const std::string k = "the-key";
  const uint16_t fp = HashKey(g, k).fingerprint;
  const std::string k2 = KeysWithFingerprint(g, "collider-", fp, true, 1)[0];
  const std::vector<std::string> fillers = KeysWithFingerprint(g, "filler-", fp, false, 7);
  IndexWriter& ix = c.index();
  const uint64_t home = BucketOffset(g, 0);
  for (const std::string& f : fillers)
    ASSERT_EQ(ix.Upsert(f, "f", 1, false, false), IndexWriter::Placement::kResident);
  const uint64_t overflow = NextBucket(c, home);
  c.Hold();
  ASSERT_EQ(ix.Upsert(k, "v", 2, false, false), IndexWriter::Placement::kNotResident);
  c.Release();
  ix.Remove(fillers[0], true);
  ix.ReclaimExpired();
  c.Hold();
  ASSERT_EQ(ix.Upsert(k2, "w", 3, false, false), IndexWriter::Placement::kNotResident);
  c.Release();
  ASSERT_EQ(SlotAt(c, home, 0).type, SlotType::kMarker);
  ASSERT_EQ(SlotAt(c, overflow, 1).type, SlotType::kMarker);

  // Reader passes the home bucket (a marker there: it must ask the server
  // anyway, but it keeps walking the chain for a resident copy).
  const ReadStep first = FirstRead(g, k);
  const std::string home_bytes = c.Read(first);
  ReadResult r = Decode(g, k, first, home_bytes);
  ASSERT_EQ(r.outcome, Outcome::kNext);
  ix.Remove(k2, true);
  EXPECT_EQ(SlotAt(c, home, 0).type, SlotType::kEmpty);
  EXPECT_EQ(SlotAt(c, overflow, 1).type, SlotType::kMarker);
  // A reader starting now sees K's cover too.
  EXPECT_EQ(c.Get(k).outcome, Outcome::kSlowPath);
  EXPECT_EQ(c.header().marker_slots, 1u);
}

// Invariant 10: a reconciliation repeats the removal of a key whose
// publication may already have run, and the repeat must not take another
// key's cover. K is non-resident (its marker); K2 has K's fingerprint, and is
// resident or non-resident (a marker of its own). K2 is removed (the
// publication), then removed again as the reconciliation after a writer
// killed before clearing its intent does: K must still read as "ask the
// server", never NotFound.
TEST(IndexInterleavingTest, ARepeatedRemovalNeverTakesAnotherKeysCover) {
  for (const bool k2_resident : {true, false}) {
    SCOPED_TRACE(k2_resident ? "K2 resident" : "K2 non-resident");
    OneChain c(64);
    const Geometry& g = c.g();
    const std::string k = "the-key";
    const uint16_t fp = HashKey(g, k).fingerprint;
    const std::string k2 = KeysWithFingerprint(g, "collider-", fp, true, 1)[0];
    const std::vector<std::string> fillers = KeysWithFingerprint(g, "filler-", fp, false, 7);
    IndexWriter& ix = c.index();
    for (const std::string& f : fillers)
      ASSERT_EQ(ix.Upsert(f, "f", 1, false, false), IndexWriter::Placement::kResident);
    c.Hold();
    ASSERT_EQ(ix.Upsert(k, "v", 2, false, false), IndexWriter::Placement::kNotResident);
    if (!k2_resident) {
      ASSERT_EQ(ix.Upsert(k2, "w", 3, false, false), IndexWriter::Placement::kNotResident);
    }
    c.Release();
    if (k2_resident) {
      ASSERT_EQ(ix.Upsert(k2, "w", 3, false, false), IndexWriter::Placement::kResident);
    }
    ASSERT_EQ(c.Get(k).outcome, Outcome::kSlowPath);

    ix.Remove(k2, /*existed=*/true);  // the publication
    ASSERT_EQ(c.Get(k).outcome, Outcome::kSlowPath);
    ix.RemoveIfResident(k2);  // the reconciliation's repeat
    EXPECT_EQ(c.Get(k).outcome, Outcome::kSlowPath)
        << "a key that exists read as " << OutcomeName(c.Get(k).outcome);
  }
}

// Invariant 8: an empty overflow bucket is unlinked and freed; a reader that
// read the link to it before retries instead of trusting what it finds there
// (the bucket with its tag cleared, or the memory reused by another bucket).
TEST(IndexInterleavingTest, ReaderOnAnUnlinkedOrReusedBucketRetries) {
  OneChain c(256);
  const Geometry& g = c.g();
  IndexWriter& ix = c.index();
  const uint64_t home = BucketOffset(g, 0);
  std::vector<std::string> keys;
  for (int i = 0; i < 13; ++i) keys.push_back("key-" + std::to_string(i));
  for (const std::string& k : keys) {
    ASSERT_EQ(ix.Upsert(k, "value-" + k, 1, false, true), IndexWriter::Placement::kResident);
  }
  ASSERT_EQ(c.header().overflow_buckets, 2u);
  const uint64_t x = NextBucket(c, home);
  const uint64_t y = NextBucket(c, x);
  ASSERT_NE(y, 0u);
  const std::string last = keys[12];  // the only key of the second overflow bucket
  ASSERT_EQ(SlotAt(c, y, 0).type, SlotType::kResident);

  // The reader READs the home bucket: next, X (a key of the chain that is
  // neither in home nor in X: the last one).
  const ReadStep first = FirstRead(g, last);
  const std::string home_bytes = c.Read(first);
  ReadResult r = Decode(g, last, first, home_bytes);
  ASSERT_EQ(r.outcome, Outcome::kNext);
  ASSERT_EQ(r.next.offset, x);
  const ReadStep to_x = r.next;

  // X's six keys go: X is unlinked and its tag cleared.
  for (int i = 6; i < 12; ++i) ix.Remove(keys[i], true);
  EXPECT_EQ(NextBucket(c, home), y);
  EXPECT_EQ(c.header().overflow_buckets, 1u);
  EXPECT_EQ(MetaTag(*c.arena().At<uint64_t>(x + 8)), 0u);
  EXPECT_EQ(Decode(g, last, to_x, c.Read(to_x)).outcome, Outcome::kRetry);

  // The memory is reused (grace 0): the test holds every free heap byte but
  // the block that held X, so the next overflow bucket is carved from it.
  ix.ReclaimExpired();
  EXPECT_EQ(c.header().limbo_tail, c.header().limbo_head);
  c.HoldAllBut(x);
  for (int i = 0; c.header().overflow_buckets < 2; ++i) {
    ASSERT_EQ(ix.Upsert("more-" + std::to_string(i), "m", 2, false, true),
              IndexWriter::Placement::kResident);
  }
  c.Release();
  const uint64_t reuse = NextBucket(c, y);
  ASSERT_NE(reuse, 0u);
  ASSERT_LT(reuse, x + g.bucket_size) << "X's memory was not reused; the test proves nothing";
  ASSERT_GT(reuse + g.bucket_size, x) << "X's memory was not reused; the test proves nothing";
  EXPECT_EQ(Decode(g, last, to_x, c.Read(to_x)).outcome, Outcome::kRetry);

  // A reader that starts again finds every key.
  for (const std::string& k : {keys[0], last}) {
    ASSERT_EQ(c.Get(k).outcome, Outcome::kFound) << k;
    EXPECT_EQ(c.found_value(), "value-" + k);
  }
  for (int i = 6; i < 12; ++i) EXPECT_EQ(c.Get(keys[i]).outcome, Outcome::kNotFound);
}

// Invariant 9: a remembered object (a client's cached location) is one READ
// and is still never stale. A replaced or deleted key's old object stays
// intact for the grace period but for its owner word, which the writer
// cleared before the slot store; so the READ of it is refused.
TEST(IndexInterleavingTest, RememberedObjectIsRefusedOnceReplacedOrDeleted) {
  OneChain c(/*bucket_size=*/64, 16, /*grace_ns=*/uint64_t{60} * 1000000000);
  const Geometry& g = c.g();
  IndexWriter& ix = c.index();
  const std::string key = "remembered";
  auto remember = [&](const std::string& want) {
    const ReadResult r = c.Get(key);
    EXPECT_EQ(r.outcome, Outcome::kFound);
    EXPECT_EQ(c.found_value(), want);
    return CachedLocation{r.slot, r.slot_word};
  };
  std::string got;
  auto read_cached = [&](const CachedLocation& loc) {
    const ReadStep st = CachedRead(g, loc);
    EXPECT_NE(st.length, 0u);
    const std::string bytes = c.Read(st);
    const ReadResult r = DecodeCached(g, key, st, bytes);
    got.assign(r.value.data(), r.value.size());
    return r.outcome;
  };

  ASSERT_EQ(ix.Upsert(key, "first", 1, false, true), IndexWriter::Placement::kResident);
  const CachedLocation first = remember("first");
  ASSERT_EQ(read_cached(first), Outcome::kFound);
  EXPECT_EQ(got, "first");

  ASSERT_EQ(ix.Upsert(key, "second", 2, true, true), IndexWriter::Placement::kResident);
  EXPECT_EQ(read_cached(first), Outcome::kRetry);
  // Only the owner word refuses it: with the word put back it would verify.
  std::string retired = c.Read(CachedRead(g, first));
  StoreU64(retired.data() + kObjectOwnerOffset, first.slot);
  absl::StatusOr<ObjectView> v = DecodeObject(g, retired);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->value, "first");
  const CachedLocation second = remember("second");
  EXPECT_EQ(second.slot, first.slot);
  EXPECT_NE(second.word, first.word);
  ASSERT_EQ(read_cached(second), Outcome::kFound);
  EXPECT_EQ(got, "second");

  ix.Remove(key, true);
  EXPECT_EQ(read_cached(second), Outcome::kRetry);
  EXPECT_EQ(c.Get(key).outcome, Outcome::kNotFound);
}

// The attack of a token holder who knows the hash seed (every client does):
// keys aimed at one home bucket. The write that would grow the chain past
// max_chain_buckets fails with ResourceExhausted before anything is written;
// deleting the keys gives every overflow bucket and heap byte back.
TEST(ChainBoundTest, CollidingKeysAreBoundedAndDeletesGiveTheSpaceBack) {
  testing::TempStore t;
  t.options.bucket_count = 1024;
  t.options.reuse_grace_us = 0;
  t.options.max_chain_buckets = 4;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  const Geometry g = s.geometry();
  ASSERT_TRUE(s.Put("bystander", "b").ok());
  ASSERT_TRUE(s.Delete("absent").ok());  // releases the retire ring
  const StoreStats start = s.stats();
  ASSERT_EQ(start.overflow_buckets, 0u);
  ASSERT_EQ(start.limbo_entries, 0u);

  // Brute force: keys whose home bucket is 7, as an attacker would.
  std::vector<std::string> aimed;
  for (uint64_t i = 0; aimed.size() < 4 * kSlotsPerBucket + 1; ++i) {
    const std::string k = "aimed-" + std::to_string(i);
    if (HashKey(g, k).bucket == 7) aimed.push_back(k);
  }
  for (size_t i = 0; i + 1 < aimed.size(); ++i) {
    ASSERT_TRUE(s.Put(aimed[i], "value-" + aimed[i]).ok()) << i;
  }
  EXPECT_EQ(s.stats().overflow_buckets, 3u);
  auto refused = s.Put(aimed.back(), "one too many");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("index chain full"), std::string::npos);
  EXPECT_NE(refused.status().message().find("max_chain_buckets 4"), std::string::npos);
  EXPECT_TRUE(absl::IsNotFound(s.Get(aimed.back()).status()));  // nothing was written
  EXPECT_EQ(s.stats().keys, start.keys + aimed.size() - 1);
  // Keys already in the chain can still be written; other chains too.
  ASSERT_TRUE(s.Put(aimed[0], "updated").ok());
  ASSERT_TRUE(s.Put("elsewhere", "e").ok());
  ASSERT_TRUE(s.Delete("elsewhere").ok());

  for (size_t i = 0; i + 1 < aimed.size(); ++i) ASSERT_TRUE(s.Delete(aimed[i]).ok()) << i;
  ASSERT_TRUE(s.Delete("absent").ok());  // releases the retire ring (grace 0)
  const StoreStats end = s.stats();
  EXPECT_EQ(end.overflow_buckets, start.overflow_buckets);
  EXPECT_EQ(end.limbo_entries, 0u);
  EXPECT_EQ(end.heap_free_bytes, start.heap_free_bytes);
  EXPECT_EQ(end.keys, start.keys);
  // And the refused key fits now.
  ASSERT_TRUE(s.Put(aimed.back(), "fits").ok());
  EXPECT_EQ(s.Get(aimed.back())->value, "fits");
  EXPECT_EQ(s.Get("bystander")->value, "b");
}

TEST(ChainBoundTest, OptionIsValidated) {
  testing::TempStore t;
  t.options.max_chain_buckets = 0;
  EXPECT_NE(t.options.Validate().message().find("max_chain_buckets"), std::string::npos);
  t.options.max_chain_buckets = kMaxChainLength + 1;
  EXPECT_FALSE(t.options.Validate().ok());
  t.options.max_chain_buckets = kMaxChainLength;
  EXPECT_TRUE(t.options.Validate().ok());
  EXPECT_EQ(StoreOptions().max_chain_buckets, 16u);
}

}  // namespace
}  // namespace kvnode::storage
