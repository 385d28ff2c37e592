#include "sluice/detail/store_table.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "catch.hpp"
#include "hold_cell.hpp"
#include "sluice/key.hpp"
#include "sluice/store.hpp"

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;

using sluice_test::HoldCell;
using sluice_test::refused;
using sluice_test::touch;
// Tables given cells directly label each by its `touches`.
using Table = sluice::detail::StoreTable<HoldCell>;
using Store = sluice::ShardedStore<HoldCell>;

// A random digest in shard `shard`.
sluice::KeyDigest digest_in_shard(std::mt19937_64& rng, std::size_t shard) {
  return {rng() | 1, (rng() << 6) | shard};
}

// The inverse of the table's second-bucket multiplier modulo 2^64 (Newton's iteration).
constexpr std::uint64_t inverse(std::uint64_t odd) {
  std::uint64_t x = odd;
  for (int i = 0; i < 6; ++i) x *= 2 - odd * x;
  return x;
}

// The `i`th of digests that share both buckets in every table size and land in shard `shard`:
// their low halves, and their high halves times the second-bucket multiplier, differ only in low
// bits (which leaves the high halves' low six bits, the shard, alone).
sluice::KeyDigest colliding(std::uint64_t i, std::size_t shard) {
  constexpr std::uint64_t kMultiplier = Table::kSecondBucketMultiplier;
  static_assert(kMultiplier * inverse(kMultiplier) == 1);
  const std::uint64_t product = ((0x7f4a7c159e3779ULL << 6) + shard) * kMultiplier + (i << 8);
  return {0x9e3779b97f4a7c15ULL + (i << 8), product * inverse(kMultiplier)};
}

}  // namespace

TEST_CASE("a cuckoo table finds every key it took at 17/20 load, stash included") {
  constexpr std::size_t kBuckets = 1000;
  Table table(kBuckets, kBuckets);
  std::mt19937_64 rng(1);
  std::vector<sluice::KeyDigest> keys;
  while (keys.size() < kBuckets * 2 * 17 / 20) {
    const sluice::KeyDigest d = digest_in_shard(rng, 0);
    REQUIRE(table.insert(d, HoldCell{.fresh_at = 0, .touches = keys.size()}) != nullptr);
    keys.push_back(d);
  }
  CHECK(table.size() == keys.size());
  CHECK(table.stash_size() <= Table::kStashSlots);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const Table::Slot* slot = table.find(keys[i]);
    REQUIRE(slot != nullptr);
    CHECK(slot->cell.touches == i);
  }
  CHECK(table.find(digest_in_shard(rng, 0)) == nullptr);
}

TEST_CASE("a full cuckoo table fills its stash, then refuses a key and changes nothing") {
  Table table(2, 2);  // 4 slots
  std::mt19937_64 rng(2);
  std::vector<sluice::KeyDigest> keys;
  while (table.insert(keys.emplace_back(digest_in_shard(rng, 0)), HoldCell{}) != nullptr) {
  }
  keys.pop_back();  // refused
  CHECK(keys.size() == 4 + Table::kStashSlots);
  CHECK(table.size() == keys.size());
  CHECK(table.stash_size() == Table::kStashSlots);
  for (const sluice::KeyDigest& d : keys) CHECK(table.find(d) != nullptr);
}

TEST_CASE("keys sharing both buckets take two buckets and the stash, with bounded work") {
  Table table(1024, 1024);
  std::size_t taken = 0;
  for (std::uint64_t i = 0; i < 100; ++i) {
    if (table.insert(colliding(i, 0), HoldCell{.fresh_at = 0, .touches = i}) != nullptr) ++taken;
  }
  CHECK(taken == 4 + Table::kStashSlots);
  for (std::uint64_t i = 0; i < taken; ++i) CHECK(table.find(colliding(i, 0))->cell.touches == i);
}

