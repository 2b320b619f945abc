#include "kvnode/upgrade/header.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kvnode/base/errno.h"
#include "kvnode/base/unique_fd.h"
#include "kvnode/proto/wire.h"

namespace kvnode::upgrade {
namespace {

using proto::wire::Av;
using proto::wire::Reader;
using proto::wire::SpanWriter;

constexpr size_t kChecksumOffset = kHandoffHeaderSize - 8;

std::string Hex(uint64_t v) { return absl::StrCat("0x", absl::Hex(v)); }

absl::Status ErrnoStatus(int err, std::string_view what) {
  return base::ErrnoStatus(err, absl::StrCat("handoff header: ", Av(what)));
}

absl::Status FieldError(absl::StatusCode code, std::string_view field, std::string_view expected,
                        std::string_view found) {
  return absl::Status(code, absl::StrCat("handoff header: ", Av(field), ": expected ", Av(expected),
                                         ", found ", Av(found)));
}

}  // namespace

absl::Status Compat::Validate() const {
  if (handoff_protocol_version == 0) {
    return absl::InvalidArgumentError("Compat.handoff_protocol_version is 0");
  }
  if (arena_layout_version == 0) {
    return absl::InvalidArgumentError("Compat.arena_layout_version is 0 (unset)");
  }
  if (sizeof_arena_header == 0 || sizeof_limbo_entry == 0) {
    return absl::InvalidArgumentError("Compat.sizeof_arena_header/sizeof_limbo_entry unset");
  }
  return absl::OkStatus();
}

absl::Status ApplyTestIncompatibility(std::string_view what, Compat* c) {
  if (what.empty()) return absl::OkStatus();
  if (what == "layout") {
    c->arena_layout_version += 1000;
  } else if (what == "protocol") {
    c->handoff_protocol_version += 1000;
  } else if (what == "struct") {
    c->sizeof_arena_header += 8;
  } else if (what == "capability") {
    c->required_capabilities |= uint64_t{1} << 63;
    c->supported_capabilities &= ~(uint64_t{1} << 63);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--upgrade_test_incompatible: '", Av(what),
                     "' is not one of layout, protocol, struct, capability"));
  }
  return absl::OkStatus();
}

HandoffHeader HandoffHeader::For(const Compat& c) {
  HandoffHeader h;
  h.handoff_protocol_version = c.handoff_protocol_version;
  h.arena_layout_version = c.arena_layout_version;
  h.sizeof_arena_header = c.sizeof_arena_header;
  h.sizeof_limbo_entry = c.sizeof_limbo_entry;
  h.capabilities = c.supported_capabilities;
  h.required_capabilities = c.required_capabilities;
  h.o_pid = static_cast<uint32_t>(getpid());
  h.created_unix_ns = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  return h;
}

absl::StatusOr<std::string> EncodeHandoffHeader(const HandoffHeader& h) {
  if (h.arena_shm_name.size() > kMaxShmNameSize) {
    return absl::InvalidArgumentError(absl::StrCat("handoff header: arena_shm_name is ",
                                                   h.arena_shm_name.size(), " bytes, limit ",
                                                   kMaxShmNameSize));
  }
  if (h.build_id.size() > kMaxBuildIdSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handoff header: build_id is ", h.build_id.size(), " bytes, limit ", kMaxBuildIdSize));
  }
  std::string out(kHandoffHeaderSize, '\0');
  std::span<uint8_t> bytes(reinterpret_cast<uint8_t*>(out.data()), out.size());
  SpanWriter w(bytes.first(kChecksumOffset));
  w.U64(kHandoffHeaderMagic);
  w.U32(h.header_format);
  w.U32(static_cast<uint32_t>(kHandoffHeaderSize));
  w.U32(h.handoff_protocol_version);
  w.U32(h.arena_layout_version);
  w.U32(h.sizeof_arena_header);
  w.U32(h.sizeof_limbo_entry);
  w.U64(h.capabilities);
  w.U64(h.required_capabilities);
  w.U64(h.arena_size);
  w.U64(h.arena_id);
  w.U64(h.generation);
  w.U32(h.o_pid);
  w.U32(0);  // reserved
  w.U64(h.created_unix_ns);
  w.U16(static_cast<uint16_t>(h.arena_shm_name.size()));
  w.Bytes(h.arena_shm_name);
  w.U16(static_cast<uint16_t>(h.build_id.size()));
  w.Bytes(h.build_id);
  if (!w.ok()) return absl::InternalError("handoff header: encoding overflow");
  proto::wire::StoreLe(bytes.data() + kChecksumOffset, XXH3_64bits(bytes.data(), kChecksumOffset),
                       8);
  return out;
}

