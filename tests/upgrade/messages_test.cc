#include "kvnode/upgrade/messages.h"

#include <gtest/gtest.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "test_util.h"

namespace kvnode::upgrade {
namespace {

using testing::AllSampleMessages;
using testing::SampleCounters;
using testing::SampleSessions;

std::string Frame(const HandoffMessage& m) {
  std::string f;
  EXPECT_TRUE(EncodeHandoff(m, &f).ok());
  return f;
}

// Re-frames `payload` with a header claiming exactly its size.
std::string Reframe(const std::string& frame, const std::string& payload, uint16_t version = 0) {
  std::string out = frame.substr(0, kHandoffFrameHeaderSize);
  const uint32_t n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) out[8 + i] = static_cast<char>(n >> (8 * i));
  if (version != 0) {
    out[4] = static_cast<char>(version);
    out[5] = static_cast<char>(version >> 8);
  }
  return out + payload;
}

TEST(HandoffMessages, EveryMessageRoundTrips) {
  for (const HandoffMessage& m : AllSampleMessages()) {
    const std::string f = Frame(m);
    absl::StatusOr<HandoffMessage> d = DecodeHandoff(AsBytes(f));
    ASSERT_TRUE(d.ok()) << HandoffTypeName(static_cast<uint16_t>(TypeOf(m))) << ": " << d.status();
    EXPECT_TRUE(*d == m) << HandoffTypeName(static_cast<uint16_t>(TypeOf(m)));
  }
}

TEST(HandoffMessages, EveryTruncationIsAnError) {
  for (const HandoffMessage& m : AllSampleMessages()) {
    const std::string f = Frame(m);
    const std::string name = HandoffTypeName(static_cast<uint16_t>(TypeOf(m)));
    // The frame cut anywhere.
    for (size_t n = 0; n < f.size(); ++n) {
      absl::StatusOr<HandoffMessage> d = DecodeHandoff(AsBytes(std::string_view(f).substr(0, n)));
      EXPECT_TRUE(absl::IsDataLoss(d.status())) << name << " cut at " << n << ": " << d.status();
    }
    // The payload cut, with a header that agrees with the cut (so the
    // message decoder itself must notice).
    const std::string payload = f.substr(kHandoffFrameHeaderSize);
    for (size_t n = 0; n < payload.size(); ++n) {
      absl::StatusOr<HandoffMessage> d = DecodeHandoff(AsBytes(Reframe(f, payload.substr(0, n))));
      EXPECT_FALSE(d.ok()) << name << " payload cut at " << n;
    }
    // Trailing bytes, inside the payload and after the frame.
    EXPECT_TRUE(absl::IsDataLoss(DecodeHandoff(AsBytes(Reframe(f, payload + "x"))).status()));
    EXPECT_TRUE(absl::IsDataLoss(DecodeHandoff(AsBytes(f + "x")).status()));
  }
}

TEST(HandoffMessages, FrameHeaderChecks) {
  const std::string f = Frame(Owned{1, 2});
  std::string bad = f;
  bad[0] = 'X';
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeHandoff(AsBytes(bad)).status()));
  bad = f;
  bad[6] = 99;  // type
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeHandoff(AsBytes(bad)).status()));
  // Oversized payload rejected from the header alone.
  std::string head = f.substr(0, kHandoffFrameHeaderSize);
  const uint32_t huge = static_cast<uint32_t>(kMaxHandoffPayloadSize + 1);
  for (int i = 0; i < 4; ++i) head[8 + i] = static_cast<char>(huge >> (8 * i));
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeHandoffFrameHeader(AsBytes(head)).status()));
}

TEST(HandoffMessages, OtherVersionsRefusedExceptAbort) {
  const std::string owned = Frame(Owned{1, 2});
  const uint16_t other = kHandoffProtocolVersion + 1;
  absl::StatusOr<HandoffMessage> d =
      DecodeHandoff(AsBytes(Reframe(owned, owned.substr(kHandoffFrameHeaderSize), other)));
  EXPECT_TRUE(absl::IsFailedPrecondition(d.status())) << d.status();
  EXPECT_NE(d.status().message().find(absl::StrCat("version ", other)), std::string_view::npos);

  const Abort a{1, "arena_layout_version: expected 1, found 1001"};
  const std::string abort = Frame(a);
  d = DecodeHandoff(AsBytes(Reframe(abort, abort.substr(kHandoffFrameHeaderSize), 1001)));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(std::get<Abort>(*d) == a);
}

