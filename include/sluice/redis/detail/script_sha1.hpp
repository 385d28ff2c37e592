// sluice/redis/detail/script_sha1.hpp — the SHA-1 Redis caches a script under, in hex. Internal.
//
// Redis names a cached Lua script by the SHA-1 of its body (EVALSHA <sha1>), so the client
// computes it locally instead of asking the server. Not used for anything security-related.
//
//   std::string sha = sluice::redis::detail::sha1_hex("abc");  // "a9993e36...c9cd0d89d"
//
// Complexity: O(size of the input). Thread-safety: pure functions.
#ifndef SLUICE_REDIS_DETAIL_SCRIPT_SHA1_HPP_
#define SLUICE_REDIS_DETAIL_SCRIPT_SHA1_HPP_

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/detail/text.hpp"

namespace sluice::redis::detail {

using Sha1State = std::array<std::uint32_t, 5>;

// The message padded to whole 64-byte blocks: a 1 bit, zeros, then its length in bits
// (big-endian, 64 bits).
inline std::string sha1_padded(std::string_view data) {
  std::string message(data);
  const std::uint64_t bit_length = static_cast<std::uint64_t>(data.size()) * 8;
  message.push_back(static_cast<char>(0x80));
  while (message.size() % 64 != 56) {
    message.push_back('\0');
  }
  for (int shift = 56; shift >= 0; shift -= 8) {
    message.push_back(static_cast<char>((bit_length >> shift) & 0xff));
  }
  return message;
}

// Folds one 64-byte block into `h` (FIPS 180-4, section 6.1.2).
inline void sha1_compress(Sha1State& h, std::string_view block) {
  std::array<std::uint32_t, 80> w{};
  for (std::size_t i = 0; i < 16; ++i) {
    const auto byte = [&](std::size_t k) {
      return static_cast<std::uint32_t>(static_cast<unsigned char>(block[4 * i + k]));
    };
    w[i] = (byte(0) << 24) | (byte(1) << 16) | (byte(2) << 8) | byte(3);
  }
  for (std::size_t i = 16; i < 80; ++i) {
    w[i] = std::rotl(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
  }
  std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
  for (std::size_t i = 0; i < 80; ++i) {
    std::uint32_t f = 0, k = 0;
    if (i < 20) {
      f = (b & c) | (~b & d);
      k = 0x5A827999u;
    } else if (i < 40) {
      f = b ^ c ^ d;
      k = 0x6ED9EBA1u;
    } else if (i < 60) {
      f = (b & c) | (b & d) | (c & d);
      k = 0x8F1BBCDCu;
    } else {
      f = b ^ c ^ d;
      k = 0xCA62C1D6u;
    }
    const std::uint32_t next = std::rotl(a, 5) + f + e + k + w[i];
    e = d;
    d = c;
    c = std::rotl(b, 30);
    b = a;
    a = next;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
}

// FIPS 180-4 SHA-1 over `data`; returns 40 lowercase hex digits.
inline std::string sha1_hex(std::string_view data) {
  Sha1State h = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
  const std::string message = sha1_padded(data);
  for (std::size_t chunk = 0; chunk < message.size(); chunk += 64) {
    sha1_compress(h, std::string_view(message).substr(chunk, 64));
  }
  std::string hex;  // the words, big-endian
  hex.reserve(40);
  for (std::uint32_t word : h) sluice::detail::append_hex(hex, word, 8);
  return hex;
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_SCRIPT_SHA1_HPP_
