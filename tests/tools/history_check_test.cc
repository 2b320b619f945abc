// Histories and their linearizability check (history.h, linearize.h): hand-
// made histories, each non-linearizable one beside a control that differs
// in one operation and passes, so no test can pass by rejecting everything.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvnode/load/history.h"
#include "kvnode/load/linearize.h"
#include "kvnode/load/rng.h"

namespace kvnode::load {
namespace {

using K = HistoryOpKind;
using O = HistoryOutcome;
using R = KeyVerdict::Result;

// A one-key history under construction; line numbers as in a file.
class H {
 public:
  H& Put(uint64_t call, uint64_t ret, std::string v, O o = O::kOk) {
    return Add(K::kPut, call, ret, o, std::move(v));
  }
  H& Get(uint64_t call, uint64_t ret, std::string v) { return Add(K::kGet, call, ret, O::kOk, v); }
  H& GetNotFound(uint64_t call, uint64_t ret) { return Add(K::kGet, call, ret, O::kNotFound, ""); }
  H& GetFailed(uint64_t call, uint64_t ret) { return Add(K::kGet, call, ret, O::kFailed, ""); }
  H& Del(uint64_t call, uint64_t ret, O o) { return Add(K::kDelete, call, ret, o, ""); }

  KeyVerdict Check(LinearizeOptions::Initial initial = LinearizeOptions::Initial::kAbsent) const {
    LinearizeOptions o;
    o.initial = initial;
    return CheckKey(ops_, o);
  }
  R Result(LinearizeOptions::Initial initial = LinearizeOptions::Initial::kAbsent) const {
    return Check(initial).result;
  }
  const std::vector<HistoryOp>& ops() const { return ops_; }