absl::StatusOr<HandoffHeader> DecodeHandoffHeader(std::span<const uint8_t> bytes) {
  // The frozen prefix: magic, format, size.
  Reader r(bytes);
  uint64_t magic = 0;
  uint32_t format = 0, size = 0;
  if (!r.U64(&magic) || !r.U32(&format) || !r.U32(&size)) {
    return absl::DataLossError(
        absl::StrCat("handoff header: ", bytes.size(), " bytes, too short for its prefix"));
  }
  if (magic != kHandoffHeaderMagic) {
    return FieldError(absl::StatusCode::kInvalidArgument, "magic", Hex(kHandoffHeaderMagic),
                      Hex(magic));
  }
  if (format != kHandoffHeaderFormat) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "header_format",
                      absl::StrCat(kHandoffHeaderFormat), absl::StrCat(format));
  }
  if (size != kHandoffHeaderSize) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "header_size",
                      absl::StrCat(kHandoffHeaderSize), absl::StrCat(size));
  }
  if (bytes.size() < kHandoffHeaderSize) {
    return FieldError(absl::StatusCode::kDataLoss, "object size",
                      absl::StrCat(">= ", kHandoffHeaderSize, " bytes"),
                      absl::StrCat(bytes.size(), " bytes"));
  }
  const uint64_t stored = proto::wire::LoadLe(bytes.data() + kChecksumOffset, 8);
  const uint64_t computed = XXH3_64bits(bytes.data(), kChecksumOffset);
  if (stored != computed) {
    return FieldError(absl::StatusCode::kDataLoss, "checksum", Hex(computed), Hex(stored));
  }
  Reader f(bytes.first(kChecksumOffset));
  HandoffHeader h;
  uint32_t reserved = 0;
  uint16_t name_len = 0, build_len = 0;
  std::string_view name, build;
  // Cannot run short: the fixed part is far below kChecksumOffset.
  (void)(f.U64(&magic) && f.U32(&h.header_format) && f.U32(&size) &&
         f.U32(&h.handoff_protocol_version) && f.U32(&h.arena_layout_version) &&
         f.U32(&h.sizeof_arena_header) && f.U32(&h.sizeof_limbo_entry) && f.U64(&h.capabilities) &&
         f.U64(&h.required_capabilities) && f.U64(&h.arena_size) && f.U64(&h.arena_id) &&
         f.U64(&h.generation) && f.U32(&h.o_pid) && f.U32(&reserved) && f.U64(&h.created_unix_ns));
  if (reserved != 0) {
    return FieldError(absl::StatusCode::kInvalidArgument, "reserved", "0", absl::StrCat(reserved));
  }
  if (!f.U16(&name_len) || name_len > kMaxShmNameSize || !f.View(name_len, &name)) {
    return FieldError(absl::StatusCode::kInvalidArgument, "arena_shm_name length",
                      absl::StrCat("<= ", kMaxShmNameSize), absl::StrCat(name_len));
  }
  if (!f.U16(&build_len) || build_len > kMaxBuildIdSize || !f.View(build_len, &build)) {
    return FieldError(absl::StatusCode::kInvalidArgument, "build_id length",
                      absl::StrCat("<= ", kMaxBuildIdSize), absl::StrCat(build_len));
  }
  h.arena_shm_name.assign(name);
  h.build_id.assign(build);
  while (f.remaining() > 0) {
    uint8_t b = 0;
    const size_t at = f.pos();
    (void)f.U8(&b);
    if (b != 0) {
      return FieldError(absl::StatusCode::kInvalidArgument, absl::StrCat("padding byte ", at), "0",
                        absl::StrCat(b));
    }
  }
  return h;
}

