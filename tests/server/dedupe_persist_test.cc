// Write deduplication across a crash, with the real Store (RocksDB + arena):
// a child process applies writes through HandleRpc + StoreBackend and _exits
// without closing anything (as a SIGKILL would leave it); the parent reopens
// the store, loads the persisted client records and retries.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvnode/proto/control.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/server/dedupe.h"
#include "kvnode/server/metrics.h"
#include "kvnode/server/rpc_handler.h"
#include "kvnode/storage/arena.h"
#include "kvnode/storage/store.h"

namespace kvnode::server {
namespace {

using proto::Opcode;
using proto::RpcStatus;

struct Reply {
  RpcStatus status;
  uint64_t version;
  std::string value;
};

// One node lifetime: the store, the backend and the clients' windows.
struct Node {
  std::unique_ptr<storage::Store> store;
  std::unique_ptr<StoreBackend> backend;
  std::map<uint64_t, DedupeWindow> windows;
  std::map<uint64_t, ResumeSecret> secrets;  // as the data plane holds them
  Metrics metrics;
  bool writes_paused = false;  // as during a live upgrade's pause: writes get BUSY

  // load: import the persisted client records, as a cold start does.
  static std::unique_ptr<Node> Open(const storage::StoreOptions& o, bool load) {
    auto n = std::make_unique<Node>();
    auto s = storage::Store::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
    n->store = std::move(*s);
    n->backend = std::make_unique<StoreBackend>(n->store.get(), /*record_entries=*/8);
    if (load) {
      auto recs = n->backend->LoadClientRecords(4096);
      EXPECT_TRUE(recs.ok()) << recs.status();
      for (const ClientRecordExport& r : *recs) {
        n->windows.emplace(r.client_id, DedupeWindow::Import(r.window, 1024));
        n->secrets[r.client_id] = r.secret;
      }
    }
    return n;
  }

  Reply Send(uint64_t client, Opcode op, uint64_t seq, const std::string& key,
             const std::string& value = "") {
    std::string req;
    EXPECT_TRUE(proto::EncodeRequest(proto::RequestView{op, client, seq, key, value}, &req).ok());
    std::vector<uint8_t> resp(proto::kMaxRpcMessageSize);
    const RpcResult r = HandleRpc(proto::AsBytes(req), Context(client), resp);
    auto d = proto::DecodeResponse(std::span<const uint8_t>(resp.data(), r.response_size));
    EXPECT_TRUE(d.ok()) << d.status();
    return Reply{d->status, d->version, std::string(d->value)};
  }

  struct Op {
    uint64_t client;
    Opcode op;
    uint64_t seq;
    std::string key;
    std::string value;
  };
  // The writes of one poll round as the data plane applies them: staged by
  // HandleRpc, applied in one group commit, then answered.
  std::vector<Reply> SendGroup(const std::vector<Op>& ops) {
    std::vector<std::string> reqs(ops.size());
    std::vector<WriteRequest> staged(ops.size());
    std::vector<uint8_t> resp(proto::kMaxRpcMessageSize);
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& o = ops[i];
      EXPECT_TRUE(
          proto::EncodeRequest(proto::RequestView{o.op, o.client, o.seq, o.key, o.value}, &reqs[i])
              .ok());
      EXPECT_TRUE(HandleRpc(proto::AsBytes(reqs[i]), Context(o.client), resp, &staged[i]).staged);
    }
    std::vector<WriteReply> replies(ops.size());
    backend->Write(staged, replies);
    std::vector<Reply> out;
    for (size_t i = 0; i < ops.size(); ++i) {
      const RpcResult r = AnswerWrite(staged[i], replies[i], Context(ops[i].client), resp);
      auto d = proto::DecodeResponse(std::span<const uint8_t>(resp.data(), r.response_size));
      EXPECT_TRUE(d.ok()) << d.status();
      out.push_back(Reply{d->status, d->version, std::string(d->value)});
    }
    return out;
  }
  RpcContext Context(uint64_t client) {
    DedupeWindow& w = windows.try_emplace(client, 1024).first->second;
    return RpcContext{client, &w, backend.get(), writes_paused, &metrics, &secrets[client]};
  }

