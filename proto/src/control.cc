#include "kvnode/proto/control.h"

#include <charconv>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kvnode/proto/wire.h"

namespace kvnode::proto {
namespace {

using wire::Reader;
using wire::StringWriter;

constexpr size_t kQpInfoSize = 28;
constexpr uint32_t kMax24 = 0xffffff;

absl::Status Truncated(std::string_view what) {
  return absl::DataLossError(absl::StrCat("control: truncated ", wire::Av(what)));
}

absl::Status CheckLen(std::string_view field, size_t size, size_t max) {
  if (size > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("control: ", wire::Av(field), " is ", size, " bytes, limit ", max));
  }
  return absl::OkStatus();
}

absl::Status CheckQp(const QpInfo& qp, std::string_view who) {
  if (qp.qpn > kMax24 || qp.psn > kMax24) {
    return absl::InvalidArgumentError(absl::StrCat("control: ", wire::Av(who), " QPN ", qp.qpn,
                                                   " or PSN ", qp.psn, " exceeds 24 bits"));
  }
  if (qp.mtu < 1 || qp.mtu > 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("control: ", wire::Av(who), " MTU enum ", qp.mtu, " not in 1..5"));
  }
  return absl::OkStatus();
}

void PutString(StringWriter& w, std::string_view s) {
  w.U16(static_cast<uint16_t>(s.size()));
  w.Bytes(s);
}

bool GetString(Reader& r, size_t max, std::string* s, absl::Status* err, std::string_view field) {
  uint16_t len;
  if (!r.U16(&len)) {
    *err = Truncated(absl::StrCat(wire::Av(field), " length"));
    return false;
  }
  if (len > max) {
    *err = CheckLen(field, len, max);
    return false;
  }
  std::string_view v;
  if (!r.View(len, &v)) {
    *err = Truncated(field);
    return false;
  }
  s->assign(v);
  return true;
}

void PutQp(StringWriter& w, const QpInfo& qp) {
  w.U32(qp.qpn);
  w.U32(qp.psn);
  w.Bytes(std::string_view(reinterpret_cast<const char*>(qp.gid.data()), qp.gid.size()));
  w.U16(qp.lid);
  w.U8(qp.mtu);
  w.U8(qp.port);
}

bool GetQp(Reader& r, QpInfo* qp) {
  if (r.remaining() < kQpInfoSize) return false;
  return r.U32(&qp->qpn) && r.U32(&qp->psn) && r.Copy(qp->gid.data(), qp->gid.size()) &&
         r.U16(&qp->lid) && r.U8(&qp->mtu) && r.U8(&qp->port);
}

void PutSecret(StringWriter& w, const ResumeSecret& s) {
  w.Bytes(std::string_view(reinterpret_cast<const char*>(s.data()), s.size()));
}

bool GetSecret(Reader& r, ResumeSecret* s) { return r.Copy(s->data(), s->size()); }

// ---- per-message encode (payload only) ----

absl::Status EncodePayload(const Hello& m, uint16_t version, StringWriter& w) {
  if (auto s = CheckLen("auth token", m.auth_token.size(), kMaxAuthTokenSize); !s.ok()) return s;
  if (auto s = CheckLen("client name", m.client_name.size(), kMaxClientNameSize); !s.ok()) {
    return s;
  }
  if (m.protocol_version != version) {
    return absl::InvalidArgumentError(absl::StrCat(
        "control: Hello.protocol_version ", m.protocol_version, " but the frame says ", version));
  }
  w.U16(m.protocol_version);
  w.U64(m.client_id);
  PutSecret(w, m.resume_secret);
  w.U64(m.features);
  PutString(w, m.auth_token);
  PutString(w, m.client_name);
  return absl::OkStatus();
}

// The slot-words fields (kFeatureSlotWords): an 8-byte aligned table of
// whole words. Where it lies in the arena is the client's to check.
absl::Status CheckSlotWords(const Welcome& m) {
  if ((m.features & kFeatureSlotWords) == 0) return absl::OkStatus();
  if (m.slot_words_offset == 0 || m.slot_words_offset % 8 != 0 || m.slot_words_size == 0 ||
      m.slot_words_size % 8 != 0 || m.slot_words_size > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "control: Welcome slot words at ", m.slot_words_offset, ", ", m.slot_words_size,
        " bytes: want a non-zero 8-byte aligned offset and 8..", kMaxSlots, " whole words"));
  }
  return absl::OkStatus();
}

