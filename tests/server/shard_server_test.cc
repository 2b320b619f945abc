// A Server with and without a ShardGate, driven over the wire by the e2e
// test peer (label rdma: a real device, a real RocksDB, the server in this
// process so that the test publishes maps on its gate): the shard map
// feature's negotiation, the maps pushed after Ready, after Publish and on
// MapRequest, WRONG_SHARD with the epoch for a foreign slot (nothing
// applied, nothing remembered), REJECTED naming the owner to a session
// without the feature, the guard (`guard up|down` on the admin socket:
// acknowledged or cut), and no change at all without a gate.
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/device_env.h"
#include "kvnode/proto/control.h"
#include "kvnode/proto/frame_io.h"
#include "kvnode/proto/rpc.h"
#include "kvnode/server/server.h"
#include "kvnode/server/shard_gate.h"
#include "test_peer.h"

namespace kvnode::server {
namespace {

using e2e::Resp;
using proto::Opcode;
using proto::RpcStatus;

proto::ShardMap Map(uint64_t epoch, std::vector<std::string> ids) {
  absl::StatusOr<proto::ShardMap> m = proto::EvenSplit("c1", 4096, ids);
  EXPECT_TRUE(m.ok()) << m.status();
  m->epoch = epoch;
  return *m;
}

class ShardServerTest : public ::testing::Test {
 protected:
  // Starts a node on `dev` (with `gate` when set) and points the peer at it.
  void Start(const testing::TestDevice& dev, std::shared_ptr<ShardGate> gate) {
    char tmpl[] = "/tmp/kvnode-shard-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.db_path = dir_ + "/db";
    o.admin_socket = dir_ + "/admin.sock";
    o.shm_name = absl::StrCat("kvnode-shard-test-", getpid());
    o.rdma_device = dev.name;
    o.rdma_port = dev.port;
    o.arena_size = uint64_t{16} << 20;
    o.upgrade_journal_mb = 2;
    o.sync_writes = false;
    o.max_clients = 8;
    o.shard_gate = std::move(gate);
    absl::StatusOr<std::unique_ptr<Server>> s = Server::Create(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    thread_ = std::thread([this] { run_status_ = server_->Run(); });
    e2e::PeerConfig& c = e2e::Config();
    c.tool = "shard_server_test";
    c.server = server_->listen_address();
    c.rdma_device = dev.name;
    c.timeout_s = 10;
  }

  void TearDown() override {
    // The peer's verbs objects first: the server's leak check counts the
    // whole process.
    for (std::unique_ptr<e2e::Session>* s : {&a_, &b_, &c_}) {
      if (*s != nullptr && !(*s)->dead) e2e::Goodbye(**s);
      s->reset();
    }
    if (server_ != nullptr) {
      server_->RequestShutdown();
      thread_.join();
      EXPECT_TRUE(run_status_.ok()) << run_status_;
      server_.reset();
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<e2e::Session> Open(uint64_t features) {
    e2e::OpenOptions o;
    o.features = features;
    return e2e::Open(o);
  }

  static Resp Rpc(e2e::Session& s, Opcode op, std::string_view key, std::string_view value = {},
                  uint64_t sequence = 0) {
    proto::RequestView req{op, s.w.client_id, sequence != 0 ? sequence : s.seq++, key, value};
    std::string bytes;
    EXPECT_TRUE(proto::EncodeRequest(req, &bytes).ok());
    return e2e::RawRpc(s, bytes);
  }

  // The next control message of `s` is a ShardMap; returns its map.
  static proto::ShardMap ExpectMap(e2e::Session& s) {
    return e2e::Expect<proto::ShardMapMsg>(s.fd, "ShardMap", &s).map;
  }

  static void SendMapRequest(e2e::Session& s, uint64_t known) {
    ASSERT_TRUE(proto::WriteControl(s.fd, proto::MapRequest{known}, e2e::Deadline()).ok());
  }

  uint64_t WrongShard() { return server_->metrics().Snapshot().of(Counter::kRpcWrongShard); }

  std::string dir_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  absl::Status run_status_;
  std::unique_ptr<e2e::Session> a_, b_, c_;
};

// An admin request sent now, its answer read later (a guard's answer waits
// for the peer's own acknowledgement).
class AdminCall {
 public:
  AdminCall(const std::string& socket, const std::string& line) {
    fd_ = socket_fd();
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    socket.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << socket;
    const std::string req = line + "\n";
    EXPECT_EQ(write(fd_, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  }
  ~AdminCall() { close(fd_); }
  // The answer, parsed (discarded when none came before the deadline).
  nlohmann::json Answer() {
    std::string out;
    const absl::Time deadline = absl::Now() + absl::Seconds(15);
    while (out.find('\n') == std::string::npos && absl::Now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[512];
      const ssize_t n = read(fd_, buf, sizeof(buf));
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  }

 private:
  static int socket_fd() { return socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); }
  int fd_ = -1;
};

nlohmann::json GuardUp(int acknowledged, int cut) {
  return {{"ok", true}, {"guard", "up"}, {"acknowledged", acknowledged}, {"cut", cut}};
}
nlohmann::json GuardDown(uint64_t check_below_epoch) {
  return {{"ok", true}, {"guard", "down"}, {"check_below_epoch", check_below_epoch}};
}

// A key this node ("a" of a, b) owns and one it does not.
void KeysOf(const ShardView& v, std::string* ours, std::string* theirs) {
  for (int i = 0; ours->empty() || theirs->empty(); ++i) {
    const std::string k = absl::StrCat("key-", i);
    (v.OwnsKey(k) ? *ours : *theirs) = k;
  }
}

TEST_F(ShardServerTest, ClusterNodeServesItsSlotsAndPushesItsMap) {
  KVNODE_REQUIRE_DEVICE(dev);
  auto gate = std::make_shared<ShardGate>();
  Start(dev, gate);
  // The feature is granted to a Hello that asks, not to one that does not.
  a_ = Open(proto::kFeatureShardMap);
  EXPECT_EQ(a_->w.features, proto::kFeatureShardMap);
  b_ = Open(0);
  EXPECT_EQ(b_->w.features, 0u);

  // No map yet: nothing is served. Epoch 0 to the feature session; a
  // message to the other.
  Resp r = Rpc(*a_, Opcode::kPut, "k", "v");
  EXPECT_EQ(r.status, RpcStatus::kWrongShard);
  EXPECT_EQ(r.version, 0u);
  r = Rpc(*b_, Opcode::kGet, "k");
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  EXPECT_NE(r.value.find("no shard map"), std::string::npos) << r.value;

  // Publish (from this thread, not the control thread): pushed to a_ only.
  auto view5 = ShardView::ForNode(Map(5, {"a", "b"}), "a");
  gate->Publish(view5);
  EXPECT_EQ(ExpectMap(*a_), view5->map);
  SendMapRequest(*a_, 5);
  EXPECT_EQ(ExpectMap(*a_), view5->map);

  std::string ours, theirs;
  KeysOf(*view5, &ours, &theirs);
  const uint64_t foreign_seq = a_->seq++;
  r = Rpc(*a_, Opcode::kPut, theirs, "lost", foreign_seq);
  EXPECT_EQ(r.status, RpcStatus::kWrongShard);
  EXPECT_EQ(r.version, 5u);
  EXPECT_EQ(r.sequence, foreign_seq);
  EXPECT_EQ(Rpc(*a_, Opcode::kGet, theirs).status, RpcStatus::kWrongShard);
  EXPECT_EQ(Rpc(*a_, Opcode::kPut, ours, "mine").status, RpcStatus::kOk);
  r = Rpc(*a_, Opcode::kGet, ours);
  EXPECT_EQ(r.status, RpcStatus::kOk);
  EXPECT_EQ(r.value, "mine");
  r = Rpc(*b_, Opcode::kDelete, theirs);
  EXPECT_EQ(r.status, RpcStatus::kRejected);
  const std::string slot = absl::StrCat("slot ", proto::SlotOf(theirs, 4096));
  EXPECT_NE(r.value.find(slot), std::string::npos) << r.value;
  EXPECT_NE(r.value.find("node 'b'"), std::string::npos) << r.value;
  EXPECT_EQ(Rpc(*b_, Opcode::kGet, ours).value, "mine");
  EXPECT_EQ(WrongShard(), 5u);

  // The node now owns every slot: the foreign PUT was never applied (the
  // key is absent) nor remembered (its sequence is applied now).
  auto view6 = ShardView::ForNode(Map(6, {"a"}), "a");
  gate->Publish(view6);
  EXPECT_EQ(ExpectMap(*a_).epoch, 6u);
  EXPECT_EQ(Rpc(*a_, Opcode::kGet, theirs).status, RpcStatus::kNotFound);
  r = Rpc(*a_, Opcode::kPut, theirs, "now", foreign_seq);
  EXPECT_EQ(r.status, RpcStatus::kOk);
  EXPECT_EQ(Rpc(*b_, Opcode::kGet, theirs).value, "now");
  EXPECT_EQ(WrongShard(), 5u);

  // A session that becomes ready while there is a map gets it after Ready.
  c_ = Open(proto::kFeatureShardMap);
  EXPECT_EQ(ExpectMap(*c_).epoch, 6u);

  // MapRequest from a session without the feature is an unexpected message.
  SendMapRequest(*b_, 0);
  e2e::ExpectErrorThenClose(b_->fd, proto::ErrorCode::kUnexpectedMessage, b_.get());
  b_->dead = true;
}

// Slot words (docs/format.md "Slot words"): offered only to a Hello with
// both cluster bits; a READ of the table shows the view the node serves:
// the one published before it started as soon as it serves, and the next
// one once its data plane has stored it.
TEST_F(ShardServerTest, SlotWordsShowTheServedViewToReads) {
  KVNODE_REQUIRE_DEVICE(dev);
  auto gate = std::make_shared<ShardGate>();
  auto view5 = ShardView::ForNode(Map(5, {"a", "b"}), "a");
  gate->Publish(view5);  // as the agent publishes the persisted map
  Start(dev, gate);
  const uint64_t both = proto::kFeatureShardMap | proto::kFeatureSlotWords;
  b_ = Open(proto::kFeatureSlotWords);  // without the shard map: nothing
  EXPECT_EQ(b_->w.features, 0u);
  c_ = Open(proto::kFeatureShardMap);
  EXPECT_EQ(c_->w.features, proto::kFeatureShardMap);
  EXPECT_EQ(c_->w.slot_words_offset, 0u);
  EXPECT_EQ(ExpectMap(*c_).epoch, 5u);
  a_ = Open(both);
  ASSERT_EQ(a_->w.features, both);
  EXPECT_EQ(ExpectMap(*a_).epoch, 5u);
  const uint64_t off = a_->w.slot_words_offset;
  ASSERT_NE(off, 0u);
  ASSERT_EQ(a_->w.slot_words_size, proto::kMaxSlots);
  EXPECT_EQ(gate->slot_words_epoch(), 5u) << "stored before the first session";

  auto expect_words = [&](const ShardView& v) {
    std::string words;
    ASSERT_EQ(e2e::Read(*a_, off, proto::kMaxSlots, a_->w.rkey, &words), IBV_WC_SUCCESS);
    uint32_t ones = 0;
    for (uint32_t slot = 0; slot < proto::kMaxSlots; ++slot) {
      ASSERT_EQ(words[slot], v.Owns(slot) ? 1 : 0) << "slot " << slot << ", epoch " << v.map.epoch;
      ones += words[slot] == 1;
    }
    EXPECT_EQ(ones, v.slots_owned());
  };
  expect_words(*view5);

  // The other half of the slots becomes a's.
  auto view6 = ShardView::ForNode(Map(6, {"b", "a"}), "a");
  gate->Publish(view6);
  EXPECT_EQ(ExpectMap(*a_).epoch, 6u);
  EXPECT_EQ(ExpectMap(*c_).epoch, 6u);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (gate->slot_words_epoch() != 6 && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a condition with a deadline
  }
  ASSERT_EQ(gate->slot_words_epoch(), 6u);
  expect_words(*view6);
}

// The guard: a session with slot words is told (Guard) and acknowledged; one
// without them, and one that does not acknowledge in time, is cut (its QP
// gone: READs fail); a session opened meanwhile learns it in its Welcome (or,
// without slot words, gets no index geometry); lowered, it says the node's
// epoch.
TEST_F(ShardServerTest, GuardIsAcknowledgedOrCut) {
  KVNODE_REQUIRE_DEVICE(dev);
  auto gate = std::make_shared<ShardGate>();
  gate->Publish(ShardView::ForNode(Map(5, {"a", "b"}), "a"));
  Start(dev, gate);
  const uint64_t both = proto::kFeatureShardMap | proto::kFeatureSlotWords;
  const std::string admin = server_->admin_socket_path();
  a_ = Open(both);
  EXPECT_EQ(a_->w.check_below_epoch, 5u) << "guard down: the node's epoch";
  EXPECT_EQ(ExpectMap(*a_).epoch, 5u);
  c_ = Open(proto::kFeatureShardMap);
  EXPECT_EQ(ExpectMap(*c_).epoch, 5u);
  EXPECT_FALSE(c_->w.index_geometry.empty());

  {
    AdminCall up(admin, "guard up 5");
    c_->dead = true;  // cut: not pumped while a_ waits
    const proto::Guard g = e2e::Expect<proto::Guard>(a_->fd, "Guard", a_.get());
    EXPECT_EQ(g.check_below_epoch, proto::kGuardUp);
    ASSERT_TRUE(proto::WriteControl(a_->fd, proto::GuardAck{g.nonce}, e2e::Deadline()).ok());
    const proto::Goodbye bye = e2e::Expect<proto::Goodbye>(c_->fd, "Goodbye", c_.get());
    EXPECT_EQ(bye.reason, proto::GoodbyeReason::kGuardCut) << bye.message;
    EXPECT_EQ(up.Answer(), GuardUp(1, 1));
    std::string word;
    EXPECT_NE(e2e::Read(*c_, 0, 8, c_->w.rkey, &word), IBV_WC_SUCCESS) << "a cut session READs";
    EXPECT_EQ(e2e::Read(*a_, 0, 8, a_->w.rkey, &word), IBV_WC_SUCCESS);
  }
  c_.reset();
  b_ = Open(proto::kFeatureShardMap);
  EXPECT_TRUE(b_->w.index_geometry.empty()) << "no READs without slot words under the guard";
  EXPECT_EQ(ExpectMap(*b_).epoch, 5u);
  e2e::Goodbye(*b_);
  b_.reset();
  b_ = Open(both);
  EXPECT_EQ(b_->w.check_below_epoch, proto::kGuardUp);
  EXPECT_EQ(ExpectMap(*b_).epoch, 5u);

  {
    AdminCall down(admin, "guard down");
    EXPECT_EQ(down.Answer(), GuardDown(5));
    b_->dead = true;  // its Guard waits while a_'s is read (pumped, it would fail)
    EXPECT_EQ(e2e::Expect<proto::Guard>(a_->fd, "Guard", a_.get()).check_below_epoch, 5u);
    b_->dead = false;
    EXPECT_EQ(e2e::Expect<proto::Guard>(b_->fd, "Guard", b_.get()).check_below_epoch, 5u);
  }

  // Raised again, b_ acknowledges and a_ does not: a_ is cut at the time-out.
  AdminCall up(admin, "guard up 1");
  a_->dead = true;
  const proto::Guard g = e2e::Expect<proto::Guard>(b_->fd, "Guard", b_.get());
  ASSERT_TRUE(proto::WriteControl(b_->fd, proto::GuardAck{g.nonce}, e2e::Deadline()).ok());
  EXPECT_EQ(e2e::Expect<proto::Guard>(a_->fd, "Guard", a_.get()).check_below_epoch,
            proto::kGuardUp);
  const proto::Goodbye bye = e2e::Expect<proto::Goodbye>(a_->fd, "Goodbye", a_.get());
  EXPECT_EQ(bye.reason, proto::GoodbyeReason::kGuardCut) << bye.message;
  EXPECT_EQ(up.Answer(), GuardUp(1, 1));
  EXPECT_EQ(AdminCall(admin, "guard down").Answer(), GuardDown(5));
}

TEST_F(ShardServerTest, WithoutAGateNothingChanges) {
  KVNODE_REQUIRE_DEVICE(dev);
  Start(dev, nullptr);
  a_ = Open(proto::kFeatureShardMap | proto::kFeatureSlotWords);
  EXPECT_EQ(a_->w.features, 0u);
  for (int i = 0; i < 20; ++i) {
    const std::string k = absl::StrCat("key-", i);
    EXPECT_EQ(Rpc(*a_, Opcode::kPut, k, "v").status, RpcStatus::kOk);
    EXPECT_EQ(Rpc(*a_, Opcode::kGet, k).value, "v");
  }
  EXPECT_EQ(WrongShard(), 0u);
  EXPECT_EQ(
      AdminCall(server_->admin_socket_path(), "guard up").Answer(),
      (nlohmann::json{{"ok", false}, {"error", "not a cluster node: no slot words to guard"}}));
  SendMapRequest(*a_, 0);
  e2e::ExpectErrorThenClose(a_->fd, proto::ErrorCode::kUnexpectedMessage, a_.get());
  a_->dead = true;
}

}  // namespace
}  // namespace kvnode::server
