#include "kvnode/upgrade/messages.h"

#include <glog/logging.h>

#include <type_traits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/proto/wire.h"

namespace kvnode::upgrade {
namespace {

using proto::wire::Av;
using proto::wire::Reader;
using proto::wire::StringWriter;

constexpr size_t kDedupeEntrySize = 18;  // u64 sequence, u8 opcode, u8 status, u64 version
// u64 client_id, 16 bytes resume secret, u64 highest, u32 count
constexpr size_t kSessionFixedSize = 36;
constexpr size_t kCounterMinSize = 2 + 1 + 8;

absl::Status Truncated(std::string_view what) {
  return absl::DataLossError(absl::StrCat("handoff: truncated ", Av(what)));
}

absl::Status TooLong(std::string_view field, size_t size, size_t max) {
  return absl::InvalidArgumentError(
      absl::StrCat("handoff: ", Av(field), " is ", size, " bytes, limit ", max));
}

// u16 length + bytes.
absl::Status PutString(StringWriter& w, std::string_view field, std::string_view s, size_t max) {
  if (s.size() > max) return TooLong(field, s.size(), max);
  w.U16(static_cast<uint16_t>(s.size()));
  w.Bytes(s);
  return absl::OkStatus();
}

absl::Status GetString(Reader& r, std::string_view field, size_t max, std::string* s) {
  uint16_t n = 0;
  if (!r.U16(&n)) return Truncated(field);
  if (n > max) return TooLong(field, n, max);
  std::string_view v;
  if (!r.View(n, &v)) return Truncated(field);
  s->assign(v.data(), v.size());
  return absl::OkStatus();
}

// --- session table -------------------------------------------------------

// What the server may have recorded (dedupe.h invariant 1): a write, answered
// definitively. The same rule as the persisted client records (dedupe.cc).
absl::Status CheckEntry(uint64_t client_id, const DedupeEntry& e) {
  const auto op = static_cast<proto::Opcode>(e.opcode);
  const auto st = static_cast<proto::RpcStatus>(e.status);
  if (op != proto::Opcode::kPut && op != proto::Opcode::kDelete) {
    return absl::InvalidArgumentError(absl::StrCat("handoff: client ", client_id, " sequence ",
                                                   e.sequence, ": opcode ",
                                                   static_cast<int>(e.opcode), " is not a write"));
  }
  if (st != proto::RpcStatus::kOk && st != proto::RpcStatus::kNotFound &&
      st != proto::RpcStatus::kRejected) {
    return absl::InvalidArgumentError(
        absl::StrCat("handoff: client ", client_id, " sequence ", e.sequence, ": status ",
                     static_cast<int>(e.status), " is not a definitive answer"));
  }
  return absl::OkStatus();
}

// Every check a decoder makes on a list of records.
absl::Status CheckRecords(const std::vector<SessionRecord>& records) {
  if (records.size() > UINT32_MAX) {
    return absl::InvalidArgumentError("handoff: too many sessions");
  }
  absl::flat_hash_set<uint64_t> seen;
  seen.reserve(records.size());
  for (const SessionRecord& s : records) {
    if (s.client_id == 0) return absl::InvalidArgumentError("handoff: session with client_id 0");
    if (!seen.insert(s.client_id).second) {
      return absl::InvalidArgumentError(absl::StrCat("handoff: client_id ", s.client_id, " twice"));
    }
    if (s.window.size() > kMaxDedupeWindow) {
      return absl::InvalidArgumentError(absl::StrCat("handoff: client ", s.client_id, " window of ",
                                                     s.window.size(), " entries, limit ",
                                                     kMaxDedupeWindow));
    }
    for (const DedupeEntry& e : s.window) {
      if (absl::Status st = CheckEntry(s.client_id, e); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

size_t EncodedRecordSize(const SessionRecord& s) {
  return kSessionFixedSize + s.window.size() * kDedupeEntrySize;
}

// u32 count, then the records (checked by CheckRecords). Sized first and
// written in place: a table of full windows is tens of megabytes, and
// appending it field by field cost three times as much (handoff_bench).
void WriteRecords(StringWriter& w, const std::vector<SessionRecord>& records) {
  size_t size = 4;
  for (const SessionRecord& s : records) size += EncodedRecordSize(s);
  proto::wire::SpanWriter sw(w.Extend(size));
  sw.U32(static_cast<uint32_t>(records.size()));
  for (const SessionRecord& s : records) {
    sw.U64(s.client_id);
    sw.Bytes(std::string_view(reinterpret_cast<const char*>(s.resume_secret.data()),
                              s.resume_secret.size()));
    sw.U64(s.highest_sequence);
    sw.U32(static_cast<uint32_t>(s.window.size()));
    for (const DedupeEntry& e : s.window) {
      sw.U64(e.sequence);
      sw.U8(e.opcode);
      sw.U8(e.status);
      sw.U64(e.version);
    }
  }
  DCHECK(sw.ok() && sw.pos() == size);
}

absl::Status PutRecords(StringWriter& w, const std::vector<SessionRecord>& records) {
  if (absl::Status s = CheckRecords(records); !s.ok()) return s;
  WriteRecords(w, records);
  return absl::OkStatus();
}

absl::Status PutSessions(StringWriter& w, const SessionTable& t) {
  if (t.next_client_id == 0) {
    return absl::InvalidArgumentError("handoff: SessionTable.next_client_id is 0");
  }
  if (absl::Status s = CheckRecords(t.sessions); !s.ok()) return s;
  w.U64(t.next_client_id);
  WriteRecords(w, t.sessions);
  return absl::OkStatus();
}

absl::Status GetRecords(Reader& r, std::vector<SessionRecord>* records) {
  uint32_t count = 0;
  if (!r.U32(&count)) return Truncated("session count");
  // Never reserve on a count the bytes present cannot back.
  if (count > r.remaining() / kSessionFixedSize) return Truncated("sessions (count too big)");
  records->clear();
  records->reserve(count);
  absl::flat_hash_set<uint64_t> seen;
  seen.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    SessionRecord s;
    uint32_t n = 0;
    if (!r.U64(&s.client_id) || !r.Copy(s.resume_secret.data(), s.resume_secret.size()) ||
        !r.U64(&s.highest_sequence) || !r.U32(&n)) {
      return Truncated(absl::StrCat("session ", i));
    }
    if (s.client_id == 0) return absl::InvalidArgumentError("handoff: session with client_id 0");
    if (!seen.insert(s.client_id).second) {
      return absl::InvalidArgumentError(absl::StrCat("handoff: client_id ", s.client_id, " twice"));
    }
    if (n > kMaxDedupeWindow) {
      return absl::InvalidArgumentError(absl::StrCat("handoff: client ", s.client_id, " window of ",
                                                     n, " entries, limit ", kMaxDedupeWindow));
    }
    if (n > r.remaining() / kDedupeEntrySize) {
      return Truncated(absl::StrCat("window of client ", s.client_id));
    }
    s.window.resize(n);
    for (DedupeEntry& e : s.window) {
      // Cannot fail: the size was checked above.
      (void)(r.U64(&e.sequence) && r.U8(&e.opcode) && r.U8(&e.status) && r.U64(&e.version));
      if (absl::Status st = CheckEntry(s.client_id, e); !st.ok()) return st;
    }
    records->push_back(std::move(s));
  }
  return absl::OkStatus();
}

absl::Status GetSessions(Reader& r, SessionTable* t) {
  if (!r.U64(&t->next_client_id)) return Truncated("SessionTable header");
  if (t->next_client_id == 0) {
    return absl::InvalidArgumentError("handoff: SessionTable.next_client_id is 0");
  }
  return GetRecords(r, &t->sessions);
}

// One whole client record always fits in one Sessions message.
static_assert(4 + kSessionFixedSize + kMaxDedupeWindow * kDedupeEntrySize <=
              kMaxHandoffPayloadSize);

// --- counters --------------------------------------------------------------

absl::Status PutCounters(StringWriter& w, const CounterSnapshot& c) {
  if (c.counters.size() > kMaxCounters)
    return TooLong("counter list", c.counters.size(), kMaxCounters);
  absl::flat_hash_set<std::string_view> seen;
  for (const Counter& k : c.counters) {
    if (k.name.empty()) return absl::InvalidArgumentError("handoff: counter with an empty name");
    if (k.name.size() > kMaxCounterNameSize) {
      return TooLong("counter name", k.name.size(), kMaxCounterNameSize);
    }
    if (!seen.insert(k.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("handoff: counter ", Av(k.name), " twice"));
    }
  }
  w.U32(static_cast<uint32_t>(c.counters.size()));
  for (const Counter& k : c.counters) {
    w.U16(static_cast<uint16_t>(k.name.size()));
    w.Bytes(k.name);
    w.U64(k.value);
  }
  return absl::OkStatus();
}

absl::Status GetCounters(Reader& r, CounterSnapshot* c) {
  uint32_t count = 0;
  if (!r.U32(&count)) return Truncated("counter count");
  if (count > kMaxCounters) return TooLong("counter list", count, kMaxCounters);
  if (count > r.remaining() / kCounterMinSize) return Truncated("counters (count too big)");
  c->counters.clear();
  c->counters.reserve(count);
  absl::flat_hash_set<std::string> seen;
  for (uint32_t i = 0; i < count; ++i) {
    Counter k;
    if (absl::Status s = GetString(r, "counter name", kMaxCounterNameSize, &k.name); !s.ok()) {
      return s;
    }
    if (k.name.empty()) return absl::InvalidArgumentError("handoff: counter with an empty name");
    if (!r.U64(&k.value)) return Truncated(absl::StrCat("counter ", Av(k.name)));
    if (!seen.insert(k.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("handoff: counter ", Av(k.name), " twice"));
    }
    c->counters.push_back(std::move(k));
  }
  return absl::OkStatus();
}

// --- messages --------------------------------------------------------------

absl::Status Put(StringWriter& w, const Hello& m) {
  if (m.protocol_version != kHandoffProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handoff: Hello.protocol_version ", m.protocol_version, " != ", kHandoffProtocolVersion));
  }
  if (m.pid == 0) return absl::InvalidArgumentError("handoff: Hello.pid is 0");
  w.U16(m.protocol_version);
  w.U32(m.pid);
  w.U64(m.generation);
  w.U64(m.capabilities);
  return PutString(w, "Hello.build_id", m.build_id, kMaxBuildIdSize);
}

absl::Status Put(StringWriter& w, const Ready& m) {
  if (m.mr_imported > 1) return absl::InvalidArgumentError("handoff: Ready.mr_imported not 0/1");
  w.U32(m.rkey);
  w.U64(m.arena_remote_addr);
  w.U64(m.arena_id);
  w.U64(m.registered_bytes);
  w.U8(m.mr_imported);
  return absl::OkStatus();
}

absl::Status CheckRole(FdRole role, std::vector<bool>& seen) {
  const auto v = static_cast<uint8_t>(role);
  if (v != static_cast<uint8_t>(FdRole::kListenTcp) &&
      v != static_cast<uint8_t>(FdRole::kAdminSocket)) {
    return absl::InvalidArgumentError(absl::StrCat("handoff: unknown fd role ", v));
  }
  if (seen[v]) return absl::InvalidArgumentError(absl::StrCat("handoff: fd role ", v, " twice"));
  seen[v] = true;
  return absl::OkStatus();
}

absl::Status CheckClientIds(const std::vector<uint64_t>& ids) {
  if (ids.size() > kMaxHandOverClientIds) {
    return TooLong("HandOver.client_ids", ids.size(), kMaxHandOverClientIds);
  }
  absl::flat_hash_set<uint64_t> seen;
  seen.reserve(ids.size());
  for (uint64_t id : ids) {
    if (id == 0) return absl::InvalidArgumentError("handoff: HandOver lists client_id 0");
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("handoff: HandOver lists client_id ", id, " twice"));
    }
  }
  return absl::OkStatus();
}

// HandOver's n_fds byte: the count in its low 4 bits, flags in its high 4.
// A HandOver without a flag is byte for byte what builds before the flags
// sent; only a peer that accepted the flag's capability gets it set.
constexpr uint8_t kHandOverCountMask = 0x0f;
constexpr uint8_t kHandOverHasLease = 0x80;  // kCapClusterLease: i64 cluster_lease at the end

absl::Status Put(StringWriter& w, const HandOver& m) {
  if (m.cluster_lease < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("handoff: HandOver.cluster_lease ", m.cluster_lease, " is negative"));
  }
  if (m.fd_roles.size() > kMaxHandoffFds) {
    return TooLong("HandOver.fd_roles", m.fd_roles.size(), kMaxHandoffFds);
  }
  std::vector<bool> seen(256, false);
  for (FdRole role : m.fd_roles) {
    if (absl::Status s = CheckRole(role, seen); !s.ok()) return s;
  }
  if (m.session_chunks > kMaxSessionChunks) {
    return TooLong("HandOver.session_chunks", m.session_chunks, kMaxSessionChunks);
  }
  if (absl::Status s = CheckClientIds(m.client_ids); !s.ok()) return s;
  w.U64(m.generation);
  w.U8(static_cast<uint8_t>(m.fd_roles.size()) | (m.cluster_lease != 0 ? kHandOverHasLease : 0));
  for (FdRole role : m.fd_roles) w.U8(static_cast<uint8_t>(role));
  w.U32(m.session_chunks);
  w.U64(m.last_version);
  if (absl::Status s = PutSessions(w, m.sessions); !s.ok()) return s;
  if (absl::Status s = PutCounters(w, m.counters); !s.ok()) return s;
  w.U32(static_cast<uint32_t>(m.client_ids.size()));
  for (uint64_t id : m.client_ids) w.U64(id);
  if (m.cluster_lease != 0) w.U64(static_cast<uint64_t>(m.cluster_lease));
  return absl::OkStatus();
}

absl::Status Put(StringWriter& w, const Sessions& m) { return PutRecords(w, m.sessions); }

absl::Status Put(StringWriter& w, const Owned& m) {
  if (m.pid == 0) return absl::InvalidArgumentError("handoff: Owned.pid is 0");
  w.U64(m.generation);
  w.U32(m.pid);
  return absl::OkStatus();
}

absl::Status Put(StringWriter& w, const Released& m) {
  w.U64(m.generation);
  return absl::OkStatus();
}

absl::Status Put(StringWriter& w, const Adopted& m) {
  w.U32(m.records);
  return absl::OkStatus();
}

absl::Status Put(StringWriter& w, const Gone& m) {
  w.U64(m.clients_moved);
  w.U64(m.clients_cut);
  return PutCounters(w, m.counters_delta);
}

absl::Status Put(StringWriter& w, const Abort& m) {
  w.U32(m.code);
  return PutString(w, "Abort.message", m.message, kMaxAbortMessageSize);
}

absl::StatusOr<HandoffMessage> GetHello(Reader& r, uint16_t frame_version) {
  Hello m;
  if (!r.U16(&m.protocol_version) || !r.U32(&m.pid) || !r.U64(&m.generation) ||
      !r.U64(&m.capabilities)) {
    return Truncated("Hello");
  }
  if (m.protocol_version != frame_version) {
    return absl::InvalidArgumentError(absl::StrCat("handoff: Hello.protocol_version ",
                                                   m.protocol_version, " in a version ",
                                                   frame_version, " frame"));
  }
  if (m.pid == 0) return absl::InvalidArgumentError("handoff: Hello.pid is 0");
  if (absl::Status s = GetString(r, "Hello.build_id", kMaxBuildIdSize, &m.build_id); !s.ok()) {
    return s;
  }
  return m;
}

absl::StatusOr<HandoffMessage> GetReady(Reader& r) {
  Ready m;
  if (!r.U32(&m.rkey) || !r.U64(&m.arena_remote_addr) || !r.U64(&m.arena_id) ||
      !r.U64(&m.registered_bytes) || !r.U8(&m.mr_imported)) {
    return Truncated("Ready");
  }
  if (m.mr_imported > 1) return absl::InvalidArgumentError("handoff: Ready.mr_imported not 0/1");
  return m;
}

absl::StatusOr<HandoffMessage> GetHandOver(Reader& r) {
  HandOver m;
  uint8_t n = 0;
  if (!r.U64(&m.generation) || !r.U8(&n)) return Truncated("HandOver");
  const uint8_t flags = n & ~kHandOverCountMask;
  n &= kHandOverCountMask;
  if ((flags & ~kHandOverHasLease) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("handoff: HandOver has unknown flags ", static_cast<int>(flags)));
  }
  if (n > kMaxHandoffFds) return TooLong("HandOver.fd_roles", n, kMaxHandoffFds);
  std::vector<bool> seen(256, false);
  for (uint8_t i = 0; i < n; ++i) {
    uint8_t v = 0;
    if (!r.U8(&v)) return Truncated("HandOver.fd_roles");
    const auto role = static_cast<FdRole>(v);
    if (absl::Status s = CheckRole(role, seen); !s.ok()) return s;
    m.fd_roles.push_back(role);
  }
  if (!r.U32(&m.session_chunks)) return Truncated("HandOver.session_chunks");
  if (m.session_chunks > kMaxSessionChunks) {
    return TooLong("HandOver.session_chunks", m.session_chunks, kMaxSessionChunks);
  }
  if (!r.U64(&m.last_version)) return Truncated("HandOver.last_version");
  if (absl::Status s = GetSessions(r, &m.sessions); !s.ok()) return s;
  if (absl::Status s = GetCounters(r, &m.counters); !s.ok()) return s;
  uint32_t n_ids = 0;
  if (!r.U32(&n_ids)) return Truncated("HandOver.client_ids");
  if (n_ids > kMaxHandOverClientIds) {
    return TooLong("HandOver.client_ids", n_ids, kMaxHandOverClientIds);
  }
  if (n_ids > r.remaining() / 8) return Truncated("HandOver.client_ids (count too big)");
  m.client_ids.resize(n_ids);
  for (uint64_t& id : m.client_ids) (void)r.U64(&id);  // the size was checked above
  if (absl::Status s = CheckClientIds(m.client_ids); !s.ok()) return s;
  if ((flags & kHandOverHasLease) != 0) {
    uint64_t lease = 0;
    if (!r.U64(&lease)) return Truncated("HandOver.cluster_lease");
    m.cluster_lease = static_cast<int64_t>(lease);
    if (m.cluster_lease <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("handoff: HandOver.cluster_lease ", m.cluster_lease, " is not positive"));
    }
  }
  return m;
}

