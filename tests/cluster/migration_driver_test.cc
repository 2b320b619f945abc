// Slot migration's commit (cluster/migration_commit.h) and kvctl's driver
// (cluster/migration_driver.h) against a real etcd. The targets here are
// member keys and commits written by the test the way a node's mover will
// write them: the node-side mover is not built yet.
#include "kvnode/cluster/migration_driver.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "etcd_fixture.h"
#include "gtest/gtest.h"
#include "kvnode/cluster/admin.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/map_json.h"
#include "kvnode/cluster/migration_commit.h"
#include "kvnode/cluster/roll.h"
#include "kvnode/cluster/roll_driver.h"

namespace kvnode::cluster {
namespace {

using kvnode::testing::WaitUntil;

Member MakeMember(const std::string& id) {
  Member m;
  m.node_id = id;
  m.endpoint = "127.0.0.1:7000";
  m.generation = 3;
  m.build_id = "b";
  m.state = MemberState::kServing;
  m.pid = 100;
  m.instance = std::string(32, 'a');
  return m;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(MigrationMemberReport, RoundTripsIsOptionalAndIsChecked) {
  Member m = MakeMember("d");
  m.migration = MigrationReport{"m-1", 1024, 2, MoveReportState::kFailed, 7, 900, "session lost"};
  auto back = DecodeMemberJson(EncodeMemberJson(m), "k", "d");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m);
  auto plain = DecodeMemberJson(EncodeMemberJson(MakeMember("d")), "k", "d");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->migration.has_value());
  const std::string head = R"({"node_id":"d","endpoint":"e","generation":1,"build_id":"b",
      "version":"v","state":"serving","pid":1,"instance":"i","migration":)";
  for (const char* bad :
       {"7", R"({"id":"m","first":0,"attempt":1,"state":"copying","keys":0,"bytes":0})",
        R"({"id":"m","first":0,"attempt":1,"state":"done","keys":0,"bytes":0,"reason":""})",
        R"({"id":"m","first":65536,"attempt":1,"state":"copying","keys":0,"bytes":0,"reason":""})",
        R"({"id":"m","first":0,"attempt":-1,"state":"copying","keys":0,"bytes":0,"reason":""})"}) {
    auto d = DecodeMemberJson(head + bad + "}", "/kvnode/c1/nodes/d", "d");
    EXPECT_FALSE(d.ok()) << bad;
    EXPECT_TRUE(Has(std::string(d.status().message()), "/kvnode/c1/nodes/d")) << d.status();
  }
  Member too_long = m;
  too_long.migration->reason = std::string(kMaxMemberFieldSize + 1, 'x');
  EXPECT_FALSE(DecodeMemberJson(EncodeMemberJson(too_long), "k", "d").ok());
}

class MigrationCommitTest : public kvnode::testing::EtcdTest {
 protected:
  // A three-node map of 64 slots and the plan adding d, its first move
  // copying at attempt 1.
  void SetUpPlan(EtcdClient& etcd) {
    if (map_.epoch == 0) {
      auto map = InitCluster(etcd, "c1", {"a", "b", "c"}, 64);
      ASSERT_TRUE(map.ok()) << map.status();
      map_ = *map;
    } else {  // a test's next round: the map of epoch 1 again
      ASSERT_TRUE(etcd.Put(MapKey("c1"), EncodeMapJson(map_)).ok());
    }
    MigrationOptions o;
    o.max_slots_per_move = 4;
    auto m = PlanAddNode(map_, "d", o);
    ASSERT_TRUE(m.ok()) << m.status();
    plan_ = m->plan;
    plan_.migration_id = "m-1";
    plan_.moves[0].state = MoveState::kCopying;
    plan_.moves[0].attempt = 1;
    ASSERT_TRUE(etcd.Put(MigrationKey("c1"), EncodeMigrationJson(plan_)).ok());
  }
  MigrationPlan ReadPlan(EtcdClient& etcd, int64_t* rev = nullptr) {
    auto kv = etcd.Get(MigrationKey("c1"));
    EXPECT_TRUE(kv.ok() && kv->has_value());
    if (rev != nullptr) *rev = (*kv)->mod_revision;
    auto p = DecodeMigrationJson((*kv)->value, "k");
    EXPECT_TRUE(p.ok()) << p.status();
    return *p;
  }
  proto::ShardMap ReadMap(EtcdClient& etcd) {
    auto kv = etcd.Get(MapKey("c1"));
    EXPECT_TRUE(kv.ok() && kv->has_value());
    auto m = DecodeMapJson((*kv)->value, "c1");
    EXPECT_TRUE(m.ok()) << m.status();
    return *m;
  }
  // What a driver's abort writes: a CAS on the plan read at `rev`.
  bool Abort(EtcdClient& etcd, MigrationPlan p, int64_t rev) {
    p.state = MigrationState::kAborted;
    for (SlotMove& m : p.moves) {
      if (m.state != MoveState::kDone) m.state = MoveState::kAborted;
    }
    auto r = etcd.PutIfModRevision(MigrationKey("c1"), EncodeMigrationJson(p), rev);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && r->applied;
  }
  proto::ShardMap map_;
  MigrationPlan plan_;
};

