// The slot-words table (Arena::EnsureSlotWords, docs/format.md "Slot
// words"): made by the writer only, zeroed, 8-byte aligned, and kept with
// the arena by a reattach, a recovery and a live upgrade's attach; an arena
// made without it gets it from its next writer, and nothing else moves.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kvnode/storage/arena.h"
#include "kvnode/storage/store.h"
#include "test_util.h"

namespace kvnode::storage {
namespace {

using testing::TempStore;

std::string Key(int i) { return "key-" + std::to_string(i); }
std::string Value(int i) { return "value-" + std::to_string(i) + std::string(i % 40 * 9, 'v'); }

void Fill(Store& s, int n) {
  for (int i = 0; i < n; ++i) ASSERT_TRUE(s.Put(Key(i), Value(i)).ok());
}
void ExpectAll(Store& s, int n) {
  for (int i = 0; i < n; ++i) {
    auto g = s.Get(Key(i));
    ASSERT_TRUE(g.ok()) << Key(i) << ": " << g.status();
    EXPECT_EQ(g->value, Value(i));
    EXPECT_TRUE(g->from_arena) << Key(i);
  }
}

uint8_t* Words(const Store& s) {
  return reinterpret_cast<uint8_t*>(s.arena_base() + s.arena().slot_words_offset());
}

// Bytes of the table that are not 0 (a fresh table has none).
uint64_t NonZero(const Store& s) {
  uint64_t n = 0;
  for (uint64_t i = 0; i < kSlotWordsBytes; ++i) n += Words(s)[i] != 0;
  return n;
}

TEST(SlotWordsTest, ASingleNodesArenaHasNone) {
  TempStore t;
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->arena().slot_words_offset(), 0u);
}

TEST(SlotWordsTest, MadeZeroedAndAlignedAndKeptByReattachAndRecovery) {
  TempStore t;
  uint64_t off = 0;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    Fill(**s, 300);
    absl::StatusOr<uint64_t> made = (*s)->EnsureSlotWords();
    ASSERT_TRUE(made.ok()) << made.status();
    off = *made;
    EXPECT_NE(off, 0u);
    EXPECT_EQ(off % 8, 0u);
    EXPECT_LE(off + kSlotWordsBytes, (*s)->arena_size());
    EXPECT_EQ((*s)->arena().slot_words_offset(), off);
    EXPECT_EQ(NonZero(**s), 0u);
    EXPECT_FALSE((*s)->arena().HeapMayBeTorn());
    // Made once: asked again, the same table.
    EXPECT_EQ(*(*s)->EnsureSlotWords(), off);
    ExpectAll(**s, 300);  // nothing the index had moved
    Words(**s)[7] = 1;
    Words(**s)[kSlotWordsBytes - 1] = 1;
    // Writes after it go on as before (the heap allocates around it).
    ASSERT_TRUE((*s)->Put(Key(1000), Value(1000)).ok());
    ASSERT_TRUE((*s)->Close().ok());
  }
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kReattached) << (*s)->open_reason();
    EXPECT_EQ((*s)->arena().slot_words_offset(), off);
    EXPECT_EQ(Words(**s)[7], 1);
    EXPECT_EQ(Words(**s)[kSlotWordsBytes - 1], 1);
    EXPECT_EQ(NonZero(**s), 2u);
    EXPECT_EQ(*(*s)->EnsureSlotWords(), off);
    ExpectAll(**s, 300);
    // No Close(): as if the process died.
  }
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRecovered) << (*s)->open_reason();
  EXPECT_EQ((*s)->arena().slot_words_offset(), off);
  EXPECT_EQ(NonZero(**s), 2u);
}

// An arena kept by a restart of a build without the table (here: a store
// that never asked for it) gets it from the next writer that does, in
// place: reattached, not rebuilt, every key still read from the arena.
TEST(SlotWordsTest, AReattachedArenaWithoutOneGetsItFromItsWriter) {
  TempStore t;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    Fill(**s, 300);
    ASSERT_TRUE((*s)->Close().ok());
  }
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ((*s)->opened_as(), Store::OpenedAs::kReattached) << (*s)->open_reason();
  EXPECT_EQ((*s)->arena().slot_words_offset(), 0u);
  absl::StatusOr<uint64_t> off = (*s)->EnsureSlotWords();
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_NE(*off, 0u);
  EXPECT_EQ(NonZero(**s), 0u);
  ExpectAll(**s, 300);
  ASSERT_TRUE((*s)->Put(Key(1), "after").ok());
  EXPECT_EQ((*s)->Get(Key(1))->value, "after");
}

// A rebuild makes a new arena: no table until its writer asks for one.
TEST(SlotWordsTest, ARebuiltArenaStartsWithout) {
  TempStore t;
  {
    auto s = Store::Open(t.options);
    ASSERT_TRUE(s.ok()) << s.status();
    Fill(**s, 10);
    ASSERT_TRUE((*s)->EnsureSlotWords().ok());
    ASSERT_TRUE((*s)->Close().ok());
  }
  auto s = testing::OpenFromRocksDbAlone(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->arena().slot_words_offset(), 0u);
}

// A live upgrade: the new process finds the old one's table at attach.
// From an old process whose arena has none (a build without it), the new
// one cannot make it before it is the writer, and makes it once it is.
TEST(SlotWordsTest, LiveAttachFindsItAndOnlyTheWriterMakesIt) {
  TempStore t;
  {
    auto old_s = Store::Open(t.options);
    ASSERT_TRUE(old_s.ok()) << old_s.status();
    Fill(**old_s, 200);
    const uint64_t off = *(*old_s)->EnsureSlotWords();
    Words(**old_s)[4095] = 1;
    auto new_s = Store::AttachLive(t.options);
    ASSERT_TRUE(new_s.ok()) << new_s.status();
    EXPECT_EQ((*new_s)->arena().slot_words_offset(), off);
    EXPECT_EQ(Words(**new_s)[4095], 1);
    EXPECT_TRUE(absl::IsFailedPrecondition((*new_s)->EnsureSlotWords().status()));
    ASSERT_TRUE((*old_s)->Close().ok());
  }
  TempStore u;
  auto old_s = Store::Open(u.options);
  ASSERT_TRUE(old_s.ok()) << old_s.status();
  Fill(**old_s, 200);
  auto new_s = Store::AttachLive(u.options);
  ASSERT_TRUE(new_s.ok()) << new_s.status();
  Store& n = **new_s;
  EXPECT_EQ(n.arena().slot_words_offset(), 0u);
  EXPECT_TRUE(absl::IsFailedPrecondition(n.EnsureSlotWords().status()));
  ASSERT_TRUE((*old_s)->CloseDbForHandoff().ok());
  ASSERT_TRUE(n.OpenDb().ok());
  absl::StatusOr<uint64_t> off = n.EnsureSlotWords();
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_NE(*off, 0u);
  EXPECT_EQ(NonZero(n), 0u);
  ExpectAll(n, 200);
  old_s->reset();
  ASSERT_TRUE(n.Close().ok());
  new_s->reset();
  auto again = Store::Open(u.options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->opened_as(), Store::OpenedAs::kReattached);
  EXPECT_EQ((*again)->arena().slot_words_offset(), *off);
}

}  // namespace
}  // namespace kvnode::storage
