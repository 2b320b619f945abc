#include "kvnode/cluster/member.h"

#include <array>
#include <cstdint>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "json_fields.h"
#include "kvnode/base/errno.h"
#include "nlohmann/json.hpp"

namespace kvnode::cluster {
namespace {

using base::Av;
using nlohmann::json;

constexpr std::array<std::string_view, 4> kStateNames = {"starting", "serving", "draining",
                                                         "upgrading"};

constexpr std::array<std::string_view, 2> kMoveReportStateNames = {"copying", "failed"};

absl::Status ReadMigration(const JsonFields& r, const json& j, Member* m) {
  if (!j.is_object()) return r.Bad("field 'migration' must be an object");
  JsonFields mr = r.Nested(j);
  MigrationReport report;
  uint64_t first = 0;
  std::string state;
  for (auto s :
       {mr.String("id", &report.id), mr.Uint("first", &first), mr.Uint("attempt", &report.attempt),
        mr.String("state", &state), mr.Uint("keys", &report.keys), mr.Uint("bytes", &report.bytes),
        mr.String("reason", &report.reason)}) {
    if (!s.ok()) return s;
  }
  if (first >= proto::kMaxSlots) {
    return r.Bad(absl::StrCat("migration.first ", first, " is beyond the last slot"));
  }
  report.first = static_cast<uint32_t>(first);
  auto parsed = ParseMoveReportState(state);
  if (!parsed) return r.Bad(absl::StrCat("unknown migration.state '", state, "'"));
  report.state = *parsed;
  m->migration = std::move(report);
  return absl::OkStatus();
}

// "health", "roll" and "migration": absent in a member of an older build.
absl::Status ReadOptional(const JsonFields& r, Member* m) {
  if (auto it = r.obj.find("health"); it != r.obj.end()) {
    if (!it->is_object()) return r.Bad("field 'health' must be an object");
    JsonFields h = r.Nested(*it);
    MemberHealth health;
    for (auto s : {h.Uint("rejected", &health.rejected), h.Uint("qp_errors", &health.qp_errors),
                   h.Uint("upgrade_failures", &health.upgrade_failures)}) {
      if (!s.ok()) return s;
    }
    m->health = health;
  }
  if (auto it = r.obj.find("roll"); it != r.obj.end()) {
    if (!it->is_object()) return r.Bad("field 'roll' must be an object");
    JsonFields rr = r.Nested(*it);
    RollReport roll;
    for (auto s : {rr.String("id", &roll.id), rr.Uint("attempt", &roll.attempt),
                   rr.String("outcome", &roll.outcome), rr.String("reason", &roll.reason)}) {
      if (!s.ok()) return s;
    }
    m->roll = std::move(roll);
  }
  if (auto it = r.obj.find("migration"); it != r.obj.end()) return ReadMigration(r, *it, m);
  return absl::OkStatus();
}

absl::Status ReadFields(const JsonFields& r, Member* m) {
  std::string state;
  uint64_t pid = 0;
  for (auto s : {r.String("node_id", &m->node_id), r.String("endpoint", &m->endpoint),
                 r.Uint("generation", &m->generation), r.String("build_id", &m->build_id),
                 r.String("version", &m->version), r.String("state", &state), r.Uint("pid", &pid),
                 r.String("instance", &m->instance)}) {
    if (!s.ok()) return s;
  }
  if (pid > INT32_MAX) return r.Bad(absl::StrCat("pid ", pid, " out of range"));
  m->pid = static_cast<int64_t>(pid);
  auto parsed = ParseMemberState(state);
  if (!parsed) return r.Bad(absl::StrCat("unknown state '", state, "'"));
  m->state = *parsed;
  return ReadOptional(r, m);
}

}  // namespace

std::string_view MemberStateName(MemberState state) {
  return kStateNames[static_cast<size_t>(state)];
}

std::optional<MemberState> ParseMemberState(std::string_view name) {
  for (size_t i = 0; i < kStateNames.size(); ++i) {
    if (kStateNames[i] == name) return static_cast<MemberState>(i);
  }
  return std::nullopt;
}

std::string_view MoveReportStateName(MoveReportState state) {
  return kMoveReportStateNames[static_cast<size_t>(state)];
}

std::optional<MoveReportState> ParseMoveReportState(std::string_view name) {
  for (size_t i = 0; i < kMoveReportStateNames.size(); ++i) {
    if (kMoveReportStateNames[i] == name) return static_cast<MoveReportState>(i);
  }
  return std::nullopt;
}

std::string EncodeMemberJson(const Member& m) {
  json j = {{"node_id", m.node_id},
            {"endpoint", m.endpoint},
            {"generation", m.generation},
            {"build_id", m.build_id},
            {"version", m.version},
            {"state", std::string(MemberStateName(m.state))},
            {"pid", m.pid},
            {"instance", m.instance}};
  if (m.health) {
    j["health"] = {{"rejected", m.health->rejected},
                   {"qp_errors", m.health->qp_errors},
                   {"upgrade_failures", m.health->upgrade_failures}};
  }
  if (m.roll) {
    j["roll"] = {{"id", m.roll->id},
                 {"attempt", m.roll->attempt},
                 {"outcome", m.roll->outcome},
                 {"reason", m.roll->reason}};
  }
  if (m.migration) {
    j["migration"] = {{"id", m.migration->id},
                      {"first", m.migration->first},
                      {"attempt", m.migration->attempt},
                      {"state", std::string(MoveReportStateName(m.migration->state))},
                      {"keys", m.migration->keys},
                      {"bytes", m.migration->bytes},
                      {"reason", m.migration->reason}};
  }
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<Member> DecodeMemberJson(std::string_view text, std::string_view key,
                                        std::string_view expected_node_id) {
  auto obj = ParseJsonObject(text, kMaxMemberJsonSize, "member at", key);
  if (!obj.ok()) return obj.status();
  JsonFields r{*obj, "member at", key, kMaxMemberFieldSize};
  Member m;
  if (auto s = ReadFields(r, &m); !s.ok()) return s;
  if (auto s = proto::CheckName(m.node_id, proto::kMaxNodeIdSize, "node_id"); !s.ok()) {
    return r.Bad(std::string(s.message()));
  }
  if (!expected_node_id.empty() && m.node_id != expected_node_id) {
    return r.Bad(absl::StrCat("node_id '", m.node_id, "' does not match the key"));
  }
  return m;
}

proto::ShardMap Assemble(const proto::ShardMap& stored, const std::vector<Member>& live) {
  std::unordered_map<std::string_view, const Member*> by_id;
  for (const Member& m : live) by_id[m.node_id] = &m;
  proto::ShardMap map = stored;
  for (proto::MapNode& n : map.nodes) {
    auto it = by_id.find(n.node_id);
    n.alive = it != by_id.end();
    n.endpoint = n.alive ? it->second->endpoint : "";
    n.generation = n.alive ? it->second->generation : 0;
  }
  return map;
}

}  // namespace kvnode::cluster