absl::Status EncodePayload(const Welcome& m, StringWriter& w) {
  if (m.client_id == 0) return absl::InvalidArgumentError("control: Welcome.client_id is 0");
  if (auto s = CheckSlotWords(m); !s.ok()) return s;
  if (m.max_rpc_credits == 0) {
    return absl::InvalidArgumentError("control: Welcome.max_rpc_credits is 0");
  }
  if (auto s = CheckQp(m.server_qp, "server"); !s.ok()) return s;
  if (auto s = CheckLen("index geometry", m.index_geometry.size(), kMaxIndexGeometrySize);
      !s.ok()) {
    return s;
  }
  w.U64(m.client_id);
  PutSecret(w, m.resume_secret);
  w.U64(m.server_generation);
  w.U64(m.features);
  PutQp(w, m.server_qp);
  w.U32(m.rkey);
  w.U64(m.arena_remote_addr);
  w.U64(m.arena_size);
  w.U32(m.max_rpc_credits);
  w.U32(m.max_rpc_message_size);
  w.U32(m.max_key_size);
  w.U32(m.max_value_size);
  PutString(w, m.index_geometry);
  if ((m.features & kFeatureSlotWords) != 0) {
    w.U64(m.slot_words_offset);
    w.U32(m.slot_words_size);
    w.U64(m.check_below_epoch);
  }
  return absl::OkStatus();
}

absl::Status EncodePayload(const ClientQp& m, StringWriter& w) {
  if (auto s = CheckQp(m.qp, "client"); !s.ok()) return s;
  PutQp(w, m.qp);
  return absl::OkStatus();
}

absl::Status EncodePayload(const Ready&, StringWriter&) { return absl::OkStatus(); }

absl::Status EncodePayload(const Keepalive& m, StringWriter& w) {
  w.U64(m.nonce);
  return absl::OkStatus();
}

absl::Status EncodePayload(const KeepaliveAck& m, StringWriter& w) {
  w.U64(m.nonce);
  return absl::OkStatus();
}

absl::Status EncodePayload(const Move& m, StringWriter& w) {
  if (auto s = CheckLen("move endpoint", m.endpoint.size(), kMaxEndpointSize); !s.ok()) return s;
  if (auto hp = ParseHostPort(m.endpoint); !hp.ok()) return hp.status();
  w.U32(static_cast<uint32_t>(m.reason));
  w.U64(m.new_generation);
  w.U32(m.deadline_ms);
  PutString(w, m.endpoint);
  return absl::OkStatus();
}

absl::Status EncodePayload(const MoveAck& m, StringWriter& w) {
  w.U64(m.new_generation);
  return absl::OkStatus();
}

absl::Status EncodePayload(const Goodbye& m, StringWriter& w) {
  if (auto s = CheckLen("goodbye message", m.message.size(), kMaxMessageTextSize); !s.ok()) {
    return s;
  }
  w.U32(static_cast<uint32_t>(m.reason));
  PutString(w, m.message);
  return absl::OkStatus();
}

absl::Status EncodePayload(const Error& m, StringWriter& w) {
  if (auto s = CheckLen("error message", m.message.size(), kMaxMessageTextSize); !s.ok()) {
    return s;
  }
  w.U32(static_cast<uint32_t>(m.code));
  PutString(w, m.message);
  return absl::OkStatus();
}

absl::Status EncodePayload(const MapRequest& m, StringWriter& w) {
  w.U64(m.known_epoch);
  return absl::OkStatus();
}

absl::Status EncodePayload(const ShardMapMsg& m, StringWriter& w) {
  std::string bytes;
  if (auto s = EncodeShardMap(m.map, &bytes); !s.ok()) return s;
  w.Bytes(bytes);
  return absl::OkStatus();
}

absl::Status EncodePayload(const Guard& m, StringWriter& w) {
  w.U64(m.nonce);
  w.U64(m.check_below_epoch);
  return absl::OkStatus();
}

absl::Status EncodePayload(const GuardAck& m, StringWriter& w) {
  w.U64(m.nonce);
  return absl::OkStatus();
}

