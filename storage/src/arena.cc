#include "kvnode/storage/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <bit>
#include <boost/interprocess/indexes/iset_index.hpp>
#include <boost/interprocess/managed_mapped_file.hpp>
#include <boost/interprocess/managed_shared_memory.hpp>
#include <boost/interprocess/mem_algo/rbtree_best_fit.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/sync/mutex_family.hpp>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <new>
#include <random>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "kvnode/base/errno.h"

namespace kvnode::storage {
namespace bip = boost::interprocess;

namespace {

// No process-shared mutex in the segment: one process writes the arena at a
// time (the live-upgrade handoff passes that right from O to N), and a mutex
// held by a process killed inside the allocator would never be released.
using Allocator = bip::rbtree_best_fit<bip::null_mutex_family>;
using ShmSegment = bip::basic_managed_shared_memory<char, Allocator, bip::iset_index>;
using FileSegment = bip::basic_managed_mapped_file<char, Allocator, bip::iset_index>;
using SegmentManager = ShmSegment::segment_manager;
static_assert(std::is_same_v<SegmentManager, FileSegment::segment_manager>,
              "shared memory and mapped file arenas must share one allocator type");
static_assert(std::is_trivially_copyable_v<ArenaHeader>);
static_assert(sizeof(LimboEntry) == 32);

// Boost's managed segments begin with a 32-bit state word; 2 = initialized.
// Boost spins forever on a segment whose word says "uninitialized", so we
// check it ourselves before handing the segment to Boost.
constexpr uint32_t kBoostInitializedSegment = 2;

std::string ShmPath(const std::string& name) { return "/dev/shm/" + name; }

std::string SegmentPath(const ArenaOptions& o) {
  return o.file_path.empty() ? ShmPath(o.shm_name) : o.file_path;
}

uint64_t HeaderChecksum(const ArenaHeader& h) {
  return XXH3_64bits(&h, offsetof(ArenaHeader, header_checksum));
}

// Unit the mapping size is rounded to: the page size, or for a file the file
// system's block size (the huge page size on hugetlbfs).
absl::StatusOr<uint64_t> SizeUnit(const ArenaOptions& o) {
  uint64_t unit = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (!o.file_path.empty()) {
    std::string dir = o.file_path;
    const size_t slash = dir.find_last_of('/');
    dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : dir.substr(0, slash));
    struct statfs fs;
    if (statfs(dir.c_str(), &fs) != 0) {
      return base::ErrnoStatus(errno,
                               absl::StrCat("statfs(", dir, ") for arena file ", o.file_path));
    }
    if (static_cast<uint64_t>(fs.f_bsize) > unit) unit = static_cast<uint64_t>(fs.f_bsize);
  }
  return unit;
}

uint64_t RoundUp(uint64_t v, uint64_t unit) { return (v + unit - 1) / unit * unit; }

// Where the Boost segment keeps things depends on the allocator type (its
// mutex family above all), so a segment of another layout version must be
// refused before Boost interprets it: Boost would read its own structures at
// the wrong offsets. The header is the segment's first allocation, a few
// hundred bytes in; find its magic and check the layout version that follows.
absl::Status PrecheckLayout(int fd, const std::string& path) {
  constexpr size_t kScan = 4096;
  char buf[kScan];
  const ssize_t n = pread(fd, buf, kScan, 0);
  if (n < 0) return base::ErrnoStatus(errno, absl::StrCat("read arena segment ", path));
  for (size_t off = 0; off + 12 <= static_cast<size_t>(n); off += 8) {
    if (LoadU64(buf + off) != kArenaMagic) continue;
    const uint32_t version = LoadU32(buf + off + 8);
    if (version == kLayoutVersion) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("arena segment ", path, ": layout version ",
                                                      version, ", this build uses ",
                                                      kLayoutVersion));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("arena segment ", path, ": bad magic: no kvnode header where layout version ",
                   kLayoutVersion, " puts it (not a kvnode arena, or another layout)"));
}

