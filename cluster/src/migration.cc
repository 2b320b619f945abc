#include "kvnode/cluster/migration.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "json_fields.h"
#include "kvnode/base/errno.h"
#include "nlohmann/json.hpp"
#include "plan_id.h"

namespace kvnode::cluster {
namespace {

using base::Av;
using nlohmann::json;
using proto::MapNode;
using proto::ShardMap;
using proto::SlotRange;

constexpr std::array<std::string_view, 3> kKinds = {"add_node", "remove_node", "rebalance"};
constexpr std::array<std::string_view, 4> kPlanStates = {"running", "stopped", "aborted", "done"};
constexpr std::array<std::string_view, 5> kMoveStates = {"pending", "copying", "done", "aborted",
                                                         "failed"};

template <typename E, size_t N>
std::optional<E> ParseName(const std::array<std::string_view, N>& names, std::string_view name) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == name) return static_cast<E>(i);
  }
  return std::nullopt;
}

absl::Status Refuse(std::string_view why) { return absl::InvalidArgumentError(Av(why)); }

// Owner (index into nodes) of each slot of a valid map.
using Owners = std::vector<uint16_t>;

Owners OwnersOf(const ShardMap& map) {
  Owners owners(map.num_slots);
  for (size_t i = 0; i < map.ranges.size(); ++i) {
    const uint32_t end = i + 1 < map.ranges.size() ? map.ranges[i + 1].first_slot : map.num_slots;
    std::fill(owners.begin() + map.ranges[i].first_slot, owners.begin() + end, map.ranges[i].node);
  }
  return owners;
}

// The fewest ranges that give each slot its owner: neighbours of one owner
// merged.
std::vector<SlotRange> RangesOf(const Owners& owners) {
  std::vector<SlotRange> ranges;
  for (uint32_t s = 0; s < owners.size(); ++s) {
    if (ranges.empty() || ranges.back().node != owners[s]) ranges.push_back({s, owners[s]});
  }
  return ranges;
}

std::vector<uint32_t> Counts(const Owners& owners, size_t nodes) {
  std::vector<uint32_t> counts(nodes, 0);
  for (uint16_t o : owners) ++counts[o];
  return counts;
}

// `map` with the nodes `nodes` and owners `owners` (indexes into `nodes`),
// `drop` removed from the nodes when set (it must own no slot).
ShardMap WithOwners(const ShardMap& map, std::vector<MapNode> nodes, Owners owners,
                    std::optional<uint16_t> drop) {
  ShardMap out = map;
  if (drop) {
    nodes.erase(nodes.begin() + *drop);
    for (uint16_t& o : owners) o -= o > *drop ? 1 : 0;
  }
  out.nodes = std::move(nodes);
  out.ranges = RangesOf(owners);
  return out;
}

absl::Status CheckInputs(const ShardMap& map, const MigrationOptions& options) {
  if (auto s = options.Validate(); !s.ok()) return s;
  if (auto s = map.Validate(); !s.ok()) {
    return Refuse(absl::StrCat("the map does not validate: ", s.message()));
  }
  return absl::OkStatus();
}

// Appends slots first..last from -> to in pieces of at most `max` slots of
// even size (the first ones one larger).
void AppendChunks(uint32_t first, uint32_t last, const std::string& from, const std::string& to,
                  uint32_t max, std::vector<SlotMove>* moves) {
  const uint32_t len = last - first + 1;
  const uint32_t pieces = (len + max - 1) / max;
  uint32_t next = first;
  for (uint32_t i = 0; i < pieces; ++i) {
    const uint32_t size = len / pieces + (i < len % pieces ? 1 : 0);
    SlotMove m;
    m.first = next;
    m.last = next + size - 1;
    m.from = from;
    m.to = to;
    moves->push_back(std::move(m));
    next += size;
  }
}

