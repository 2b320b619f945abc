// The control protocol: the TCP conversation that bootstraps a client session
// and then stays open as its control channel (keep-alive, live-upgrade move
// notices, goodbye). The byte format is specified in docs/protocol.md; this
// header is its C++ face.
//
// Every message travels in one frame:
//
//   magic u32 "KVNC" | version u16 | type u16 | payload_size u32 | payload
//
// all little endian. Encoders validate the fields they are given (sizes, QP
// number ranges) and return an error rather than put a frame on the wire that
// the peer would reject. Decoders never trust their input: truncated frames,
// oversize lengths, unknown types, unsupported versions and trailing bytes are
// all reported as statuses, never undefined behaviour.
//
// Thread safety: all functions are pure; FrameAssembler is a plain value owned
// by one thread.
#ifndef KVNODE_PROTO_CONTROL_H_
#define KVNODE_PROTO_CONTROL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::proto {

// The control protocol version this build speaks. A peer that sends another
// version gets Error{kUnsupportedVersion}. Bump on any incompatible change to
// a message layout and record it in docs/protocol.md.
inline constexpr uint16_t kProtocolVersion = 2;

// "KVNC" as the first four bytes of every frame (read as a little-endian u32).
inline constexpr uint32_t kFrameMagic = 0x434e564b;
inline constexpr size_t kFrameHeaderSize = 12;
// Largest payload a decoder accepts; bigger lengths are rejected from the
// header alone, before anything is buffered.
// (64 KiB: a shard map of 64 nodes and 4096 ranges fits, see shard_map.h.)
inline constexpr size_t kMaxControlPayloadSize = 64 * 1024;
inline constexpr size_t kMaxFrameSize = kFrameHeaderSize + kMaxControlPayloadSize;

// Field limits (bytes).
inline constexpr size_t kMaxAuthTokenSize = 1024;
inline constexpr size_t kMaxClientNameSize = 256;
inline constexpr size_t kMaxEndpointSize = 512;
inline constexpr size_t kMaxIndexGeometrySize = 4096;
inline constexpr size_t kMaxMessageTextSize = 1024;

enum class MessageType : uint16_t {
  kHello = 1,         // client -> server, first frame
  kWelcome = 2,       // server -> client, answer to Hello
  kClientQp = 3,      // client -> server, the client's QP after Welcome
  kReady = 4,         // server -> client, server QP is RTS, RPCs may flow
  kKeepalive = 5,     // either way
  kKeepaliveAck = 6,  // answer to Keepalive, echoes its nonce
  kMove = 7,          // server -> client, live upgrade: move to endpoint
  kMoveAck = 8,       // client -> old server, the move is done
  kGoodbye = 9,       // either way, then the sender closes
  kError = 10,        // either way, then the sender closes
  // With kFeatureShardMap only:
  kMapRequest = 11,  // client -> server, send me your shard map
  kShardMap = 12,    // server -> client, after Ready, on every change, on request
  // With kFeatureSlotWords only:
  kGuard = 13,     // server -> client, the node's guard changed
  kGuardAck = 14,  // client -> server, answer to Guard
};

// Name for logs ("Hello", ...), "Unknown(N)" for anything else.
std::string MessageTypeName(uint16_t type);

// What one side tells the other about its RC QP (the perftest-style
// out-of-band exchange). 28 bytes on the wire.
struct QpInfo {
  uint32_t qpn = 0;  // 24 bits significant; larger values are rejected
  uint32_t psn = 0;  // 24 bits significant; larger values are rejected
  std::array<uint8_t, 16> gid{};
  uint16_t lid = 0;  // 0 on RoCE
  uint8_t mtu = 0;   // enum ibv_mtu value: 1 (256) .. 5 (4096); others rejected
  uint8_t port = 0;  // the sender's port number (informational)
  friend bool operator==(const QpInfo&, const QpInfo&) = default;
};

// Feature bits in Hello.features / Welcome.features. A session uses the AND
// of both sides' bits; unknown bits are ignored.
//
// kFeatureShardMap: the node is a cluster member and the client routes by
// slot. The node then sends ShardMap frames and answers RpcStatus::kWrongShard
// for keys of slots it does not own. A node outside a cluster never sets it.
inline constexpr uint64_t kFeatureShardMap = uint64_t{1} << 0;
// kFeatureSlotWords: the node keeps a slot ownership table in its arena (one
// byte per slot, 1 while it serves the slot) and names it in the Welcome
// (Welcome::slot_words_offset, slot_words_size). While the client's map is
// older than the node's guard (Welcome::check_below_epoch, then Guard
// messages), it READs the word holding a key's slot byte after every READ
// of a GET, in the same chain, and takes the data only when the byte is 1.
// Only with kFeatureShardMap: a node sets it in a Welcome only when both
// bits were asked for.
inline constexpr uint64_t kFeatureSlotWords = uint64_t{1} << 1;
inline constexpr uint64_t kKnownFeatures = kFeatureShardMap | kFeatureSlotWords;

