// sluice/redis/detail/exact_double.hpp — the script's number format, with integers only. Internal.
//
// Lua in Redis has only doubles, so every number the script reads or writes is an IEEE-754
// binary64 holding an integer below 2^53, packed little-endian (`struct.pack('<d')`). These
// helpers convert between such bit patterns and integers with integer operations only, so no
// floating-point rounding can enter a decision.
//
//   std::string params;
//   sluice::redis::detail::append_double(params, 1000);        // 8 bytes: 1000.0, little-endian
//   std::size_t pos = 0;
//   auto value = sluice::redis::detail::read_double(params, pos, 1000);  // 1000; pos == 8
//
// Complexity: O(1) per value. Thread-safety: pure functions.
#ifndef SLUICE_REDIS_DETAIL_EXACT_DOUBLE_HPP_
#define SLUICE_REDIS_DETAIL_EXACT_DOUBLE_HPP_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/detail/little_endian.hpp"

namespace sluice::redis::detail {

// Times cross to and from the script as (seconds, nanoseconds within the second).
inline constexpr std::uint64_t kNanosPerSecond = 1'000'000'000;

// The binary64 bit pattern of `value` (< 2^53, so exact).
inline std::uint64_t integer_to_double_bits(std::uint64_t value) noexcept {
  if (value == 0) {
    return 0;
  }
  const int top = static_cast<int>(std::bit_width(value)) - 1;  // < 53
  const std::uint64_t mantissa = (value << (52 - top)) & ((std::uint64_t{1} << 52) - 1);
  return (static_cast<std::uint64_t>(top + 1023) << 52) | mantissa;
}

// The integer a binary64 bit pattern holds; nullopt for a negative, fractional, infinite or NaN
// value, or one of 2^63 or more (never a value the script stores).
inline std::optional<std::uint64_t> double_bits_to_integer(std::uint64_t bits) noexcept {
  if (bits == 0) {
    return 0;
  }
  const int exponent = static_cast<int>((bits >> 52) & 0x7ff);
  if ((bits >> 63) != 0 || exponent == 0 || exponent == 0x7ff) {
    return std::nullopt;
  }
  const std::uint64_t significand =
      (bits & ((std::uint64_t{1} << 52) - 1)) | (std::uint64_t{1} << 52);
  const int shift = exponent - 1075;  // value = significand * 2^shift
  if (shift >= 0) {
    if (shift > 10) {
      return std::nullopt;  // >= 2^63
    }
    return significand << shift;
  }
  if (shift < -52) {
    return std::nullopt;
  }
  if ((significand & ((std::uint64_t{1} << -shift) - 1)) != 0) {
    return std::nullopt;  // fraction
  }
  return significand >> -shift;
}

// Appends `integer` (< 2^53) as a little-endian double.
inline void append_double(std::string& out, std::uint64_t integer) {
  sluice::detail::append_le64(out, integer_to_double_bits(integer));
}

// Reads a little-endian double at `pos` as an integer ≤ `max`; advances `pos`. nullopt when
// fewer than 8 bytes are left or the value is not such an integer.
inline std::optional<std::uint64_t> read_double(std::string_view in, std::size_t& pos,
                                                std::uint64_t max) {
  if (pos > in.size() || in.size() - pos < 8) {
    return std::nullopt;
  }
  std::optional<std::uint64_t> value = double_bits_to_integer(sluice::detail::read_le64(&in[pos]));
  pos += 8;
  if (!value || *value > max) {
    return std::nullopt;
  }
  return value;
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_EXACT_DOUBLE_HPP_
