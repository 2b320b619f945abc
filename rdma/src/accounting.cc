#include "kvnode/rdma/accounting.h"

#include <glog/logging.h>

#include <atomic>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace kvnode::rdma {
namespace {

struct State {
  absl::Mutex mu;
  // Live objects by kind, keyed by owner address, with their labels.
  std::array<absl::flat_hash_map<const void*, std::string>, static_cast<size_t>(ObjectKind::kCount)>
      live ABSL_GUARDED_BY(mu);
  std::atomic<int64_t> destroy_failures{0};
  std::atomic<int64_t> undrained_destroys{0};
  std::atomic<uint64_t> pinned_bytes{0};
};

State& GetState() {
  static State* s = new State();  // never destroyed: owners may die at exit
  return *s;
}

}  // namespace

const char* ObjectKindName(ObjectKind kind) {
  switch (kind) {
    case ObjectKind::kDevice:
      return "device";
    case ObjectKind::kCompChannel:
      return "comp_channel";
    case ObjectKind::kPd:
      return "pd";
    case ObjectKind::kCq:
      return "cq";
    case ObjectKind::kQp:
      return "qp";
    case ObjectKind::kMr:
      return "mr";
    case ObjectKind::kMw:
      return "mw";
    case ObjectKind::kCount:
      break;
  }
  return "?";
}

int64_t LiveCounts::total() const {
  int64_t t = 0;
  for (int64_t v : live) t += v;
  return t;
}

std::string LiveCounts::ToString() const {
  std::string s;
  for (size_t i = 0; i < live.size(); ++i) {
    absl::StrAppend(&s, ObjectKindName(static_cast<ObjectKind>(i)), "=", live[i], " ");
  }
  absl::StrAppend(&s, "destroy_failures=", destroy_failures,
                  " undrained_destroys=", undrained_destroys, " pinned_bytes=", pinned_bytes);
  return s;
}

LiveCounts Accounting::Snapshot() {
  State& s = GetState();
  LiveCounts c;
  {
    absl::MutexLock l(&s.mu);
    for (size_t i = 0; i < c.live.size(); ++i) c.live[i] = static_cast<int64_t>(s.live[i].size());
  }
  c.destroy_failures = s.destroy_failures.load();
  c.undrained_destroys = s.undrained_destroys.load();
  c.pinned_bytes = s.pinned_bytes.load();
  return c;
}

std::string Accounting::Report() {
  State& s = GetState();
  std::string out;
  absl::MutexLock l(&s.mu);
  for (size_t i = 0; i < s.live.size(); ++i) {
    // Sorted by label so reports are stable.
    std::multimap<std::string, const void*> sorted;
    for (const auto& [p, label] : s.live[i]) sorted.emplace(label, p);
    for (const auto& [label, p] : sorted) {
      absl::StrAppend(&out, ObjectKindName(static_cast<ObjectKind>(i)), " ", label, "\n");
    }
  }
  return out;
}

absl::Status Accounting::CheckNoLeaks() {
  LiveCounts c = Snapshot();
  if (c.total() == 0 && c.destroy_failures == 0 && c.pinned_bytes == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("verbs objects leaked or failed to destroy: ", c.ToString(), "\n", Report()));
}

void Accounting::ResetFailureCounters() {
  GetState().destroy_failures = 0;
  GetState().undrained_destroys = 0;
}

void Accounting::Created(ObjectKind kind, const void* obj, std::string label) {
  State& s = GetState();
  absl::MutexLock l(&s.mu);
  s.live[static_cast<size_t>(kind)][obj] = std::move(label);
}

void Accounting::Destroyed(ObjectKind kind, const void* obj) {
  State& s = GetState();
  absl::MutexLock l(&s.mu);
  s.live[static_cast<size_t>(kind)].erase(obj);
}

void Accounting::DestroyFailed(ObjectKind kind, const void* obj, absl::string_view why) {
  State& s = GetState();
  s.destroy_failures.fetch_add(1);
  std::string label;
  {
    absl::MutexLock l(&s.mu);
    auto& m = s.live[static_cast<size_t>(kind)];
    if (auto it = m.find(obj); it != m.end()) label = it->second;
  }
  LOG(ERROR) << "kvrdma: destroying " << ObjectKindName(kind) << " '" << label
             << "' failed: " << why << " (the object stays alive and counted)";
}

void Accounting::UndrainedDestroy() { GetState().undrained_destroys.fetch_add(1); }

void Accounting::Pinned(int64_t delta_bytes) {
  GetState().pinned_bytes.fetch_add(static_cast<uint64_t>(delta_bytes));
}

uint64_t Accounting::PinnedBytes() { return GetState().pinned_bytes.load(); }

}  // namespace kvnode::rdma
