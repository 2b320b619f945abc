// The handoff header: a small POSIX shared-memory object that the old process
// O writes BEFORE it starts the new process N, and that N validates before it
// disturbs anything (before it attaches the arena, opens the device or says
// Hello). It answers "can this binary take over from that one?" field by
// field, so an incompatible N can say exactly why it refuses.
//
// Object: "/<node shm name>.handoff" in /dev/shm, mode 0600, owned by the
// node's user; fixed kHandoffHeaderSize bytes, little endian, format in
// docs/upgrade.md. It is read with pread (a short object is an error, never a
// SIGBUS). O removes it when the upgrade ends either way; N removes it after
// it took over from an O that died; a node removes a stale one at start.
//
// Thread safety: all functions are reentrant; the object itself has one
// writer (O) and is not modified while N reads it.
#ifndef KVNODE_UPGRADE_HEADER_H_
#define KVNODE_UPGRADE_HEADER_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/upgrade/messages.h"

namespace kvnode::upgrade {

inline constexpr uint64_t kHandoffHeaderMagic = 0x464f444e48564e4bULL;  // "KVNHNDOF"
// Format of the header object itself. Its first 16 bytes (magic, format,
// size) and the checksum in its last 8 bytes are frozen, so any later format
// can still be recognised and reported.
inline constexpr uint32_t kHandoffHeaderFormat = 1;
inline constexpr size_t kHandoffHeaderSize = 1024;
inline constexpr size_t kMaxShmNameSize = 200;  // leaves room for ".handoff" in NAME_MAX

// Capability bits. O writes what the handoff will use in
// required_capabilities; N refuses if it lacks any of them.
inline constexpr uint64_t kCapSessionTable = uint64_t{1} << 0;  // HandOver carries sessions
inline constexpr uint64_t kCapCounters = uint64_t{1} << 1;      // HandOver/Gone carry counters
inline constexpr uint64_t kCapMrImport = uint64_t{1} << 2;  // O can share its PD/MR (ibv_import_*)
// HandOver may carry the etcd lease of a cluster member's key (N renews it
// from then on). O requires it only when it is a cluster member, so that a
// single node still upgrades to and from builds without it.
inline constexpr uint64_t kCapClusterLease = uint64_t{1} << 3;
inline constexpr uint64_t kKnownCapabilities =
    kCapSessionTable | kCapCounters | kCapMrImport | kCapClusterLease;

// What this binary is, as far as a handoff is concerned. The server fills the
// arena fields from kvnode::storage (kLayoutVersion, sizeof(ArenaHeader),
// sizeof(LimboEntry)); O writes them, N compares them with its own.
struct Compat {
  uint32_t handoff_protocol_version = kHandoffProtocolVersion;  // default: this build's
  uint32_t arena_layout_version = 0;  // default 0 = unset (Validate refuses)
  uint32_t sizeof_arena_header = 0;   // default 0 = unset (Validate refuses)
  uint32_t sizeof_limbo_entry = 0;    // default 0 = unset (Validate refuses)
  // As O: bits N must support. Default: sessions and counters.
  uint64_t required_capabilities = kCapSessionTable | kCapCounters;
  // As N: bits this binary supports. Default: all bits this build knows.
  uint64_t supported_capabilities = kKnownCapabilities;