// The plan that turns `before` into `after` (both indexes into `nodes`, the
// map's nodes plus the one an add_node plan adds), and its target. Moves
// are exactly the slots whose owner differs (invariant 1 of migration.h),
// each run of one (from, to) pair cut at most max long (3); the target is
// built from `after` merged and validated (4).
absl::StatusOr<Migration> Finish(const ShardMap& map, MigrationKind kind, std::string_view node,
                                 const std::vector<MapNode>& nodes, const Owners& before,
                                 const Owners& after, std::optional<uint16_t> drop,
                                 const MigrationOptions& options) {
  Migration m;
  m.plan.kind = kind;
  m.plan.node = std::string(node);
  m.plan.rate_mb_s = options.rate_mb_s;
  m.plan.from_epoch = map.epoch;
  for (uint32_t s = 0; s < before.size();) {
    if (before[s] == after[s]) {
      ++s;
      continue;
    }
    uint32_t end = s;
    while (end + 1 < before.size() && before[end + 1] == before[s] && after[end + 1] == after[s]) {
      ++end;
    }
    AppendChunks(s, end, nodes[before[s]].node_id, nodes[after[s]].node_id,
                 options.max_slots_per_move, &m.plan.moves);
    s = end + 1;
  }
  m.target = WithOwners(map, nodes, after, drop);
  if (auto s = m.target.Validate(); !s.ok()) {
    return Refuse(absl::StrCat("the target map would not validate: ", s.message()));
  }
  return m;
}

// The node ids of `map`, "a, b, c".
std::string NodeList(const ShardMap& map) {
  std::vector<std::string> ids;
  for (const MapNode& n : map.nodes) ids.push_back(n.node_id);
  return absl::StrJoin(ids, ", ");
}

absl::StatusOr<SlotMove> ReadMove(const JsonFields& plan, const json& j) {
  if (!j.is_object()) return plan.Bad("an entry of 'moves' is not an object");
  JsonFields r = plan.Nested(j);
  SlotMove m;
  uint64_t first = 0, last = 0;
  std::string state;
  for (auto s :
       {r.Uint("first", &first), r.Uint("last", &last), r.String("from", &m.from),
        r.String("to", &m.to), r.String("state", &state), r.Uint("attempt", &m.attempt),
        r.Uint("keys", &m.keys), r.Uint("bytes", &m.bytes), r.String("reason", &m.reason)}) {
    if (!s.ok()) return s;
  }
  if (first > last || last >= proto::kMaxSlots) {
    return plan.Bad(absl::StrCat("move of slots ", first, "..", last, ": not a range within 0..",
                                 proto::kMaxSlots - 1));
  }
  m.first = static_cast<uint32_t>(first);
  m.last = static_cast<uint32_t>(last);
  for (const auto& [id, what] : {std::pair{&m.from, "from"}, std::pair{&m.to, "to"}}) {
    if (auto s = proto::CheckName(*id, proto::kMaxNodeIdSize, what); !s.ok()) {
      return plan.Bad(absl::StrCat("move of slots ", first, "..", last, ": ", s.message()));
    }
  }
  if (m.from == m.to) {
    return plan.Bad(
        absl::StrCat("move of slots ", first, "..", last, " from '", m.from, "' to itself"));
  }
  auto parsed = ParseMoveState(state);
  if (!parsed) {
    return plan.Bad(
        absl::StrCat("move of slots ", first, "..", last, ": unknown state '", state, "'"));
  }
  m.state = *parsed;
  return m;
}