absl::StatusOr<HandoffMessage> GetSessionsMessage(Reader& r) {
  Sessions m;
  if (absl::Status s = GetRecords(r, &m.sessions); !s.ok()) return s;
  return m;
}

absl::StatusOr<HandoffMessage> GetOwned(Reader& r) {
  Owned m;
  if (!r.U64(&m.generation) || !r.U32(&m.pid)) return Truncated("Owned");
  if (m.pid == 0) return absl::InvalidArgumentError("handoff: Owned.pid is 0");
  return m;
}

absl::StatusOr<HandoffMessage> GetReleased(Reader& r) {
  Released m;
  if (!r.U64(&m.generation)) return Truncated("Released");
  return m;
}

absl::StatusOr<HandoffMessage> GetAdopted(Reader& r) {
  Adopted m;
  if (!r.U32(&m.records)) return Truncated("Adopted");
  return m;
}

absl::StatusOr<HandoffMessage> GetGone(Reader& r) {
  Gone m;
  if (!r.U64(&m.clients_moved) || !r.U64(&m.clients_cut)) return Truncated("Gone");
  if (absl::Status s = GetCounters(r, &m.counters_delta); !s.ok()) return s;
  return m;
}

absl::StatusOr<HandoffMessage> GetAbort(Reader& r) {
  Abort m;
  if (!r.U32(&m.code)) return Truncated("Abort");
  if (absl::Status s = GetString(r, "Abort.message", kMaxAbortMessageSize, &m.message); !s.ok()) {
    return s;
  }
  return m;
}

}  // namespace

