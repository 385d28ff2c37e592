#include "sluice/detail/divider.hpp"

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/numeric/int128.h"
#include "catch.hpp"

namespace {
constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

void check_divisor(std::uint64_t d, std::mt19937_64& rng) {
  const sluice::detail::Divider divider(d);
  std::vector<std::uint64_t> numerators{
      0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, kMax, kMax - 1, kMax / d * d, kMax / d * d - 1};
  for (int i = 0; i < 64; ++i) numerators.push_back(rng());
  for (int i = 0; i < 64; ++i) numerators.push_back(rng() >> (rng() % 64));
  for (std::uint64_t n : numerators) {
    // A 128-bit numerator whose quotient fits 64 bits: high word below the divisor.
    const absl::uint128 wide = absl::MakeUint128(d == 1 ? 0 : rng() % d, n);
    REQUIRE(divider.divide_wide(wide) == absl::Uint128Low64(wide / d));
    REQUIRE(divider.divide(n) == n / d);
    REQUIRE(divider.divide_up(n) == n / d + (n % d != 0 ? 1 : 0));
  }
  const absl::uint128 largest = absl::MakeUint128(d - 1, kMax);  // quotient 2^64 − 1
  REQUIRE(divider.divide_wide(largest) == absl::Uint128Low64(largest / d));
}
}  // namespace

TEST_CASE(
    "division by multiplication equals hardware division for every kind of divisor, 64 and 128-bit "
    "numerators") {
  std::mt19937_64 rng(99);
  for (std::uint64_t d = 1; d <= 5000; ++d) check_divisor(d, rng);
  for (int shift = 0; shift < 64; ++shift) {
    const std::uint64_t p = std::uint64_t{1} << shift;
    check_divisor(p, rng);
    if (p > 1) check_divisor(p - 1, rng);
    check_divisor(p + 1, rng);
  }
  for (std::uint64_t d : std::vector<std::uint64_t>{3, 7, 1'000'000'000, 60'000'000'000,
                                                    3'600'000'000'000, kMax, kMax - 1, kMax / 3}) {
    check_divisor(d, rng);
  }
  for (int i = 0; i < 20'000; ++i) {
    std::uint64_t d = rng() >> (rng() % 64);
    if (d == 0) d = 1;
    check_divisor(d, rng);
  }
}
