// ClusterClient's rules without a device: which shard map it believes,
// where a key goes, what a WRONG_SHARD answer asks for, SHARD_UNAVAILABLE as
// its own error kind; and the hooks a node session gives it (Hello's feature
// bit, ShardMap frames, MapRequest, the WRONG_SHARD signal), driven on
// Client::Impl over a socketpair as tests/client/client_unit_test.cc does.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <set>
#include <string>

#include "client_impl.h"
#include "cluster_map.h"
#include "kvnode/client/cluster_client.h"
#include "kvnode/client/errors.h"
#include "kvnode/proto/control.h"
#include "kvnode/proto/frame_io.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::client {

// Drives one Client::Impl's control channel and response handling against a
// session the test builds: its control socket is one end of a socketpair,
// the test holds the other (`peer`).
class ImplTestPeer {
 public:
  explicit ImplTestPeer(uint64_t hello_features, uint64_t welcome_features)
      : impl_(ClientOptions{}) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    peer_ = Fd(sv[1]);
    impl_.hello_features_ = hello_features;
    auto s = std::make_unique<Session>();
    s->epoch = 1;
    s->state = SessionState::kUp;
    s->fd = Fd(sv[0]);
    s->welcome.features = welcome_features;
    s->last_rx = s->last_tx = absl::Now();
    impl_.current_ = std::move(s);
  }
  ~ImplTestPeer() { impl_.closed_ = true; }  // no device, nothing to tear down

  Client::Impl& impl() { return impl_; }
  Session* session() { return impl_.current_.get(); }
  int peer() { return peer_.get(); }

  // The Hello the session sends (SendHello), as the node would read it.
  proto::Hello SentHello() {
    EXPECT_TRUE(impl_.SendHello(session(), absl::Now()).ok());
    return std::get<proto::Hello>(ReadOne());
  }
  // `m` from the node, then one pass of the control loop.
  void Deliver(const proto::ControlMessage& m) {
    ASSERT_TRUE(proto::WriteControl(peer(), m, absl::Now() + absl::Seconds(1)).ok());
    impl_.PollControl(session(), absl::Now());
  }
  proto::ControlMessage ReadOne() {
    proto::FrameAssembler a;
    EXPECT_TRUE(ReceiveAvailable(peer(), &a).ok());
    absl::StatusOr<std::optional<proto::ControlMessage>> m = a.Next();
    EXPECT_TRUE(m.ok() && m->has_value());
    return **m;
  }

  // Slot 0 holds a PUT in flight on the session; the node answers it with
  // `status` carrying `version` (WRONG_SHARD: the node's map epoch).
  absl::Status Answer(proto::RpcStatus status, uint64_t version) {
    absl::StatusOr<rdma::HostMemory> mem =
        rdma::HostMemory::Allocate((size_t{Client::Impl::kSlotStride} + 4095) / 4096 * 4096);
    EXPECT_TRUE(mem.ok()) << mem.status();
    impl_.slot_mem_ = *std::move(mem);
    impl_.slots_.resize(1);
    Slot& slot = impl_.slots_[0];
    slot.state = Slot::State::kRpc;
    slot.kind = OpKind::kPut;
    slot.key = "key";
    slot.sequence = 42;
    slot.epoch = session()->epoch;
    slot.awaiting_response = true;
    slot.deadline = absl::InfiniteFuture();
    proto::ResponseView r;
    r.opcode = proto::Opcode::kPut;
    r.status = status;
    r.sequence = 42;
    r.version = version;
    EXPECT_TRUE(proto::EncodeResponse(r, &response_).ok());
    session()->recv_base = reinterpret_cast<const uint8_t*>(response_.data());
    session()->recv_buffers = 1;
    session()->broken = true;  // no QP: RepostRecv does nothing on a broken session
    impl_.OnResponse(session(), 0, static_cast<uint32_t>(response_.size()), absl::Now());
    EXPECT_EQ(slot.state, Slot::State::kDone);
    return slot.status;
  }

  // Slots and send buffers as Init makes them, for Submit. The session
  // has no credits (nothing is posted: there is no QP), so what is
  // submitted waits in the queue, as for a session being reconnected.
  // Reconnection is due but not yet: Poll starts no handshake.
  void InitSlots() {
    absl::StatusOr<rdma::HostMemory> mem = rdma::HostMemory::Allocate(
        (size_t{impl_.slot_count()} * Client::Impl::kSlotStride + 4095) / 4096 * 4096);
    ASSERT_TRUE(mem.ok()) << mem.status();
    impl_.slot_mem_ = *std::move(mem);
    impl_.InitSlots();
    impl_.need_reconnect_ = true;
    impl_.next_reconnect_ = absl::InfiniteFuture();
  }
  uint32_t Submit(OpKind kind, std::string_view key, uint64_t user_data) {
    OpRequest op;
    op.kind = kind;
    op.key = key;
    op.user_data = user_data;
    EXPECT_TRUE(impl_.Submit(op).ok());
    for (uint32_t i = 0; i < impl_.slots_.size(); ++i) {
      if (impl_.slots_[i].state != Slot::State::kFree && impl_.slots_[i].user_data == user_data) {
        return i;
      }
    }
    ADD_FAILURE() << "no slot for " << user_data;
    return 0;
  }
  Slot& slot(uint32_t idx) { return impl_.slots_[idx]; }
  // The request of slot `idx` went out on the session.
  void Sent(uint32_t idx) {
    Slot& s = slot(idx);
    s.state = Slot::State::kRpc;
    s.epoch = session()->epoch;
    s.awaiting_response = true;
  }
  void AnsweredBusy(uint32_t idx) { impl_.Hold(idx); }
  void Finished(uint32_t idx) { impl_.Finish(idx, absl::OkStatus()); }
  // The node's OK answer to slot `idx`'s request arrives now.
  void LateOk(uint32_t idx) {
    proto::ResponseView r;
    r.opcode = proto::Opcode::kPut;
    r.status = proto::RpcStatus::kOk;
    r.sequence = slot(idx).sequence;
    r.version = 1;
    EXPECT_TRUE(proto::EncodeResponse(r, &response_).ok());
    session()->recv_base = reinterpret_cast<const uint8_t*>(response_.data());
    session()->recv_buffers = 1;
    impl_.OnResponse(session(), 0, static_cast<uint32_t>(response_.size()), absl::Now());
  }

 private:
  Client::Impl impl_;
  Fd peer_;
  std::string response_;
};