std::string HandoffTypeName(uint16_t type) {
  switch (static_cast<HandoffType>(type)) {
    case HandoffType::kHello:
      return "Hello";
    case HandoffType::kReady:
      return "Ready";
    case HandoffType::kHandOver:
      return "HandOver";
    case HandoffType::kOwned:
      return "Owned";
    case HandoffType::kGone:
      return "Gone";
    case HandoffType::kAbort:
      return "Abort";
    case HandoffType::kSessions:
      return "Sessions";
    case HandoffType::kReleased:
      return "Released";
    case HandoffType::kAdopted:
      return "Adopted";
  }
  return absl::StrCat("Unknown(", type, ")");
}

HandoffType TypeOf(const HandoffMessage& m) {
  return static_cast<HandoffType>(m.index() + 1);  // variant order == type numbers
}

absl::Status EncodeHandoff(const HandoffMessage& m, std::string* frame) {
  // The payload is written in place after the header, whose size field is
  // filled in last: a Sessions payload is up to 64 MiB, not worth a copy.
  const size_t start = frame->size();
  StringWriter w(frame);
  w.U32(kHandoffFrameMagic);
  w.U16(kHandoffProtocolVersion);
  w.U16(static_cast<uint16_t>(TypeOf(m)));
  w.U32(0);
  absl::Status s = std::visit([&w](const auto& msg) { return Put(w, msg); }, m);
  const size_t payload_size = frame->size() - start - kHandoffFrameHeaderSize;
  if (s.ok() && payload_size > kMaxHandoffPayloadSize) {
    s = TooLong(absl::StrCat(HandoffTypeName(static_cast<uint16_t>(TypeOf(m))), " payload"),
                payload_size, kMaxHandoffPayloadSize);
  }
  if (!s.ok()) {
    frame->resize(start);
    return s;
  }
  uint8_t size_le[4];
  proto::wire::StoreLe(size_le, payload_size, 4);
  frame->replace(start + 8, 4, reinterpret_cast<const char*>(size_le), 4);
  return absl::OkStatus();
}

