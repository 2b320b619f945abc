// kvctl cluster add-node | remove-node | rebalance (tools/kvctl_migrate.h):
// the kvctl binary run against a real etcd holding a map written by
// InitCluster. The dry run's totals and exit statuses, and that nothing is
// ever written to the migration key.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "etcd_fixture.h"
#include "gtest/gtest.h"
#include "kvnode/cluster/admin.h"
#include "kvnode/cluster/keys.h"
#include "kvnode/cluster/migration.h"

extern char** environ;

namespace kvnode::cluster {
namespace {

struct KvctlRun {
  int status = -1;  // the exit status; -1 when kvctl did not exit normally
  std::string out;
  std::string err;
};

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class KvctlMigrateTest : public kvnode::testing::EtcdTest {
 protected:
  // kvctl `args` with --etcd_endpoints and --cluster c1 appended.
  KvctlRun Kvctl(std::vector<std::string> args) {
    args.insert(args.begin(), KVNODE_KVCTL_PATH);
    args.push_back("--etcd_endpoints");
    args.push_back(etcd().endpoint());
    args.push_back("--cluster");
    args.push_back("c1");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string out = etcd().dir() + "/kvctl.out", err = etcd().dir() + "/kvctl.err";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid = -1;
    KvctlRun r;
    const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(rc, 0) << "cannot run " << argv[0];
    if (rc != 0) return r;
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFEXITED(status)) r.status = WEXITSTATUS(status);
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }

  // Asserts there is no migration key: no kvctl run writes one yet.
  void ExpectNoPlanWritten(EtcdClient& etcd) {
    auto kv = etcd.Get(MigrationKey("c1"));
    ASSERT_TRUE(kv.ok()) << kv.status();
    EXPECT_FALSE(kv->has_value()) << (*kv)->value;
  }
};

bool Has(const std::string& text, const std::string& want) {
  return text.find(want) != std::string::npos;
}

TEST_F(KvctlMigrateTest, DryRunsShowTotalsAndPerNodeCounts) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b", "c"}, 4096).ok());

  KvctlRun add = Kvctl({"cluster", "add-node", "d", "--dry_run"});
  EXPECT_EQ(add.status, 0) << add.err;
  EXPECT_TRUE(Has(add.out,
                  "dry run (nothing written): add node 'd' to cluster c1, from map "
                  "epoch 1 (4096 slots, 3 nodes)"))
      << add.out;
  EXPECT_TRUE(Has(add.out,
                  "moved: 1024 of 4096 slots (25.0 %) in 18 moves of at most 64 "
                  "slots; rate unthrottled"))
      << add.out;
  EXPECT_TRUE(Has(add.out, "1     1024..1080        57  a -> d")) << add.out;
  for (const char* row :
       {"a                   1366    1024     -342", "b                   1365    1024     -341",
        "d                      -    1024    +1024  (joins)"}) {
    EXPECT_TRUE(Has(add.out, row)) << row << "\n" << add.out;
  }

  KvctlRun remove = Kvctl({"cluster", "remove-node", "b", "--dry_run", "--max_slots_per_move",
                           "1000", "--rate_mb_s", "50"});
  EXPECT_EQ(remove.status, 0) << remove.err;
  EXPECT_TRUE(Has(remove.out,
                  "moved: 1365 of 4096 slots (33.3 %) in 2 moves of at most 1000 "
                  "slots; rate 50 MB/s"))
      << remove.out;
  EXPECT_TRUE(Has(remove.out, "b                   1365       -    -1365  (leaves)")) << remove.out;

  KvctlRun rebalance = Kvctl({"cluster", "rebalance", "--dry_run"});
  EXPECT_EQ(rebalance.status, 0) << rebalance.err;
  EXPECT_TRUE(Has(rebalance.out, "nothing to move: the slot counts differ by at most 1"))
      << rebalance.out;

  // --json: the plan as it would be stored, which the decoder takes.
  KvctlRun json = Kvctl({"cluster", "add-node", "d", "--dry_run", "--json"});
  EXPECT_EQ(json.status, 0) << json.err;
  auto plan = DecodeMigrationJson(json.out, "stdout");
  ASSERT_TRUE(plan.ok()) << plan.status() << "\n" << json.out;
  EXPECT_EQ(plan->kind, MigrationKind::kAddNode);
  EXPECT_EQ(plan->from_epoch, 1u);
  EXPECT_EQ(plan->moves.size(), 18u);
  ExpectNoPlanWritten(*etcd);
}

TEST_F(KvctlMigrateTest, RefusalsAndUsageExitWithTheirStatus) {
  auto etcd = NewClient();
  KvctlRun no_map = Kvctl({"cluster", "rebalance", "--dry_run"});
  EXPECT_EQ(no_map.status, 2);
  EXPECT_TRUE(Has(no_map.err, "cluster 'c1' has no map at /kvnode/c1/map")) << no_map.err;
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b", "c"}, 4096).ok());
  struct Case {
    std::vector<std::string> args;
    int status;
    const char* err;
  };
  const std::vector<Case> cases = {
      {{"add-node", "d"}, 2, "moving slots is not built yet, nothing was changed; --dry_run"},
      {{"rebalance"}, 2, "moving slots is not built yet"},
      {{"add-node", "a", "--dry_run"}, 1, "node 'a' is in the map already (nodes: a, b, c)"},
      {{"add-node", "x/y", "--dry_run"}, 1, "may hold only A-Z a-z 0-9 . _ -"},
      {{"remove-node", "z", "--dry_run"}, 1, "node 'z' is not in the map"},
      {{"add-node", "--dry_run"}, 2, "usage: kvctl cluster add-node ID"},
      {{"rebalance", "a", "--dry_run"}, 2, "usage:"},
      {{"add-node", "d", "--dry_run", "--max_slots_per_move", "0"},
       2,
       "--max_slots_per_move 0 is not within 1..65536"},
      // 1 slot a move: 1024 moves, a plan well within 1 MiB.
      {{"add-node", "d", "--dry_run", "--max_slots_per_move", "1"}, 0, ""},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"cluster"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    KvctlRun r = Kvctl(args);
    EXPECT_EQ(r.status, c.status) << c.args[0] << ": " << r.err;
    EXPECT_TRUE(Has(r.err, c.err)) << "want '" << c.err << "', got: " << r.err;
  }
  ExpectNoPlanWritten(*etcd);
}

TEST_F(KvctlMigrateTest, APlanTooLargeToStoreIsRefusedNamingTheFlag) {
  auto etcd = NewClient();
  ASSERT_TRUE(InitCluster(*etcd, "c1", {"a", "b"}, 65536).ok());
  // 32768 one-slot moves of about 100 bytes each: above 1 MiB.
  KvctlRun r = Kvctl({"cluster", "remove-node", "b", "--dry_run", "--max_slots_per_move", "1"});
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_TRUE(Has(r.err, "above the limit of 1048576: raise --max_slots_per_move")) << r.err;
  KvctlRun ok = Kvctl({"cluster", "remove-node", "b", "--dry_run"});
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_TRUE(Has(ok.out, "moved: 32768 of 65536 slots (50.0 %) in 512 moves")) << ok.out;
}

TEST_F(KvctlMigrateTest, EtcdNotAnsweringExits2) {
  etcd().Stop();
  KvctlRun r = Kvctl({"cluster", "add-node", "d", "--dry_run"});
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_TRUE(Has(r.err, "kvctl cluster add-node: ")) << r.err;
}

}  // namespace
}  // namespace kvnode::cluster
