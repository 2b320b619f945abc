// The cluster agent's start-up (most of it needs no etcd): the cluster flags'
// checks, the identity in the database directory (another node's or
// cluster's database refused, naming both), and the persisted map served
// before the etcd session exists; and, against a real etcd, a node id bound
// to another database serving nothing.
#include "cluster_agent.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "etcd_fixture.h"
#include "kvnode/cluster/identity.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/map_json.h"
#include "kvnode/proto/shard_map.h"

namespace kvnode::node {
namespace {

class TempDir {
 public:
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "kv-agent-XXXXXX").string();
    path_ = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

ClusterFlags Flags(std::string cluster, std::string endpoints, std::string node_id = "") {
  ClusterFlags f;
  f.cluster = std::move(cluster);
  f.etcd_endpoints = std::move(endpoints);
  f.node_id = std::move(node_id);
  return f;
}

// The error of `f`, which must be an InvalidArgument whose message names
// `flag` and contains `detail`.
void ExpectRefused(const ClusterFlags& f, const std::string& flag, const std::string& detail) {
  absl::StatusOr<std::optional<ClusterAgentOptions>> o = ClusterOptionsFromFlags(f, "/tmp/db");
  ASSERT_FALSE(o.ok()) << flag << " accepted";
  EXPECT_TRUE(absl::IsInvalidArgument(o.status())) << o.status();
  EXPECT_NE(o.status().message().find(flag), std::string_view::npos) << o.status();
  EXPECT_NE(o.status().message().find(detail), std::string_view::npos) << o.status();
}

TEST(ClusterFlags, WithoutClusterNothingChanges) {
  absl::StatusOr<std::optional<ClusterAgentOptions>> o =
      ClusterOptionsFromFlags(ClusterFlags{}, "/tmp/db");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->has_value());
  // A cluster flag alone is a mistake, not something to ignore.
  ExpectRefused(Flags("", "127.0.0.1:2379"), "--etcd_endpoints", "--cluster");
  ExpectRefused(Flags("", "", "a"), "--node_id", "--cluster");
  ClusterFlags ttl;
  ttl.etcd_lease_ttl_s = 5;
  ttl.etcd_lease_ttl_given = true;
  ExpectRefused(ttl, "--etcd_lease_ttl_s", "--cluster");
}

TEST(ClusterFlags, EachFlagChecked) {
  ExpectRefused(Flags("c1", ""), "--cluster", "--etcd_endpoints");
  ExpectRefused(Flags("c/1", "127.0.0.1:2379"), "--cluster", "c/1");
  ExpectRefused(Flags(std::string(65, 'c'), "127.0.0.1:2379"), "--cluster", "");
  ExpectRefused(Flags("c1", "127.0.0.1:2379", "a b"), "--node_id", "a b");
  ExpectRefused(Flags("c1", "127.0.0.1"), "--etcd_endpoints", "127.0.0.1");
  ExpectRefused(Flags("c1", "127.0.0.1:0"), "--etcd_endpoints", "127.0.0.1:0");
  ExpectRefused(Flags("c1", "127.0.0.1:2379,,h:1"), "--etcd_endpoints", "empty entry");
  ExpectRefused(Flags("c1", "http://127.0.0.1:2379"), "--etcd_endpoints", "scheme");
  for (int64_t ttl : {0, 1, 61}) {
    ClusterFlags f = Flags("c1", "127.0.0.1:2379");
    f.etcd_lease_ttl_s = ttl;
    ExpectRefused(f, "--etcd_lease_ttl_s", absl::StrCat("not ", ttl));
  }
  absl::StatusOr<std::optional<ClusterAgentOptions>> o =
      ClusterOptionsFromFlags(Flags("c1", "127.0.0.1:2379"), "");
  EXPECT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--db_path"), std::string_view::npos) << o.status();
}

TEST(ClusterFlags, GoodFlagsBecomeOptions) {
  ClusterFlags f = Flags("c-1.x_y", " 127.0.0.1:2379, [::1]:2380 ,etcd.example:1", "node-a");
  f.etcd_lease_ttl_s = 2;
  absl::StatusOr<std::optional<ClusterAgentOptions>> o = ClusterOptionsFromFlags(f, "/tmp/db");
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE(o->has_value());
  const ClusterAgentOptions& c = **o;
  EXPECT_EQ(c.cluster, "c-1.x_y");
  EXPECT_EQ(c.etcd_endpoints,
            (std::vector<std::string>{"127.0.0.1:2379", "[::1]:2380", "etcd.example:1"}));
  EXPECT_EQ(c.node_id, "node-a");
  EXPECT_EQ(c.lease_ttl_s, 2);
  EXPECT_EQ(c.db_path, "/tmp/db");
}

ClusterAgentOptions Options(const std::string& db, std::string cluster, std::string node_id) {
  ClusterAgentOptions o;
  o.cluster = std::move(cluster);
  o.node_id = std::move(node_id);
  o.etcd_endpoints = {"127.0.0.1:2379"};
  o.db_path = db;
  return o;
}

TEST(ClusterIdentity, FirstStartRecordsItLaterStartsMayOmitTheNodeId) {
  TempDir dir;
  const std::string db = dir.path() + "/db";
  // The first start needs --node_id.
  absl::StatusOr<std::unique_ptr<ClusterAgent>> a = ClusterAgent::Create(Options(db, "c1", ""));
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--node_id"), std::string_view::npos) << a.status();

  a = ClusterAgent::Create(Options(db, "c1", "a"));
  ASSERT_TRUE(a.ok()) << a.status();
  const cluster::Identity first = (*a)->identity();
  EXPECT_EQ(first.cluster, "c1");
  EXPECT_EQ(first.node_id, "a");
  EXPECT_EQ(first.instance.size(), 32u);
  struct stat st {};
  ASSERT_EQ(stat((db + "/" + cluster::kIdentityFileName).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  a->reset();

  // Without --node_id, and with the same one: the same identity.
  for (const char* id : {"", "a"}) {
    absl::StatusOr<std::unique_ptr<ClusterAgent>> again =
        ClusterAgent::Create(Options(db, "c1", id));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ((*again)->identity(), first);
  }
}

TEST(ClusterIdentity, AnotherNodesOrClustersDatabaseIsRefusedNamingBoth) {
  TempDir dir;
  const std::string db = dir.path() + "/db";
  ASSERT_TRUE(ClusterAgent::Create(Options(db, "c1", "a")).ok());
  const std::string before = [&] {
    absl::StatusOr<std::optional<cluster::Identity>> i = cluster::LoadIdentity(db);
    return i.ok() && i->has_value() ? (*i)->instance : std::string();
  }();
  ASSERT_FALSE(before.empty());

  struct Case {
    const char* cluster;
    const char* node_id;
  };
  for (const Case c : {Case{"c1", "b"}, Case{"c2", "a"}, Case{"c2", ""}}) {
    absl::StatusOr<std::unique_ptr<ClusterAgent>> a =
        ClusterAgent::Create(Options(db, c.cluster, c.node_id));
    ASSERT_FALSE(a.ok()) << c.cluster << "/" << c.node_id << " accepted";
    EXPECT_TRUE(absl::IsFailedPrecondition(a.status())) << a.status();
    const std::string m(a.status().message());
    // The database, its owner and who asked.
    EXPECT_NE(m.find(db), std::string::npos) << m;
    EXPECT_NE(m.find("node 'a' of cluster 'c1'"), std::string::npos) << m;
    EXPECT_NE(m.find(absl::StrCat("cluster '", c.cluster, "'")), std::string::npos) << m;
    if (*c.node_id != '\0') {
      EXPECT_NE(m.find(absl::StrCat("node '", c.node_id, "'")), std::string::npos) << m;
    }
  }
  // Nothing was rewritten by the refused starts.
  absl::StatusOr<std::optional<cluster::Identity>> i = cluster::LoadIdentity(db);
  ASSERT_TRUE(i.ok() && i->has_value());
  EXPECT_EQ((*i)->node_id, "a");
  EXPECT_EQ((*i)->instance, before);
}

TEST(ClusterIdentity, PersistedMapIsServedBeforeEtcd) {
  TempDir dir;
  const std::string db = dir.path() + "/db";
  // No map yet: nothing published, nothing owned.
  {
    absl::StatusOr<std::unique_ptr<ClusterAgent>> a = ClusterAgent::Create(Options(db, "c1", "b"));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)->gate()->Current(), nullptr);
    EXPECT_EQ((*a)->gate()->epoch(), 0u);
  }
  absl::StatusOr<proto::ShardMap> map = proto::EvenSplit("c1", 4096, {"a", "b", "c"});
  ASSERT_TRUE(map.ok()) << map.status();
  map->epoch = 7;
  ASSERT_TRUE(cluster::StoreMap(db, *map).ok());
  absl::StatusOr<std::unique_ptr<ClusterAgent>> a = ClusterAgent::Create(Options(db, "c1", "b"));
  ASSERT_TRUE(a.ok()) << a.status();
  std::shared_ptr<const server::ShardView> v = (*a)->gate()->Current();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->map, *map);
  EXPECT_EQ(v->self, 1);
  EXPECT_EQ(v->slots_owned(), 1365u);
  EXPECT_EQ((*a)->gate()->epoch(), 7u);
  bool saw_epoch = false, saw_slots = false;
  for (const server::ExtraStat& s : (*a)->Stats()) {
    if (s.name == "cluster_map_epoch") saw_epoch = s.value == 7;
    if (s.name == "cluster_slots_owned") saw_slots = s.value == 1365;
  }
  EXPECT_TRUE(saw_epoch && saw_slots);
}

