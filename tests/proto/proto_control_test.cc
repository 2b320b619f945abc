// Control protocol codecs: round trips, every truncation, corrupted headers,
// field validation, random input.
#include <cstring>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "gtest/gtest.h"
#include "kvnode/proto/control.h"

namespace kvnode::proto {
namespace {

QpInfo SampleQp(uint32_t seed) {
  QpInfo qp;
  qp.qpn = 0x123456 ^ seed;
  qp.psn = 0xabcdef ^ seed;
  for (size_t i = 0; i < qp.gid.size(); ++i) qp.gid[i] = static_cast<uint8_t>(i * 17 + seed);
  qp.lid = static_cast<uint16_t>(0xbeef + seed);
  qp.mtu = 3;
  qp.port = 1;
  return qp;
}

ShardMap SampleMap() {
  ShardMap m = *EvenSplit("prod-1", 4096, {"a", "b", "c"});
  m.epoch = 5;
  m.nodes[1].endpoint = "10.0.0.2:7000";
  m.nodes[1].generation = 4;
  m.nodes[1].alive = true;
  return m;
}

std::vector<ControlMessage> AllMessages() {
  Hello hello;
  hello.client_id = 0x0102030405060708;
  for (size_t i = 0; i < hello.resume_secret.size(); ++i) {
    hello.resume_secret[i] = static_cast<uint8_t>(0xa0 + i);
  }
  hello.features = 0xf0;
  hello.auth_token = std::string("tok\0en", 6);
  hello.client_name = "kvload/0.1";
  Welcome welcome;
  welcome.client_id = 42;
  for (size_t i = 0; i < welcome.resume_secret.size(); ++i) {
    welcome.resume_secret[i] = static_cast<uint8_t>(0x30 + 3 * i);
  }
  welcome.server_generation = 7;
  welcome.features = 1;
  welcome.server_qp = SampleQp(1);
  welcome.rkey = 0xdeadbeef;
  welcome.arena_remote_addr = 0;
  welcome.arena_size = 1ull << 33;
  welcome.max_rpc_credits = 16;
  welcome.max_rpc_message_size = 17432;
  welcome.max_key_size = 1024;
  welcome.max_value_size = 16384;
  welcome.index_geometry = std::string("\x01\x00\x02geometry", 11);
  Move move;
  move.reason = MoveReason::kUpgrade;
  move.endpoint = "127.0.0.1:7000";
  move.new_generation = 8;
  move.deadline_ms = 5000;
  return {
      hello,
      Hello{},  // empty strings, new client
      welcome,
      ClientQp{SampleQp(2)},
      Ready{},
      Keepalive{0x1122334455667788},
      KeepaliveAck{0x1122334455667788},
      move,
      Move{MoveReason::kDrain, "[::1]:7001", 9, 0},
      MoveAck{8},
      Goodbye{GoodbyeReason::kShutdown, "node stopping"},
      Goodbye{static_cast<GoodbyeReason>(999), ""},  // unknown reasons are kept
      Error{ErrorCode::kAuthFailed, "bad token"},
      MapRequest{3},
      ShardMapMsg{SampleMap()},
      Guard{7, kGuardUp},
      Guard{8, 12},
      GuardAck{7},
  };
}

std::string Encode(const ControlMessage& m) {
  std::string out;
  absl::Status s = EncodeControl(m, &out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

void PutLe(std::string& s, size_t off, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) s[off + i] = static_cast<char>(v >> (8 * i));
}

TEST(ControlTest, RoundTripEveryMessage) {
  for (const ControlMessage& m : AllMessages()) {
    const std::string frame = Encode(m);
    ASSERT_GE(frame.size(), kFrameHeaderSize);
    absl::StatusOr<ControlMessage> back = DecodeControlFrame(AsBytes(frame));
    ASSERT_TRUE(back.ok()) << MessageTypeName(static_cast<uint16_t>(TypeOf(m))) << ": "
                           << back.status();
    EXPECT_EQ(*back, m) << MessageTypeName(static_cast<uint16_t>(TypeOf(m)));
  }
}

TEST(ControlTest, EveryMessageTypeIsCovered) {
  constexpr size_t kTypes = std::variant_size_v<ControlMessage>;
  std::vector<bool> seen(kTypes + 1, false);
  for (const ControlMessage& m : AllMessages()) seen[static_cast<size_t>(TypeOf(m))] = true;
  for (size_t t = 1; t <= kTypes; ++t) EXPECT_TRUE(seen[t]) << MessageTypeName(t);
}

TEST(ControlTest, HeaderLayoutIsLittleEndian) {
  const std::string f = Encode(Keepalive{0x0807060504030201});
  ASSERT_EQ(f.size(), kFrameHeaderSize + 8);
  EXPECT_EQ(f.substr(0, 4), "KVNC");
  EXPECT_EQ(f[4], static_cast<char>(kProtocolVersion));  // version
  EXPECT_EQ(f[5], 0);
  EXPECT_EQ(f[6], 5);  // type Keepalive
  EXPECT_EQ(f[7], 0);
  EXPECT_EQ(f[8], 8);  // payload size
  for (int i = 0; i < 8; ++i) EXPECT_EQ(f[12 + i], i + 1);
}

// Every strict prefix of every frame is rejected, and so is every shorter
// payload whose header was patched to agree with it.
TEST(ControlTest, EveryTruncationIsRejected) {
  for (const ControlMessage& m : AllMessages()) {
    const std::string frame = Encode(m);
    for (size_t len = 0; len < frame.size(); ++len) {
      std::string cut = frame.substr(0, len);
      EXPECT_FALSE(DecodeControlFrame(AsBytes(cut)).ok())
          << MessageTypeName(static_cast<uint16_t>(TypeOf(m))) << " prefix " << len;
      if (len >= kFrameHeaderSize) {
        PutLe(cut, 8, len - kFrameHeaderSize, 4);
        absl::StatusOr<ControlMessage> d = DecodeControlFrame(AsBytes(cut));
        EXPECT_FALSE(d.ok()) << MessageTypeName(static_cast<uint16_t>(TypeOf(m)))
                             << " patched payload " << len - kFrameHeaderSize;
        if (!d.ok()) {
          EXPECT_TRUE(absl::IsDataLoss(d.status())) << d.status();
        }
      }
      // A stream that has only delivered a prefix so far asks for more.
      FrameAssembler a;
      a.Append(frame.substr(0, len));
      absl::StatusOr<std::optional<ControlMessage>> n = a.Next();
      ASSERT_TRUE(n.ok()) << n.status();
      EXPECT_FALSE(n->has_value());
    }
  }
}

TEST(ControlTest, TrailingBytesAreRejected) {
  for (const ControlMessage& m : AllMessages()) {
    std::string frame = Encode(m);
    frame.push_back('x');
    PutLe(frame, 8, frame.size() - kFrameHeaderSize, 4);
    absl::StatusOr<ControlMessage> d = DecodeControlFrame(AsBytes(frame));
    ASSERT_FALSE(d.ok());
    EXPECT_TRUE(absl::IsDataLoss(d.status())) << d.status();
  }
}

TEST(ControlTest, BadMagicIsRejected) {
  std::string f = Encode(Ready{});
  f[0] = 'X';
  absl::StatusOr<ControlMessage> d = DecodeControlFrame(AsBytes(f));
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
}

TEST(ControlTest, OversizeLengthIsRejectedFromTheHeaderAlone) {
  std::string f = Encode(Ready{});
  PutLe(f, 8, kMaxControlPayloadSize + 1, 4);
  absl::StatusOr<FrameHeader> h = DecodeFrameHeader(AsBytes(f));
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << h.status();
  PutLe(f, 8, 0xffffffff, 4);
  FrameAssembler a;
  a.Append(f);  // only the header: the assembler must not wait for 4 GiB
  EXPECT_FALSE(a.Next().ok());
}

TEST(ControlTest, UnknownTypesAreRejected) {
  for (uint16_t type : {0, 15, 16, 0x7fff, 0xffff}) {
    std::string f = Encode(Ready{});
    PutLe(f, 6, type, 2);
    absl::StatusOr<ControlMessage> d = DecodeControlFrame(AsBytes(f));
    ASSERT_FALSE(d.ok()) << type;
    EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
    EXPECT_EQ(MessageTypeName(type), "Unknown(" + std::to_string(type) + ")");
  }
}

TEST(ControlTest, OtherVersionsAreRejectedButErrorIsReadable) {
  for (const ControlMessage& m : AllMessages()) {
    for (uint16_t v : {0, kProtocolVersion - 1, kProtocolVersion + 1, 0xffff}) {
      std::string f = Encode(m);
      PutLe(f, 4, v, 2);
      absl::StatusOr<ControlMessage> d = DecodeControlFrame(AsBytes(f));
      if (TypeOf(m) == MessageType::kError) {
        ASSERT_TRUE(d.ok()) << d.status();
        EXPECT_EQ(*d, m);
      } else {
        ASSERT_FALSE(d.ok());
        EXPECT_TRUE(absl::IsFailedPrecondition(d.status())) << d.status();
      }
    }
  }
}

TEST(ControlTest, HelloVersionMustMatchItsFrame) {
  const uint16_t next = kProtocolVersion + 1;
  Hello h;
  h.protocol_version = next;
  std::string out;
  EXPECT_FALSE(EncodeControl(h, &out).ok());
  EXPECT_TRUE(out.empty());
  // A future client's Hello: encodable with the test override, refused here.
  ASSERT_TRUE(EncodeControl(h, &out, /*version=*/next).ok());
  absl::StatusOr<ControlMessage> d = DecodeControlFrame(AsBytes(out));
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(d.status())) << d.status();
  // A frame of this version carrying a Hello that claims the next one.
  std::string f = Encode(Hello{});
  PutLe(f, kFrameHeaderSize, next, 2);
  EXPECT_FALSE(DecodeControlFrame(AsBytes(f)).ok());
}

// Version 2: Hello and Welcome carry the 16-byte resume secret right after
// the client id, and every byte of it crosses.
TEST(ControlTest, ResumeSecretFollowsTheClientId) {
  EXPECT_EQ(kProtocolVersion, 2);
  Hello h = std::get<Hello>(AllMessages()[0]);
  std::string f = Encode(h);
  // header, u16 version, u64 client_id, then the secret.
  const size_t at = kFrameHeaderSize + 2 + 8;
  EXPECT_EQ(f.substr(at, kResumeSecretSize),
            std::string(reinterpret_cast<const char*>(h.resume_secret.data()), kResumeSecretSize));
  for (size_t i = 0; i < kResumeSecretSize; ++i) {
    std::string g = f;
    g[at + i] = static_cast<char>(g[at + i] ^ 0x01);
    absl::StatusOr<ControlMessage> d = DecodeControlFrame(AsBytes(g));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_NE(std::get<Hello>(*d).resume_secret, h.resume_secret) << "byte " << i;
    EXPECT_EQ(std::get<Hello>(*d).client_id, h.client_id);
  }
  const Welcome w = std::get<Welcome>(AllMessages()[2]);
  f = Encode(w);
  EXPECT_EQ(f.substr(kFrameHeaderSize + 8, kResumeSecretSize),
            std::string(reinterpret_cast<const char*>(w.resume_secret.data()), kResumeSecretSize));
  absl::StatusOr<ControlMessage> d = DecodeControlFrame(AsBytes(f));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(std::get<Welcome>(*d).resume_secret, w.resume_secret);
  // A Welcome cut inside the secret is a truncation.
  std::string cut = f.substr(0, kFrameHeaderSize + 8 + 7);
  PutLe(cut, 8, 8 + 7, 4);
  EXPECT_TRUE(absl::IsDataLoss(DecodeControlFrame(AsBytes(cut)).status()));
}

// kFeatureSlotWords: the Welcome's slot-words fields follow the geometry
// exactly when its features carry the bit. A peer that does not ask for it
// gets the Welcome it always got, byte for byte.
TEST(ControlTest, SlotWordsTravelOnlyWithTheirBit) {
  Welcome plain = std::get<Welcome>(AllMessages()[2]);
  plain.features = kFeatureShardMap;
  const std::string plain_frame = Encode(plain);

  Welcome with = plain;
  with.features = kFeatureShardMap | kFeatureSlotWords;
  with.slot_words_offset = 0x12340;
  with.slot_words_size = kMaxSlots;
  with.check_below_epoch = 0x0605;
  const std::string f = Encode(with);
  ASSERT_EQ(f.size(), plain_frame.size() + 20);
  absl::StatusOr<ControlMessage> d = DecodeControlFrame(AsBytes(f));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(std::get<Welcome>(*d), with);
  // u64 offset, u32 size, u64 guard after the geometry (the payload's last
  // 20 bytes).
  std::string tail = f.substr(f.size() - 20);
  EXPECT_EQ(static_cast<uint8_t>(tail[0]), 0x40);
  EXPECT_EQ(static_cast<uint8_t>(tail[1]), 0x23);
  EXPECT_EQ(static_cast<uint8_t>(tail[10]), 0x01);  // 65536 = 0x00010000
  EXPECT_EQ(static_cast<uint8_t>(tail[12]), 0x05);
  EXPECT_EQ(static_cast<uint8_t>(tail[13]), 0x06);

  // Fields set without the bit do not travel: the old encoding.
  Welcome stray = plain;
  stray.slot_words_offset = 0x12340;
  stray.slot_words_size = kMaxSlots;
  stray.check_below_epoch = 3;
  EXPECT_EQ(Encode(stray), plain_frame);
  d = DecodeControlFrame(AsBytes(plain_frame));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(std::get<Welcome>(*d).slot_words_offset, 0u);
  EXPECT_EQ(std::get<Welcome>(*d).slot_words_size, 0u);
  EXPECT_EQ(std::get<Welcome>(*d).check_below_epoch, 0u);

  // The bit without its fields is a truncation; the fields without the bit
  // are trailing bytes (what a decoder of an older build also says).
  std::string cut = f.substr(0, f.size() - 4);
  PutLe(cut, 8, cut.size() - kFrameHeaderSize, 4);
  EXPECT_TRUE(absl::IsDataLoss(DecodeControlFrame(AsBytes(cut)).status()));
  std::string extra = plain_frame + tail;
  PutLe(extra, 8, extra.size() - kFrameHeaderSize, 4);
  EXPECT_FALSE(DecodeControlFrame(AsBytes(extra)).ok());

  // Out-of-range tables are refused by both sides.
  std::string out;
  for (auto [off, size] : std::vector<std::pair<uint64_t, uint32_t>>{{0, kMaxSlots},
                                                                     {0x12344, kMaxSlots},
                                                                     {0x12340, 0},
                                                                     {0x12340, 12},
                                                                     {0x12340, kMaxSlots + 8}}) {
    Welcome bad = with;
    bad.slot_words_offset = off;
    bad.slot_words_size = size;
    EXPECT_TRUE(absl::IsInvalidArgument(EncodeControl(bad, &out))) << off << " " << size;
    std::string g = f;
    PutLe(g, g.size() - 20, off, 8);
    PutLe(g, g.size() - 12, size, 4);
    EXPECT_TRUE(absl::IsInvalidArgument(DecodeControlFrame(AsBytes(g)).status()))
        << off << " " << size;
  }
  EXPECT_TRUE(out.empty());

  // Hello carries the bits as any others.
  Hello h;
  h.features = kFeatureShardMap | kFeatureSlotWords;
  d = DecodeControlFrame(AsBytes(Encode(h)));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(std::get<Hello>(*d).features, kFeatureShardMap | kFeatureSlotWords);
  EXPECT_EQ(kKnownFeatures, kFeatureShardMap | kFeatureSlotWords);
}

TEST(ControlTest, EncoderRefusesOutOfRangeFields) {
  std::string out;
  Hello h;
  h.auth_token.assign(kMaxAuthTokenSize + 1, 'a');
  EXPECT_FALSE(EncodeControl(h, &out).ok());
  h.auth_token.assign(kMaxAuthTokenSize, 'a');
  EXPECT_TRUE(EncodeControl(h, &out).ok());
  out.clear();

  Welcome w = std::get<Welcome>(AllMessages()[2]);
  Welcome bad = w;
  bad.client_id = 0;
  EXPECT_FALSE(EncodeControl(bad, &out).ok());
  bad = w;
  bad.max_rpc_credits = 0;
  EXPECT_FALSE(EncodeControl(bad, &out).ok());
  bad = w;
  bad.server_qp.qpn = 1 << 24;
  EXPECT_FALSE(EncodeControl(bad, &out).ok());
  bad = w;
  bad.server_qp.mtu = 6;
  EXPECT_FALSE(EncodeControl(bad, &out).ok());
  bad = w;
  bad.index_geometry.assign(kMaxIndexGeometrySize + 1, 'g');
  EXPECT_FALSE(EncodeControl(bad, &out).ok());
  EXPECT_FALSE(EncodeControl(ClientQp{QpInfo{}}, &out).ok());  // MTU 0
  EXPECT_FALSE(EncodeControl(Move{MoveReason::kUpgrade, "nohost", 1, 0}, &out).ok());
  EXPECT_FALSE(
      EncodeControl(Error{ErrorCode::kInternal, std::string(kMaxMessageTextSize + 1, 'e')}, &out)
          .ok());
  EXPECT_TRUE(out.empty()) << "a failed encode must not leave a partial frame";
}

TEST(ControlTest, DecoderRefusesOutOfRangeFields) {
  // Patch fields of valid frames in place.
  const std::string welcome = Encode(AllMessages()[2]);
  const size_t qp_off = kFrameHeaderSize + 8 + kResumeSecretSize + 16;
  std::string f = welcome;
  PutLe(f, qp_off, 1 << 24, 4);  // QPN
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeControlFrame(AsBytes(f)).status()));
  f = welcome;
  PutLe(f, qp_off + 4 + 4 + 16 + 2, 0, 1);  // MTU
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeControlFrame(AsBytes(f)).status()));
  f = welcome;
  PutLe(f, kFrameHeaderSize, 0, 8);  // client id
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeControlFrame(AsBytes(f)).status()));

  // A string length over its limit is refused before it is read.
  std::string hello = Encode(Hello{});
  PutLe(hello, kFrameHeaderSize + 18 + kResumeSecretSize, kMaxAuthTokenSize + 1, 2);
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeControlFrame(AsBytes(hello)).status()));

  Move m{MoveReason::kUpgrade, "h:1", 2, 0};
  std::string mv = Encode(m);
  mv[mv.size() - 1] = 'x';  // "h:x"
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeControlFrame(AsBytes(mv)).status()));
}