TEST_F(MigrationCommitTest, CommitsOnceWithTheMapAtEpochPlusOne) {
  auto etcd = NewClient();
  SetUpPlan(*etcd);
  const SlotMove& move = plan_.moves[0];
  CommitOutcome c = CommitMove(*etcd, "c1", "m-1", move.first, 1, MoveCounts{10, 1000});
  ASSERT_EQ(c.result, CommitResult::kCommitted) << c.message;
  proto::ShardMap stored = ReadMap(*etcd);
  EXPECT_TRUE(stored.Validate().ok());
  EXPECT_EQ(stored.epoch, 2u);
  EXPECT_EQ(stored, c.map);
  const auto d = stored.IndexOf("d");
  ASSERT_TRUE(d.has_value());
  for (uint32_t s = 0; s < 64; ++s) {
    const bool moved = s >= move.first && s <= move.last;
    EXPECT_EQ(stored.OwnerOf(s) == *d, moved) << s;
    if (!moved) {
      EXPECT_EQ(stored.nodes[stored.OwnerOf(s)].node_id, map_.nodes[map_.OwnerOf(s)].node_id);
    }
  }
  MigrationPlan p = ReadPlan(*etcd);
  EXPECT_EQ(p.moves[0].state, MoveState::kDone);
  EXPECT_EQ(p.moves[0].keys, 10u);
  EXPECT_EQ(p.moves[0].bytes, 1000u);
  // Once only: a second commit of the same attempt loses, the map stays.
  CommitOutcome again = CommitMove(*etcd, "c1", "m-1", move.first, 1);
  EXPECT_EQ(again.result, CommitResult::kLost);
  EXPECT_TRUE(Has(again.message, "is done at attempt 1")) << again.message;
  EXPECT_EQ(ReadMap(*etcd).epoch, 2u);
}

TEST_F(MigrationCommitTest, RefusesAWrongAttemptIdOrMove) {
  auto etcd = NewClient();
  SetUpPlan(*etcd);
  const uint32_t first = plan_.moves[0].first;
  CommitOutcome wrong = CommitMove(*etcd, "c1", "m-1", first, 2);
  EXPECT_EQ(wrong.result, CommitResult::kLost);
  EXPECT_TRUE(Has(wrong.message, "copying at attempt 1, not copying at 2")) << wrong.message;
  EXPECT_EQ(CommitMove(*etcd, "c1", "m-2", first, 1).result, CommitResult::kLost);
  CommitOutcome pending = CommitMove(*etcd, "c1", "m-1", plan_.moves[1].first, 0);
  EXPECT_EQ(pending.result, CommitResult::kLost);
  EXPECT_TRUE(Has(pending.message, "is pending")) << pending.message;
  EXPECT_EQ(CommitMove(*etcd, "c1", "m-1", first + 1, 1).result, CommitResult::kLost);
  EXPECT_EQ(ReadMap(*etcd).epoch, 1u);
  EXPECT_EQ(ReadPlan(*etcd), plan_);
}

