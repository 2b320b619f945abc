// The JSON report has every key kvload promises, with consistent values.
#include <unistd.h>

#include "gtest/gtest.h"
#include "kvnode/load/report.h"

namespace kvnode::load {
namespace {

LoadStats SampleStats() {
  LoadStats s;
  for (uint64_t i = 0; i < 1000; ++i) {
    const uint64_t start = i * 1'000'000;  // one op per ms for a second
    s.RecordCompletion(i % 4 ? OpType::kRead : OpType::kPut, start, start + 20'000 + i,
                       /*not_found=*/i % 100 == 1);
  }
  s.RecordCompletion(OpType::kDelete, 1'000'000'000, 1'000'050'000);
  s.RecordFailure();
  s.RecordVerdict(ReadVerdict::kOk);
  s.RecordVerdict(ReadVerdict::kStale);
  s.RecordVerdict(ReadVerdict::kCorrupt);
  return s;
}

TEST(ReportTest, EveryPromisedKeyIsPresent) {
  const LoadStats s = SampleStats();
  const nlohmann::json r = BuildReport(s, 2.0, {{"workload", "A"}});
  for (const char* key :
       {"ops", "reads", "writes", "failed_ops", "shard_unavailable", "verify_errors", "stale_reads",
        "duration_s", "ops_per_s", "latency_us", "timeline", "blackout_ms", "blackout_read_ms",
        "blackout_write_ms", "reads_in_write_blackout", "reads_while_writes_held"}) {
    EXPECT_TRUE(r.contains(key)) << key;
  }
  for (const char* kind : {"", "read", "write"}) {
    const nlohmann::json& l = *kind ? r["latency_us"][kind] : r["latency_us"];
    for (const char* p : {"p50", "p99", "p999", "max"}) {
      EXPECT_TRUE(l.contains(p)) << kind << "." << p;
      EXPECT_TRUE(l[p].is_number()) << kind << "." << p;
    }
  }
  EXPECT_EQ(r["ops"], 1001);
  EXPECT_EQ(r["reads"], 750);
  EXPECT_EQ(r["writes"], 251);
  EXPECT_EQ(r["deletes"], 1);
  EXPECT_EQ(r["not_found"], 10);  // i = 1, 101, ..., 901
  EXPECT_EQ(r["failed_ops"], 1);
  EXPECT_EQ(r["shard_unavailable"], 0);
  EXPECT_EQ(r["verify_errors"], 2);
  EXPECT_EQ(r["stale_reads"], 1);
  EXPECT_EQ(r["verify"]["corrupt"], 1);
  EXPECT_EQ(r["verify"]["missing"], 0);
  EXPECT_DOUBLE_EQ(r["ops_per_s"].get<double>(), 500.5);
  EXPECT_EQ(r["config"]["workload"], "A");
  EXPECT_GE(r["latency_us"]["read"]["p50"].get<double>(), 20.0);
  EXPECT_LE(r["latency_us"]["read"]["max"].get<double>(), 21.0);
  EXPECT_DOUBLE_EQ(r["latency_us"]["max"].get<double>(), 50.0);  // the DELETE

  // The timeline: one entry per 10 ms slot, summing to all completed ops.
  const nlohmann::json& t = r["timeline"];
  ASSERT_EQ(t.size(), 101u);
  uint64_t sum = 0;
  for (const nlohmann::json& e : t) {
    ASSERT_TRUE(e.contains("t_ms") && e.contains("ops") && e.contains("max_latency_us"));
    sum += e["ops"].get<uint64_t>();
  }
  EXPECT_EQ(sum, 1001u);
  EXPECT_DOUBLE_EQ(t[1]["t_ms"].get<double>(), 10.0);
  EXPECT_EQ(t[1]["ops"], 10);
  // Completions 1 ms apart, then the DELETE ~1 ms after the last.
  EXPECT_NEAR(r["blackout_ms"].get<double>(), 1.03, 0.05);
  EXPECT_FALSE(FormatSummary(r).empty());
}

// Writes stop for 500 ms while GETs go on: the read and write blackouts are
// told apart, and the GETs completed inside the write gap are counted.
TEST(ReportTest, ReadAndWriteBlackoutsApart) {
  LoadStats s;
  for (uint64_t ms = 0; ms < 1000; ++ms) {
    const uint64_t t = ms * 1'000'000;
    s.RecordCompletion(OpType::kRead, t, t + 10'000);
    if (ms < 200 || ms >= 700) s.RecordCompletion(OpType::kPut, t, t + 20'000);
  }
  s.reads_while_writes_held = 7;
  LoadStats merged;
  merged.Merge(s);
  const nlohmann::json r = BuildReport(merged, 1.0);
  EXPECT_NEAR(r["blackout_ms"].get<double>(), 1.0, 0.05);
  EXPECT_NEAR(r["blackout_read_ms"].get<double>(), 1.0, 0.05);
  EXPECT_NEAR(r["blackout_write_ms"].get<double>(), 501.0, 0.05);
  EXPECT_NEAR(r["blackout_write_start_ms"].get<double>(), 199.02, 0.05);
  // GETs at 200..699 ms; the slots wholly inside (199.02, 700.02) ms hold
  // those at 200..699 but the first and last slot touch the gap's ends.
  EXPECT_GE(r["reads_in_write_blackout"].get<uint64_t>(), 480u);
  EXPECT_LE(r["reads_in_write_blackout"].get<uint64_t>(), 500u);
  EXPECT_EQ(r["reads_while_writes_held"], 7);
  EXPECT_EQ(r["timeline"][30]["reads"], 10);
  EXPECT_EQ(r["timeline"][30]["writes"], 0);
  EXPECT_EQ(r["timeline"][80]["writes"], 10);
  EXPECT_NE(FormatSummary(r).find("writes 501.0 ms"), std::string::npos) << FormatSummary(r);
}

TEST(ReportTest, MergeAddsEverything) {
  LoadStats a = SampleStats(), b = SampleStats();
  a.Merge(b);
  EXPECT_EQ(a.ops(), 2002u);
  EXPECT_EQ(a.failed_ops, 2u);
  EXPECT_EQ(a.verify_errors(), 4u);
  EXPECT_EQ(a.read_latency.count(), 1500u);
  EXPECT_EQ(a.timeline.slots()[1].ops, 20u);
  EXPECT_FALSE(RunSucceeded(a));
  LoadStats unavailable;
  unavailable.RecordFailure(/*shard_unavailable_=*/true);
  a.Merge(unavailable);
  EXPECT_EQ(a.failed_ops, 3u);
  EXPECT_EQ(a.shard_unavailable, 1u);
  LoadStats clean;
  clean.RecordCompletion(OpType::kRead, 0, 10);
  EXPECT_TRUE(RunSucceeded(clean));
}

TEST(ReportTest, ProgressLineShowsTheLastInterval) {
  LoadStats before;
  for (int i = 0; i < 100; ++i) before.RecordCompletion(OpType::kRead, 0, 1'000'000);  // 1 ms
  LoadStats now = before;
  for (int i = 0; i < 2000; ++i) now.RecordCompletion(OpType::kPut, 0, 10'000);  // 10 us
  const std::string line = FormatProgressLine(3.0, 1.0, now, before);
  EXPECT_NE(line.find("2000 ops/s"), std::string::npos) << line;
  // The 1 ms ops of the earlier interval are gone (10 us rounds up to 10.1).
  EXPECT_NE(line.find("p50    10.1us"), std::string::npos) << line;
  EXPECT_NE(line.find("failed 0"), std::string::npos) << line;
  EXPECT_NE(line.find("[    3s]"), std::string::npos) << line;
}

TEST(ReportTest, ProcStatCpuCountsFieldsAfterTheLastParen) {
  // comm "a) (b" holds spaces and parentheses; utime 150, stime 25.
  const std::string line =
      "4242 (a) (b) S 1 4242 4242 0 -1 4194560 100 0 0 0 150 25 0 0 20 0 3 0 1 1 1";
  EXPECT_EQ(ProcStatCpuTicks(line), 175);
  EXPECT_EQ(ProcStatCpuTicks("4242 (x) S 1 2"), -1);
  EXPECT_EQ(ProcStatCpuTicks("garbage"), -1);
}

TEST(ReportTest, CpuJsonPerOperation) {
  CpuTimes a, b;
  a.self_s = 1.0;
  b.self_s = 1.5;
  a.node_s = 2.0;
  b.node_s = 2.25;
  a.node_ok = b.node_ok = true;
  const nlohmann::json j = CpuJson(a, b, 1000);
  EXPECT_DOUBLE_EQ(j["client_us_per_op"].get<double>(), 500.0);
  EXPECT_DOUBLE_EQ(j["node_us_per_op"].get<double>(), 250.0);
  b.node_ok = false;
  EXPECT_TRUE(CpuJson(a, b, 1000)["node_us_per_op"].is_null());
  // This process has used some CPU; its own pid is readable.
  const CpuTimes self = SampleCpu(static_cast<int>(getpid()));
  EXPECT_TRUE(self.node_ok);
  EXPECT_GE(self.node_s, 0.0);
}

}  // namespace
}  // namespace kvnode::load