TEST(ControlTest, AssemblerSplitsAConcatenatedStreamFedByteByByte) {
  std::string stream;
  const std::vector<ControlMessage> all = AllMessages();
  for (const ControlMessage& m : all) stream += Encode(m);
  FrameAssembler a;
  std::vector<ControlMessage> got;
  for (char c : stream) {
    a.Append(std::string_view(&c, 1));
    for (;;) {
      absl::StatusOr<std::optional<ControlMessage>> n = a.Next();
      ASSERT_TRUE(n.ok()) << n.status();
      if (!n->has_value()) break;
      got.push_back(std::move(**n));
    }
  }
  EXPECT_EQ(got, all);
  EXPECT_EQ(a.buffered(), 0u);
}

TEST(ControlTest, AssemblerReportsABadFrameInTheStream) {
  FrameAssembler a;
  a.Append(Encode(Ready{}));
  std::string bad = Encode(Keepalive{1});
  PutLe(bad, 6, 77, 2);
  a.Append(bad);
  absl::StatusOr<std::optional<ControlMessage>> first = a.Next();
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->has_value());
  EXPECT_FALSE(a.Next().ok());
}

TEST(ControlTest, ParseHostPort) {
  absl::StatusOr<HostPort> hp = ParseHostPort("127.0.0.1:7000");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "127.0.0.1");
  EXPECT_EQ(hp->port, 7000);
  hp = ParseHostPort("[fe80::1]:65535");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "fe80::1");
  EXPECT_EQ(hp->port, 65535);
  for (const char* bad : {"", ":", "host", "host:", ":80", "host:0", "host:65536", "host:80x",
                          "fe80::1:80", "[fe80::1]80", "[fe80::1", "[]:80", "h:-1", "h: 80"}) {
    EXPECT_FALSE(ParseHostPort(bad).ok()) << bad;
  }
}

