#include "kvnode/load/history.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"

namespace kvnode::load {
namespace {

using base::Av;

void AppendU64(uint64_t v, std::string* out) {
  char buf[20];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, static_cast<size_t>(r.ptr - buf));
}

bool ParseU64(std::string_view s, uint64_t* v) {
  if (s.empty()) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool ParseKind(std::string_view s, HistoryOpKind* k) {
  if (s == "GET") {
    *k = HistoryOpKind::kGet;
  } else if (s == "PUT") {
    *k = HistoryOpKind::kPut;
  } else if (s == "DELETE") {
    *k = HistoryOpKind::kDelete;
  } else {
    return false;
  }
  return true;
}

bool ParseOutcome(std::string_view s, HistoryOutcome* o) {
  if (s == "ok") {
    *o = HistoryOutcome::kOk;
  } else if (s == "not_found") {
    *o = HistoryOutcome::kNotFound;
  } else if (s == "failed") {
    *o = HistoryOutcome::kFailed;
  } else {
    return false;
  }
  return true;
}

absl::Status Invalid(std::string_view why, std::string_view line) {
  return absl::InvalidArgumentError(absl::StrCat(Av(why), ": \"", Av(line.substr(0, 200)), "\""));
}

}  // namespace

std::string_view HistoryOpKindName(HistoryOpKind k) {
  switch (k) {
    case HistoryOpKind::kGet:
      return "GET";
    case HistoryOpKind::kPut:
      return "PUT";
    case HistoryOpKind::kDelete:
      return "DELETE";
  }
  return "?";
}

std::string_view HistoryOutcomeName(HistoryOutcome o) {
  switch (o) {
    case HistoryOutcome::kOk:
      return "ok";
    case HistoryOutcome::kNotFound:
      return "not_found";
    case HistoryOutcome::kFailed:
      return "failed";
  }
  return "?";
}

void AppendHistoryLine(const HistoryEvent& e, std::string* out) {
  AppendU64(e.client, out);
  out->push_back('\t');
  out->append(HistoryOpKindName(e.kind));
  out->push_back('\t');
  out->append(e.key);
  out->push_back('\t');
  AppendU64(e.call_ns, out);
  out->push_back('\t');
  AppendU64(e.return_ns, out);
  out->push_back('\t');
  out->append(HistoryOutcomeName(e.outcome));
  out->push_back('\t');
  if (e.value.empty()) {
    out->push_back('-');
  } else {
    out->append(e.value);
  }
  out->push_back('\n');
}

absl::StatusOr<HistoryOp> ParseHistoryLine(std::string_view line) {
  std::string_view f[7];
  size_t n = 0;
  std::string_view rest = line;
  for (;;) {
    const size_t tab = rest.find('\t');
    if (n == 7) return Invalid("more than 7 fields", line);
    f[n++] = rest.substr(0, tab);
    if (tab == std::string_view::npos) break;
    rest.remove_prefix(tab + 1);
  }
  if (n != 7) return Invalid("expected 7 TAB-separated fields", line);
  HistoryOp op;
  uint64_t client = 0;
  if (!ParseU64(f[0], &client) || client > UINT32_MAX) return Invalid("bad client", line);
  op.client = static_cast<uint32_t>(client);
  if (!ParseKind(f[1], &op.kind)) return Invalid("op is not GET, PUT or DELETE", line);
  if (f[2].empty() || f[2].find_first_of("\r\n") != std::string_view::npos) {
    return Invalid("bad key", line);
  }
  op.key = std::string(f[2]);
  if (!ParseU64(f[3], &op.call_ns) || !ParseU64(f[4], &op.return_ns)) {
    return Invalid("bad call_ns or return_ns", line);
  }
  if (op.call_ns > op.return_ns) return Invalid("call_ns after return_ns", line);
  if (!ParseOutcome(f[5], &op.outcome)) {
    return Invalid("outcome is not ok, not_found or failed", line);
  }
  if (f[6].empty()) return Invalid("empty value (write \"-\" for none)", line);
  if (f[6] != "-") op.value = std::string(f[6]);
  const bool has_value = !op.value.empty();
  switch (op.kind) {
    case HistoryOpKind::kPut:
      if (!has_value) return Invalid("PUT without a value", line);
      if (op.outcome == HistoryOutcome::kNotFound) return Invalid("PUT answered not_found", line);
      break;
    case HistoryOpKind::kGet:
      if ((op.outcome == HistoryOutcome::kOk) != has_value) {
        return Invalid("a GET has a value exactly when it is ok", line);
      }
      break;
    case HistoryOpKind::kDelete:
      if (has_value) return Invalid("DELETE with a value", line);
      break;
  }
  return op;
}

absl::StatusOr<std::vector<HistoryOp>> ParseHistory(std::string_view text, std::string_view name) {
  std::vector<HistoryOp> ops;
  uint64_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    if (line_no == 1 && line != kHistoryHeader) {
      return absl::InvalidArgumentError(
          absl::StrCat(Av(name), ":1: not a history file (the first line must be \"",
                       Av(kHistoryHeader), "\")"));
    }
    if (line.empty() || line[0] == '#') continue;
    absl::StatusOr<HistoryOp> op = ParseHistoryLine(line);
    if (!op.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Av(name), ":", line_no, ": ", op.status().message()));
    }
    op->line = line_no;
    ops.push_back(*std::move(op));
  }
  if (line_no == 0) {
    return absl::InvalidArgumentError(absl::StrCat(Av(name), ": empty, not a history file"));
  }
  return ops;
}

absl::StatusOr<std::vector<HistoryOp>> ReadHistory(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return base::ErrnoStatus(errno, absl::StrCat("history ", path, ": open"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return base::ErrnoStatus(errno, absl::StrCat("history ", path, ": read"));
  return ParseHistory(ss.str(), path);
}

absl::StatusOr<std::unique_ptr<HistoryWriter>> HistoryWriter::Create(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return base::ErrnoStatus(errno, absl::StrCat("history ", path, ": open"));
  std::unique_ptr<HistoryWriter> w(new HistoryWriter(fd, path));
  if (absl::Status st = w->Append(absl::StrCat(Av(kHistoryHeader), "\n")); !st.ok()) return st;
  return w;
}

HistoryWriter::~HistoryWriter() { (void)Close(); }

absl::Status HistoryWriter::Append(std::string_view lines) {
  absl::MutexLock l(&mu_);
  if (!sticky_error_.ok()) return sticky_error_;
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("history ", path_, ": closed"));
  while (!lines.empty()) {
    const ssize_t n = write(fd_, lines.data(), lines.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      sticky_error_ = base::ErrnoStatus(errno, absl::StrCat("history ", path_, ": write"));
      return sticky_error_;
    }
    lines.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status HistoryWriter::Close() {
  absl::MutexLock l(&mu_);
  if (fd_ >= 0) {
    if (close(fd_) != 0 && sticky_error_.ok()) {
      sticky_error_ = base::ErrnoStatus(errno, absl::StrCat("history ", path_, ": close"));
    }
    fd_ = -1;
  }
  return sticky_error_;
}

}  // namespace kvnode::load