// Moves of one node's plan all to (add_node) or from (remove_node) it; no
// two moves share a slot.
absl::Status CheckMoves(const JsonFields& r, const MigrationPlan& p) {
  for (const SlotMove& m : p.moves) {
    if (p.kind == MigrationKind::kAddNode && m.to != p.node) {
      return r.Bad(absl::StrCat("move of slots ", m.first, "..", m.last, " to '", m.to,
                                "' in a plan that adds '", p.node, "'"));
    }
    if (p.kind == MigrationKind::kRemoveNode && m.from != p.node) {
      return r.Bad(absl::StrCat("move of slots ", m.first, "..", m.last, " from '", m.from,
                                "' in a plan that removes '", p.node, "'"));
    }
  }
  std::vector<const SlotMove*> sorted;
  for (const SlotMove& m : p.moves) sorted.push_back(&m);
  std::sort(sorted.begin(), sorted.end(),
            [](const SlotMove* a, const SlotMove* b) { return a->first < b->first; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->first <= sorted[i - 1]->last) {
      return r.Bad(absl::StrCat("moves of slots ", sorted[i - 1]->first, "..", sorted[i - 1]->last,
                                " and ", sorted[i]->first, "..", sorted[i]->last, " overlap"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadPlan(const JsonFields& r, MigrationPlan* p) {
  std::string kind, state;
  for (auto s :
       {r.String("migration_id", &p->migration_id), r.String("kind", &kind),
        r.String("node", &p->node), r.Uint("rate_mb_s", &p->rate_mb_s), r.String("state", &state),
        r.String("reason", &p->reason), r.Uint("from_epoch", &p->from_epoch)}) {
    if (!s.ok()) return s;
  }
  if (p->migration_id.empty()) return r.Bad("empty migration_id");
  auto parsed_kind = ParseMigrationKind(kind);
  if (!parsed_kind) return r.Bad(absl::StrCat("unknown kind '", kind, "'"));
  p->kind = *parsed_kind;
  if (p->kind == MigrationKind::kRebalance) {
    if (!p->node.empty()) return r.Bad("a rebalance names no node, but 'node' is set");
  } else if (auto s = proto::CheckName(p->node, proto::kMaxNodeIdSize, "node"); !s.ok()) {
    return r.Bad(std::string(s.message()));
  }
  auto parsed_state = ParseMigrationState(state);
  if (!parsed_state) return r.Bad(absl::StrCat("unknown state '", state, "'"));
  p->state = *parsed_state;
  if (p->from_epoch == 0) return r.Bad("from_epoch is 0");
  auto moves = r.obj.find("moves");
  if (moves == r.obj.end() || !moves->is_array()) return r.Bad("field 'moves' must be an array");
  for (const json& j : *moves) {
    auto m = ReadMove(r, j);
    if (!m.ok()) return m.status();
    p->moves.push_back(std::move(*m));
  }
  return CheckMoves(r, *p);
}

}  // namespace

std::string_view MigrationKindName(MigrationKind k) { return kKinds[static_cast<size_t>(k)]; }
std::optional<MigrationKind> ParseMigrationKind(std::string_view name) {
  return ParseName<MigrationKind>(kKinds, name);
}
std::string_view MigrationStateName(MigrationState s) {
  return kPlanStates[static_cast<size_t>(s)];
}
std::optional<MigrationState> ParseMigrationState(std::string_view name) {
  return ParseName<MigrationState>(kPlanStates, name);
}
std::string_view MoveStateName(MoveState s) { return kMoveStates[static_cast<size_t>(s)]; }
std::optional<MoveState> ParseMoveState(std::string_view name) {
  return ParseName<MoveState>(kMoveStates, name);
}

absl::Status MigrationOptions::Validate() const {
  if (max_slots_per_move < 1 || max_slots_per_move > proto::kMaxSlots) {
    return Refuse(absl::StrCat("--max_slots_per_move ", max_slots_per_move, " is not within 1..",
                               proto::kMaxSlots));
  }
  if (rate_mb_s > 1'000'000) {
    return Refuse(absl::StrCat("--rate_mb_s ", rate_mb_s, " is above 1000000 (0: unthrottled)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Migration> PlanAddNode(const ShardMap& map, std::string_view new_id,
                                      const MigrationOptions& options) {
  if (auto s = CheckInputs(map, options); !s.ok()) return s;
  if (auto s = proto::CheckName(new_id, proto::kMaxNodeIdSize, "node id"); !s.ok()) return s;
  if (map.IndexOf(new_id)) {
    return Refuse(
        absl::StrCat("node '", Av(new_id), "' is in the map already (nodes: ", NodeList(map), ")"));
  }
  const size_t n = map.nodes.size();
  if (n >= proto::kMaxMapNodes) {
    return Refuse(absl::StrCat("the map has ", n, " nodes, the most a map holds"));
  }
  const uint32_t slots = map.num_slots;
  if (slots < n + 1) {
    return Refuse(absl::StrCat("the map's ", slots, " slots leave none for node '", Av(new_id),
                               "' among ", n + 1, " nodes"));
  }
  const Owners before = OwnersOf(map);
  const std::vector<uint32_t> counts = Counts(before, n);
  // Each node gives counts[i] * total / slots, rounded by largest remainder
  // so that the gifts add up to total exactly.
  const uint64_t total = slots / (n + 1);
  std::vector<uint32_t> give(n);
  std::vector<uint64_t> rest(n);
  uint64_t given = 0;
  for (size_t i = 0; i < n; ++i) {
    give[i] = static_cast<uint32_t>(counts[i] * total / slots);
    rest[i] = counts[i] * total % slots;
    given += give[i];
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rest[a] > rest[b]; });
  for (size_t k = 0; given < total; ++k, ++given) ++give[order[k]];
  // From the end of each node's ranges.
  const uint16_t added = static_cast<uint16_t>(n);
  Owners after = before;
  for (uint32_t s = slots; s-- > 0;) {
    if (give[before[s]] > 0) {
      --give[before[s]];
      after[s] = added;
    }
  }
  std::vector<MapNode> nodes = map.nodes;
  nodes.emplace_back().node_id = std::string(new_id);
  return Finish(map, MigrationKind::kAddNode, new_id, nodes, before, after, std::nullopt, options);
}

absl::StatusOr<Migration> PlanRemoveNode(const ShardMap& map, std::string_view id,
                                         const MigrationOptions& options) {
  if (auto s = CheckInputs(map, options); !s.ok()) return s;
  std::optional<uint16_t> gone = map.IndexOf(id);
  if (!gone) {
    return Refuse(
        absl::StrCat("node '", Av(id), "' is not in the map (nodes: ", NodeList(map), ")"));
  }
  if (map.nodes.size() == 1) {
    return Refuse(
        absl::StrCat("node '", Av(id), "' is the map's last node: a cluster keeps at least one"));
  }
  const size_t n = map.nodes.size();
  const Owners before = OwnersOf(map);
  std::vector<uint32_t> counts = Counts(before, n);
  // Water-filling: each slot to the receiver with the fewest so far.
  std::vector<uint32_t> take(n, 0);
  for (uint32_t k = 0; k < counts[*gone]; ++k) {
    size_t best = n;
    for (size_t i = 0; i < n; ++i) {
      if (i != *gone && (best == n || counts[i] + take[i] < counts[best] + take[best])) best = i;
    }
    ++take[best];
  }
  // Pieces in slot order; the first to the node before the removed one's
  // first slot and the last to the node after its last, where they merge.
  std::vector<uint16_t> order;
  auto first = std::find(before.begin(), before.end(), *gone);
  auto last = std::find(before.rbegin(), before.rend(), *gone);
  std::optional<uint16_t> prev, next;
  if (first != before.end() && first != before.begin()) prev = *std::prev(first);
  if (last != before.rend() && last != before.rbegin()) next = *std::prev(last);
  if (prev) order.push_back(*prev);
  for (uint16_t i = 0; i < n; ++i) {
    if (i != *gone && i != prev && i != next) order.push_back(i);
  }
  if (next && next != prev) order.push_back(*next);
  Owners after = before;
  size_t k = 0;
  for (uint32_t s = 0; s < map.num_slots; ++s) {
    if (before[s] != *gone) continue;
    while (take[order[k]] == 0) ++k;
    --take[order[k]];
    after[s] = order[k];
  }
  return Finish(map, MigrationKind::kRemoveNode, id, map.nodes, before, after, gone, options);
}

absl::StatusOr<Migration> PlanRebalance(const ShardMap& map, const MigrationOptions& options) {
  if (auto s = CheckInputs(map, options); !s.ok()) return s;
  const size_t n = map.nodes.size();
  const Owners before = OwnersOf(map);
  const std::vector<uint32_t> counts = Counts(before, n);
  // The nodes that own most keep the slots / n + 1 shares: the fewest moves.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return counts[a] > counts[b]; });
  std::vector<uint32_t> share(n, map.num_slots / static_cast<uint32_t>(n));
  for (size_t k = 0; k < map.num_slots % n; ++k) ++share[order[k]];
  std::vector<uint32_t> excess(n, 0), need(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (counts[i] > share[i]) excess[i] = counts[i] - share[i];
    if (counts[i] < share[i]) need[i] = share[i] - counts[i];
  }
  // Each excess from the end of its node's ranges, handed out in slot order.
  std::vector<bool> moving(map.num_slots, false);
  for (uint32_t s = map.num_slots; s-- > 0;) {
    if (excess[before[s]] > 0) {
      --excess[before[s]];
      moving[s] = true;
    }
  }
  Owners after = before;
  size_t to = 0;
  for (uint32_t s = 0; s < map.num_slots; ++s) {
    if (!moving[s]) continue;
    while (need[to] == 0) ++to;
    --need[to];
    after[s] = static_cast<uint16_t>(to);
  }
  return Finish(map, MigrationKind::kRebalance, "", map.nodes, before, after, std::nullopt,
                options);
}

absl::StatusOr<ShardMap> ApplyMove(const ShardMap& map, const MigrationPlan& plan,
                                   const SlotMove& move) {
  if (auto s = map.Validate(); !s.ok()) {
    return Refuse(absl::StrCat("the map does not validate: ", s.message()));
  }
  const std::string what = absl::StrCat("move of slots ", move.first, "..", move.last, " from '",
                                        move.from, "' to '", move.to, "'");
  if (move.first > move.last || move.last >= map.num_slots) {
    return Refuse(absl::StrCat(what, ": outside the map's ", map.num_slots, " slots"));
  }
  if (move.from == move.to) return Refuse(absl::StrCat(what, ": to its own node"));
  std::optional<uint16_t> from = map.IndexOf(move.from);
  if (!from) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": '", move.from, "' is not in the map"));
  }
  std::vector<MapNode> nodes = map.nodes;
  std::optional<uint16_t> to = map.IndexOf(move.to);
  if (!to) {
    if (plan.kind != MigrationKind::kAddNode || move.to != plan.node) {
      return Refuse(
          absl::StrCat(what, ": '", move.to, "' is not in the map, nor the node the plan adds"));
    }
    to = static_cast<uint16_t>(nodes.size());
    nodes.emplace_back().node_id = move.to;
  }
  // Invariant 2: a planned move's slots are all `from`'s in every map on
  // the way, whatever the order; anything else is not this plan's map.
  Owners owners = OwnersOf(map);
  for (uint32_t s = move.first; s <= move.last; ++s) {
    if (owners[s] != *from) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": slot ", s, " is owned by '", map.nodes[owners[s]].node_id, "', not '", move.from,
          "' (the move is applied already, or the plan is of another map)"));
    }
    owners[s] = *to;
  }
  std::optional<uint16_t> drop;
  if (plan.kind == MigrationKind::kRemoveNode) {
    std::optional<uint16_t> gone = map.IndexOf(plan.node);
    if (gone && Counts(owners, nodes.size())[*gone] == 0) drop = gone;
  }
  ShardMap out = WithOwners(map, std::move(nodes), std::move(owners), drop);
  if (auto s = out.Validate(); !s.ok()) {
    return Refuse(absl::StrCat(what, ": the map after it would not validate: ", s.message()));
  }
  return out;
}

