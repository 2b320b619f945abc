#include "journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "kvnode/storage/format.h"
#include "kvnode/storage/limits.h"

namespace kvnode::storage {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'J', 'R', 'N', 'L', '0', '1'};
constexpr size_t kRecordHeader = 16;  // u32 size, u32 0, u64 checksum
constexpr size_t kOpHeader = 12;      // u8 kind, u8 cf, u16 0, u32 key size, u32 value size
constexpr size_t kMaxOps = WriteJournal::kMaxRecordOps;
constexpr size_t kMaxOpBytes = kOpHeader + 4096 + kMaxValueSize + 64;

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status SyncDir(const std::string& path) {
  base::UniqueFd dir(::open(DirOf(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return base::ErrnoStatus(errno, absl::StrCat("open directory of ", path));
  if (::fsync(dir.get()) != 0) return base::ErrnoStatus(errno, "fsync the journal's directory");
  return absl::OkStatus();
}

// Renames `from` to `to` (same directory) and syncs the directory.
absl::Status RenameSynced(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return base::ErrnoStatus(errno, absl::StrCat("rename ", from, " to ", to));
  }
  return SyncDir(to);
}

// Opens one of the journal's files that exists (the journal, its spare, the
// retired one) without following a symbolic link at its name (nor blocking
// on a FIFO): NotFound when there is nothing, FailedPrecondition naming it
// when what is there is not a regular file. The database directory is the
// node's own (checked at start), so a link there is a mistake or an attack:
// writing through it would truncate or fill a file of someone's choice.
absl::StatusOr<base::UniqueFd> OpenExisting(const std::string& path, int flags) {
  base::UniqueFd fd(::open(path.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (!fd.valid() && errno != ELOOP) return base::ErrnoStatus(errno, absl::StrCat("open ", path));
  if (fd.valid() && ::fstat(fd.get(), &st) != 0) {
    return base::ErrnoStatus(errno, absl::StrCat("stat ", path));
  }
  if (!fd.valid() || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, fd.valid() ? " is not a regular file" : " is a symbolic link",
        ": not followed (the node's files in its database directory are regular files)"));
  }
  return fd;
}

absl::Status WriteAll(int fd, const char* p, size_t n, uint64_t off, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return base::ErrnoStatus(w < 0 ? errno : EIO, absl::StrCat("write ", path));
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

// Decodes one record's payload; false when it is malformed.
bool DecodePayload(const char* p, size_t n, std::vector<JournalOp>* ops) {
  if (n < 4) return false;
  const uint32_t count = LoadU32(p);
  if (count == 0 || count > kMaxOps) return false;
  size_t at = 4;
  for (uint32_t i = 0; i < count; ++i) {
    if (n - at < kOpHeader) return false;
    JournalOp op;
    const uint8_t kind = static_cast<uint8_t>(p[at]);
    if (kind != 1 && kind != 2) return false;
    op.kind = static_cast<JournalOp::Kind>(kind);
    op.cf = static_cast<uint8_t>(p[at + 1]);
    const uint32_t ks = LoadU32(p + at + 4);
    const uint32_t vs = LoadU32(p + at + 8);
    at += kOpHeader;
    if (n - at < uint64_t{ks} + vs) return false;
    op.key.assign(p + at, ks);
    op.value.assign(p + at + ks, vs);
    at += ks + vs;
    ops->push_back(std::move(op));
  }
  return at == n;
}

}  // namespace

std::string WriteJournal::PathFor(const std::string& db_path) {
  return absl::StrCat(db_path, "/kvnode-writes.journal");
}

namespace {

absl::Status WriteZeros(int fd, uint64_t from, uint64_t to, const std::string& path) {
  const std::string zeros(size_t{1} << 20, '\0');
  for (uint64_t off = from; off < to; off += zeros.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(zeros.size(), to - off));
    if (absl::Status s = WriteAll(fd, zeros.data(), n, off, path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FileSize(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return base::ErrnoStatus(errno, absl::StrCat("stat ", path));
  return static_cast<uint64_t>(st.st_size);
}

// A new file at `path` (replacing one there), `bytes` long, allocated, with
// the header and nothing after it, synced (the directory is not). Whatever
// was at the name is unlinked and the file created O_EXCL | O_NOFOLLOW: a
// symbolic link there is removed, never written through.
absl::StatusOr<base::UniqueFd> AllocateEmpty(const std::string& path, uint64_t bytes) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return base::ErrnoStatus(errno, absl::StrCat("remove ", path, " to create it anew"));
  }
  base::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return base::ErrnoStatus(errno, absl::StrCat("create ", path));
  // Blocks allocated up front (they read as zeros), so that an append never
  // grows the file or runs out of space; zeros written where the file system
  // cannot allocate without writing. The header last: a crash before it
  // leaves a file without records.
  if (::fallocate(fd.get(), 0, 0, static_cast<off_t>(bytes)) != 0) {
    if (errno != EOPNOTSUPP) {
      return base::ErrnoStatus(errno, absl::StrCat("allocate ", bytes, " bytes for ", path));
    }
    if (absl::Status s = WriteZeros(fd.get(), 0, bytes, path); !s.ok()) return s;
  }
  char header[WriteJournal::kHeaderSize] = {};
  std::memcpy(header, kMagic, sizeof(kMagic));
  if (absl::Status s = WriteAll(fd.get(), header, sizeof(header), 0, path); !s.ok()) return s;
  if (::fsync(fd.get()) != 0) return base::ErrnoStatus(errno, absl::StrCat("fsync ", path));
  return fd;
}

// Whether fd is a journal `bytes` long whose first record is the end: what
// AllocateEmpty and Recycle leave (zeros after the header).
absl::StatusOr<bool> IsEmptyJournal(int fd, uint64_t bytes, const std::string& path) {
  absl::StatusOr<uint64_t> size = FileSize(fd, path);
  if (!size.ok()) return size.status();
  char head[WriteJournal::kHeaderSize + kRecordHeader];
  if (*size != bytes || ::pread(fd, head, sizeof(head), 0) != static_cast<ssize_t>(sizeof(head))) {
    return false;
  }
  return std::memcmp(head, kMagic, sizeof(kMagic)) == 0 &&
         LoadU32(head + WriteJournal::kHeaderSize) == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WriteJournal>> WriteJournal::Create(const std::string& path,
                                                                   uint64_t bytes) {
  if (bytes < kHeaderSize + kRecordHeader + kMaxOpBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("journal of ", bytes, " bytes cannot hold one largest write"));
  }
  absl::StatusOr<std::vector<std::vector<JournalOp>>> old = ReadAll(path);
  if (!old.ok()) return old.status();
  if (!old->empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " holds ", old->size(), " journaled writes that were never replayed into RocksDB"));
  }
  absl::StatusOr<std::unique_ptr<WriteJournal>> spare = TakeSpare(path, bytes);
  if (!spare.ok() || *spare != nullptr) return spare;
  absl::StatusOr<base::UniqueFd> fd = AllocateEmpty(path, bytes);
  if (!fd.ok()) return fd.status();
  if (absl::Status s = SyncDir(path); !s.ok()) return s;
  return std::unique_ptr<WriteJournal>(new WriteJournal(path, std::move(*fd), bytes));
}

std::string WriteJournal::SparePathFor(const std::string& path) {
  return absl::StrCat(path, ".spare");
}

absl::StatusOr<std::unique_ptr<WriteJournal>> WriteJournal::TakeSpare(const std::string& path,
                                                                      uint64_t bytes) {
  const std::string spare = SparePathFor(path);
  absl::StatusOr<base::UniqueFd> fd = OpenExisting(spare, O_RDWR);
  if (absl::IsNotFound(fd.status())) return nullptr;
  if (absl::IsFailedPrecondition(fd.status())) {  // a link: removed, the spare made anew
    if (absl::Status s = Remove(spare); !s.ok()) return s;
    return nullptr;
  }
  if (!fd.ok()) return fd.status();
  absl::StatusOr<bool> fits = IsEmptyJournal(fd->get(), bytes, spare);
  if (!fits.ok()) return fits.status();
  if (!*fits) {  // another --upgrade_journal_mb, or not one of ours
    if (absl::Status s = Remove(spare); !s.ok()) return s;
    return nullptr;
  }
  if (absl::Status s = RenameSynced(spare, path); !s.ok()) return s;
  return std::unique_ptr<WriteJournal>(new WriteJournal(path, std::move(*fd), bytes));
}

absl::Status WriteJournal::MakeSpare(const std::string& path, uint64_t bytes) {
  const std::string spare = SparePathFor(path);
  // A link or anything else at the spare's name is replaced by the rename
  // below (the name, not what it points at).
  absl::StatusOr<base::UniqueFd> fd = OpenExisting(spare, O_RDONLY);
  if (fd.ok()) {
    absl::StatusOr<bool> fits = IsEmptyJournal(fd->get(), bytes, spare);
    if (!fits.ok() || *fits) return fits.status();
  } else if (!absl::IsNotFound(fd.status()) && !absl::IsFailedPrecondition(fd.status())) {
    return fd.status();
  }
  const std::string tmp = absl::StrCat(spare, ".tmp");
  absl::StatusOr<base::UniqueFd> made = AllocateEmpty(tmp, bytes);
  if (!made.ok()) return made.status();
  return RenameSynced(tmp, spare);
}

absl::Status WriteJournal::Recycle(const std::string& path, uint64_t written) {
  const std::string retired = RetiredPathFor(path);
  absl::StatusOr<base::UniqueFd> opened = OpenExisting(retired, O_RDWR);
  if (!opened.ok()) return opened.status();
  base::UniqueFd fd = std::move(*opened);
  absl::StatusOr<uint64_t> size = FileSize(fd.get(), retired);
  if (!size.ok()) return size.status();
  char magic[sizeof(kMagic)];
  if (::pread(fd.get(), magic, sizeof(magic), 0) != static_cast<ssize_t>(sizeof(magic)) ||
      std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(retired, " is not a kvnode write journal"));
  }
  const uint64_t to = std::min(written, *size);
  if (absl::Status s = WriteZeros(fd.get(), kHeaderSize, to, retired); !s.ok()) return s;
  if (::fdatasync(fd.get()) != 0) {
    return base::ErrnoStatus(errno, absl::StrCat("fdatasync ", retired));
  }
  return RenameSynced(retired, SparePathFor(path));
}

absl::Status WriteJournal::Append(std::span<const JournalOp> ops, bool sync) {
  if (ops.empty() || ops.size() > kMaxOps) {
    return absl::InvalidArgumentError(absl::StrCat("a journal record of ", ops.size(), " ops"));
  }
  buf_.assign(kRecordHeader + 4, '\0');
  StoreU32(buf_.data() + kRecordHeader, static_cast<uint32_t>(ops.size()));
  for (const JournalOp& op : ops) {
    char h[kOpHeader] = {};
    h[0] = static_cast<char>(op.kind);
    h[1] = static_cast<char>(op.cf);
    StoreU32(h + 4, static_cast<uint32_t>(op.key.size()));
    StoreU32(h + 8, static_cast<uint32_t>(op.value.size()));
    buf_.append(h, sizeof(h));
    buf_.append(op.key);
    buf_.append(op.value);
  }
  const size_t payload = buf_.size() - kRecordHeader;
  if (end_ + buf_.size() > size_) {
    return absl::ResourceExhaustedError(absl::StrCat("the write journal ", path_, " is full (",
                                                     size_, " bytes, ", records_, " writes)"));
  }
  StoreU32(buf_.data(), static_cast<uint32_t>(payload));
  StoreU64(buf_.data() + 8, XXH3_64bits(buf_.data() + kRecordHeader, payload));
  written_to_ = std::max(written_to_, end_ + buf_.size());
  if (absl::Status s = WriteAll(fd_.get(), buf_.data(), buf_.size(), end_, path_); !s.ok()) {
    return s;
  }
  if (sync && ::fdatasync(fd_.get()) != 0) {
    return base::ErrnoStatus(errno, absl::StrCat("fdatasync ", path_));
  }
  end_ += buf_.size();
  ++records_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<JournalOp>>> WriteJournal::ReadAll(const std::string& path) {
  uint64_t end = 0;
  return ReadFrom(path, 0, &end);
}

namespace {

// Reads [off, off + n) of fd into *out (shorter at the end of the file).
absl::Status ReadAt(int fd, uint64_t off, size_t n, std::string* out, const std::string& path) {
  out->resize(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, out->data() + got, n - got, static_cast<off_t>(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return base::ErrnoStatus(errno, absl::StrCat("read ", path));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  out->resize(got);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::vector<JournalOp>>> WriteJournal::ReadFrom(const std::string& path,
                                                                           uint64_t from,
                                                                           uint64_t* end) {
  std::vector<std::vector<JournalOp>> out;
  *end = std::max<uint64_t>(from, kHeaderSize);
  absl::StatusOr<base::UniqueFd> opened = OpenExisting(path, O_RDONLY);
  if (absl::IsNotFound(opened.status())) return out;
  if (!opened.ok()) return opened.status();
  const base::UniqueFd fd = std::move(*opened);
  std::string header;
  if (absl::Status s = ReadAt(fd.get(), 0, kHeaderSize, &header, path); !s.ok()) return s;
  // A file cut short before its header was written (a crash while creating
  // it) holds no write.
  if (header.size() < kHeaderSize || std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0) {
    if (std::all_of(header.begin(), header.end(), [](char c) { return c == 0; })) return out;
    return absl::DataLossError(absl::StrCat(path, " is not a kvnode write journal"));
  }
  // Records are read a chunk at a time, as far as they go (the file is
  // allocated far beyond them).
  std::string buf;
  uint64_t buf_off = 0;
  // Whether buf holds [off, off + len) (read from off when it does not).
  auto window = [&](uint64_t off, size_t len) -> absl::StatusOr<bool> {
    if (off >= buf_off && off + len <= buf_off + buf.size()) return true;
    buf_off = off;
    if (absl::Status s = ReadAt(fd.get(), off, std::max(len, size_t{1} << 20), &buf, path);
        !s.ok()) {
      return s;
    }
    return buf.size() >= len;
  };
  for (;;) {
    absl::StatusOr<bool> has = window(*end, kRecordHeader);
    if (!has.ok()) return has.status();
    if (!*has) break;
    const uint32_t n = LoadU32(buf.data() + (*end - buf_off));
    if (n == 0) break;
    has = window(*end, kRecordHeader + n);
    if (!has.ok()) return has.status();
    if (!*has) break;  // runs past the end of the file: torn
    const char* rec = buf.data() + (*end - buf_off);
    if (XXH3_64bits(rec + kRecordHeader, n) != LoadU64(rec + 8)) break;
    std::vector<JournalOp> ops;
    if (!DecodePayload(rec + kRecordHeader, n, &ops)) break;
    out.push_back(std::move(ops));
    *end += kRecordHeader + n;
  }
  return out;
}

std::string WriteJournal::RetiredPathFor(const std::string& path) {
  return absl::StrCat(path, ".retired");
}

absl::Status WriteJournal::Retire(const std::string& path) {
  if (::rename(path.c_str(), RetiredPathFor(path).c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return base::ErrnoStatus(errno, absl::StrCat("rename ", path));
  }
  return SyncDir(path);
}

absl::Status WriteJournal::Remove(const std::string& path) {
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return base::ErrnoStatus(errno, absl::StrCat("remove ", path));
  }
  return SyncDir(path);
}

}  // namespace kvnode::storage
