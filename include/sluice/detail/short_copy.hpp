// Internal: copies, compares and decimal digits for the few bytes of a key part or an HTTP field
// value, written inline. For such sizes a call to the C library's memcpy, and std::to_chars's
// length computation, cost more than the bytes themselves.
//
// Thread-safety: pure functions.
#ifndef SLUICE_DETAIL_SHORT_COPY_HPP_
#define SLUICE_DETAIL_SHORT_COPY_HPP_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace sluice::detail {

// memcpy(out, in, n): for n ≤ 16 as two overlapping loads and stores of the widest word that
// fits, so no byte outside [in, in + n) is read or outside [out, out + n) written.
inline void copy_short(char* out, const char* in, std::size_t n) noexcept {
  if (n > 16) {
    std::memcpy(out, in, n);
  } else if (n >= 8) {
    std::uint64_t head = 0, tail = 0;
    std::memcpy(&head, in, 8);
    std::memcpy(&tail, in + n - 8, 8);
    std::memcpy(out, &head, 8);
    std::memcpy(out + n - 8, &tail, 8);
  } else if (n >= 4) {
    std::uint32_t head = 0, tail = 0;
    std::memcpy(&head, in, 4);
    std::memcpy(&tail, in + n - 4, 4);
    std::memcpy(out, &head, 4);
    std::memcpy(out + n - 4, &tail, 4);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i];
  }
}

// memcmp(a, b, n) == 0, for n ≤ 16 as two overlapping word compares (as copy_short).
inline bool equal_short(const char* a, const char* b, std::size_t n) noexcept {
  if (n > 16) return std::memcmp(a, b, n) == 0;
  if (n >= 8) {
    std::uint64_t a0 = 0, a1 = 0, b0 = 0, b1 = 0;
    std::memcpy(&a0, a, 8);
    std::memcpy(&a1, a + n - 8, 8);
    std::memcpy(&b0, b, 8);
    std::memcpy(&b1, b + n - 8, 8);
    return ((a0 ^ b0) | (a1 ^ b1)) == 0;
  }
  if (n >= 4) {
    std::uint32_t a0 = 0, a1 = 0, b0 = 0, b1 = 0;
    std::memcpy(&a0, a, 4);
    std::memcpy(&a1, a + n - 4, 4);
    std::memcpy(&b0, b, 4);
    std::memcpy(&b1, b + n - 4, 4);
    return ((a0 ^ b0) | (a1 ^ b1)) == 0;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// The number of decimal digits of `value` (no sign, no leading zeros): 1 to 20.
inline std::size_t decimal_size(std::uint64_t value) noexcept {
  std::size_t n = 1;
  for (std::uint64_t power = 10; n < 20 && value >= power; power *= 10) ++n;
  return n;
}

// Writes the decimal_size(value) digits of `value` so that they end at `end`, two digits per
// division. Written in place where they belong: digits written to a buffer and copied on are
// read back as one wide load over several narrow stores, which stalls the store forwarding.
inline void write_decimal(char* end, std::uint64_t value) noexcept {
  static constexpr char kPairs[] =
      "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
      "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
      "8081828384858687888990919293949596979899";
  char* at = end;
  while (value >= 100) {
    const std::size_t pair = static_cast<std::size_t>(value % 100) * 2;
    value /= 100;
    at -= 2;
    at[0] = kPairs[pair];
    at[1] = kPairs[pair + 1];
  }
  if (value >= 10) {
    at[-2] = kPairs[value * 2];
    at[-1] = kPairs[value * 2 + 1];
  } else {
    at[-1] = static_cast<char>('0' + value);
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_SHORT_COPY_HPP_
