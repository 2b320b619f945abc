// What the node does with one RPC request (docs/protocol.md section 2): pure
// logic over a received buffer, a backend and the client's dedupe window,
// producing exactly one response. Every request gets a response -- even one
// that cannot be decoded -- so the client's credit comes back.
//
// Thread safety: none; called by the data-plane thread that owns the
// client's QP and dedupe window.
#ifndef KVNODE_SERVER_RPC_HANDLER_H_
#define KVNODE_SERVER_RPC_HANDLER_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/server/dedupe.h"
#include "kvnode/server/metrics.h"
#include "kvnode/server/shard_gate.h"

namespace kvnode::storage {
class Store;
}

namespace kvnode::server {

// Which client write this is, so that the backend can persist the client's
// dedupe record with it (dedupe.h, "Across crashes").
struct WriteTag {
  uint64_t client_id = 0;                // 0: nothing to persist
  const DedupeWindow* window = nullptr;  // the client's, before this write
  uint64_t sequence = 0;
  proto::Opcode opcode = proto::Opcode::kPut;
  const ResumeSecret* secret = nullptr;  // the client's, persisted with the record
};

// A PUT or DELETE the handler accepted: applied by KvBackend::Write (alone or
// in a group commit), then answered by AnswerWrite. The views point into the
// received request, which must stay put until then.
struct WriteRequest {
  proto::Opcode opcode = proto::Opcode::kPut;  // kPut or kDelete
  std::string_view key;
  std::string_view value;  // kPut
  WriteTag tag;
};

// What became of a WriteRequest. Errors: InvalidArgument (the request was
// bad: REJECTED), Unavailable/FailedPrecondition (not now, e.g. the DB is
// closed for a live upgrade: BUSY), others INTERNAL.
struct WriteReply {
  absl::Status status;
  uint64_t version = 0;  // a PUT's
  bool existed = false;  // a DELETE's: the key was there (else NOT_FOUND)
};

// The storage the handler works on. Get errors: NotFound (NOT_FOUND), the
// rest as for writes.
class KvBackend {
 public:
  virtual ~KvBackend() = default;
  // Applies `requests` in order, replies[i] for requests[i] (same sizes). A
  // backend that persists writes stores each tag's client record atomically
  // with its write.
  virtual void Write(std::span<const WriteRequest> requests, std::span<WriteReply> replies) = 0;
  // The client's in-memory record was aged out: its persisted one may go
  // too. Best effort (errors are logged).
  virtual void ForgetClient(uint64_t client_id) { (void)client_id; }
  struct Value {
    std::string value;
    uint64_t version = 0;
  };
  virtual absl::StatusOr<Value> Get(std::string_view key) = 0;
};

// KvBackend over storage::Store: Write is one Store::Write, a group commit.
//
// Every PUT/DELETE with a tag also writes, in the same RocksDB batch, the
// client's record (docs/format.md "Client records"): its newest
// `record_entries` dedupe entries -- at least the RPCs a client may have
// outstanding (--rpc_credits) -- and a floor covering the rest.
class StoreBackend final : public KvBackend {
 public:
  explicit StoreBackend(storage::Store* store, uint32_t record_entries = 8)
      : store_(store), record_entries_(record_entries) {}
  void Write(std::span<const WriteRequest> requests, std::span<WriteReply> replies) override;
  absl::StatusOr<Value> Get(std::string_view key) override;
  void ForgetClient(uint64_t client_id) override;

  // Cold start: the persisted client records to import into the data plane,
  // the `max` most recently written, oldest written first (the order
  // ClientRecords::Import takes as their age); older and malformed ones are
  // deleted (logged). Needs the DB open.
  absl::StatusOr<std::vector<ClientRecordExport>> LoadClientRecords(size_t max);

 private:
  storage::Store* store_;
  uint32_t record_entries_;
};

struct RpcContext {
  uint64_t client_id = 0;          // the session's id; requests must carry it
  DedupeWindow* window = nullptr;  // the client's
  KvBackend* backend = nullptr;
  bool writes_paused = false;            // PUT/DELETE answered BUSY (unless deduped)
  Metrics* metrics = nullptr;            // may be null
  const ResumeSecret* secret = nullptr;  // the client's resume secret (WriteTag)
  // Cluster membership (ServerOptions::shard_gate set). A GET, PUT or DELETE
  // of a key whose slot `shard` does not own, or any with no `shard` (no map
  // yet), is answered WRONG_SHARD with shard's epoch (0 without) to a session
  // with `shard_map_feature`, REJECTED naming the slot and its owner to
  // another, before the dedupe window is consulted: nothing is applied or
  // remembered, so a retry routed to the right node is applied there.
  bool sharded = false;
  const ShardView* shard = nullptr;
  bool shard_map_feature = false;
};

struct RpcResult {
  size_t response_size = 0;  // bytes written to the response buffer
  proto::Opcode opcode = proto::Opcode::kPing;
  proto::RpcStatus status = proto::RpcStatus::kOk;
  uint64_t sequence = 0;
  bool staged = false;  // a write left in *staged: nothing answered yet
};

// Handles `request` (the received bytes, exactly byte_len) and encodes the
// answer into `response` (at least proto::kMaxRpcMessageSize bytes).
// Undecodable requests are answered REJECTED with the header's sequence when
// the header is readable, else with sequence 0; unknown opcodes are echoed as
// PING (the response format cannot carry an unknown opcode).
//
// With `staged`, a PUT/DELETE that needs the backend is not applied but left
// there (result.staged): the caller applies it with KvBackend::Write, in a
// group with others, and answers it with AnswerWrite. Without, it is applied
// and answered here.
RpcResult HandleRpc(std::span<const uint8_t> request, const RpcContext& ctx,
                    std::span<uint8_t> response, WriteRequest* staged = nullptr);

// Answers a staged write with what the backend did, and remembers a
// definitive answer in ctx.window (the window of the write's client).
RpcResult AnswerWrite(const WriteRequest& write, const WriteReply& reply, const RpcContext& ctx,
                      std::span<uint8_t> response);

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_RPC_HANDLER_H_
