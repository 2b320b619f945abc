// RPC codecs: round trips, every truncation, limits, random input.
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvnode/proto/rpc.h"

namespace kvnode::proto {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

void PutLe(std::string& s, size_t off, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) s[off + i] = static_cast<char>(v >> (8 * i));
}

const std::string kBigKey(storage::kMaxKeySize, 'k');
const std::string kBigValue(storage::kMaxValueSize, 'v');

std::vector<RequestView> AllRequests() {
  return {
      {Opcode::kGet, 1, 2, "key", ""},
      {Opcode::kPut, 0xffffffffffffffff, 0x0102030405060708, "key", std::string_view("v\0l", 3)},
      {Opcode::kPut, 3, 4, "k", ""},  // empty value allowed
      {Opcode::kPut, 3, 5, kBigKey, kBigValue},
      {Opcode::kDelete, 3, 6, "gone", ""},
      {Opcode::kPing, 3, 7, "", ""},
      {Opcode::kPing, 3, 8, "", "echo me"},
  };
}

std::vector<ResponseView> AllResponses() {
  return {
      {Opcode::kGet, RpcStatus::kOk, 2, 99, "value"},
      {Opcode::kGet, RpcStatus::kNotFound, 2, 0, ""},
      {Opcode::kPut, RpcStatus::kOk, 3, 100, ""},
      {Opcode::kPut, RpcStatus::kRejected, 3, 0, "value too large"},
      {Opcode::kPut, RpcStatus::kBusy, 4, 0, ""},
      {Opcode::kDelete, RpcStatus::kInternal, 5, 0, "rocksdb: IO error"},
      {Opcode::kGet, RpcStatus::kOk, 6, 1, kBigValue},
      {Opcode::kPing, RpcStatus::kOk, 7, 0, "echo me"},
  };
}

bool Same(const RequestView& a, const RequestView& b) {
  return a.opcode == b.opcode && a.client_id == b.client_id && a.sequence == b.sequence &&
         a.key == b.key && a.value == b.value;
}

bool Same(const ResponseView& a, const ResponseView& b) {
  return a.opcode == b.opcode && a.status == b.status && a.sequence == b.sequence &&
         a.version == b.version && a.value == b.value;
}

TEST(RpcTest, MaxMessageSizeFitsTheLargestMessages) {
  EXPECT_EQ(kMaxRpcMessageSize, 24 + storage::kMaxKeySize + storage::kMaxValueSize);
  RequestView big{Opcode::kPut, 1, 1, kBigKey, kBigValue};
  EXPECT_EQ(EncodedSize(big), kMaxRpcMessageSize);
  std::vector<uint8_t> buf(kMaxRpcMessageSize);
  absl::StatusOr<size_t> n = EncodeRequest(big, buf);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, kMaxRpcMessageSize);
}

TEST(RpcTest, RequestRoundTrips) {
  for (const RequestView& r : AllRequests()) {
    std::string out;
    ASSERT_TRUE(EncodeRequest(r, &out).ok());
    EXPECT_EQ(out.size(), EncodedSize(r));
    absl::StatusOr<RequestView> d = DecodeRequest(Bytes(out));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(Same(*d, r)) << OpcodeName(r.opcode);
    // The views point into the received buffer, not a copy.
    if (!d->key.empty()) {
      EXPECT_EQ(d->key.data(), out.data() + kRpcHeaderSize);
    }
  }
}

TEST(RpcTest, ResponseRoundTrips) {
  for (const ResponseView& r : AllResponses()) {
    std::string out;
    ASSERT_TRUE(EncodeResponse(r, &out).ok());
    absl::StatusOr<ResponseView> d = DecodeResponse(Bytes(out));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(Same(*d, r)) << RpcStatusName(r.status);
  }
}

