// The handoff protocol: the messages the old process O and the new process N
// exchange over their Unix stream socket during a live upgrade. The byte
// format and the conversation are specified in docs/upgrade.md; this header is
// its C++ face. Same conventions as the client protocol (docs/protocol.md):
//
//   magic u32 "KVNH" | version u16 | type u16 | payload_size u32 | payload
//
// all little endian, no padding. Encoders refuse fields a decoder would
// reject. Decoders never trust their input: every count and length is checked
// against the bytes present and its limit BEFORE anything is allocated;
// truncation, trailing bytes, unknown types, duplicates and out-of-range values
// are statuses (DataLoss for truncation and length mismatches,
// InvalidArgument for bad values, FailedPrecondition for another version).
//
// The plain structs SessionTable and CounterSnapshot have codecs of their own
// so that the server can also use them outside a frame.
//
// Thread safety: all functions are pure.
#ifndef KVNODE_UPGRADE_MESSAGES_H_
#define KVNODE_UPGRADE_MESSAGES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvnode::upgrade {

// Version of the handoff messages AND of the conversation. O writes it into
// the handoff header; N refuses another one there, before any frame flows.
// Bump on any incompatible change and record it in docs/upgrade.md.
inline constexpr uint16_t kHandoffProtocolVersion = 4;

// "KVNH" as the first four bytes of every frame (read as a little-endian u32).
inline constexpr uint32_t kHandoffFrameMagic = 0x484e564b;
inline constexpr size_t kHandoffFrameHeaderSize = 12;
// Largest payload accepted; checked from the frame header alone. A session
// table that does not fit travels in several Sessions messages (one client
// record always fits one, see kMaxDedupeWindow).
inline constexpr size_t kMaxHandoffPayloadSize = size_t{64} << 20;
// File descriptors one frame may carry (SCM_RIGHTS).
inline constexpr size_t kMaxHandoffFds = 8;

// Field limits.
inline constexpr size_t kMaxBuildIdSize = 256;
inline constexpr size_t kMaxAbortMessageSize = 4096;
inline constexpr size_t kMaxCounterNameSize = 128;
inline constexpr size_t kMaxCounters = 4096;
// Entries per client: --dedupe_window's upper limit, so that a window always
// crosses whole.
inline constexpr size_t kMaxDedupeWindow = size_t{1} << 20;
// Sessions messages before one HandOver (a table of 2^32-1 records with
// full windows is far beyond that anyway).
inline constexpr size_t kMaxSessionChunks = 1 << 20;
// Client ids HandOver may list (8 bytes each: a quarter of a payload).
inline constexpr size_t kMaxHandOverClientIds = kMaxHandoffPayloadSize / 32;

enum class HandoffType : uint16_t {
  kHello = 1,     // N -> O: header accepted; who N is
  kReady = 2,     // N -> O: arena attached and registered, N can serve reads
  kHandOver = 3,  // O -> N: the writer switch: O released RocksDB and writes no more;
                  // listen/admin fds + sessions + counters + last version
  kOwned = 4,     // N -> O: N the writer (journal), accepting; the point of no return
  kGone = 5,      // O -> N: O drained and deregistered; it exits 0 next
  kAbort = 6,     // either way: the upgrade is off (layout frozen, any version)
  kSessions = 7,  // O -> N, before HandOver: a part of the session table
  kReleased = 8,  // O -> N, after Owned: O closed RocksDB; N may open it
  kAdopted = 9,   // N -> O: the answer to each Sessions: its records are taken in
};

// "Hello", ..., "Unknown(N)".
std::string HandoffTypeName(uint16_t type);

// --- plain structs that cross -------------------------------------------

// One applied write remembered for deduplication: a retry with the same
// (client_id, sequence) is answered from here, never applied twice.
// Only what the server records (dedupe.h invariant 1) crosses: the codecs
// refuse any other opcode or status, so that N never imports, and later
// persists, an entry that a cold start would reject.
struct DedupeEntry {
  uint64_t sequence = 0;
  uint8_t opcode = 0;    // kvnode::proto::Opcode of the write: PUT or DELETE
  uint8_t status = 0;    // kvnode::proto::RpcStatus answered: OK, NOT_FOUND or REJECTED
  uint64_t version = 0;  // object version the answer carried
  friend bool operator==(const DedupeEntry&, const DedupeEntry&) = default;
};

