// Internal: sluice::KeyDigest (re-exported by sluice/key.hpp) and the one rule that makes a
// digest of key bytes under a seed, apart from KeyHasher's random seeding, so that a backend
// that only digests with a known seed (the Redis key scheme) does not pull in <random>.
//
//   sluice::KeyDigest d = sluice::detail::seeded_digest("203.0.113.7", seed);
//
// Thread-safety: pure functions.
#ifndef SLUICE_DETAIL_KEY_DIGEST_HPP_
#define SLUICE_DETAIL_KEY_DIGEST_HPP_

#include <compare>
#include <cstdint>
#include <string_view>

#include "absl/base/attributes.h"
#include "sluice/detail/xxhash.hpp"

namespace sluice {

// A 128-bit key digest. Two digests are reserved: {0, 0} marks an empty store slot and {0, 1} a
// slot whose key was removed. A key that hashes to either is mapped to {1, high}, which merges it
// with one other of 2^128 digests.
struct KeyDigest {
  std::uint64_t low = 0;
  std::uint64_t high = 0;

  bool empty() const noexcept { return (low | high) == 0; }
  friend bool operator==(const KeyDigest&, const KeyDigest&) = default;
  friend auto operator<=>(const KeyDigest& a, const KeyDigest& b) noexcept {
    if (auto c = a.high <=> b.high; std::is_neq(c)) return c;
    return a.low <=> b.low;
  }
};

namespace detail {

// Seeded XXH3-128 over `key`, with the reserved digests mapped to {1, high}. Always inline, as
// KeyHasher::operator() that calls it (see there).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline KeyDigest seeded_digest(std::string_view key,
                                                            std::uint64_t seed) noexcept {
  const XXH128_hash_t h = XXH3_128bits_withSeed(key.data(), key.size(), seed);
  KeyDigest d{h.low64, h.high64};
  if (d.low == 0 && d.high <= 1) d.low = 1;
  return d;
}

}  // namespace detail
}  // namespace sluice

#endif  // SLUICE_DETAIL_KEY_DIGEST_HPP_