// ---- per-message decode ----

absl::StatusOr<ControlMessage> DecodeHello(Reader& r, uint16_t frame_version) {
  Hello m;
  absl::Status err;
  if (!r.U16(&m.protocol_version) || !r.U64(&m.client_id) || !GetSecret(r, &m.resume_secret) ||
      !r.U64(&m.features)) {
    return Truncated("Hello");
  }
  if (m.protocol_version != frame_version) {
    return absl::InvalidArgumentError(absl::StrCat("control: Hello.protocol_version ",
                                                   m.protocol_version, " != frame version ",
                                                   frame_version));
  }
  if (!GetString(r, kMaxAuthTokenSize, &m.auth_token, &err, "Hello.auth_token") ||
      !GetString(r, kMaxClientNameSize, &m.client_name, &err, "Hello.client_name")) {
    return err;
  }
  return m;
}

absl::StatusOr<ControlMessage> DecodeWelcome(Reader& r) {
  Welcome m;
  absl::Status err;
  if (!r.U64(&m.client_id) || !GetSecret(r, &m.resume_secret) || !r.U64(&m.server_generation) ||
      !r.U64(&m.features) || !GetQp(r, &m.server_qp) || !r.U32(&m.rkey) ||
      !r.U64(&m.arena_remote_addr) || !r.U64(&m.arena_size) || !r.U32(&m.max_rpc_credits) ||
      !r.U32(&m.max_rpc_message_size) || !r.U32(&m.max_key_size) || !r.U32(&m.max_value_size)) {
    return Truncated("Welcome");
  }
  if (!GetString(r, kMaxIndexGeometrySize, &m.index_geometry, &err, "Welcome.index_geometry")) {
    return err;
  }
  if ((m.features & kFeatureSlotWords) != 0) {
    if (!r.U64(&m.slot_words_offset) || !r.U32(&m.slot_words_size) ||
        !r.U64(&m.check_below_epoch)) {
      return Truncated("Welcome slot words");
    }
    if (auto s = CheckSlotWords(m); !s.ok()) return s;
  }
  if (m.client_id == 0) return absl::InvalidArgumentError("control: Welcome.client_id is 0");
  if (m.max_rpc_credits == 0) {
    return absl::InvalidArgumentError("control: Welcome.max_rpc_credits is 0");
  }
  if (auto s = CheckQp(m.server_qp, "server"); !s.ok()) return s;
  return m;
}

absl::StatusOr<ControlMessage> DecodeClientQp(Reader& r) {
  ClientQp m;
  if (!GetQp(r, &m.qp)) return Truncated("ClientQp");
  if (auto s = CheckQp(m.qp, "client"); !s.ok()) return s;
  return m;
}

absl::StatusOr<ControlMessage> DecodeMove(Reader& r) {
  Move m;
  uint32_t reason;
  absl::Status err;
  if (!r.U32(&reason) || !r.U64(&m.new_generation) || !r.U32(&m.deadline_ms)) {
    return Truncated("Move");
  }
  m.reason = static_cast<MoveReason>(reason);
  if (!GetString(r, kMaxEndpointSize, &m.endpoint, &err, "Move.endpoint")) return err;
  if (auto hp = ParseHostPort(m.endpoint); !hp.ok()) return hp.status();
  return m;
}

template <typename T, typename Enum>
absl::StatusOr<ControlMessage> DecodeReasonText(Reader& r, std::string_view name) {
  T m;
  uint32_t code;
  absl::Status err;
  if (!r.U32(&code)) return Truncated(name);
  if constexpr (std::is_same_v<T, Error>) {
    m.code = static_cast<Enum>(code);
  } else {
    m.reason = static_cast<Enum>(code);
  }
  if (!GetString(r, kMaxMessageTextSize, &m.message, &err,
                 absl::StrCat(wire::Av(name), ".message"))) {
    return err;
  }
  return m;
}

}  // namespace

