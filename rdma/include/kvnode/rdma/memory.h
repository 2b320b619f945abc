// Page-aligned host memory for registration (4 KiB, transparent huge pages,
// MAP_HUGETLB, memfd MFD_HUGETLB), and RLIMIT_MEMLOCK accounting.
//
// The arena itself belongs to storage/; this is for kvrdma's own buffers
// (RPC send/recv, READ targets), tests and benchmarks. Mr::Register accepts
// any page-aligned mapping, e.g. a Boost.Interprocess segment.
#ifndef KVNODE_RDMA_MEMORY_H_
#define KVNODE_RDMA_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvnode::rdma {

enum class PageKind {
  k4K,               // anonymous private mapping, MADV_NOHUGEPAGE
  kTransparentHuge,  // anonymous, 2 MiB aligned, MADV_HUGEPAGE
  kHugetlb,          // MAP_HUGETLB (needs vm.nr_hugepages)
  kHugetlbMemfd,     // memfd_create(MFD_HUGETLB) mapped MAP_SHARED (fd())
};

struct MemoryOptions {
  // Default k4K.
  PageKind pages = PageKind::k4K;
  // Default false. True: touch every page before returning (registration of
  // prefaulted memory is much cheaper).
  bool prefault = false;
};

// An owned, page-aligned mapping. Move-only; unmapped on destruction.
class HostMemory {
 public:
  static absl::StatusOr<HostMemory> Allocate(size_t length, MemoryOptions options = {});

  HostMemory() = default;
  HostMemory(HostMemory&& o) noexcept;
  HostMemory& operator=(HostMemory&& o) noexcept;
  ~HostMemory();

  void* data() const { return data_; }
  uint8_t* bytes() const { return static_cast<uint8_t*>(data_); }
  size_t size() const { return size_; }
  int fd() const { return fd_; }  // -1 unless kHugetlbMemfd

 private:
  void Reset();
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  int fd_ = -1;
};

struct MemlockInfo {
  bool unlimited = false;         // RLIMIT_MEMLOCK soft limit is RLIM_INFINITY
  uint64_t soft_limit = 0;        // bytes
  bool cap_ipc_lock = false;      // the kernel does not enforce the limit then
  uint64_t pinned_by_kvrdma = 0;  // bytes in live kvrdma MRs
};
MemlockInfo QueryMemlock();

// OK if pinning `extra` more bytes stays within RLIMIT_MEMLOCK (or the limit
// is not enforced); otherwise ResourceExhausted / kMemlockLimit with a
// message naming the limit and how to raise it.
[[nodiscard]] absl::Status CheckMemlock(uint64_t extra, absl::string_view what);

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_MEMORY_H_
