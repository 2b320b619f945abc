// Torn and reused memory: a reader that copies arena bytes without any lock
// (as a NIC's DMA does) must only ever get found (the right value of some
// version), not-found (only for keys that may be absent), retry or slow-path;
// never a wrong value.
//
// ConcurrentMemcpyReaders is a deliberate data race on raw bytes (a writer
// thread and memcpy readers, no synchronisation), which is exactly what the
// decoder must survive. It is meaningless under TSan and skipped there.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kvnode/storage/read_path.h"
#include "kvnode/storage/store.h"
#include "test_util.h"

#if defined(__SANITIZE_THREAD__)
#define KVNODE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVNODE_TSAN 1
#endif
#endif

namespace kvnode::storage {
namespace {

using Outcome = ReadResult::Outcome;

// Self-describing values: "<key>|<counter>|" then a fill derived from the
// counter up to a length derived from the counter.
constexpr size_t kLengths[] = {12, 60, 150, 700, 3000, 9000, 16000};
constexpr size_t kNumLengths = sizeof(kLengths) / sizeof(kLengths[0]);
std::string MakeValue(const std::string& key, uint64_t counter) {
  std::string v = key + "|" + std::to_string(counter) + "|";
  const size_t len = std::max(kLengths[counter % kNumLengths], v.size());
  v.resize(len, static_cast<char>('a' + counter % 26));
  return v;
}
bool ValidValue(const std::string& key, std::string_view v) {
  const size_t bar1 = v.find('|');
  if (bar1 == std::string_view::npos || v.substr(0, bar1) != key) return false;
  const size_t bar2 = v.find('|', bar1 + 1);
  if (bar2 == std::string_view::npos) return false;
  uint64_t counter = 0;
  for (char c : v.substr(bar1 + 1, bar2 - bar1 - 1)) {
    if (c < '0' || c > '9') return false;
    counter = counter * 10 + static_cast<uint64_t>(c - '0');
  }
  return v == MakeValue(key, counter);
}

TEST(TornReadTest, ConcurrentMemcpyReaders) {
#ifdef KVNODE_TSAN
  GTEST_SKIP() << "deliberate data race on raw bytes; not a TSan test";
#endif
  testing::TempStore t;
  t.options.arena_size = 1 << 20;  // small: evictions and memory reuse
  t.options.bucket_count = 16;     // short index: overflow chains
  t.options.reuse_grace_us = 0;    // reuse retired memory at once: worst case
  t.options.promote_on_get = false;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  constexpr int kKeys = 256;
  constexpr int kStable = 192;  // keys 0..191 are never deleted
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back("key-" + std::to_string(i));
    ASSERT_TRUE(s.Put(keys.back(), MakeValue(keys.back(), 0)).ok());
  }
  const Geometry g = s.geometry();
  const char* base = s.arena_base();

  std::atomic<bool> done{false};
  std::atomic<uint64_t> wrong{0}, bad_not_found{0};
  std::atomic<uint64_t> counts[5] = {};
  auto reader = [&](int seed) {
    std::vector<char> buf(kMaxObjectSize + 64);
    uint64_t x = static_cast<uint64_t>(seed) * 0x9e3779b97f4a7c15ULL + 1;
    while (!done.load(std::memory_order_relaxed)) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const int k = static_cast<int>(x % kKeys);
      ReadStep step = FirstRead(g, keys[k]);
      ReadResult r;
      for (int hop = 0; hop < 200; ++hop) {
        ASSERT_LE(step.length, buf.size());
        ASSERT_LE(step.offset + step.length, g.arena_size);
        std::memcpy(buf.data(), base + step.offset, step.length);  // no lock: a DMA
        r = Decode(g, keys[k], step, std::string_view(buf.data(), step.length));
        if (r.outcome != Outcome::kNext) break;
        step = r.next;
      }
      counts[static_cast<int>(r.outcome)].fetch_add(1, std::memory_order_relaxed);
      if (r.outcome == Outcome::kFound && !ValidValue(keys[k], r.value)) wrong++;
      if (r.outcome == Outcome::kNotFound && k < kStable) bad_not_found++;
    }
  };
  std::thread r1(reader, 1), r2(reader, 2);
  uint64_t counter = 1;
  for (int op = 0; op < 12000; ++op, ++counter) {
    const int k = static_cast<int>((counter * 7919) % kKeys);
    if (k >= kStable && op % 5 == 0) {
      ASSERT_TRUE(s.Delete(keys[k]).ok());
    } else {
      ASSERT_TRUE(s.Put(keys[k], MakeValue(keys[k], counter)).ok());
    }
  }
  done = true;
  r1.join();
  r2.join();
  const StoreStats st = s.stats();
  std::printf("found %lu not-found %lu retry %lu slow-path %lu; evictions %lu\n", counts[0].load(),
              counts[1].load(), counts[2].load(), counts[4].load(), st.evictions);
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(bad_not_found.load(), 0u);
  EXPECT_GT(counts[0].load(), 0u);
  // Every key still reads correctly through the store.
  EXPECT_GT(st.evictions, 0u);
  for (int i = 0; i < kStable; ++i) {
    auto got = s.Get(keys[i]);
    ASSERT_TRUE(got.ok()) << keys[i] << ": " << got.status();
    EXPECT_TRUE(ValidValue(keys[i], got->value));
  }
}

