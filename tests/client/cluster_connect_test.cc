// ClusterClient::Connect against scripted control peers (label rdma: every
// node session opens the verbs device before it dials). A peer plays a
// cluster member far enough for the first map: Welcome with the shard-map
// feature, Ready, then its map pushed, or sent in answer to a MapRequest.
// No RPC is ever answered: what these tests submit must fail before any
// send (SHARD_UNAVAILABLE) or not be submitted at all.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/device_env.h"
#include "fake_node.h"
#include "kvnode/client/cluster_client.h"
#include "kvnode/client/errors.h"
#include "kvnode/proto/control.h"
#include "kvnode/proto/frame_io.h"
#include "kvnode/proto/shard_map.h"
#include "kvnode/rdma/accounting.h"
#include "kvnode/rdma/device.h"

namespace kvnode::client {
namespace {

using fake::FakeNode;
using fake::WaitForClose;

ClusterClientOptions Options(const kvnode::testing::TestDevice& dev,
                             std::vector<std::string> seeds) {
  ClusterClientOptions o;
  o.seeds = std::move(seeds);
  o.base.rdma_device = dev.name;
  o.base.rdma_port = dev.port;
  o.base.client_name = "cluster-test";
  o.base.connect_timeout = absl::Seconds(5);  // a loaded TCG guest
  o.map_wait = absl::Milliseconds(100);
  return o;
}

// Cluster "c1", epoch 3: node "a" (alive, at `a_endpoint`) owns the first
// half of 16 slots, node "b" (not alive) the second.
proto::ShardMap TwoNodes(const std::string& a_endpoint) {
  absl::StatusOr<proto::ShardMap> m = proto::EvenSplit("c1", 16, {"a", "b"});
  EXPECT_TRUE(m.ok()) << m.status();
  m->epoch = 3;
  m->nodes[0].alive = true;
  m->nodes[0].endpoint = a_endpoint;
  m->nodes[1].endpoint = "127.0.0.1:1";
  return *m;
}

// The device's GID: the Welcome's server QP must carry a valid address for
// the client's QP to reach RTR (no QP has that number; nothing is posted).
std::array<uint8_t, 16> DeviceGid(const kvnode::testing::TestDevice& dev) {
  rdma::DeviceOptions o;
  o.name = dev.name;
  o.port = dev.port;
  absl::StatusOr<std::shared_ptr<rdma::Device>> d = rdma::Device::Open(o);
  EXPECT_TRUE(d.ok()) << d.status();
  std::array<uint8_t, 16> gid{};
  if (d.ok()) std::memcpy(gid.data(), (*d)->gid().raw, gid.size());
  return gid;
}

// How a scripted member hands out its map.
enum class MapBy { kPush, kRequest, kNever };

// The handshake of a member (features: what its Welcome offers), then its
// map as `by` says; then it stays until the client closes.
// With kFeatureSlotWords the Welcome names a table at `words_offset`.
// `then` runs after the map went out, before the member waits for the close.
void PlayMember(int c, uint64_t features, MapBy by, const std::string* endpoint,
                const std::array<uint8_t, 16>& gid, uint64_t words_offset = 4096,
                const std::function<void()>& then = {}) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  proto::Welcome w;
  w.client_id = 5;
  w.server_generation = 1;
  w.features = features;
  if ((features & proto::kFeatureSlotWords) != 0) {
    w.slot_words_offset = words_offset;
    w.slot_words_size = proto::kMaxSlots;
  }
  w.server_qp.qpn = 17;  // nobody: no READ or SEND is ever posted to it
  w.server_qp.mtu = 3;
  w.server_qp.gid = gid;
  w.arena_size = 1 << 20;
  w.max_rpc_credits = 4;
  w.max_rpc_message_size = 4096;
  ASSERT_TRUE(proto::WriteControl(c, w, deadline).ok());
  absl::StatusOr<proto::ControlMessage> qp = proto::ReadControl(c, deadline);
  ASSERT_TRUE(qp.ok() && std::holds_alternative<proto::ClientQp>(*qp));
  ASSERT_TRUE(proto::WriteControl(c, proto::Ready{}, deadline).ok());
  if (by == MapBy::kPush) {
    ASSERT_TRUE(proto::WriteControl(c, proto::ShardMapMsg{TwoNodes(*endpoint)}, deadline).ok());
  } else if (by == MapBy::kRequest) {
    for (;;) {  // keepalives may come first
      absl::StatusOr<proto::ControlMessage> m = proto::ReadControl(c, deadline);
      ASSERT_TRUE(m.ok()) << m.status();
      if (std::holds_alternative<proto::MapRequest>(*m)) break;
    }
    ASSERT_TRUE(proto::WriteControl(c, proto::ShardMapMsg{TwoNodes(*endpoint)}, deadline).ok());
  }
  if (then) then();
  WaitForClose(c);
}

void ExpectNoVerbsObjects() {
  EXPECT_EQ(rdma::Accounting::Snapshot().total(), 0) << rdma::Accounting::Report();
}

// A key of the 16-slot map owned by node index `node`.
std::string KeyOf(const proto::ShardMap& map, uint16_t node) {
  for (int i = 0;; ++i) {
    std::string key = absl::StrCat("key-", i);
    if (map.OwnerOf(proto::SlotOf(key, map.num_slots)) == node) return key;
  }
}

TEST(ClusterConnect, PushedMapThenADeadOwnersKeyFailsAtOnce) {
  KVNODE_REQUIRE_DEVICE(dev);
  const std::array<uint8_t, 16> gid = DeviceGid(dev);
  std::string endpoint;
  FakeNode node(
      [&](int c) { PlayMember(c, proto::kFeatureShardMap, MapBy::kPush, &endpoint, gid); });
  endpoint = node.endpoint();
  absl::StatusOr<std::unique_ptr<ClusterClient>> cc =
      ClusterClient::Connect(Options(dev, {endpoint}));
  ASSERT_TRUE(cc.ok()) << cc.status();
  ClusterClient& c = **cc;
  ASSERT_TRUE(node.hello().has_value());
  EXPECT_EQ(node.hello()->features, proto::kFeatureShardMap | proto::kFeatureSlotWords);
  EXPECT_EQ(c.map_epoch(), 3u);
  // (Whether the push beat map_wait, or a MapRequest fetched it, depends on
  // the machine's load: either way the map is the node's.)

  const proto::ShardMap map = TwoNodes(endpoint);
  OpRequest op;
  op.kind = OpKind::kPut;
  const std::string key = KeyOf(map, 1);
  op.key = key;
  op.value = "v";
  op.user_data = 77;
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(c.Submit(op).ok());
  OpResult r[1];
  while (c.Poll(std::span<OpResult>(r)) == 0) c.Wait(absl::Now() + absl::Milliseconds(5));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1)) << "failed at once, not at the deadline";
  EXPECT_EQ(r[0].user_data, 77u);
  EXPECT_EQ(ErrorKindOf(r[0].status), ErrorKind::kShardUnavailable) << r[0].status;
  EXPECT_EQ(r[0].status.message(), absl::StrCat("SHARD_UNAVAILABLE: slot ", proto::SlotOf(key, 16),
                                                " of node 'b' (not alive in map epoch 3)"));
  EXPECT_EQ(c.cluster_stats().shard_unavailable, 1u);
  EXPECT_EQ(c.stats().ops_failed, 1u);
  ASSERT_EQ(c.cluster_stats().nodes.size(), 2u);
  EXPECT_TRUE(c.cluster_stats().nodes[0].alive);
  EXPECT_FALSE(c.cluster_stats().nodes[1].alive);
  EXPECT_TRUE(c.Close().ok());
  cc->reset();
  ExpectNoVerbsObjects();
}

