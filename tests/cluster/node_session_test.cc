// NodeSession against a real etcd (etcd_fixture.h): registration, the map
// it delivers, refusal of a duplicate node id, a malformed stored map, etcd
// going away and coming back, a lost lease, and the live upgrade's handoff.
#include "kvnode/cluster/node_session.h"

#include <mutex>

#include "etcd_fixture.h"
#include "gtest/gtest.h"
#include "kvnode/cluster/admin.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/map_json.h"
#include "kvnode/cluster/migration.h"

namespace kvnode::cluster {
namespace {

using kvnode::testing::EtcdTest;
using kvnode::testing::WaitUntil;

constexpr char kInstanceA[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
constexpr char kInstanceB[] = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

// What a session reported through its callbacks.
struct Seen {
  std::mutex mu;
  std::vector<proto::ShardMap> maps;
  std::vector<absl::Status> refusals;
  std::vector<std::optional<RollPlan>> rolls;
  std::vector<std::optional<MigrationPlan>> migrations;

  NodeSessionCallbacks Callbacks() {
    return {.on_map =
                [this](proto::ShardMap m) {
                  std::lock_guard<std::mutex> l(mu);
                  maps.push_back(std::move(m));
                },
            .on_refused =
                [this](const absl::Status& s) {
                  std::lock_guard<std::mutex> l(mu);
                  refusals.push_back(s);
                },
            .on_roll =
                [this](const std::optional<RollPlan>& p) {
                  std::lock_guard<std::mutex> l(mu);
                  rolls.push_back(p);
                },
            .on_migration =
                [this](const std::optional<MigrationPlan>& p) {
                  std::lock_guard<std::mutex> l(mu);
                  migrations.push_back(p);
                }};
  }
  std::optional<proto::ShardMap> last() {
    std::lock_guard<std::mutex> l(mu);
    if (maps.empty()) return std::nullopt;
    return maps.back();
  }
  size_t count() {
    std::lock_guard<std::mutex> l(mu);
    return maps.size();
  }
};

class NodeSessionTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    client_ = NewClient();
  }

  void PutMap(uint64_t epoch) {
    auto map = proto::EvenSplit("c1", 64, {"a", "b"});
    ASSERT_TRUE(map.ok());
    map->epoch = epoch;
    ASSERT_TRUE(client_->Put(MapKey("c1"), EncodeMapJson(*map)).ok());
  }

  std::unique_ptr<NodeSession> NewSession(const char* instance, Seen* seen) {
    NodeSessionOptions o;
    o.endpoints = {etcd().endpoint()};
    o.cluster = "c1";
    o.node_id = "a";
    o.instance = instance;
    o.lease_ttl_s = 2;
    o.rpc_deadline = absl::Milliseconds(500);
    o.max_backoff = absl::Milliseconds(500);
    auto s = NodeSession::Create(o, seen->Callbacks());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static Member Self(const char* instance) {
    Member m;
    m.node_id = "a";
    m.endpoint = "127.0.0.1:7000";
    m.generation = 1;
    m.instance = instance;
    m.pid = 42;
    return m;
  }

  std::optional<KeyValue> MemberKv() {
    auto kv = client_->Get(MemberKey("c1", "a"));
    return kv.ok() ? *kv : std::nullopt;
  }

  std::unique_ptr<EtcdClient> client_;
};

TEST_F(NodeSessionTest, RegistersAndDeliversTheAssembledMap) {
  PutMap(1);
  Seen seen;
  auto session = NewSession(kInstanceA, &seen);
  ASSERT_TRUE(session->Start(Self(kInstanceA), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] {
    auto m = seen.last();
    return m && m->nodes[0].alive && m->nodes[0].endpoint == "127.0.0.1:7000";
  }));
  EXPECT_FALSE(seen.last()->nodes[1].alive);
  NodeSessionStatus st = session->Status();
  EXPECT_TRUE(st.etcd_connected);
  EXPECT_TRUE(st.registered);
  EXPECT_NE(st.lease_id, 0);
  EXPECT_EQ(st.map_epoch, 1u);
  EXPECT_EQ(st.registrations, 1);
  EXPECT_EQ(st.last_error, "");

