#include "kvnode/cluster/roll.h"

#include <array>
#include <set>

#include "absl/strings/str_cat.h"
#include "json_fields.h"
#include "kvnode/base/errno.h"
#include "kvnode/proto/shard_map.h"
#include "nlohmann/json.hpp"
#include "plan_id.h"

namespace kvnode::cluster {
namespace {

using base::Av;
using nlohmann::json;

constexpr std::array<std::string_view, 4> kRollStates = {"running", "stopped", "aborted", "done"};
constexpr std::array<std::string_view, 5> kNodeStates = {"pending", "upgrading", "done",
                                                         "rolled_back", "failed"};

template <typename E, size_t N>
std::optional<E> ParseName(const std::array<std::string_view, N>& names, std::string_view name) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == name) return static_cast<E>(i);
  }
  return std::nullopt;
}

absl::StatusOr<RollNode> ReadNode(const JsonFields& plan, const json& j) {
  if (!j.is_object()) return plan.Bad("an entry of 'nodes' is not an object");
  JsonFields r = plan.Nested(j);
  RollNode n;
  std::string state;
  uint64_t started = 0, ended = 0;
  for (auto s : {r.String("node_id", &n.node_id), r.String("state", &state),
                 r.Uint("attempt", &n.attempt), r.Uint("from_generation", &n.from_generation),
                 r.Uint("to_generation", &n.to_generation), r.String("reason", &n.reason),
                 r.Uint("started_ms", &started), r.Uint("ended_ms", &ended)}) {
    if (!s.ok()) return s;
  }
  if (started > INT64_MAX || ended > INT64_MAX) return plan.Bad("a time out of range");
  n.started_ms = static_cast<int64_t>(started);
  n.ended_ms = static_cast<int64_t>(ended);
  if (auto s = proto::CheckName(n.node_id, proto::kMaxNodeIdSize, "node_id"); !s.ok()) {
    return plan.Bad(std::string(s.message()));
  }
  auto parsed = ParseRollNodeState(state);
  if (!parsed) return plan.Bad(absl::StrCat("node '", n.node_id, "': unknown state '", state, "'"));
  n.state = *parsed;
  return n;
}

