// The fleet roll's plan and decisions (cluster/roll.h), and kvctl's driver
// (cluster/roll_driver.h) against a real etcd. The nodes here are member
// keys written by the test the way a node writes them (roll_agent.h): the
// e2e tests (tests/e2e/cluster_roll*.sh) run real nodes.
#include "kvnode/cluster/roll.h"

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "etcd_fixture.h"
#include "gtest/gtest.h"
#include "kvnode/cluster/admin.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/roll_driver.h"

namespace kvnode::cluster {
namespace {

Member MakeMember(const std::string& id, uint64_t generation, const std::string& build) {
  Member m;
  m.node_id = id;
  m.endpoint = "127.0.0.1:7000";
  m.generation = generation;
  m.build_id = build;
  m.state = MemberState::kServing;
  m.pid = 100;
  m.instance = std::string(32, 'a');
  m.health = MemberHealth{};
  return m;
}

RollPlan MakePlan() {
  RollPlan p;
  p.roll_id = "r-1";
  p.binary = "/usr/sbin/kvnode";
  p.build_id = "new";
  for (const char* id : {"a", "b"}) {
    RollNode n;
    n.node_id = id;
    p.nodes.push_back(n);
  }
  return p;
}

TEST(RollJson, RoundTripsAndRefusesBadPlans) {
  RollPlan p = MakePlan();
  p.nodes[0].state = RollNodeState::kRolledBack;
  p.nodes[0].reason = "new process aborted: \"x\"";
  p.nodes[0].started_ms = 1765000000000;
  auto back = DecodeRollJson(EncodeRollJson(p), "k");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);
  for (const char* bad :
       {"", "[]", "{\"roll_id\":\"r\"}",
        R"({"roll_id":"r","binary":"rel/kvnode","build_id":"b","max_unavailable":1,
                              "gate_s":1,"state":"running","reason":"","nodes":[]})",
        R"({"roll_id":"r","binary":"/k","build_id":"b","max_unavailable":0,
                              "gate_s":1,"state":"running","reason":"","nodes":[]})",
        R"({"roll_id":"r","binary":"/k","build_id":"b","max_unavailable":1,
                              "gate_s":1,"state":"walking","reason":"","nodes":[]})"}) {
    auto d = DecodeRollJson(bad, "/kvnode/c/roll");
    EXPECT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().message().find("/kvnode/c/roll"), absl::string_view::npos);
  }
  RollPlan twice = MakePlan();
  twice.nodes[1].node_id = "a";
  EXPECT_NE(DecodeRollJson(EncodeRollJson(twice), "k").status().message().find("'a' twice"),
            absl::string_view::npos);
}

TEST(RollJson, MemberCarriesHealthAndReportAndOlderMembersStillDecode) {
  Member m = MakeMember("a", 3, "old");
  m.health = MemberHealth{1, 2, 3};
  m.roll = RollReport{"r-1", 2, "rolled_back", "bad \xff binary"};  // not UTF-8: replaced
  auto back = DecodeMemberJson(EncodeMemberJson(m), "k", "a");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->health, m.health);
  ASSERT_TRUE(back->roll.has_value());
  EXPECT_EQ(back->roll->attempt, 2u);
  Member old = MakeMember("a", 3, "old");
  old.health.reset();
  auto plain = DecodeMemberJson(EncodeMemberJson(old), "k", "a");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->health.has_value());
  EXPECT_FALSE(DecodeMemberJson(R"({"node_id":"a","endpoint":"e","generation":1,"build_id":"b",
      "version":"v","state":"serving","pid":1,"instance":"i","health":7})",
                                "k", "a")
                   .ok());
}

