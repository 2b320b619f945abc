#include "kvnode/upgrade/header.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvnode/upgrade/messages.h"

namespace kvnode::upgrade {
namespace {

Compat Mine() {
  Compat c;
  c.arena_layout_version = 1;
  c.sizeof_arena_header = 232;
  c.sizeof_limbo_entry = 32;
  return c;
}

HandoffHeader Sample() {
  HandoffHeader h = HandoffHeader::For(Mine());
  h.arena_shm_name = "kvnode-test";
  h.arena_size = 64 << 20;
  h.arena_id = 0x1122334455667788ULL;
  h.generation = 7;
  h.build_id = "build-a";
  h.created_unix_ns = 1700000000000000000ULL;
  return h;
}

std::string UniqueName() { return "kvupgrade-test-" + std::to_string(getpid()); }

TEST(HandoffHeader, RoundTripAndCompatible) {
  absl::StatusOr<std::string> b = EncodeHandoffHeader(Sample());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->size(), kHandoffHeaderSize);
  absl::StatusOr<HandoffHeader> h = DecodeHandoffHeader(AsBytes(*b));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(*h == Sample());
  EXPECT_TRUE(CheckCompatibility(*h, Mine(), {getpid(), "kvnode-test", 64 << 20}).empty());
}

// Each field, changed alone, gives exactly one mismatch that names it with
// expected (this binary) and found (the header) values.
TEST(HandoffHeader, EveryCompatFieldExplained) {
  struct Case {
    std::string field;
    std::function<void(HandoffHeader&)> change;
    std::string expected, found;
  };
  const std::vector<Case> cases = {
      {"handoff_protocol_version",
       [](HandoffHeader& h) { h.handoff_protocol_version = kHandoffProtocolVersion + 1; },
       std::to_string(kHandoffProtocolVersion), std::to_string(kHandoffProtocolVersion + 1)},
      {"arena_layout_version", [](HandoffHeader& h) { h.arena_layout_version = 3; }, "1", "3"},
      {"sizeof_arena_header", [](HandoffHeader& h) { h.sizeof_arena_header = 240; }, "232", "240"},
      {"sizeof_limbo_entry", [](HandoffHeader& h) { h.sizeof_limbo_entry = 40; }, "32", "40"},
      {"required_capabilities",
       [](HandoffHeader& h) { h.required_capabilities |= uint64_t{1} << 40; }, "a subset of 0xf",
       "0x10000000003 (missing 0x10000000000)"},
      {"o_pid", [](HandoffHeader& h) { h.o_pid = 1; }, std::to_string(getpid()), "1"},
      {"arena_shm_name", [](HandoffHeader& h) { h.arena_shm_name = "other"; }, "kvnode-test",
       "other"},
      {"arena_size", [](HandoffHeader& h) { h.arena_size = 1 << 20; }, "67108864", "1048576"},
  };
  for (const Case& c : cases) {
    HandoffHeader h = Sample();
    c.change(h);
    // Through the bytes, as N would see it.
    absl::StatusOr<std::string> b = EncodeHandoffHeader(h);
    ASSERT_TRUE(b.ok());
    absl::StatusOr<HandoffHeader> d = DecodeHandoffHeader(AsBytes(*b));
    ASSERT_TRUE(d.ok()) << d.status();
    const std::vector<Mismatch> m =
        CheckCompatibility(*d, Mine(), {getpid(), "kvnode-test", 64 << 20});
    ASSERT_EQ(m.size(), 1u) << c.field;
    EXPECT_EQ(m[0].field, c.field);
    EXPECT_EQ(m[0].expected, c.expected) << c.field;
    EXPECT_EQ(m[0].found, c.found) << c.field;
  }
  // Unchecked expectations stay unchecked.
  HandoffHeader h = Sample();
  h.o_pid = 1;
  EXPECT_TRUE(CheckCompatibility(h, Mine(), {}).empty());
}

// kCapClusterLease: a cluster member's O requires it, so that a build
// without it (as N) refuses before anything is disturbed instead of dropping
// the lease; a single node's O does not, and such a build takes over as
// before.
TEST(HandoffHeader, ClusterLeaseRequiredOnlyOfClusterMembers) {
  Compat before_lease = Mine();
  before_lease.supported_capabilities = kCapSessionTable | kCapCounters | kCapMrImport;
  HandoffHeader single = Sample();
  EXPECT_TRUE(CheckCompatibility(single, before_lease, {}).empty());
  HandoffHeader member = Sample();
  member.capabilities |= kCapClusterLease;
  member.required_capabilities |= kCapClusterLease;
  const std::vector<Mismatch> m = CheckCompatibility(member, before_lease, {});
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].ToString(),
            "required_capabilities: expected a subset of 0x7, found 0xb (missing 0x8)");
  EXPECT_TRUE(CheckCompatibility(member, Mine(), {}).empty());
}