TEST(RpcTest, LayoutIsLittleEndian) {
  std::string out;
  ASSERT_TRUE(
      EncodeRequest({Opcode::kPut, 0x0807060504030201, 0x1817161514131211, "ab", "xyz"}, &out)
          .ok());
  const std::string want = std::string("\x01\x02\x02\x00\x03\x00\x00\x00", 8) +
                           "\x01\x02\x03\x04\x05\x06\x07\x08" + "\x11\x12\x13\x14\x15\x16\x17\x18" +
                           "abxyz";
  EXPECT_EQ(out, want);
  ASSERT_TRUE(EncodeResponse({Opcode::kGet, RpcStatus::kNotFound, 1, 2, ""}, &out).ok());
  EXPECT_EQ(out, std::string("\x01\x01\x01\x00\x00\x00\x00\x00"
                             "\x01\x00\x00\x00\x00\x00\x00\x00"
                             "\x02\x00\x00\x00\x00\x00\x00\x00",
                             24));
}

TEST(RpcTest, EveryTruncationIsRejected) {
  for (const RequestView& r : AllRequests()) {
    std::string out;
    ASSERT_TRUE(EncodeRequest(r, &out).ok());
    for (size_t len = 0; len < out.size(); ++len) {
      absl::StatusOr<RequestView> d = DecodeRequest(Bytes(out).first(len));
      ASSERT_FALSE(d.ok()) << OpcodeName(r.opcode) << " prefix " << len;
      EXPECT_TRUE(absl::IsDataLoss(d.status())) << d.status();
    }
  }
  for (const ResponseView& r : AllResponses()) {
    std::string out;
    ASSERT_TRUE(EncodeResponse(r, &out).ok());
    for (size_t len = 0; len < out.size(); ++len) {
      absl::StatusOr<ResponseView> d = DecodeResponse(Bytes(out).first(len));
      ASSERT_FALSE(d.ok()) << RpcStatusName(r.status) << " prefix " << len;
      EXPECT_TRUE(absl::IsDataLoss(d.status())) << d.status();
    }
  }
}

TEST(RpcTest, ExtraBytesAreRejected) {
  std::string out;
  ASSERT_TRUE(EncodeRequest(AllRequests()[1], &out).ok());
  out.push_back('x');
  EXPECT_TRUE(absl::IsDataLoss(DecodeRequest(Bytes(out)).status()));
  ASSERT_TRUE(EncodeResponse(AllResponses()[0], &out).ok());
  out.push_back('x');
  EXPECT_TRUE(absl::IsDataLoss(DecodeResponse(Bytes(out)).status()));
}

TEST(RpcTest, EncoderRefusesInvalidRequests) {
  std::string out;
  const std::string too_big_key(storage::kMaxKeySize + 1, 'k');
  const std::string too_big_value(storage::kMaxValueSize + 1, 'v');
  EXPECT_FALSE(EncodeRequest({Opcode::kPut, 1, 1, too_big_key, "v"}, &out).ok());
  EXPECT_FALSE(EncodeRequest({Opcode::kPut, 1, 1, "k", too_big_value}, &out).ok());
  EXPECT_FALSE(EncodeRequest({Opcode::kGet, 1, 1, "", ""}, &out).ok());
  EXPECT_FALSE(EncodeRequest({Opcode::kGet, 1, 1, "k", "v"}, &out).ok());
  EXPECT_FALSE(EncodeRequest({Opcode::kDelete, 1, 1, "k", "v"}, &out).ok());
  EXPECT_FALSE(EncodeRequest({Opcode::kPing, 1, 1, "k", ""}, &out).ok());
  EXPECT_FALSE(EncodeRequest({static_cast<Opcode>(9), 1, 1, "k", ""}, &out).ok());
  EXPECT_FALSE(EncodeResponse({Opcode::kGet, static_cast<RpcStatus>(6), 1, 1, ""}, &out).ok());
  EXPECT_FALSE(EncodeResponse({Opcode::kGet, RpcStatus::kOk, 1, 1, too_big_value}, &out).ok());

  std::vector<uint8_t> small(kRpcHeaderSize + 2);
  absl::StatusOr<size_t> n = EncodeRequest({Opcode::kPut, 1, 1, "key", ""}, small);
  ASSERT_FALSE(n.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(n.status()));
}