TEST_CASE("an erased key's slot is taken again and other keys stay found") {
  Table table(64, 64);
  std::mt19937_64 rng(3);
  std::vector<sluice::KeyDigest> keys;
  for (int i = 0; i < 100; ++i) {
    keys.push_back(digest_in_shard(rng, 0));
    REQUIRE(table.insert(keys.back(), HoldCell{}) != nullptr);
  }
  for (std::size_t i = 0; i < keys.size(); i += 2) table.erase(table.find(keys[i]));
  CHECK(table.size() == 50);
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK((table.find(keys[i]) != nullptr) == (i % 2));
  for (std::size_t i = 0; i < keys.size(); i += 2) {
    REQUIRE(table.insert(keys[i], HoldCell{.fresh_at = 0, .touches = i}) != nullptr);
  }
  for (std::size_t i = 0; i < keys.size(); i += 2) CHECK(table.find(keys[i])->cell.touches == i);
  CHECK(table.size() == 100);
}

TEST_CASE("a store keeps every key through its tables' growth, removal and reinsertion") {
  Store store({.max_keys_per_shard = 4096, .seed = 1});
  std::mt19937_64 rng(4);
  std::vector<sluice::KeyDigest> keys;
  for (int i = 0; i < 4000; ++i) {
    keys.push_back(digest_in_shard(rng, 3));
    REQUIRE(touch(store, keys.back(), 0, kSecond));
  }
  CHECK(store.stats() == sluice::StoreStats{.size = 4000});
  // At most 20/17 slots per key, the table having grown by half past 17/20 load.
  CHECK(store.table_bytes() <= 64 * 8 * 32 + 4096 * 20 / 17 * 32 + 64);
  for (std::size_t i = 0; i < keys.size(); i += 3) store.forget(keys[i], 0);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CHECK(store.find(keys[i]).has_value() == (i % 3 != 0));
  }
  for (std::size_t i = 0; i < keys.size(); i += 3) REQUIRE(touch(store, keys[i], 0, 2 * kSecond));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(store.find(keys[i]).has_value());
    CHECK(store.find(keys[i])->fresh_at == (i % 3 == 0 ? 2 : 1) * kSecond);
  }
  CHECK(store.stats().live_evicted == 0);
}

TEST_CASE("a kEvict store facing keys that share both buckets evicts among them only") {
  constexpr std::size_t kCap = 64;
  Store store({.max_keys_per_shard = kCap, .seed = 1});
  std::mt19937_64 rng(5);
  std::vector<sluice::KeyDigest> others;
  for (int i = 0; i < 20; ++i) {
    others.push_back(digest_in_shard(rng, 2));
    REQUIRE(touch(store, others.back(), 0, 100 * kSecond));
  }
  // 4 + kStashSlots of them fit, then each evicts the colliding cell a sweep would evict first.
  constexpr std::uint64_t kColliding = 40;
  for (std::uint64_t i = 0; i < kColliding; ++i) {
    REQUIRE(touch(store, colliding(i, 2), 0, (1 + static_cast<std::int64_t>(i)) * kSecond));
  }
  // (Fewer fit if other keys hold slots of those buckets: at most 4.)
  const std::size_t fit = 4 + Table::kStashSlots;
  CHECK(store.stats().live_evicted >= kColliding - fit);
  CHECK(store.stats().live_evicted <= kColliding - fit + 4);
  // The last colliding key and every other key are tracked.
  CHECK(store.find(colliding(kColliding - 1, 2)).has_value());
  for (const sluice::KeyDigest& d : others) CHECK(store.find(d).has_value());
}

TEST_CASE(
    "a kRejectNewKeys store refuses a key colliding with live cells, then takes an idle one") {
  Store store({.max_keys_per_shard = 64, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1});
  const std::size_t fit = 4 + Table::kStashSlots;
  std::size_t admitted = 0;
  for (std::uint64_t i = 0; i < 40; ++i) {
    admitted += touch(store, colliding(i, 4), 0, (5 + static_cast<std::int64_t>(i)) * kSecond);
  }
  CHECK(admitted >= fit);
  CHECK(admitted < 40);
  CHECK(store.stats().live_evicted == 0);
  CHECK(store.stats().size == admitted);
  const std::optional<std::int64_t> retry = refused(store, colliding(100, 4), 0, kSecond);
  REQUIRE(retry.has_value());
  CHECK(*retry >= 5 * kSecond);
  // Once the earliest cell of its buckets is idle, the key takes its slot.
  CHECK(touch(store, colliding(100, 4), *retry, kSecond));
  CHECK(store.stats().size == admitted);
}