std::string MessageTypeName(uint16_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello:
      return "Hello";
    case MessageType::kWelcome:
      return "Welcome";
    case MessageType::kClientQp:
      return "ClientQp";
    case MessageType::kReady:
      return "Ready";
    case MessageType::kKeepalive:
      return "Keepalive";
    case MessageType::kKeepaliveAck:
      return "KeepaliveAck";
    case MessageType::kMove:
      return "Move";
    case MessageType::kMoveAck:
      return "MoveAck";
    case MessageType::kGoodbye:
      return "Goodbye";
    case MessageType::kError:
      return "Error";
    case MessageType::kMapRequest:
      return "MapRequest";
    case MessageType::kShardMap:
      return "ShardMap";
    case MessageType::kGuard:
      return "Guard";
    case MessageType::kGuardAck:
      return "GuardAck";
  }
  return absl::StrCat("Unknown(", type, ")");
}

MessageType TypeOf(const ControlMessage& m) {
  // The variant's alternatives are declared in MessageType order from 1.
  return static_cast<MessageType>(m.index() + 1);
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  uint32_t magic;
  FrameHeader h;
  if (!r.U32(&magic) || !r.U16(&h.version) || !r.U16(&h.type) || !r.U32(&h.payload_size)) {
    return Truncated("frame header");
  }
  if (magic != kFrameMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("control: bad frame magic 0x", absl::Hex(magic), " (not a kvnode peer?)"));
  }
  if (h.payload_size > kMaxControlPayloadSize) {
    return absl::InvalidArgumentError(absl::StrCat("control: frame payload of ", h.payload_size,
                                                   " bytes exceeds limit ",
                                                   kMaxControlPayloadSize));
  }
  return h;
}

absl::Status EncodeControl(const ControlMessage& m, std::string* out, uint16_t version) {
  const size_t start = out->size();
  StringWriter w(out);
  w.U32(kFrameMagic);
  w.U16(version);
  w.U16(static_cast<uint16_t>(TypeOf(m)));
  w.U32(0);  // payload size, patched below
  absl::Status s = std::visit(
      [&w, version](const auto& msg) {
        if constexpr (std::is_same_v<std::decay_t<decltype(msg)>, Hello>) {
          return EncodePayload(msg, version, w);
        } else {
          return EncodePayload(msg, w);
        }
      },
      m);
  const size_t payload = out->size() - start - kFrameHeaderSize;
  if (s.ok() && payload > kMaxControlPayloadSize) {
    s = absl::InvalidArgumentError(absl::StrCat("control: ", MessageTypeName(m.index() + 1),
                                                " payload of ", payload, " bytes exceeds limit"));
  }
  if (!s.ok()) {
    out->resize(start);
    return s;
  }
  wire::StoreLe(reinterpret_cast<uint8_t*>(out->data()) + start + 8, payload, 4);
  return absl::OkStatus();
}

absl::StatusOr<ControlMessage> DecodeControlPayload(const FrameHeader& header,
                                                    std::span<const uint8_t> payload) {
  if (payload.size() != header.payload_size) {
    return absl::DataLossError(absl::StrCat("control: payload is ", payload.size(),
                                            " bytes, header says ", header.payload_size));
  }
  const auto type = static_cast<MessageType>(header.type);
  // Error keeps its layout in every version (see Error); all else must match.
  if (header.version != kProtocolVersion && type != MessageType::kError) {
    return absl::FailedPreconditionError(absl::StrCat("control: unsupported protocol version ",
                                                      header.version, " (this build speaks ",
                                                      kProtocolVersion, ")"));
  }
  Reader r(payload);
  absl::StatusOr<ControlMessage> m;
  switch (type) {
    case MessageType::kHello:
      m = DecodeHello(r, header.version);
      break;
    case MessageType::kWelcome:
      m = DecodeWelcome(r);
      break;
    case MessageType::kClientQp:
      m = DecodeClientQp(r);
      break;
    case MessageType::kReady:
      m = Ready{};
      break;
    case MessageType::kKeepalive: {
      Keepalive k;
      if (!r.U64(&k.nonce)) return Truncated("Keepalive");
      m = k;
      break;
    }
    case MessageType::kKeepaliveAck: {
      KeepaliveAck k;
      if (!r.U64(&k.nonce)) return Truncated("KeepaliveAck");
      m = k;
      break;
    }
    case MessageType::kMove:
      m = DecodeMove(r);
      break;
    case MessageType::kMoveAck: {
      MoveAck a;
      if (!r.U64(&a.new_generation)) return Truncated("MoveAck");
      m = a;
      break;
    }
    case MessageType::kGoodbye:
      m = DecodeReasonText<Goodbye, GoodbyeReason>(r, "Goodbye");
      break;
    case MessageType::kError:
      m = DecodeReasonText<Error, ErrorCode>(r, "Error");
      break;
    case MessageType::kMapRequest: {
      MapRequest q;
      if (!r.U64(&q.known_epoch)) return Truncated("MapRequest");
      m = q;
      break;
    }
    case MessageType::kShardMap: {
      std::string_view rest;
      r.View(r.remaining(), &rest);
      absl::StatusOr<ShardMap> map = DecodeShardMap(rest);
      if (!map.ok()) return map.status();
      m = ShardMapMsg{*std::move(map)};
      break;
    }
    case MessageType::kGuard: {
      Guard g;
      if (!r.U64(&g.nonce) || !r.U64(&g.check_below_epoch)) return Truncated("Guard");
      m = g;
      break;
    }
    case MessageType::kGuardAck: {
      GuardAck a;
      if (!r.U64(&a.nonce)) return Truncated("GuardAck");
      m = a;
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("control: unknown message type ", header.type));
  }
  if (!m.ok()) return m.status();
  if (r.remaining() != 0) {
    return absl::DataLossError(absl::StrCat("control: ", r.remaining(), " trailing bytes after ",
                                            MessageTypeName(header.type)));
  }
  return m;
}

