// Hot path: RPC encode/decode, no allocation except the std::string overloads.
#include "kvnode/proto/rpc.h"

#include "absl/strings/str_cat.h"
#include "kvnode/proto/wire.h"

namespace kvnode::proto {
namespace {

using wire::Reader;
using wire::SpanWriter;

bool KnownOpcode(uint8_t op) { return op >= 1 && op <= 4; }
bool KnownStatus(uint8_t st) { return st <= static_cast<uint8_t>(RpcStatus::kWrongShard); }

std::span<uint8_t> StringSpan(std::string* s) {
  return {reinterpret_cast<uint8_t*>(s->data()), s->size()};
}

}  // namespace

std::string_view OpcodeName(Opcode op) {
  switch (op) {
    case Opcode::kGet:
      return "GET";
    case Opcode::kPut:
      return "PUT";
    case Opcode::kDelete:
      return "DELETE";
    case Opcode::kPing:
      return "PING";
  }
  return "?";
}

std::string_view RpcStatusName(RpcStatus st) {
  switch (st) {
    case RpcStatus::kOk:
      return "OK";
    case RpcStatus::kNotFound:
      return "NOT_FOUND";
    case RpcStatus::kRejected:
      return "REJECTED";
    case RpcStatus::kBusy:
      return "BUSY";
    case RpcStatus::kInternal:
      return "INTERNAL";
    case RpcStatus::kWrongShard:
      return "WRONG_SHARD";
  }
  return "?";
}

absl::Status ValidateRequest(const RequestView& r) {
  const auto op = static_cast<uint8_t>(r.opcode);
  if (!KnownOpcode(op)) {
    return absl::InvalidArgumentError(absl::StrCat("rpc: unknown opcode ", op));
  }
  if (r.key.size() > storage::kMaxKeySize) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpc: key of ", r.key.size(), " bytes exceeds limit ", storage::kMaxKeySize));
  }
  if (r.value.size() > storage::kMaxValueSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rpc: value of ", r.value.size(), " bytes exceeds limit ", storage::kMaxValueSize));
  }
  const bool wants_key = r.opcode != Opcode::kPing;
  if (wants_key == r.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("rpc: ", wire::Av(OpcodeName(r.opcode)),
                                                   wants_key ? " needs a key" : " takes no key"));
  }
  const bool takes_value = r.opcode == Opcode::kPut || r.opcode == Opcode::kPing;
  if (!takes_value && !r.value.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpc: ", wire::Av(OpcodeName(r.opcode)), " takes no value"));
  }
  return absl::OkStatus();
}

absl::Status ValidateResponse(const ResponseView& r) {
  const auto op = static_cast<uint8_t>(r.opcode);
  if (!KnownOpcode(op)) {
    return absl::InvalidArgumentError(absl::StrCat("rpc: unknown opcode ", op));
  }
  const auto st = static_cast<uint8_t>(r.status);
  if (!KnownStatus(st)) {
    return absl::InvalidArgumentError(absl::StrCat("rpc: unknown status ", st));
  }
  if (r.value.size() > storage::kMaxValueSize) {
    return absl::InvalidArgumentError(absl::StrCat("rpc: response value of ", r.value.size(),
                                                   " bytes exceeds limit ",
                                                   storage::kMaxValueSize));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> EncodeRequest(const RequestView& r, std::span<uint8_t> buf) {
  if (absl::Status s = ValidateRequest(r); !s.ok()) return s;
  const size_t n = EncodedSize(r);
  if (buf.size() < n) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rpc: request needs ", n, " bytes, buffer has ", buf.size()));
  }
  SpanWriter w(buf);
  w.U8(kRpcVersion);
  w.U8(static_cast<uint8_t>(r.opcode));
  w.U16(static_cast<uint16_t>(r.key.size()));
  w.U32(static_cast<uint32_t>(r.value.size()));
  w.U64(r.client_id);
  w.U64(r.sequence);
  w.Bytes(r.key);
  w.Bytes(r.value);
  if (!w.ok() || w.pos() != n) return absl::InternalError("rpc: request encoder overran");
  return n;
}

absl::StatusOr<size_t> EncodeResponse(const ResponseView& r, std::span<uint8_t> buf) {
  if (absl::Status s = ValidateResponse(r); !s.ok()) return s;
  const size_t n = EncodedSize(r);
  if (buf.size() < n) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rpc: response needs ", n, " bytes, buffer has ", buf.size()));
  }
  SpanWriter w(buf);
  w.U8(kRpcVersion);
  w.U8(static_cast<uint8_t>(r.status));
  w.U8(static_cast<uint8_t>(r.opcode));
  w.U8(0);  // flags: none defined
  w.U32(static_cast<uint32_t>(r.value.size()));
  w.U64(r.sequence);
  w.U64(r.version);
  w.Bytes(r.value);
  if (!w.ok() || w.pos() != n) return absl::InternalError("rpc: response encoder overran");
  return n;
}

