#include "kvnode/server/rpc_handler.h"

#include <time.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
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
    case absl::StatusCode::kResourceExhausted:  // a new key's index chain is full
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

// The client record's write time, used only to age records at a cold start
// (the most recently written kept first). CLOCK_REALTIME_COARSE: read from
// the vDSO without touching the clocksource (on a guest whose clocksource is
// the HPET every CLOCK_REALTIME read is a syscall and an emulated device
// read, one per write); its resolution, the kernel's tick (<= 10 ms), is
// ample for ageing records.
uint64_t NowUnixMs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

bool Persisted(const WriteTag& tag) { return tag.client_id != 0 && tag.window != nullptr; }

// A client's writes in one group commit, in the order their side records
// were computed: each record holds the ones before it.
struct GroupEntries {
  uint64_t client_id = 0;
  std::vector<DedupeEntry> entries;
};

// The side record that persists `tag`'s client record with the write; the
// answer (status, version) is known only under the store's write lock.
storage::SideRecord ClientSide(const WriteTag& tag, uint32_t keep, GroupEntries* earlier) {
  return storage::SideRecord{
      ClientRecordKey(tag.client_id), [&tag, keep, earlier](const storage::WriteOutcome& o) {
        const RpcStatus status =
            tag.opcode == Opcode::kDelete && !o.existed ? RpcStatus::kNotFound : RpcStatus::kOk;
        const DedupeEntry e{tag.sequence, static_cast<uint8_t>(tag.opcode),
                            static_cast<uint8_t>(status), o.version};
        PersistedClient c =
            PersistedSnapshot(tag.client_id, *tag.window, e, keep, NowUnixMs(), earlier->entries);
        earlier->entries.push_back(e);
        // Without it the client could not resume its id after a cold start.
        if (tag.secret != nullptr) c.secret = *tag.secret;
        return EncodeClientRecord(c);
      }};
}

// The answer to a GET/PUT/DELETE of a slot this node does not serve
// (RpcContext::sharded), nullopt when it does.
std::optional<RpcResult> ForeignSlot(const proto::RequestView& r, const RpcContext& ctx,
                                     std::span<uint8_t> response) {
  const ShardView* v = ctx.shard;
  uint32_t slot = 0;
  if (v != nullptr && v->map.num_slots != 0) {
    slot = proto::SlotOf(r.key, v->map.num_slots);
    if (v->Owns(slot)) return std::nullopt;
  }
  Count(ctx, Counter::kRpcWrongShard);
  const uint64_t epoch = v != nullptr ? v->map.epoch : 0;
  if (ctx.shard_map_feature) {
    return Answer(r.opcode, RpcStatus::kWrongShard, r.sequence, epoch, {}, response);
  }
  std::string why;
  if (v == nullptr || v->map.num_slots == 0) {
    why = "this cluster node has no shard map yet: it serves no slot";
  } else {
    const uint16_t owner = v->map.OwnerOf(slot);
    why = absl::StrCat("the key's slot ", slot, " is served by node '",
                       owner < v->map.nodes.size() ? v->map.nodes[owner].node_id : "?",
                       "', not this one (map epoch ", epoch, "); route it by the shard map");
  }
  return Answer(r.opcode, RpcStatus::kRejected, r.sequence, 0, why, response);
}

}  // namespace

void StoreBackend::Write(std::span<const WriteRequest> requests, std::span<WriteReply> replies) {
  // Reserved in full: the side records' closures keep pointers into them.
  std::vector<GroupEntries> clients;
  clients.reserve(requests.size());
  std::vector<storage::SideRecord> sides;
  sides.reserve(requests.size());
  std::vector<storage::WriteOp> ops(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const WriteRequest& w = requests[i];
    ops[i] = storage::WriteOp{
        w.opcode == Opcode::kPut ? storage::WriteOp::Kind::kPut : storage::WriteOp::Kind::kDelete,
        w.key, w.value, nullptr};
    if (!Persisted(w.tag)) continue;
    auto c = std::find_if(clients.begin(), clients.end(),
                          [&](const GroupEntries& g) { return g.client_id == w.tag.client_id; });
    if (c == clients.end()) c = clients.insert(clients.end(), GroupEntries{w.tag.client_id, {}});
    ops[i].side = &sides.emplace_back(ClientSide(w.tag, record_entries_, &*c));
  }
  std::vector<storage::WriteResult> results(requests.size());
  store_->Write(ops, results);
  for (size_t i = 0; i < requests.size(); ++i) {
    replies[i] = WriteReply{std::move(results[i].status), results[i].version, results[i].existed};
  }
}

void StoreBackend::ForgetClient(uint64_t client_id) {
  absl::Status s = store_->DeleteSideRecord(ClientRecordKey(client_id));
  // RocksDB is not open in this process (during a live upgrade: the old
  // process after the writer switch, the new one before its open): the
  // persisted record stays until it ages out, like a vanished client's.
  if (!s.ok() && !absl::IsFailedPrecondition(s)) {
    LOG(WARNING) << "dropping the persisted dedupe record of client " << client_id << ": " << s;
  }
}

