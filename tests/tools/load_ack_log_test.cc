// The ack log: records survive, a torn tail is tolerated and reported,
// corruption elsewhere is not; the audit tells the failure kinds apart.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "gtest/gtest.h"
#include "kvnode/load/ack_log.h"
#include "kvnode/load/verify.h"

namespace kvnode::load {
namespace {

class AckLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvload_acklog_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/acks.log";
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  std::string Slurp() {
    std::ifstream in(path_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void Spit(const std::string& data) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out << data;
  }
  std::vector<AckRecord> Sample() {
    return {
        {"k01", 1, false}, {"k02", 2, false}, {"k01", 3, true}, {std::string(200, 'z'), 4, false}};
  }
  void WriteSample(size_t buffer_bytes) {
    AckLogOptions opts;
    opts.buffer_bytes = buffer_bytes;
    absl::StatusOr<std::unique_ptr<AckLogWriter>> w = AckLogWriter::Open(path_, opts);
    ASSERT_TRUE(w.ok()) << w.status();
    for (const AckRecord& r : Sample()) ASSERT_TRUE((*w)->Append(r.key, r.version, r.deleted).ok());
    EXPECT_EQ((*w)->records_appended(), Sample().size());
  }
  std::string dir_, path_;
};

TEST_F(AckLogTest, RecordsRoundTrip) {
  for (size_t buffer : {size_t{0}, size_t{1} << 16}) {
    unlink(path_.c_str());
    WriteSample(buffer);  // the destructor flushes
    absl::StatusOr<AckLogContents> c = ReadAckLog(path_);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->records, Sample());
    EXPECT_EQ(c->torn_tail_bytes, 0u);
  }
}

TEST_F(AckLogTest, EmptyLogHasOnlyTheHeader) {
  { ASSERT_TRUE(AckLogWriter::Open(path_).ok()); }
  EXPECT_EQ(Slurp(), std::string(kAckLogMagic));
  absl::StatusOr<AckLogContents> c = ReadAckLog(path_);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->records.empty());
}

// Cut the file at every length: the whole records before the cut come back
// and the rest is reported as a torn tail, never an error.
TEST_F(AckLogTest, EveryTornTailIsTolerated) {
  WriteSample(0);
  const std::string full = Slurp();
  std::vector<size_t> ends;  // file offsets where records end
  size_t pos = kAckLogMagic.size();
  for (const AckRecord& r : Sample()) {
    pos += kAckRecordHeaderSize + r.key.size();
    ends.push_back(pos);
  }
  ASSERT_EQ(pos, full.size());
  for (size_t len = 0; len <= full.size(); ++len) {
    absl::StatusOr<AckLogContents> c = ParseAckLog(std::string_view(full).substr(0, len));
    ASSERT_TRUE(c.ok()) << len << ": " << c.status();
    size_t whole = 0;
    while (whole < ends.size() && ends[whole] <= len) ++whole;
    EXPECT_EQ(c->records.size(), whole) << len;
    const size_t valid = len < kAckLogMagic.size() ? 0
                         : whole == 0              ? kAckLogMagic.size()
                                                   : ends[whole - 1];
    EXPECT_EQ(c->torn_tail_bytes, len - valid) << len;
    EXPECT_EQ(c->valid_bytes, valid) << len;
  }
}

TEST_F(AckLogTest, GarbageInTheLastRecordIsATornTail) {
  WriteSample(0);
  std::string data = Slurp();
  data[data.size() - 3] ^= 0x40;
  absl::StatusOr<AckLogContents> c = ParseAckLog(data);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->records.size(), 3u);
  EXPECT_EQ(c->torn_tail_bytes, kAckRecordHeaderSize + 200);
}

TEST_F(AckLogTest, CorruptionFollowedByMoreDataIsDataLoss) {
  AckLogOptions opts;
  {
    absl::StatusOr<std::unique_ptr<AckLogWriter>> w = AckLogWriter::Open(path_, opts);
    ASSERT_TRUE(w.ok());
    for (int i = 0; i < 500; ++i) ASSERT_TRUE((*w)->Append("k" + std::to_string(i), i, false).ok());
  }
  std::string data = Slurp();
  data[kAckLogMagic.size() + 5] ^= 1;  // first record's key length
  absl::StatusOr<AckLogContents> c = ParseAckLog(data);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsDataLoss(c.status())) << c.status();
  EXPECT_FALSE(ParseAckLog("not an ack log at all").ok());
}