std::string Mismatch::ToString() const {
  return absl::StrCat(field, ": expected ", expected, ", found ", found);
}

std::vector<Mismatch> CheckCompatibility(const HandoffHeader& h, const Compat& mine,
                                         const HandoffExpectations& expect) {
  std::vector<Mismatch> out;
  auto check = [&out](std::string_view field, uint64_t expected, uint64_t found) {
    if (expected != found) {
      out.push_back({std::string(field), absl::StrCat(expected), absl::StrCat(found)});
    }
  };
  check("handoff_protocol_version", mine.handoff_protocol_version, h.handoff_protocol_version);
  check("arena_layout_version", mine.arena_layout_version, h.arena_layout_version);
  check("sizeof_arena_header", mine.sizeof_arena_header, h.sizeof_arena_header);
  check("sizeof_limbo_entry", mine.sizeof_limbo_entry, h.sizeof_limbo_entry);
  if (const uint64_t missing = h.required_capabilities & ~mine.supported_capabilities;
      missing != 0) {
    out.push_back({"required_capabilities",
                   absl::StrCat("a subset of ", Hex(mine.supported_capabilities)),
                   absl::StrCat(Hex(h.required_capabilities), " (missing ", Hex(missing), ")")});
  }
  if (expect.o_pid != 0) check("o_pid", static_cast<uint64_t>(expect.o_pid), h.o_pid);
  if (!expect.arena_shm_name.empty() && expect.arena_shm_name != h.arena_shm_name) {
    out.push_back({"arena_shm_name", expect.arena_shm_name, h.arena_shm_name});
  }
  if (expect.arena_size != 0) check("arena_size", expect.arena_size, h.arena_size);
  return out;
}

absl::StatusOr<std::string> HandoffHeaderShmName(std::string_view node_shm_name) {
  if (!node_shm_name.empty() && node_shm_name.front() == '/') node_shm_name.remove_prefix(1);
  if (node_shm_name.empty() || node_shm_name.size() > kMaxShmNameSize ||
      node_shm_name.find('/') != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("handoff header: shm name '", Av(node_shm_name),
                                                   "' must be 1..", kMaxShmNameSize,
                                                   " bytes without '/'"));
  }
  return absl::StrCat("/", Av(node_shm_name), ".handoff");
}

namespace {

// What is at the handoff header's name: NotFound when nothing, OK when a
// regular object of this uid (a stale header of an upgrade that died, ours to
// replace), otherwise the refusal. The name is predictable from --shm_name, so
// any local user can create it first; the refusal names the file and its
// owner, because nothing else tells the operator why every upgrade fails. The
// object is opened with O_PATH | O_NOFOLLOW: neither a mode that denies us
// reading nor a symbolic link hides its owner.
absl::Status CheckExistingHandoffObject(const std::string& name) {
  const std::string path = "/dev/shm" + name;
  base::UniqueFd fd(open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no ", path));
    return ErrnoStatus(errno, absl::StrCat("handoff header: open ", path));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", path));
  const uid_t me = geteuid();
  if (st.st_uid == me && S_ISREG(st.st_mode)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "handoff header: ", path, " already exists",
      S_ISLNK(st.st_mode)   ? " as a symbolic link"
      : S_ISREG(st.st_mode) ? ""
                            : " and is not a regular file",
      ", owned by uid ", st.st_uid, " (this node runs as uid ", me,
      "): it blocks every live upgrade of this node; remove it (its owner or root can) or give "
      "the node another --shm_name"));
}

}  // namespace

