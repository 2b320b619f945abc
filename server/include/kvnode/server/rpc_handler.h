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

#include "absl/status/statusor.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/server/dedupe.h"
#include "kvnode/server/metrics.h"

namespace kvnode::storage {
class Store;
}

namespace kvnode::server {

// The storage the handler writes to. Errors: InvalidArgument (the request was
// bad: REJECTED), Unavailable/FailedPrecondition (not now, e.g. the DB is
// closed for a live upgrade: BUSY), NotFound (GET: NOT_FOUND), others
// INTERNAL.
class KvBackend {
 public:
  virtual ~KvBackend() = default;
  // Returns the version of the write.
  virtual absl::StatusOr<uint64_t> Put(std::string_view key, std::string_view value) = 0;
  // True if the key existed.
  virtual absl::StatusOr<bool> Delete(std::string_view key) = 0;
  struct Value {
    std::string value;
    uint64_t version = 0;
  };
  virtual absl::StatusOr<Value> Get(std::string_view key) = 0;
};

// KvBackend over storage::Store. Single writer assumed (the data-plane
// thread): Delete reads the key first to answer NOT_FOUND for an absent key,
// which Store::Delete does not report.
class StoreBackend final : public KvBackend {
 public:
  explicit StoreBackend(storage::Store* store) : store_(store) {}
  absl::StatusOr<uint64_t> Put(std::string_view key, std::string_view value) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;
  absl::StatusOr<Value> Get(std::string_view key) override;

 private:
  storage::Store* store_;
};

struct RpcContext {
  uint64_t client_id = 0;          // the session's id; requests must carry it
  DedupeWindow* window = nullptr;  // the client's
  KvBackend* backend = nullptr;
  bool writes_paused = false;  // PUT/DELETE answered BUSY (unless deduped)
  Metrics* metrics = nullptr;  // may be null
};

struct RpcResult {
  size_t response_size = 0;  // bytes written to the response buffer
  proto::Opcode opcode = proto::Opcode::kPing;
  proto::RpcStatus status = proto::RpcStatus::kOk;
  uint64_t sequence = 0;
};

// Handles `request` (the received bytes, exactly byte_len) and encodes the
// answer into `response` (at least proto::kMaxRpcMessageSize bytes).
// Undecodable requests are answered REJECTED with the header's sequence when
// the header is readable, else with sequence 0; unknown opcodes are echoed as
// PING (the response format cannot carry an unknown opcode).
RpcResult HandleRpc(std::span<const uint8_t> request, const RpcContext& ctx,
                    std::span<uint8_t> response);

}  // namespace kvnode::server

#endif  // KVNODE_SERVER_RPC_HANDLER_H_
