// sluice/detail/little_endian.hpp — the one little-endian encoder: integers as bytes, least
// significant first, whatever the host's byte order. Every byte string sluice hashes or hands a
// server (key part lengths, window fingerprints, a PostgreSQL limit's identity, the Redis
// scripts' `struct` '<' arguments) is written here. Internal.
//
//   std::string bytes;
//   sluice::detail::append_le64(bytes, 1000);                // e8 03 00 00 00 00 00 00
//   std::uint64_t v = sluice::detail::read_le64(bytes.data());  // 1000
//
// Thread-safety: pure functions.
#ifndef SLUICE_DETAIL_LITTLE_ENDIAN_HPP_
#define SLUICE_DETAIL_LITTLE_ENDIAN_HPP_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace sluice::detail {

// Writes the `size` low bytes of `value` at `out`, least significant first; returns the byte
// after them. `size` is at most 8.
constexpr char* write_le(char* out, std::uint64_t value, std::size_t size) noexcept {
  for (std::size_t i = 0; i < size; ++i) {
    *out++ = static_cast<char>((value >> (8 * i)) & 0xff);
  }
  return out;
}

// Writes `value`'s 4 bytes at `out`; returns the byte after them.
constexpr char* write_le32(char* out, std::uint32_t value) noexcept {
  if (!std::is_constant_evaluated() && std::endian::native == std::endian::little) {
    std::memcpy(out, &value, sizeof value);  // one store, where GCC keeps four byte stores
    return out + sizeof value;
  }
  return write_le(out, value, 4);
}

// Appends `value`'s 8 bytes to `out`.
inline void append_le64(std::string& out, std::uint64_t value) {
  char bytes[8];
  write_le(bytes, value, sizeof bytes);
  out.append(bytes, sizeof bytes);
}

// The 8 bytes at `in` as one value (the inverse of append_le64).
constexpr std::uint64_t read_le64(const char* in) noexcept {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    value |= std::uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  }
  return value;
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_LITTLE_ENDIAN_HPP_
