#include "kvnode/upgrade/fault.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvnode/upgrade/process.h"

namespace kvnode::upgrade {
namespace {

TEST(Fault, ParsesEveryPhaseAndAction) {
  for (int i = 0; i < kPhaseCount; ++i) {
    const Phase p = static_cast<Phase>(i);
    EXPECT_EQ(PhaseFromName(PhaseName(p)), p);
    for (const char* a : {"crash", "hang", "fail"}) {
      const std::string flag = std::string(PhaseName(p)) + ":" + a;
      absl::StatusOr<FaultPlan> plan = FaultPlan::Parse(flag);
      ASSERT_TRUE(plan.ok()) << flag << ": " << plan.status();
      EXPECT_EQ(plan->ToString(), flag);
      EXPECT_EQ(FaultActionName(*plan->ActionAt(p)), a);
      for (int j = 0; j < kPhaseCount; ++j) {
        if (j != i) {
          EXPECT_FALSE(plan->ActionAt(static_cast<Phase>(j)).has_value());
        }
      }
    }
  }
  EXPECT_TRUE(IsOldSidePhase(Phase::kOSpawn));
  EXPECT_FALSE(IsOldSidePhase(Phase::kNOpenDb));
}

TEST(Fault, ListsAndErrors) {
  absl::StatusOr<FaultPlan> p = FaultPlan::Parse("n_ready:hang,o_drain:crash");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ActionAt(Phase::kNReady), FaultAction::kHang);
  EXPECT_EQ(p->ActionAt(Phase::kODrain), FaultAction::kCrash);
  EXPECT_EQ(p->ToString(), "n_ready:hang,o_drain:crash");
  EXPECT_TRUE(FaultPlan::Parse("")->empty());
  for (const char* bad : {"n_ready", "n_ready:", ":crash", "n_rdy:crash", "n_ready:explode",
                          "n_ready:crash,n_ready:fail", "n_ready:crash,", "o_exit:crash:1"}) {
    absl::StatusOr<FaultPlan> b = FaultPlan::Parse(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(b.status())) << bad;
  }
  absl::Status s = FaultPlan::Parse("n_rdy:crash").status();
  EXPECT_NE(s.message().find("unknown phase 'n_rdy'"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("o_move_clients"), std::string_view::npos) << "lists valid phases";
}

TEST(Fault, FailReturnsAStatusAndNothingElseFires) {
  const FaultPlan plan = *FaultPlan::Parse("o_flush:fail");
  absl::Status s = MaybeInjectFault(plan, Phase::kOFlush);
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_NE(s.message().find("o_flush"), std::string_view::npos);
  EXPECT_TRUE(MaybeInjectFault(plan, Phase::kOPause).ok());
  // The process-wide plan.
  EXPECT_TRUE(MaybeInjectFault(Phase::kOFlush).ok());
  SetFaultPlan(plan);
  EXPECT_TRUE(absl::IsAborted(MaybeInjectFault(Phase::kOFlush)));
  SetFaultPlan(FaultPlan());
  EXPECT_TRUE(MaybeInjectFault(Phase::kOFlush).ok());
}

TEST(FaultDeathTest, CrashExitsWithoutCleanup) {
  const FaultPlan plan = *FaultPlan::Parse("n_open_db:crash");
  EXPECT_EXIT((void)MaybeInjectFault(plan, Phase::kNOpenDb),
              ::testing::ExitedWithCode(kInjectedCrashExitCode), "injected crash at n_open_db");
}

// A hang blocks until someone kills it: the observer's deadline catches it.
TEST(Fault, HangBlocksUntilKilled) {
  const FaultPlan plan = *FaultPlan::Parse("o_drain:hang");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    (void)MaybeInjectFault(plan, Phase::kODrain);
    _exit(0);  // never reached
  }
  absl::StatusOr<Process> p = Process::Open(pid, /*is_child=*/true);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(p->WaitExit(absl::Now() + absl::Milliseconds(100))));
  absl::StatusOr<ExitStatus> st = p->KillAndReap(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_TRUE(st->signaled);
  EXPECT_EQ(st->signal, SIGKILL);
}

}  // namespace
}  // namespace kvnode::upgrade