TEST(HandoffMessages, EncodersRefuseWhatDecodersWould) {
  std::string f;
  EXPECT_FALSE(EncodeHandoff(Hello{kHandoffProtocolVersion, 0, 1, 0, ""}, &f).ok());  // pid 0
  EXPECT_FALSE(EncodeHandoff(Hello{7, 1, 1, 0, ""}, &f).ok());
  EXPECT_FALSE(
      EncodeHandoff(Hello{kHandoffProtocolVersion, 1, 1, 0, std::string(kMaxBuildIdSize + 1, 'b')},
                    &f)
          .ok());
  EXPECT_FALSE(EncodeHandoff(Ready{1, 0, 0, 0, 2}, &f).ok());
  EXPECT_FALSE(
      EncodeHandoff(HandOver{1, {FdRole::kListenTcp, FdRole::kListenTcp}, {}, {}}, &f).ok());
  EXPECT_FALSE(EncodeHandoff(HandOver{1, {static_cast<FdRole>(9)}, {}, {}}, &f).ok());
  SessionTable dup = SampleSessions(2, 1);
  dup.sessions[1].client_id = dup.sessions[0].client_id;
  EXPECT_FALSE(EncodeHandoff(HandOver{1, {}, dup, {}}, &f).ok());
  SessionTable zero = SampleSessions(1, 1);
  zero.sessions[0].client_id = 0;
  EXPECT_FALSE(EncodeHandoff(HandOver{1, {}, zero, {}}, &f).ok());
  EXPECT_FALSE(
      EncodeHandoff(HandOver{1, {}, SampleSessions(1, kMaxDedupeWindow + 1), {}}, &f).ok());
  EXPECT_FALSE(EncodeHandoff(HandOver{1, {}, {}, {}, 0, 0, {5, 0}}, &f).ok());
  EXPECT_FALSE(EncodeHandoff(HandOver{1, {}, {}, {}, 0, 0, {5, 6, 5}}, &f).ok());
  EXPECT_FALSE(EncodeHandoff(Gone{0, 0, CounterSnapshot{{{"a", 1}, {"a", 2}}}}, &f).ok());
  EXPECT_FALSE(EncodeHandoff(Gone{0, 0, CounterSnapshot{{{"", 1}}}}, &f).ok());
  EXPECT_FALSE(EncodeHandoff(Owned{1, 0}, &f).ok());
  EXPECT_FALSE(EncodeHandoff(Abort{1, std::string(kMaxAbortMessageSize + 1, 'x')}, &f).ok());
  EXPECT_TRUE(f.empty()) << "a refused message must append nothing";
}

TEST(HandoffMessages, DecoderRefusesDuplicatesAndLies) {
  // Patch an encoded HandOver so that the second client id equals the first.
  HandOver h{1, {}, SampleSessions(2, 0), {}};
  std::string f = Frame(h);
  // payload: u64 gen, u8 nfds, u32 chunks, u64 next, u32 count,
  // [u64 id, 16 secret, u64 hi, u32 n] x2
  const size_t first = kHandoffFrameHeaderSize + 8 + 1 + 4 + 8 + 4;
  const size_t second = first + 36;
  f.replace(second, 8, f.substr(first, 8));
  absl::StatusOr<HandoffMessage> d = DecodeHandoff(AsBytes(f));
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();

  // HandOver's client ids: one listed twice, and a count the bytes behind it
  // cannot back (the ids are the payload's last field).
  h = HandOver{1, {}, {}, {}, 0, 0, {5, 6}};
  f = Frame(h);
  f.replace(f.size() - 8, 8, f.substr(f.size() - 16, 8));
  d = DecodeHandoff(AsBytes(f));
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  f = Frame(h);
  f[f.size() - 16 - 4 + 2] = '\x01';  // 2 -> 65538 ids
  d = DecodeHandoff(AsBytes(f));
  EXPECT_TRUE(absl::IsDataLoss(d.status())) << d.status();

  // A session count of 2^32-1 with no bytes behind it: refused as truncation,
  // without reserving for it.
  std::string table;
  ASSERT_TRUE(EncodeSessionTable(SessionTable{5, {}}, &table).ok());
  for (int i = 8; i < 12; ++i) table[i] = '\xff';
  EXPECT_TRUE(absl::IsDataLoss(DecodeSessionTable(AsBytes(table)).status()));

  // A window count beyond the limit.
  std::string one;
  ASSERT_TRUE(EncodeSessionTable(SampleSessions(1, 0), &one).ok());
  const uint32_t big = kMaxDedupeWindow + 1;
  for (int i = 0; i < 4; ++i) one[12 + 8 + 16 + 8 + i] = static_cast<char>(big >> (8 * i));
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeSessionTable(AsBytes(one)).status()));

  // Counter names: duplicate and too many.
  std::string c;
  ASSERT_TRUE(EncodeCounters(CounterSnapshot{{{"a", 1}, {"b", 2}}}, &c).ok());
  c[4 + 2] = 'b';  // first name "a" -> "b"
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeCounters(AsBytes(c)).status()));
  std::string many = "\xff\xff\xff\xff";
  EXPECT_FALSE(DecodeCounters(AsBytes(many)).ok());
}