 private:
  H& Add(K k, uint64_t call, uint64_t ret, O o, std::string v) {
    HistoryOp op;
    op.client = static_cast<uint32_t>(ops_.size());
    op.kind = k;
    op.key = "k1";
    op.call_ns = call;
    op.return_ns = ret;
    op.outcome = o;
    op.value = std::move(v);
    op.line = ops_.size() + 2;
    ops_.push_back(op);
    return *this;
  }
  std::vector<HistoryOp> ops_;
};

constexpr auto kAny = LinearizeOptions::Initial::kAny;

TEST(LinearizeTest, SequentialRunIsLinearizable) {
  H h;
  h.GetNotFound(0, 1).Put(2, 3, "a").Get(4, 5, "a").Put(6, 7, "b").Get(8, 9, "b");
  h.Del(10, 11, O::kOk).GetNotFound(12, 13).Del(14, 15, O::kNotFound).Put(16, 17, "c");
  const KeyVerdict v = h.Check();
  EXPECT_EQ(v.result, R::kLinearizable);
  EXPECT_EQ(v.ops, 9u);
}

TEST(LinearizeTest, WrongValueInSequenceIsNotLinearizable) {
  EXPECT_EQ(H().Put(0, 1, "a").Get(2, 3, "b").Result(), R::kNotLinearizable);
  EXPECT_EQ(H().Put(0, 1, "a").GetNotFound(2, 3).Result(), R::kNotLinearizable);
  EXPECT_EQ(H().Put(0, 1, "a").Put(2, 3, "b").Get(4, 5, "a").Result(), R::kNotLinearizable);
}

// A GET sees the new value, a later GET (called after the first returned)
// sees the old one, while the write is still in flight.
TEST(LinearizeTest, OlderReadAfterNewerReadIsNotLinearizable) {
  H bad;
  bad.Put(0, 10, "a").Put(20, 40, "b").Get(25, 30, "b").Get(31, 35, "a");
  const KeyVerdict v = bad.Check();
  ASSERT_EQ(v.result, R::kNotLinearizable);
  // The window: the newer read is the end of the longest prefix, the older
  // read cannot follow it.
  ASSERT_FALSE(v.tail.empty());
  EXPECT_EQ(v.tail.back(), 2u);
  EXPECT_EQ(v.state, "b");
  ASSERT_EQ(v.stuck.size(), 1u);
  EXPECT_EQ(v.stuck[0], 3u);
  EXPECT_NE(v.reasons[0].find("reads a (written by line 2), the register holds b"),
            std::string::npos)
      << v.reasons[0];
  const std::string text = DescribeVerdict(v, bad.ops());
  EXPECT_NE(text.find("NOT LINEARIZABLE"), std::string::npos) << text;
  EXPECT_NE(text.find("line 5"), std::string::npos) << text;  // the older read

  // Control: the two reads overlap, so the older may take effect first.
  H ok;
  ok.Put(0, 10, "a").Put(20, 40, "b").Get(25, 30, "b").Get(22, 35, "a");
  EXPECT_EQ(ok.Result(), R::kLinearizable);
}

TEST(LinearizeTest, ConcurrentWritesFixOneOrder) {
  // Both PUTs overlap; the reads after both returned must agree on the last.
  EXPECT_EQ(H().Put(0, 10, "a").Put(0, 10, "b").Get(11, 12, "a").Get(13, 14, "a").Result(),
            R::kLinearizable);
  EXPECT_EQ(H().Put(0, 10, "a").Put(0, 10, "b").Get(11, 12, "b").Get(13, 14, "a").Result(),
            R::kNotLinearizable);
  // While they are in flight, reads may see a then b (not b, a, b).
  EXPECT_EQ(H().Put(0, 20, "a").Put(0, 20, "b").Get(1, 2, "a").Get(3, 4, "b").Result(),
            R::kLinearizable);
  EXPECT_EQ(
      H().Put(0, 20, "a").Put(0, 20, "b").Get(1, 2, "b").Get(3, 4, "a").Get(5, 6, "b").Result(),
      R::kNotLinearizable);
}

TEST(LinearizeTest, DeleteNotFoundWhileKeyExistedIsNotLinearizable) {
  H bad;
  bad.Put(0, 10, "a").Del(20, 30, O::kNotFound);
  const KeyVerdict v = bad.Check();
  ASSERT_EQ(v.result, R::kNotLinearizable);
  ASSERT_EQ(v.stuck.size(), 1u);
  EXPECT_EQ(v.stuck[0], 1u);
  EXPECT_NE(v.reasons[0].find("answered not_found, the register holds a"), std::string::npos)
      << v.reasons[0];
  // Controls: another client's DELETE (ok, or failed: unknown outcome)
  // before or overlapping it explains the not_found.
  EXPECT_EQ(H().Put(0, 10, "a").Del(15, 25, O::kOk).Del(20, 30, O::kNotFound).Result(),
            R::kLinearizable);
  EXPECT_EQ(H().Put(0, 10, "a").Del(12, 13, O::kFailed).Del(20, 30, O::kNotFound).Result(),
            R::kLinearizable);
  // ... but a DELETE called after it returned does not.
  EXPECT_EQ(H().Put(0, 10, "a").Del(20, 30, O::kNotFound).Del(31, 32, O::kFailed).Result(),
            R::kNotLinearizable);
}

TEST(LinearizeTest, DeleteOkOnAbsentKeyIsNotLinearizable) {
  EXPECT_EQ(H().Del(0, 10, O::kOk).Result(), R::kNotLinearizable);
  EXPECT_EQ(H().Put(0, 1, "a").Del(2, 3, O::kOk).Del(4, 5, O::kOk).Result(), R::kNotLinearizable);
  // Controls: a failed PUT nobody read may have made the key exist; an
  // unknown initial state may have held a value.
  EXPECT_EQ(H().Put(0, 1, "a", O::kFailed).Del(5, 10, O::kOk).Result(), R::kLinearizable);
  EXPECT_EQ(H().Del(0, 10, O::kOk).Result(kAny), R::kLinearizable);
}

TEST(LinearizeTest, FailedWriteMayTakeEffectLateOrNever) {
  // Never applied.
  EXPECT_EQ(H().Put(0, 10, "a").Put(20, 30, "b", O::kFailed).Get(100, 110, "a").Result(),
            R::kLinearizable);
  EXPECT_EQ(H().Put(20, 30, "b", O::kFailed).GetNotFound(100, 110).Result(), R::kLinearizable);
  // Applied long after its failure was reported.
  EXPECT_EQ(H().Put(0, 10, "a")
                .Put(20, 30, "b", O::kFailed)
                .Get(100, 110, "a")
                .Get(200, 210, "b")
                .Result(),
            R::kLinearizable);
  // Once seen it stays: the older value cannot come back.
  EXPECT_EQ(H().Put(0, 10, "a")
                .Put(20, 30, "b", O::kFailed)
                .Get(100, 110, "b")
                .Get(120, 130, "a")
                .Result(),
            R::kNotLinearizable);
  // Seen before it was called.
  EXPECT_EQ(H().Get(0, 5, "b").Put(10, 20, "b", O::kFailed).Result(), R::kNotLinearizable);
  // A failed DELETE: the key may be gone later, or not.
  EXPECT_EQ(
      H().Put(0, 10, "a").Del(20, 30, O::kFailed).Get(40, 50, "a").GetNotFound(60, 70).Result(),
      R::kLinearizable);
  EXPECT_EQ(
      H().Put(0, 10, "a").Del(20, 30, O::kFailed).GetNotFound(40, 50).Get(60, 70, "a").Result(),
      R::kNotLinearizable);
}

// A failed write takes effect once: it explains one answer, not two.
TEST(LinearizeTest, FailedWriteExplainsOneAnswer) {
  H del;
  del.Put(0, 1, "a").Del(2, 3, O::kFailed).GetNotFound(10, 11).Put(12, 13, "b");
  del.GetNotFound(20, 21);
  EXPECT_EQ(del.Result(), R::kNotLinearizable);
  del.Del(4, 5, O::kFailed);  // a second one, called early, applied late
  EXPECT_EQ(del.Result(), R::kLinearizable);

  H put;
  put.Put(0, 1, "u1", O::kFailed).Del(10, 11, O::kOk).Del(20, 21, O::kOk);
  EXPECT_EQ(put.Result(), R::kNotLinearizable);
  put.Put(2, 3, "u2", O::kFailed);
  EXPECT_EQ(put.Result(), R::kLinearizable);
}

TEST(LinearizeTest, FailedGetSaysNothing) {
  const KeyVerdict v = H().Put(0, 10, "a").GetFailed(20, 30).Get(40, 50, "a").Check();
  EXPECT_EQ(v.result, R::kLinearizable);
  EXPECT_EQ(v.ops, 2u);
}

TEST(LinearizeTest, InitialState) {
  // A value no PUT wrote: impossible on a key that started absent...
  EXPECT_EQ(H().Get(0, 1, "x").Result(), R::kNotLinearizable);
  // ... and fine as the unknown initial value, which then stays.
  EXPECT_EQ(H().Get(0, 1, "x").Get(2, 3, "x").Result(kAny), R::kLinearizable);
  EXPECT_EQ(H().GetNotFound(0, 1).Result(kAny), R::kLinearizable);
  EXPECT_EQ(H().Get(0, 1, "x").Get(2, 3, "y").Result(kAny), R::kNotLinearizable);
  EXPECT_EQ(H().Get(0, 1, "x").GetNotFound(2, 3).Result(kAny), R::kNotLinearizable);
  // A value this history writes cannot be the initial one.
  EXPECT_EQ(H().Get(0, 5, "v").Put(10, 20, "v").Result(kAny), R::kNotLinearizable);
}

TEST(LinearizeTest, StepLimitGivesUndecided) {
  H h;
  h.Put(0, 10, "a").Get(20, 30, "a").Get(40, 50, "a");
  LinearizeOptions o;
  o.max_steps = 1;
  EXPECT_EQ(CheckKey(h.ops(), o).result, R::kUndecided);
}

// Many operations in flight per key, failed writes: a generated history is
// linearizable; one GET moved far back in time is caught.
TEST(LinearizeTest, GeneratedHistory) {
  GenerateOptions g;  // ~4 operations in flight per key, as kvload's hot keys
  g.ops = 30000;
  g.keys = 6;
  g.failed = 0.01;
  std::vector<HistoryOp> ops = GenerateHistory(g);
  auto by_key = SplitByKey(ops);
  ASSERT_EQ(by_key.size(), 6u);
  for (const auto& [key, key_ops] : by_key) {
    const KeyVerdict v = CheckKey(key_ops);
    EXPECT_EQ(v.result, R::kLinearizable) << DescribeVerdict(v, key_ops);
  }
  std::vector<HistoryOp> k0 = by_key.begin()->second;
  size_t late = 0;
  for (size_t i = k0.size() / 2; i < k0.size(); ++i) {
    if (k0[i].kind == K::kGet && k0[i].outcome == O::kOk && std::stoull(k0[i].value) > 100) {
      late = i;
      break;
    }
  }
  ASSERT_GT(late, 0u);
  k0[late].value = std::to_string(std::stoull(k0[late].value) - 100);
  const KeyVerdict v = CheckKey(k0);
  EXPECT_EQ(v.result, R::kNotLinearizable);
  ASSERT_FALSE(v.stuck.empty());
  bool found = false;
  for (size_t s : v.stuck) found |= s == late;
  EXPECT_TRUE(found) << DescribeVerdict(v, k0);
}

// The search's shortcuts (forced reads, preludes, shared unread values, the
// memo's cover) against brute force: every order of every subset of the
// failed writes, on many small random histories with overlapping times,
// repeated values and failed writes.
bool BruteForce(const std::vector<HistoryOp>& all, LinearizeOptions::Initial initial) {
  std::vector<HistoryOp> ops;
  for (const HistoryOp& h : all) {
    if (!(h.kind == K::kGet && h.outcome == O::kFailed)) ops.push_back(h);
  }
  std::vector<std::string> starts = {""};  // "" = absent
  if (initial == kAny) {
    std::set<std::string> written, read;
    for (const HistoryOp& h : ops) (h.kind == K::kPut ? written : read).insert(h.value);
    for (const std::string& v : read) {
      if (!v.empty() && !written.count(v)) starts.push_back(v);
    }
    starts.push_back("?");  // a value nobody reads or writes
  }
  const auto ret = [](const HistoryOp& h) {
    return h.outcome == O::kFailed ? UINT64_MAX : h.return_ns;
  };
  const size_t n = ops.size();
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    std::vector<size_t> pick;
    bool ok = true;
    for (size_t i = 0; i < n; ++i) {
      const bool in = mask >> i & 1;
      if (!in && ops[i].outcome != O::kFailed) ok = false;
      if (in) pick.push_back(i);
    }
    if (!ok) continue;
    do {
      bool order = true;
      for (size_t x = 0; x < pick.size() && order; ++x) {
        for (size_t y = x + 1; y < pick.size() && order; ++y) {
          order = !(ret(ops[pick[y]]) < ops[pick[x]].call_ns);  // y returned before x called
        }
      }
      for (size_t st = 0; order && st < starts.size(); ++st) {
        std::string reg = starts[st];
        bool good = true;
        for (size_t i : pick) {
          const HistoryOp& h = ops[i];
          if (h.kind == K::kPut) {
            reg = h.value;
          } else if (h.kind == K::kGet) {
            good &= h.outcome == O::kOk ? reg == h.value : reg.empty();
          } else {
            if (h.outcome == O::kOk) good &= !reg.empty();
            if (h.outcome == O::kNotFound) good &= reg.empty();
            reg.clear();
          }
        }
        if (good) return true;
      }
    } while (std::next_permutation(pick.begin(), pick.end()));
  }
  return false;
}

TEST(LinearizeTest, AgreesWithBruteForce) {
  Rng rng(7);
  const char* values[] = {"a", "b", "c"};
  size_t linearizable = 0, failed_writes = 0;
  for (int round = 0; round < 20000; ++round) {
    std::vector<HistoryOp> ops;
    const size_t n = 1 + rng.Uniform(6);
    for (size_t i = 0; i < n; ++i) {
      HistoryOp h;
      h.key = "k";
      h.line = i + 2;
      h.call_ns = rng.Uniform(8);
      h.return_ns = h.call_ns + rng.Uniform(5);
      h.kind = static_cast<K>(rng.Uniform(3));
      const bool fail = rng.Uniform(5) == 0;
      switch (h.kind) {
        case K::kPut:
          h.value = values[rng.Uniform(3)];
          h.outcome = fail ? O::kFailed : O::kOk;
          break;
        case K::kGet:
          h.outcome = fail ? O::kFailed : rng.Uniform(3) == 0 ? O::kNotFound : O::kOk;
          if (h.outcome == O::kOk) h.value = values[rng.Uniform(3)];
          break;
        case K::kDelete:
          h.outcome = fail ? O::kFailed : rng.Uniform(2) == 0 ? O::kNotFound : O::kOk;
          break;
      }
      failed_writes += fail && h.kind != K::kGet;
      ops.push_back(h);
    }
    for (auto initial : {LinearizeOptions::Initial::kAbsent, kAny}) {
      const bool want = BruteForce(ops, initial);
      LinearizeOptions o;
      o.initial = initial;
      const KeyVerdict v = CheckKey(ops, o);
      linearizable += want;
      std::string dump;
      for (const HistoryOp& h : ops) {
        AppendHistoryLine({h.client, h.kind, h.key, h.call_ns, h.return_ns, h.outcome, h.value},
                          &dump);
      }
      ASSERT_EQ(v.result == R::kLinearizable, want) << dump << "round " << round << " initial "
                                                    << (initial == kAny ? "any" : "absent") << "\n"
                                                    << DescribeVerdict(v, ops);
    }
  }
  // Both answers were common, and failed writes too: the comparison means something.
  EXPECT_GT(linearizable, 4000u);
  EXPECT_LT(linearizable, 36000u);
  EXPECT_GT(failed_writes, 5000u);
}

TEST(HistoryFormatTest, LineRoundTrip) {
  std::string text;
  AppendHistoryLine({3, K::kPut, "k0001", 10, 20, O::kOk, "42"}, &text);
  AppendHistoryLine({4, K::kDelete, "k0001", 11, 25, O::kNotFound, ""}, &text);
  AppendHistoryLine({5, K::kGet, "k0001", 12, 30, O::kFailed, ""}, &text);
  EXPECT_EQ(text,
            "3\tPUT\tk0001\t10\t20\tok\t42\n"
            "4\tDELETE\tk0001\t11\t25\tnot_found\t-\n"
            "5\tGET\tk0001\t12\t30\tfailed\t-\n");
  absl::StatusOr<std::vector<HistoryOp>> ops =
      ParseHistory(std::string(kHistoryHeader) + "\n" + text, "h.tsv");
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 3u);
  const HistoryOp& p = (*ops)[0];
  EXPECT_EQ(p.client, 3u);
  EXPECT_EQ(p.kind, K::kPut);
  EXPECT_EQ(p.key, "k0001");
  EXPECT_EQ(p.call_ns, 10u);
  EXPECT_EQ(p.return_ns, 20u);
  EXPECT_EQ(p.outcome, O::kOk);
  EXPECT_EQ(p.value, "42");
  EXPECT_EQ(p.line, 2u);
  EXPECT_EQ((*ops)[1].outcome, O::kNotFound);
  EXPECT_EQ((*ops)[1].value, "");
  EXPECT_EQ((*ops)[2].line, 4u);
}

