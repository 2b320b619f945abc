#include "kvnode/server/rpc_handler.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "kvnode/proto/control.h"
#include "kvnode/storage/limits.h"

namespace kvnode::server {
namespace {

using proto::Opcode;
using proto::RpcStatus;

// An in-memory backend (the RPC handler's logic is under test, not storage;
// the e2e tests run the real Store).
class MapBackend final : public KvBackend {
 public:
  void Write(std::span<const WriteRequest> requests, std::span<WriteReply> replies) override {
    ++writes;
    for (size_t i = 0; i < requests.size(); ++i) {
      const WriteRequest& w = requests[i];
      WriteReply& r = replies[i];
      tags.push_back(w.tag);
      ++(w.opcode == Opcode::kPut ? puts : deletes);
      if (!fail.ok()) {
        r.status = fail;
      } else if (w.opcode == Opcode::kPut) {
        map[std::string(w.key)] = {std::string(w.value), ++version};
        r.version = version;
      } else {
        r.existed = map.erase(std::string(w.key)) > 0;
      }
    }
  }
  absl::StatusOr<Value> Get(std::string_view k) override {
    if (!fail.ok()) return fail;
    auto it = map.find(std::string(k));
    if (it == map.end()) return absl::NotFoundError("absent");
    return it->second;
  }
  std::map<std::string, Value> map;
  uint64_t version = 0;
  int writes = 0;  // Write calls
  int puts = 0;
  int deletes = 0;
  std::vector<WriteTag> tags;
  absl::Status fail;
};

class RpcHandlerTest : public ::testing::Test {
 protected:
  struct Reply {
    RpcStatus status;
    uint64_t sequence;
    uint64_t version;
    std::string value;
    Opcode opcode;
  };

  Reply Send(const std::string& bytes) {
    std::vector<uint8_t> resp(proto::kMaxRpcMessageSize);
    RpcContext ctx{kClient, &window_, &backend_, paused_, &metrics_};
    ctx.sharded = sharded_;
    ctx.shard = shard_.get();
    ctx.shard_map_feature = shard_map_feature_;
    RpcResult r = HandleRpc(proto::AsBytes(bytes), ctx, resp);
    EXPECT_GT(r.response_size, 0u);
    auto d = proto::DecodeResponse(std::span<const uint8_t>(resp.data(), r.response_size));
    EXPECT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->status, r.status);
    return Reply{d->status, d->sequence, d->version, std::string(d->value), d->opcode};
  }

  std::string Req(Opcode op, uint64_t seq, std::string_view key, std::string_view value = {},
                  uint64_t client = kClient) {
    std::string out;
    EXPECT_TRUE(proto::EncodeRequest(proto::RequestView{op, client, seq, key, value}, &out).ok());
    return out;
  }

  uint64_t Errors(ErrorKind k) { return metrics_.Snapshot().of(k); }