namespace {

proto::ShardMap ThreeNodes(uint64_t epoch = 1) {
  absl::StatusOr<proto::ShardMap> m = proto::EvenSplit("c1", 4096, {"a", "b", "c"});
  EXPECT_TRUE(m.ok()) << m.status();
  m->epoch = epoch;
  for (size_t i = 0; i < m->nodes.size(); ++i) {
    m->nodes[i].alive = true;
    m->nodes[i].endpoint = absl::StrCat("10.0.0.", i + 1, ":7000");
    m->nodes[i].generation = 1;
  }
  return *m;
}

// --- SHARD_UNAVAILABLE is its own kind -----------------------------------------

TEST(ShardUnavailable, OwnKindAndMessageNotAConnectionLoss) {
  const absl::Status st = ShardUnavailableError(17, "b", 5);
  EXPECT_TRUE(absl::IsUnavailable(st));
  EXPECT_EQ(st.message(), "SHARD_UNAVAILABLE: slot 17 of node 'b' (not alive in map epoch 5)");
  EXPECT_EQ(ErrorKindOf(st), ErrorKind::kShardUnavailable);
  EXPECT_EQ(ErrorKindName(ErrorKindOf(st)), "shard_unavailable");
  EXPECT_TRUE(IsShardUnavailable(st));
  EXPECT_FALSE(IsConnectionLost(st));
  // The same code without the marker stays a lost connection.
  const absl::Status lost = absl::UnavailableError(std::string(st.message()));
  EXPECT_EQ(ErrorKindOf(lost), ErrorKind::kConnectionLost);
  EXPECT_FALSE(IsShardUnavailable(lost));
}

// --- the WRONG_SHARD signal ------------------------------------------------------

TEST(WrongShardSignal, CarriesTheNodesEpochAndTheOldMessage) {
  const absl::Status st = WrongShardSignal(9, "put");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "node answered WRONG_SHARD (map epoch 9) to put: the key's slot is another node's");
  ASSERT_TRUE(WrongShardEpochOf(st).has_value());
  EXPECT_EQ(*WrongShardEpochOf(st), 9u);
  EXPECT_EQ(*WrongShardEpochOf(WrongShardSignal(0, "get")), 0u) << "a node with no map yet";
  EXPECT_FALSE(WrongShardEpochOf(absl::FailedPreconditionError("x")).has_value());
  EXPECT_FALSE(WrongShardEpochOf(absl::OkStatus()).has_value());
}

