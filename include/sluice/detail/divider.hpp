// Internal: division of 64-bit integers by a divisor fixed at construction, by multiplication.
//
// A hardware 64-bit division costs tens of cycles; a limiter divides by the same window constants
// (period, requests) on every check, so it precomputes a magic multiplier once and divides with
// one 64×64→128 multiply, a subtraction and shifts. This is the classic round-up method
// (Granlund–Montgomery; the same scheme as libdivide's unsigned 64-bit branchful divider).
// Exact for every numerator and every divisor ≥ 1 (tests/divider_test.cpp checks it against `/`).
#ifndef SLUICE_DETAIL_DIVIDER_HPP_
#define SLUICE_DETAIL_DIVIDER_HPP_

#include <bit>
#include <cstdint>

#include "absl/numeric/int128.h"

namespace sluice::detail {

class Divider {
 public:
  Divider() = default;
  explicit Divider(std::uint64_t divisor) noexcept : divisor_(divisor) {
    const int log2 = 63 - std::countl_zero(divisor);
    if ((divisor & (divisor - 1)) == 0) {  // a power of two: a shift
      shift_ = log2;
      return;
    }
    // 2^(64 + log2) / divisor: the quotient fits in 64 bits since divisor > 2^log2.
    const absl::uint128 numerator = absl::MakeUint128(std::uint64_t{1} << log2, 0);
    std::uint64_t magic = absl::Uint128Low64(numerator / divisor);
    const std::uint64_t remainder = absl::Uint128Low64(numerator % divisor);
    if (divisor - remainder < (std::uint64_t{1} << log2)) {
      shift_ = log2;
    } else {
      // The multiplier needs 65 bits: keep its low 64 and add the numerator back when dividing.
      magic += magic;
      const std::uint64_t twice = remainder + remainder;
      if (twice >= divisor || twice < remainder) ++magic;
      shift_ = log2;
      add_ = true;
    }
    magic_ = magic + 1;
  }

  std::uint64_t divisor() const noexcept { return divisor_; }

  // floor(n / divisor)
  std::uint64_t divide(std::uint64_t n) const noexcept {
    if (magic_ == 0) return n >> shift_;
    const std::uint64_t q = absl::Uint128High64(absl::uint128(magic_) * n);
    if (!add_) return q >> shift_;
    return (((n - q) >> 1) + q) >> shift_;
  }
  // ceil(n / divisor)
  std::uint64_t divide_up(std::uint64_t n) const noexcept {
    const std::uint64_t q = divide(n);
    return q + (q * divisor_ != n ? 1 : 0);
  }

 private:
  std::uint64_t divisor_ = 1;
  std::uint64_t magic_ = 0;  // 0: divide by shifting
  int shift_ = 0;
  bool add_ = false;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_DIVIDER_HPP_
