// The cluster's pure codecs: keys, the stored map's JSON, member JSON and
// Assemble, and the identity and map files (no etcd).
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "kvnode/cluster/identity.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/map_json.h"
#include "kvnode/cluster/member.h"

namespace kvnode::cluster {
namespace {

proto::ShardMap ThreeNodes() {
  auto map = proto::EvenSplit("c1", 4096, {"a", "b", "c"});
  EXPECT_TRUE(map.ok());
  return *map;
}

void ExpectErrorMentions(const absl::Status& s, std::string_view what) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(std::string(what)), absl::string_view::npos) << s;
}

TEST(ClusterKeysTest, Layout) {
  EXPECT_EQ(MapKey("c1"), "/kvnode/c1/map");
  EXPECT_EQ(MemberKey("c1", "b"), "/kvnode/c1/nodes/b");
  EXPECT_EQ(MembersPrefix("c1"), "/kvnode/c1/nodes/");
  EXPECT_EQ(NodeIdOfMemberKey("c1", "/kvnode/c1/nodes/b"), "b");
  EXPECT_EQ(NodeIdOfMemberKey("c1", "/kvnode/c1/nodes/"), std::nullopt);
  EXPECT_EQ(NodeIdOfMemberKey("c1", "/kvnode/c1/nodes/b/x"), std::nullopt);
  EXPECT_EQ(NodeIdOfMemberKey("c1", "/kvnode/c2/nodes/b"), std::nullopt);
  EXPECT_EQ(PrefixRangeEnd("/kvnode/c1/"), "/kvnode/c10");
}

TEST(MapJsonTest, RoundTripsTheContractForm) {
  const proto::ShardMap map = ThreeNodes();
  const std::string json = EncodeMapJson(map);
  EXPECT_EQ(json, R"({"cluster":"c1","epoch":1,"nodes":["a","b","c"],)"
                  R"("ranges":[[0,"a"],[1366,"b"],[2731,"c"]],"slots":4096})");
  auto back = DecodeMapJson(json, "c1");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, map);
}

TEST(MapJsonTest, RefusesWhatIsWrongAndSaysWhat) {
  ExpectErrorMentions(DecodeMapJson("{not json", "c1").status(), "not valid JSON");
  ExpectErrorMentions(DecodeMapJson("[]", "c1").status(), "not a JSON object");
  const std::string good = EncodeMapJson(ThreeNodes());
  ExpectErrorMentions(DecodeMapJson(good, "c2").status(), "not 'c2'");
  ExpectErrorMentions(
      DecodeMapJson(R"({"cluster":"c1","epoch":"1","slots":8,"nodes":["a"],"ranges":[[0,"a"]]})",
                    "c1")
          .status(),
      "'epoch'");
  ExpectErrorMentions(
      DecodeMapJson(R"({"cluster":"c1","epoch":1,"slots":8,"nodes":["a"],"ranges":[[0,"z"]]})",
                    "c1")
          .status(),
      "not in 'nodes'");
  ExpectErrorMentions(
      DecodeMapJson(R"({"cluster":"c1","epoch":1,"slots":8,"nodes":["a"],"ranges":[[3,"a"]]})",
                    "c1")
          .status(),
      "shard map JSON");
  ExpectErrorMentions(
      DecodeMapJson(R"({"cluster":"c1","epoch":1,"slots":999999,"nodes":[],"ranges":[]})", "c1")
          .status(),
      "'slots'");
  ExpectErrorMentions(
      DecodeMapJson(R"({"cluster":"c1","epoch":1,"slots":8,"nodes":[1],"ranges":[]})", "c1")
          .status(),
      "'nodes'");
  ExpectErrorMentions(DecodeMapJson(std::string(kMaxMapJsonSize + 1, ' '), "c1").status(),
                      "above the limit");
}

// Whatever etcd holds decodes to a value or an error, never a crash: deep
// nesting, wrong types everywhere, numbers out of range, NUL bytes.
TEST(MapJsonTest, HostileValuesAreErrors) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_FALSE(DecodeMapJson(deep, "c1").ok());
  EXPECT_FALSE(DecodeMemberJson(deep, "k", "").ok());
  for (const char* v :
       {"", "null", "1", "\"x\"", "{}", R"({"cluster":null})",
        R"({"cluster":"c1","epoch":-1,"slots":8,"nodes":["a"],"ranges":[[0,"a"]]})",
        R"({"cluster":"c1","epoch":1e99,"slots":8,"nodes":["a"],"ranges":[[0,"a"]]})",
        R"({"cluster":"c1","epoch":1,"slots":8,"nodes":["a"],"ranges":[[0]]})",
        R"({"cluster":"c1","epoch":1,"slots":8,"nodes":["a"],"ranges":[[99999999999,"a"]]})",
        R"({"cluster":"c1","epoch":1,"slots":8,"nodes":"a","ranges":{}})",
        R"({"cluster":"c1","epoch":1,"slots":0,"nodes":[],"ranges":[]})"}) {
    EXPECT_FALSE(DecodeMapJson(v, "c1").ok()) << v;
    EXPECT_FALSE(DecodeMemberJson(v, "k", "").ok()) << v;
  }
  EXPECT_FALSE(DecodeMapJson(std::string("{\"cluster\":\"c\0\"}", 16), "c1").ok());
  EXPECT_FALSE(DecodeMemberJson(R"({"node_id":"a","endpoint":"e","generation":1,"build_id":"",
      "version":"","state":"serving","pid":99999999999,"instance":""})",
                                "k", "")
                   .ok());
}