TEST(ClusterConnect, NoPushInTimeAsksWithMapRequest) {
  KVNODE_REQUIRE_DEVICE(dev);
  const std::array<uint8_t, 16> gid = DeviceGid(dev);
  std::string endpoint;
  FakeNode node(
      [&](int c) { PlayMember(c, proto::kFeatureShardMap, MapBy::kRequest, &endpoint, gid); });
  endpoint = node.endpoint();
  ClusterClientOptions o = Options(dev, {endpoint});
  o.slot_words = false;  // and a client that does not ask for slot words
  absl::StatusOr<std::unique_ptr<ClusterClient>> cc = ClusterClient::Connect(o);
  ASSERT_TRUE(cc.ok()) << cc.status();
  ASSERT_TRUE(node.hello().has_value());
  EXPECT_EQ(node.hello()->features, proto::kFeatureShardMap);
  EXPECT_EQ((*cc)->map_epoch(), 3u);
  EXPECT_EQ((*cc)->cluster_stats().map_requests, 1u);
  cc->reset();
  ExpectNoVerbsObjects();
}

// follow_pushed_maps: a map pushed after Connect is taken by a following
// client and dropped (counted) by a pinned one, which keeps its epoch.
TEST(ClusterConnect, APinnedClientDropsPushedMaps) {
  KVNODE_REQUIRE_DEVICE(dev);
  const std::array<uint8_t, 16> gid = DeviceGid(dev);
  for (const bool follow : {false, true}) {
    std::promise<void> connected;
    std::shared_future<void> go = connected.get_future().share();
    std::string endpoint;
    FakeNode node([&](int c) {
      PlayMember(c, proto::kFeatureShardMap, MapBy::kPush, &endpoint, gid, 4096, [&] {
        ASSERT_EQ(go.wait_for(std::chrono::seconds(30)), std::future_status::ready);
        proto::ShardMap next = TwoNodes(endpoint);
        next.epoch = 4;
        ASSERT_TRUE(
            proto::WriteControl(c, proto::ShardMapMsg{next}, absl::Now() + absl::Seconds(30)).ok());
      });
    });
    endpoint = node.endpoint();
    ClusterClientOptions o = Options(dev, {endpoint});
    o.follow_pushed_maps = follow;
    absl::StatusOr<std::unique_ptr<ClusterClient>> cc = ClusterClient::Connect(o);
    ASSERT_TRUE(cc.ok()) << cc.status();
    ClusterClient& c = **cc;
    EXPECT_EQ(c.map_epoch(), 3u);
    connected.set_value();
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline &&
           (follow ? c.map_epoch() != 4 : c.cluster_stats().maps_dropped == 0)) {
      (void)c.Poll({});
      c.Wait(absl::Now() + absl::Milliseconds(5));
    }
    EXPECT_EQ(c.map_epoch(), follow ? 4u : 3u) << "follow_pushed_maps " << follow;
    EXPECT_EQ(c.cluster_stats().maps_dropped, follow ? 0u : 1u);
    EXPECT_TRUE(c.Close().ok());
    cc->reset();
  }
  ExpectNoVerbsObjects();
}