TEST(RpcTest, DecoderRefusesBadHeaders) {
  std::string good;
  ASSERT_TRUE(EncodeRequest({Opcode::kPut, 5, 77, "key", "value"}, &good).ok());

  std::string f = good;
  f[0] = 2;  // version
  EXPECT_TRUE(absl::IsFailedPrecondition(DecodeRequest(Bytes(f)).status()));
  for (uint8_t op : {0, 5, 255}) {
    f = good;
    f[1] = static_cast<char>(op);
    EXPECT_TRUE(absl::IsInvalidArgument(DecodeRequest(Bytes(f)).status())) << int{op};
  }
  // Oversize key length in a buffer that is big enough to hold it: refused by
  // the limit, and the server can still learn the sequence to answer.
  f = std::string(kRpcHeaderSize + storage::kMaxKeySize + 1, 'k');
  std::string hdr;
  ASSERT_TRUE(EncodeRequest({Opcode::kGet, 5, 78, "k", ""}, &hdr).ok());
  f.replace(0, kRpcHeaderSize, hdr.substr(0, kRpcHeaderSize));
  PutLe(f, 2, storage::kMaxKeySize + 1, 2);
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeRequest(Bytes(f)).status()));
  absl::StatusOr<RequestHeader> h = DecodeRequestHeader(Bytes(f));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->sequence, 78u);
  EXPECT_EQ(h->client_id, 5u);
  // value_len of 4 GiB - 1.
  f = good;
  PutLe(f, 4, 0xffffffff, 4);
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeRequest(Bytes(f)).status()));
  // A GET that carries a value.
  ASSERT_TRUE(EncodeRequest({Opcode::kPut, 5, 77, "key", "value"}, &f).ok());
  f[1] = static_cast<char>(Opcode::kGet);
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeRequest(Bytes(f)).status()));

  std::string resp;
  ASSERT_TRUE(EncodeResponse({Opcode::kGet, RpcStatus::kOk, 1, 2, "v"}, &resp).ok());
  f = resp;
  f[1] = 9;  // status
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeResponse(Bytes(f)).status()));
  f = resp;
  f[2] = 0;  // opcode
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeResponse(Bytes(f)).status()));
  f = resp;
  f[3] = 1;  // flags
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeResponse(Bytes(f)).status()));
  f = resp;
  f[0] = 0;
  EXPECT_TRUE(absl::IsFailedPrecondition(DecodeResponse(Bytes(f)).status()));
}

TEST(RpcTest, RandomBytesNeverCrash) {
  std::mt19937_64 rng(777);
  std::vector<std::string> valid;
  for (const RequestView& r : AllRequests()) {
    std::string s;
    ASSERT_TRUE(EncodeRequest(r, &s).ok());
    valid.push_back(s);
  }
  for (const ResponseView& r : AllResponses()) {
    std::string s;
    ASSERT_TRUE(EncodeResponse(r, &s).ok());
    valid.push_back(s);
  }
  for (int iter = 0; iter < 200000; ++iter) {
    std::string buf;
    if (iter % 2 == 0) {
      buf.resize(rng() % 80);
      for (char& c : buf) c = static_cast<char>(rng());
      if (!buf.empty()) buf[0] = 1;  // right version, so decoding goes deeper
    } else {
      buf = valid[rng() % valid.size()];
      const int flips = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < flips; ++i) {
        buf[rng() % std::min<size_t>(buf.size(), 64)] ^= static_cast<char>(1 + rng() % 255);
      }
    }
    absl::StatusOr<RequestView> q = DecodeRequest(Bytes(buf));
    if (q.ok()) {
      ASSERT_LE(q->key.size(), storage::kMaxKeySize);
      ASSERT_EQ(EncodedSize(*q), buf.size());
    }
    absl::StatusOr<ResponseView> p = DecodeResponse(Bytes(buf));
    if (p.ok()) {
      ASSERT_EQ(EncodedSize(*p), buf.size());
    }
  }
}

}  // namespace
}  // namespace kvnode::proto