// Deterministic tearing: for a write that changes key K from v1 to v2 (and for
// memory reused by another key afterwards), build every reader view that mixes
// the "before" and "after" images of the bucket at every byte, and of the
// object at every 8-byte word, and decode them all.
class Images {
 public:
  explicit Images(const Store& s) : base_(s.arena_base()), size_(s.arena_size()) {}
  std::string Snap() const { return std::string(base_, size_); }

 private:
  const char* base_;
  uint64_t size_;
};

struct Verdicts {
  uint64_t found = 0, not_found = 0, retry = 0, slow = 0, wrong = 0;
};

// Decodes `key` starting at `step` where every READ is served by `fetch`.
template <typename Fetch>
ReadResult Walk(const Geometry& g, const std::string& key, ReadStep step, Fetch&& fetch,
                std::string* holder) {
  ReadResult r;
  for (int hop = 0; hop < 100; ++hop) {
    *holder = fetch(step, hop);
    r = Decode(g, key, step, *holder);
    if (r.outcome != Outcome::kNext) return r;
    step = r.next;
  }
  return r;
}

void TearAll(const Geometry& g, const std::string& key, const std::string& a, const std::string& b,
             const std::vector<std::string>& allowed, bool may_be_absent, Verdicts* v) {
  auto account = [&](const ReadResult& r) {
    switch (r.outcome) {
      case Outcome::kFound: {
        ++v->found;
        bool ok = false;
        for (const std::string& s : allowed) ok |= (r.value == s);
        if (!ok) ++v->wrong;
        break;
      }
      case Outcome::kNotFound:
        ++v->not_found;
        if (!may_be_absent) ++v->wrong;
        break;
      case Outcome::kRetry:
        ++v->retry;
        break;
      default:
        ++v->slow;
    }
  };
  const ReadStep first = FirstRead(g, key);
  for (int order = 0; order < 2; ++order) {
    const std::string& lo = order == 0 ? a : b;
    const std::string& hi = order == 0 ? b : a;
    for (uint32_t cut = 0; cut <= first.length; ++cut) {
      auto torn = [&](const ReadStep& st) {
        std::string out = hi.substr(st.offset, st.length);
        std::memcpy(out.data(), lo.data() + st.offset, std::min<uint64_t>(cut, st.length));
        return out;
      };
      // Object reads: whole "before", whole "after", or torn at each word.
      std::string holder;
      ReadResult r = Walk(
          g, key, first,
          [&](const ReadStep& st, int hop) {
            return hop == 0 ? torn(st) : lo.substr(st.offset, st.length);
          },
          &holder);
      account(r);
      r = Walk(
          g, key, first,
          [&](const ReadStep& st, int hop) {
            return hop == 0 ? torn(st) : hi.substr(st.offset, st.length);
          },
          &holder);
      account(r);
      if (cut % 32 == 0) {
        for (uint32_t ocut = 0; ocut < 4096; ocut += 8) {
          r = Walk(
              g, key, first,
              [&](const ReadStep& st, int hop) {
                if (hop == 0) return torn(st);
                std::string out = hi.substr(st.offset, st.length);
                std::memcpy(out.data(), lo.data() + st.offset, std::min<uint64_t>(ocut, st.length));
                return out;
              },
              &holder);
          account(r);
        }
      }
    }
  }
}