TEST(HistoryFormatTest, RejectsWhatTheFormatForbids) {
  for (const char* bad : {
           "1\tPUT\tk\t1\t2\tok",            // 6 fields
           "1\tPUT\tk\t1\t2\tok\t4\t5",      // 8 fields
           "1\tSCAN\tk\t1\t2\tok\t4",        // op
           "1\tPUT\tk\t3\t2\tok\t4",         // call after return
           "1\tPUT\tk\t1\t2\tnot_found\t4",  // PUT not_found
           "1\tPUT\tk\t1\t2\tok\t-",         // PUT without value
           "1\tGET\tk\t1\t2\tok\t-",         // GET ok without value
           "1\tGET\tk\t1\t2\tnot_found\t4",  // GET not_found with value
           "1\tDELETE\tk\t1\t2\tok\t4",      // DELETE with value
           "1\tGET\tk\t1\t2\tmaybe\t-",      // outcome
           "x\tGET\tk\t1\t2\tok\t4",         // client
           "1\tGET\t\t1\t2\tok\t4",          // empty key
       }) {
    EXPECT_FALSE(ParseHistoryLine(bad).ok()) << bad;
  }
  absl::StatusOr<std::vector<HistoryOp>> r =
      ParseHistory(std::string(kHistoryHeader) + "\n1\tGET\tk\t1\t2\tok\t4\n1\tGET\tk\n", "h.tsv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("h.tsv:3:"), std::string::npos) << r.status();
  r = ParseHistory("1\tGET\tk\t1\t2\tok\t4\n", "h.tsv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a history file"), std::string::npos) << r.status();
}

TEST(HistoryFormatTest, WriterAndReader) {
  char tmpl[] = "/tmp/kvhistory_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/h.tsv";
  {
    absl::StatusOr<std::unique_ptr<HistoryWriter>> w = HistoryWriter::Create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    std::string chunk;
    AppendHistoryLine({0, K::kPut, "k1", 1, 2, O::kOk, "7"}, &chunk);
    ASSERT_TRUE((*w)->Append(chunk).ok());
    chunk.clear();
    AppendHistoryLine({1, K::kGet, "k1", 3, 4, O::kOk, "7"}, &chunk);
    ASSERT_TRUE((*w)->Append(chunk).ok());
    ASSERT_TRUE((*w)->Close().ok());
    EXPECT_FALSE((*w)->Append(chunk).ok());  // closed
  }
  absl::StatusOr<std::vector<HistoryOp>> ops = ReadHistory(path);
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 2u);
  EXPECT_EQ(CheckKey(*ops).result, R::kLinearizable);
  unlink(path.c_str());
  rmdir(tmpl);
  EXPECT_FALSE(ReadHistory(path).ok());
  EXPECT_FALSE(HistoryWriter::Create(std::string(tmpl) + "/no/such/dir").ok());
}

}  // namespace
}  // namespace kvnode::load