  [[nodiscard]] absl::Status Validate() const;
};

// Test hook behind the server's --upgrade_test_incompatible=WHAT flag: makes
// this binary differ from an otherwise identical one. WHAT is one of
//   layout      arena_layout_version + 1000
//   protocol    handoff_protocol_version + 1000
//   struct      sizeof_arena_header + 8
//   capability  requires (as O) and lacks (as N) capability bit 63
// Applied to only the new binary (e.g. through a wrapper script given as
// --upgrade_binary) it must make N refuse before any client notices.
[[nodiscard]] absl::Status ApplyTestIncompatibility(std::string_view what, Compat* c);

struct HandoffHeader {
  uint32_t header_format = kHandoffHeaderFormat;
  uint32_t handoff_protocol_version = 0;
  uint32_t arena_layout_version = 0;
  uint32_t sizeof_arena_header = 0;
  uint32_t sizeof_limbo_entry = 0;
  uint64_t capabilities = 0;           // what O supports (informational)
  uint64_t required_capabilities = 0;  // what N must support
  uint64_t arena_size = 0;             // bytes in the arena mapping
  uint64_t arena_id = 0;               // ArenaHeader::arena_id; N checks after attaching
  uint64_t generation = 0;             // O's generation; N serves as generation + 1
  uint32_t o_pid = 0;
  uint64_t created_unix_ns = 0;  // informational
  std::string arena_shm_name;    // <= kMaxShmNameSize
  std::string build_id;          // <= kMaxBuildIdSize, O's, informational
  friend bool operator==(const HandoffHeader&, const HandoffHeader&) = default;

  // A header describing `c` (the other fields are the caller's).
  static HandoffHeader For(const Compat& c);
};

// kHandoffHeaderSize bytes, checksum (XXH3-64 of all bytes before it) last.
// InvalidArgument if a string is too long.
[[nodiscard]] absl::StatusOr<std::string> EncodeHandoffHeader(const HandoffHeader& h);
// Checks magic, format, size, checksum, string lengths and zero padding, in
// that order; each error names the field and gives expected vs found.
[[nodiscard]] absl::StatusOr<HandoffHeader> DecodeHandoffHeader(std::span<const uint8_t> bytes);

// One incompatibility between a header and this binary.
struct Mismatch {
  std::string field;
  std::string expected;          // what this binary needs
  std::string found;             // what the header says
  std::string ToString() const;  // "field: expected X, found Y"
};

// What N knows independently of the header; zero/empty fields are not checked.
struct HandoffExpectations {
  pid_t o_pid = 0;             // default 0: not checked (N passes the --upgrade_handoff pid)
  std::string arena_shm_name;  // default "": not checked (N passes its own configuration)
  uint64_t arena_size = 0;     // default 0: not checked
};

// Every field of `h` that `mine` or `expect` disagrees with (empty = compatible).
std::vector<Mismatch> CheckCompatibility(const HandoffHeader& h, const Compat& mine,
                                         const HandoffExpectations& expect);

// --- the shared-memory object -------------------------------------------

// "/<name>.handoff" for a node whose arena shm name is `node_shm_name` (with
// or without its leading '/'). InvalidArgument for names with '/' inside,
// empty or longer than kMaxShmNameSize.
[[nodiscard]] absl::StatusOr<std::string> HandoffHeaderShmName(std::string_view node_shm_name);

// O: writes the header object, mode 0600, replacing a stale one of ours (one
// owned by another user is refused: PermissionDenied).
[[nodiscard]] absl::Status WriteHandoffHeader(std::string_view object_name, const HandoffHeader& h);
// Reads and decodes the object. NotFound if absent; PermissionDenied if it is
// owned by another user or group/other may access it; decode errors as above.
[[nodiscard]] absl::StatusOr<HandoffHeader> ReadHandoffHeader(std::string_view object_name);
// Removes the object; OK if absent.
[[nodiscard]] absl::Status RemoveHandoffHeader(std::string_view object_name);

// N's single call: read, decode, CheckCompatibility. FailedPrecondition with
// every mismatch in the message ("handoff header incompatible: arena_layout_
// version: expected 1, found 1001; ...") and in *mismatches if given.
[[nodiscard]] absl::StatusOr<HandoffHeader> ReadAndValidateHandoffHeader(
    std::string_view object_name, const Compat& mine, const HandoffExpectations& expect,
    std::vector<Mismatch>* mismatches = nullptr);

}  // namespace kvnode::upgrade

#endif  // KVNODE_UPGRADE_HEADER_H_
