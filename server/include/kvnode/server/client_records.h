// The dedupe records of the client ids a node remembers, with a session or
// without one (a client that vanished may still retry), at most
// --max_client_records. Bookkeeping only: no device, no RocksDB (the data
// plane forgets persisted records of evicted ids), and the caller says which
// ids have a live session, so that the rules a live upgrade hands records
// over by are unit-tested (tests/server/client_records_test.cc).
//
// A record without a session changes only when a session of its client
// begins or ends (writes come through sessions). Both stamp it from a
// change count, so an export can name what changed since an earlier one:
// O sends every idle record before it pauses writes and, at HandOver, the
// ones in session or stamped since (docs/upgrade.md, "Records ahead of the
// pause").
//
// Thread safety: none; the data thread owns it (before Run(), the thread
// that starts the node).
#ifndef KVNODE_SERVER_CLIENT_RECORDS_H_
#define KVNODE_SERVER_CLIENT_RECORDS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "kvnode/server/dedupe.h"

namespace kvnode::server {

class ClientRecords {
 public:
  // Whether a client id has a live session.
  using LiveFn = absl::FunctionRef<bool(uint64_t)>;

  ClientRecords(size_t window, size_t max_records) : window_(window), max_(max_records) {}

  ClientRecord* Find(uint64_t client_id);
  bool contains(uint64_t client_id) const { return records_.contains(client_id); }
  size_t size() const { return records_.size(); }

  // A session of `client_id` begins: its record (created with an empty
  // window if there is none), stamped.
  ClientRecord* Open(uint64_t client_id, uint64_t now_ns);
  // A session on `record` ended: stamped, and idle from `now_ns` (eviction
  // order).
  void Closed(ClientRecord* record, uint64_t now_ns);
  void Erase(uint64_t client_id) { records_.erase(client_id); }
  // Evicts the records idle longest, never one in session, until at most
  // max_records are left. Returns the evicted ids.
  std::vector<uint64_t> Trim(LiveFn live);

  // The records in session (when `with_live`) and every other record stamped
  // after `changed_after` (0: all), with every id held and the change count.
  // Records come idle longest first, those in session last: the order is
  // their age (a live upgrade's session table carries no time).
  RecordsExport Export(uint64_t changed_after, bool with_live, LiveFn live) const;
  // Each record replaces the one held for its id, unless that id is in
  // session. `records` come idle longest first (Export's order; a cold
  // start's, oldest written first): each is stamped idle from `now_ns`, after
  // the ones before it, so that eviction keeps their order, and every record
  // imported earlier or stamped before stays older. No trimming: records
  // adopted in batches may exceed max_records until Retain drops the ones
  // the sender forgot meanwhile.
  void Import(const std::vector<ClientRecordExport>& records, uint64_t now_ns, LiveFn live);
  // Drops every record not of `client_ids`. DataLoss (dropping nothing) when
  // one of them has no record.
  absl::Status Retain(const std::vector<uint64_t>& client_ids);

 private:
  size_t window_;
  size_t max_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<ClientRecord>> records_;
  uint64_t changes_ = 0;  // ClientRecord::changed's clock
};

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_CLIENT_RECORDS_H_
