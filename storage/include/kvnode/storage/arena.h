// The shared-memory arena: one Boost.Interprocess segment (managed_shared_memory
// in /dev/shm by default, managed_mapped_file at a path, e.g. on hugetlbfs)
// holding the ArenaHeader, the bucket index, a retire ring ("limbo") and the
// object heap. Everything inside is addressed by byte offset from base(); the
// whole mapping [base(), base() + size()) is meant to be registered as one MR
// at iova 0. See docs/format.md.
//
// Thread safety: an Arena is mutated by a single writer at a time (the Store's
// write path, or during a live upgrade the process that owns RocksDB). Any
// number of processes may map it and read it. That exclusivity is the whole
// protocol: the segment has no cross-process lock (Boost's null_mutex_family),
// because a lock held by a process killed inside the allocator would stay
// locked and block the next writer forever. What a killed writer can leave
// behind instead is recorded in the header (heap_busy, intent) for whoever
// becomes the writer next.
#ifndef KVNODE_STORAGE_ARENA_H_
#define KVNODE_STORAGE_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/storage/format.h"

namespace kvnode::storage {

inline constexpr uint64_t kArenaMagic = 0x414e455241564b4bULL;  // "KKVARENA"
// Name of the header object inside the Boost segment.
inline constexpr char kArenaHeaderName[] = "kvnode.arena.header";
// The slot ownership table of a cluster node (docs/format.md "Slot words"):
// a named object of kSlotWordsBytes bytes, 8-byte aligned, byte s = 1 while
// the node serves slot s. One byte per slot of the largest shard map
// (proto::kMaxSlots; the server checks that they agree).
inline constexpr char kSlotWordsName[] = "kvnode.arena.slot_words";
inline constexpr uint64_t kSlotWordsBytes = 65536;

// A write between RocksDB and the arena (Store::Put/Delete/promotion): set
// before RocksDB is written, cleared after the arena is updated. A writer
// killed in between leaves it set, and the next writer re-reads the key from
// RocksDB and republishes it (Store reconciles it when it becomes the writer).
// One slot: writes are applied one at a time.
struct WriteIntent {
  uint64_t state;    // 0 none; kIntentPending: key_len/existed/key are valid
  uint64_t key_len;  // 1..kMaxKeySize
  uint64_t existed;  // 1: the key existed before the write (the index's count)
  uint64_t reserved;
  char key[kMaxKeySize];
};
inline constexpr uint64_t kIntentPending = 1;

// Lives inside the segment. The first block is written once at creation and
// covered by header_checksum; the second is written by the single writer with
// 8-byte atomic stores (other processes may read it at any time).
struct ArenaHeader {
  // --- immutable after creation ---
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_size;  // sizeof(ArenaHeader)
  uint64_t mapping_size;
  uint64_t index_offset;
  uint64_t bucket_count;
  uint32_t bucket_size;
  uint32_t slots_per_bucket;
  uint64_t hash_seed;
  uint64_t arena_id;
  uint64_t limbo_offset;
  uint64_t limbo_capacity;
  uint64_t header_checksum;  // XXH3-64 of the fields above
  // --- mutable, single writer ---
  uint64_t generation;  // equals the generation recorded in RocksDB while valid
  uint64_t clean;       // 1 only after a clean Close(); 0 while a writer owns it
  uint64_t writer_pid;  // informational
  uint64_t limbo_head;  // ring counters; entry i lives at i % limbo_capacity
  uint64_t limbo_tail;
  uint64_t clock_hand;  // next home bucket the CLOCK looks at
  uint64_t num_keys;    // keys in the store (resident or not)
  uint64_t resident_keys;
  uint64_t marker_slots;
  uint64_t evictions;
  uint64_t overflow_buckets;
  uint64_t lossy_buckets;
  uint64_t heap_bytes;    // bytes of live objects in the heap
  uint64_t inline_bytes;  // bytes of live objects inline in buckets
  // 1 while the writer is inside the heap allocator: a writer killed there may
  // have left the allocator's free lists half-updated, so the heap (and with
  // it the arena) cannot be trusted and must be rebuilt from RocksDB.
  uint64_t heap_busy;
  uint64_t next_bucket_tag;  // last tag given to an overflow bucket (24 bits, never 0)
  // XXH3 of the kernel's boot id when the last writer claimed the arena (0:
  // an older build claimed it). A file-backed arena outlives a reboot, but
  // what reached its file by then is anybody's guess: only an arena of this
  // boot is taken back after a crash.
  uint64_t boot_id;
  uint64_t reserved[5];
  WriteIntent intent;
};

// One retired allocation waiting for its grace period (limbo ring entry).
struct LimboEntry {
  uint64_t offset;         // object offset
  uint64_t bucket_offset;  // 0: heap block; else inline in this bucket
  uint64_t length;         // footprint in bytes
  uint64_t retire_ns;      // CLOCK_MONOTONIC when retired
};

struct ArenaOptions {
  // Shared-memory object name (in /dev/shm), used when file_path is empty.
  std::string shm_name = "kvnode-arena";
  // If non-empty: a managed_mapped_file at this path instead (hugetlbfs mount
  // for huge pages; size is rounded up to the file system's block size).
  std::string file_path = "";
  // Bytes in the mapping, rounded up to the page (or huge page) size.
  uint64_t size = uint64_t{256} << 20;
  // Bucket size in bytes: 64 (no inline values) .. 512; the first 64 bytes hold
  // the slots, the rest inline objects.
  uint32_t bucket_size = 256;
  // Home buckets, a power of two; 0 = the largest power of two whose index
  // takes at most 1/8 of the arena.
  uint64_t bucket_count = 0;
  // Entries in the retire ring (32 bytes each); capped at 1/16 of the arena.
  uint32_t limbo_capacity = 65536;
  // Key hash seed; 0 = random at creation.
  uint64_t hash_seed = 0;