TEST_F(AckLogTest, ReopeningCutsATornTailAndAppends) {
  WriteSample(0);
  std::string data = Slurp();
  Spit(data.substr(0, data.size() - 7));  // crash mid-record
  {
    absl::StatusOr<std::unique_ptr<AckLogWriter>> w = AckLogWriter::Open(path_);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->torn_tail_bytes(), kAckRecordHeaderSize + 200 - 7);
    ASSERT_TRUE((*w)->Append("k09", 9, false).ok());
  }
  absl::StatusOr<AckLogContents> c = ReadAckLog(path_);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<AckRecord> want = Sample();
  want.pop_back();
  want.push_back({"k09", 9, false});
  EXPECT_EQ(c->records, want);
  EXPECT_EQ(c->torn_tail_bytes, 0u);
}

TEST_F(AckLogTest, RefusesAFileThatIsNotAnAckLog) {
  Spit("hello world, this is some other file");
  EXPECT_FALSE(AckLogWriter::Open(path_).ok());
  EXPECT_EQ(Slurp(), "hello world, this is some other file");  // untouched
}

TEST_F(AckLogTest, RejectsBadKeys) {
  absl::StatusOr<std::unique_ptr<AckLogWriter>> w = AckLogWriter::Open(path_);
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE((*w)->Append("", 1, false).ok());
  EXPECT_FALSE((*w)->Append(std::string(5000, 'k'), 1, false).ok());
}

// A fake node: key -> value, and keys whose read fails.
struct FakeNode {
  std::map<std::string, std::string> data;
  std::set<std::string> broken;
  AuditReadFn Reader() {
    return [this](const std::string& key) -> absl::StatusOr<std::optional<std::string>> {
      if (broken.count(key)) return absl::DeadlineExceededError("timeout");
      auto it = data.find(key);
      if (it == data.end()) return std::optional<std::string>();
      return std::optional<std::string>(it->second);
    };
  }
};

TEST(AuditTest, PassesWhenEveryAcknowledgedWriteIsThere) {
  FakeNode node;
  std::vector<AckRecord> acks;
  for (int i = 0; i < 50; ++i) {
    const std::string k = "k" + std::to_string(i);
    acks.push_back({k, 1, false});
    acks.push_back({k, 3, false});
    acks.push_back({k, 2, false});  // logged out of order: version 3 wins
    node.data[k] = EncodeVerifiedValue(k, i % 2 ? 3 : 4, 40);  // newer is fine
  }
  acks.push_back({"gone", 5, true});
  AuditReport r = Audit(acks, node.Reader());
  EXPECT_TRUE(r.passed()) << r.ToJson().dump();
  EXPECT_EQ(r.keys, 51u);
  EXPECT_EQ(r.records, 151u);
}

TEST(AuditTest, TellsTheFailureKindsApart) {
  FakeNode node;
  std::vector<AckRecord> acks = {
      {"ok", 2, false},      {"missing", 2, false}, {"stale", 5, false},
      {"corrupt", 1, false}, {"wrong", 1, false},   {"resurrected", 4, true},
      {"broken", 1, false},  {"deleted", 3, true},  {"rewritten", 3, true},
  };
  node.data["ok"] = EncodeVerifiedValue("ok", 2, 40);
  node.data["stale"] = EncodeVerifiedValue("stale", 4, 40);
  node.data["corrupt"] = EncodeVerifiedValue("corrupt", 1, 40);
  node.data["corrupt"][10] ^= 1;
  node.data["wrong"] = EncodeVerifiedValue("other", 1, 40);
  node.data["resurrected"] = EncodeVerifiedValue("resurrected", 3, 40);
  node.data["rewritten"] = EncodeVerifiedValue("rewritten", 4, 40);  // PUT after the DELETE
  node.broken.insert("broken");
  AuditReport r = Audit(acks, node.Reader());
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.keys, 9u);
  EXPECT_EQ(r.ok, 3u);  // ok, deleted, rewritten
  EXPECT_EQ(r.missing, 1u);
  EXPECT_EQ(r.stale, 1u);
  EXPECT_EQ(r.corrupt, 1u);
  EXPECT_EQ(r.wrong_key, 1u);
  EXPECT_EQ(r.resurrected, 1u);
  EXPECT_EQ(r.read_errors, 1u);
  EXPECT_EQ(r.issues.size(), 6u);
  const nlohmann::json j = r.ToJson();
  EXPECT_FALSE(j["passed"].get<bool>());
  EXPECT_EQ(j["issues"].size(), 6u);
  EXPECT_EQ(Audit(acks, node.Reader(), /*max_issues=*/2).issues.size(), 2u);
}

}  // namespace
}  // namespace kvnode::load