// kCapClusterLease: a HandOver without a lease is the bytes builds without
// the capability send and read; with one, a flag in the n_fds byte and the
// lease after the client ids, which a build without the capability refuses
// (it never gets one: O requires the capability in the header first).
TEST(HandoffMessages, ClusterLeaseIsAFlaggedTail) {
  HandOver plain{8, {FdRole::kListenTcp, FdRole::kAdminSocket}, {}, {}, 2, 9, {4, 5}};
  HandOver leased = plain;
  leased.cluster_lease = 0x694d8a1b2c3d4e5fLL;
  const std::string p = Frame(plain);
  const std::string l = Frame(leased);
  const size_t n_fds = kHandoffFrameHeaderSize + 8;
  // The layout of handoff 4 before the capability: u8 n_fds = 2, no tail.
  EXPECT_EQ(p[n_fds], '\x02');
  EXPECT_EQ(p.size(), kHandoffFrameHeaderSize + 8 + 1 + 2 + 4 + 8 + 12 + 4 + 4 + 16);
  ASSERT_EQ(l.size(), p.size() + 8);
  EXPECT_EQ(static_cast<uint8_t>(l[n_fds]), 0x82);
  std::string untagged = l.substr(kHandoffFrameHeaderSize, l.size() - kHandoffFrameHeaderSize - 8);
  untagged[8] = '\x02';
  EXPECT_EQ(untagged, p.substr(kHandoffFrameHeaderSize)) << "only the flag and the tail differ";
  absl::StatusOr<HandoffMessage> d = DecodeHandoff(AsBytes(l));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(std::get<HandOver>(*d).cluster_lease, leased.cluster_lease);

  // The flag without the lease behind it, the lease without the flag.
  std::string bad = l.substr(kHandoffFrameHeaderSize);
  EXPECT_TRUE(
      absl::IsDataLoss(DecodeHandoff(AsBytes(Reframe(l, bad.substr(0, bad.size() - 8)))).status()));
  bad[8] = '\x02';
  EXPECT_TRUE(absl::IsDataLoss(DecodeHandoff(AsBytes(Reframe(l, bad))).status()));
  // A lease of 0 or less behind the flag, unknown flags.
  bad = l.substr(kHandoffFrameHeaderSize);
  bad.replace(bad.size() - 8, 8, std::string(8, '\0'));
  d = DecodeHandoff(AsBytes(Reframe(l, bad)));
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  bad.replace(bad.size() - 8, 8, std::string(8, '\xff'));
  d = DecodeHandoff(AsBytes(Reframe(l, bad)));
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  bad = p.substr(kHandoffFrameHeaderSize);
  bad[8] = '\x42';
  d = DecodeHandoff(AsBytes(Reframe(p, bad)));
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  EXPECT_NE(d.status().message().find("unknown flags"), std::string_view::npos) << d.status();

  std::string f;
  leased.cluster_lease = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeHandoff(leased, &f)));
  EXPECT_TRUE(f.empty());
}

