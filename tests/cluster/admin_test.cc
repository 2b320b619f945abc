// kvctl's cluster commands' logic (cluster/admin.h) against a real etcd.
#include "kvnode/cluster/admin.h"

#include "etcd_fixture.h"
#include "gtest/gtest.h"
#include "kvnode/cluster/keys.h"

namespace kvnode::cluster {
namespace {

class ClusterAdminTest : public kvnode::testing::EtcdTest {};

TEST_F(ClusterAdminTest, InitWritesTheFirstMapOnlyOnce) {
  auto etcd = NewClient();
  auto map = InitCluster(*etcd, "c1", {"a", "b", "c"}, 4096);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->epoch, 1u);
  auto again = InitCluster(*etcd, "c1", {"x"}, 16);
  EXPECT_TRUE(absl::IsAlreadyExists(again.status())) << again.status();
  EXPECT_NE(again.status().message().find("already has a map (epoch 1) at /kvnode/c1/map"),
            absl::string_view::npos);
  EXPECT_FALSE(InitCluster(*etcd, "c2", {"a", "a"}, 16).ok());  // duplicate node id
}

TEST_F(ClusterAdminTest, StatusShowsMembersLeasesSlotsAndBadValues) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b"}, 64).ok());
  Member b;
  b.node_id = "b";
  b.endpoint = "127.0.0.1:7001";
  b.state = MemberState::kServing;
  b.instance = std::string(32, 'b');
  auto lease = etcd->LeaseGrant(30);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(etcd->Put(MemberKey("c1", "b"), EncodeMemberJson(b), lease->id).ok());
  ASSERT_TRUE(etcd->Put(MemberKey("c1", "z"), "{\"node_id\":7}").ok());
  auto s = ReadClusterStatus(*etcd, "c1");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->etcd.has_value());
  ASSERT_TRUE(s->map.has_value());
  ASSERT_EQ(s->nodes.size(), 2u);
  EXPECT_FALSE(s->nodes[0].member.has_value());
  EXPECT_EQ(s->nodes[0].slots, 32u);
  ASSERT_TRUE(s->nodes[1].member.has_value());
  EXPECT_TRUE(s->map->nodes[1].alive);
  EXPECT_GT(s->nodes[1].lease_ttl_left_s, 20);
  ASSERT_EQ(s->member_errors.size(), 1u);
  EXPECT_NE(s->member_errors[0].find("/kvnode/c1/nodes/z"), std::string::npos);
  EXPECT_NE(ClusterStatusJson(*s).find("\"map_epoch\":1"), std::string::npos);
}

TEST_F(ClusterAdminTest, StatusShowsTheMigrationPlanOrItsError) {
  auto etcd = NewClient();
  auto map = InitCluster(*etcd, "c1", {"a", "b"}, 64);
  ASSERT_TRUE(map.ok());
  auto s = ReadClusterStatus(*etcd, "c1");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->migration.has_value());
  auto m = PlanAddNode(*map, "c");
  ASSERT_TRUE(m.ok()) << m.status();
  m->plan.migration_id = "m-1";
  ASSERT_TRUE(etcd->Put(MigrationKey("c1"), EncodeMigrationJson(m->plan)).ok());
  s = ReadClusterStatus(*etcd, "c1");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->migration.has_value());
  EXPECT_EQ(*s->migration, m->plan);
  EXPECT_NE(ClusterStatusJson(*s).find("\"migration_id\":\"m-1\""), std::string::npos);
  ASSERT_TRUE(etcd->Put(MigrationKey("c1"), "{").ok());
  s = ReadClusterStatus(*etcd, "c1");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->migration.has_value());
  EXPECT_NE(s->migration_error.find("/kvnode/c1/migration"), std::string::npos);
}

}  // namespace
}  // namespace kvnode::cluster