std::string EncodeMigrationJson(const MigrationPlan& p) {
  json moves = json::array();
  for (const SlotMove& m : p.moves) {
    moves.push_back({{"first", m.first},
                     {"last", m.last},
                     {"from", m.from},
                     {"to", m.to},
                     {"state", std::string(MoveStateName(m.state))},
                     {"attempt", m.attempt},
                     {"keys", m.keys},
                     {"bytes", m.bytes},
                     {"reason", m.reason}});
  }
  json j = {{"migration_id", p.migration_id},
            {"kind", std::string(MigrationKindName(p.kind))},
            {"node", p.node},
            {"rate_mb_s", p.rate_mb_s},
            {"state", std::string(MigrationStateName(p.state))},
            {"reason", p.reason},
            {"from_epoch", p.from_epoch},
            {"moves", std::move(moves)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<MigrationPlan> DecodeMigrationJson(std::string_view text, std::string_view key) {
  auto obj = ParseJsonObject(text, kMaxMigrationJsonSize, "migration plan at", key);
  if (!obj.ok()) return obj.status();
  JsonFields r{*obj, "migration plan at", key, 4096};
  MigrationPlan plan;
  if (auto s = ReadPlan(r, &plan); !s.ok()) return s;
  return plan;
}

std::string NewMigrationId() { return NewPlanId("m"); }

}  // namespace kvnode::cluster