struct SessionRecord {
  uint64_t client_id = 0;           // != 0
  uint64_t highest_sequence = 0;    // highest sequence applied for this client
  std::vector<DedupeEntry> window;  // <= kMaxDedupeWindow entries, any order
  // What a Hello must present to resume client_id (control protocol
  // Welcome.resume_secret); all zeros = none, never resumed.
  std::array<uint8_t, 16> resume_secret{};
  friend bool operator==(const SessionRecord&, const SessionRecord&) = default;
};

// What N needs to keep client ids and write deduplication exact.
struct SessionTable {
  uint64_t next_client_id = 1;          // N hands out ids from here on (never reuses one)
  std::vector<SessionRecord> sessions;  // client ids unique
  friend bool operator==(const SessionTable&, const SessionTable&) = default;
};

// Monotonic service counters by name (names are the server's business; N
// adds the values to its own counters of the same name, keeps unknown ones).
struct Counter {
  std::string name;  // 1..kMaxCounterNameSize bytes
  uint64_t value = 0;
  friend bool operator==(const Counter&, const Counter&) = default;
};
struct CounterSnapshot {
  std::vector<Counter> counters;  // <= kMaxCounters, names unique
  friend bool operator==(const CounterSnapshot&, const CounterSnapshot&) = default;
};

// --- messages ------------------------------------------------------------

// N -> O, first frame, sent only after N validated the handoff header.
struct Hello {
  uint16_t protocol_version = kHandoffProtocolVersion;  // must equal the frame's
  uint32_t pid = 0;                                     // N's pid (O cross-checks)
  uint64_t generation = 0;    // the generation N will serve as (header's + 1)
  uint64_t capabilities = 0;  // capability bits N accepted from the header
  std::string build_id;       // <= kMaxBuildIdSize, for logs
  friend bool operator==(const Hello&, const Hello&) = default;
};

// N -> O: arena attached and registered (or imported); N's rkey is valid.
struct Ready {
  uint32_t rkey = 0;
  uint64_t arena_remote_addr = 0;  // remote address of arena offset 0
  uint64_t arena_id = 0;           // ArenaHeader::arena_id N attached (O cross-checks)
  uint64_t registered_bytes = 0;
  uint8_t mr_imported = 0;  // 1: O's MR imported (rkey unchanged); 0: registered anew
  friend bool operator==(const Ready&, const Ready&) = default;
};

// Role of each descriptor passed with HandOver, in SCM_RIGHTS order.
enum class FdRole : uint8_t {
  kListenTcp = 1,    // the client listener (bound, listening)
  kAdminSocket = 2,  // the admin Unix listener
};

// O -> N, with len(fd_roles) descriptors attached. O released RocksDB.
// The session table N adopts: of the records in the `session_chunks`
// Sessions messages O sent since Ready, then in sessions.sessions, the last
// one of each client id in `client_ids`. Every listed id has a record; a
// record whose id is not listed is dropped (O forgot it since it sent it).
struct HandOver {
  uint64_t generation = 0;       // N's generation (== Hello.generation)
  std::vector<FdRole> fd_roles;  // <= kMaxHandoffFds, no duplicates
  SessionTable sessions;
  CounterSnapshot counters;
  uint32_t session_chunks = 0;            // <= kMaxSessionChunks
  uint64_t last_version = 0;              // version of O's last write: N's writes go on from it
  std::vector<uint64_t> client_ids = {};  // <= kMaxHandOverClientIds, unique, none 0
  // kCapClusterLease: the etcd lease of the node's member key, which O no
  // longer renews (N does from now on); >= 0, 0 = none. A HandOver without
  // one is encoded exactly as before the capability existed.
  int64_t cluster_lease = 0;
  friend bool operator==(const HandOver&, const HandOver&) = default;
};

// O -> N, zero or more between Ready and HandOver: client records. O sends
// the records of clients without a session before it pauses writes, and at
// HandOver those that changed since, or have a session (HandOver says which
// records stand). Client ids are unique within one message.
struct Sessions {
  std::vector<SessionRecord> sessions;
  friend bool operator==(const Sessions&, const Sessions&) = default;
};