  // The stored value (not through the dedupe path).
  Reply Read(const std::string& key) {
    auto g = store->Get(key);
    if (!g.ok()) return Reply{RpcStatus::kNotFound, 0, ""};
    return Reply{RpcStatus::kOk, g->version, g->value};
  }
};

constexpr uint64_t kA = 0xa0a0a0a0a0a0a0a0ULL, kB = 0xb0b0, kC = 0xc0c0;

class DedupePersistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvnode-dedupe-persist-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    opts_.db_path = dir_ + "/db";
    opts_.shm_name = "kvnode-dedupe-persist-" + std::to_string(getpid()) + "-" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name();
    opts_.arena_size = 8 << 20;
    opts_.sync_writes = false;  // a process crash loses nothing either way
  }
  void TearDown() override {
    (void)storage::Arena::Remove(opts_.arena_options());
    ASSERT_EQ(std::system(("rm -rf " + dir_).c_str()), 0);
  }

  // Runs `body` in a child that then _exits without closing the store (a
  // crash); returns the numbers the child reported.
  std::vector<uint64_t> InCrashingChild(void (*body)(Node&, std::vector<uint64_t>*)) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      std::unique_ptr<Node> n = Node::Open(opts_, true);
      if (n == nullptr) _exit(3);
      std::vector<uint64_t> out;
      body(*n, &out);
      std::string text;
      for (uint64_t v : out) text += std::to_string(v) + " ";
      if (write(fds[1], text.data(), text.size()) != static_cast<ssize_t>(text.size())) _exit(4);
      _exit(::testing::Test::HasFailure() ? 1 : 0);  // no destructor: RocksDB never closed
    }
    close(fds[1]);
    std::string text;
    char buf[256];
    for (ssize_t k; (k = read(fds[0], buf, sizeof(buf))) > 0;) text.append(buf, k);
    close(fds[0]);
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child failed: " << status;
    std::vector<uint64_t> out;
    for (size_t p = 0; p < text.size();) {
      size_t e = text.find(' ', p);
      out.push_back(std::stoull(text.substr(p, e - p)));
      p = e + 1;
    }
    return out;
  }

  std::string dir_;
  storage::StoreOptions opts_;
};

// A applied PUT k (seq 7) and DELETE k2 (seq 8) and lost the answers; B then
// wrote both keys; C applied seqs 1..21. The node crashed.
void Writes(Node& n, std::vector<uint64_t>* out) {
  EXPECT_EQ(n.Send(kB, Opcode::kPut, 1, "k2", "b-old").status, RpcStatus::kOk);
  const Reply a = n.Send(kA, Opcode::kPut, 7, "k", "a");
  EXPECT_EQ(a.status, RpcStatus::kOk);
  EXPECT_EQ(n.Send(kA, Opcode::kDelete, 8, "k2").status, RpcStatus::kOk);
  const Reply b = n.Send(kB, Opcode::kPut, 2, "k", "b");
  const Reply b2 = n.Send(kB, Opcode::kPut, 3, "k2", "b2");
  Reply c{};
  for (uint64_t s = 1; s <= 21; ++s) c = n.Send(kC, Opcode::kPut, s, "kc", "c" + std::to_string(s));
  *out = {a.version, b.version, b2.version, c.version};
}