TEST_F(MigrationCommitTest, ExactlyOneOfCommitAndAbortWinsInEitherOrder) {
  auto etcd = NewClient();
  SetUpPlan(*etcd);
  const uint32_t first = plan_.moves[0].first;
  // The abort read the plan before the commit: its CAS loses.
  int64_t rev = 0;
  MigrationPlan before = ReadPlan(*etcd, &rev);
  ASSERT_EQ(CommitMove(*etcd, "c1", "m-1", first, 1).result, CommitResult::kCommitted);
  EXPECT_FALSE(Abort(*etcd, before, rev));
  EXPECT_EQ(ReadPlan(*etcd).state, MigrationState::kRunning);
  // The abort first: the commit loses and the map stays.
  SetUpPlan(*etcd);  // map epoch 1 again, the move copying
  before = ReadPlan(*etcd, &rev);
  ASSERT_TRUE(Abort(*etcd, before, rev));
  CommitOutcome lost = CommitMove(*etcd, "c1", "m-1", first, 1);
  EXPECT_EQ(lost.result, CommitResult::kLost);
  EXPECT_TRUE(Has(lost.message, "aborted")) << lost.message;
  EXPECT_EQ(ReadMap(*etcd).epoch, 1u);
  // At once, from two threads: one wins, and the map says which.
  for (int i = 0; i < 10; ++i) {
    SetUpPlan(*etcd);
    before = ReadPlan(*etcd, &rev);
    std::atomic<bool> aborted{false};
    std::thread t([&] { aborted = Abort(*etcd, before, rev); });
    CommitOutcome c = CommitMove(*etcd, "c1", "m-1", first, 1);
    t.join();
    ASSERT_NE(c.result, CommitResult::kError) << c.message;
    EXPECT_NE(c.result == CommitResult::kCommitted, aborted.load()) << i;
    MigrationPlan after = ReadPlan(*etcd);
    EXPECT_EQ(after.moves[0].state, aborted ? MoveState::kAborted : MoveState::kDone);
    EXPECT_EQ(ReadMap(*etcd).epoch, aborted ? 1u : 2u);
  }
}