absl::StatusOr<HandoffFrameHeader> DecodeHandoffFrameHeader(std::span<const uint8_t> header) {
  Reader r(header);
  uint32_t magic = 0;
  HandoffFrameHeader h;
  if (!r.U32(&magic) || !r.U16(&h.version) || !r.U16(&h.type) || !r.U32(&h.payload_size)) {
    return Truncated("frame header");
  }
  if (magic != kHandoffFrameMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("handoff: bad frame magic 0x", absl::Hex(magic), " (not a handoff frame)"));
  }
  if (h.payload_size > kMaxHandoffPayloadSize) {
    return TooLong("frame payload", h.payload_size, kMaxHandoffPayloadSize);
  }
  return h;
}

absl::StatusOr<HandoffMessage> DecodeHandoffPayload(const HandoffFrameHeader& h,
                                                    std::span<const uint8_t> payload) {
  if (payload.size() != h.payload_size) {
    return absl::DataLossError(absl::StrCat("handoff: payload is ", payload.size(),
                                            " bytes, header says ", h.payload_size));
  }
  const bool is_abort = h.type == static_cast<uint16_t>(HandoffType::kAbort);
  if (h.version != kHandoffProtocolVersion && !is_abort) {
    return absl::FailedPreconditionError(
        absl::StrCat("handoff: peer speaks protocol version ", h.version, ", this binary ",
                     kHandoffProtocolVersion, " (", HandoffTypeName(h.type), ")"));
  }
  Reader r(payload);
  absl::StatusOr<HandoffMessage> m;
  switch (static_cast<HandoffType>(h.type)) {
    case HandoffType::kHello:
      m = GetHello(r, h.version);
      break;
    case HandoffType::kReady:
      m = GetReady(r);
      break;
    case HandoffType::kHandOver:
      m = GetHandOver(r);
      break;
    case HandoffType::kOwned:
      m = GetOwned(r);
      break;
    case HandoffType::kGone:
      m = GetGone(r);
      break;
    case HandoffType::kAbort:
      m = GetAbort(r);
      break;
    case HandoffType::kSessions:
      m = GetSessionsMessage(r);
      break;
    case HandoffType::kReleased:
      m = GetReleased(r);
      break;
    case HandoffType::kAdopted:
      m = GetAdopted(r);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("handoff: unknown message type ", h.type));
  }
  if (!m.ok()) return m.status();
  if (r.remaining() != 0) {
    return absl::DataLossError(absl::StrCat("handoff: ", r.remaining(), " trailing bytes after ",
                                            HandoffTypeName(h.type)));
  }
  return m;
}

