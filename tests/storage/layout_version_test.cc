// Segments of an earlier arena layout: refused by the layout check before
// Boost interprets them, and rebuilt by a cold start.
#include <gtest/gtest.h>

#include <boost/interprocess/managed_shared_memory.hpp>
#include <boost/interprocess/permissions.hpp>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvnode/storage/arena.h"
#include "kvnode/storage/store.h"
#include "test_util.h"

namespace kvnode::storage {
namespace {

namespace bip = boost::interprocess;

// Layout 1: Boost's default segment (a process-shared mutex in the allocator
// and the named-object index) with the kvnode header as its first object.
void MakeLayout1Segment(const StoreOptions& o) {
  bip::permissions perm;
  perm.set_permissions(0600);
  bip::managed_shared_memory shm(bip::create_only, o.shm_name.c_str(), o.arena_size, nullptr, perm);
  ArenaHeader* h = shm.construct<ArenaHeader>(kArenaHeaderName)();
  std::memset(static_cast<void*>(h), 0, sizeof(*h));
  h->magic = kArenaMagic;
  h->layout_version = 1;
  h->header_size = sizeof(ArenaHeader);
  h->mapping_size = o.arena_size;
}

TEST(LayoutVersionTest, SegmentOfLayout1IsRefusedAndRebuiltCold) {
  testing::TempStore t;
  MakeLayout1Segment(t.options);
  auto a = Arena::Attach(t.options.arena_options());
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(a.status())) << a.status();
  EXPECT_NE(
      a.status().message().find(absl::StrCat("layout version 1, this build uses ", kLayoutVersion)),
      std::string::npos)
      << a.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(Store::AttachLive(t.options).status()));
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRebuilt);
  ASSERT_TRUE((*s)->Put("k", "v").ok());
  ASSERT_TRUE((*s)->Close().ok());
}

// Layout 2: this build's segment, but its objects' owner words stay set
// after they are replaced, so a client's one-READ cached GET would trust
// them. Refused, and rebuilt cold.
TEST(LayoutVersionTest, SegmentOfLayout2IsRefusedAndRebuiltCold) {
  testing::TempStore t;
  {
    auto a = Arena::Create(t.options.arena_options());
    ASSERT_TRUE(a.ok()) << a.status();
    (*a)->header()->layout_version = 2;
  }
  auto a = Arena::Attach(t.options.arena_options());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(
      a.status().message().find(absl::StrCat("layout version 2, this build uses ", kLayoutVersion)),
      std::string::npos)
      << a.status();
  auto s = Store::Open(t.options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->opened_as(), Store::OpenedAs::kRebuilt);
  ASSERT_TRUE((*s)->Close().ok());
}

}  // namespace
}  // namespace kvnode::storage
