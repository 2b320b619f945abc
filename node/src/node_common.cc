// Shared pieces of the node's upgrade state machines: options, metrics,
// this build's Compat.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvnode/node/node.h"
#include "kvnode/storage/arena.h"
#include "kvnode/storage/format.h"

namespace kvnode::upgrade {
namespace {
constexpr char kPrefix[] = "upgrade.";
constexpr char kLastPrefix[] = "upgrade.last_us.";
}  // namespace

absl::Status NodeUpgradeOptions::Validate() const {
  if (argv.empty()) return absl::InvalidArgumentError("upgrade: no argv to restart with");
  if (shm_name.empty()) return absl::InvalidArgumentError("upgrade: no shm name");
  for (absl::Duration d :
       {exec_deadline, hello_deadline, ready_deadline, pause_deadline, owned_deadline,
        move_deadline, handover_deadline, old_exit_deadline, step_deadline, write_pause_limit,
        watchdog_grace, watchdog_rollback_deadline, send_deadline, handover_send_deadline,
        control_task_deadline, kill_deadline}) {
    if (d <= absl::ZeroDuration()) return absl::InvalidArgumentError("upgrade: deadline <= 0");
  }
  return compat.Validate();
}

const char* UpgradeMetrics::Name(Count c) {
  switch (c) {
    case kRefused:
      return "refused";
    case kClientsMigrated:
      return "clients_migrated";
    case kClientsCut:
      return "clients_cut";
    case kMrBytesRegistered:
      return "mr_bytes_registered";
    case kMrBytesImported:
      return "mr_bytes_imported";
    case kRkeyChanges:
      return "rkey_changes";
    case kTakeoversAlone:
      return "takeovers_alone";
    case kOldKilled:
      return "old_killed";
    case kIncompatibleRefused:
      return "incompatible_refused";
    case kWatchdogRollbacks:
      return "watchdog_rollbacks";
    case kCanceled:
      return "canceled";
    case kCountEnd:
      break;
  }
  return "?";
}

void UpgradeMetrics::SetLast(const std::string& name, absl::Duration d) {
  absl::MutexLock l(&mu_);
  last_us_[name] = static_cast<uint64_t>(absl::ToInt64Microseconds(d));
}

void UpgradeMetrics::ClearLast() {
  absl::MutexLock l(&mu_);
  last_us_.clear();
}

void UpgradeMetrics::ExportTo(std::vector<std::pair<std::string, uint64_t>>* out) const {
  for (int i = 0; i < kCountEnd; ++i) {
    out->emplace_back(absl::StrCat(kPrefix, Name(static_cast<Count>(i))),
                      Get(static_cast<Count>(i)));
  }
  absl::MutexLock l(&mu_);
  for (const auto& [k, v] : last_us_) out->emplace_back(absl::StrCat(kLastPrefix, k), v);
}

void UpgradeMetrics::ImportFrom(const std::vector<std::pair<std::string, uint64_t>>& in) {
  for (const auto& [name, v] : in) {
    if (absl::StartsWith(name, kLastPrefix)) {
      absl::MutexLock l(&mu_);
      last_us_[name.substr(sizeof(kLastPrefix) - 1)] = v;
      continue;
    }
    if (!absl::StartsWith(name, kPrefix)) continue;
    const std::string short_name = name.substr(sizeof(kPrefix) - 1);
    for (int i = 0; i < kCountEnd; ++i) {
      if (short_name == Name(static_cast<Count>(i))) Add(static_cast<Count>(i), v);
    }
  }
}

std::vector<server::ExtraStat> UpgradeMetrics::Render() const {
  std::vector<server::ExtraStat> out;
  auto counter = [&](Count c, const char* help) {
    out.push_back(server::ExtraStat{absl::StrCat("upgrade_", Name(c), "_total"), "", "counter",
                                    help, static_cast<double>(Get(c))});
  };
  counter(kRefused, "Upgrade requests refused (one running, bad binary).");
  counter(kClientsMigrated, "Clients that moved to a new process and acknowledged.");
  counter(kClientsCut, "Clients cut at the Move deadline.");
  counter(kMrBytesRegistered, "Arena bytes registered anew by new processes.");
  counter(kMrBytesImported, "Arena bytes imported from the old process (ibv_import_mr).");
  counter(kRkeyChanges, "Upgrades after which the arena rkey changed.");
  counter(kTakeoversAlone, "Takeovers from an old process that died before HandOver.");
  counter(kOldKilled, "Old processes killed for overrunning their exit deadline.");
  counter(kIncompatibleRefused, "New binaries refused as incompatible.");
  counter(kWatchdogRollbacks, "Upgrades rolled back by the old process's watchdog (stuck step).");
  counter(kCanceled, "Upgrades canceled by SIGTERM/SIGINT before the point of no return.");
  absl::MutexLock l(&mu_);
  for (const auto& [k, v] : last_us_) {
    out.push_back(server::ExtraStat{"upgrade_last_phase_seconds", absl::StrCat("phase=\"", k, "\""),
                                    "gauge", "Duration of each phase of the last live upgrade.",
                                    static_cast<double>(v) / 1e6});
  }
  return out;
}

std::string UpgradeMetrics::LastPhasesText() const {
  absl::MutexLock l(&mu_);
  std::string out;
  for (const auto& [k, v] : last_us_) {
    absl::StrAppend(&out, out.empty() ? "" : " ", k, "=",
                    absl::StrFormat("%.1f", static_cast<double>(v) / 1e3));
  }
  return out;
}

absl::StatusOr<Compat> NodeCompat(const std::string& test_incompatible) {
  Compat c;
  c.arena_layout_version = storage::kLayoutVersion;
  c.sizeof_arena_header = sizeof(storage::ArenaHeader);
  c.sizeof_limbo_entry = sizeof(storage::LimboEntry);
  if (!test_incompatible.empty()) {
    if (absl::Status s = ApplyTestIncompatibility(test_incompatible, &c); !s.ok()) return s;
  }
  return c;
}

}  // namespace kvnode::upgrade