// Targets as member keys: each copying move is answered the way a node's
// mover will: a progress report, then CommitMove, unless told otherwise.
class FakeTargets {
 public:
  enum class Behaviour { kCommit, kHold };
  FakeTargets(EtcdClient& etcd, std::vector<std::string> ids) : etcd_(etcd) {
    {
      absl::MutexLock l(&mu_);
      for (const std::string& id : ids) {
        members_[id] = MakeMember(id);
        Write(id);
      }
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~FakeTargets() {
    stop_ = true;
    thread_.join();
  }
  // kHold: copy (report progress) but commit nothing until told kCommit.
  void Behave(Behaviour b) {
    absl::MutexLock l(&mu_);
    behave_ = b;
  }
  // The first attempt of the move starting at `first` reports failed.
  void FailMoveOnce(uint32_t first) {
    absl::MutexLock l(&mu_);
    fail_once_.insert(first);
  }
  // A restart: the member comes back at the next generation, with no
  // report (a new process knows of no copy).
  void Restart(const std::string& id) {
    absl::MutexLock l(&mu_);
    members_[id].generation += 1;
    members_[id].migration.reset();
    Write(id);
  }
  size_t max_copying() { return max_copying_; }
  size_t shared_node_seen() { return shared_node_seen_; }
  size_t commits() { return commits_; }

 private:
  void Write(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ASSERT_TRUE(etcd_.Put(MemberKey("c1", id), EncodeMemberJson(members_[id])).ok());
  }
  void Run() {
    while (!stop_) {
      auto kv = etcd_.Get(MigrationKey("c1"));
      if (kv.ok() && *kv) {
        auto plan = DecodeMigrationJson((*kv)->value, "migration");
        if (plan.ok()) Step(*plan);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the fake's poll
    }
  }
  void Step(const MigrationPlan& plan) {
    absl::MutexLock l(&mu_);
    size_t copying = 0;
    std::set<std::string> nodes;
    for (const SlotMove& m : plan.moves) {
      if (m.state != MoveState::kCopying) continue;
      ++copying;
      if (!nodes.insert(m.from).second || !nodes.insert(m.to).second) ++shared_node_seen_;
    }
    max_copying_ = std::max(max_copying_.load(), copying);
    if (plan.state != MigrationState::kRunning) return;
    for (const SlotMove& m : plan.moves) {
      if (m.state != MoveState::kCopying || members_.count(m.to) == 0) continue;
      Member& target = members_[m.to];
      const bool reported = target.migration && target.migration->id == plan.migration_id &&
                            target.migration->first == m.first &&
                            target.migration->attempt == m.attempt;
      if (!reported) {  // the copy starts
        MigrationReport r{
            plan.migration_id, m.first,           m.attempt, MoveReportState::kCopying,
            m.slots() * 10u,   m.slots() * 1000u, ""};
        if (fail_once_.erase(m.first) > 0) {
          r.state = MoveReportState::kFailed;
          r.reason = "injected: the source closed the mover session";
        }
        target.migration = r;
        Write(m.to);
        continue;
      }
      if (target.migration->state != MoveReportState::kCopying || behave_ == Behaviour::kHold) {
        continue;
      }
      CommitOutcome c = CommitMove(etcd_, "c1", plan.migration_id, m.first, m.attempt,
                                   MoveCounts{target.migration->keys, target.migration->bytes});
      if (c.result == CommitResult::kCommitted) ++commits_;
      return;  // the plan changed: read it again
    }
  }

  EtcdClient& etcd_;
  absl::Mutex mu_;
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);
  Behaviour behave_ ABSL_GUARDED_BY(mu_) = Behaviour::kCommit;
  std::set<uint32_t> fail_once_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> max_copying_{0};
  std::atomic<size_t> shared_node_seen_{0};
  std::atomic<size_t> commits_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class MigrationDriverTest : public kvnode::testing::EtcdTest {
 protected:
  MigrationDriverOptions Options(MigrationKind kind, const std::string& node) {
    MigrationDriverOptions o;
    o.cluster = "c1";
    o.kind = kind;
    o.node = node;
    o.plan.max_slots_per_move = 4;
    o.poll = absl::Milliseconds(20);
    o.node_timeout = absl::Seconds(20);
    o.holder = "test";
    return o;
  }
  MigrationOptions PlanOptions() {
    MigrationOptions o;
    o.max_slots_per_move = 4;
    return o;
  }
  MigrationOutcome Run(EtcdClient& etcd, const MigrationDriverOptions& o) {
    return RunMigration(
        etcd, o,
        [this](const MigrationSnapshot&, const MigrationProgress& p, const std::string& e) {
          absl::MutexLock l(&mu_);
          events_.push_back(e);
          last_ = p;
        });
  }
  proto::ShardMap ReadMap(EtcdClient& etcd) {
    auto kv = etcd.Get(MapKey("c1"));
    EXPECT_TRUE(kv.ok() && kv->has_value());
    auto m = DecodeMapJson((*kv)->value, "c1");
    EXPECT_TRUE(m.ok()) << m.status();
    return *m;
  }
  // The stored map equals `target` but for the epoch: one per move.
  void ExpectTarget(EtcdClient& etcd, proto::ShardMap target, size_t moves) {
    proto::ShardMap stored = ReadMap(etcd);
    EXPECT_EQ(stored.epoch, 1 + moves);
    target.epoch = stored.epoch;
    EXPECT_EQ(stored, target);
  }
  absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
  MigrationProgress last_ ABSL_GUARDED_BY(mu_);
};

TEST_F(MigrationDriverTest, AddNodeFromThreeToFourEndsAtThePlannedMap) {
  auto etcd = NewClient();
  auto map = InitCluster(*etcd, "c1", {"a", "b", "c"}, 64);
  ASSERT_TRUE(map.ok());
  auto planned = PlanAddNode(*map, "d", PlanOptions());
  ASSERT_TRUE(planned.ok());
  FakeTargets nodes(*etcd, {"a", "b", "c", "d"});
  MigrationOutcome out = Run(*etcd, Options(MigrationKind::kAddNode, "d"));
  ASSERT_EQ(out.result, MigrationResult::kDone) << out.message;
  EXPECT_EQ(out.last.plan.state, MigrationState::kDone);
  const size_t moves = planned->plan.moves.size();
  ASSERT_GT(moves, 1u);
  EXPECT_EQ(out.last.plan.moves.size(), moves);
  for (const SlotMove& m : out.last.plan.moves) {
    EXPECT_EQ(m.state, MoveState::kDone) << m.first;
    EXPECT_EQ(m.attempt, 1u);
    EXPECT_EQ(m.keys, m.slots() * 10u);
  }
  EXPECT_EQ(nodes.commits(), moves);
  EXPECT_EQ(nodes.max_copying(), 1u);  // every move has target d
  EXPECT_EQ(nodes.shared_node_seen(), 0u);
  ExpectTarget(*etcd, planned->target, moves);
  EXPECT_FALSE(etcd->Get(MigrationLockKey("c1"))->has_value());  // released
  absl::MutexLock l(&mu_);
  EXPECT_EQ(events_.back(), "done");
  EXPECT_EQ(last_.slots_done, 16u);
  EXPECT_EQ(last_.slots_total, 16u);
  EXPECT_EQ(last_.keys, 160u);
  EXPECT_EQ(last_.bytes, 16000u);
}

TEST_F(MigrationDriverTest, ParallelMovesNeverShareASourceOrTarget) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b", "c", "d"}, 64).ok());
  // a and b own 24 slots each, c and d 8: a rebalance moves from two
  // sources to two targets.
  const std::string skewed = R"({"cluster":"c1","epoch":1,"slots":64,"nodes":["a","b","c","d"],)"
                             R"("ranges":[[0,"a"],[24,"b"],[48,"c"],[56,"d"]]})";
  ASSERT_TRUE(etcd->Put(MapKey("c1"), skewed).ok());
  auto planned = PlanRebalance(ReadMap(*etcd), PlanOptions());
  ASSERT_TRUE(planned.ok());
  FakeTargets nodes(*etcd, {"a", "b", "c", "d"});
  MigrationDriverOptions o = Options(MigrationKind::kRebalance, "");
  MigrationOutcome out = Run(*etcd, o);
  ASSERT_EQ(out.result, MigrationResult::kDone) << out.message;
  EXPECT_EQ(nodes.max_copying(), 2u);
  EXPECT_EQ(nodes.shared_node_seen(), 0u);
  ExpectTarget(*etcd, planned->target, planned->plan.moves.size());
}

TEST_F(MigrationDriverTest, AFailedTargetStopsTheMigrationAndResumeFinishesIt) {
  auto etcd = NewClient();
  auto map = InitCluster(*etcd, "c1", {"a", "b", "c"}, 64);
  ASSERT_TRUE(map.ok());
  auto planned = PlanAddNode(*map, "d", PlanOptions());
  ASSERT_TRUE(planned.ok());
  const SlotMove third = planned->plan.moves[2];
  FakeTargets nodes(*etcd, {"a", "b", "c", "d"});
  nodes.FailMoveOnce(third.first);
  MigrationOutcome out = Run(*etcd, Options(MigrationKind::kAddNode, "d"));
  ASSERT_EQ(out.result, MigrationResult::kStopped) << out.message;
  const std::string name = absl::StrCat("slots ", third.first, "-", third.last, " ", third.from,
                                        " -> d failed: d reports: injected");
  EXPECT_TRUE(Has(out.message, name)) << out.message;
  EXPECT_EQ(out.last.plan.state, MigrationState::kStopped);
  EXPECT_EQ(out.last.plan.moves[1].state, MoveState::kDone);
  EXPECT_EQ(out.last.plan.moves[2].state, MoveState::kFailed);
  EXPECT_EQ(out.last.plan.moves[3].state, MoveState::kPending);
  EXPECT_EQ(ReadMap(*etcd).epoch, 3u);  // two moves committed
  // A new migration is refused while this one is unfinished.
  MigrationOutcome refused = Run(*etcd, Options(MigrationKind::kAddNode, "d"));
  EXPECT_EQ(refused.result, MigrationResult::kRefused);
  EXPECT_TRUE(Has(refused.message, "is unfinished (stopped")) << refused.message;

  MigrationDriverOptions resume = Options(MigrationKind::kAddNode, "d");
  resume.mode = MigrationMode::kResume;
  MigrationOutcome done = Run(*etcd, resume);
  ASSERT_EQ(done.result, MigrationResult::kDone) << done.message;
  EXPECT_EQ(done.last.plan.moves[2].attempt, 2u);
  EXPECT_EQ(done.last.plan.moves[3].attempt, 1u);
  ExpectTarget(*etcd, planned->target, planned->plan.moves.size());
}

TEST_F(MigrationDriverTest, AbortKeepsDoneMovesAndAbortsTheRest) {
  auto etcd = NewClient();
  auto map = InitCluster(*etcd, "c1", {"a", "b", "c"}, 64);
  ASSERT_TRUE(map.ok());
  auto planned = PlanAddNode(*map, "d", PlanOptions());
  ASSERT_TRUE(planned.ok());
  FakeTargets nodes(*etcd, {"a", "b", "c", "d"});
  nodes.FailMoveOnce(planned->plan.moves[2].first);
  ASSERT_EQ(Run(*etcd, Options(MigrationKind::kAddNode, "d")).result, MigrationResult::kStopped);
  MigrationDriverOptions abort = Options(MigrationKind::kAddNode, "d");
  abort.mode = MigrationMode::kAbort;
  MigrationOutcome out = Run(*etcd, abort);
  ASSERT_EQ(out.result, MigrationResult::kDone) << out.message;
  EXPECT_EQ(out.last.plan.state, MigrationState::kAborted);
  for (size_t i = 0; i < out.last.plan.moves.size(); ++i) {
    EXPECT_EQ(out.last.plan.moves[i].state, i < 2 ? MoveState::kDone : MoveState::kAborted) << i;
  }
  // The map keeps what the two done moves switched.
  proto::ShardMap stored = ReadMap(*etcd);
  EXPECT_EQ(stored.epoch, 3u);
  auto d = stored.IndexOf("d");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(stored.SlotsOwnedBy(*d),
            planned->plan.moves[0].slots() + planned->plan.moves[1].slots());
  EXPECT_EQ(Run(*etcd, abort).result, MigrationResult::kRefused);  // nothing left to abort
}

TEST_F(MigrationDriverTest, ASecondDriverIsRefusedNamingTheHolder) {
  auto etcd = NewClient();
  auto map = InitCluster(*etcd, "c1", {"a", "b", "c"}, 64);
  ASSERT_TRUE(map.ok());
  auto planned = PlanAddNode(*map, "d", PlanOptions());
  ASSERT_TRUE(planned.ok());
  planned->plan.migration_id = "m-7";
  ASSERT_TRUE(etcd->Put(MigrationKey("c1"), EncodeMigrationJson(planned->plan)).ok());
  auto lease = etcd->LeaseGrant(30);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(
      etcd->Put(MigrationLockKey("c1"), R"({"holder":"kvctl on h pid 7"})", lease->id).ok());
  MigrationOutcome out = Run(*etcd, Options(MigrationKind::kAddNode, "d"));
  EXPECT_EQ(out.result, MigrationResult::kRefused);
  EXPECT_TRUE(Has(out.message, "migration m-7 is being driven by kvctl on h pid 7")) << out.message;
  MigrationDriverOptions resume = Options(MigrationKind::kAddNode, "d");
  resume.mode = MigrationMode::kResume;
  resume.lock_wait = absl::Milliseconds(300);
  EXPECT_EQ(Run(*etcd, resume).result, MigrationResult::kRefused);
  ASSERT_TRUE(etcd->LeaseRevoke(lease->id).ok());  // the holder is gone
  MigrationDriverOptions abort = resume;
  abort.mode = MigrationMode::kAbort;
  MigrationOutcome aborted = Run(*etcd, abort);
  EXPECT_EQ(aborted.result, MigrationResult::kDone) << aborted.message;
  EXPECT_EQ(aborted.last.plan.state, MigrationState::kAborted);
}

TEST_F(MigrationDriverTest, ARollAndAMigrationRefuseToRunTogether) {
  auto etcd = NewClient();
  auto map = InitCluster(*etcd, "c1", {"a", "b", "c"}, 64);
  ASSERT_TRUE(map.ok());
  auto planned = PlanAddNode(*map, "d", PlanOptions());
  ASSERT_TRUE(planned.ok());
  planned->plan.migration_id = "m-7";
  ASSERT_TRUE(etcd->Put(MigrationKey("c1"), EncodeMigrationJson(planned->plan)).ok());
  RollOptions roll;
  roll.cluster = "c1";
  roll.binary = "/usr/sbin/kvnode";
  roll.build_id = "new";
  roll.holder = "test";
  RollOutcome refused = RunRoll(*etcd, roll, nullptr);
  EXPECT_EQ(refused.result, RollResult::kRefused);
  EXPECT_TRUE(Has(refused.message, "slot migration m-7 is running")) << refused.message;
  EXPECT_FALSE(etcd->Get(RollKey("c1"))->has_value());  // no roll plan written

  planned->plan.state = MigrationState::kDone;
  ASSERT_TRUE(etcd->Put(MigrationKey("c1"), EncodeMigrationJson(planned->plan)).ok());
  RollPlan running;
  running.roll_id = "r-7";
  running.binary = "/usr/sbin/kvnode";
  running.build_id = "new";
  for (const char* id : {"a", "b", "c"}) {
    RollNode n;
    n.node_id = id;
    running.nodes.push_back(n);
  }
  ASSERT_TRUE(etcd->Put(RollKey("c1"), EncodeRollJson(running)).ok());
  MigrationOutcome out = Run(*etcd, Options(MigrationKind::kAddNode, "d"));
  EXPECT_EQ(out.result, MigrationResult::kRefused);
  EXPECT_TRUE(Has(out.message, "fleet roll r-7 is running")) << out.message;
  EXPECT_EQ(out.last.plan.migration_id, "m-7");  // not replaced
}

TEST_F(MigrationDriverTest, ADriverKilledMidRunIsResumedToTheEnd) {
  auto etcd = NewClient();
  auto map = InitCluster(*etcd, "c1", {"a", "b", "c"}, 64);
  ASSERT_TRUE(map.ok());
  auto planned = PlanAddNode(*map, "d", PlanOptions());
  ASSERT_TRUE(planned.ok());
  FakeTargets nodes(*etcd, {"a", "b", "c", "d"});
  nodes.Behave(FakeTargets::Behaviour::kHold);  // copies, but commits nothing yet
  MigrationOutcome first;
  std::thread driver([&] { first = Run(*etcd, Options(MigrationKind::kAddNode, "d")); });
  // Once a move is copying, the driver dies: its lock's lease goes.
  int64_t lease = 0;
  ASSERT_TRUE(WaitUntil([&] {
    auto lock = etcd->Get(MigrationLockKey("c1"));
    auto plan = etcd->Get(MigrationKey("c1"));
    if (!lock.ok() || !*lock || !plan.ok() || !*plan) return false;
    auto p = DecodeMigrationJson((*plan)->value, "k");
    if (!p.ok() || p->moves.empty() || p->moves[0].state != MoveState::kCopying) return false;
    lease = (*lock)->lease;
    return true;
  }));
  ASSERT_TRUE(etcd->LeaseRevoke(lease).ok());
  driver.join();
  EXPECT_EQ(first.result, MigrationResult::kPaused) << first.message;
  EXPECT_TRUE(Has(first.message, "lost the migration's lock")) << first.message;
  // The move in flight goes on and commits without a driver.
  nodes.Behave(FakeTargets::Behaviour::kCommit);
  ASSERT_TRUE(WaitUntil([&] { return nodes.commits() == 1; }));
  MigrationDriverOptions resume = Options(MigrationKind::kAddNode, "d");
  resume.mode = MigrationMode::kResume;
  MigrationOutcome done = Run(*etcd, resume);
  ASSERT_EQ(done.result, MigrationResult::kDone) << done.message;
  for (const SlotMove& m : done.last.plan.moves) EXPECT_EQ(m.attempt, 1u) << m.first;
  ExpectTarget(*etcd, planned->target, planned->plan.moves.size());
}

TEST_F(MigrationDriverTest, ATargetThatGoesDownFailsItsMove) {
  auto etcd = NewClient();
  auto map = InitCluster(*etcd, "c1", {"a", "b", "c"}, 64);
  ASSERT_TRUE(map.ok());
  auto planned = PlanAddNode(*map, "d", PlanOptions());
  ASSERT_TRUE(planned.ok());
  FakeTargets nodes(*etcd, {"a", "b", "c", "d"});
  nodes.Behave(FakeTargets::Behaviour::kHold);  // the first move never commits
  MigrationOutcome out;
  std::thread driver([&] { out = Run(*etcd, Options(MigrationKind::kAddNode, "d")); });
  ASSERT_TRUE(WaitUntil([&] {
    auto kv = etcd->Get(MemberKey("c1", "d"));
    if (!kv.ok() || !*kv) return false;
    auto m = DecodeMemberJson((*kv)->value, "k", "d");
    return m.ok() && m->migration.has_value();
  }));
  ASSERT_TRUE(etcd->Delete(MemberKey("c1", "d")).ok());  // its lease ran out
  driver.join();
  ASSERT_EQ(out.result, MigrationResult::kStopped) << out.message;
  const SlotMove& first = planned->plan.moves[0];
  EXPECT_TRUE(Has(out.message, absl::StrCat("slots ", first.first, "-", first.last, " ", first.from,
                                            " -> d failed: d is down")))
      << out.message;
  EXPECT_EQ(out.last.plan.moves[0].state, MoveState::kFailed);
}

TEST_F(MigrationDriverTest, ATargetRestartedWithoutACommitFailsItsMove) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b", "c"}, 64).ok());
  FakeTargets nodes(*etcd, {"a", "b", "c", "d"});
  nodes.Behave(FakeTargets::Behaviour::kHold);
  MigrationOutcome out;
  std::thread driver([&] { out = Run(*etcd, Options(MigrationKind::kAddNode, "d")); });
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock l(&mu_);
    return std::find_if(events_.begin(), events_.end(), [](const std::string& e) {
             return Has(e, "copying (attempt 1)");
           }) != events_.end();
  }));
  nodes.Restart("d");
  driver.join();
  ASSERT_EQ(out.result, MigrationResult::kStopped) << out.message;
  EXPECT_TRUE(Has(out.message, "d restarted without committing (generation 3, now 4)"))
      << out.message;
}

TEST_F(MigrationDriverTest, NoProgressForNodeTimeoutFailsTheMove) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b", "c"}, 64).ok());
  FakeTargets nodes(*etcd, {"a", "b", "c", "d"});
  nodes.Behave(FakeTargets::Behaviour::kHold);
  MigrationDriverOptions o = Options(MigrationKind::kAddNode, "d");
  o.node_timeout = absl::Milliseconds(500);
  MigrationOutcome out = Run(*etcd, o);
  ASSERT_EQ(out.result, MigrationResult::kStopped) << out.message;
  EXPECT_TRUE(Has(out.message, "failed: no progress from d in 500ms")) << out.message;
  EXPECT_EQ(ReadMap(*etcd).epoch, 1u);
}

}  // namespace
}  // namespace kvnode::cluster