TEST_F(DedupePersistTest, RetryAfterCrashIsAnsweredNotApplied) {
  const std::vector<uint64_t> v = InCrashingChild(Writes);
  ASSERT_EQ(v.size(), 4u);
  const uint64_t va = v[0], vb = v[1], vb2 = v[2], vc = v[3];

  std::unique_ptr<Node> n = Node::Open(opts_, /*load=*/true);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->store->opened_as(), storage::Store::OpenedAs::kRecovered);  // it did crash

  // A's retried PUT: the original answer, and B's newer value stays.
  Reply r = n->Send(kA, Opcode::kPut, 7, "k", "a");
  EXPECT_EQ(r.status, RpcStatus::kOk);
  EXPECT_EQ(r.version, va);
  Reply k = n->Read("k");
  EXPECT_EQ(k.value, "b");
  EXPECT_EQ(k.version, vb);

  // A's retried DELETE: answered OK, B's newer k2 stays.
  r = n->Send(kA, Opcode::kDelete, 8, "k2");
  EXPECT_EQ(r.status, RpcStatus::kOk);
  k = n->Read("k2");
  EXPECT_EQ(k.status, RpcStatus::kOk);
  EXPECT_EQ(k.value, "b2");
  EXPECT_EQ(k.version, vb2);
  EXPECT_EQ(n->metrics.Snapshot().of(Counter::kDedupeHits), 2u);

  // C's seq 1 is older than the 8 entries persisted: refused, not applied.
  r = n->Send(kC, Opcode::kPut, 1, "kc", "c-stale");
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  EXPECT_EQ(n->Read("kc").version, vc);
  EXPECT_EQ(n->metrics.Snapshot().of(ErrorKind::kRpcTooOld), 1u);
  // ...while its newest ones are answered.
  r = n->Send(kC, Opcode::kPut, 21, "kc", "c21");
  EXPECT_EQ(r.status, RpcStatus::kOk);
  EXPECT_EQ(r.version, vc);

  // A's next sequence is new: applied.
  r = n->Send(kA, Opcode::kPut, 9, "k", "a2");
  EXPECT_EQ(r.status, RpcStatus::kOk);
  EXPECT_GT(r.version, vb2);
  ASSERT_TRUE(n->store->Close().ok());
}

// The attack the records stop: without them (the node before this change),
// the same retry after a restart is applied again and puts A's old value back.
TEST_F(DedupePersistTest, WithoutTheRecordsTheRetryWouldOverwrite) {
  const std::vector<uint64_t> v = InCrashingChild(Writes);
  ASSERT_EQ(v.size(), 4u);
  std::unique_ptr<Node> n = Node::Open(opts_, /*load=*/false);
  ASSERT_NE(n, nullptr);
  Reply r = n->Send(kA, Opcode::kPut, 7, "k", "a");
  EXPECT_EQ(r.status, RpcStatus::kOk);
  EXPECT_GT(r.version, v[1]);
  EXPECT_EQ(n->Read("k").value, "a");  // B's newer 'b' lost: what the e2e test catches
  ASSERT_TRUE(n->store->Close().ok());
}

// One group commit held three writes of A and one of B; the node crashed.
void GroupedWrites(Node& n, std::vector<uint64_t>* out) {
  const std::vector<Reply> r = n.SendGroup({{kA, Opcode::kPut, 10, "g1", "a10"},
                                            {kB, Opcode::kPut, 5, "gb", "b5"},
                                            {kA, Opcode::kPut, 11, "g2", "a11"},
                                            {kA, Opcode::kDelete, 12, "gb", ""}});
  for (const Reply& x : r) EXPECT_EQ(x.status, RpcStatus::kOk);
  // Newer writes of both keys A wrote, by B.
  EXPECT_EQ(n.Send(kB, Opcode::kPut, 6, "g1", "b6").status, RpcStatus::kOk);
  EXPECT_EQ(n.Send(kB, Opcode::kPut, 7, "g2", "b7").status, RpcStatus::kOk);
  *out = {r[0].version, r[2].version, n.Read("g1").version, n.Read("g2").version};
}

// Each side record of a group holds its client's earlier writes of the
// group: A's record, written last by seq 12, still answers 10 and 11.
TEST_F(DedupePersistTest, EveryWriteOfAGroupIsRememberedAfterACrash) {
  const std::vector<uint64_t> v = InCrashingChild(GroupedWrites);
  ASSERT_EQ(v.size(), 4u);
  std::unique_ptr<Node> n = Node::Open(opts_, /*load=*/true);
  ASSERT_NE(n, nullptr);
  Reply r = n->Send(kA, Opcode::kPut, 10, "g1", "a10");
  EXPECT_EQ(r.status, RpcStatus::kOk);
  EXPECT_EQ(r.version, v[0]);
  r = n->Send(kA, Opcode::kPut, 11, "g2", "a11");
  EXPECT_EQ(r.status, RpcStatus::kOk);
  EXPECT_EQ(r.version, v[1]);
  EXPECT_EQ(n->Send(kA, Opcode::kDelete, 12, "gb").status, RpcStatus::kOk);
  EXPECT_EQ(n->Send(kB, Opcode::kPut, 5, "gb", "b5").status, RpcStatus::kOk);
  EXPECT_EQ(n->metrics.Snapshot().of(Counter::kDedupeHits), 4u);
  EXPECT_EQ(n->Read("g1").version, v[2]);  // B's newer values stay
  EXPECT_EQ(n->Read("g2").version, v[3]);
  EXPECT_EQ(n->Read("gb").status, RpcStatus::kNotFound);
  ASSERT_TRUE(n->store->Close().ok());
}