// Checks owner, mode and Boost's state word of an existing segment before
// mapping it. NotFound when it does not exist.
absl::Status PrecheckSegment(const ArenaOptions& o) {
  const std::string path = SegmentPath(o);
  int fd = o.file_path.empty() ? shm_open(("/" + o.shm_name).c_str(), O_RDONLY, 0)
                               : open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("no arena segment at ", path));
    return base::ErrnoStatus(err, absl::StrCat("open arena segment ", path));
  }
  struct stat st;
  absl::Status status;
  uint32_t state = 0;
  if (fstat(fd, &st) != 0) {
    status = base::ErrnoStatus(errno, absl::StrCat("fstat arena segment ", path));
  } else if (st.st_uid != geteuid()) {
    status = absl::PermissionDeniedError(absl::StrCat("arena segment ", path, " is owned by uid ",
                                                      st.st_uid, ", not by this user (uid ",
                                                      geteuid(), "); refusing to attach"));
  } else if ((st.st_mode & 077) != 0) {
    status = absl::PermissionDeniedError(absl::StrCat(
        "arena segment ", path, " has mode 0", (st.st_mode & 0777) >> 6, (st.st_mode & 077) >> 3,
        st.st_mode & 07, ": group/other access, expected 0600; refusing to attach"));
  } else if (st.st_size < 4096) {
    status = absl::FailedPreconditionError(absl::StrCat("arena segment ", path, " is only ",
                                                        st.st_size, " bytes: not a kvnode arena"));
  } else if (pread(fd, &state, sizeof(state), 0) != sizeof(state)) {
    status = base::ErrnoStatus(errno, absl::StrCat("read arena segment ", path));
  } else if (state != kBoostInitializedSegment) {
    status = absl::FailedPreconditionError(
        absl::StrCat("arena segment ", path, " is not an initialized segment (state word ", state,
                     "): not a kvnode arena, or its creation was interrupted"));
  } else {
    status = PrecheckLayout(fd, path);
  }
  close(fd);
  return status;
}

}  // namespace

absl::Status ArenaOptions::Validate() const {
  if (file_path.empty()) {
    if (shm_name.empty() || shm_name.size() > 200 || shm_name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("arena: shm_name '", shm_name, "' must be 1..200 chars without '/'"));
    }
  } else if (file_path.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("arena: file_path '", file_path, "' is a dir"));
  }
  if (size < (uint64_t{1} << 20) || size > kMaxArenaSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena: size ", size, " must be in [1 MiB, 512 GiB]"));
  }
  if (bucket_size % kSlotLineSize != 0 || bucket_size < kMinBucketSize ||
      bucket_size > kMaxBucketSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena: bucket_size ", bucket_size, " must be a multiple of 64 in [64, 512]"));
  }
  if (bucket_count != 0 &&
      (!std::has_single_bit(bucket_count) || bucket_count * bucket_size > size / 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena: bucket_count ", bucket_count, " must be a power of two whose index (",
                     bucket_count * bucket_size, " bytes) takes at most half the arena"));
  }
  if (limbo_capacity < 16 || limbo_capacity > (1u << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena: limbo_capacity ", limbo_capacity, " must be in [16, 2^24]"));
  }
  return absl::OkStatus();
}

struct Arena::Impl {
  std::unique_ptr<ShmSegment> shm;
  std::unique_ptr<FileSegment> file;
  SegmentManager* sm = nullptr;
  void* user_address = nullptr;
  uint64_t user_size = 0;
};

