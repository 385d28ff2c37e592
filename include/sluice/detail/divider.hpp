// Internal: division of 64-bit integers by a divisor fixed at construction, by multiplication.
//
// A hardware 64-bit division costs tens of cycles; a limiter divides by the same window constants
// (period, requests) on every check, so it precomputes a magic multiplier once and divides with
// one 64×64→128 multiply, a subtraction and shifts. This is the classic round-up method
// (Granlund–Montgomery; the same scheme as libdivide's unsigned 64-bit branchful divider).
// Exact for every numerator and every divisor ≥ 1 (tests/divider_test.cpp checks it against `/`).
// `divide_wide` divides a 128-bit numerator whose quotient fits 64 bits the same way (Möller and
// Granlund's division by a precomputed reciprocal, "Improved division by invariant integers",
// 2011), where a hardware 128/64 division or libgcc's __udivti3 would cost tens of cycles.
#ifndef SLUICE_DETAIL_DIVIDER_HPP_
#define SLUICE_DETAIL_DIVIDER_HPP_

#include <bit>
#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/numeric/int128.h"

namespace sluice::detail {

class Divider {
 public:
  Divider() = default;
  explicit Divider(std::uint64_t divisor) noexcept
      : divisor_(divisor),
        normalizing_shift_(std::countl_zero(divisor)),
        normalized_(divisor << normalizing_shift_),
        // floor((2^128 − 1) / normalized) − 2^64: the quotient is in [2^64, 2^65).
        reciprocal_(absl::Uint128Low64(~absl::uint128(0) / normalized_)) {
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
  // floor(n / divisor) for n < divisor·2^64 (the quotient fits 64 bits). Always inline for a
  // numerator that fits 64 bits (the common case: a division by multiplication); the wide case is
  // a call.
  ABSL_ATTRIBUTE_ALWAYS_INLINE std::uint64_t divide_wide(absl::uint128 n) const noexcept {
    const std::uint64_t high = absl::Uint128High64(n);
    const std::uint64_t low = absl::Uint128Low64(n);
    if (ABSL_PREDICT_TRUE(high == 0)) return divide(low);
    return divide_wide_high(high, low);
  }
  // ceil(n / divisor)
  std::uint64_t divide_up(std::uint64_t n) const noexcept {
    const std::uint64_t q = divide(n);
    return q + (q * divisor_ != n ? 1 : 0);
  }

 private:
  // divide_wide for a numerator of high·2^64 + low with 0 < high < divisor.
  ABSL_ATTRIBUTE_NOINLINE std::uint64_t divide_wide_high(std::uint64_t high,
                                                         std::uint64_t low) const noexcept {
    // Normalized so that the divisor's top bit is set; high < divisor keeps high_n < normalized.
    const int s = normalizing_shift_;
    const std::uint64_t high_n = s == 0 ? high : (high << s) | (low >> (64 - s));
    const std::uint64_t low_n = low << s;
    const absl::uint128 estimate =
        absl::uint128(reciprocal_) * high_n + absl::MakeUint128(high_n + 1, low_n);
    std::uint64_t q = absl::Uint128High64(estimate);
    std::uint64_t r = low_n - q * normalized_;
    if (r > absl::Uint128Low64(estimate)) {
      --q;
      r += normalized_;
    }
    if (r >= normalized_) ++q;
    return q;
  }

  std::uint64_t divisor_ = 1;
  int normalizing_shift_ = 63;             // leading zeros of the divisor
  std::uint64_t normalized_ = 1ULL << 63;  // divisor << normalizing_shift_
  std::uint64_t reciprocal_ = ~0ULL;       // floor((2^128 − 1) / normalized_) − 2^64
  std::uint64_t magic_ = 0;                // 0: divide by shifting
  int shift_ = 0;
  bool add_ = false;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_DIVIDER_HPP_
