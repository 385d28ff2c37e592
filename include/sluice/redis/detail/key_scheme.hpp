// sluice/redis/detail/key_scheme.hpp — the bytes every Redis key and script argument is built
// from: one little-endian encoder, and the digest seed bound to what a key is counted against.
// Internal.
//
//   std::string bytes;
//   sluice::redis::detail::append_le64(bytes, 1000);  // e8 03 00 00 00 00 00 00
//   std::uint64_t seed = sluice::redis::detail::bound_seed(limit_fingerprint, key_seed);
//
// Thread-safety: pure functions.
#ifndef SLUICE_REDIS_DETAIL_KEY_SCHEME_HPP_
#define SLUICE_REDIS_DETAIL_KEY_SCHEME_HPP_

#include <cstdint>
#include <string>

#include "sluice/detail/xxhash.hpp"

namespace sluice::redis::detail {

// Appends the 8 bytes of `value`, least significant first (the scripts' `struct` '<' order).
inline void append_le64(std::string& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// The seed of a key's XXH3-128 digest: the deployment's key seed bound to the fingerprint of
// what the key is counted against (a limit's windows, an attempt policy), so that one key under
// two limits names two Redis keys.
inline std::uint64_t bound_seed(std::uint64_t fingerprint, std::uint64_t key_seed) {
  std::string bytes;
  append_le64(bytes, fingerprint);
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), key_seed);
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_KEY_SCHEME_HPP_
