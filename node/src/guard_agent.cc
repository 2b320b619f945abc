#include "guard_agent.h"

#include <utility>

#include "glog/logging.h"

namespace kvnode::node {

bool GuardWanted(const std::optional<cluster::MigrationPlan>& plan, std::string_view self,
                 const server::ShardView* view) {
  if (!plan.has_value()) return false;
  for (const cluster::SlotMove& m : plan->moves) {
    if (m.from != self) continue;
    if (plan->state == cluster::MigrationState::kRunning &&
        m.state == cluster::MoveState::kCopying) {
      return true;
    }
    if (m.state != cluster::MoveState::kDone || view == nullptr) continue;
    for (uint32_t s = m.first; s <= m.last; ++s) {
      if (view->Owns(s)) return true;  // the commit's map has not reached us yet
    }
  }
  return false;
}

void GuardAgent::OnPlan(const std::optional<cluster::MigrationPlan>& plan) {
  {
    AnnotatedLock l(&mu_);
    plan_ = plan;
  }
  Reconsider();
}

void GuardAgent::OnView(std::shared_ptr<const server::ShardView> view) {
  {
    AnnotatedLock l(&mu_);
    view_ = std::move(view);
  }
  Reconsider();
}

void GuardAgent::SetGuard(GuardFn guard) {
  {
    AnnotatedLock l(&mu_);
    guard_ = std::move(guard);
  }
  Reconsider();
}

bool GuardAgent::wanted() const {
  AnnotatedLock l(&mu_);
  return wanted_;
}

bool GuardAgent::held() const {
  AnnotatedLock l(&mu_);
  return held_;
}

void GuardAgent::Reconsider() {
  GuardFn guard;
  bool up = false;
  uint64_t ask = 0;
  {
    AnnotatedLock l(&mu_);
    wanted_ = GuardWanted(plan_, self_, view_.get());
    if (guard_ == nullptr || wanted_ == asked_) return;
    asked_ = up = wanted_;
    held_ = false;
    ask = ++asks_;
    guard = guard_;
    LOG(INFO) << "cluster: slot migration "
              << (plan_.has_value() ? plan_->migration_id : std::string("(none)")) << ": guard "
              << (up ? "up: a move takes slots from this node"
                     : "down: no move takes slots "
                       "from this node any more");
  }
  // Outside the lock: the answer may come at once, on this thread.
  guard(up, [this, up, ask](absl::Status st) {
    AnnotatedLock l(&mu_);
    if (ask != asks_) return;  // asked again since
    if (!st.ok()) {
      LOG(WARNING) << "cluster: the guard could not be raised: " << st
                   << " (asked again at the next plan or map)";
      asked_ = false;
      return;
    }
    held_ = up;
  });
}

}  // namespace kvnode::node
