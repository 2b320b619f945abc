// RPC messages carried by RDMA SEND/RECV on a client's RC QP: PUT, DELETE,
// slow-path GET and PING. The byte format is specified in docs/protocol.md.
//
// One message per SEND; its length is the completion's byte_len, so there is
// no frame header beyond the fixed 24-byte message header:
//
//   Request:  version u8 | opcode u8 | key_len u16 | value_len u32 |
//             client_id u64 | sequence u64 | key | value
//   Response: version u8 | status u8 | opcode u8 | flags u8 | value_len u32 |
//             sequence u64 | version u64 | value
//
// all little endian. Receive buffers are kMaxRpcMessageSize bytes; every
// valid request and response fits.
//
// Hot path: encoders write into a caller buffer (registered memory) and
// decoders return views into the received buffer, without allocation. The
// views are valid as long as that buffer is not reposted.
#ifndef KVNODE_PROTO_RPC_H_
#define KVNODE_PROTO_RPC_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/storage/limits.h"

namespace kvnode::proto {

inline constexpr uint8_t kRpcVersion = 1;
inline constexpr size_t kRpcHeaderSize = 24;
// Size of every RPC receive buffer, on both sides.
inline constexpr size_t kMaxRpcMessageSize =
    kRpcHeaderSize + storage::kMaxKeySize + storage::kMaxValueSize;

enum class Opcode : uint8_t {
  kGet = 1,     // key -> value (slow path; the fast path is an RDMA READ)
  kPut = 2,     // key, value
  kDelete = 3,  // key
  kPing = 4,    // no key; the value (if any) is echoed back
};

enum class RpcStatus : uint8_t {
  kOk = 0,
  kNotFound = 1,  // GET or DELETE of an absent key
  kRejected = 2,  // malformed or too large; retrying will not help
  kBusy = 3,      // try again later (e.g. writes paused by a live upgrade)
  kInternal = 4,  // the server failed (e.g. RocksDB error); the op may be retried
  // The key's slot is not this node's in its shard map (a cluster node only,
  // to a client that set kFeatureShardMap). The response's version field is
  // that map's epoch; the client refreshes its map and resubmits. Nothing
  // was applied.
  kWrongShard = 5,
};

std::string_view OpcodeName(Opcode op);        // "GET", ...; "?" if unknown
std::string_view RpcStatusName(RpcStatus st);  // "OK", ...; "?" if unknown

// A request whose key and value point at memory owned by someone else.
struct RequestView {
  Opcode opcode = Opcode::kPing;
  uint64_t client_id = 0;
  // Per client, increasing; a retry reuses the sequence so the server applies
  // a write once.
  uint64_t sequence = 0;
  std::string_view key;    // non-empty for GET/PUT/DELETE, empty for PING
  std::string_view value;  // PUT and PING only; empty otherwise
};

struct ResponseView {
  Opcode opcode = Opcode::kPing;  // echoes the request
  RpcStatus status = RpcStatus::kOk;
  uint64_t sequence = 0;  // echoes the request
  // Object version assigned by the server: of the value returned (GET), of the
  // write applied (PUT, DELETE); 0 when there is none.
  uint64_t version = 0;
  // GET/PING: the value. Any status other than kOk: an optional
  // human-readable reason. Otherwise empty.
  std::string_view value;
};

// The header fields of a request, for a server that must answer even a
// request it cannot fully decode (to send kRejected with the sequence).
struct RequestHeader {
  uint8_t opcode = 0;  // raw, unchecked
  uint16_t key_len = 0;
  uint32_t value_len = 0;
  uint64_t client_id = 0;
  uint64_t sequence = 0;
};

inline size_t EncodedSize(const RequestView& r) {
  return kRpcHeaderSize + r.key.size() + r.value.size();
}
inline size_t EncodedSize(const ResponseView& r) { return kRpcHeaderSize + r.value.size(); }

// Checks a request against the rules above (opcode known, key/value sizes and
// presence). The encoder and the decoder both apply it.
[[nodiscard]] absl::Status ValidateRequest(const RequestView& r);
[[nodiscard]] absl::Status ValidateResponse(const ResponseView& r);

// Encode into `buf`; returns the number of bytes written (EncodedSize()).
// InvalidArgument if the message is invalid, ResourceExhausted if `buf` is
// too small. Nothing is written on error.
[[nodiscard]] absl::StatusOr<size_t> EncodeRequest(const RequestView& r, std::span<uint8_t> buf);
[[nodiscard]] absl::StatusOr<size_t> EncodeResponse(const ResponseView& r, std::span<uint8_t> buf);
// Encode into a string (replacing its contents).
[[nodiscard]] absl::Status EncodeRequest(const RequestView& r, std::string* out);
[[nodiscard]] absl::Status EncodeResponse(const ResponseView& r, std::string* out);

// Decode a whole received message (exactly byte_len bytes). DataLoss when
// truncated or when the header's lengths disagree with the size;
// FailedPrecondition for another RPC version; InvalidArgument for unknown
// opcodes/statuses or sizes over the limits.
[[nodiscard]] absl::StatusOr<RequestView> DecodeRequest(std::span<const uint8_t> msg);
[[nodiscard]] absl::StatusOr<ResponseView> DecodeResponse(std::span<const uint8_t> msg);
// Only the header (needs kRpcHeaderSize bytes and the right version).
[[nodiscard]] absl::StatusOr<RequestHeader> DecodeRequestHeader(std::span<const uint8_t> msg);

}  // namespace kvnode::proto

#endif  // KVNODE_PROTO_RPC_H_