TEST(RollDecisions, TheNodeActsOnceOnItsOwnIntentOnly) {
  RollPlan p = MakePlan();
  Member a = MakeMember("a", 3, "old");
  EXPECT_FALSE(ShouldAct(p, a, std::nullopt));  // pending
  p.nodes[0].state = RollNodeState::kUpgrading;
  p.nodes[0].attempt = 1;
  p.nodes[0].from_generation = 3;
  auto intent = ShouldAct(p, a, std::nullopt);
  ASSERT_TRUE(intent.has_value());
  EXPECT_EQ(intent->binary, "/usr/sbin/kvnode");
  EXPECT_FALSE(ShouldAct(p, a, intent));                                // acted already
  EXPECT_FALSE(ShouldAct(p, MakeMember("a", 4, "old"), std::nullopt));  // the new process
  EXPECT_FALSE(ShouldAct(p, MakeMember("a", 3, "new"), std::nullopt));  // on the build
  EXPECT_FALSE(ShouldAct(p, MakeMember("b", 3, "old"), std::nullopt));  // not b's turn
  p.nodes[0].attempt = 2;
  EXPECT_TRUE(ShouldAct(p, a, intent));  // a resumed roll's new attempt
  p.state = RollState::kStopped;
  EXPECT_FALSE(ShouldAct(p, a, std::nullopt));
}

TEST(RollDecisions, KvctlJudgesByTheMember) {
  RollPlan p = MakePlan();
  RollNode& e = p.nodes[0];
  e.state = RollNodeState::kUpgrading;
  e.attempt = 1;
  e.from_generation = 3;
  EXPECT_EQ(Judge(p, e, std::nullopt).state, RollNodeState::kUpgrading);  // down: wait
  EXPECT_EQ(Judge(p, e, MakeMember("a", 3, "old")).state, RollNodeState::kUpgrading);
  Member taking = MakeMember("a", 4, "new");
  taking.state = MemberState::kUpgrading;
  EXPECT_EQ(Judge(p, e, taking).state, RollNodeState::kUpgrading);
  RollVerdict done = Judge(p, e, MakeMember("a", 4, "new"));
  EXPECT_EQ(done.state, RollNodeState::kDone);
  EXPECT_EQ(done.to_generation, 4u);
  Member back = MakeMember("a", 3, "old");
  back.roll = RollReport{"r-1", 1, "rolled_back", "hello deadline"};
  RollVerdict rb = Judge(p, e, back);
  EXPECT_EQ(rb.state, RollNodeState::kRolledBack);
  EXPECT_EQ(rb.reason, "rolled back: hello deadline");
  back.roll->attempt = 0;  // an older attempt's report: still waiting
  EXPECT_EQ(Judge(p, e, back).state, RollNodeState::kUpgrading);
  back.roll = RollReport{"r-1", 1, "refused", "an upgrade is already in progress"};
  EXPECT_EQ(Judge(p, e, back).state, RollNodeState::kFailed);
  RollVerdict wrong = Judge(p, e, MakeMember("a", 4, "other"));
  EXPECT_EQ(wrong.state, RollNodeState::kFailed);
  EXPECT_NE(wrong.reason.find("build 'other'"), std::string::npos);
}

