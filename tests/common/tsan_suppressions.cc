// Linked into every test binary of a ThreadSanitizer build (tests/CMakeLists.txt).
//
// Debian's RocksDB is not built with -fsanitize=thread: TSan sees its
// mutexes (intercepted) but not its atomics, and reports races between its
// own threads that its atomics order. A report with a RocksDB frame is
// therefore noise; every other race still fails the test.
extern "C" const char* __tsan_default_suppressions() { return "race:rocksdb::\n"; }
