// A store cell for the store's tests: it stays live until `fresh_at`, and helpers that keep a key
// live or read why the store refused one.
//
//   sluice::ShardedStore<sluice_test::HoldCell> store({.max_keys_per_shard = 64});
//   REQUIRE(sluice_test::touch(store, store.digest("a"), 0, kSecond));  // live for 1 s
//   std::optional<std::int64_t> wait = sluice_test::refused(store, key, now, kSecond);
#ifndef SLUICE_TESTS_SUPPORT_HOLD_CELL_HPP_
#define SLUICE_TESTS_SUPPORT_HOLD_CELL_HPP_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>

#include "sluice/key.hpp"
#include "sluice/store.hpp"

namespace sluice_test {

// Live until `fresh_at`; counts the updates that touched it (touch, refused). 16 bytes: with a
// 16-byte digest, a slot of the size a one-window GCRA cell makes.
struct HoldCell {
  std::int64_t fresh_at = std::numeric_limits<std::int64_t>::min();
  std::uint64_t touches = 0;
  bool idle(std::int64_t now) const noexcept { return fresh_at <= now; }
  std::int64_t time_until_fresh(std::int64_t now) const noexcept {
    return fresh_at > now ? fresh_at - now : 0;
  }
};

// Keeps `key` live for `hold` ns after `now`. Returns false if the store refused the key.
inline bool touch(sluice::ShardedStore<HoldCell>& store, const sluice::KeyDigest& key,
                  std::int64_t now, std::int64_t hold) {
  return store.update(
      key, now,
      [&](HoldCell& cell, std::int64_t at) {
        cell.fresh_at = std::max(cell.fresh_at, at + hold);
        ++cell.touches;
        return true;
      },
      [](sluice::StoreFull) { return false; });
}

// Like touch; returns the wait the store gave if it refused the key, nothing if it took it.
inline std::optional<std::int64_t> refused(sluice::ShardedStore<HoldCell>& store,
                                           const sluice::KeyDigest& key, std::int64_t now,
                                           std::int64_t hold) {
  std::optional<std::int64_t> retry;
  store.update(
      key, now,
      [&](HoldCell& cell, std::int64_t at) {
        cell.fresh_at = std::max(cell.fresh_at, at + hold);
        ++cell.touches;
        return true;
      },
      [&](sluice::StoreFull full) {
        retry = full.retry_after_ns;
        return false;
      });
  return retry;
}

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_HOLD_CELL_HPP_
