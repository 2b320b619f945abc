// Registration caching: registration is expensive and pins memory, so
//  - ChunkPool registers big chunks once and hands out sub-ranges (RPC
//    buffers, READ targets), and
//  - RegistrationCache keeps registrations of caller memory keyed by
//    (address, length, access) in an LRU with a byte budget,
// both counting pinned bytes against RLIMIT_MEMLOCK (Mr::Register does; the
// cache evicts idle entries and retries before giving up).
//
// Thread safety: all public members of ChunkPool and RegistrationCache may
// be called from any thread. LruPolicy is not synchronised (the cache holds
// its lock around it).
#ifndef KVNODE_RDMA_REG_CACHE_H_
#define KVNODE_RDMA_REG_CACHE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kvnode/rdma/memory.h"
#include "kvnode/rdma/mr.h"
#include "kvnode/rdma/qp.h"

namespace kvnode::rdma {

// ---------------------------------------------------------------------------
// Pre-registered chunks with sub-allocation.

struct ChunkPoolOptions {
  // Bytes per registered chunk. Default 16 MiB. Allocations larger than a
  // chunk fail.
  uint64_t chunk_bytes = 16u << 20;
  // Most chunks ever registered. Default 16 (256 MiB with the default size).
  int max_chunks = 16;
  // Alignment of every allocation. Default 64 (a cache line).
  uint32_t alignment = 64;
  // Access of the chunks' MRs. Default LOCAL_WRITE (RECV buffers, READ targets).
  int access = IBV_ACCESS_LOCAL_WRITE;
  // Backing pages. Default k4K, prefaulted (registration is ~100x cheaper).
  PageKind pages = PageKind::k4K;
  // Default "chunk".
  std::string label = "chunk";

  [[nodiscard]] absl::Status Validate() const;
};

class ChunkPool;

// A sub-range of a registered chunk. Move-only. Holds a reference on the
// chunk's Mr (so it cannot be deregistered under it) and returns the range
// to the pool on destruction.
class RegisteredBuffer {
 public:
  RegisteredBuffer() = default;
  RegisteredBuffer(RegisteredBuffer&& o) noexcept;
  RegisteredBuffer& operator=(RegisteredBuffer&& o) noexcept;
  ~RegisteredBuffer();

  uint8_t* data() const { return data_; }
  uint32_t size() const { return size_; }
  Mr* mr() const { return ref_.get(); }
  uint64_t offset() const { return offset_; }  // within mr()
  // For Qp::Post*: the whole buffer or a part of it.
  LocalBuf local(uint32_t off = 0) const {
    return LocalBuf{ref_.get(), offset_ + off, size_ - off};
  }
  LocalBuf local(uint32_t off, uint32_t len) const {
    return LocalBuf{ref_.get(), offset_ + off, len};
  }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  friend class ChunkPool;
  void Reset();

  std::shared_ptr<ChunkPool> pool_;  // keeps the pool alive while allocated
  MrRef ref_;
  uint8_t* data_ = nullptr;
  uint64_t offset_ = 0;
  uint32_t size_ = 0;
  int chunk_ = -1;
};

class ChunkPool : public std::enable_shared_from_this<ChunkPool> {
 public:
  static absl::StatusOr<std::shared_ptr<ChunkPool>> Create(std::shared_ptr<Pd> pd,
                                                           ChunkPoolOptions options = {});
  ~ChunkPool();

  // A buffer of `size` bytes (rounded up to the alignment); registers a new
  // chunk when no existing one has room.
  absl::StatusOr<RegisteredBuffer> Allocate(uint32_t size);

  // Deregisters every chunk with SafeDeregister(deadline). Refused (kMrInUse)
  // while buffers are still allocated or named by outstanding work requests.
  [[nodiscard]] absl::Status Close(Deadline deadline);

  int chunks() const;
  uint64_t bytes_in_use() const;

 private:
  friend class RegisteredBuffer;
  struct Chunk {
    HostMemory memory;
    std::shared_ptr<Mr> mr;
    std::map<uint64_t, uint64_t> free;  // offset -> length, coalesced
  };
  ChunkPool() = default;
  void Free(int chunk, uint64_t offset, uint64_t size);