TEST(WrongShardSignal, ANodesAnswerBecomesTheSignal) {
  ImplTestPeer t(proto::kFeatureShardMap, proto::kFeatureShardMap);
  const absl::Status st = t.Answer(proto::RpcStatus::kWrongShard, 12);
  ASSERT_TRUE(WrongShardEpochOf(st).has_value()) << st;
  EXPECT_EQ(*WrongShardEpochOf(st), 12u);
  ImplTestPeer ok(proto::kFeatureShardMap, proto::kFeatureShardMap);
  EXPECT_FALSE(WrongShardEpochOf(ok.Answer(proto::RpcStatus::kRejected, 0)).has_value());
}

// --- map adoption ------------------------------------------------------------------

TEST(MapTracker, NewerEpochWinsOlderIgnored) {
  MapTracker t;
  EXPECT_FALSE(t.has_map());
  EXPECT_EQ(t.Offer(ThreeNodes(3)), MapOffer::kAdopted);
  EXPECT_EQ(t.epoch(), 3u);
  EXPECT_EQ(t.Offer(ThreeNodes(3)), MapOffer::kSame);
  EXPECT_EQ(t.Offer(ThreeNodes(2)), MapOffer::kOlder);
  EXPECT_EQ(t.epoch(), 3u);
  proto::ShardMap next = ThreeNodes(4);
  next.ranges[1].first_slot += 10;  // ownership moved: a new epoch
  EXPECT_EQ(t.Offer(next), MapOffer::kAdopted);
  EXPECT_EQ(t.map(), next);
}

TEST(MapTracker, InvalidAndOtherClustersIgnored) {
  MapTracker t;
  proto::ShardMap bad = ThreeNodes(0);  // epoch 0 is invalid
  EXPECT_EQ(t.Offer(bad), MapOffer::kInvalid);
  EXPECT_FALSE(t.has_map()) << "an invalid map is never the first either";
  ASSERT_EQ(t.Offer(ThreeNodes(2)), MapOffer::kAdopted);
  proto::ShardMap unknown_node = ThreeNodes(50);
  unknown_node.ranges[2].node = 7;  // names no node
  EXPECT_EQ(t.Offer(unknown_node), MapOffer::kInvalid);
  proto::ShardMap other = ThreeNodes(60);
  other.cluster = "c2";
  EXPECT_EQ(t.Offer(other), MapOffer::kOtherCluster);
  EXPECT_EQ(t.epoch(), 2u) << "neither moved the epoch";
}

TEST(MapTracker, SameEpochTakesMembershipNotOwnership) {
  MapTracker t;
  ASSERT_EQ(t.Offer(ThreeNodes(5)), MapOffer::kAdopted);
  proto::ShardMap down = ThreeNodes(5);
  down.nodes[1].alive = false;  // membership changes keep the epoch
  EXPECT_EQ(t.Offer(down), MapOffer::kAdopted);
  EXPECT_FALSE(t.map().nodes[1].alive);
  proto::ShardMap back = ThreeNodes(5);
  back.nodes[1].endpoint = "10.0.0.9:7001";
  EXPECT_EQ(t.Offer(back), MapOffer::kAdopted);
  EXPECT_TRUE(t.map().nodes[1].alive);
  EXPECT_EQ(t.map().nodes[1].endpoint, "10.0.0.9:7001");
  proto::ShardMap moved = ThreeNodes(5);
  moved.ranges[1].first_slot += 1;  // ownership without a new epoch
  EXPECT_EQ(t.Offer(moved), MapOffer::kInconsistent);
  EXPECT_EQ(t.map().ranges, ThreeNodes(5).ranges);
}