Arena::Arena(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Arena::~Arena() = default;

absl::Status Arena::Remove(const ArenaOptions& options) {
  const std::string path = SegmentPath(options);
  const int rc = options.file_path.empty() ? shm_unlink(("/" + options.shm_name).c_str())
                                           : unlink(options.file_path.c_str());
  if (rc != 0 && errno != ENOENT)
    return base::ErrnoStatus(errno, absl::StrCat("remove arena ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::Create(const ArenaOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  absl::StatusOr<uint64_t> unit = SizeUnit(options);
  if (!unit.ok()) return unit.status();
  const uint64_t size = RoundUp(options.size, *unit);
  if (absl::Status s = PrecheckSegment(options); s.code() == absl::StatusCode::kPermissionDenied) {
    return s;  // never remove a segment that is not ours
  }
  if (absl::Status s = Remove(options); !s.ok()) return s;

  auto impl = std::make_unique<Impl>();
  bip::permissions perm;
  perm.set_permissions(0600);
  try {
    if (options.file_path.empty()) {
      impl->shm = std::make_unique<ShmSegment>(bip::create_only, options.shm_name.c_str(), size,
                                               nullptr, perm);
      impl->sm = impl->shm->get_segment_manager();
      impl->user_address = impl->shm->get_address();
      impl->user_size = impl->shm->get_size();
    } else {
      impl->file = std::make_unique<FileSegment>(bip::create_only, options.file_path.c_str(), size,
                                                 nullptr, perm);
      impl->sm = impl->file->get_segment_manager();
      impl->user_address = impl->file->get_address();
      impl->user_size = impl->file->get_size();
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("create arena segment ", SegmentPath(options), " (",
                                            size, " bytes): ", e.what()));
  }

  std::unique_ptr<Arena> arena(new Arena(std::move(impl)));
  Impl& im = *arena->impl_;
  arena->path_ = SegmentPath(options);
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  arena->base_ =
      reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(im.user_address) & ~(page - 1));
  arena->size_ =
      im.user_size + static_cast<uint64_t>(static_cast<char*>(im.user_address) - arena->base_);

  uint64_t buckets = options.bucket_count;
  if (buckets == 0) {
    buckets = std::bit_floor(std::max<uint64_t>(1, size / 8 / options.bucket_size));
  }
  // The retire ring takes at most 1/16 of the arena.
  const uint64_t limbo_capacity = std::max<uint64_t>(
      16, std::min<uint64_t>(options.limbo_capacity, size / 16 / sizeof(LimboEntry)));
  ArenaHeader* h = nullptr;
  void* index = nullptr;
  void* limbo = nullptr;
  try {
    h = im.sm->construct<ArenaHeader>(kArenaHeaderName)();
    index = im.sm->allocate_aligned(buckets * options.bucket_size, 4096);
    limbo = im.sm->allocate_aligned(limbo_capacity * sizeof(LimboEntry), 64);
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("arena of ", size, " bytes cannot hold an index of ", buckets, " x ",
                     options.bucket_size, " bytes and its retire ring: ", e.what()));
  }
  std::memset(index, 0, buckets * options.bucket_size);
  std::memset(limbo, 0, limbo_capacity * sizeof(LimboEntry));
  std::memset(static_cast<void*>(h), 0, sizeof(*h));

  std::random_device rd;
  auto rand64 = [&rd] { return (uint64_t{rd()} << 32) | rd(); };
  h->magic = kArenaMagic;
  h->layout_version = kLayoutVersion;
  h->header_size = sizeof(ArenaHeader);
  h->mapping_size = arena->size_;
  h->index_offset = arena->OffsetOf(index);
  h->bucket_count = buckets;
  h->bucket_size = options.bucket_size;
  h->slots_per_bucket = kSlotsPerBucket;
  h->hash_seed = options.hash_seed != 0 ? options.hash_seed : rand64();
  do {
    h->arena_id = rand64();
  } while (h->arena_id == 0);
  h->limbo_offset = arena->OffsetOf(limbo);
  h->limbo_capacity = limbo_capacity;
  h->header_checksum = HeaderChecksum(*h);
  if (absl::Status s = arena->Bind(options, /*created=*/true); !s.ok()) return s;
  return arena;
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::Attach(const ArenaOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  absl::StatusOr<uint64_t> unit = SizeUnit(options);
  if (!unit.ok()) return unit.status();
  if (absl::Status s = PrecheckSegment(options); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  try {
    if (options.file_path.empty()) {
      impl->shm = std::make_unique<ShmSegment>(bip::open_only, options.shm_name.c_str());
      impl->sm = impl->shm->get_segment_manager();
      impl->user_address = impl->shm->get_address();
      impl->user_size = impl->shm->get_size();
    } else {
      impl->file = std::make_unique<FileSegment>(bip::open_only, options.file_path.c_str());
      impl->sm = impl->file->get_segment_manager();
      impl->user_address = impl->file->get_address();
      impl->user_size = impl->file->get_size();
    }
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("attach arena segment ", SegmentPath(options), ": ", e.what()));
  }
  std::unique_ptr<Arena> arena(new Arena(std::move(impl)));
  Impl& im = *arena->impl_;
  arena->path_ = SegmentPath(options);
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  arena->base_ =
      reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(im.user_address) & ~(page - 1));
  arena->size_ =
      im.user_size + static_cast<uint64_t>(static_cast<char*>(im.user_address) - arena->base_);
  if (const uint64_t want = RoundUp(options.size, *unit); want != arena->size_) {
    return absl::FailedPreconditionError(absl::StrCat("arena ", arena->path_, " is ", arena->size_,
                                                      " bytes but the options ask for ", want));
  }
  if (absl::Status s = arena->Bind(options, /*created=*/false); !s.ok()) return s;
  return arena;
}

absl::Status Arena::Bind(const ArenaOptions& options, bool created) {
  std::pair<ArenaHeader*, std::size_t> found{nullptr, 0};
  try {
    found = impl_->sm->find<ArenaHeader>(kArenaHeaderName);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("arena ", path_, ": looking up the header: ", e.what()));
  }
  if (found.first == nullptr || found.second != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("arena ", path_, " has no kvnode header: not a kvnode arena"));
  }
  ArenaHeader* h = found.first;
  auto bad = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat("arena ", path_, ": ", why));
  };
  if (h->magic != kArenaMagic) return bad("bad magic: not a kvnode arena");
  if (h->layout_version != kLayoutVersion) {
    return bad(
        absl::StrCat("layout version ", h->layout_version, ", this build uses ", kLayoutVersion));
  }
  if (h->header_size != sizeof(ArenaHeader)) {
    return bad(
        absl::StrCat("header is ", h->header_size, " bytes, expected ", sizeof(ArenaHeader)));
  }
  if (h->header_checksum != HeaderChecksum(*h)) return bad("header checksum mismatch");
  if (h->mapping_size != size_) {
    return bad(absl::StrCat("header says ", h->mapping_size, " bytes, the mapping has ", size_));
  }
  geometry_.layout_version = h->layout_version;
  geometry_.bucket_size = h->bucket_size;
  geometry_.slots_per_bucket = h->slots_per_bucket;
  geometry_.inline_granule = kInlineGranule;
  geometry_.arena_size = size_;
  geometry_.index_offset = h->index_offset;
  geometry_.bucket_count = h->bucket_count;
  geometry_.hash_seed = h->hash_seed;
  geometry_.arena_id = h->arena_id;
  if (absl::Status s = geometry_.Validate(); !s.ok()) return bad(s.message());
  if (h->limbo_capacity == 0 || h->limbo_offset % 8 != 0 || h->limbo_offset > size_ ||
      h->limbo_capacity * sizeof(LimboEntry) > size_ - h->limbo_offset) {
    return bad("retire ring outside the mapping");
  }
  if (!created) {
    if (h->bucket_size != options.bucket_size) {
      return bad(
          absl::StrCat("bucket size ", h->bucket_size, ", options say ", options.bucket_size));
    }
    if (options.bucket_count != 0 && h->bucket_count != options.bucket_count) {
      return bad(
          absl::StrCat("bucket count ", h->bucket_count, ", options say ", options.bucket_count));
    }
  }
  header_ = h;
  limbo_ = At<LimboEntry>(h->limbo_offset);
  return FindSlotWords();
}