// N -> O: N opened RocksDB and accepts on the listener.
struct Owned {
  uint64_t generation = 0;
  uint32_t pid = 0;
  friend bool operator==(const Owned&, const Owned&) = default;
};

// O -> N: every client moved or was cut, O's QPs drained, MRs deregistered.
struct Gone {
  uint64_t clients_moved = 0;
  uint64_t clients_cut = 0;
  CounterSnapshot counters_delta;  // what O counted after the HandOver snapshot
  friend bool operator==(const Gone&, const Gone&) = default;
};

enum class AbortCode : uint32_t {
  kIncompatible = 1,   // header or version check failed (message says which field)
  kDeadline = 2,       // a phase overran its deadline
  kInternal = 3,       // a local step failed (message says which)
  kPeerRefused = 4,    // the peer failed the credential / protocol checks
  kInjectedFault = 5,  // --upgrade_fault=...:fail
  kCanceled = 6,       // e.g. O is shutting down
};

// Either way. The layout is frozen forever and accepted at any frame version,
// so an incompatible N can still explain itself. Unknown codes are accepted.
struct Abort {
  uint32_t code = 0;
  std::string message;  // <= kMaxAbortMessageSize
  friend bool operator==(const Abort&, const Abort&) = default;
};

struct Released {
  uint64_t generation = 0;  // N's generation (== HandOver.generation)
  friend bool operator==(const Released&, const Released&) = default;
};

// N -> O, once per Sessions message, when N has taken its records in. O
// waits for these before it pauses writes (and before HandOver), so that
// N's work on the records sent ahead is not done while writes wait.
struct Adopted {
  uint32_t records = 0;  // the Sessions message's record count
  friend bool operator==(const Adopted&, const Adopted&) = default;
};

using HandoffMessage =
    std::variant<Hello, Ready, HandOver, Owned, Gone, Abort, Sessions, Released, Adopted>;

HandoffType TypeOf(const HandoffMessage& m);

// --- codecs --------------------------------------------------------------

// Appends one whole frame to *frame. Fails (appending nothing) when a field is
// out of range or the payload would exceed kMaxHandoffPayloadSize.
[[nodiscard]] absl::Status EncodeHandoff(const HandoffMessage& m, std::string* frame);

struct HandoffFrameHeader {
  uint16_t version = 0;
  uint16_t type = 0;
  uint32_t payload_size = 0;
};
// Decodes and checks magic and payload size (version and type are checked by
// DecodeHandoffPayload, so that Abort can pass at any version).
[[nodiscard]] absl::StatusOr<HandoffFrameHeader> DecodeHandoffFrameHeader(
    std::span<const uint8_t> header);
// Decodes a payload that must be consumed exactly.
[[nodiscard]] absl::StatusOr<HandoffMessage> DecodeHandoffPayload(const HandoffFrameHeader& h,
                                                                  std::span<const uint8_t> payload);
// A whole frame, header and payload, with nothing after it.
[[nodiscard]] absl::StatusOr<HandoffMessage> DecodeHandoff(std::span<const uint8_t> frame);

// Stand-alone codecs of the plain structs (the same bytes as inside HandOver
// and Gone).
[[nodiscard]] absl::Status EncodeSessionTable(const SessionTable& t, std::string* out);
[[nodiscard]] absl::StatusOr<SessionTable> DecodeSessionTable(std::span<const uint8_t> in);
[[nodiscard]] absl::Status EncodeCounters(const CounterSnapshot& c, std::string* out);
[[nodiscard]] absl::StatusOr<CounterSnapshot> DecodeCounters(std::span<const uint8_t> in);

// --- a session table of any size ------------------------------------------

// Splits `records` into Sessions messages whose payloads are at most
// `max_payload` bytes each (kMaxHandoffPayloadSize for real; smaller in
// tests), in order, none empty. Fails only when one record alone does not
// fit (impossible at kMaxHandoffPayloadSize within kMaxDedupeWindow) or more
// than kMaxSessionChunks would be needed.
[[nodiscard]] absl::StatusOr<std::vector<Sessions>> SplitSessions(
    std::vector<SessionRecord> records, size_t max_payload = kMaxHandoffPayloadSize);

inline std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace kvnode::upgrade

#endif  // KVNODE_UPGRADE_MESSAGES_H_