  Member serving = Self(kInstanceA);
  serving.state = MemberState::kServing;
  session->UpdateMember(serving);
  ASSERT_TRUE(WaitUntil([&] {
    auto kv = MemberKv();
    return kv && kv->value.find("\"serving\"") != std::string::npos;
  }));
  session->Stop(/*revoke=*/true);
  EXPECT_FALSE(MemberKv().has_value());  // revoked with its lease
}

// The fleet roll's plan reaches the node as it changes; a value that does
// not decode counts as no plan (nothing is acted on).
TEST_F(NodeSessionTest, DeliversTheRollPlanAsItChanges) {
  PutMap(1);
  RollPlan plan;
  plan.roll_id = "r-1";
  plan.binary = "/usr/sbin/kvnode";
  plan.build_id = "b2";
  plan.nodes.resize(1);
  plan.nodes[0].node_id = "a";
  ASSERT_TRUE(client_->Put(RollKey("c1"), EncodeRollJson(plan)).ok());
  Seen seen;
  auto session = NewSession(kInstanceA, &seen);
  ASSERT_TRUE(session->Start(Self(kInstanceA), std::nullopt).ok());
  auto rolls = [&] {
    std::lock_guard<std::mutex> l(seen.mu);
    return seen.rolls;
  };
  ASSERT_TRUE(WaitUntil([&] { return rolls().size() == 1; }));
  EXPECT_EQ(rolls()[0], plan);
  plan.nodes[0].state = RollNodeState::kUpgrading;
  ASSERT_TRUE(client_->Put(RollKey("c1"), EncodeRollJson(plan)).ok());
  ASSERT_TRUE(WaitUntil([&] { return rolls().size() == 2; }));
  EXPECT_EQ(rolls()[1], plan);
  ASSERT_TRUE(client_->Put(RollKey("c1"), "{not json").ok());
  ASSERT_TRUE(WaitUntil([&] { return rolls().size() == 3; }));
  EXPECT_FALSE(rolls()[2].has_value());
  PutMap(2);  // a map change alone delivers no plan
  ASSERT_TRUE(WaitUntil([&] { return seen.last() && seen.last()->epoch == 2; }));
  EXPECT_EQ(rolls().size(), 3u);
  session->Stop(/*revoke=*/true);
}

// The slot migration's plan likewise, beside the roll's: a change of one
// delivers only it.
TEST_F(NodeSessionTest, DeliversTheMigrationPlanAsItChanges) {
  PutMap(1);
  MigrationPlan plan;
  plan.migration_id = "m-20261207T000000-0001";
  plan.from_epoch = 1;
  plan.moves.resize(1);
  plan.moves[0].first = 0;
  plan.moves[0].last = 7;
  plan.moves[0].from = "a";
  plan.moves[0].to = "b";
  ASSERT_TRUE(client_->Put(MigrationKey("c1"), EncodeMigrationJson(plan)).ok());
  Seen seen;
  auto session = NewSession(kInstanceA, &seen);
  ASSERT_TRUE(session->Start(Self(kInstanceA), std::nullopt).ok());
  auto migrations = [&] {
    std::lock_guard<std::mutex> l(seen.mu);
    return seen.migrations;
  };
  ASSERT_TRUE(WaitUntil([&] { return migrations().size() == 1; }));
  EXPECT_EQ(migrations()[0], plan);
  plan.moves[0].state = MoveState::kCopying;
  plan.moves[0].attempt = 1;
  ASSERT_TRUE(client_->Put(MigrationKey("c1"), EncodeMigrationJson(plan)).ok());
  ASSERT_TRUE(WaitUntil([&] { return migrations().size() == 2; }));
  EXPECT_EQ(migrations()[1], plan);
  ASSERT_TRUE(client_->Delete(MigrationKey("c1")).ok());
  ASSERT_TRUE(WaitUntil([&] { return migrations().size() == 3; }));
  EXPECT_FALSE(migrations()[2].has_value());
  {
    std::lock_guard<std::mutex> l(seen.mu);
    EXPECT_TRUE(seen.rolls.empty()) << "no roll plan changed";
  }
  session->Stop(/*revoke=*/true);
}

TEST_F(NodeSessionTest, DuplicateNodeIdOfAnotherInstanceIsRefused) {
  PutMap(1);
  Seen first_seen, second_seen;
  auto first = NewSession(kInstanceA, &first_seen);
  ASSERT_TRUE(first->Start(Self(kInstanceA), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] { return first->Status().registered; }));
  auto second = NewSession(kInstanceB, &second_seen);
  ASSERT_TRUE(second->Start(Self(kInstanceB), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard<std::mutex> l(second_seen.mu);
    return !second_seen.refusals.empty();
  }));
  const std::string want = std::string(
                               "node id 'a' belongs to another database: "
                               "/kvnode/c1/instances/a holds instance ") +
                           kInstanceA + ", this database is instance " + kInstanceB;
  {
    std::lock_guard<std::mutex> l(second_seen.mu);
    EXPECT_NE(second_seen.refusals[0].message().find(want), absl::string_view::npos)
        << second_seen.refusals[0];
    EXPECT_TRUE(absl::IsPermissionDenied(second_seen.refusals[0]));
  }
  NodeSessionStatus st = second->Status();
  EXPECT_FALSE(st.registered);
  EXPECT_NE(st.last_error.find(want), std::string::npos) << st.last_error;
  EXPECT_NE(MemberKv()->value.find(kInstanceA), std::string::npos);  // untouched
  EXPECT_TRUE(first->Status().registered);
}

