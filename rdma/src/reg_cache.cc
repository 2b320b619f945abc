#include "kvnode/rdma/reg_cache.h"

#include <glog/logging.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kvnode/rdma/errors.h"

namespace kvnode::rdma {
namespace {

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

// --- ChunkPool ---------------------------------------------------------------

absl::Status ChunkPoolOptions::Validate() const {
  if (chunk_bytes == 0 || chunk_bytes % PageSize() != 0 || chunk_bytes > (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkPoolOptions.chunk_bytes=", chunk_bytes,
                                                   ": a multiple of the page size, <= 4 GiB"));
  }
  if (max_chunks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ChunkPoolOptions.max_chunks=", max_chunks, ": must be >= 1"));
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > PageSize()) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkPoolOptions.alignment=", alignment,
                                                   ": a power of two up to the page size"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ChunkPool>> ChunkPool::Create(std::shared_ptr<Pd> pd,
                                                             ChunkPoolOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (pd == nullptr) return absl::InvalidArgumentError("ChunkPool::Create: null pd");
  std::shared_ptr<ChunkPool> pool(new ChunkPool());
  pool->pd_ = std::move(pd);
  pool->options_ = std::move(options);
  return pool;
}

ChunkPool::~ChunkPool() {
  // No RegisteredBuffer exists (each holds the pool). Work requests may still
  // hold chunk MRs: each Mr keeps its memory (MrOptions::backing) until it is
  // deregistered, so nothing is unmapped under the device.
  absl::MutexLock l(&mu_);
  for (auto& c : chunks_) {
    absl::Status s = SafeDeregister(*c->mr, Clock::now());
    if (!s.ok()) {
      LOG(WARNING) << "kvrdma: ChunkPool '" << options_.label << "' chunk outlives the pool: " << s;
    }
  }
}

absl::StatusOr<RegisteredBuffer> ChunkPool::Allocate(uint32_t size) {
  if (size == 0) return absl::InvalidArgumentError("ChunkPool::Allocate: size 0");
  const uint64_t want = AlignUp(size, options_.alignment);
  if (want > options_.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("ChunkPool '", options_.label, "': ", size,
                                                   " bytes exceed the chunk size ",
                                                   options_.chunk_bytes));
  }
  absl::MutexLock l(&mu_);
  if (closed_) {
    return WithKind(
        absl::FailedPreconditionError(absl::StrCat("ChunkPool '", options_.label, "' is closed")),
        RdmaErrorKind::kClosed);
  }
  auto take = [&](int ci) -> std::optional<uint64_t> {
    mu_.AssertHeld();  // called below under the lock; tells the analysis
    Chunk& c = *chunks_[ci];
    for (auto it = c.free.begin(); it != c.free.end(); ++it) {
      if (it->second < want) continue;
      const uint64_t off = it->first;
      const uint64_t len = it->second;
      c.free.erase(it);
      if (len > want) c.free.emplace(off + want, len - want);
      return off;
    }
    return std::nullopt;
  };
  int chunk = -1;
  std::optional<uint64_t> off;
  for (int i = 0; i < static_cast<int>(chunks_.size()) && !off; ++i) {
    off = take(i);
    if (off) chunk = i;
  }
  if (!off) {
    if (static_cast<int>(chunks_.size()) >= options_.max_chunks) {
      return WithKind(absl::ResourceExhaustedError(absl::StrCat(
                          "ChunkPool '", options_.label, "': all ", options_.max_chunks,
                          " chunks full (ChunkPoolOptions.max_chunks)")),
                      RdmaErrorKind::kRetryLater);
    }
    absl::StatusOr<HostMemory> mem =
        HostMemory::Allocate(options_.chunk_bytes, MemoryOptions{options_.pages, true});
    if (!mem.ok()) return mem.status();
    auto backing = std::make_shared<HostMemory>(std::move(*mem));
    MrOptions mo;
    mo.access = options_.access;
    mo.label = absl::StrCat(options_.label, "#", chunks_.size());
    mo.backing = backing;
    absl::StatusOr<std::shared_ptr<Mr>> mr =
        Mr::Register(pd_, backing->data(), options_.chunk_bytes, std::move(mo));
    if (!mr.ok()) return mr.status();
    auto c = std::make_unique<Chunk>();
    c->mr = std::move(*mr);
    c->free.emplace(0, options_.chunk_bytes);
    chunks_.push_back(std::move(c));
    chunk = static_cast<int>(chunks_.size()) - 1;
    off = take(chunk);
  }
  Chunk& c = *chunks_[chunk];
  absl::StatusOr<MrRef> ref = c.mr->Acquire();
  if (!ref.ok()) {
    c.free.emplace(*off, want);  // (cannot happen while open; keep the range)
    return ref.status();
  }
  in_use_ += want;
  RegisteredBuffer b;
  b.pool_ = shared_from_this();
  b.ref_ = std::move(*ref);
  b.data_ = static_cast<uint8_t*>(c.mr->addr()) + *off;
  b.offset_ = *off;
  b.size_ = size;
  b.chunk_ = chunk;
  return b;
}

void ChunkPool::Free(int chunk, uint64_t offset, uint64_t size) {
  const uint64_t len = AlignUp(size, options_.alignment);
  absl::MutexLock l(&mu_);
  in_use_ -= len;
  auto& free = chunks_[chunk]->free;
  auto [it, inserted] = free.emplace(offset, len);
  if (!inserted) return;  // double free: cannot happen through RegisteredBuffer
  // Coalesce with the next and previous ranges.
  auto next = std::next(it);
  if (next != free.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free.erase(next);
  }
  if (it != free.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free.erase(it);
    }
  }
}

