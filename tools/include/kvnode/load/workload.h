// What kvload asks for: the operation mix (YCSB core workloads A/B/C or an
// explicit read ratio), which key (uniform or zipfian), and the key bytes.
//
// Everything is deterministic under WorkloadOptions::seed: the same options
// and the same per-thread stream give the same sequence of (op, key).
#ifndef KVNODE_CLIENT_LOAD_WORKLOAD_H_
#define KVNODE_CLIENT_LOAD_WORKLOAD_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvnode/load/rng.h"

namespace kvnode::load {

enum class KeyDistribution { kUniform, kZipfian };

// "uniform" | "zipfian" (also "zipf").
[[nodiscard]] absl::StatusOr<KeyDistribution> ParseKeyDistribution(std::string_view name);

// YCSB core workloads: "A" -> 0.5 (update heavy), "B" -> 0.95 (read mostly),
// "C" -> 1.0 (read only). Case-insensitive.
[[nodiscard]] absl::StatusOr<double> ReadRatioForWorkload(std::string_view name);

struct WorkloadOptions {
  // Fraction of operations that are reads (GET); the rest are writes.
  // Default 0.5 (YCSB A). Must be in [0, 1].
  double read_ratio = 0.5;
  // Fraction of writes that are DELETEs instead of PUTs. Default 0 (YCSB has
  // none). Must be in [0, 1].
  double delete_ratio = 0.0;
  // Number of distinct keys, indices 0 .. keys-1. Default 100000. >= 1.
  uint64_t keys = 100000;
  // Bytes per key. Default 16. Must hold "k" + the decimal index of the last
  // key (MinKeySize) and be <= storage::kMaxKeySize.
  size_t key_size = 16;
  // Bytes per value. Default 64. <= storage::kMaxValueSize, and
  // >= kMinVerifiedValueSize when values are verified.
  size_t value_size = 64;
  // Default zipfian (YCSB's default request distribution).
  KeyDistribution distribution = KeyDistribution::kZipfian;
  // Zipfian skew; default 0.99 (YCSB). Must be in (0, 1).
  double zipf_theta = 0.99;
  // Seed of every random choice. Default 1.
  uint64_t seed = 1;

  // Names the offending flag (--read_ratio, --keys, ...) in its message.
  [[nodiscard]] absl::Status Validate(bool verify_values) const;
};

// Zipfian ranks in [0, n): rank 0 is the most popular, P(rank i) is
// proportional to 1 / (i+1)^theta. The generator of Gray et al., "Quickly
// generating billion-record synthetic databases" (SIGMOD '94), as used by
// YCSB's ZipfianGenerator. Construction computes zeta(n, theta): exactly for
// the first 10^6 terms, by the Euler-Maclaurin integral beyond (relative
// error below 1e-9).
class ZipfianGenerator {
 public:
  [[nodiscard]] static absl::StatusOr<ZipfianGenerator> Create(uint64_t n, double theta);
  uint64_t Next(Rng& rng) const;
  uint64_t n() const { return n_; }
  double theta() const { return theta_; }
  double zeta_n() const { return zeta_n_; }

 private:
  ZipfianGenerator() = default;
  uint64_t n_ = 0;
  double theta_ = 0, alpha_ = 0, zeta_n_ = 0, eta_ = 0, half_pow_theta_ = 0;
};

// Picks key indices in [0, keys). Zipfian ranks are scrambled by a fixed
// bijection of [0, keys) (an affine permutation chosen from the seed) so that
// the popular keys are spread over the key space rather than being keys 0, 1,
// 2 ... (the point of YCSB's ScrambledZipfianGenerator; unlike YCSB's hash,
// a bijection keeps every key reachable and the skew exact).
// Immutable after Create: shareable between threads, each with its own Rng.
class KeyChooser {
 public:
  [[nodiscard]] static absl::StatusOr<KeyChooser> Create(const WorkloadOptions& options);
  uint64_t Next(Rng& rng) const;
  // The key index that zipfian rank `rank` maps to (identity for uniform).
  uint64_t KeyForRank(uint64_t rank) const;

 private:
  KeyChooser() = default;
  uint64_t keys_ = 1;
  std::optional<ZipfianGenerator> zipf_;
  uint64_t mul_ = 1, add_ = 0;
};

enum class OpType { kRead, kPut, kDelete };
std::string_view OpTypeName(OpType op);  // "read", "put", "delete"

// Draws the next operation per read_ratio and delete_ratio.
OpType ChooseOp(const WorkloadOptions& options, Rng& rng);

// Smallest key_size that can name `keys` keys ("k" + digits of keys-1).
size_t MinKeySize(uint64_t keys);

// "k" followed by `index` in decimal, zero-padded to exactly key_size bytes
// (key_size >= MinKeySize(index + 1)), e.g. FormatKey(42, 8) == "k0000042".
std::string FormatKey(uint64_t index, size_t key_size);
// The same into *out, reusing its capacity (no allocation once it has
// grown to key_size: kvload's per-operation path).
void FormatKeyTo(uint64_t index, size_t key_size, std::string* out);

// Inverse of FormatKey; nullopt for anything FormatKey cannot produce.
std::optional<uint64_t> ParseKeyIndex(std::string_view key);

}  // namespace kvnode::load

#endif  // KVNODE_CLIENT_LOAD_WORKLOAD_H_