// A node id stays bound to the database (instance) that first registered
// it: a second database is refused for good, also once the first node is
// gone (its member key deleted), and is never handed a map to serve.
TEST_F(NodeSessionTest, DuplicateStaysRefusedAfterTheFirstIsGone) {
  PutMap(1);
  Seen first_seen, second_seen;
  auto first = NewSession(kInstanceA, &first_seen);
  ASSERT_TRUE(first->Start(Self(kInstanceA), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] { return first->Status().registered; }));
  auto second = NewSession(kInstanceB, &second_seen);
  ASSERT_TRUE(second->Start(Self(kInstanceB), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard<std::mutex> l(second_seen.mu);
    return !second_seen.refusals.empty();
  }));
  first->Stop(/*revoke=*/true);  // the member key goes, as when its lease expires
  ASSERT_FALSE(MemberKv().has_value());
  // The second retries every <= 500 ms (max_backoff): 3 s is several tries.
  EXPECT_FALSE(WaitUntil([&] { return MemberKv().has_value(); }, std::chrono::seconds(3)))
      << "the duplicate took the member key: " << MemberKv()->value;
  EXPECT_FALSE(second->Status().registered);
  EXPECT_EQ(second_seen.count(), 0u) << "a refused instance was handed a map to serve";

  // The first restarts on its own database: it registers as before.
  Seen again_seen;
  auto again = NewSession(kInstanceA, &again_seen);
  ASSERT_TRUE(again->Start(Self(kInstanceA), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] { return again->Status().registered; }));
  ASSERT_TRUE(WaitUntil([&] { return again_seen.last() && again_seen.last()->nodes[0].alive; }));
  EXPECT_NE(MemberKv()->value.find(kInstanceA), std::string::npos);
}