absl::StatusOr<ControlMessage> DecodeControlFrame(std::span<const uint8_t> frame) {
  absl::StatusOr<FrameHeader> h = DecodeFrameHeader(frame);
  if (!h.ok()) return h.status();
  if (frame.size() - kFrameHeaderSize != h->payload_size) {
    return absl::DataLossError(absl::StrCat("control: frame has ", frame.size() - kFrameHeaderSize,
                                            " payload bytes, header says ", h->payload_size));
  }
  return DecodeControlPayload(*h, frame.subspan(kFrameHeaderSize));
}

void FrameAssembler::Append(std::span<const uint8_t> bytes) {
  // Compact once the consumed prefix dominates, so the buffer stays bounded.
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

absl::StatusOr<std::optional<ControlMessage>> FrameAssembler::Next() {
  const std::span<const uint8_t> avail = AsBytes(std::string_view(buf_).substr(pos_));
  if (avail.size() < kFrameHeaderSize) return std::nullopt;
  absl::StatusOr<FrameHeader> h = DecodeFrameHeader(avail);
  if (!h.ok()) return h.status();
  if (avail.size() - kFrameHeaderSize < h->payload_size) return std::nullopt;
  absl::StatusOr<ControlMessage> m =
      DecodeControlPayload(*h, avail.subspan(kFrameHeaderSize, h->payload_size));
  if (!m.ok()) return m.status();
  pos_ += kFrameHeaderSize + h->payload_size;
  return std::optional<ControlMessage>(std::move(*m));
}

absl::StatusOr<HostPort> ParseHostPort(std::string_view endpoint) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("endpoint \"", wire::Av(endpoint.substr(0, 64)), "\": ", wire::Av(why)));
  };
  if (endpoint.size() > kMaxEndpointSize) return bad("too long");
  HostPort hp;
  std::string_view port;
  if (!endpoint.empty() && endpoint.front() == '[') {
    const size_t close = endpoint.find(']');
    if (close == std::string_view::npos) return bad("missing ']'");
    hp.host = std::string(endpoint.substr(1, close - 1));
    if (close + 1 >= endpoint.size() || endpoint[close + 1] != ':') {
      return bad("expected ':' after ']'");
    }
    port = endpoint.substr(close + 2);
  } else {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string_view::npos) return bad("expected host:port");
    hp.host = std::string(endpoint.substr(0, colon));
    if (hp.host.find(':') != std::string::npos) return bad("IPv6 hosts need [brackets]");
    port = endpoint.substr(colon + 1);
  }
  if (hp.host.empty()) return bad("empty host");
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || ptr != port.data() + port.size() || value == 0 ||
      value > 65535) {
    return bad("port must be 1..65535");
  }
  hp.port = static_cast<uint16_t>(value);
  return hp;
}

}  // namespace kvnode::proto