// A node whose Welcome puts its slot words outside its arena cannot be
// read safely: the session is refused, and with it the only seed.
TEST(ClusterConnect, SlotWordsOutsideTheArenaAreRefused) {
  KVNODE_REQUIRE_DEVICE(dev);
  const std::array<uint8_t, 16> gid = DeviceGid(dev);
  std::optional<bool> sent_qp;
  {
    FakeNode node([&](int c) {
      proto::Welcome w;
      w.client_id = 5;
      w.server_generation = 1;
      w.features = proto::kFeatureShardMap | proto::kFeatureSlotWords;
      w.slot_words_offset = (1 << 20) - 4096;  // 64 KiB from there run past the arena
      w.slot_words_size = proto::kMaxSlots;
      w.server_qp.qpn = 17;
      w.server_qp.mtu = 3;
      w.server_qp.gid = gid;
      w.arena_size = 1 << 20;
      w.max_rpc_credits = 4;
      w.max_rpc_message_size = 4096;
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      ASSERT_TRUE(proto::WriteControl(c, w, deadline).ok());
      // The client goes without a ClientQp: it will not use this node.
      absl::StatusOr<proto::ControlMessage> m = proto::ReadControl(c, deadline);
      sent_qp = m.ok() && std::holds_alternative<proto::ClientQp>(*m);
      WaitForClose(c);
    });
    absl::StatusOr<std::unique_ptr<ClusterClient>> cc =
        ClusterClient::Connect(Options(dev, {node.endpoint()}));
    ASSERT_FALSE(cc.ok());
    EXPECT_NE(cc.status().message().find("slot words at"), std::string::npos) << cc.status();
  }  // the node's script has ended
  ASSERT_TRUE(sent_qp.has_value());
  EXPECT_FALSE(*sent_qp);
  ExpectNoVerbsObjects();
}

TEST(ClusterConnect, ANonMemberSeedIsSkippedForTheNext) {
  KVNODE_REQUIRE_DEVICE(dev);
  const std::array<uint8_t, 16> gid = DeviceGid(dev);
  std::string endpoint;
  FakeNode plain([&](int c) { PlayMember(c, /*features=*/0, MapBy::kNever, &endpoint, gid); });
  FakeNode member(
      [&](int c) { PlayMember(c, proto::kFeatureShardMap, MapBy::kPush, &endpoint, gid); });
  endpoint = member.endpoint();
  absl::StatusOr<std::unique_ptr<ClusterClient>> cc =
      ClusterClient::Connect(Options(dev, {plain.endpoint(), member.endpoint()}));
  ASSERT_TRUE(cc.ok()) << cc.status();
  EXPECT_EQ((*cc)->map_epoch(), 3u);
  cc->reset();
  ExpectNoVerbsObjects();
}

TEST(ClusterConnect, NoSeedGivesAMapNamesEachSeed) {
  KVNODE_REQUIRE_DEVICE(dev);
  const std::array<uint8_t, 16> gid = DeviceGid(dev);
  std::string endpoint;
  FakeNode plain([&](int c) { PlayMember(c, /*features=*/0, MapBy::kNever, &endpoint, gid); });
  FakeNode silent(
      [&](int c) { PlayMember(c, proto::kFeatureShardMap, MapBy::kNever, &endpoint, gid); });
  ClusterClientOptions o = Options(dev, {plain.endpoint(), silent.endpoint()});
  o.base.connect_timeout = absl::Milliseconds(800);
  absl::StatusOr<std::unique_ptr<ClusterClient>> cc = ClusterClient::Connect(o);
  ASSERT_FALSE(cc.ok());
  EXPECT_TRUE(IsConnectionLost(cc.status())) << cc.status();
  EXPECT_NE(cc.status().message().find(plain.endpoint() + ": not a cluster member"),
            std::string::npos)
      << cc.status();
  EXPECT_NE(cc.status().message().find(silent.endpoint() + ": no valid shard map"),
            std::string::npos)
      << cc.status();
  ExpectNoVerbsObjects();
}

}  // namespace
}  // namespace kvnode::client