TEST_CASE("the kRejectNewKeys idle index follows cells that moved to their other bucket") {
  constexpr std::size_t kCap = 512;
  Store store(
      {.max_keys_per_shard = kCap, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1});
  std::mt19937_64 rng(6);
  std::vector<sluice::KeyDigest> keys;
  for (std::size_t i = 0; i < kCap; ++i) {  // inserts move earlier cells between buckets
    keys.push_back(digest_in_shard(rng, 7));
    REQUIRE(touch(store, keys.back(), 0, (10 + static_cast<std::int64_t>(i)) * kSecond));
  }
  // Full: the earliest cell (keys[0], idle at 10 s) decides the wait.
  CHECK(refused(store, digest_in_shard(rng, 7), kSecond, kSecond) == 9 * kSecond);
  // At 12 s keys 0..2 are idle: three new keys take their places, a fourth is refused.
  for (int i = 0; i < 3; ++i) CHECK(touch(store, digest_in_shard(rng, 7), 12 * kSecond, kSecond));
  CHECK_FALSE(touch(store, digest_in_shard(rng, 7), 12 * kSecond, kSecond));
  for (std::size_t i = 0; i < 3; ++i) CHECK_FALSE(store.find(keys[i]).has_value());
  for (std::size_t i = 3; i < kCap; ++i) CHECK(store.find(keys[i]).has_value());
  CHECK(store.stats() ==
        sluice::StoreStats{.size = kCap, .idle_reclaimed = 3, .capacity_denials = 2});
}

TEST_CASE("a kEvict sweep of a cuckoo table evicts in (time until fresh, digest) order") {
  constexpr std::size_t kCap = 256;
  Store store({.max_keys_per_shard = kCap, .seed = 1});
  std::mt19937_64 rng(8);
  std::vector<std::pair<std::int64_t, sluice::KeyDigest>> held;
  for (std::size_t i = 0; i < kCap; ++i) {
    const sluice::KeyDigest d = digest_in_shard(rng, 1);
    const std::int64_t hold = (1 + static_cast<std::int64_t>(rng() % 8)) * kSecond;  // ties
    REQUIRE(touch(store, d, 0, hold));
    held.emplace_back(hold, d);
  }
  REQUIRE(touch(store, digest_in_shard(rng, 1), 0, 100 * kSecond));  // sweeps to cap/2
  std::sort(held.begin(), held.end());
  for (std::size_t i = 0; i < kCap; ++i) {
    INFO("rank " << i);
    CHECK(store.find(held[i].second).has_value() == (i >= kCap / 2));
  }
  CHECK(store.stats().live_evicted == kCap / 2);
}

TEST_CASE("a cuckoo table agrees with a map under random inserts and erases, colliding keys too") {
  std::mt19937_64 rng(7);
  for (std::size_t buckets : {1, 2, 3, 8, 64}) {
    Table table(buckets, buckets);
    std::vector<std::pair<sluice::KeyDigest, std::uint64_t>> model;  // what the table must hold
    auto held_at = [&](const sluice::KeyDigest& d) {
      return std::find_if(model.begin(), model.end(), [&](const auto& e) { return e.first == d; });
    };
    for (std::uint64_t step = 0; step < 4000; ++step) {
      // Erase a held key a third of the time; else insert a key, a third of them sharing both
      // buckets with each other (the rest random). A refused insert must change nothing.
      if (!model.empty() && rng() % 3 == 0) {
        const std::size_t victim = rng() % model.size();
        table.erase(table.find(model[victim].first));
        model.erase(model.begin() + static_cast<std::ptrdiff_t>(victim));
      } else {
        const sluice::KeyDigest d =
            rng() % 3 == 0 ? colliding(rng() % 16, 0) : digest_in_shard(rng, 0);
        if (held_at(d) == model.end() &&
            table.insert(d, HoldCell{.fresh_at = 0, .touches = step}) != nullptr) {
          model.emplace_back(d, step);
        }
      }
      REQUIRE(table.size() == model.size());
      REQUIRE(table.stash_size() <= Table::kStashSlots);
      std::size_t visited = 0;
      table.for_each([&](const Table::Slot&) { ++visited; });
      REQUIRE(visited == model.size());
      for (const auto& [key, touches] : model) {
        const Table::Slot* slot = table.find(key);
        REQUIRE(slot != nullptr);
        REQUIRE(slot->cell.touches == touches);
      }
    }
  }
}