absl::Status WriteHandoffHeader(std::string_view object_name, const HandoffHeader& h) {
  absl::StatusOr<std::string> bytes = EncodeHandoffHeader(h);
  if (!bytes.ok()) return bytes.status();
  const std::string name(object_name);
  // A stale object (an upgrade that died) is ours to replace; someone else's is not.
  if (absl::Status s = CheckExistingHandoffObject(name); s.ok()) {
    if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, absl::StrCat("shm_unlink stale ", name));
    }
  } else if (!absl::IsNotFound(s)) {
    return s;
  }
  base::UniqueFd fd(shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    const int err = errno;
    // Created by someone else since the check: the same refusal.
    if (err == EEXIST) {
      if (absl::Status s = CheckExistingHandoffObject(name); !s.ok() && !absl::IsNotFound(s)) {
        return s;
      }
    }
    return ErrnoStatus(err, absl::StrCat("shm_open(O_CREAT|O_EXCL) ", name));
  }
  auto fail = [&name](absl::Status s) {
    (void)shm_unlink(name.c_str());
    return s;
  };
  if (fchmod(fd.get(), 0600) != 0) return fail(ErrnoStatus(errno, "fchmod 0600"));  // umask
  size_t done = 0;
  while (done < bytes->size()) {
    const ssize_t n =
        pwrite(fd.get(), bytes->data() + done, bytes->size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(ErrnoStatus(n < 0 ? errno : EIO, absl::StrCat("pwrite ", name)));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<HandoffHeader> ReadHandoffHeader(std::string_view object_name) {
  const std::string name(object_name);
  base::UniqueFd fd(shm_open(name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("shm_open ", name));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", name));
  if (st.st_uid != geteuid()) {
    return FieldError(absl::StatusCode::kPermissionDenied, absl::StrCat(name, " owner uid"),
                      absl::StrCat(geteuid()), absl::StrCat(st.st_uid));
  }
  if ((st.st_mode & 077) != 0) {
    return FieldError(absl::StatusCode::kPermissionDenied, absl::StrCat(name, " mode"), "0600",
                      absl::StrFormat("%04o", st.st_mode & 07777));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat("handoff header: ", name, " not a file"));
  }
  std::string bytes(kHandoffHeaderSize, '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        pread(fd.get(), bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, absl::StrCat("pread ", name));
    if (n == 0) break;  // short object: the decoder says what is missing
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return DecodeHandoffHeader(AsBytes(bytes));
}

absl::Status RemoveHandoffHeader(std::string_view object_name) {
  const std::string name(object_name);
  if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("shm_unlink ", name));
  }
  return absl::OkStatus();
}

absl::StatusOr<HandoffHeader> ReadAndValidateHandoffHeader(std::string_view object_name,
                                                           const Compat& mine,
                                                           const HandoffExpectations& expect,
                                                           std::vector<Mismatch>* mismatches) {
  absl::StatusOr<HandoffHeader> h = ReadHandoffHeader(object_name);
  if (!h.ok()) return h.status();
  std::vector<Mismatch> m = CheckCompatibility(*h, mine, expect);
  if (!m.empty()) {
    std::vector<std::string> parts;
    for (const Mismatch& x : m) parts.push_back(x.ToString());
    absl::Status s = absl::FailedPreconditionError(
        absl::StrCat("handoff header incompatible (O pid ", h->o_pid, ", build '", h->build_id,
                     "'): ", absl::StrJoin(parts, "; ")));
    if (mismatches != nullptr) *mismatches = std::move(m);
    return s;
  }
  if (mismatches != nullptr) mismatches->clear();
  return h;
}

}  // namespace kvnode::upgrade