absl::StatusOr<HandoffMessage> DecodeHandoff(std::span<const uint8_t> frame) {
  if (frame.size() < kHandoffFrameHeaderSize) return Truncated("frame header");
  absl::StatusOr<HandoffFrameHeader> h =
      DecodeHandoffFrameHeader(frame.first(kHandoffFrameHeaderSize));
  if (!h.ok()) return h.status();
  std::span<const uint8_t> payload = frame.subspan(kHandoffFrameHeaderSize);
  if (payload.size() < h->payload_size) {
    return absl::DataLossError(absl::StrCat("handoff: truncated ", HandoffTypeName(h->type), ": ",
                                            payload.size(), " of ", h->payload_size,
                                            " payload bytes"));
  }
  if (payload.size() > h->payload_size) {
    return absl::DataLossError(absl::StrCat("handoff: ", payload.size() - h->payload_size,
                                            " trailing bytes after the frame"));
  }
  return DecodeHandoffPayload(*h, payload);
}

absl::StatusOr<std::vector<Sessions>> SplitSessions(std::vector<SessionRecord> records,
                                                    size_t max_payload) {
  std::vector<Sessions> out;
  size_t payload = 0;  // of out.back()
  for (SessionRecord& rec : records) {
    const size_t size = EncodedRecordSize(rec);
    if (4 + size > max_payload) {
      return absl::InvalidArgumentError(absl::StrCat("handoff: the record of client ",
                                                     rec.client_id, " alone is ", size,
                                                     " bytes, limit ", max_payload));
    }
    if (out.empty() || payload + size > max_payload) {
      if (out.size() == kMaxSessionChunks) {
        return TooLong("session table (chunks)", out.size() + 1, kMaxSessionChunks);
      }
      out.emplace_back();
      payload = 4;  // the record count
    }
    out.back().sessions.push_back(std::move(rec));
    payload += size;
  }
  return out;
}