// The secret that proves a client owns its client id: given in the Welcome
// that created the id, presented in every Hello that resumes it. 128 bits
// from the node's kernel CSPRNG; the id alone (also random, but sent in
// every RPC) grants nothing.
inline constexpr size_t kResumeSecretSize = 16;
using ResumeSecret = std::array<uint8_t, kResumeSecretSize>;

struct Hello {
  uint16_t protocol_version = kProtocolVersion;
  uint64_t client_id = 0;  // 0 = new client; else resume this id
  // With client_id != 0: the secret the Welcome of that id gave (a wrong or
  // missing one gets a fresh id). With client_id == 0: zeros.
  ResumeSecret resume_secret{};
  uint64_t features = 0;
  std::string auth_token;   // <= kMaxAuthTokenSize bytes, opaque
  std::string client_name;  // <= kMaxClientNameSize bytes, e.g. "kvload/0.1"
  friend bool operator==(const Hello&, const Hello&) = default;
};

struct Welcome {
  uint64_t client_id = 0;          // != 0
  ResumeSecret resume_secret{};    // present it to resume client_id
  uint64_t server_generation = 0;  // upgrade generation of the serving process
  uint64_t features = 0;
  QpInfo server_qp;
  uint32_t rkey = 0;               // for the arena (an MW or the arena MR)
  uint64_t arena_remote_addr = 0;  // remote address of arena offset 0
  uint64_t arena_size = 0;
  uint32_t max_rpc_credits = 0;       // >= 1: receive buffers posted for us
  uint32_t max_rpc_message_size = 0;  // server's RPC receive buffer size
  uint32_t max_key_size = 0;
  uint32_t max_value_size = 0;
  std::string index_geometry;  // opaque, encoded by kvnode::storage
  // On the wire only when features has kFeatureSlotWords (an older peer
  // never sees them); 0 otherwise. The table's arena offset (8-byte
  // aligned) and its length in bytes (kMaxSlots, a multiple of 8), and the
  // node's guard: see Guard.
  uint64_t slot_words_offset = 0;
  uint32_t slot_words_size = 0;
  uint64_t check_below_epoch = 0;
  friend bool operator==(const Welcome&, const Welcome&) = default;
};

struct ClientQp {
  QpInfo qp;
  friend bool operator==(const ClientQp&, const ClientQp&) = default;
};

struct Ready {
  friend bool operator==(const Ready&, const Ready&) = default;
};

struct Keepalive {
  uint64_t nonce = 0;
  friend bool operator==(const Keepalive&, const Keepalive&) = default;
};

struct KeepaliveAck {
  uint64_t nonce = 0;
  friend bool operator==(const KeepaliveAck&, const KeepaliveAck&) = default;
};

// Reason and code enums are open: a decoder accepts values it does not know
// (a newer peer may send them) and treats them like the generic one.
enum class MoveReason : uint32_t {
  kUpgrade = 1,  // live upgrade to a new process
  kDrain = 2,    // this node is being drained
};

struct Move {
  MoveReason reason = MoveReason::kUpgrade;
  std::string endpoint;         // "host:port" or "[v6]:port", see ParseHostPort
  uint64_t new_generation = 0;  // generation the client will find there
  uint32_t deadline_ms = 0;     // the client is cut after this; 0 = none given
  friend bool operator==(const Move&, const Move&) = default;
};

struct MoveAck {
  uint64_t new_generation = 0;  // echoes Move.new_generation
  friend bool operator==(const MoveAck&, const MoveAck&) = default;
};

enum class GoodbyeReason : uint32_t {
  kShutdown = 1,     // server is stopping
  kClientClose = 2,  // client disconnects
  kMoveTimeout = 3,  // client did not acknowledge a Move in time
  kIdleTimeout = 4,  // no keep-alive
  kReplaced = 5,     // a newer session with the same client id took over
  // Client closes for good: it will never resume this id, so the node may
  // forget the id's dedupe record (kClientClose keeps it for a resume).
  kClientDone = 6,
  // The node's guard went up (Guard) and this session could not be told, or
  // did not acknowledge in time: its QP is gone; a new session learns the
  // guard in its Welcome.
  kGuardCut = 7,
};

struct Goodbye {
  GoodbyeReason reason = GoodbyeReason::kShutdown;
  std::string message;  // <= kMaxMessageTextSize, for logs
  friend bool operator==(const Goodbye&, const Goodbye&) = default;
};

