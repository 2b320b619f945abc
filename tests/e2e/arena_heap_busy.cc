// kvnode_arena_heap_busy: marks a node's arena as if its writer had died
// inside the heap allocator (ArenaHeader::heap_busy = 1, docs/format.md).
// The fault matrix's killed_in_heap cells (upgrade_faults.sh) stop the old
// process, run this, and SIGKILL it: the next writer must not trust the heap.
//
//   kvnode_arena_heap_busy --shm_name NAME --arena_size BYTES
#include <gflags/gflags.h>

#include <atomic>
#include <cstdint>
#include <iostream>

#include "kvnode/storage/arena.h"

DEFINE_string(shm_name, "", "the arena's shared-memory object name (the node's --shm_name)");
DEFINE_uint64(arena_size, 0, "the arena's size in bytes (the node's --arena_size)");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("kvnode_arena_heap_busy --shm_name NAME --arena_size BYTES");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  kvnode::storage::ArenaOptions o;
  o.shm_name = FLAGS_shm_name;
  o.size = FLAGS_arena_size;
  auto arena = kvnode::storage::Arena::Attach(o);
  if (!arena.ok()) {
    std::cerr << "kvnode_arena_heap_busy: " << arena.status() << "\n";
    return 1;
  }
  std::atomic_ref<uint64_t>((*arena)->header()->heap_busy).store(1, std::memory_order_release);
  if (!(*arena)->HeapMayBeTorn()) {
    std::cerr << "kvnode_arena_heap_busy: the mark did not take\n";
    return 1;
  }
  std::cout << "arena " << (*arena)->path() << ": heap_busy set\n";
  return 0;
}
