// A small, fast, portable PRNG for load generation: the same seed gives the
// same stream on every platform and standard library (std:: distributions
// do not promise that). xoshiro256** seeded through splitmix64.
//
// Not thread-safe: one Rng per thread (see ForStream).
#ifndef KVNODE_CLIENT_LOAD_RNG_H_
#define KVNODE_CLIENT_LOAD_RNG_H_

#include <cstdint>

namespace kvnode::load {

inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& w : s_) w = SplitMix64(seed);
  }
  // An independent stream per (seed, stream) pair, e.g. one per thread.
  static Rng ForStream(uint64_t seed, uint64_t stream) {
    uint64_t mix = seed ^ (0xd1b54a32d192ed03ull * (stream + 1));
    return Rng(SplitMix64(mix));
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 bits.
  double NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  // Uniform in [0, n), n > 0, without modulo bias (Lemire).
  uint64_t Uniform(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(Next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace kvnode::load

#endif  // KVNODE_CLIENT_LOAD_RNG_H_
