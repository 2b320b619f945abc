#include "kvnode/load/report.h"

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace kvnode::load {
namespace {

double Us(uint64_t ns) { return static_cast<double>(ns) / 1000.0; }
double Ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }

// Completions in `t` strictly inside (start_ns, end_ns), counting only slots
// that lie wholly inside (the timeline keeps no finer times).
uint64_t CompletionsInside(const Timeline& t, uint64_t start_ns, uint64_t end_ns) {
  uint64_t n = 0;
  for (const Timeline::Slot& s : t.slots()) {
    if (s.ops > 0 && s.first_ns > start_ns && s.last_ns < end_ns) n += s.ops;
  }
  return n;
}

nlohmann::json LatencyJson(const LatencyHistogram& h) {
  return {{"p50", Us(h.Percentile(50))},    {"p99", Us(h.Percentile(99))},
          {"p999", Us(h.Percentile(99.9))}, {"max", Us(h.max())},
          {"mean", h.mean() / 1000.0},      {"count", h.count()}};
}

}  // namespace

uint64_t LoadStats::verify_errors() const {
  uint64_t n = 0;
  for (uint64_t v : verdicts) n += v;
  return n;
}

void LoadStats::RecordCompletion(OpType op, uint64_t start_ns, uint64_t end_ns, bool nf) {
  const uint64_t latency = end_ns >= start_ns ? end_ns - start_ns : 0;
  if (op == OpType::kRead) {
    ++reads;
    if (nf) ++not_found;
    read_latency.Record(latency);
    read_timeline.Record(end_ns, latency);
  } else {
    ++writes;
    if (op == OpType::kDelete) ++deletes;
    write_latency.Record(latency);
    write_timeline.Record(end_ns, latency);
  }
  timeline.Record(end_ns, latency);
}

void LoadStats::Merge(const LoadStats& o) {
  reads += o.reads;
  writes += o.writes;
  deletes += o.deletes;
  not_found += o.not_found;
  failed_ops += o.failed_ops;
  shard_unavailable += o.shard_unavailable;
  reads_while_writes_held += o.reads_while_writes_held;
  for (size_t i = 0; i < verdicts.size(); ++i) verdicts[i] += o.verdicts[i];
  read_latency.Merge(o.read_latency);
  write_latency.Merge(o.write_latency);
  timeline.Merge(o.timeline);
  read_timeline.Merge(o.read_timeline);
  write_timeline.Merge(o.write_timeline);
}

std::string FormatProgressLine(double elapsed_s, double interval_s, const LoadStats& now,
                               const LoadStats& before) {
  LatencyHistogram interval = now.read_latency;
  interval.Merge(now.write_latency);
  LatencyHistogram earlier = before.read_latency;
  earlier.Merge(before.write_latency);
  interval.Subtract(earlier);
  const uint64_t ops = now.ops() >= before.ops() ? now.ops() - before.ops() : 0;
  const double rate = interval_s > 0 ? static_cast<double>(ops) / interval_s : 0;
  return absl::StrFormat(
      "[%5.0fs] %8.0f ops/s  p50 %7.1fus  p99 %7.1fus  failed %d  verify_err %d  stale %d",
      elapsed_s, rate, Us(interval.Percentile(50)), Us(interval.Percentile(99)), now.failed_ops,
      now.verify_errors(), now.stale_reads());
}

