#include "kvnode/load/workload.h"

#include <charconv>
#include <cmath>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "kvnode/base/errno.h"
#include "kvnode/load/verify.h"
#include "kvnode/storage/limits.h"

namespace kvnode::load {
namespace {

using base::Av;

constexpr uint64_t kExactZetaTerms = 1'000'000;

// sum_{i=1}^{n} 1/i^theta.
double Zeta(uint64_t n, double theta) {
  const uint64_t exact = std::min(n, kExactZetaTerms);
  double sum = 0;
  for (uint64_t i = 1; i <= exact; ++i) sum += std::pow(static_cast<double>(i), -theta);
  if (n > exact) {
    // Euler-Maclaurin: sum_{i=m+1}^{n} f(i) ~ int_m^n f + (f(n) - f(m)) / 2.
    const double m = static_cast<double>(exact), x = static_cast<double>(n);
    sum += (std::pow(x, 1 - theta) - std::pow(m, 1 - theta)) / (1 - theta) +
           (std::pow(x, -theta) - std::pow(m, -theta)) / 2;
  }
  return sum;
}

}  // namespace

absl::StatusOr<KeyDistribution> ParseKeyDistribution(std::string_view name) {
  const std::string n = absl::AsciiStrToLower(Av(name));
  if (n == "uniform") return KeyDistribution::kUniform;
  if (n == "zipfian" || n == "zipf") return KeyDistribution::kZipfian;
  return absl::InvalidArgumentError(
      absl::StrCat("--distribution: \"", Av(name), "\" is not uniform or zipfian"));
}

absl::StatusOr<double> ReadRatioForWorkload(std::string_view name) {
  const std::string n = absl::AsciiStrToUpper(Av(name));
  if (n == "A") return 0.5;
  if (n == "B") return 0.95;
  if (n == "C") return 1.0;
  return absl::InvalidArgumentError(
      absl::StrCat("--workload: \"", Av(name), "\" is not A, B or C"));
}

absl::Status WorkloadOptions::Validate(bool verify_values) const {
  if (!(read_ratio >= 0 && read_ratio <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--read_ratio ", read_ratio, " not in [0, 1]"));
  }
  if (!(delete_ratio >= 0 && delete_ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--delete_ratio ", delete_ratio, " not in [0, 1]"));
  }
  if (keys == 0) return absl::InvalidArgumentError("--keys must be at least 1");
  if (key_size < MinKeySize(keys) || key_size > storage::kMaxKeySize) {
    return absl::InvalidArgumentError(absl::StrCat("--key_size ", key_size, " must be in [",
                                                   MinKeySize(keys), ", ", storage::kMaxKeySize,
                                                   "] for ", keys, " keys"));
  }
  const size_t min_value = verify_values ? kMinVerifiedValueSize : 0;
  if (value_size < min_value || value_size > storage::kMaxValueSize) {
    return absl::InvalidArgumentError(absl::StrCat("--value_size ", value_size, " must be in [",
                                                   min_value, ", ", storage::kMaxValueSize, "]",
                                                   verify_values ? " with --verify" : ""));
  }
  if (distribution == KeyDistribution::kZipfian && !(zipf_theta > 0 && zipf_theta < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--zipf_theta ", zipf_theta, " not in (0, 1)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ZipfianGenerator> ZipfianGenerator::Create(uint64_t n, double theta) {
  if (n == 0) return absl::InvalidArgumentError("zipfian: n must be at least 1");
  if (!(theta > 0 && theta < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("zipfian: theta ", theta, " not in (0, 1)"));
  }
  ZipfianGenerator z;
  z.n_ = n;
  z.theta_ = theta;
  z.alpha_ = 1.0 / (1.0 - theta);
  z.zeta_n_ = Zeta(n, theta);
  const double zeta2 = Zeta(2, theta);
  z.eta_ = (1 - std::pow(2.0 / static_cast<double>(n), 1 - theta)) / (1 - zeta2 / z.zeta_n_);
  z.half_pow_theta_ = 1.0 + std::pow(0.5, theta);
  return z;
}

uint64_t ZipfianGenerator::Next(Rng& rng) const {
  const double u = rng.NextDouble();
  const double uz = u * zeta_n_;
  if (uz < 1.0) return 0;
  if (uz < half_pow_theta_ || n_ < 3) return std::min<uint64_t>(1, n_ - 1);
  const double r = static_cast<double>(n_) * std::pow(eta_ * u - eta_ + 1, alpha_);
  const uint64_t rank = r <= 0 ? 0 : static_cast<uint64_t>(r);
  return std::min(rank, n_ - 1);
}

absl::StatusOr<KeyChooser> KeyChooser::Create(const WorkloadOptions& options) {
  KeyChooser c;
  c.keys_ = options.keys;
  if (c.keys_ == 0) return absl::InvalidArgumentError("--keys must be at least 1");
  if (options.distribution == KeyDistribution::kZipfian) {
    absl::StatusOr<ZipfianGenerator> z = ZipfianGenerator::Create(options.keys, options.zipf_theta);
    if (!z.ok()) return z.status();
    c.zipf_ = *z;
    // rank -> (mul * rank + add) mod keys, a bijection when gcd(mul, keys) = 1.
    uint64_t s = options.seed ^ 0x5bd1e995;
    c.mul_ = (SplitMix64(s) % c.keys_) | 1;
    while (std::gcd(c.mul_, c.keys_) != 1) c.mul_ = (c.mul_ + 2) % c.keys_;
    if (c.keys_ == 1) c.mul_ = 0;
    c.add_ = SplitMix64(s) % c.keys_;
  }
  return c;
}

uint64_t KeyChooser::KeyForRank(uint64_t rank) const {
  if (!zipf_) return rank;
  const unsigned __int128 x = static_cast<unsigned __int128>(mul_) * rank + add_;
  return static_cast<uint64_t>(x % keys_);
}

uint64_t KeyChooser::Next(Rng& rng) const {
  if (!zipf_) return rng.Uniform(keys_);
  return KeyForRank(zipf_->Next(rng));
}

std::string_view OpTypeName(OpType op) {
  switch (op) {
    case OpType::kRead:
      return "read";
    case OpType::kPut:
      return "put";
    case OpType::kDelete:
      return "delete";
  }
  return "?";
}

OpType ChooseOp(const WorkloadOptions& options, Rng& rng) {
  if (options.read_ratio >= 1.0 || rng.NextDouble() < options.read_ratio) return OpType::kRead;
  if (options.delete_ratio > 0 && rng.NextDouble() < options.delete_ratio) return OpType::kDelete;
  return OpType::kPut;
}

size_t MinKeySize(uint64_t keys) {
  uint64_t last = keys == 0 ? 0 : keys - 1;
  size_t digits = 1;
  while (last >= 10) {
    last /= 10;
    ++digits;
  }
  return 1 + digits;
}

std::string FormatKey(uint64_t index, size_t key_size) {
  std::string key;
  FormatKeyTo(index, key_size, &key);
  return key;
}

void FormatKeyTo(uint64_t index, size_t key_size, std::string* out) {
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), index);
  const size_t n = static_cast<size_t>(end - digits);
  out->clear();
  out->reserve(std::max(key_size, n + 1));
  out->push_back('k');
  if (key_size > n + 1) out->append(key_size - n - 1, '0');
  out->append(digits, n);
}

std::optional<uint64_t> ParseKeyIndex(std::string_view key) {
  if (key.size() < 2 || key.front() != 'k') return std::nullopt;
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(key.data() + 1, key.data() + key.size(), v);
  if (ec != std::errc() || ptr != key.data() + key.size()) return std::nullopt;
  return v;
}

}  // namespace kvnode::load