TEST(HandoffHeader, DecodeRefusesDamage) {
  const std::string good = *EncodeHandoffHeader(Sample());
  auto decode = [](const std::string& s) { return DecodeHandoffHeader(AsBytes(s)).status(); };
  std::string b = good;
  b[0] ^= 1;
  EXPECT_TRUE(absl::IsInvalidArgument(decode(b))) << decode(b);
  EXPECT_NE(decode(b).message().find("magic: expected 0x464f444e48564e4b"), std::string::npos);

  b = good;
  b[8] = 2;  // header_format
  EXPECT_TRUE(absl::IsFailedPrecondition(decode(b)));
  EXPECT_NE(decode(b).message().find("header_format: expected 1, found 2"), std::string::npos)
      << decode(b);

  b = good;
  b[12] = 0;  // header_size 1024 -> 256
  b[13] = 1;
  EXPECT_NE(decode(b).message().find("header_size: expected 1024, found 256"), std::string::npos)
      << decode(b);

  EXPECT_TRUE(absl::IsDataLoss(decode(good.substr(0, 10))));
  EXPECT_TRUE(absl::IsDataLoss(decode(good.substr(0, 600))));

  // Any flipped byte after the prefix is caught by the checksum.
  for (size_t i = 16; i < kHandoffHeaderSize; i += 7) {
    b = good;
    b[i] ^= 0x40;
    EXPECT_TRUE(absl::IsDataLoss(decode(b))) << "byte " << i << ": " << decode(b);
  }
}

TEST(HandoffHeader, EncodeRefusesLongStrings) {
  HandoffHeader h = Sample();
  h.arena_shm_name.assign(kMaxShmNameSize + 1, 'n');
  EXPECT_FALSE(EncodeHandoffHeader(h).ok());
  h = Sample();
  h.build_id.assign(kMaxBuildIdSize + 1, 'b');
  EXPECT_FALSE(EncodeHandoffHeader(h).ok());
  h.build_id.assign(kMaxBuildIdSize, 'b');
  h.arena_shm_name.assign(kMaxShmNameSize, 'n');
  absl::StatusOr<std::string> b = EncodeHandoffHeader(h);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(*DecodeHandoffHeader(AsBytes(*b)) == h);
}

TEST(HandoffHeader, ShmName) {
  EXPECT_EQ(*HandoffHeaderShmName("kvnode-arena"), "/kvnode-arena.handoff");
  EXPECT_EQ(*HandoffHeaderShmName("/kvnode-arena"), "/kvnode-arena.handoff");
  EXPECT_FALSE(HandoffHeaderShmName("").ok());
  EXPECT_FALSE(HandoffHeaderShmName("a/b").ok());
  EXPECT_FALSE(HandoffHeaderShmName(std::string(kMaxShmNameSize + 1, 'x')).ok());
}

TEST(HandoffHeader, SharedMemoryObject) {
  const std::string name = *HandoffHeaderShmName(UniqueName());
  ASSERT_TRUE(RemoveHandoffHeader(name).ok());
  EXPECT_TRUE(absl::IsNotFound(ReadHandoffHeader(name).status()));

  const mode_t old_umask = umask(0);  // the object must be 0600 regardless
  ASSERT_TRUE(WriteHandoffHeader(name, Sample()).ok());
  umask(old_umask);
  struct stat st;
  ASSERT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, geteuid());
  absl::StatusOr<HandoffHeader> h = ReadHandoffHeader(name);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(*h == Sample());

  // A stale header of ours is replaced.
  HandoffHeader next = Sample();
  next.generation = 8;
  ASSERT_TRUE(WriteHandoffHeader(name, next).ok());
  EXPECT_EQ(ReadHandoffHeader(name)->generation, 8u);

  // Group/other access: refused, naming the mode.
  ASSERT_EQ(chmod(("/dev/shm" + name).c_str(), 0644), 0);
  absl::Status s = ReadHandoffHeader(name).status();
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_NE(s.message().find("mode: expected 0600, found 0644"), std::string::npos) << s;
  ASSERT_EQ(chmod(("/dev/shm" + name).c_str(), 0600), 0);

  // Another owner: refused for reading and for replacing.
  if (geteuid() == 0) {
    ASSERT_EQ(chown(("/dev/shm" + name).c_str(), 65534, 65534), 0);
    s = ReadHandoffHeader(name).status();
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
    EXPECT_NE(s.message().find("owner uid: expected 0, found 65534"), std::string::npos) << s;
    EXPECT_TRUE(absl::IsPermissionDenied(WriteHandoffHeader(name, Sample())));
    ASSERT_EQ(chown(("/dev/shm" + name).c_str(), 0, 0), 0);
  }

  // A short object: an error, not a SIGBUS.
  ASSERT_EQ(truncate(("/dev/shm" + name).c_str(), 100), 0);
  EXPECT_TRUE(absl::IsDataLoss(ReadHandoffHeader(name).status()));

  ASSERT_TRUE(RemoveHandoffHeader(name).ok());
  ASSERT_TRUE(RemoveHandoffHeader(name).ok());  // idempotent
}