  [[nodiscard]] absl::Status Validate() const;
};

class Arena {
 public:
  // Creates a new segment (removing an existing one of ours first), mode 0600.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Arena>> Create(const ArenaOptions& options);
  // Maps an existing segment without touching its contents. Refuses:
  //   NotFound            no such segment
  //   PermissionDenied    owned by another user, or group/other permission bits set
  //   FailedPrecondition  not a kvnode arena, bad magic or checksum, other layout
  //                       version, or sizes that disagree with the mapping or with
  //                       `options` (size, bucket_size, bucket_count if non-zero)
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Arena>> Attach(const ArenaOptions& options);
  // Removes the segment name (existing mappings stay valid). OK if absent.
  [[nodiscard]] static absl::Status Remove(const ArenaOptions& options);

  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // The whole mapping: page-aligned base and length (register this as the MR).
  char* base() const { return base_; }
  uint64_t size() const { return size_; }
  const Geometry& geometry() const { return geometry_; }
  ArenaHeader* header() const { return header_; }
  LimboEntry* limbo() const { return limbo_; }
  // Where the segment lives ("/dev/shm/<name>" or the file path).
  const std::string& path() const { return path_; }

  // Heap (single writer). Returns the offset of `n` bytes aligned to `align`
  // (a power of two, >= 8), or 0 when the heap has no room.
  uint64_t Allocate(uint64_t n, uint64_t align);
  void Deallocate(uint64_t offset);
  uint64_t HeapFreeBytes() const;
  // A writer died inside Allocate/Deallocate (see ArenaHeader::heap_busy).
  bool HeapMayBeTorn() const;

  // The slot-words table (kSlotWordsName): its offset, found when the arena
  // was mapped or made by EnsureSlotWords; 0 when the arena has none (a
  // single node's, or one of a build without it). Any process.
  uint64_t slot_words_offset() const { return slot_words_offset_; }
  // Writer only (the allocator's single-writer rule; the segment's named
  // object index changes under heap_busy like the heap): the table's
  // offset, creating it zeroed (no slot served) when the arena has none.
  // ResourceExhausted when the heap has no room for it. Creation moves no
  // byte of anything already in the arena.
  [[nodiscard]] absl::StatusOr<uint64_t> EnsureSlotWords();

  template <typename T = char>
  T* At(uint64_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }
  uint64_t OffsetOf(const void* p) const {
    return static_cast<uint64_t>(static_cast<const char*>(p) - base_);
  }

 private:
  struct Impl;
  explicit Arena(std::unique_ptr<Impl> impl);
  absl::Status Bind(const ArenaOptions& options, bool created);
  // Looks the slot words up (slot_words_offset_, 0 when absent).
  absl::Status FindSlotWords();

  std::unique_ptr<Impl> impl_;
  char* base_ = nullptr;
  uint64_t size_ = 0;
  ArenaHeader* header_ = nullptr;
  LimboEntry* limbo_ = nullptr;
  uint64_t slot_words_offset_ = 0;
  Geometry geometry_;
  std::string path_;
};

}  // namespace kvnode::storage

#endif  // KVNODE_STORAGE_ARENA_H_