absl::Status ChunkPool::Close(Deadline deadline) {
  absl::MutexLock l(&mu_);
  closed_ = true;
  for (auto& c : chunks_) {
    if (absl::Status s = SafeDeregister(*c->mr, deadline); !s.ok()) return s;
  }
  return absl::OkStatus();
}

int ChunkPool::chunks() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(chunks_.size());
}

uint64_t ChunkPool::bytes_in_use() const {
  absl::MutexLock l(&mu_);
  return in_use_;
}

RegisteredBuffer::RegisteredBuffer(RegisteredBuffer&& o) noexcept
    : pool_(std::move(o.pool_)),
      ref_(std::move(o.ref_)),
      data_(o.data_),
      offset_(o.offset_),
      size_(o.size_),
      chunk_(o.chunk_) {
  o.data_ = nullptr;
  o.chunk_ = -1;
}

RegisteredBuffer& RegisteredBuffer::operator=(RegisteredBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    pool_ = std::move(o.pool_);
    ref_ = std::move(o.ref_);
    data_ = o.data_;
    offset_ = o.offset_;
    size_ = o.size_;
    chunk_ = o.chunk_;
    o.data_ = nullptr;
    o.chunk_ = -1;
  }
  return *this;
}

RegisteredBuffer::~RegisteredBuffer() { Reset(); }

void RegisteredBuffer::Reset() {
  if (pool_ != nullptr && chunk_ >= 0) pool_->Free(chunk_, offset_, size_);
  ref_.Release();
  pool_.reset();
  data_ = nullptr;
  chunk_ = -1;
}

// --- LruPolicy ---------------------------------------------------------------

void LruPolicy::Insert(const RegKey& key, uint64_t bytes) {
  Erase(key);
  lru_.push_front(Node{key, bytes});
  index_[key] = lru_.begin();
  bytes_ += bytes;
}

bool LruPolicy::Touch(const RegKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  lru_.splice(lru_.begin(), lru_, it->second);
  return true;
}

void LruPolicy::Erase(const RegKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  bytes_ -= it->second->bytes;
  lru_.erase(it->second);
  index_.erase(it);
}

std::vector<RegKey> LruPolicy::PickVictims(uint64_t incoming,
                                           const std::function<bool(const RegKey&)>& in_use) const {
  std::vector<RegKey> victims;
  uint64_t total = bytes_;
  for (auto it = lru_.rbegin(); it != lru_.rend() && total + incoming > budget_; ++it) {
    if (in_use(it->key)) continue;
    victims.push_back(it->key);
    total -= it->bytes;
  }
  return victims;
}

std::vector<RegKey> LruPolicy::Overlapping(uintptr_t addr, uint64_t len) const {
  std::vector<RegKey> out;
  for (const Node& n : lru_) {
    if (n.key.addr < addr + len && addr < n.key.addr + n.key.length) out.push_back(n.key);
  }
  return out;
}

std::vector<RegKey> LruPolicy::Order() const {
  std::vector<RegKey> out;
  for (const Node& n : lru_) out.push_back(n.key);
  return out;
}

// --- RegistrationCache ---------------------------------------------------------