absl::Status EncodeSessionTable(const SessionTable& t, std::string* out) {
  std::string tmp;
  StringWriter w(&tmp);
  if (absl::Status s = PutSessions(w, t); !s.ok()) return s;
  out->append(tmp);
  return absl::OkStatus();
}

absl::StatusOr<SessionTable> DecodeSessionTable(std::span<const uint8_t> in) {
  Reader r(in);
  SessionTable t;
  if (absl::Status s = GetSessions(r, &t); !s.ok()) return s;
  if (r.remaining() != 0) {
    return absl::DataLossError(
        absl::StrCat("handoff: ", r.remaining(), " trailing bytes after SessionTable"));
  }
  return t;
}

absl::Status EncodeCounters(const CounterSnapshot& c, std::string* out) {
  std::string tmp;
  StringWriter w(&tmp);
  if (absl::Status s = PutCounters(w, c); !s.ok()) return s;
  out->append(tmp);
  return absl::OkStatus();
}

absl::StatusOr<CounterSnapshot> DecodeCounters(std::span<const uint8_t> in) {
  Reader r(in);
  CounterSnapshot c;
  if (absl::Status s = GetCounters(r, &c); !s.ok()) return s;
  if (r.remaining() != 0) {
    return absl::DataLossError(
        absl::StrCat("handoff: ", r.remaining(), " trailing bytes after counters"));
  }
  return c;
}

}  // namespace kvnode::upgrade