// Two nodes push maps of one epoch; the view of membership read at the later
// etcd revision wins whatever the order they arrive in.
TEST(MapTracker, SameEpochMembershipIsOrderedByItsRevision) {
  MapTracker t;
  proto::ShardMap fresh = ThreeNodes(5);
  fresh.members_revision = 40;
  ASSERT_EQ(t.Offer(fresh), MapOffer::kAdopted);
  proto::ShardMap stale = ThreeNodes(5);
  stale.members_revision = 31;
  stale.nodes[1].alive = false;  // a node cut off from etcd still thinks b is gone
  EXPECT_EQ(t.Offer(stale), MapOffer::kOlder);
  EXPECT_TRUE(t.map().nodes[1].alive);
  proto::ShardMap later = stale;
  later.members_revision = 41;
  EXPECT_EQ(t.Offer(later), MapOffer::kAdopted);
  EXPECT_FALSE(t.map().nodes[1].alive);
}

// --- routing ---------------------------------------------------------------------------

TEST(RouteKey, BySlotToItsOwner) {
  const proto::ShardMap map = ThreeNodes();
  std::set<uint16_t> owners;
  for (int i = 0; i < 300; ++i) {
    const std::string key = absl::StrCat("key-", i);
    absl::StatusOr<Route> r = RouteKey(map, key);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->slot, proto::SlotOf(key, map.num_slots));
    EXPECT_EQ(r->node, map.OwnerOf(r->slot));
    owners.insert(r->node);
  }
  EXPECT_EQ(owners.size(), 3u) << "300 keys reach every node of an even split";
}

TEST(RouteKey, DeadOwnerIsShardUnavailableNamingSlotNodeAndEpoch) {
  proto::ShardMap map = ThreeNodes(7);
  map.nodes[1].alive = false;
  int unavailable = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string key = absl::StrCat("key-", i);
    const uint32_t slot = proto::SlotOf(key, map.num_slots);
    absl::StatusOr<Route> r = RouteKey(map, key);
    if (map.OwnerOf(slot) != 1) {
      EXPECT_TRUE(r.ok()) << key;
      continue;
    }
    ++unavailable;
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(IsShardUnavailable(r.status()));
    EXPECT_EQ(r.status().message(), absl::StrCat("SHARD_UNAVAILABLE: slot ", slot,
                                                 " of node 'b' (not alive in map epoch 7)"));
  }
  EXPECT_GT(unavailable, 0) << "some keys must belong to b";
  map.nodes[1].alive = true;
  map.nodes[1].endpoint.clear();  // alive but nowhere to go
  for (int i = 0; i < 300; ++i) {
    const std::string key = absl::StrCat("key-", i);
    if (map.OwnerOf(proto::SlotOf(key, map.num_slots)) == 1) {
      EXPECT_TRUE(IsShardUnavailable(RouteKey(map, key).status()));
    }
  }
}

TEST(AnyAliveNode, RoundRobinOverTheAliveOnes) {
  proto::ShardMap map = ThreeNodes();
  map.nodes[0].alive = false;
  EXPECT_EQ(*AnyAliveNode(map, 0), 1);
  EXPECT_EQ(*AnyAliveNode(map, 2), 2);
  EXPECT_EQ(*AnyAliveNode(map, 3), 1);
  for (proto::MapNode& n : map.nodes) n.alive = false;
  EXPECT_TRUE(absl::IsUnavailable(AnyAliveNode(map, 0).status()));
}

// --- operations in flight at a node that died ----------------------------------------

TEST(FailInFlight, WriteMessageSaysItMayHaveBeenApplied) {
  const absl::Status put = InFlightUnavailableError(17, "b", 5, /*write=*/true);
  EXPECT_TRUE(IsShardUnavailable(put)) << put;
  EXPECT_EQ(put.message(),
            "SHARD_UNAVAILABLE: slot 17 of node 'b' (not alive in map epoch 5); the write may "
            "have been applied");
  EXPECT_EQ(InFlightUnavailableError(17, "b", 5, /*write=*/false),
            ShardUnavailableError(17, "b", 5));
}