// Random input never crashes the decoder (ASan/UBSan builds make this
// meaningful); a libFuzzer target will do this properly.
TEST(ControlTest, RandomBytesNeverCrash) {
  std::mt19937_64 rng(12345);
  const std::vector<ControlMessage> all = AllMessages();
  size_t decoded = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    std::string buf;
    if (iter % 2 == 0) {
      // Pure noise, sometimes behind a valid magic so the payload is reached.
      buf.resize(rng() % 96);
      for (char& c : buf) c = static_cast<char>(rng());
      if (buf.size() >= kFrameHeaderSize && rng() % 2) {
        PutLe(buf, 0, kFrameMagic, 4);
        PutLe(buf, 4, kProtocolVersion, 2);
        PutLe(buf, 6, 1 + rng() % 11, 2);
        PutLe(buf, 8, buf.size() - kFrameHeaderSize, 4);
      }
    } else {
      // A valid frame with a few bytes flipped.
      buf = Encode(all[rng() % all.size()]);
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < flips; ++i) buf[rng() % buf.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    if (DecodeControlFrame(AsBytes(buf)).ok()) ++decoded;
    FrameAssembler a;
    a.Append(buf);
    (void)a.Next();
  }
  // Some flips land in values that have no constraint; most do not decode.
  EXPECT_GT(decoded, 0u);
}

}  // namespace
}  // namespace kvnode::proto