// Something the node cannot open as its own header under the header's name (a
// symbolic link here: any user can plant one, and shm_open does not follow
// it): the refusal names the file and its owner instead of an EEXIST from the
// exclusive create, and leaves it alone.
TEST(HandoffHeader, SquattedNameIsRefusedNamingFileAndOwner) {
  const std::string name = *HandoffHeaderShmName(UniqueName() + "-squat");
  const std::string path = "/dev/shm" + name;
  ASSERT_EQ(symlink("/nonexistent-kvnode-target", path.c_str()), 0) << strerror(errno);
  const absl::Status s = WriteHandoffHeader(name, Sample());
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_NE(s.message().find(path + " already exists as a symbolic link, owned by uid " +
                             std::to_string(geteuid())),
            std::string::npos)
      << s;
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the squatting object must be left alone";
  ASSERT_EQ(unlink(path.c_str()), 0);
}

// The "incompatible binary" test flag, through the object, as N would see it.
TEST(HandoffHeader, TestIncompatibilityIsRefusedWithReason) {
  const std::string name = *HandoffHeaderShmName(UniqueName() + "-incompat");
  ASSERT_TRUE(WriteHandoffHeader(name, Sample()).ok());
  const HandoffExpectations expect{getpid(), "kvnode-test", 0};
  ASSERT_TRUE(ReadAndValidateHandoffHeader(name, Mine(), expect).ok());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"layout", "arena_layout_version: expected 1001, found 1"},
      {"protocol",
       absl::StrCat("handoff_protocol_version: expected ", kHandoffProtocolVersion + 1000,
                    ", found ", kHandoffProtocolVersion)},
      {"struct", "sizeof_arena_header: expected 240, found 232"},
      {"capability", "required_capabilities"},
  };
  for (const auto& [what, text] : cases) {
    Compat n = Mine();
    ASSERT_TRUE(ApplyTestIncompatibility(what, &n).ok());
    std::vector<Mismatch> m;
    absl::StatusOr<HandoffHeader> h = ReadAndValidateHandoffHeader(name, n, expect, &m);
    if (what == "capability") {
      // N lacking bit 63 is fine while O does not require it; O requiring it is not.
      EXPECT_TRUE(h.ok());
      HandoffHeader o = Sample();
      Compat oc = Mine();
      ASSERT_TRUE(ApplyTestIncompatibility(what, &oc).ok());
      o.required_capabilities = oc.required_capabilities;
      ASSERT_TRUE(WriteHandoffHeader(name, o).ok());
      h = ReadAndValidateHandoffHeader(name, Mine(), expect, &m);
      ASSERT_TRUE(WriteHandoffHeader(name, Sample()).ok());
    }
    EXPECT_TRUE(absl::IsFailedPrecondition(h.status())) << what << ": " << h.status();
    EXPECT_NE(h.status().message().find(text), std::string::npos) << h.status();
    EXPECT_EQ(m.size(), 1u) << what;
  }
  Compat c = Mine();
  EXPECT_TRUE(absl::IsInvalidArgument(ApplyTestIncompatibility("everything", &c)));
  EXPECT_TRUE(ApplyTestIncompatibility("", &c).ok());
  ASSERT_TRUE(RemoveHandoffHeader(name).ok());
}

TEST(HandoffHeader, CompatValidate) {
  EXPECT_TRUE(Mine().Validate().ok());
  EXPECT_FALSE(Compat().Validate().ok());  // arena fields unset
}

}  // namespace
}  // namespace kvnode::upgrade
