// Helpers for storage tests: a private temp dir and a unique segment name per
// test, both removed at the end; a store opened from what RocksDB alone holds.
#ifndef KVNODE_TESTS_STORAGE_TEST_UTIL_H_
#define KVNODE_TESTS_STORAGE_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvnode/storage/arena.h"
#include "kvnode/storage/store.h"

namespace kvnode::storage::testing {

class TempStore {
 public:
  TempStore() {
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("kvnode-test-") + std::to_string(getpid()) + "-" +
                       (t ? t->name() : "x") + "-" + std::to_string(counter_++);
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    dir_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::create_directories(dir_);
    options.db_path = (dir_ / "db").string();
    options.shm_name = name;
    options.arena_size = 8 << 20;
    options.sync_writes = false;
  }
  ~TempStore() {
    (void)Arena::Remove(options.arena_options());
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::filesystem::path& dir() const { return dir_; }
  StoreOptions options;

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
};

// The store as RocksDB alone holds it: the arena removed, so that Open builds
// a new one from the database. A durability check of a path that writes
// RocksDB out of band (journal replay, side records) reads through this: the
// arena the same writes updated would hide one that never reached RocksDB
// until the next rebuild. Every Store on `options` must be closed or
// destroyed first (RocksDB's lock). A write journal left behind is replayed
// by this Open first, as by any start.
inline absl::StatusOr<std::unique_ptr<Store>> OpenFromRocksDbAlone(const StoreOptions& options) {
  if (absl::Status s = Arena::Remove(options.arena_options()); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
  if (store.ok() && (*store)->opened_as() != Store::OpenedAs::kCreated) {
    return absl::InternalError(absl::StrCat("arena of ", options.db_path, " was ",
                                            OpenedAsName((*store)->opened_as()),
                                            ", not built from RocksDB"));
  }
  return store;
}

}  // namespace kvnode::storage::testing

#endif  // KVNODE_TESTS_STORAGE_TEST_UTIL_H_
