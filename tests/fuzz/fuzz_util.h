// Helpers shared by the libFuzzer targets in tests/fuzz/.
//
// A target checks two things on every input: that the decoder neither crashes
// nor reads outside the bytes it was given (ASan and UBSan catch that), and
// properties of the decoder's own contract (a view points into the input,
// decode -> encode gives the same bytes, ...). A broken property aborts, which
// libFuzzer records as a crash with the input that caused it.
#ifndef KVNODE_TESTS_FUZZ_FUZZ_UTIL_H_
#define KVNODE_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#define FUZZ_CHECK(cond)                                                                    \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

namespace kvnode::fuzz {

// True when `view` lies entirely inside [base, base + size).
inline bool Inside(std::string_view view, const void* base, size_t size) {
  const auto* b = static_cast<const char*>(base);
  return view.empty() || (view.data() >= b && view.data() + view.size() <= b + size);
}

inline uint64_t Le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}
inline void PutLe(uint8_t* p, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace kvnode::fuzz

#endif  // KVNODE_TESTS_FUZZ_FUZZ_UTIL_H_
