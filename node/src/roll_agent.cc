#include "roll_agent.h"

#include <algorithm>
#include <utility>

#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace kvnode::node {

void RollAgent::OnPlan(const std::optional<cluster::RollPlan>& plan) {
  {
    AnnotatedLock l(&mu_);
    plan_ = plan;
  }
  Act();
}

void RollAgent::SetUpgrade(UpgradeFn upgrade) {
  {
    AnnotatedLock l(&mu_);
    upgrade_ = std::move(upgrade);
  }
  Act();
}

void RollAgent::Act() {
  const cluster::Member self = self_();
  std::optional<cluster::RollIntent> intent;
  UpgradeFn upgrade;
  {
    AnnotatedLock l(&mu_);
    if (!plan_ || !upgrade_) return;
    intent = cluster::ShouldAct(*plan_, self, acted_);
    if (!intent) return;
    acted_ = intent;  // invariant 1
    upgrade = upgrade_;
  }
  LOG(INFO) << "roll " << intent->roll_id << " (attempt " << intent->attempt
            << "): this node's turn: live upgrade from generation " << self.generation
            << ", build '" << self.build_id << "' to " << intent->binary;
  upgrade(intent->binary, [this, intent = *intent](std::string answer) { Finish(intent, answer); });
}

void RollAgent::Finish(const cluster::RollIntent& intent, const std::string& answer) {
  nlohmann::json j = nlohmann::json::parse(answer, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.value("ok", false)) {
    LOG(INFO) << "roll " << intent.roll_id << ": upgraded; the new process serves";
    return;
  }
  cluster::RollReport r;
  r.id = intent.roll_id;
  r.attempt = intent.attempt;
  // A rollback's answer names the upgrade; a refusal has only an error.
  const bool rolled_back = j.is_object() && j.value("upgrade", "") == "rolled_back";
  r.outcome = rolled_back ? "rolled_back" : "refused";
  r.reason = j.is_object() ? j.value(rolled_back ? "reason" : "error", "") : "";
  if (r.reason.empty()) r.reason = answer;
  if (r.reason.size() > cluster::kMaxMemberFieldSize) {
    size_t n = cluster::kMaxMemberFieldSize;
    while (n > 0 && (static_cast<unsigned char>(r.reason[n]) & 0xC0) == 0x80) --n;  // UTF-8
    r.reason.resize(n);
  }
  while (!r.reason.empty() && (r.reason.back() == '\n' || r.reason.back() == ' ')) {
    r.reason.pop_back();
  }
  LOG(WARNING) << "roll " << intent.roll_id << " (attempt " << intent.attempt << "): " << r.outcome
               << ": " << r.reason << " (reported in the member key)";
  report_(std::move(r));
}

}  // namespace kvnode::node