  static constexpr uint64_t kClient = 1234;
  MapBackend backend_;
  DedupeWindow window_{1024};
  Metrics metrics_;
  bool paused_ = false;
  bool sharded_ = false;
  std::shared_ptr<const ShardView> shard_;
  bool shard_map_feature_ = true;
};

TEST_F(RpcHandlerTest, PutGetDeletePing) {
  Reply p = Send(Req(Opcode::kPut, 1, "k", "v1"));
  EXPECT_EQ(p.status, RpcStatus::kOk);
  EXPECT_EQ(p.sequence, 1u);
  EXPECT_EQ(p.opcode, Opcode::kPut);
  EXPECT_EQ(p.version, 1u);
  Reply g = Send(Req(Opcode::kGet, 2, "k"));
  EXPECT_EQ(g.status, RpcStatus::kOk);
  EXPECT_EQ(g.value, "v1");
  EXPECT_EQ(g.version, 1u);
  EXPECT_EQ(Send(Req(Opcode::kGet, 3, "nope")).status, RpcStatus::kNotFound);
  EXPECT_EQ(Send(Req(Opcode::kDelete, 4, "k")).status, RpcStatus::kOk);
  EXPECT_EQ(Send(Req(Opcode::kDelete, 5, "k")).status, RpcStatus::kNotFound);
  Reply ping = Send(Req(Opcode::kPing, 6, "", "echo me"));
  EXPECT_EQ(ping.status, RpcStatus::kOk);
  EXPECT_EQ(ping.value, "echo me");
  const CounterSnapshot s = metrics_.Snapshot();
  EXPECT_EQ(s.of(Counter::kOpsPut), 1u);
  EXPECT_EQ(s.of(Counter::kOpsGetRpc), 2u);
  EXPECT_EQ(s.of(Counter::kOpsDelete), 2u);
  EXPECT_EQ(s.of(Counter::kOpsPing), 1u);
}

TEST_F(RpcHandlerTest, RetriedWriteIsAppliedOnce) {
  const std::string put = Req(Opcode::kPut, 10, "k", "v");
  Reply a = Send(put);
  Reply b = Send(put);  // e.g. after a reconnect or a Move
  EXPECT_EQ(backend_.puts, 1);
  EXPECT_EQ(b.status, a.status);
  EXPECT_EQ(b.version, a.version);
  EXPECT_EQ(metrics_.Snapshot().of(Counter::kDedupeHits), 1u);
  const std::string del = Req(Opcode::kDelete, 11, "absent");
  EXPECT_EQ(Send(del).status, RpcStatus::kNotFound);
  EXPECT_EQ(Send(del).status, RpcStatus::kNotFound);
  EXPECT_EQ(backend_.deletes, 1);
}

TEST_F(RpcHandlerTest, PausedWritesAreBusyAndNotRemembered) {
  paused_ = true;
  EXPECT_EQ(Send(Req(Opcode::kPut, 20, "k", "v")).status, RpcStatus::kBusy);
  EXPECT_EQ(Send(Req(Opcode::kDelete, 21, "k")).status, RpcStatus::kBusy);
  EXPECT_EQ(backend_.puts, 0);
  // Reads and pings still work while writes are paused.
  EXPECT_EQ(Send(Req(Opcode::kGet, 22, "k")).status, RpcStatus::kNotFound);
  EXPECT_EQ(Send(Req(Opcode::kPing, 23, "")).status, RpcStatus::kOk);
  paused_ = false;
  // The retry with the same sequence is applied now.
  EXPECT_EQ(Send(Req(Opcode::kPut, 20, "k", "v")).status, RpcStatus::kOk);
  EXPECT_EQ(backend_.puts, 1);
  // A write answered before the pause is still answered from the window
  // during one (no BUSY for what was already applied).
  paused_ = true;
  EXPECT_EQ(Send(Req(Opcode::kPut, 20, "k", "v")).status, RpcStatus::kOk);
}

TEST_F(RpcHandlerTest, StorageErrorsAreInternalAndRetryable) {
  backend_.fail = absl::InternalError("disk on fire");
  Reply r = Send(Req(Opcode::kPut, 30, "k", "v"));
  EXPECT_EQ(r.status, RpcStatus::kInternal);
  EXPECT_NE(r.value.find("disk on fire"), std::string::npos);
  EXPECT_EQ(Errors(ErrorKind::kStorage), 1u);
  backend_.fail = absl::OkStatus();
  EXPECT_EQ(Send(Req(Opcode::kPut, 30, "k", "v")).status, RpcStatus::kOk);  // not remembered
  backend_.fail = absl::UnavailableError("db closed for handoff");
  EXPECT_EQ(Send(Req(Opcode::kGet, 31, "x")).status, RpcStatus::kBusy);
}

// The store refuses a new key whose index chain is at its bound: the client
// gets REJECTED with the store's reason, the node counts it, and a retry of
// the same sequence gets the same answer without a second attempt.
TEST_F(RpcHandlerTest, FullIndexChainIsRejectedAndCounted) {
  backend_.fail = absl::ResourceExhaustedError("index chain full: max_chain_buckets 16");
  Reply r = Send(Req(Opcode::kPut, 35, "aimed", "v"));
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  EXPECT_NE(r.value.find("index chain full"), std::string::npos);
  EXPECT_EQ(Errors(ErrorKind::kIndexChainFull), 1u);
  EXPECT_EQ(Errors(ErrorKind::kStorage), 0u);
  EXPECT_EQ(Send(Req(Opcode::kPut, 35, "aimed", "v")).status, RpcStatus::kRejected);
  EXPECT_EQ(backend_.puts, 1);
  bool exported = false;
  for (const auto& [name, v] : metrics_.Export()) {
    exported |= (name == "errors.index_chain_full" && v == 1);
  }
  EXPECT_TRUE(exported);
}

TEST_F(RpcHandlerTest, MalformedRequestsAreRejectedWithTheirSequence) {
  std::string ok = Req(Opcode::kPut, 40, "k", "v");
  std::string unknown = ok;
  unknown[1] = 99;
  Reply r = Send(unknown);
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  EXPECT_EQ(r.sequence, 40u);
  EXPECT_EQ(r.opcode, Opcode::kPing);
  EXPECT_EQ(Errors(ErrorKind::kRpcUnknownOpcode), 1u);

  std::string oversize = ok;
  oversize[2] = static_cast<char>(0xff);
  oversize[3] = 0x7f;  // key_len 32767
  r = Send(oversize);
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  EXPECT_EQ(r.sequence, 40u);
  EXPECT_EQ(Errors(ErrorKind::kRpcOversize), 1u);

  r = Send(ok.substr(0, ok.size() - 1));  // body shorter than the header says
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  EXPECT_EQ(r.sequence, 40u);
  r = Send(ok.substr(0, 5));  // not even a header
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  EXPECT_EQ(r.sequence, 0u);
  r = Send("");
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  std::string v2 = ok;
  v2[0] = 2;  // RPC version
  EXPECT_EQ(Send(v2).status, RpcStatus::kRejected);
  EXPECT_EQ(Errors(ErrorKind::kRpcMalformed), 4u);
  EXPECT_EQ(backend_.puts, 0);
}

TEST_F(RpcHandlerTest, WrongClientIdIsRejected) {
  Reply r = Send(Req(Opcode::kPut, 50, "k", "v", kClient + 1));
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  EXPECT_EQ(Errors(ErrorKind::kRpcWrongClient), 1u);
  EXPECT_EQ(backend_.puts, 0);
}

TEST_F(RpcHandlerTest, LargestValueRoundTrips) {
  const std::string big(storage::kMaxValueSize, 'x');
  const std::string key(storage::kMaxKeySize, 'k');
  EXPECT_EQ(Send(Req(Opcode::kPut, 60, key, big)).status, RpcStatus::kOk);
  Reply g = Send(Req(Opcode::kGet, 61, key));
  EXPECT_EQ(g.status, RpcStatus::kOk);
  EXPECT_EQ(g.value, big);
}

TEST_F(RpcHandlerTest, WriteOlderThanTheWindowIsRefusedNotReapplied) {
  for (uint64_t s = 1; s <= 1100; ++s) Send(Req(Opcode::kPut, 1000 + s, "k", "v"));
  const int puts = backend_.puts;
  Reply r = Send(Req(Opcode::kPut, 1001, "k", "v"));  // forgotten
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  EXPECT_EQ(backend_.puts, puts);
  EXPECT_EQ(Errors(ErrorKind::kRpcTooOld), 1u);
}

// A key of each kind for node "a" of a two-node map.
struct ShardKeys {
  std::string ours;
  std::string theirs;
};
ShardKeys KeysFor(const ShardView& v) {
  ShardKeys k;
  for (int i = 0; k.ours.empty() || k.theirs.empty(); ++i) {
    const std::string key = "key-" + std::to_string(i);
    (v.OwnsKey(key) ? k.ours : k.theirs) = key;
  }
  return k;
}

std::shared_ptr<const ShardView> TwoNodeView(uint64_t epoch) {
  absl::StatusOr<proto::ShardMap> m = proto::EvenSplit("c1", 4096, {"a", "b"});
  EXPECT_TRUE(m.ok());
  m->epoch = epoch;
  return ShardView::ForNode(*m, "a");
}

TEST_F(RpcHandlerTest, ForeignSlotIsWrongShardWithTheEpochAndNothingApplied) {
  sharded_ = true;
  shard_ = TwoNodeView(9);
  const ShardKeys k = KeysFor(*shard_);
  for (Opcode op : {Opcode::kPut, Opcode::kDelete, Opcode::kGet}) {
    Reply r = Send(Req(op, 40, k.theirs, op == Opcode::kPut ? "v" : ""));
    EXPECT_EQ(r.status, RpcStatus::kWrongShard) << proto::OpcodeName(op);
    EXPECT_EQ(r.version, 9u);
    EXPECT_EQ(r.sequence, 40u);
    EXPECT_EQ(r.opcode, op);
  }
  EXPECT_EQ(backend_.writes, 0);
  // Not remembered: the same sequence for an owned key is applied.
  EXPECT_EQ(window_.Find(40), nullptr);
  EXPECT_EQ(Send(Req(Opcode::kPut, 40, k.ours, "v")).status, RpcStatus::kOk);
  EXPECT_EQ(backend_.puts, 1);
  EXPECT_EQ(Send(Req(Opcode::kGet, 41, k.ours)).value, "v");
  EXPECT_EQ(Send(Req(Opcode::kPing, 42, "")).status, RpcStatus::kOk);
  EXPECT_EQ(metrics_.Snapshot().of(Counter::kRpcWrongShard), 3u);
}

// The shard check comes before the dedupe window: a write remembered here
// whose slot moved away is rerouted, not answered from the window.
TEST_F(RpcHandlerTest, ForeignSlotWinsOverTheDedupeWindow) {
  shard_ = TwoNodeView(1);
  const ShardKeys k = KeysFor(*shard_);
  EXPECT_EQ(Send(Req(Opcode::kPut, 50, k.theirs, "v")).status, RpcStatus::kOk);
  sharded_ = true;
  EXPECT_EQ(Send(Req(Opcode::kPut, 50, k.theirs, "v")).status, RpcStatus::kWrongShard);
  EXPECT_EQ(metrics_.Snapshot().of(Counter::kDedupeHits), 0u);
}

TEST_F(RpcHandlerTest, NoMapYetIsWrongShardEpochZero) {
  sharded_ = true;
  Reply r = Send(Req(Opcode::kPut, 60, "k", "v"));
  EXPECT_EQ(r.status, RpcStatus::kWrongShard);
  EXPECT_EQ(r.version, 0u);
  shard_map_feature_ = false;
  r = Send(Req(Opcode::kGet, 61, "k"));
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  EXPECT_NE(r.value.find("no shard map"), std::string::npos) << r.value;
  EXPECT_EQ(backend_.writes, 0);
}

TEST_F(RpcHandlerTest, ForeignSlotToAPlainSessionIsRejectedNamingSlotAndOwner) {
  sharded_ = true;
  shard_map_feature_ = false;
  shard_ = TwoNodeView(3);
  const ShardKeys k = KeysFor(*shard_);
  Reply r = Send(Req(Opcode::kPut, 70, k.theirs, "v"));
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  const std::string slot = std::to_string(proto::SlotOf(k.theirs, 4096));
  EXPECT_NE(r.value.find("slot " + slot), std::string::npos) << r.value;
  EXPECT_NE(r.value.find("node 'b'"), std::string::npos) << r.value;
  EXPECT_EQ(backend_.writes, 0);
  EXPECT_EQ(window_.Find(70), nullptr);
  EXPECT_EQ(metrics_.Snapshot().of(Counter::kRpcWrongShard), 1u);
}

}  // namespace
}  // namespace kvnode::server