  std::shared_ptr<Pd> pd_;
  ChunkPoolOptions options_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Chunk>> chunks_ ABSL_GUARDED_BY(mu_);
  uint64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------
// LRU of registrations.

struct RegKey {
  uintptr_t addr = 0;
  uint64_t length = 0;
  int access = 0;

  bool operator==(const RegKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const RegKey& k) {
    return H::combine(std::move(h), k.addr, k.length, k.access);
  }
};

// The eviction policy alone (no device): entries in LRU order with their
// byte sizes, and victim selection under a byte budget. Unit-tested on the
// host.
class LruPolicy {
 public:
  explicit LruPolicy(uint64_t budget_bytes) : budget_(budget_bytes) {}

  // Adds `key` as most recently used (replacing an existing entry).
  void Insert(const RegKey& key, uint64_t bytes);
  // Marks `key` most recently used; false if absent.
  bool Touch(const RegKey& key);
  void Erase(const RegKey& key);
  bool Contains(const RegKey& key) const { return index_.contains(key); }

  // Least recently used first: the entries to evict so that `incoming` more
  // bytes fit in the budget, skipping those `in_use` says are busy. May
  // return fewer than needed (everything else busy): check fits.
  std::vector<RegKey> PickVictims(uint64_t incoming,
                                  const std::function<bool(const RegKey&)>& in_use) const;
  // Every entry overlapping [addr, addr+len) (for invalidation on unmap).
  std::vector<RegKey> Overlapping(uintptr_t addr, uint64_t len) const;

  uint64_t bytes() const { return bytes_; }
  uint64_t budget() const { return budget_; }
  size_t size() const { return index_.size(); }
  // Keys from most to least recently used.
  std::vector<RegKey> Order() const;

 private:
  struct Node {
    RegKey key;
    uint64_t bytes;
  };
  uint64_t budget_;
  uint64_t bytes_ = 0;
  std::list<Node> lru_;  // front = most recent
  absl::flat_hash_map<RegKey, std::list<Node>::iterator> index_;
};

struct RegCacheOptions {
  // Registered bytes the cache may keep. Default 256 MiB. Entries in use are
  // never evicted, so it can be exceeded while they are held.
  uint64_t budget_bytes = 256u << 20;
  // Default "regcache".
  std::string label = "regcache";

  [[nodiscard]] absl::Status Validate() const;
};

class RegistrationCache {
 public:
  static absl::StatusOr<std::unique_ptr<RegistrationCache>> Create(std::shared_ptr<Pd> pd,
                                                                   RegCacheOptions options = {});
  ~RegistrationCache();

  // A reference on a registration of exactly [addr, addr+length) with
  // `access`: cached, or registered now (evicting idle LRU entries to stay in
  // the budget and under RLIMIT_MEMLOCK). Any alignment.
  absl::StatusOr<MrRef> Get(void* addr, size_t length, int access);

  // Drops (deregisters) every cached registration overlapping the range:
  // call before unmapping or reusing memory for something else. Entries
  // still referenced are refused (kMrInUse) and stay.
  [[nodiscard]] absl::Status Invalidate(void* addr, size_t length, Deadline deadline);

  // Deregisters everything; refused while references are held.
  [[nodiscard]] absl::Status Clear(Deadline deadline);

  struct Stats {
    uint64_t hits = 0, misses = 0, evictions = 0, bytes = 0, entries = 0;
  };
  Stats stats() const;

 private:
  RegistrationCache() = default;
  absl::Status EvictFor(uint64_t incoming) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<Pd> pd_;
  RegCacheOptions options_;
  mutable absl::Mutex mu_;
  LruPolicy policy_ ABSL_GUARDED_BY(mu_){0};
  absl::flat_hash_map<RegKey, std::shared_ptr<Mr>> mrs_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvnode::rdma

#endif  // KVNODE_RDMA_REG_CACHE_H_