class DeterministicTearTest : public ::testing::TestWithParam<std::pair<size_t, size_t>> {};

TEST_P(DeterministicTearTest, EveryTornViewIsSafe) {
  const auto [len1, len2] = GetParam();
  testing::TempStore t;
  t.options.reuse_grace_us = 0;
  t.options.bucket_count = 64;
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  const Geometry g = s.geometry();
  Images img(s);
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(s.Put("filler-" + std::to_string(i), std::string(40 + i % 300, 'f')).ok());
  }
  const std::string key = "the-key";
  const std::string v1(len1, '1'), v2(len2, '2');
  ASSERT_TRUE(s.Put(key, v1).ok());
  const std::string before = img.Snap();
  ASSERT_TRUE(s.Put(key, v2).ok());
  const std::string after = img.Snap();
  // Memory of v1 reused: other keys written with grace 0.
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(s.Put("reuser-" + std::to_string(i), std::string(len1, 'r')).ok());
  }
  const std::string reused = img.Snap();
  ASSERT_TRUE(s.Delete(key).ok());
  ASSERT_TRUE(s.Put("reuser-x", std::string(len2, 'x')).ok());
  const std::string deleted = img.Snap();

  Verdicts v;
  TearAll(g, key, before, after, {v1, v2}, false, &v);
  TearAll(g, key, before, reused, {v1, v2}, false, &v);
  TearAll(g, key, after, deleted, {v2}, true, &v);
  std::printf("found %lu not-found %lu retry %lu slow %lu\n", v.found, v.not_found, v.retry,
              v.slow);
  EXPECT_EQ(v.wrong, 0u);
  EXPECT_GT(v.found, 0u);
  EXPECT_GT(v.retry, 0u);
}

INSTANTIATE_TEST_SUITE_P(Sizes, DeterministicTearTest,
                         ::testing::Values(std::make_pair(10, 20),      // inline -> inline
                                           std::make_pair(1000, 2000),  // heap -> heap
                                           std::make_pair(10, 1500),    // inline -> heap
                                           std::make_pair(1500, 10)));  // heap -> inline

// Arbitrary corruption: flip every byte of every READ of an existing key;
// the decoder must not crash and must never return a value other than the
// stored one.
TEST(CorruptionTest, EveryFlippedByteIsSafe) {
  testing::TempStore t;
  t.options.bucket_count = 4;  // overflow chains
  auto store = Store::Open(t.options);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  const Geometry g = s.geometry();
  std::vector<std::pair<std::string, std::string>> kv;
  for (int i = 0; i < 60; ++i) {
    kv.emplace_back("k" + std::to_string(i), std::string(i % 2 ? 30 : 900, 'a' + i % 26));
    ASSERT_TRUE(s.Put(kv.back().first, kv.back().second).ok());
  }
  const std::string image(s.arena_base(), s.arena_size());
  uint64_t found = 0, wrong = 0, other = 0;
  for (const auto& [key, value] : kv) {
    // Record the clean path of READs.
    std::vector<ReadStep> path;
    ReadStep step = FirstRead(g, key);
    for (;;) {
      path.push_back(step);
      ReadResult r = Decode(g, key, step, std::string_view(image).substr(step.offset, step.length));
      if (r.outcome != Outcome::kNext) {
        ASSERT_EQ(r.outcome, Outcome::kFound) << key;
        break;
      }
      step = r.next;
    }
    for (size_t which = 0; which < path.size(); ++which) {
      for (uint32_t i = 0; i < path[which].length; ++i) {
        for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
          ReadStep st = FirstRead(g, key);
          ReadResult r;
          std::string buf;
          for (int hop = 0; hop < 100; ++hop) {
            buf = image.substr(st.offset, st.length);
            if (hop == static_cast<int>(which) && st.offset == path[which].offset) {
              buf[i] = static_cast<char>(buf[i] ^ mask);
            }
            r = Decode(g, key, st, buf);
            if (r.outcome != Outcome::kNext) break;
            st = r.next;
          }
          if (r.outcome == Outcome::kFound) {
            ++found;
            if (r.value != value) ++wrong;
          } else {
            ++other;
          }
        }
      }
    }
  }
  std::printf("found %lu other %lu\n", found, other);
  EXPECT_EQ(wrong, 0u);
  EXPECT_GT(other, 0u);
}

}  // namespace
}  // namespace kvnode::storage
