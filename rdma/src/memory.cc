#include "kvnode/rdma/memory.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kvnode/rdma/accounting.h"
#include "kvnode/rdma/errors.h"

namespace kvnode::rdma {
namespace {

constexpr size_t kHuge = size_t{2} << 20;

size_t RoundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

bool HasCapIpcLock() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    uint64_t caps = 0;
    std::string hex = line.substr(7);
    hex.erase(0, hex.find_first_not_of(" \t"));
    if (!absl::SimpleHexAtoi(hex, &caps)) return false;
    constexpr int kCapIpcLock = 14;
    return (caps >> kCapIpcLock) & 1;
  }
  return false;
}

}  // namespace

absl::StatusOr<HostMemory> HostMemory::Allocate(size_t length, MemoryOptions options) {
  if (length == 0) return absl::InvalidArgumentError("HostMemory::Allocate: length 0");
  HostMemory m;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  switch (options.pages) {
    case PageKind::k4K: {
      m.mapped_ = RoundUp(length, page);
      void* p =
          mmap(nullptr, m.mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap(", m.mapped_, " bytes)"), errno);
      m.data_ = p;
      madvise(p, m.mapped_, MADV_NOHUGEPAGE);
      break;
    }
    case PageKind::kTransparentHuge: {
      // Over-allocate to get a 2 MiB aligned start, trim the rest.
      const size_t len = RoundUp(length, kHuge);
      const size_t over = len + kHuge;
      void* p = mmap(nullptr, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap(", over, " bytes)"), errno);
      uintptr_t start = RoundUp(reinterpret_cast<uintptr_t>(p), kHuge);
      uintptr_t end = start + len;
      if (start > reinterpret_cast<uintptr_t>(p)) {
        munmap(p, start - reinterpret_cast<uintptr_t>(p));
      }
      if (reinterpret_cast<uintptr_t>(p) + over > end) {
        munmap(reinterpret_cast<void*>(end), reinterpret_cast<uintptr_t>(p) + over - end);
      }
      m.data_ = reinterpret_cast<void*>(start);
      m.mapped_ = len;
      madvise(m.data_, len, MADV_HUGEPAGE);
      break;
    }
    case PageKind::kHugetlb: {
      m.mapped_ = RoundUp(length, kHuge);
      void* p = mmap(nullptr, m.mapped_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
      if (p == MAP_FAILED) {
        return ErrnoStatus(absl::StrCat("mmap(MAP_HUGETLB, ", m.mapped_,
                                        " bytes) (is vm.nr_hugepages large enough?)"),
                           errno);
      }
      m.data_ = p;
      break;
    }
    case PageKind::kHugetlbMemfd: {
      m.mapped_ = RoundUp(length, kHuge);
      int fd = memfd_create("kvrdma-huge", MFD_HUGETLB | MFD_CLOEXEC);
      if (fd < 0) return ErrnoStatus("memfd_create(MFD_HUGETLB)", errno);
      m.fd_ = fd;
      if (ftruncate(fd, static_cast<off_t>(m.mapped_)) != 0) {
        return ErrnoStatus("ftruncate(hugetlb memfd)", errno);
      }
      void* p = mmap(nullptr, m.mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        return ErrnoStatus(absl::StrCat("mmap(hugetlb memfd, ", m.mapped_,
                                        " bytes) (is vm.nr_hugepages large enough?)"),
                           errno);
      }
      m.data_ = p;
      break;
    }
  }
  m.size_ = length;
  if (options.prefault) {
    // Writing one byte per 4 KiB faults every page in (huge pages too).
    for (size_t off = 0; off < m.mapped_; off += page) m.bytes()[off] = 0;
  }
  return m;
}

HostMemory::HostMemory(HostMemory&& o) noexcept
    : data_(o.data_), size_(o.size_), mapped_(o.mapped_), fd_(o.fd_) {
  o.data_ = nullptr;
  o.fd_ = -1;
  o.size_ = o.mapped_ = 0;
}

HostMemory& HostMemory::operator=(HostMemory&& o) noexcept {
  if (this != &o) {
    Reset();
    data_ = o.data_;
    size_ = o.size_;
    mapped_ = o.mapped_;
    fd_ = o.fd_;
    o.data_ = nullptr;
    o.fd_ = -1;
    o.size_ = o.mapped_ = 0;
  }
  return *this;
}

HostMemory::~HostMemory() { Reset(); }

void HostMemory::Reset() {
  if (data_ != nullptr) munmap(data_, mapped_);
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  fd_ = -1;
  size_ = mapped_ = 0;
}

MemlockInfo QueryMemlock() {
  MemlockInfo info;
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    info.unlimited = rl.rlim_cur == RLIM_INFINITY;
    info.soft_limit = info.unlimited ? 0 : rl.rlim_cur;
  }
  info.cap_ipc_lock = HasCapIpcLock();
  info.pinned_by_kvrdma = Accounting::PinnedBytes();
  return info;
}

absl::Status CheckMemlock(uint64_t extra, absl::string_view what) {
  MemlockInfo m = QueryMemlock();
  if (m.unlimited || m.cap_ipc_lock) return absl::OkStatus();
  if (m.pinned_by_kvrdma + extra <= m.soft_limit) return absl::OkStatus();
  return WithKind(
      absl::ResourceExhaustedError(absl::StrCat(
          what, ": pinning ", extra, " more bytes would make ", m.pinned_by_kvrdma + extra,
          " bytes registered by this process, over RLIMIT_MEMLOCK (soft limit ", m.soft_limit,
          " bytes, uid ", getuid(),
          "). Raise the memlock limit: `ulimit -l` (KiB) in the shell, LimitMEMLOCK= in the "
          "systemd unit, or 'memlock' in /etc/security/limits.conf; or grant CAP_IPC_LOCK")),
      RdmaErrorKind::kMemlockLimit);
}

}  // namespace kvnode::rdma