// Replacing a lost node (a new database, the same id) takes kvctl cluster
// forget-node, which is refused while the node is alive.
TEST_F(NodeSessionTest, ForgetNodeLetsANewDatabaseTakeTheId) {
  PutMap(1);
  Seen first_seen, second_seen;
  auto first = NewSession(kInstanceA, &first_seen);
  ASSERT_TRUE(first->Start(Self(kInstanceA), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] { return first->Status().registered; }));
  auto alive = ForgetNode(*client_, "c1", "a");
  ASSERT_FALSE(alive.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(alive.status())) << alive.status();
  EXPECT_NE(alive.status().message().find("node 'a' is alive (instance " + std::string(kInstanceA)),
            absl::string_view::npos)
      << alive.status();
  auto bound = client_->Get(InstanceKey("c1", "a"));
  ASSERT_TRUE(bound.ok() && bound->has_value());
  EXPECT_EQ((*bound)->value, kInstanceA);

  first->Stop(/*revoke=*/true);
  auto forgotten = ForgetNode(*client_, "c1", "a");
  ASSERT_TRUE(forgotten.ok()) << forgotten.status();
  EXPECT_EQ(*forgotten, kInstanceA);
  EXPECT_TRUE(absl::IsNotFound(ForgetNode(*client_, "c1", "a").status()));

  auto second = NewSession(kInstanceB, &second_seen);
  ASSERT_TRUE(second->Start(Self(kInstanceB), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] { return second->Status().registered; }));
  ASSERT_TRUE(WaitUntil([&] { return second_seen.last() && second_seen.last()->nodes[0].alive; }));
  EXPECT_NE(MemberKv()->value.find(kInstanceB), std::string::npos);
  bound = client_->Get(InstanceKey("c1", "a"));
  ASSERT_TRUE(bound.ok() && bound->has_value());
  EXPECT_EQ((*bound)->value, kInstanceB);
}

TEST_F(NodeSessionTest, MalformedMapKeepsTheLastGoodOneAndSaysWhy) {
  PutMap(1);
  Seen seen;
  auto session = NewSession(kInstanceA, &seen);
  ASSERT_TRUE(session->Start(Self(kInstanceA), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] { return seen.last() && seen.last()->nodes[0].alive; }));
  const size_t maps_before = seen.count();
  ASSERT_TRUE(client_->Put(MapKey("c1"), "{\"cluster\":\"c1\",\"epoch\":").ok());
  ASSERT_TRUE(WaitUntil([&] { return session->Status().map_errors == 1; }));
  NodeSessionStatus st = session->Status();
  EXPECT_NE(st.last_error.find("key /kvnode/c1/map: shard map JSON: not valid JSON"),
            std::string::npos)
      << st.last_error;
  EXPECT_NE(st.last_error.find("serving the last good map"), std::string::npos);
  EXPECT_EQ(st.map_epoch, 1u);
  EXPECT_EQ(seen.count(), maps_before);  // nothing delivered

  PutMap(2);  // a good map again clears the error
  ASSERT_TRUE(WaitUntil([&] { return seen.last()->epoch == 2; }));
  EXPECT_EQ(session->Status().last_error, "");
}

TEST_F(NodeSessionTest, ReconnectsAndReRegistersAfterEtcdRestarts) {
  PutMap(1);
  Seen seen;
  auto session = NewSession(kInstanceA, &seen);
  ASSERT_TRUE(session->Start(Self(kInstanceA), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] { return session->Status().registered; }));
  etcd().Stop();
  ASSERT_TRUE(WaitUntil([&] { return !session->Status().etcd_connected; }));
  EXPECT_NE(session->Status().last_error, "");
  ASSERT_TRUE(etcd().Start());
  ASSERT_TRUE(WaitUntil([&] {
    NodeSessionStatus st = session->Status();
    return st.etcd_connected && st.registered && st.last_error.empty();
  }));
  EXPECT_TRUE(WaitUntil([&] { return MemberKv().has_value(); }));
}

