// Per-client write deduplication (contract: "Session semantics").
//
// Each client id has a window of the most recent writes (PUT, DELETE) the node
// applied, keyed by the request's sequence, with the answer that was given
// (status and version). A retry of a write with the same (client id,
// sequence) -- after a lost response, a reconnect or a live-upgrade move -- is
// answered from the window and never applied twice.
//
// Invariants:
//  1. An entry is recorded only for a definitive answer (OK, NOT_FOUND,
//     REJECTED). BUSY and INTERNAL answers are not recorded: the retry must
//     be applied.
//  2. The window keeps the `capacity` most recently recorded entries; when
//     full, the oldest is forgotten and `floor()` rises to its sequence.
//  3. A write whose sequence is <= floor() and not in the window may have
//     been applied already: the server refuses it (REJECTED, kRpcTooOld)
//     rather than risk applying it twice.
//  4. A write answered BUSY or INTERNAL was not applied, and the client
//     holds it and retries it with its sequence, however many later writes
//     are applied meanwhile (held writes are outside its RPC credits). Hold()
//     remembers such a sequence until an answer for it is recorded, and no
//     floor passes the lowest held sequence: floor(), Export()'s and
//     Newest()'s (the persisted one) stop just below it. An applied write
//     above that floor and no longer listed is then not refused if retried:
//     a client retries only writes it has no answer for, which are held or
//     among its newest entries (docs/server.md "Dedupe").
//
// The state is a plain list (Export/Import) so that a live upgrade can hand
// it to the next process. Thread safety: none, const calls included (Newest()
// updates a cache); owned by the data-plane thread.
//
// Memory: the entries themselves in record order, 24 bytes each, and no
// index. The node keeps a window for every client id it remembers (up to
// --max_client_records, most of them clients that left without closing for
// good), so the window's size is what those cost. Lookups stay cheap without
// an index: a client's sequences rise, so a new write is above every recorded
// sequence (one comparison), and a retry is among the newest entries (a short
// scan from the newest end).
//
// Across crashes (docs/format.md "Client records"): every applied write also
// stores, in the same RocksDB batch, its client's newest entries (as many as
// the client may have RPCs outstanding, --rpc_credits) and a floor covering
// every entry left out. A cold start imports those records, so a retry of a
// write applied just before a crash is answered from them (or, if it is older
// than them, refused by invariant 3), never applied a second time.
#ifndef KVNODE_SERVER_DEDUPE_H_
#define KVNODE_SERVER_DEDUPE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvnode::server {

struct PersistedClient;

struct DedupeEntry {
  uint64_t sequence = 0;
  uint8_t opcode = 0;  // proto::Opcode
  uint8_t status = 0;  // proto::RpcStatus given
  uint64_t version = 0;
  friend bool operator==(const DedupeEntry&, const DedupeEntry&) = default;
};

class DedupeWindow {
 public:
  explicit DedupeWindow(size_t capacity = 1024);