absl::Status RegCacheOptions::Validate() const {
  if (budget_bytes == 0) {
    return absl::InvalidArgumentError("RegCacheOptions.budget_bytes must be > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RegistrationCache>> RegistrationCache::Create(
    std::shared_ptr<Pd> pd, RegCacheOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (pd == nullptr) return absl::InvalidArgumentError("RegistrationCache::Create: null pd");
  std::unique_ptr<RegistrationCache> c(new RegistrationCache());
  c->pd_ = std::move(pd);
  c->options_ = std::move(options);
  absl::MutexLock l(&c->mu_);
  c->policy_ = LruPolicy(c->options_.budget_bytes);
  return c;
}

RegistrationCache::~RegistrationCache() {
  absl::Status s = Clear(Clock::now());
  if (!s.ok()) {
    LOG(WARNING) << "kvrdma: RegistrationCache '" << options_.label
                 << "' destroyed with registrations in use (they stay alive with their "
                    "references): "
                 << s;
  }
}

absl::Status RegistrationCache::EvictFor(uint64_t incoming) {
  std::vector<RegKey> victims = policy_.PickVictims(incoming, [this](const RegKey& k) {
    mu_.AssertHeld();  // PickVictims calls back synchronously, under EvictFor's lock
    const Mr& mr = *mrs_.at(k);
    return mr.references() > 0 || mr.outstanding_wrs() > 0;
  });
  for (const RegKey& k : victims) {
    std::shared_ptr<Mr> mr = mrs_.at(k);
    absl::Status s = SafeDeregister(*mr, Clock::now());
    if (!s.ok()) return s;  // raced with a new reference: leave it
    policy_.Erase(k);
    mrs_.erase(k);
    ++stats_.evictions;
  }
  return absl::OkStatus();
}

absl::StatusOr<MrRef> RegistrationCache::Get(void* addr, size_t length, int access) {
  const RegKey key{reinterpret_cast<uintptr_t>(addr), length, access};
  absl::MutexLock l(&mu_);
  if (auto it = mrs_.find(key); it != mrs_.end()) {
    absl::StatusOr<MrRef> ref = it->second->Acquire();
    if (ref.ok()) {
      policy_.Touch(key);
      ++stats_.hits;
      return ref;
    }
    // Closed by an Invalidate in progress: fall through and register anew.
    policy_.Erase(key);
    mrs_.erase(it);
  }
  ++stats_.misses;
  if (absl::Status s = EvictFor(length); !s.ok()) {
    LOG(WARNING) << "kvrdma: RegistrationCache '" << options_.label << "' eviction: " << s;
  }
  MrOptions mo;
  mo.access = access;
  mo.require_page_aligned = false;
  mo.label = absl::StrCat(options_.label, "@", absl::Hex(key.addr));
  absl::StatusOr<std::shared_ptr<Mr>> mr = Mr::Register(pd_, addr, length, mo);
  if (!mr.ok() && GetRdmaErrorKind(mr.status()) == RdmaErrorKind::kMemlockLimit) {
    // Make room under RLIMIT_MEMLOCK: evict every idle entry, try once more.
    std::vector<RegKey> idle;
    for (const auto& [k, m] : mrs_) {
      if (m->references() == 0 && m->outstanding_wrs() == 0) idle.push_back(k);
    }
    for (const RegKey& k : idle) {
      if (SafeDeregister(*mrs_.at(k), Clock::now()).ok()) {
        policy_.Erase(k);
        mrs_.erase(k);
        ++stats_.evictions;
      }
    }
    mr = Mr::Register(pd_, addr, length, mo);
  }
  if (!mr.ok()) return mr.status();
  absl::StatusOr<MrRef> ref = (*mr)->Acquire();
  if (!ref.ok()) return ref.status();
  policy_.Insert(key, length);
  mrs_[key] = std::move(*mr);
  return ref;
}

absl::Status RegistrationCache::Invalidate(void* addr, size_t length, Deadline deadline) {
  absl::MutexLock l(&mu_);
  absl::Status first;
  for (const RegKey& k : policy_.Overlapping(reinterpret_cast<uintptr_t>(addr), length)) {
    absl::Status s = SafeDeregister(*mrs_.at(k), deadline);
    if (s.ok()) {
      policy_.Erase(k);
      mrs_.erase(k);
    } else if (first.ok()) {
      first = s;
    }
  }
  return first;
}

absl::Status RegistrationCache::Clear(Deadline deadline) {
  absl::MutexLock l(&mu_);
  absl::Status first;
  for (const RegKey& k : policy_.Order()) {
    absl::Status s = SafeDeregister(*mrs_.at(k), deadline);
    if (s.ok()) {
      policy_.Erase(k);
      mrs_.erase(k);
    } else if (first.ok()) {
      first = s;
    }
  }
  return first;
}

RegistrationCache::Stats RegistrationCache::stats() const {
  absl::MutexLock l(&mu_);
  Stats s = stats_;
  s.bytes = policy_.bytes();
  s.entries = policy_.size();
  return s;
}

}  // namespace kvnode::rdma
