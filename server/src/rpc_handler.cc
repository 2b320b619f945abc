#include "kvnode/server/rpc_handler.h"

#include "absl/strings/str_cat.h"
#include "kvnode/storage/limits.h"
#include "kvnode/storage/store.h"

namespace kvnode::server {
namespace {

std::string_view Sv(absl::string_view s) { return {s.data(), s.size()}; }

using proto::Opcode;
using proto::RpcStatus;

bool KnownOpcode(uint8_t op) { return op >= 1 && op <= 4; }

RpcResult Answer(Opcode op, RpcStatus status, uint64_t sequence, uint64_t version,
                 std::string_view value, std::span<uint8_t> response) {
  if (value.size() > storage::kMaxValueSize) value = value.substr(0, storage::kMaxValueSize);
  proto::ResponseView r{op, status, sequence, version, value};
  absl::StatusOr<size_t> n = proto::EncodeResponse(r, response);
  if (!n.ok()) {
    // Only possible with a response buffer smaller than kMaxRpcMessageSize
    // (a bug); answer without the value.
    r.value = {};
    n = proto::EncodeResponse(r, response);
  }
  return RpcResult{n.ok() ? *n : 0, op, status, sequence};
}

RpcStatus StatusFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return RpcStatus::kRejected;
    case absl::StatusCode::kNotFound:
      return RpcStatus::kNotFound;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition:
      return RpcStatus::kBusy;
    default:
      return RpcStatus::kInternal;
  }
}

void Count(const RpcContext& ctx, ErrorKind k) {
  if (ctx.metrics != nullptr) ctx.metrics->Error(k);
}
void Count(const RpcContext& ctx, Counter c) {
  if (ctx.metrics != nullptr) ctx.metrics->Add(c);
}

}  // namespace

absl::StatusOr<uint64_t> StoreBackend::Put(std::string_view key, std::string_view value) {
  return store_->Put(key, value);
}

absl::StatusOr<bool> StoreBackend::Delete(std::string_view key) {
  absl::StatusOr<storage::Store::GetResult> before = store_->Get(key);
  bool existed = true;
  if (!before.ok()) {
    if (before.status().code() != absl::StatusCode::kNotFound) return before.status();
    existed = false;
  }
  if (absl::Status s = store_->Delete(key); !s.ok()) return s;
  return existed;
}

absl::StatusOr<KvBackend::Value> StoreBackend::Get(std::string_view key) {
  absl::StatusOr<storage::Store::GetResult> r = store_->Get(key);
  if (!r.ok()) return r.status();
  return Value{std::move(r->value), r->version};
}

RpcResult HandleRpc(std::span<const uint8_t> request, const RpcContext& ctx,
                    std::span<uint8_t> response) {
  absl::StatusOr<proto::RequestView> req = proto::DecodeRequest(request);
  if (!req.ok()) {
    absl::StatusOr<proto::RequestHeader> h = proto::DecodeRequestHeader(request);
    const uint64_t seq = h.ok() ? h->sequence : 0;
    Opcode op = Opcode::kPing;
    ErrorKind kind = ErrorKind::kRpcMalformed;
    if (h.ok()) {
      if (KnownOpcode(h->opcode)) {
        op = static_cast<Opcode>(h->opcode);
        if (h->key_len > storage::kMaxKeySize || h->value_len > storage::kMaxValueSize) {
          kind = ErrorKind::kRpcOversize;
        }
      } else {
        kind = ErrorKind::kRpcUnknownOpcode;
      }
    }
    Count(ctx, kind);
    return Answer(op, RpcStatus::kRejected, seq, 0, Sv(req.status().message()), response);
  }
  const proto::RequestView& r = *req;
  if (r.client_id != ctx.client_id) {
    Count(ctx, ErrorKind::kRpcWrongClient);
    return Answer(
        r.opcode, RpcStatus::kRejected, r.sequence, 0,
        absl::StrCat("request names client ", r.client_id, " but this session is ", ctx.client_id),
        response);
  }
  switch (r.opcode) {
    case Opcode::kPing:
      Count(ctx, Counter::kOpsPing);
      return Answer(Opcode::kPing, RpcStatus::kOk, r.sequence, 0, r.value, response);

    case Opcode::kGet: {
      Count(ctx, Counter::kOpsGetRpc);
      absl::StatusOr<KvBackend::Value> v = ctx.backend->Get(r.key);
      if (!v.ok()) {
        const RpcStatus st = StatusFor(v.status());
        if (st == RpcStatus::kInternal) Count(ctx, ErrorKind::kStorage);
        return Answer(Opcode::kGet, st, r.sequence, 0,
                      st == RpcStatus::kNotFound ? std::string_view() : Sv(v.status().message()),
                      response);
      }
      return Answer(Opcode::kGet, RpcStatus::kOk, r.sequence, v->version, v->value, response);
    }

    case Opcode::kPut:
    case Opcode::kDelete: {
      Count(ctx, r.opcode == Opcode::kPut ? Counter::kOpsPut : Counter::kOpsDelete);
      if (const DedupeEntry* e = ctx.window->Find(r.sequence); e != nullptr) {
        Count(ctx, Counter::kDedupeHits);
        return Answer(r.opcode, static_cast<RpcStatus>(e->status), r.sequence, e->version, {},
                      response);
      }
      if (ctx.window->TooOld(r.sequence)) {
        Count(ctx, ErrorKind::kRpcTooOld);
        return Answer(
            r.opcode, RpcStatus::kRejected, r.sequence, 0,
            absl::StrCat("sequence ", r.sequence, " is older than the dedupe window (floor ",
                         ctx.window->floor(), "): it may have been applied"),
            response);
      }
      if (ctx.writes_paused) {
        Count(ctx, Counter::kRpcBusy);
        return Answer(r.opcode, RpcStatus::kBusy, r.sequence, 0, "writes paused", response);
      }
      RpcStatus st = RpcStatus::kOk;
      uint64_t version = 0;
      std::string reason;
      if (r.opcode == Opcode::kPut) {
        absl::StatusOr<uint64_t> v = ctx.backend->Put(r.key, r.value);
        if (v.ok()) {
          version = *v;
        } else {
          st = StatusFor(v.status());
          if (st == RpcStatus::kNotFound) st = RpcStatus::kInternal;
          reason = std::string(Sv(v.status().message()));
        }
      } else {
        absl::StatusOr<bool> existed = ctx.backend->Delete(r.key);
        if (existed.ok()) {
          st = *existed ? RpcStatus::kOk : RpcStatus::kNotFound;
        } else {
          st = StatusFor(existed.status());
          if (st == RpcStatus::kNotFound) st = RpcStatus::kInternal;
          reason = std::string(Sv(existed.status().message()));
        }
      }
      if (st == RpcStatus::kInternal) Count(ctx, ErrorKind::kStorage);
      if (st == RpcStatus::kBusy) Count(ctx, Counter::kRpcBusy);
      // Invariant 1 of dedupe.h: only definitive answers are remembered.
      if (st == RpcStatus::kOk || st == RpcStatus::kNotFound || st == RpcStatus::kRejected) {
        ctx.window->Record(DedupeEntry{r.sequence, static_cast<uint8_t>(r.opcode),
                                       static_cast<uint8_t>(st), version});
      }
      return Answer(r.opcode, st, r.sequence, version, reason, response);
    }
  }
  Count(ctx, ErrorKind::kRpcUnknownOpcode);
  return Answer(Opcode::kPing, RpcStatus::kRejected, r.sequence, 0, "unknown opcode", response);
}

}  // namespace kvnode::server
