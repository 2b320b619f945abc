// Fault injection at the named phases of a live upgrade, for tests:
//
//   --upgrade_fault=PHASE:ACTION[,PHASE:ACTION...]
//
// PHASE is one of the names below (o_* run in the old process O, n_* in the
// new process N; since N is started with O's argv, one flag value can arm both
// sides, and each side fires only its own phases). ACTION is
//   crash  log one line, then _exit(kInjectedCrashExitCode): no destructors,
//          no atexit, no flush of anything but the log line; the kernel
//          cleans up as after any crash (fds, verbs objects, shm mappings).
//   hang   log one line, then block the calling thread forever. The peer's
//          deadline must catch it; this is the one place where blocking is
//          the point.
//   fail   return Aborted("injected failure at PHASE"): the normal error path.
//
// The server parses the flag in main() (FaultPlan::Parse), installs the plan
// with SetFaultPlan() before starting threads, and calls MaybeInjectFault()
// at each phase. docs/upgrade.md lists where each phase sits.
//
// Thread safety: SetFaultPlan and MaybeInjectFault may be called from any
// thread.
#ifndef KVNODE_UPGRADE_FAULT_H_
#define KVNODE_UPGRADE_FAULT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvnode::upgrade {

enum class Phase : uint8_t {
  kOSpawn,        // O: handoff header written, before the spawn of N
  kNAttach,       // N: header validated, Hello sent, before attaching the arena
  kNRegister,     // N: arena attached, before opening the device / registering
  kNReady,        // N: registered, before sending Ready
  kOPause,        // O: Ready received, idle clients' records sent, before pausing writes
  kOFlush,        // O: writes paused and drained, before releasing RocksDB
  kOHandover,     // O: RocksDB released, before sending HandOver
  kNOpenDb,       // N: HandOver received, before becoming the writer (journal; RocksDB if alone)
  kNAccepting,    // N: the writer, before accepting and sending Owned
  kOOwned,        // O: Owned received, before the point of no return (a rollback still can)
  kOMoveClients,  // O: Owned received, before telling clients to move
  kOCloseDb,      // O: clients moved or cut, before closing RocksDB and sending Released
  kNJournal,      // N: Owned sent, journaling writes, before waiting for Released
  kNReplay,       // N: O released RocksDB (or died), before opening it and replaying the journal
  kODrain,        // O: RocksDB closed, before draining its QPs
  kODereg,        // O: QPs drained, before deregistering MRs / closing the device
  kOExit,         // O: Gone sent, before exit(0)
};
inline constexpr int kPhaseCount = 17;

// "o_spawn", ...
std::string_view PhaseName(Phase p);
std::optional<Phase> PhaseFromName(std::string_view name);
// True for the o_* phases.
bool IsOldSidePhase(Phase p);

enum class FaultAction : uint8_t { kCrash, kHang, kFail };
std::string_view FaultActionName(FaultAction a);

// Exit status of an injected crash (distinct from real failures in test logs).
inline constexpr int kInjectedCrashExitCode = 86;

class FaultPlan {
 public:
  FaultPlan() = default;
  // "" = no faults. Otherwise a comma-separated list of PHASE:ACTION, each
  // phase at most once. InvalidArgument naming the bad item and the valid
  // names otherwise.
  [[nodiscard]] static absl::StatusOr<FaultPlan> Parse(std::string_view flag);

  std::optional<FaultAction> ActionAt(Phase p) const;
  bool empty() const;
  // Parseable form, "" when empty.
  std::string ToString() const;

 private:
  std::optional<FaultAction> actions_[kPhaseCount];
};

// The process-wide plan (empty until set).
void SetFaultPlan(const FaultPlan& plan);
FaultPlan CurrentFaultPlan();

// Does what the process-wide plan says for `p`: nothing (OK), crash, hang,
// or returns Aborted("injected failure at <phase>").
[[nodiscard]] absl::Status MaybeInjectFault(Phase p);
// Same with an explicit plan (tests).
[[nodiscard]] absl::Status MaybeInjectFault(const FaultPlan& plan, Phase p);

}  // namespace kvnode::upgrade

#endif  // KVNODE_UPGRADE_FAULT_H_