Member SomeMember(std::string id) {
  Member m;
  m.node_id = std::move(id);
  m.endpoint = "10.0.0.1:7000";
  m.generation = 3;
  m.build_id = "v0.1-1-gabc";
  m.version = "0.1.0";
  m.state = MemberState::kServing;
  m.pid = 1234;
  m.instance = std::string(32, 'f');
  return m;
}

TEST(MemberJsonTest, RoundTripsAndNamesTheKeyInErrors) {
  const Member m = SomeMember("b");
  auto back = DecodeMemberJson(EncodeMemberJson(m), "/kvnode/c1/nodes/b", "b");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m);
  ExpectErrorMentions(DecodeMemberJson("nope", "/kvnode/c1/nodes/b", "b").status(),
                      "/kvnode/c1/nodes/b");
  ExpectErrorMentions(DecodeMemberJson(EncodeMemberJson(m), "/kvnode/c1/nodes/x", "x").status(),
                      "does not match");
  std::string bad_state = EncodeMemberJson(m);
  bad_state.replace(bad_state.find("serving"), 7, "dancing");
  ExpectErrorMentions(DecodeMemberJson(bad_state, "k", "b").status(), "unknown state 'dancing'");
  ExpectErrorMentions(DecodeMemberJson(R"({"node_id":5})", "k", "").status(), "'node_id'");
  Member long_endpoint = m;
  long_endpoint.endpoint = std::string(kMaxMemberFieldSize + 1, 'e');
  ExpectErrorMentions(DecodeMemberJson(EncodeMemberJson(long_endpoint), "k", "b").status(),
                      "'endpoint' is longer");
  for (MemberState s : {MemberState::kStarting, MemberState::kServing, MemberState::kDraining,
                        MemberState::kUpgrading}) {
    EXPECT_EQ(ParseMemberState(MemberStateName(s)), s);
  }
}

TEST(AssembleTest, FillsEndpointsAndLivenessFromMembers) {
  const proto::ShardMap stored = ThreeNodes();
  const proto::ShardMap map = Assemble(stored, {SomeMember("b"), SomeMember("zz")});
  EXPECT_FALSE(map.nodes[0].alive);
  EXPECT_EQ(map.nodes[0].endpoint, "");
  EXPECT_TRUE(map.nodes[1].alive);
  EXPECT_EQ(map.nodes[1].endpoint, "10.0.0.1:7000");
  EXPECT_EQ(map.nodes[1].generation, 3u);
  EXPECT_EQ(map.ranges, stored.ranges);
  EXPECT_TRUE(map.Validate().ok());
}

class IdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvnode-ident-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(IdentityTest, CreatedOnceThenKeptAndMismatchesRefused) {
  auto first = LoadOrCreateIdentity(dir_, "c1", "a");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->instance.size(), 32u);
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/" + kIdentityFileName).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto again = LoadOrCreateIdentity(dir_, "c1", "");  // --node_id may be omitted later
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first);
  ExpectErrorMentions(LoadOrCreateIdentity(dir_, "c1", "b").status(),
                      "belongs to node 'a' of cluster 'c1', not node 'b' of cluster 'c1'");
  ExpectErrorMentions(LoadOrCreateIdentity(dir_, "c2", "a").status(), "of cluster 'c2'");
}

TEST_F(IdentityTest, NewIdentityNeedsANodeId) {
  ExpectErrorMentions(LoadOrCreateIdentity(dir_, "c1", "").status(), "--node_id");
  ExpectErrorMentions(LoadOrCreateIdentity(dir_, "c1", "no/slash").status(), "--node_id");
}

TEST_F(IdentityTest, SymlinkAndGarbageAreRefused) {
  std::ofstream(dir_ + "/elsewhere") << "x";
  ASSERT_EQ(::symlink((dir_ + "/elsewhere").c_str(), (dir_ + "/" + kIdentityFileName).c_str()), 0);
  EXPECT_FALSE(LoadIdentity(dir_).ok());
  std::filesystem::remove(dir_ + "/" + kIdentityFileName);
  std::ofstream(dir_ + "/" + kIdentityFileName) << "cluster=c1\nnode_id=a\nhacker=1\n";
  ExpectErrorMentions(LoadIdentity(dir_).status(), "unknown line");
}

TEST_F(IdentityTest, MapFileRoundTripsAndChecksTheCluster) {
  auto none = LoadMap(dir_, "c1");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  proto::ShardMap map = Assemble(ThreeNodes(), {SomeMember("a")});
  ASSERT_TRUE(StoreMap(dir_, map).ok());
  auto back = LoadMap(dir_, "c1");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(**back, map);
  ExpectErrorMentions(LoadMap(dir_, "c2").status(), "not 'c2'");
  std::ofstream(dir_ + "/" + kMapFileName, std::ios::trunc) << "garbage";
  EXPECT_FALSE(LoadMap(dir_, "c1").ok());
}

}  // namespace
}  // namespace kvnode::cluster
