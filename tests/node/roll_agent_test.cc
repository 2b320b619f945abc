// The node's roll agent (node/src/roll_agent.h) without etcd or a server:
// plans arrive on one thread, the upgrade hook is set on another, answers
// come back on a third, as in a node. It acts once per intent, never as the
// process an upgrade made, and reports rollbacks and refusals.
#include "roll_agent.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "kvnode/base/annotated_mutex.h"

namespace kvnode::node {
namespace {

using cluster::Member;
using cluster::RollNodeState;
using cluster::RollPlan;
using cluster::RollReport;

RollPlan Plan(uint64_t attempt) {
  RollPlan p;
  // std::string(...): GCC 12's -Wrestrict misfires on assigning a literal.
  p.roll_id = std::string("r-1");
  p.binary = std::string("/opt/kvnode-2");
  p.build_id = std::string("b2");
  p.nodes.resize(1);
  p.nodes[0].node_id = std::string("a");
  p.nodes[0].state = RollNodeState::kUpgrading;
  p.nodes[0].attempt = attempt;
  p.nodes[0].from_generation = 3;
  return p;
}

struct Node {
  AnnotatedMutex mu;
  Member self ABSL_GUARDED_BY(mu);
  std::vector<RollReport> reports ABSL_GUARDED_BY(mu);
  std::atomic<int> upgrades{0};
  std::string answer = R"({"ok":false,"upgrade":"rolled_back","reason":"hello deadline"})";
  RollAgent agent{[this] {
                    AnnotatedLock l(&mu);
                    return self;
                  },
                  [this](RollReport r) {
                    AnnotatedLock l(&mu);
                    reports.push_back(std::move(r));
                  }};
  Node() {
    AnnotatedLock l(&mu);
    self.node_id = std::string("a");
    self.generation = 3;
    self.build_id = std::string("b1");
  }
  // The upgrade answers on a thread of its own, as the old side does.
  RollAgent::UpgradeFn Upgrade() {
    return [this](const std::string& binary, std::function<void(std::string)> reply) {
      EXPECT_EQ(binary, "/opt/kvnode-2");
      upgrades++;
      std::thread([reply, a = answer] { reply(a); }).detach();
    };
  }
  size_t report_count() {
    AnnotatedLock l(&mu);
    return reports.size();
  }
};

bool Eventually(const std::function<bool()>& cond) {
  for (int i = 0; i < 500 && !cond(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // poll, 5 s deadline
  }
  return cond();
}

TEST(RollAgent, ActsOncePerIntentFromAnyThreadAndReportsTheRollback) {
  Node n;
  std::thread plans([&] {
    for (int i = 0; i < 50; ++i) n.agent.OnPlan(Plan(1));  // the watch redelivering
  });
  std::thread hook([&] { n.agent.SetUpgrade(n.Upgrade()); });
  plans.join();
  hook.join();
  ASSERT_TRUE(Eventually([&] { return n.report_count() == 1; }));
  EXPECT_EQ(n.upgrades.load(), 1);
  {
    AnnotatedLock l(&n.mu);
    EXPECT_EQ(n.reports[0].outcome, "rolled_back");
    EXPECT_EQ(n.reports[0].reason, "hello deadline");
    EXPECT_EQ(n.reports[0].attempt, 1u);
  }
  n.agent.OnPlan(Plan(2));  // --resume: a new attempt
  ASSERT_TRUE(Eventually([&] { return n.report_count() == 2; }));
  EXPECT_EQ(n.upgrades.load(), 2);
}

TEST(RollAgent, TheNewProcessAndAPlanWithoutTheHookDoNothing) {
  Node n;
  n.agent.OnPlan(Plan(1));  // no hook yet: waits for it
  EXPECT_EQ(n.upgrades.load(), 0);
  {
    AnnotatedLock l(&n.mu);
    n.self.generation = 4;  // the upgrade's new process
    n.self.build_id = std::string("b2");
  }
  n.agent.SetUpgrade(n.Upgrade());
  n.agent.OnPlan(Plan(1));
  EXPECT_EQ(n.upgrades.load(), 0);
  EXPECT_EQ(n.report_count(), 0u);
}

TEST(RollAgent, ARefusalIsReportedAsRefused) {
  Node n;
  n.answer = R"({"ok":false,"error":"an upgrade is already in progress"})";
  n.agent.SetUpgrade(n.Upgrade());
  n.agent.OnPlan(Plan(1));
  ASSERT_TRUE(Eventually([&] { return n.report_count() == 1; }));
  AnnotatedLock l(&n.mu);
  EXPECT_EQ(n.reports[0].outcome, "refused");
  EXPECT_EQ(n.reports[0].reason, "an upgrade is already in progress");
}

}  // namespace
}  // namespace kvnode::node