enum class ErrorCode : uint32_t {
  kUnsupportedVersion = 1,
  kAuthFailed = 2,
  kMalformed = 3,          // undecodable frame
  kUnexpectedMessage = 4,  // valid message at the wrong moment
  kTooManyClients = 5,
  kUnknownClient = 6,  // Hello.client_id names no session we can resume
  kInternal = 7,
};

// The Error payload layout is frozen across protocol versions so that any
// peer can report a version mismatch: a decoder accepts an Error frame of any
// version.
struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;  // <= kMaxMessageTextSize, for logs
  friend bool operator==(const Error&, const Error&) = default;
};

struct MapRequest {
  uint64_t known_epoch = 0;  // the client's map epoch, 0 for none (informational)
  friend bool operator==(const MapRequest&, const MapRequest&) = default;
};

// The sending node's current shard map (shard_map.h has its layout).
struct ShardMapMsg {
  ShardMap map;
  friend bool operator==(const ShardMapMsg&, const ShardMapMsg&) = default;
};

// The node's guard (kFeatureSlotWords): a client checks the slot words of
// its READs while its shard map's epoch is below check_below_epoch. A node
// keeps it at its own map's epoch (a client whose map is as new as the
// node's routes it no key of a slot the node gave away), and raises it to
// kGuardUp before it stops serving a slot it still holds in that map (a
// slot migration's freeze). The client answers every Guard with a GuardAck
// of its nonce once no READ it posted without a word check is outstanding.
inline constexpr uint64_t kGuardUp = ~uint64_t{0};
struct Guard {
  uint64_t nonce = 0;
  uint64_t check_below_epoch = 0;
  friend bool operator==(const Guard&, const Guard&) = default;
};

struct GuardAck {
  uint64_t nonce = 0;  // echoes Guard.nonce
  friend bool operator==(const GuardAck&, const GuardAck&) = default;
};

using ControlMessage =
    std::variant<Hello, Welcome, ClientQp, Ready, Keepalive, KeepaliveAck, Move, MoveAck, Goodbye,
                 Error, MapRequest, ShardMapMsg, Guard, GuardAck>;

MessageType TypeOf(const ControlMessage& m);

struct FrameHeader {
  uint16_t version = 0;  // as sent; checked by DecodeControlPayload
  uint16_t type = 0;     // raw; checked by DecodeControlPayload
  uint32_t payload_size = 0;
};

// Checks the first kFrameHeaderSize bytes of `bytes`: magic and payload size
// (<= kMaxControlPayloadSize). Version and type are returned unchecked so that
// a server can still answer a wrong version with an Error frame.
[[nodiscard]] absl::StatusOr<FrameHeader> DecodeFrameHeader(std::span<const uint8_t> bytes);

// Appends one whole frame (header and payload) for `m` to `out`. Fails with
// InvalidArgument, leaving `out` unchanged, when a field is out of range.
// `version` goes into the frame header (and must equal Hello.protocol_version
// for a Hello); anything but kProtocolVersion is for compatibility tests.
[[nodiscard]] absl::Status EncodeControl(const ControlMessage& m, std::string* out,
                                         uint16_t version = kProtocolVersion);

// Decodes the payload of a frame whose header was already decoded. The payload
// must be exactly header.payload_size bytes; trailing bytes are an error.
[[nodiscard]] absl::StatusOr<ControlMessage> DecodeControlPayload(const FrameHeader& header,
                                                                  std::span<const uint8_t> payload);

// Decodes exactly one frame that fills `frame` entirely.
[[nodiscard]] absl::StatusOr<ControlMessage> DecodeControlFrame(std::span<const uint8_t> frame);

inline std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Reassembles frames from a byte stream for non-blocking event loops: Append
// whatever recv() returned, then call Next() until it yields nullopt.
// After Next() returns an error the stream is desynchronised: close it.
class FrameAssembler {
 public:
  void Append(std::span<const uint8_t> bytes);
  void Append(std::string_view bytes) { Append(AsBytes(bytes)); }

  // The next complete message, nullopt if more bytes are needed, or the
  // decode error of the next frame. An oversize length is reported as soon
  // as the header has arrived.
  [[nodiscard]] absl::StatusOr<std::optional<ControlMessage>> Next();

  // Bytes buffered and not yet returned as messages.
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
};

struct HostPort {
  std::string host;  // without brackets for IPv6
  uint16_t port = 0;
};

// Parses "host:port" or "[ipv6]:port" (port 1..65535, host non-empty).
[[nodiscard]] absl::StatusOr<HostPort> ParseHostPort(std::string_view endpoint);

}  // namespace kvnode::proto

#endif  // KVNODE_PROTO_CONTROL_H_