TEST_F(DedupePersistTest, OneBoundedRecordPerClientAndAgeing) {
  std::unique_ptr<Node> n = Node::Open(opts_, true);
  ASSERT_NE(n, nullptr);
  for (uint64_t s = 1; s <= 100; ++s) {
    ASSERT_EQ(n->Send(kA, Opcode::kPut, s, "k" + std::to_string(s % 7), "v").status,
              RpcStatus::kOk);
  }
  ASSERT_EQ(n->Send(kB, Opcode::kDelete, 1, "absent").status, RpcStatus::kNotFound);
  ASSERT_EQ(n->Send(kC, Opcode::kPut, 1, "kc", "c").status, RpcStatus::kOk);
  auto side = n->store->ReadSideRecords(kClientRecordPrefix);
  ASSERT_TRUE(side.ok()) << side.status();
  ASSERT_EQ(side->size(), 3u);
  std::map<std::string, std::string> by_key(side->begin(), side->end());
  ASSERT_EQ(by_key.count(ClientRecordKey(kA)), 1u);
  EXPECT_EQ(by_key[ClientRecordKey(kA)].size(), 36u + 8 * 18);  // the newest 8 entries only
  // A NOT_FOUND answer is persisted too (a retried DELETE must not delete a
  // value written since).
  auto b = DecodeClientRecord(kB, by_key[ClientRecordKey(kB)]);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->window.entries.size(), 1u);
  EXPECT_EQ(b->window.entries[0].status, static_cast<uint8_t>(RpcStatus::kNotFound));

  // A client aged out of memory is dropped from disk too.
  n->backend->ForgetClient(kB);
  side = n->store->ReadSideRecords(kClientRecordPrefix);
  ASSERT_TRUE(side.ok());
  EXPECT_EQ(side->size(), 2u);
  // At load, at most --max_client_records are kept; the rest are deleted.
  auto recs = n->backend->LoadClientRecords(1);
  ASSERT_TRUE(recs.ok()) << recs.status();
  EXPECT_EQ(recs->size(), 1u);
  side = n->store->ReadSideRecords(kClientRecordPrefix);
  ASSERT_TRUE(side.ok());
  EXPECT_EQ(side->size(), 1u);
  // A malformed record is dropped (logged), never a reason not to start.
  ASSERT_EQ(n->Send(kB, Opcode::kPut, 2, "kb", "b").status, RpcStatus::kOk);
  const storage::SideRecord junk{"dedupe/zzzz",
                                 [](const storage::WriteOutcome&) { return std::string("junk"); }};
  ASSERT_TRUE(n->store->Put("junk", "x", &junk).ok());
  recs = n->backend->LoadClientRecords(10);
  ASSERT_TRUE(recs.ok()) << recs.status();
  EXPECT_EQ(recs->size(), 2u);
  side = n->store->ReadSideRecords(kClientRecordPrefix);
  ASSERT_TRUE(side.ok());
  EXPECT_EQ(side->size(), 2u);
  ASSERT_TRUE(n->store->Close().ok());
}

