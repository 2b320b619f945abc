#include "kvnode/load/ack_log.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "kvnode/load/verify.h"
#include "kvnode/storage/limits.h"

namespace kvnode::load {
namespace {

constexpr uint8_t kTypePut = 1;
constexpr uint8_t kTypeDelete = 2;
constexpr size_t kMaxRecordSize = kAckRecordHeaderSize + storage::kMaxKeySize;

using base::Av;

uint64_t Load(const char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

void Store(char* p, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

absl::Status Errno(std::string_view what, const std::string& path) {
  return base::ErrnoStatus(errno, absl::StrCat("ack log ", path, ": ", Av(what)));
}

absl::Status WriteFully(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open", path);
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = Errno("read", path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return data;
}

}  // namespace

absl::StatusOr<AckLogContents> ParseAckLog(std::string_view data) {
  if (data.size() < kAckLogMagic.size() || data.substr(0, kAckLogMagic.size()) != kAckLogMagic) {
    // A crash while the header itself was written leaves a prefix of it.
    if (data.size() < kAckLogMagic.size() && kAckLogMagic.substr(0, data.size()) == data) {
      AckLogContents c;
      c.torn_tail_bytes = data.size();
      return c;
    }
    return absl::DataLossError("ack log: bad header (not a kvload ack log)");
  }
  AckLogContents c;
  size_t pos = kAckLogMagic.size();
  while (pos < data.size()) {
    const std::string_view rest = data.substr(pos);
    bool good = rest.size() >= kAckRecordHeaderSize;
    size_t key_len = 0;
    uint8_t type = 0;
    if (good) {
      key_len = Load(rest.data() + 4, 2);
      type = static_cast<uint8_t>(rest[6]);
      good =
          key_len >= 1 && key_len <= storage::kMaxKeySize &&
          rest.size() >= kAckRecordHeaderSize + key_len &&
          Load(rest.data(), 4) == XXH32(rest.data() + 4, kAckRecordHeaderSize - 4 + key_len, 0) &&
          (type == kTypePut || type == kTypeDelete) && rest[7] == 0;
    }
    if (!good) {
      if (rest.size() <= kMaxRecordSize) {
        c.torn_tail_bytes = rest.size();
        break;
      }
      return absl::DataLossError(absl::StrCat("ack log: corrupt record at offset ", pos, " with ",
                                              rest.size(), " bytes after it"));
    }
    AckRecord r;
    r.version = Load(rest.data() + 8, 8);
    r.deleted = type == kTypeDelete;
    r.key.assign(rest.data() + kAckRecordHeaderSize, key_len);
    c.records.push_back(std::move(r));
    pos += kAckRecordHeaderSize + key_len;
  }
  c.valid_bytes = data.size() - c.torn_tail_bytes;
  return c;
}

absl::StatusOr<AckLogContents> ReadAckLog(const std::string& path) {
  absl::StatusOr<std::string> data = ReadFile(path);
  if (!data.ok()) return data.status();
  absl::StatusOr<AckLogContents> c = ParseAckLog(*data);
  if (!c.ok()) return absl::DataLossError(absl::StrCat(path, ": ", c.status().message()));
  return c;
}

absl::StatusOr<std::unique_ptr<AckLogWriter>> AckLogWriter::Open(const std::string& path,
                                                                 const AckLogOptions& options) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", path);
  auto fail = [fd](absl::Status s) {
    close(fd);
    return s;
  };
  struct stat st;
  if (fstat(fd, &st) != 0) return fail(Errno("fstat", path));
  uint64_t torn = 0;
  if (st.st_size == 0) {
    if (absl::Status s = WriteFully(fd, kAckLogMagic, path); !s.ok()) return fail(s);
  } else {
    absl::StatusOr<AckLogContents> c = ReadAckLog(path);
    if (!c.ok()) return fail(c.status());
    torn = c->torn_tail_bytes;
    if (c->valid_bytes < kAckLogMagic.size()) {
      // Only a torn header: start over.
      if (ftruncate(fd, 0) != 0) return fail(Errno("ftruncate", path));
      if (lseek(fd, 0, SEEK_SET) < 0) return fail(Errno("lseek", path));
      if (absl::Status s = WriteFully(fd, kAckLogMagic, path); !s.ok()) return fail(s);
    } else if (torn > 0) {
      LOG(WARNING) << "ack log " << path << ": cutting a torn tail of " << torn << " bytes";
      if (ftruncate(fd, static_cast<off_t>(c->valid_bytes)) != 0) {
        return fail(Errno("ftruncate", path));
      }
    }
  }
  if (lseek(fd, 0, SEEK_END) < 0) return fail(Errno("lseek", path));
  return std::unique_ptr<AckLogWriter>(new AckLogWriter(fd, path, options, torn));
}

AckLogWriter::~AckLogWriter() {
  absl::Status s = Flush();
  if (!s.ok()) LOG(ERROR) << "ack log " << path_ << ": final flush failed: " << s;
  close(fd_);
}

absl::Status AckLogWriter::Append(std::string_view key, uint64_t version, bool deleted) {
  if (key.empty() || key.size() > storage::kMaxKeySize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ack log: key of ", key.size(), " bytes not in [1, ", storage::kMaxKeySize, "]"));
  }
  char rec[kMaxRecordSize];
  Store(rec + 4, key.size(), 2);
  rec[6] = static_cast<char>(deleted ? kTypeDelete : kTypePut);
  rec[7] = 0;
  Store(rec + 8, version, 8);
  std::memcpy(rec + kAckRecordHeaderSize, key.data(), key.size());
  const size_t len = kAckRecordHeaderSize + key.size();
  Store(rec, XXH32(rec + 4, len - 4, 0), 4);

  absl::MutexLock lock(&mu_);
  if (!sticky_error_.ok()) return sticky_error_;
  buffer_.append(rec, len);
  ++appended_;
  if (buffer_.size() >= options_.buffer_bytes) return FlushLocked();
  return absl::OkStatus();
}

absl::Status AckLogWriter::Flush() {
  absl::MutexLock lock(&mu_);
  return FlushLocked();
}

absl::Status AckLogWriter::FlushLocked() {
  if (!sticky_error_.ok()) return sticky_error_;
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status s = WriteFully(fd_, buffer_, path_);
  if (s.ok() && options_.sync && fdatasync(fd_) != 0) s = Errno("fdatasync", path_);
  buffer_.clear();
  // A failed write may have left part of a record: later appends would sit
  // behind garbage, so the writer refuses them.
  sticky_error_ = s;
  return s;
}

uint64_t AckLogWriter::records_appended() const {
  absl::MutexLock lock(&mu_);
  return appended_;
}

nlohmann::json AuditReport::ToJson() const {
  nlohmann::json j = {{"passed", passed()},
                      {"records", records},
                      {"keys", keys},
                      {"ok", ok},
                      {"missing", missing},
                      {"stale", stale},
                      {"resurrected", resurrected},
                      {"corrupt", corrupt},
                      {"wrong_key", wrong_key},
                      {"read_errors", read_errors}};
  nlohmann::json list = nlohmann::json::array();
  for (const AuditIssue& i : issues) {
    list.push_back({{"key", i.key},
                    {"expected_version", i.expected_version},
                    {"expected_deleted", i.expected_deleted},
                    {"problem", i.problem}});
  }
  j["issues"] = std::move(list);
  return j;
}

AuditReport Audit(const std::vector<AckRecord>& records, const AuditReadFn& read,
                  size_t max_issues) {
  AuditReport report;
  report.records = records.size();
  std::map<std::string, const AckRecord*> expected;
  for (const AckRecord& r : records) {
    auto [it, inserted] = expected.emplace(r.key, &r);
    if (!inserted && r.version > it->second->version) it->second = &r;
  }
  report.keys = expected.size();
  for (const auto& entry : expected) {
    // Not a structured binding: clang before 16 cannot capture one in a lambda.
    const std::string& key = entry.first;
    const AckRecord* want = entry.second;
    auto problem = [&](uint64_t& counter, std::string text) {
      ++counter;
      if (report.issues.size() < max_issues) {
        report.issues.push_back({key, want->version, want->deleted, std::move(text)});
      }
    };
    absl::StatusOr<std::optional<std::string>> got = read(key);
    if (!got.ok()) {
      problem(report.read_errors, absl::StrCat("read failed: ", got.status().ToString()));
      continue;
    }
    if (!got->has_value()) {
      if (want->deleted) {
        ++report.ok;
      } else {
        problem(report.missing, "missing: NOT_FOUND");
      }
      continue;
    }
    const CheckedValue c = CheckVerifiedValue(key, **got);
    if (c.check == ValueCheck::kCorrupt) {
      problem(report.corrupt, "corrupt value");
    } else if (c.check == ValueCheck::kWrongKey) {
      problem(report.wrong_key, "value of another key");
    } else if (want->deleted && c.version <= want->version) {
      problem(report.resurrected, absl::StrCat("deleted at version ", want->version,
                                               " but version ", c.version, " is readable"));
    } else if (c.version < want->version) {
      problem(report.stale,
              absl::StrCat("stale: version ", c.version, " < acknowledged ", want->version));
    } else {
      ++report.ok;
    }
  }
  return report;
}

}  // namespace kvnode::load
