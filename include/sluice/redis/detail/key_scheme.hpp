// sluice/redis/detail/key_scheme.hpp — the one rule by which every Redis limiter names its keys:
// the digest of a key (seeded, bound to what it is counted against) and the key names built from
// it. Deployed state lives under these names; tests/redis_key_scheme_test.cpp pins them. Internal.
//
//   const std::uint64_t seed = sluice::redis::detail::bound_seed(fingerprint, key_seed);
//   const sluice::KeyDigest d = sluice::redis::detail::key_digest(key, seed);
//   std::string name = sluice::redis::detail::slot_key_name("rl:", d);  // "rl:{<32 hex>}"
//
// Thread-safety: pure functions.
#ifndef SLUICE_REDIS_DETAIL_KEY_SCHEME_HPP_
#define SLUICE_REDIS_DETAIL_KEY_SCHEME_HPP_

#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/detail/key_digest.hpp"
#include "sluice/detail/little_endian.hpp"
#include "sluice/detail/text.hpp"
#include "sluice/detail/xxhash.hpp"

namespace sluice::redis::detail {

// The seed of a key's XXH3-128 digest: the deployment's key seed bound to the fingerprint of
// what the key is counted against (a limit's windows, an attempt policy), so that one key under
// two limits names two Redis keys.
inline std::uint64_t bound_seed(std::uint64_t fingerprint, std::uint64_t key_seed) {
  std::string bytes;
  sluice::detail::append_le64(bytes, fingerprint);
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), key_seed);
}

// The digest of `key` under a bound seed: sluice::KeyHasher's digest (XXH3-128, reserved
// digests remapped).
inline KeyDigest key_digest(std::string_view key, std::uint64_t bound_seed) {
  return sluice::detail::seeded_digest(key, bound_seed);
}

// The digest's 32 hex digits, high word first (its canonical, big-endian bytes).
inline void append_digest_hex(std::string& out, const KeyDigest& d) {
  sluice::detail::append_hex(out, d.high, 16);
  sluice::detail::append_hex(out, d.low, 16);
}

// prefix + "{" + 32 hex digits + "}": a rate limit's key, its own Cluster hash tag.
inline std::string slot_key_name(std::string_view prefix, const KeyDigest& d) {
  std::string name(prefix);
  name.push_back('{');
  append_digest_hex(name, d);
  name.push_back('}');
  return name;
}

// prefix + tag + 32 hex digits: a key under a hash tag shared with others (`tag` holds it, e.g.
// "{attempts}:"), so that they all live in one Cluster slot.
inline std::string tagged_key_name(std::string_view prefix, std::string_view tag,
                                   const KeyDigest& d) {
  std::string name(prefix);
  name.append(tag);
  append_digest_hex(name, d);
  return name;
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_KEY_SCHEME_HPP_
