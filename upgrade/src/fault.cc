#include "kvnode/upgrade/fault.h"

#include <unistd.h>

#include <array>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "kvnode/proto/wire.h"

namespace kvnode::upgrade {
namespace {

using proto::wire::Av;

constexpr std::array<std::string_view, kPhaseCount> kPhaseNames = {
    "o_spawn",    "n_attach",  "n_register",  "n_ready", "o_pause",        "o_flush",
    "o_handover", "n_open_db", "n_accepting", "o_owned", "o_move_clients", "o_close_db",
    "n_journal",  "n_replay",  "o_drain",     "o_dereg", "o_exit",
};

constexpr std::array<std::string_view, 3> kActionNames = {"crash", "hang", "fail"};

std::string AllPhaseNames() {
  std::string out;
  for (std::string_view n : kPhaseNames) absl::StrAppend(&out, out.empty() ? "" : ", ", Av(n));
  return out;
}

absl::Mutex g_mu;
FaultPlan* g_plan ABSL_GUARDED_BY(g_mu) = nullptr;

}  // namespace

std::string_view PhaseName(Phase p) {
  const auto i = static_cast<size_t>(p);
  return i < kPhaseNames.size() ? kPhaseNames[i] : "unknown_phase";
}

std::optional<Phase> PhaseFromName(std::string_view name) {
  for (size_t i = 0; i < kPhaseNames.size(); ++i) {
    if (kPhaseNames[i] == name) return static_cast<Phase>(i);
  }
  return std::nullopt;
}

bool IsOldSidePhase(Phase p) { return PhaseName(p).substr(0, 2) == "o_"; }

std::string_view FaultActionName(FaultAction a) {
  const auto i = static_cast<size_t>(a);
  return i < kActionNames.size() ? kActionNames[i] : "unknown_action";
}

absl::StatusOr<FaultPlan> FaultPlan::Parse(std::string_view flag) {
  FaultPlan plan;
  if (flag.empty()) return plan;
  for (absl::string_view item : absl::StrSplit(absl::string_view(flag.data(), flag.size()), ',')) {
    const size_t colon = item.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--upgrade_fault: '", item, "' is not PHASE:ACTION"));
    }
    const std::string_view phase_name(item.data(), colon);
    const std::string_view action_name(item.data() + colon + 1, item.size() - colon - 1);
    const std::optional<Phase> phase = PhaseFromName(phase_name);
    if (!phase) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--upgrade_fault: unknown phase '", Av(phase_name), "'; phases: ", AllPhaseNames()));
    }
    std::optional<FaultAction> action;
    for (size_t i = 0; i < kActionNames.size(); ++i) {
      if (kActionNames[i] == action_name) action = static_cast<FaultAction>(i);
    }
    if (!action) {
      return absl::InvalidArgumentError(absl::StrCat("--upgrade_fault: unknown action '",
                                                     Av(action_name), "' for ", Av(phase_name),
                                                     "; actions: crash, hang, fail"));
    }
    auto& slot = plan.actions_[static_cast<size_t>(*phase)];
    if (slot) {
      return absl::InvalidArgumentError(
          absl::StrCat("--upgrade_fault: phase ", Av(phase_name), " given twice"));
    }
    slot = action;
  }
  return plan;
}

std::optional<FaultAction> FaultPlan::ActionAt(Phase p) const {
  const auto i = static_cast<size_t>(p);
  return i < static_cast<size_t>(kPhaseCount) ? actions_[i] : std::nullopt;
}

bool FaultPlan::empty() const {
  for (const auto& a : actions_) {
    if (a) return false;
  }
  return true;
}

std::string FaultPlan::ToString() const {
  std::vector<std::string> items;
  for (int i = 0; i < kPhaseCount; ++i) {
    if (actions_[i]) {
      items.push_back(absl::StrCat(Av(kPhaseNames[i]), ":", Av(FaultActionName(*actions_[i]))));
    }
  }
  return absl::StrJoin(items, ",");
}

void SetFaultPlan(const FaultPlan& plan) {
  auto* copy = new FaultPlan(plan);
  absl::MutexLock lock(&g_mu);
  delete g_plan;
  g_plan = copy;
}

FaultPlan CurrentFaultPlan() {
  absl::MutexLock lock(&g_mu);
  return g_plan != nullptr ? *g_plan : FaultPlan();
}

absl::Status MaybeInjectFault(Phase p) { return MaybeInjectFault(CurrentFaultPlan(), p); }

absl::Status MaybeInjectFault(const FaultPlan& plan, Phase p) {
  const std::optional<FaultAction> a = plan.ActionAt(p);
  if (!a) return absl::OkStatus();
  const std::string_view name = PhaseName(p);
  switch (*a) {
    case FaultAction::kCrash:
      LOG(ERROR) << "upgrade: injected crash at " << name << " (pid " << getpid() << ")";
      google::FlushLogFiles(google::GLOG_INFO);
      _exit(kInjectedCrashExitCode);
    case FaultAction::kHang:
      LOG(ERROR) << "upgrade: injected hang at " << name << " (pid " << getpid()
                 << "): blocking this thread forever";
      google::FlushLogFiles(google::GLOG_INFO);
      for (;;) pause();
    case FaultAction::kFail:
      LOG(WARNING) << "upgrade: injected failure at " << name;
      return absl::AbortedError(absl::StrCat("injected failure at ", Av(name)));
  }
  return absl::OkStatus();
}

}  // namespace kvnode::upgrade