// etcd comes back empty (its data lost): the lease is unknown there, so the
// session registers with a new one, and the watch, whose revision the new
// store has not reached, re-reads and finds the map written again.
TEST_F(NodeSessionTest, ReRegistersWhenEtcdComesBackEmpty) {
  PutMap(1);
  Seen seen;
  auto session = NewSession(kInstanceA, &seen);
  ASSERT_TRUE(session->Start(Self(kInstanceA), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] { return seen.last() && seen.last()->nodes[0].alive; }));
  PutMap(2);  // move the revision on, so that the new store starts behind it
  PutMap(3);
  ASSERT_TRUE(WaitUntil([&] { return seen.last()->epoch == 3; }));
  etcd().Stop();
  etcd().WipeData();
  ASSERT_TRUE(etcd().Start());
  ASSERT_TRUE(WaitUntil([&] {
    NodeSessionStatus st = session->Status();
    return st.etcd_connected && st.registered && st.registrations == 2;
  }));
  EXPECT_TRUE(MemberKv().has_value());
  PutMap(4);
  EXPECT_TRUE(WaitUntil([&] { return seen.last()->epoch == 4 && seen.last()->nodes[0].alive; }));
}

TEST_F(NodeSessionTest, RegistersWithANewLeaseWhenTheOldOneIsGone) {
  PutMap(1);
  Seen seen;
  auto session = NewSession(kInstanceA, &seen);
  ASSERT_TRUE(session->Start(Self(kInstanceA), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] { return session->Status().registered; }));
  const int64_t old_lease = session->Status().lease_id;
  ASSERT_TRUE(client_->LeaseRevoke(old_lease).ok());  // the key goes with it
  ASSERT_TRUE(WaitUntil([&] {
    NodeSessionStatus st = session->Status();
    return st.registered && st.registrations == 2 && st.lease_id != old_lease;
  }));
  auto kv = MemberKv();
  ASSERT_TRUE(kv.has_value());
  EXPECT_EQ(kv->lease, session->Status().lease_id);
}

// The live upgrade: the old process hands its lease over and stops without
// revoking; the new one adopts it and the member key never goes away.
TEST_F(NodeSessionTest, HandedOverLeaseIsAdoptedAndTheKeyStays) {
  PutMap(1);
  Seen old_seen, new_seen;
  auto old_session = NewSession(kInstanceA, &old_seen);
  ASSERT_TRUE(old_session->Start(Self(kInstanceA), std::nullopt).ok());
  ASSERT_TRUE(WaitUntil([&] { return old_session->Status().registered; }));
  const int64_t lease = old_session->HandOffLease();
  ASSERT_NE(lease, 0);
  old_session->Stop(/*revoke=*/false);
  old_session.reset();

  auto new_session = NewSession(kInstanceA, &new_seen);
  Member self = Self(kInstanceA);
  self.generation = 2;
  ASSERT_TRUE(new_session->Start(self, lease).ok());
  ASSERT_TRUE(WaitUntil([&] {
    auto kv = MemberKv();
    return new_session->Status().registered && kv &&
           kv->value.find("\"generation\":2") != std::string::npos;
  }));
  EXPECT_EQ(new_session->Status().lease_id, lease);
  EXPECT_EQ(MemberKv()->lease, lease);
  // Longer than the TTL: the adopted lease is kept alive by the new session.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  EXPECT_FALSE(WaitUntil([&] { return !MemberKv().has_value(); }, std::chrono::seconds(3)));
  EXPECT_GE(std::chrono::steady_clock::now(), until);
}

TEST(NodeSessionOptionsTest, ValidateNamesTheFlag) {
  NodeSessionOptions o;
  o.endpoints = {"127.0.0.1:2379"};
  o.cluster = "c1";
  o.node_id = "a";
  o.instance = kInstanceA;
  EXPECT_TRUE(o.Validate().ok());
  o.lease_ttl_s = 1;
  EXPECT_NE(o.Validate().message().find("--etcd_lease_ttl_s"), absl::string_view::npos);
  o.lease_ttl_s = 3;
  o.node_id = "a/b";
  EXPECT_NE(o.Validate().message().find("--node_id"), absl::string_view::npos);
}

}  // namespace
}  // namespace kvnode::cluster