// A's write seq 2 was answered BUSY (writes paused), so A holds it and will
// retry it with its sequence; meanwhile writes 3..12 of A (more than the 8
// entries a record keeps) were applied. The node crashed before the retry.
void HeldWriteThenLaterWrites(Node& n, std::vector<uint64_t>* out) {
  EXPECT_EQ(n.Send(kA, Opcode::kPut, 1, "k", "a1").status, RpcStatus::kOk);
  n.writes_paused = true;
  EXPECT_EQ(n.Send(kA, Opcode::kPut, 2, "held", "a2").status, RpcStatus::kBusy);
  n.writes_paused = false;
  for (uint64_t s = 3; s <= 12; ++s) {
    EXPECT_EQ(n.Send(kA, Opcode::kPut, s, "k", "a" + std::to_string(s)).status, RpcStatus::kOk);
  }
  *out = {n.Read("k").version};
}

// A write answered BUSY was not applied, and the client retries it with its
// sequence: no floor may pass it, the persisted one included. Older writes
// that were applied stay refused.
TEST_F(DedupePersistTest, WriteHeldAfterBusyIsAppliedAfterACrash) {
  const std::vector<uint64_t> v = InCrashingChild(HeldWriteThenLaterWrites);
  ASSERT_EQ(v.size(), 1u);
  std::unique_ptr<Node> n = Node::Open(opts_, /*load=*/true);
  ASSERT_NE(n, nullptr);
  Reply r = n->Send(kA, Opcode::kPut, 2, "held", "a2");
  EXPECT_EQ(r.status, RpcStatus::kOk) << r.value;
  EXPECT_GT(r.version, v[0]);
  EXPECT_EQ(n->Read("held").value, "a2");
  EXPECT_EQ(n->metrics.Snapshot().of(ErrorKind::kRpcTooOld), 0u);
  // Seq 1, applied before the held write, is still refused.
  r = n->Send(kA, Opcode::kPut, 1, "k", "a1-stale");
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  EXPECT_EQ(n->Read("k").version, v[0]);
  ASSERT_TRUE(n->store->Close().ok());
}

uint64_t UnixMs(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

// A record's write time (what ages records at a cold start) is the wall
// clock's, read from the coarse clock: it lags by up to a kernel tick (more
// when a tick is late on a loaded host); a second's slack still tells the
// wall clock from any other.
TEST_F(DedupePersistTest, RecordTimeIsTheWallClock) {
  std::unique_ptr<Node> n = Node::Open(opts_, true);
  ASSERT_NE(n, nullptr);
  constexpr uint64_t kSlackMs = 1000;
  const uint64_t before = UnixMs(CLOCK_REALTIME);
  ASSERT_EQ(n->Send(kA, Opcode::kPut, 1, "k", "v").status, RpcStatus::kOk);
  const uint64_t after = UnixMs(CLOCK_REALTIME);
  auto side = n->store->ReadSideRecords(kClientRecordPrefix);
  ASSERT_TRUE(side.ok()) << side.status();
  ASSERT_EQ(side->size(), 1u);
  auto a = DecodeClientRecord(kA, side->front().second);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GE(a->written_unix_ms + kSlackMs, before);
  EXPECT_LE(a->written_unix_ms, after);
  ASSERT_TRUE(n->store->Close().ok());
}

// The resume secret is persisted with the record, so that after a cold start
// the client (and only it) can resume its id and window.
TEST_F(DedupePersistTest, ResumeSecretSurvivesAColdStart) {
  const ResumeSecret secret = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  {
    std::unique_ptr<Node> n = Node::Open(opts_, true);
    ASSERT_NE(n, nullptr);
    n->secrets[kA] = secret;
    ASSERT_EQ(n->Send(kA, Opcode::kPut, 1, "k", "a").status, RpcStatus::kOk);
    ASSERT_TRUE(n->store->Close().ok());
  }
  std::unique_ptr<Node> n = Node::Open(opts_, true);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->secrets[kA], secret);
  // A version 1 record (no secret) is refused and deleted at load.
  std::string v1 = EncodeClientRecord(PersistedClient{kB, 1, {}, {}});
  v1[0] = 1;
  v1.erase(20, 16);
  EXPECT_TRUE(absl::IsDataLoss(DecodeClientRecord(kB, v1).status()));
  ASSERT_TRUE(n->store->Close().ok());
}

}  // namespace
}  // namespace kvnode::server