// Nodes as member keys: each intent is answered the way `behave` says, the
// way a node's roll agent and live upgrade would.
class FakeNodes {
 public:
  enum class Behaviour { kUpgrade, kRollBack, kUpgradeThenErrors };
  FakeNodes(EtcdClient& etcd, std::vector<std::string> ids, std::string build) : etcd_(etcd) {
    {
      absl::MutexLock l(&mu_);
      for (const std::string& id : ids) {
        members_[id] = MakeMember(id, 3, build);
        Write(id);
      }
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~FakeNodes() {
    stop_ = true;
    thread_.join();
  }
  void Behave(const std::string& id, Behaviour b) {
    absl::MutexLock l(&mu_);
    behave_[id] = b;
  }
  std::vector<std::string> order() {
    absl::MutexLock l(&mu_);
    return order_;
  }
  size_t max_at_once() { return max_at_once_; }
  Member member(const std::string& id) {
    absl::MutexLock l(&mu_);
    return members_[id];
  }

 private:
  void Write(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ASSERT_TRUE(etcd_.Put(MemberKey("c1", id), EncodeMemberJson(members_[id])).ok());
  }
  void Run() {
    std::set<std::pair<std::string, uint64_t>> acted;
    while (!stop_) {
      auto kv = etcd_.Get(RollKey("c1"));
      if (kv.ok() && *kv) {
        auto plan = DecodeRollJson((*kv)->value, "roll");
        if (plan.ok()) Step(*plan, &acted);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the fake's poll
    }
  }
  void Step(const RollPlan& plan, std::set<std::pair<std::string, uint64_t>>* acted) {
    absl::MutexLock l(&mu_);
    size_t upgrading = 0;
    for (const RollNode& n : plan.nodes) {
      upgrading += n.state == RollNodeState::kUpgrading;
      if (!ShouldAct(plan, members_[n.node_id], std::nullopt) ||
          !acted->insert({n.node_id, n.attempt}).second) {
        continue;
      }
      order_.push_back(n.node_id);
      Member& m = members_[n.node_id];
      switch (behave_[n.node_id]) {
        case Behaviour::kRollBack:
          m.roll = RollReport{plan.roll_id, n.attempt, "rolled_back", "injected: o_pause crash"};
          behave_[n.node_id] = Behaviour::kUpgrade;  // the fix for --resume
          break;
        case Behaviour::kUpgradeThenErrors:
          m.health->qp_errors += 1;
          [[fallthrough]];
        case Behaviour::kUpgrade:
          m.generation += 1;
          m.build_id = plan.build_id;
          break;
      }
      Write(n.node_id);
    }
    max_at_once_ = std::max(max_at_once_.load(), upgrading);
    // A node whose gate must fail: its counter rises again after its upgrade.
    for (auto& [id, b] : behave_) {
      Member& m = members_[id];
      if (b == Behaviour::kUpgradeThenErrors && m.build_id == plan.build_id) {
        m.health->qp_errors += 1;
        Write(id);
      }
    }
  }

  EtcdClient& etcd_;
  absl::Mutex mu_;
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Behaviour> behave_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> max_at_once_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class RollDriverTest : public kvnode::testing::EtcdTest {
 protected:
  RollOptions Options() {
    RollOptions o;
    o.cluster = "c1";
    o.binary = "/usr/sbin/kvnode";
    o.build_id = "new";
    o.gate_s = 0;
    o.poll = absl::Milliseconds(20);
    o.node_timeout = absl::Seconds(20);
    o.holder = "test";
    return o;
  }
  RollOutcome Run(EtcdClient& etcd, const RollOptions& o) {
    return RunRoll(etcd, o,
                   [this](const RollSnapshot&, const std::string& e) { events_.push_back(e); });
  }
  std::vector<std::string> events_;
};

TEST_F(RollDriverTest, UpgradesEveryNodeOneAtATimeInTheMapsOrder) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b", "c"}, 64).ok());
  FakeNodes nodes(*etcd, {"a", "b", "c"}, "old");
  RollOutcome out = Run(*etcd, Options());
  ASSERT_EQ(out.result, RollResult::kDone) << out.message;
  EXPECT_EQ(nodes.order(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(nodes.max_at_once(), 1u);
  EXPECT_EQ(out.last.plan.state, RollState::kDone);
  for (const RollNode& n : out.last.plan.nodes) {
    EXPECT_EQ(n.state, RollNodeState::kDone) << n.node_id;
    EXPECT_EQ(n.to_generation, 4u);
  }
  EXPECT_FALSE(etcd->Get(RollLockKey("c1"))->has_value());  // released
  // A roll back to "old" is the same; a roll to the build they run is
  // done without an upgrade.
  RollOptions again = Options();
  RollOutcome same = Run(*etcd, again);
  ASSERT_EQ(same.result, RollResult::kDone) << same.message;
  EXPECT_EQ(nodes.order().size(), 3u);
  EXPECT_EQ(same.last.plan.nodes[0].reason, "already on the build");
}

TEST_F(RollDriverTest, StopsAtTheFirstRollbackLeavesTheRestAndResumes) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b", "c"}, 64).ok());
  FakeNodes nodes(*etcd, {"a", "b", "c"}, "old");
  nodes.Behave("b", FakeNodes::Behaviour::kRollBack);
  RollOutcome out = Run(*etcd, Options());
  ASSERT_EQ(out.result, RollResult::kStopped) << out.message;
  EXPECT_NE(out.message.find("b: rolled back: injected: o_pause crash"), std::string::npos)
      << out.message;
  EXPECT_EQ(out.last.plan.nodes[0].state, RollNodeState::kDone);
  EXPECT_EQ(out.last.plan.nodes[1].state, RollNodeState::kRolledBack);
  EXPECT_EQ(out.last.plan.nodes[2].state, RollNodeState::kPending);
  EXPECT_EQ(nodes.member("c").build_id, "old");  // untouched
  // A new roll is refused while this one is unfinished.
  RollOutcome refused = Run(*etcd, Options());
  EXPECT_EQ(refused.result, RollResult::kRefused);
  EXPECT_NE(refused.message.find("unfinished (stopped"), std::string::npos) << refused.message;

  RollOptions resume = Options();
  resume.mode = RollMode::kResume;
  RollOutcome done = Run(*etcd, resume);
  ASSERT_EQ(done.result, RollResult::kDone) << done.message;
  EXPECT_EQ(done.last.plan.nodes[1].attempt, 2u);
  EXPECT_EQ(nodes.order(), (std::vector<std::string>{"a", "b", "b", "c"}));
}

TEST_F(RollDriverTest, ASecondDriverIsRefusedNamingTheRoll) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a"}, 64).ok());
  RollPlan p = MakePlan();
  p.nodes.resize(1);
  ASSERT_TRUE(etcd->Put(RollKey("c1"), EncodeRollJson(p)).ok());
  auto lease = etcd->LeaseGrant(30);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(etcd->Put(RollLockKey("c1"), R"({"holder":"kvctl on h pid 7"})", lease->id).ok());
  RollOutcome out = Run(*etcd, Options());
  EXPECT_EQ(out.result, RollResult::kRefused);
  EXPECT_NE(out.message.find("roll r-1 is being driven by kvctl on h pid 7"), std::string::npos)
      << out.message;
  // --resume waits for a dead driver's lock only until lock_wait.
  RollOptions resume = Options();
  resume.mode = RollMode::kResume;
  resume.lock_wait = absl::Milliseconds(300);
  EXPECT_EQ(Run(*etcd, resume).result, RollResult::kRefused);
  ASSERT_TRUE(etcd->LeaseRevoke(lease->id).ok());  // the holder is gone
  RollOptions abort = Options();
  abort.mode = RollMode::kAbort;
  RollOutcome aborted = Run(*etcd, abort);
  EXPECT_EQ(aborted.result, RollResult::kDone) << aborted.message;
  EXPECT_EQ(aborted.last.plan.state, RollState::kAborted);
}

TEST_F(RollDriverTest, TheGateStopsTheRollWhenAnErrorCounterRises) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b"}, 64).ok());
  FakeNodes nodes(*etcd, {"a", "b"}, "old");
  nodes.Behave("a", FakeNodes::Behaviour::kUpgradeThenErrors);
  RollOptions o = Options();
  o.gate_s = 3;
  RollOutcome out = Run(*etcd, o);
  ASSERT_EQ(out.result, RollResult::kStopped) << out.message;
  EXPECT_NE(out.message.find("gate: a's qp_errors rose"), std::string::npos) << out.message;
  EXPECT_EQ(nodes.member("b").build_id, "old");
}

TEST_F(RollDriverTest, ANodeDownStopsTheRollBeforeAnyIntent) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b"}, 64).ok());
  FakeNodes nodes(*etcd, {"a"}, "old");
  RollOutcome out = Run(*etcd, Options());
  ASSERT_EQ(out.result, RollResult::kStopped) << out.message;
  EXPECT_NE(out.message.find("b is down"), std::string::npos) << out.message;
  EXPECT_EQ(nodes.order().size(), 0u);
}

TEST_F(RollDriverTest, MaxUnavailableUpgradesThatManyAtOnce) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b", "c", "d"}, 64).ok());
  FakeNodes nodes(*etcd, {"a", "b", "c", "d"}, "old");
  RollOptions o = Options();
  o.max_unavailable = 2;
  RollOutcome out = Run(*etcd, o);
  ASSERT_EQ(out.result, RollResult::kDone) << out.message;
  EXPECT_EQ(nodes.max_at_once(), 2u);
}

TEST_F(RollDriverTest, EtcdGoneMeansPaused) {
  auto client = NewClient();
  ASSERT_TRUE(InitCluster(*client, "c1", {"a"}, 64).ok());
  etcd().Stop();
  RollOptions o = Options();
  o.etcd_wait = absl::Seconds(1);
  RollOutcome out = Run(*client, o);
  EXPECT_EQ(out.result, RollResult::kPaused) << out.message;
  EXPECT_NE(out.message.find("the roll is paused"), std::string::npos) << out.message;
}

}  // namespace
}  // namespace kvnode::cluster