TEST(ClusterIdentity, MapWithoutThisNodeOwnsNothing) {
  TempDir dir;
  const std::string db = dir.path() + "/db";
  absl::StatusOr<proto::ShardMap> map = proto::EvenSplit("c1", 64, {"a", "c"});
  ASSERT_TRUE(map.ok());
  ASSERT_TRUE(ClusterAgent::Create(Options(db, "c1", "b")).ok());
  ASSERT_TRUE(cluster::StoreMap(db, *map).ok());
  absl::StatusOr<std::unique_ptr<ClusterAgent>> a = ClusterAgent::Create(Options(db, "c1", "b"));
  ASSERT_TRUE(a.ok()) << a.status();
  std::shared_ptr<const server::ShardView> v = (*a)->gate()->Current();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->self, server::ShardView::kNotInMap);
  EXPECT_EQ(v->slots_owned(), 0u);
  for (uint32_t s = 0; s < 64; ++s) EXPECT_FALSE(v->Owns(s)) << s;
}

// A database started as node 'b' when etcd binds 'b' to another database:
// even its persisted map (b's slots) is dropped once the session refuses
// the id for good, and b's member key is never written.
class ClusterAgentEtcdTest : public kvnode::testing::EtcdTest {};

TEST_F(ClusterAgentEtcdTest, NodeIdBoundToAnotherDatabaseServesNothing) {
  TempDir dir;
  const std::string db = dir.path() + "/db";
  auto client = NewClient();
  const std::string other(32, 'e');
  ASSERT_TRUE(client->Put(cluster::InstanceKey("c1", "b"), other).ok());
  absl::StatusOr<proto::ShardMap> map = proto::EvenSplit("c1", 64, {"a", "b"});
  ASSERT_TRUE(map.ok());
  ASSERT_TRUE(client->Put(cluster::MapKey("c1"), cluster::EncodeMapJson(*map)).ok());
  ASSERT_TRUE(ClusterAgent::Create(Options(db, "c1", "b")).ok());  // writes the identity
  ASSERT_TRUE(cluster::StoreMap(db, *map).ok());
  ClusterAgentOptions o = Options(db, "c1", "b");
  o.etcd_endpoints = {etcd().endpoint()};
  o.lease_ttl_s = 2;
  o.rpc_deadline = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<ClusterAgent>> a = ClusterAgent::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ((*a)->gate()->Current()->slots_owned(), 32u);  // the persisted map
  ASSERT_TRUE((*a)->Start("127.0.0.1:7001", 1).ok());
  EXPECT_TRUE(kvnode::testing::WaitUntil([&] {
    auto v = (*a)->gate()->Current();
    return v != nullptr && v->slots_owned() == 0;
  })) << "a node of another database still serves b's slots";
  auto member = client->Get(cluster::MemberKey("c1", "b"));
  ASSERT_TRUE(member.ok());
  EXPECT_FALSE(member->has_value()) << (*member)->value;
  (*a)->Stop();
  EXPECT_EQ((*a)->gate()->Current()->slots_owned(), 0u);
}

}  // namespace
}  // namespace kvnode::node