  // The recorded answer for `sequence`, or null.
  const DedupeEntry* Find(uint64_t sequence) const;
  // Invariant 3: true if `sequence` is not in the window but not newer than
  // something forgotten.
  bool TooOld(uint64_t sequence) const {
    return has_floor() && sequence <= floor() && !Find(sequence);
  }
  // Records an answer (replacing an entry of the same sequence); its
  // sequence is no longer held.
  void Record(const DedupeEntry& e);
  // Invariant 4: a write of `sequence` (neither in the window nor TooOld)
  // was answered BUSY or INTERNAL. At most kMaxHeld sequences are held, the
  // lowest ones (libkvclient holds at most 256 writes).
  void Hold(uint64_t sequence);
  static constexpr size_t kMaxHeld = 256;

  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }
  // The floor of invariant 3, below every held sequence (invariant 4).
  uint64_t floor() const { return Capped(has_floor_, floor_, LowestHeld()).second; }
  bool has_floor() const { return Capped(has_floor_, floor_, LowestHeld()).first; }
  // The lowest held sequence but `except` and those of `recording`; 0: none.
  uint64_t LowestHeld(uint64_t except = 0, std::span<const DedupeEntry> recording = {}) const;

  // Oldest first. Import(Export()) restores an equal window (floor included).
  struct Exported {
    std::vector<DedupeEntry> entries;
    bool has_floor = false;
    uint64_t floor = 0;
  };
  Exported Export() const;
  static DedupeWindow Import(const Exported& state, size_t capacity);
  // The newest `n` entries (oldest first) with a floor that also covers every
  // entry left out, up to invariant 4: Import() of it answers those n and
  // refuses (TooOld) any other sequence this window answered below the
  // lowest held one.
  // Cost: O(n) when `n` is the one of the previous call (every write asks
  // with the same n, --rpc_credits - 1), O(size()) on the first call with a
  // new n: the floor over the entries left out is kept up to date by Record.
  Exported Newest(size_t n) const;

 private:
  friend PersistedClient PersistedSnapshot(uint64_t, const DedupeWindow&, const DedupeEntry&,
                                           size_t, uint64_t, std::span<const DedupeEntry>);
  // (has, floor) lowered below `lowest_held` (0: none), invariant 4.
  static std::pair<bool, uint64_t> Capped(bool has, uint64_t floor, uint64_t lowest_held) {
    if (!has || lowest_held == 0 || floor < lowest_held) return {has, floor};
    return {lowest_held > 1, lowest_held - 1};
  }
  // Newest() before invariant 4's cap.
  Exported NewestUncapped(size_t n) const;

  // The floor Newest(n) reports for n == newest_n_: the highest of floor_ and
  // of every sequence but the newest n in order_ (has_newest_floor_: there
  // is one). Maintained by Record once a Newest call has set newest_n_.
  void SetNewestCache(size_t n) const;

  // Find, writable: Record replaces an answer in place.
  DedupeEntry* FindEntry(uint64_t sequence);

  size_t capacity_;
  std::deque<DedupeEntry> order_;  // oldest recorded first
  uint64_t max_recorded_ = 0;      // highest sequence ever recorded: Find's fast path
  bool has_floor_ = false;
  uint64_t floor_ = 0;  // highest forgotten sequence
  // Newest()'s cache (a cache: mutable; the window has one owning thread).
  static constexpr size_t kNoNewestCache = SIZE_MAX;
  mutable size_t newest_n_ = kNoNewestCache;
  mutable bool has_newest_floor_ = false;
  mutable uint64_t newest_floor_ = 0;
  std::vector<uint64_t> held_;  // invariant 4, ascending; usually empty
};

// The secret that proves a Hello owns the client id it resumes (the bytes of
// proto::ResumeSecret). All zeros = none: such a record is never resumed.
using ResumeSecret = std::array<uint8_t, 16>;

// What the node remembers about one client id across its sessions.
struct ClientRecord {
  uint64_t client_id = 0;
  DedupeWindow window;
  uint64_t last_active_ns = 0;  // CLOCK_MONOTONIC of the last session end, for eviction
  ResumeSecret secret{};        // what a Hello must present to resume client_id
  // ClientRecords' change count when a session last began or ended on this
  // record: a record without a session changes only then.
  uint64_t changed = 0;
};

// The session table handed from one process to the next in a live upgrade.
struct ClientRecordExport {
  uint64_t client_id = 0;
  DedupeWindow::Exported window;
  ResumeSecret secret{};
};

// Records taken at one instant (ClientRecords::Export).
struct RecordsExport {
  std::vector<ClientRecordExport> records;
  std::vector<uint64_t> client_ids;  // of every record held, exported or not
  uint64_t mark = 0;                 // the change count: the next export's `changed_after`
};

// --- Persisted client records (docs/format.md "Client records") -------------

// One client id's record as stored in RocksDB (a Store side record).
struct PersistedClient {
  uint64_t client_id = 0;
  uint64_t written_unix_ms = 0;   // wall clock of the write that stored it (ageing)
  DedupeWindow::Exported window;  // newest entries, oldest first, and the floor
  ResumeSecret secret{};          // so that the client can resume after a cold start
};

// The record to store with a write that will record `next` in `window`: the
// newest `keep` entries of the window after that write (`next` included).
// `earlier`: the client's writes of the same group commit, in order, which
// `window` records only once the group is durable (they come before `next`).
// The secret is left empty: the caller sets it.
PersistedClient PersistedSnapshot(uint64_t client_id, const DedupeWindow& window,
                                  const DedupeEntry& next, size_t keep, uint64_t now_unix_ms,
                                  std::span<const DedupeEntry> earlier = {});

// Side-record key of a client id: "dedupe/" + 16 lowercase hex digits.
inline constexpr std::string_view kClientRecordPrefix = "dedupe/";
std::string ClientRecordKey(uint64_t client_id);
// The client id of a key made by ClientRecordKey; 0 if it is not one.
uint64_t ParseClientRecordKey(std::string_view key);

std::string EncodeClientRecord(const PersistedClient& c);
// DataLoss on anything malformed (length, version, opcode, status, order).
absl::StatusOr<PersistedClient> DecodeClientRecord(uint64_t client_id, std::string_view bytes);

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_DEDUPE_H_