absl::Status EncodeRequest(const RequestView& r, std::string* out) {
  if (absl::Status s = ValidateRequest(r); !s.ok()) return s;
  out->resize(EncodedSize(r));
  return EncodeRequest(r, StringSpan(out)).status();
}

absl::Status EncodeResponse(const ResponseView& r, std::string* out) {
  if (absl::Status s = ValidateResponse(r); !s.ok()) return s;
  out->resize(EncodedSize(r));
  return EncodeResponse(r, StringSpan(out)).status();
}

absl::StatusOr<RequestHeader> DecodeRequestHeader(std::span<const uint8_t> msg) {
  Reader r(msg);
  uint8_t version;
  RequestHeader h;
  if (!r.U8(&version) || !r.U8(&h.opcode) || !r.U16(&h.key_len) || !r.U32(&h.value_len) ||
      !r.U64(&h.client_id) || !r.U64(&h.sequence)) {
    return absl::DataLossError(
        absl::StrCat("rpc: request of ", msg.size(), " bytes is shorter than its header"));
  }
  if (version != kRpcVersion) {
    return absl::FailedPreconditionError(absl::StrCat("rpc: unsupported RPC version ", version,
                                                      " (this build speaks ", kRpcVersion, ")"));
  }
  return h;
}

absl::StatusOr<RequestView> DecodeRequest(std::span<const uint8_t> msg) {
  absl::StatusOr<RequestHeader> h = DecodeRequestHeader(msg);
  if (!h.ok()) return h.status();
  if (!KnownOpcode(h->opcode)) {
    return absl::InvalidArgumentError(absl::StrCat("rpc: unknown opcode ", h->opcode));
  }
  if (h->key_len > storage::kMaxKeySize || h->value_len > storage::kMaxValueSize) {
    return absl::InvalidArgumentError(absl::StrCat("rpc: key ", h->key_len, " / value ",
                                                   h->value_len, " bytes exceed the limits"));
  }
  // Both lengths are bounded above, so the sum cannot overflow.
  const size_t want = kRpcHeaderSize + h->key_len + h->value_len;
  if (msg.size() != want) {
    return absl::DataLossError(
        absl::StrCat("rpc: request is ", msg.size(), " bytes, header says ", want));
  }
  Reader r(msg.subspan(kRpcHeaderSize));
  RequestView v;
  v.opcode = static_cast<Opcode>(h->opcode);
  v.client_id = h->client_id;
  v.sequence = h->sequence;
  if (!r.View(h->key_len, &v.key) || !r.View(h->value_len, &v.value)) {
    return absl::DataLossError("rpc: truncated request body");
  }
  if (absl::Status s = ValidateRequest(v); !s.ok()) return s;
  return v;
}

absl::StatusOr<ResponseView> DecodeResponse(std::span<const uint8_t> msg) {
  Reader r(msg);
  uint8_t version, status, opcode, flags;
  uint32_t value_len;
  ResponseView v;
  if (!r.U8(&version) || !r.U8(&status) || !r.U8(&opcode) || !r.U8(&flags) || !r.U32(&value_len) ||
      !r.U64(&v.sequence) || !r.U64(&v.version)) {
    return absl::DataLossError(
        absl::StrCat("rpc: response of ", msg.size(), " bytes is shorter than its header"));
  }
  if (version != kRpcVersion) {
    return absl::FailedPreconditionError(absl::StrCat("rpc: unsupported RPC version ", version,
                                                      " (this build speaks ", kRpcVersion, ")"));
  }
  if (!KnownOpcode(opcode)) {
    return absl::InvalidArgumentError(absl::StrCat("rpc: unknown opcode ", opcode));
  }
  if (!KnownStatus(status)) {
    return absl::InvalidArgumentError(absl::StrCat("rpc: unknown status ", status));
  }
  if (flags != 0) {
    return absl::InvalidArgumentError(absl::StrCat("rpc: unknown response flags ", flags));
  }
  if (value_len > storage::kMaxValueSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpc: response value of ", value_len, " bytes exceeds the limit"));
  }
  if (msg.size() != kRpcHeaderSize + value_len) {
    return absl::DataLossError(absl::StrCat("rpc: response is ", msg.size(), " bytes, header says ",
                                            kRpcHeaderSize + value_len));
  }
  v.opcode = static_cast<Opcode>(opcode);
  v.status = static_cast<RpcStatus>(status);
  if (!r.View(value_len, &v.value)) return absl::DataLossError("rpc: truncated response body");
  return v;
}

}  // namespace kvnode::proto
