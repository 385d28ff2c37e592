// sluice/key.hpp — key digests and composite keys.
//
// Stores never keep raw keys: they keep a 128-bit XXH3 digest computed with a per-store seed, so
// identities are not retained in memory, logs or metrics, and an attacker who does not know the
// seed cannot aim keys at one shard.
//
//   sluice::KeyHasher hasher;                      // random seed
//   sluice::KeyDigest d = hasher("203.0.113.7");
//
//   std::string key;                               // composite keys: unambiguous encoding
//   sluice::append_key_part(key, "per-ip");
//   sluice::append_key_part(key, client_ip);       // ("a|b","c") and ("a","b|c") differ
//
// Thread-safety: KeyHasher is immutable after construction; any thread may use it.
// Complexity: hashing is O(key length); XXH3 runs in a few ns for short keys.
#ifndef SLUICE_KEY_HPP_
#define SLUICE_KEY_HPP_

#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>

#include "absl/base/attributes.h"
#include "sluice/detail/key_digest.hpp"
#include "sluice/detail/little_endian.hpp"
#include "sluice/detail/short_copy.hpp"
#include "sluice/detail/xxhash.hpp"

namespace sluice {

// A fresh random 64-bit seed from std::random_device.
inline std::uint64_t random_seed() {
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ std::uint64_t{device()};
}

// Seeded XXH3-128 over key bytes.
class KeyHasher {
 public:
  KeyHasher() : seed_(random_seed()) {}
  explicit KeyHasher(std::uint64_t seed) noexcept : seed_(seed) {}

  // Always inline (XXH3 itself stays a call): out of line, a caller that is itself not inlined
  // (a limiter's check called from more than one place) got the digest back in two registers,
  // stored them to a stack slot and read it back as one 16-byte load, a store-forwarding stall
  // that doubled the cost of a hot-key check (GCC 12, -O3).
  ABSL_ATTRIBUTE_ALWAYS_INLINE KeyDigest operator()(std::string_view key) const noexcept {
    return detail::seeded_digest(key, seed_);
  }

  std::uint64_t seed() const noexcept { return seed_; }

 private:
  std::uint64_t seed_;
};

// The bytes of one part of a composite key: a 4-byte little-endian length, then (for a tagged
// part) the tag, then the part's bytes, so no choice of part contents can make two different
// part lists encode alike. Parts longer than 4 GiB - 2 are not supported (a key that large is a
// caller bug). Every composite key and rule fingerprint in sluice is encoded here.
namespace detail {
// Writes a part of `size` bytes' header at `out`; returns the byte after it.
inline char* write_key_part_header(char* out, std::size_t size) noexcept {
  return write_le32(out, static_cast<std::uint32_t>(size));
}
}  // namespace detail

// The encoded size of a tagged part of `size` bytes (`write_key_part`).
constexpr std::size_t key_part_size(std::size_t size) noexcept { return 5 + size; }

// Writes the header of a part tagged `tag` of `size` bytes at `out` (key_part_size(0) bytes),
// for a part whose bytes are written after it in place.
inline char* write_key_part_header(char* out, char tag, std::size_t size) noexcept {
  out = detail::write_key_part_header(out, size + 1);
  *out++ = tag;
  return out;
}

// Writes `tag` and `part` as one part at `out`, which has room for key_part_size(part.size())
// bytes; returns the byte after it. The tag says what kind of value the part holds (an address,
// a credential, ...), so equal bytes of different kinds are different keys.
inline char* write_key_part(char* out, char tag, std::string_view part) noexcept {
  out = write_key_part_header(out, tag, part.size());
  detail::copy_short(out, part.data(), part.size());
  return out + part.size();
}

// Appends one untagged part.
inline void append_key_part(std::string& out, std::string_view part) {
  char header[4];
  detail::write_key_part_header(header, part.size());
  out.append(header, sizeof(header));
  out.append(part);
}

// Appends `tag` followed by `part` as one part (write_key_part).
inline void append_key_part(std::string& out, char tag, std::string_view part) {
  const std::size_t at = out.size();
  out.resize(at + key_part_size(part.size()));
  write_key_part(out.data() + at, tag, part);
}

}  // namespace sluice

#endif  // SLUICE_KEY_HPP_