// Operations at node b: a PUT sent, a PUT the node answered BUSY (held), a
// GET and a PING waiting for the session, and a GET already finished but
// not yet reported. While b's session is up they stay, whatever the map
// says; once the map says b is not alive and the session is down, every
// one not finished completes at once, exactly once, and a late answer to
// the PUT sent is dropped as stale.
TEST(FailInFlight, OpsAtADeadNodeWithItsSessionDownFailOnceAtOnce) {
  ImplTestPeer t(proto::kFeatureShardMap, proto::kFeatureShardMap);
  t.InitSlots();
  const uint32_t put = t.Submit(OpKind::kPut, "k-put", 1);
  t.Sent(put);
  const uint32_t busy = t.Submit(OpKind::kPut, "k-busy", 2);
  t.AnsweredBusy(busy);
  t.Submit(OpKind::kGet, "k-get", 3);
  t.Submit(OpKind::kPing, "", 4);
  t.Finished(t.Submit(OpKind::kGet, "k-done", 5));
  EXPECT_EQ(t.impl().held_writes(), 1u);

  proto::ShardMap map = ThreeNodes(7);
  EXPECT_EQ(FailInFlight(map, "b", t.impl()), 0u) << "b is alive";
  map.nodes[1].alive = false;
  EXPECT_EQ(FailInFlight(map, "b", t.impl()), 0u) << "a session that is up wins over the map";
  EXPECT_EQ(FailInFlight(map, "z", t.impl()), 0u) << "not in the map";
  EXPECT_EQ(t.slot(put).state, Slot::State::kRpc);

  t.session()->broken = true;  // lost: down until the reconnection
  EXPECT_EQ(FailInFlight(ThreeNodes(7), "b", t.impl()), 0u) << "alive: it may come back in time";
  EXPECT_EQ(FailInFlight(map, "b", t.impl()), 3u) << "PUT, held PUT, GET (and the PING)";
  EXPECT_EQ(FailInFlight(map, "b", t.impl()), 0u) << "each fails once";
  t.LateOk(put);
  EXPECT_EQ(t.impl().stats_.stale_responses, 1u);

  OpResult out[8];
  ASSERT_EQ(t.impl().Poll(std::span<OpResult>(out)), 5u);
  std::set<uint64_t> seen;
  for (int i = 0; i < 5; ++i) {
    const OpResult& r = out[i];
    EXPECT_TRUE(seen.insert(r.user_data).second) << "twice: " << r.user_data;
    const std::string key = r.user_data == 1 ? "k-put" : r.user_data == 2 ? "k-busy" : "k-get";
    const std::string slot = absl::StrCat(proto::SlotOf(key, map.num_slots));
    switch (r.user_data) {
      case 1:
      case 2:
        EXPECT_TRUE(IsShardUnavailable(r.status)) << r.status;
        EXPECT_EQ(r.status.message(), absl::StrCat("SHARD_UNAVAILABLE: slot ", slot,
                                                   " of node 'b' (not alive in map epoch 7); "
                                                   "the write may have been applied"));
        break;
      case 3:
        EXPECT_EQ(r.status.message(), absl::StrCat("SHARD_UNAVAILABLE: slot ", slot,
                                                   " of node 'b' (not alive in map epoch 7)"));
        break;
      case 4:
        EXPECT_TRUE(absl::IsUnavailable(r.status)) << r.status;
        EXPECT_FALSE(IsShardUnavailable(r.status)) << "a PING has no slot";
        break;
      default:
        EXPECT_TRUE(r.status.ok()) << "finished before: its own result";
    }
  }
  EXPECT_EQ(t.impl().Poll(std::span<OpResult>(out)), 0u);
  EXPECT_EQ(t.impl().outstanding(), 0u) << "every slot free again";
  EXPECT_EQ(t.impl().held_writes(), 0u);
  EXPECT_EQ(t.impl().available(OpKind::kPut), t.impl().options_.max_outstanding);
}

// --- WRONG_SHARD plans ---------------------------------------------------------------

TEST(PlanWrongShard, RefreshRerouteOrRetry) {
  EXPECT_EQ(PlanWrongShard(6, 5, "a", "a"), WrongShardPlan::kRefresh) << "node knows more";
  EXPECT_EQ(PlanWrongShard(5, 5, "a", "b"), WrongShardPlan::kReroute) << "routed by an old map";
  EXPECT_EQ(PlanWrongShard(4, 6, "a", "b"), WrongShardPlan::kReroute);
  EXPECT_EQ(PlanWrongShard(5, 5, "a", "a"), WrongShardPlan::kRetry) << "node lags behind";
  EXPECT_EQ(PlanWrongShard(0, 5, "a", "a"), WrongShardPlan::kRetry) << "node has no map yet";
}