nlohmann::json BuildReport(const LoadStats& s, double duration_s, const nlohmann::json& config) {
  LatencyHistogram all = s.read_latency;
  all.Merge(s.write_latency);
  nlohmann::json latency = LatencyJson(all);
  latency["read"] = LatencyJson(s.read_latency);
  latency["write"] = LatencyJson(s.write_latency);

  nlohmann::json verify = nlohmann::json::object();
  for (int v = 1; v < kReadVerdictCount; ++v) {
    verify[std::string(ReadVerdictName(static_cast<ReadVerdict>(v)))] = s.verdicts[v];
  }

  nlohmann::json timeline = nlohmann::json::array();
  const double slot_ms = static_cast<double>(s.timeline.slot_ns()) / 1e6;
  const auto& slots = s.timeline.slots();
  const auto& read_slots = s.read_timeline.slots();
  const auto& write_slots = s.write_timeline.slots();
  for (size_t i = 0; i < slots.size(); ++i) {
    timeline.push_back({{"t_ms", static_cast<double>(i) * slot_ms},
                        {"ops", slots[i].ops},
                        {"reads", i < read_slots.size() ? read_slots[i].ops : 0},
                        {"writes", i < write_slots.size() ? write_slots[i].ops : 0},
                        {"max_latency_us", Us(slots[i].max_latency_ns)}});
  }
  const Gap gap = LongestGap(s.timeline);
  const Gap read_gap = LongestGap(s.read_timeline);
  const Gap write_gap = LongestGap(s.write_timeline);

  nlohmann::json j = {
      {"ops", s.ops()},
      {"reads", s.reads},
      {"writes", s.writes},
      {"deletes", s.deletes},
      {"not_found", s.not_found},
      {"failed_ops", s.failed_ops},
      {"shard_unavailable", s.shard_unavailable},
      {"verify_errors", s.verify_errors()},
      {"stale_reads", s.stale_reads()},
      {"verify", std::move(verify)},
      {"duration_s", duration_s},
      {"ops_per_s", duration_s > 0 ? static_cast<double>(s.ops()) / duration_s : 0.0},
      {"latency_us", std::move(latency)},
      {"blackout_ms", static_cast<double>(gap.gap_ns) / 1e6},
      {"blackout_start_ms", static_cast<double>(gap.start_ns) / 1e6},
      {"blackout_read_ms", Ms(read_gap.gap_ns)},
      {"blackout_write_ms", Ms(write_gap.gap_ns)},
      {"blackout_write_start_ms", Ms(write_gap.start_ns)},
      {"reads_in_write_blackout",
       write_gap.gap_ns == 0
           ? uint64_t{0}
           : CompletionsInside(s.read_timeline, write_gap.start_ns, write_gap.end_ns)},
      {"reads_while_writes_held", s.reads_while_writes_held},
      {"timeline_slot_ms", slot_ms},
      {"timeline", std::move(timeline)},
      {"config", config},
  };
  return j;
}

int64_t ProcStatCpuTicks(std::string_view line) {
  const size_t close = line.rfind(')');
  if (close == std::string_view::npos) return -1;
  // After "pid (comm)": state is field 3, utime field 14, stime field 15.
  std::istringstream in{std::string(line.substr(close + 1))};
  std::string field;
  int64_t utime = -1, stime = -1;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14 || i == 15) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(field, &v)) return -1;
      (i == 14 ? utime : stime) = v;
    }
  }
  if (utime < 0 || stime < 0) return -1;
  return utime + stime;
}

CpuTimes SampleCpu(int node_pid) {
  CpuTimes t;
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) == 0) {
    t.self_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
               static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  }
  if (node_pid > 0) {
    std::ifstream in(absl::StrFormat("/proc/%d/stat", node_pid));
    std::string line;
    if (std::getline(in, line)) {
      const int64_t ticks = ProcStatCpuTicks(line);
      const long hz = sysconf(_SC_CLK_TCK);
      if (ticks >= 0 && hz > 0) {
        t.node_s = static_cast<double>(ticks) / static_cast<double>(hz);
        t.node_ok = true;
      }
    }
  }
  return t;
}

nlohmann::json CpuJson(const CpuTimes& before, const CpuTimes& after, uint64_t ops) {
  const double per = ops > 0 ? 1e6 / static_cast<double>(ops) : 0.0;
  const double client = after.self_s - before.self_s;
  nlohmann::json j = {{"client_s", client}, {"client_us_per_op", client * per}};
  if (before.node_ok && after.node_ok) {
    const double node = after.node_s - before.node_s;
    j["node_s"] = node;
    j["node_us_per_op"] = node * per;
  } else {
    j["node_s"] = nullptr;
    j["node_us_per_op"] = nullptr;
  }
  return j;
}

std::string FormatSummary(const nlohmann::json& r) {
  auto num = [&r](const char* k) { return r.value(k, 0.0); };
  const nlohmann::json& lat = r.at("latency_us");
  std::string out = absl::StrFormat(
      "ops %.0f (reads %.0f, writes %.0f) in %.2f s = %.0f ops/s\n"
      "failed %.0f  verify errors %.0f  stale reads %.0f  longest gap %.1f ms"
      " (GETs %.1f ms, writes %.1f ms)\n",
      num("ops"), num("reads"), num("writes"), num("duration_s"), num("ops_per_s"),
      num("failed_ops"), num("verify_errors"), num("stale_reads"), num("blackout_ms"),
      num("blackout_read_ms"), num("blackout_write_ms"));
  for (const char* kind : {"read", "write"}) {
    const nlohmann::json& l = lat.at(kind);
    out += absl::StrFormat("%-5s latency us: p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n", kind,
                           l.value("p50", 0.0), l.value("p99", 0.0), l.value("p999", 0.0),
                           l.value("max", 0.0));
  }
  return out;
}

}  // namespace kvnode::load