absl::StatusOr<std::vector<ClientRecordExport>> StoreBackend::LoadClientRecords(size_t max) {
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> raw =
      store_->ReadSideRecords(kClientRecordPrefix);
  if (!raw.ok()) return raw.status();
  std::vector<PersistedClient> recs;
  recs.reserve(raw->size());
  for (const auto& [key, value] : *raw) {
    const uint64_t id = ParseClientRecordKey(key);
    absl::StatusOr<PersistedClient> c =
        id == 0 ? absl::DataLossError(absl::StrCat("malformed key '", key, "'"))
                : DecodeClientRecord(id, value);
    if (!c.ok()) {
      // Without it a retry of that client may be applied twice, as before
      // records were persisted; never a reason not to start.
      LOG(ERROR) << "ignoring a persisted dedupe record: " << c.status();
      (void)store_->DeleteSideRecord(key);
      continue;
    }
    recs.push_back(std::move(*c));
  }
  std::sort(recs.begin(), recs.end(), [](const PersistedClient& a, const PersistedClient& b) {
    return a.written_unix_ms > b.written_unix_ms;
  });
  std::vector<ClientRecordExport> out;
  for (size_t i = 0; i < recs.size(); ++i) {
    if (i >= max) {
      ForgetClient(recs[i].client_id);  // aged out (--max_client_records)
      continue;
    }
    out.push_back(ClientRecordExport{recs[i].client_id, std::move(recs[i].window), recs[i].secret});
  }
  // Oldest written first: ClientRecords::Import keeps that order for eviction.
  std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<KvBackend::Value> StoreBackend::Get(std::string_view key) {
  absl::StatusOr<storage::Store::GetResult> r = store_->Get(key);
  if (!r.ok()) return r.status();
  return Value{std::move(r->value), r->version};
}

RpcResult AnswerWrite(const WriteRequest& write, const WriteReply& reply, const RpcContext& ctx,
                      std::span<uint8_t> response) {
  RpcStatus st = RpcStatus::kOk;
  uint64_t version = 0;
  std::string_view reason;
  if (reply.status.ok()) {
    if (write.opcode == Opcode::kPut) {
      version = reply.version;
    } else if (!reply.existed) {
      st = RpcStatus::kNotFound;
    }
  } else {
    st = StatusFor(reply.status);
    if (st == RpcStatus::kNotFound) st = RpcStatus::kInternal;
    if (absl::IsResourceExhausted(reply.status)) Count(ctx, ErrorKind::kIndexChainFull);
    reason = Sv(reply.status.message());
  }
  if (st == RpcStatus::kInternal) Count(ctx, ErrorKind::kStorage);
  if (st == RpcStatus::kBusy) Count(ctx, Counter::kRpcBusy);
  const uint64_t sequence = write.tag.sequence;
  // Invariant 1 of dedupe.h: only definitive answers are remembered; the
  // others are held (invariant 4): the client retries them.
  if (st == RpcStatus::kOk || st == RpcStatus::kNotFound || st == RpcStatus::kRejected) {
    ctx.window->Record(DedupeEntry{sequence, static_cast<uint8_t>(write.opcode),
                                   static_cast<uint8_t>(st), version});
  } else {
    ctx.window->Hold(sequence);
  }
  return Answer(write.opcode, st, sequence, version, reason, response);
}

RpcResult HandleRpc(std::span<const uint8_t> request, const RpcContext& ctx,
                    std::span<uint8_t> response, WriteRequest* staged) {
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
  if (ctx.sharded && r.opcode != Opcode::kPing) {
    if (std::optional<RpcResult> foreign = ForeignSlot(r, ctx, response)) return *foreign;
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
      // TooOld() without its second lookup: Find() answered null just now.
      if (ctx.window->has_floor() && r.sequence <= ctx.window->floor()) {
        Count(ctx, ErrorKind::kRpcTooOld);
        return Answer(
            r.opcode, RpcStatus::kRejected, r.sequence, 0,
            absl::StrCat("sequence ", r.sequence, " is older than the dedupe window (floor ",
                         ctx.window->floor(), "): it may have been applied"),
            response);
      }
      if (ctx.writes_paused) {
        ctx.window->Hold(r.sequence);  // invariant 4 of dedupe.h: it will be retried
        Count(ctx, Counter::kRpcBusy);
        return Answer(r.opcode, RpcStatus::kBusy, r.sequence, 0, "writes paused", response);
      }
      // The backend persists the client's record with the write (the entry
      // AnswerWrite records, atomically with the data): a retry after a
      // crash is answered from it.
      const WriteRequest w{r.opcode, r.key, r.value,
                           WriteTag{ctx.client_id, ctx.window, r.sequence, r.opcode, ctx.secret}};
      if (staged != nullptr) {
        *staged = w;
        return RpcResult{0, r.opcode, RpcStatus::kOk, r.sequence, /*staged=*/true};
      }
      WriteReply reply;
      ctx.backend->Write({&w, 1}, {&reply, 1});
      return AnswerWrite(w, reply, ctx, response);
    }
  }
  Count(ctx, ErrorKind::kRpcUnknownOpcode);
  return Answer(Opcode::kPing, RpcStatus::kRejected, r.sequence, 0, "unknown opcode", response);
}

}  // namespace kvnode::server