TEST(HandoffMessages, PlainStructCodecsRoundTrip) {
  const SessionTable t = SampleSessions(5, 1024);
  std::string b;
  ASSERT_TRUE(EncodeSessionTable(t, &b).ok());
  EXPECT_EQ(b.size(), 12u + 5 * (36 + 1024 * 18));
  absl::StatusOr<SessionTable> t2 = DecodeSessionTable(AsBytes(b));
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_TRUE(*t2 == t);

  const CounterSnapshot c = SampleCounters();
  std::string cb;
  ASSERT_TRUE(EncodeCounters(c, &cb).ok());
  absl::StatusOr<CounterSnapshot> c2 = DecodeCounters(AsBytes(cb));
  ASSERT_TRUE(c2.ok()) << c2.status();
  EXPECT_TRUE(*c2 == c);
}

// Random corruption never crashes the decoder and never reads out of bounds
// (run under ASan to make the second half of that claim).
// The frame has no checksum (the channel is a local socketpair): a flipped
// byte in a value field decodes to another valid message. Every corruption
// must therefore end one of two ways: rejected with one of the decoder's
// error kinds and a message that says it was the handoff, or accepted as a
// message whose encoding is exactly the corrupted bytes (nothing accepted
// that the encoder would not have produced). Header fields each have one
// answer.
TEST(HandoffMessages, CorruptedFramesAreErrorsNotCrashes) {
  std::mt19937_64 rng(12345);
  size_t rejected = 0;
  size_t accepted = 0;
  for (const HandoffMessage& m : AllSampleMessages()) {
    const std::string f = Frame(m);
    const std::string name = HandoffTypeName(static_cast<uint16_t>(TypeOf(m)));
    ASSERT_GT(f.size(), kHandoffFrameHeaderSize) << name;

    std::string g = f;
    g[0] = static_cast<char>(g[0] ^ 0x5a);
    absl::Status s = DecodeHandoff(AsBytes(g)).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << name << " bad magic: " << s;
    EXPECT_NE(s.message().find("bad frame magic"), std::string::npos) << s;

    g = f;
    g[6] = g[7] = static_cast<char>(0xff);  // type 0xffff
    s = DecodeHandoff(AsBytes(g)).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << name << " unknown type: " << s;
    EXPECT_NE(s.message().find("unknown message type 65535"), std::string::npos) << s;

    g = f;
    g[4] = static_cast<char>(g[4] + 1);  // the next protocol version
    s = DecodeHandoff(AsBytes(g)).status();
    if (std::holds_alternative<Abort>(m)) {
      EXPECT_TRUE(s.ok()) << "Abort is accepted at any version: " << s;
    } else {
      EXPECT_TRUE(absl::IsFailedPrecondition(s)) << name << " other version: " << s;
    }

    g = f;
    g[8] = static_cast<char>(g[8] + 1);  // payload size one more than sent
    s = DecodeHandoff(AsBytes(g)).status();
    EXPECT_TRUE(absl::IsDataLoss(s)) << name << " payload size: " << s;

    // Random flips in the payload.
    for (int round = 0; round < 500; ++round) {
      g = f;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < flips; ++i) {
        const size_t at = kHandoffFrameHeaderSize + rng() % (f.size() - kHandoffFrameHeaderSize);
        g[at] = static_cast<char>(rng());
      }
      absl::StatusOr<HandoffMessage> d = DecodeHandoff(AsBytes(g));
      if (d.ok()) {
        ++accepted;
        std::string again;
        ASSERT_TRUE(EncodeHandoff(*d, &again).ok()) << name << " round " << round;
        EXPECT_EQ(again, g) << name << " round " << round << ": accepted a non-canonical frame";
      } else {
        ++rejected;
        EXPECT_TRUE(absl::IsDataLoss(d.status()) || absl::IsInvalidArgument(d.status()))
            << name << " round " << round << ": " << d.status();
        EXPECT_EQ(d.status().message().substr(0, 9), "handoff: ") << d.status();
      }
    }
  }
  // Both outcomes happened: the loop tested something either way.
  EXPECT_GT(rejected, 100u);
  EXPECT_GT(accepted, 0u);
}

}  // namespace
}  // namespace kvnode::upgrade