TEST(PlanWrongShard, ForgedEpochIsRejectedWithBothEpochs) {
  const absl::Status st = ForgedEpochError("a", 1000, 5, "put 'k'");
  EXPECT_EQ(ErrorKindOf(st), ErrorKind::kRejected);
  EXPECT_NE(st.message().find("'a' answered WRONG_SHARD with map epoch 1000"),
            std::string_view::npos)
      << st;
  EXPECT_NE(st.message().find("newest map any node gave is epoch 5"), std::string_view::npos);
}

// --- the node session's hooks ---------------------------------------------------------

TEST(NodeSession, HelloAsksForShardMapsOnlyInClusterMode) {
  ImplTestPeer plain(0, 0);
  EXPECT_EQ(plain.SentHello().features, 0u) << "a plain Client's Hello is unchanged";
  ImplTestPeer cluster(proto::kFeatureShardMap, 0);
  EXPECT_EQ(cluster.SentHello().features, proto::kFeatureShardMap);
}

TEST(NodeSession, ShardMapFramesSurfaceWhenNegotiated) {
  ImplTestPeer t(proto::kFeatureShardMap, proto::kFeatureShardMap);
  t.Deliver(proto::ShardMapMsg{ThreeNodes(3)});
  t.Deliver(proto::ShardMapMsg{ThreeNodes(4)});
  EXPECT_FALSE(t.session()->broken) << t.session()->broken_why;
  std::vector<proto::ShardMap> maps = t.impl().TakeMaps();
  ASSERT_EQ(maps.size(), 2u);
  EXPECT_EQ(maps[0].epoch, 3u);
  EXPECT_EQ(maps[1], ThreeNodes(4));
  EXPECT_TRUE(t.impl().TakeMaps().empty());
}

TEST(NodeSession, ShardMapWithoutTheFeatureEndsTheSession) {
  // A node that sends maps to a session that did not ask (or a plain
  // Client's) breaks the protocol, as any unexpected frame does.
  for (uint64_t hello : {uint64_t{0}, proto::kFeatureShardMap}) {
    ImplTestPeer t(hello, /*welcome_features=*/0);
    t.Deliver(proto::ShardMapMsg{ThreeNodes(3)});
    EXPECT_TRUE(t.session()->broken);
    EXPECT_NE(t.session()->broken_why.message().find("ShardMap"), std::string_view::npos)
        << t.session()->broken_why;
    EXPECT_TRUE(t.impl().TakeMaps().empty());
  }
}

TEST(NodeSession, MapRequestOnlyOnANegotiatedSession) {
  ImplTestPeer t(proto::kFeatureShardMap, proto::kFeatureShardMap);
  ASSERT_TRUE(t.impl().RequestMap(8));
  EXPECT_EQ(std::get<proto::MapRequest>(t.ReadOne()).known_epoch, 8u);
  ImplTestPeer old_node(proto::kFeatureShardMap, 0);
  EXPECT_FALSE(old_node.impl().RequestMap(8));
  ImplTestPeer plain(0, proto::kFeatureShardMap);
  EXPECT_FALSE(plain.impl().RequestMap(8));
}

// --- options ------------------------------------------------------------------------------

TEST(ClusterClientOptions, ValidateNamesTheProblem) {
  ClusterClientOptions o;
  EXPECT_NE(o.Validate().message().find("no seed"), std::string_view::npos);
  o.seeds = {"127.0.0.1:7000", "nonsense"};
  EXPECT_NE(o.Validate().message().find("seed 'nonsense'"), std::string_view::npos) << o.Validate();
  o.seeds = {"127.0.0.1:7000", "[::1]:7001"};
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
  o.base.max_outstanding = 0;
  EXPECT_FALSE(o.Validate().ok());
  o.base.max_outstanding = 4;
  o.map_wait = absl::ZeroDuration();
  EXPECT_FALSE(o.Validate().ok());
}

}  // namespace
}  // namespace kvnode::client
