// Helpers for storage tests: a private temp dir and a unique segment name per
// test, both removed at the end.
#ifndef KVNODE_TESTS_STORAGE_TEST_UTIL_H_
#define KVNODE_TESTS_STORAGE_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

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

}  // namespace kvnode::storage::testing

#endif  // KVNODE_TESTS_STORAGE_TEST_UTIL_H_