absl::Status Arena::FindSlotWords() {
  std::pair<uint64_t*, std::size_t> found{nullptr, 0};
  try {
    found = impl_->sm->find<uint64_t>(kSlotWordsName);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("arena ", path_, ": looking up the slot words: ", e.what()));
  }
  if (found.first == nullptr) {
    slot_words_offset_ = 0;
    return absl::OkStatus();
  }
  const uint64_t off = OffsetOf(found.first);
  if (found.second != kSlotWordsBytes / 8 || off % 8 != 0 || off > size_ ||
      kSlotWordsBytes > size_ - off) {
    return absl::FailedPreconditionError(absl::StrCat("arena ", path_, ": slot words of ",
                                                      found.second * 8, " bytes at ", off,
                                                      ", expected ", kSlotWordsBytes));
  }
  slot_words_offset_ = off;
  return absl::OkStatus();
}

namespace {

// Marks the header while the allocator runs (see ArenaHeader::heap_busy). The
// fences keep the compiler from moving the allocator's stores across the
// marks: only their order in memory matters to the process that looks after
// a crash.
class HeapBusy {
 public:
  explicit HeapBusy(ArenaHeader* h) : word_(h->heap_busy) {
    word_.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  ~HeapBusy() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    word_.store(0, std::memory_order_relaxed);
  }
  HeapBusy(const HeapBusy&) = delete;
  HeapBusy& operator=(const HeapBusy&) = delete;

 private:
  std::atomic_ref<uint64_t> word_;
};

}  // namespace

uint64_t Arena::Allocate(uint64_t n, uint64_t align) {
  HeapBusy busy(header_);
  void* p = impl_->sm->allocate_aligned(n, align, std::nothrow);
  return p == nullptr ? 0 : OffsetOf(p);
}

void Arena::Deallocate(uint64_t offset) {
  HeapBusy busy(header_);
  impl_->sm->deallocate(At(offset));
}

bool Arena::HeapMayBeTorn() const {
  return std::atomic_ref<uint64_t>(header_->heap_busy).load(std::memory_order_acquire) != 0;
}

absl::StatusOr<uint64_t> Arena::EnsureSlotWords() {
  if (slot_words_offset_ != 0) return slot_words_offset_;
  uint64_t* words = nullptr;
  {
    HeapBusy busy(header_);
    try {
      words = impl_->sm->construct<uint64_t>(kSlotWordsName, std::nothrow)[kSlotWordsBytes / 8](0);
    } catch (const std::exception& e) {
      // Already there (another writer made it since we looked): found below.
      LOG(WARNING) << "arena " << path_ << ": creating the slot words: " << e.what();
    }
  }
  if (words == nullptr) {
    if (absl::Status s = FindSlotWords(); !s.ok()) return s;
    if (slot_words_offset_ == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("arena ", path_, ": no room for the ", kSlotWordsBytes, "-byte slot words"));
    }
    return slot_words_offset_;
  }
  const uint64_t off = OffsetOf(words);
  if (off % 8 != 0) {
    return absl::InternalError(
        absl::StrCat("arena ", path_, ": slot words at ", off, ", not 8-byte aligned"));
  }
  slot_words_offset_ = off;
  return off;
}

uint64_t Arena::HeapFreeBytes() const { return impl_->sm->get_free_memory(); }

}  // namespace kvnode::storage