absl::Status ReadPlan(const JsonFields& r, RollPlan* p) {
  std::string state;
  uint64_t max_unavailable = 0, gate_s = 0;
  for (auto s :
       {r.String("roll_id", &p->roll_id), r.String("binary", &p->binary),
        r.String("build_id", &p->build_id), r.Uint("max_unavailable", &max_unavailable),
        r.Uint("gate_s", &gate_s), r.String("state", &state), r.String("reason", &p->reason)}) {
    if (!s.ok()) return s;
  }
  if (p->roll_id.empty()) return r.Bad("empty roll_id");
  if (p->binary.empty() || p->binary[0] != '/') {
    return r.Bad(absl::StrCat("binary '", p->binary, "' is not an absolute path"));
  }
  if (max_unavailable < 1 || max_unavailable > 1024) {
    return r.Bad(absl::StrCat("max_unavailable ", max_unavailable, " is not within 1..1024"));
  }
  if (gate_s > 86400) return r.Bad(absl::StrCat("gate_s ", gate_s, " is above 86400"));
  p->max_unavailable = static_cast<uint32_t>(max_unavailable);
  p->gate_s = static_cast<uint32_t>(gate_s);
  auto parsed = ParseRollState(state);
  if (!parsed) return r.Bad(absl::StrCat("unknown state '", state, "'"));
  p->state = *parsed;
  auto nodes = r.obj.find("nodes");
  if (nodes == r.obj.end() || !nodes->is_array()) return r.Bad("field 'nodes' must be an array");
  std::set<std::string> seen;
  for (const json& j : *nodes) {
    auto n = ReadNode(r, j);
    if (!n.ok()) return n.status();
    if (!seen.insert(n->node_id).second)
      return r.Bad(absl::StrCat("node '", n->node_id, "' twice"));
    p->nodes.push_back(std::move(*n));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view RollStateName(RollState s) { return kRollStates[static_cast<size_t>(s)]; }
std::optional<RollState> ParseRollState(std::string_view name) {
  return ParseName<RollState>(kRollStates, name);
}
std::string_view RollNodeStateName(RollNodeState s) { return kNodeStates[static_cast<size_t>(s)]; }
std::optional<RollNodeState> ParseRollNodeState(std::string_view name) {
  return ParseName<RollNodeState>(kNodeStates, name);
}

RollNode* RollPlan::node(std::string_view node_id) {
  for (RollNode& n : nodes) {
    if (n.node_id == node_id) return &n;
  }
  return nullptr;
}
const RollNode* RollPlan::node(std::string_view node_id) const {
  return const_cast<RollPlan*>(this)->node(node_id);
}

std::string EncodeRollJson(const RollPlan& p) {
  json nodes = json::array();
  for (const RollNode& n : p.nodes) {
    nodes.push_back({{"node_id", n.node_id},
                     {"state", std::string(RollNodeStateName(n.state))},
                     {"attempt", n.attempt},
                     {"from_generation", n.from_generation},
                     {"to_generation", n.to_generation},
                     {"reason", n.reason},
                     {"started_ms", n.started_ms},
                     {"ended_ms", n.ended_ms}});
  }
  json j = {{"roll_id", p.roll_id},   {"binary", p.binary},
            {"build_id", p.build_id}, {"max_unavailable", p.max_unavailable},
            {"gate_s", p.gate_s},     {"state", std::string(RollStateName(p.state))},
            {"reason", p.reason},     {"nodes", std::move(nodes)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<RollPlan> DecodeRollJson(std::string_view text, std::string_view key) {
  auto obj = ParseJsonObject(text, kMaxRollJsonSize, "roll plan at", key);
  if (!obj.ok()) return obj.status();
  JsonFields r{*obj, "roll plan at", key, 4096};
  RollPlan plan;
  if (auto s = ReadPlan(r, &plan); !s.ok()) return s;
  return plan;
}

std::optional<RollIntent> ShouldAct(const RollPlan& plan, const Member& self,
                                    const std::optional<RollIntent>& acted) {
  if (plan.state != RollState::kRunning) return std::nullopt;
  const RollNode* entry = plan.node(self.node_id);
  if (entry == nullptr || entry->state != RollNodeState::kUpgrading) return std::nullopt;
  // The new process of this very upgrade, a restarted one, or a node that
  // got there by other means: nothing to do (kvctl judges it by the member).
  if (self.generation != entry->from_generation || self.build_id == plan.build_id) {
    return std::nullopt;
  }
  RollIntent intent{plan.roll_id, entry->attempt, plan.binary};
  if (acted && acted->roll_id == intent.roll_id && acted->attempt == intent.attempt) {
    return std::nullopt;
  }
  return intent;
}

RollVerdict Judge(const RollPlan& plan, const RollNode& entry,
                  const std::optional<Member>& member) {
  RollVerdict v;
  if (!member) return v;  // down: maybe restarting; the caller's deadline decides
  const Member& m = *member;
  if (m.build_id == plan.build_id) {
    if (m.state == MemberState::kServing) {
      v.state = RollNodeState::kDone;
      v.to_generation = m.generation;
    }
    return v;
  }
  if (m.roll && m.roll->id == plan.roll_id && m.roll->attempt == entry.attempt) {
    v.state =
        m.roll->outcome == "rolled_back" ? RollNodeState::kRolledBack : RollNodeState::kFailed;
    v.reason = absl::StrCat(m.roll->outcome == "rolled_back" ? "rolled back: " : "refused: ",
                            m.roll->reason);
    return v;
  }
  if (m.generation != entry.from_generation && m.state == MemberState::kServing) {
    v.state = RollNodeState::kFailed;
    v.reason =
        absl::StrCat("the node serves generation ", m.generation, " with build '", m.build_id,
                     "', not '", plan.build_id, "' (restarted, or upgraded outside the roll)");
  }
  return v;
}

std::string NewRollId() { return NewPlanId("r"); }

}  // namespace kvnode::cluster
