#include "sluice/store.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "hold_cell.hpp"
#include "sluice/clock.hpp"
#include "sluice/gcra.hpp"
#include "sluice/key.hpp"

using namespace std::chrono_literals;

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;

using sluice_test::HoldCell;
using sluice_test::refused;
using sluice_test::touch;
using Store = sluice::ShardedStore<HoldCell>;

// The next `n` digests (key-0, key-1, ...) that land in shard `shard`.
std::vector<sluice::KeyDigest> keys_in_shard(const Store& store, std::size_t shard, std::size_t n,
                                             std::uint64_t& counter) {
  std::vector<sluice::KeyDigest> keys;
  while (keys.size() < n) {
    sluice::KeyDigest d = store.digest("key-" + std::to_string(counter++));
    if (Store::shard_index(d) == shard) keys.push_back(d);
  }
  return keys;
}

std::uint64_t tracked(const Store& store) { return store.stats().size; }

}  // namespace

TEST_CASE("a key spray never grows the store past kStoreShards times the cap") {
  constexpr std::size_t kCap = 32;
  Store store({.max_keys_per_shard = kCap, .seed = 7});
  const std::size_t bound = sluice::kStoreShards * kCap;
  std::uint64_t inserted = 0;
  std::int64_t now = 0;
  for (std::size_t i = 0; i < 50 * bound; ++i) {
    // Half the keys are one-shot (idle after 1 ns), half stay live for an hour.
    std::int64_t hold = (i % 2 == 0) ? 1 : 3600 * kSecond;
    REQUIRE(touch(store, store.digest("spray-" + std::to_string(i)), now, hold));
    ++inserted;
    now += 2;
    REQUIRE(tracked(store) <= bound);
  }
  const sluice::StoreStats stats = store.stats();
  CHECK(stats.size + stats.idle_reclaimed + stats.live_evicted == inserted);
  CHECK(stats.capacity_denials == 0);
  CHECK(stats.live_evicted > 0);
  CHECK(stats.idle_reclaimed > 0);
  for (std::size_t size : store.shard_sizes()) CHECK(size <= kCap);
}

TEST_CASE("a sweep drops every idle cell before any live one") {
  constexpr std::size_t kCap = 16;
  Store store({.max_keys_per_shard = kCap, .seed = 11});
  std::uint64_t counter = 0;
  auto keys = keys_in_shard(store, 0, kCap + 1, counter);
  // 4 cells idle after 1 s, 12 live for an hour: 12 > cap/2, so 4 live ones must go as well.
  for (std::size_t i = 0; i < kCap; ++i) {
    REQUIRE(touch(store, keys[i], 0, i < 4 ? kSecond : 3600 * kSecond + std::int64_t(i)));
  }
  REQUIRE(touch(store, keys[kCap], 2 * kSecond, 3600 * kSecond));

  const sluice::StoreStats stats = store.stats();
  CHECK(stats.idle_reclaimed == 4);
  CHECK(stats.live_evicted == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK_FALSE(store.find(keys[i]).has_value());
  // Of the live cells, those with the least time until fresh went first.
  for (std::size_t i = 4; i < 8; ++i) CHECK_FALSE(store.find(keys[i]).has_value());
  for (std::size_t i = 8; i <= kCap; ++i) CHECK(store.find(keys[i]).has_value());
}

TEST_CASE("dropping only idle cells evicts nothing live when at most half the cap is live") {
  constexpr std::size_t kCap = 16;
  Store store({.max_keys_per_shard = kCap, .seed = 11});
  std::uint64_t counter = 0;
  auto keys = keys_in_shard(store, 3, kCap + 1, counter);
  for (std::size_t i = 0; i < kCap; ++i) {
    REQUIRE(touch(store, keys[i], 0, i < kCap / 2 ? kSecond : 3600 * kSecond));
  }
  REQUIRE(touch(store, keys[kCap], 2 * kSecond, kSecond));
  CHECK(store.stats() == sluice::StoreStats{.size = kCap / 2 + 1, .idle_reclaimed = kCap / 2});
  for (std::size_t i = kCap / 2; i < kCap; ++i) CHECK(store.find(keys[i])->touches == 1);
}

TEST_CASE("a capped limiter decides exactly like an uncapped one while only idle cells go") {
  sluice::ManualClock clock;
  std::vector<sluice::GcraWindow> windows{{.requests = 1, .period = 100ms, .burst = 2}};
  auto capped = sluice::GcraLimiter<sluice::ManualClock>::create(
      windows, {.max_keys_per_shard = 32, .seed = 5}, clock);
  auto uncapped = sluice::GcraLimiter<sluice::ManualClock>::create(
      windows, {.max_keys_per_shard = 1 << 20, .seed = 5}, clock);
  REQUIRE(capped.ok());
  REQUIRE(uncapped.ok());
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> key(0, 4999);
  std::uniform_int_distribution<int> step_us(0, 4000);  // ~100 keys live at a time
  for (int i = 0; i < 200'000; ++i) {
    const std::string k = "client-" + std::to_string(key(rng));
    auto a = capped->check(k);
    auto b = uncapped->check(k);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    REQUIRE(capped->stats().live_evicted == 0);  // the premise: only idle cells were dropped
    REQUIRE(*a == *b);
    clock.advance(std::chrono::microseconds(step_us(rng)));
  }
  // The premise: sweeps ran and reclaimed idle cells, and never had to evict a live one.
  CHECK(capped->stats().idle_reclaimed > 1000);
  CHECK(capped->stats().live_evicted == 0);
}

TEST_CASE("a key under enforcement survives a one-shot spray that last-touch order would evict") {
  constexpr std::size_t kCap = 16;
  Store store({.max_keys_per_shard = kCap, .seed = 3});
  std::uint64_t counter = 0;
  auto enforced = keys_in_shard(store, 0, 1, counter)[0];
  auto spray = keys_in_shard(store, 0, 20 * kCap, counter);

  // The enforced key is touched first (oldest last touch) and stays live for an hour; each spray
  // key is touched once and would go idle 10 s later.
  REQUIRE(touch(store, enforced, 0, 3600 * kSecond));
  // A last-touch (LRU) model of the same shard: which keys remain, oldest touch first.
  std::vector<sluice::KeyDigest> lru{enforced};
  bool lru_evicted_enforced = false;
  std::int64_t now = 0;
  for (const auto& key : spray) {
    now += 1000;
    REQUIRE(touch(store, key, now, 10 * kSecond));
    if (lru.size() == kCap) {  // full: evict the oldest touches down to cap/2
      auto evicted = lru.begin() + static_cast<std::ptrdiff_t>(kCap - kCap / 2);
      lru_evicted_enforced |= std::find(lru.begin(), evicted, enforced) != evicted;
      lru.erase(lru.begin(), evicted);
    }
    lru.push_back(key);
  }
  CHECK(lru_evicted_enforced);              // last-touch order gives the enforced key away
  CHECK(store.find(enforced).has_value());  // time-to-fresh order keeps it
  CHECK(store.find(enforced)->touches == 1);
  CHECK(store.stats().live_evicted >= 18 * kCap / 2);  // the spray did force evictions
}

TEST_CASE("sweeps amortize to a small constant of examined slots per insert") {
  Store store({.max_keys_per_shard = 64, .seed = 9});
  constexpr std::uint64_t kInserts = 200'000;
  for (std::uint64_t i = 0; i < kInserts; ++i) {
    REQUIRE(touch(store, store.digest("one-shot-" + std::to_string(i)), 0, kSecond));
  }
  const double per_insert = static_cast<double>(store.sweep_work()) / kInserts;
  CHECK(store.sweep_work() > 0);
  // A sweep examines the table (< 4/3·cap + 1 slots) and leaves cap/2 free slots: < 2.7 per insert.
  CHECK(per_insert < 3.0);
}

TEST_CASE("a full reject_new_keys shard denies new keys until its earliest cell goes idle") {
  constexpr std::size_t kCap = 8;
  Store store(
      {.max_keys_per_shard = kCap, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1});
  std::uint64_t counter = 0;
  auto keys = keys_in_shard(store, 5, kCap + 2, counter);
  for (std::size_t i = 0; i < kCap; ++i) {
    REQUIRE(touch(store, keys[i], 0, (5 + std::int64_t(i)) * kSecond));  // earliest idle at 5 s
  }

  const std::optional<std::int64_t> retry = refused(store, keys[kCap], 2 * kSecond, kSecond);
  REQUIRE(retry.has_value());
  CHECK(*retry == 3 * kSecond);
  CHECK_FALSE(touch(store, keys[kCap + 1], 2 * kSecond, kSecond));
  // Existing keys keep working; nothing live was evicted.
  for (std::size_t i = 0; i < kCap; ++i) CHECK(touch(store, keys[i], 2 * kSecond, kSecond));
  CHECK(store.stats() == sluice::StoreStats{.size = kCap, .capacity_denials = 2});

  // At 5 s the first cell is idle: the sweep reclaims it and the new key fits.
  CHECK(touch(store, keys[kCap], 5 * kSecond, kSecond));
  CHECK(store.stats() ==
        sluice::StoreStats{.size = kCap, .idle_reclaimed = 1, .capacity_denials = 2});
}

// A digest in shard `shard` (tests that drive one shard pick digests directly).
sluice::KeyDigest digest_in_shard(std::mt19937_64& rng, std::size_t shard) {
  return {rng() | 1, (rng() << 6) | shard};
}

// Inserts `keys` new keys into shard 0 of a full kRejectNewKeys store, `per_hold` of them per
// hold time: a flood at `per_hold / cap` times the expiry rate. Returns the
// cells and slots examined per new key and per admitted one.
struct FloodWork {
  double per_new_key;
  double per_admitted;
  sluice::StoreStats stats;
};
FloodWork reject_flood(std::size_t cap, std::uint64_t keys, std::uint64_t per_hold) {
  Store store({.max_keys_per_shard = cap, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1});
  constexpr std::int64_t kStep = 1000;  // ns between fill inserts
  const std::int64_t hold = static_cast<std::int64_t>(cap) * kStep;
  std::mt19937_64 rng(7);
  for (std::size_t i = 0; i < cap; ++i) {
    REQUIRE(touch(store, digest_in_shard(rng, 0), static_cast<std::int64_t>(i) * kStep, hold));
  }
  const std::uint64_t before = store.sweep_work();
  std::uint64_t admitted = 0;
  for (std::uint64_t i = 0; i < keys; ++i) {
    const std::int64_t at =
        hold + static_cast<std::int64_t>(i) * hold / static_cast<std::int64_t>(per_hold);
    admitted += touch(store, digest_in_shard(rng, 0), at, hold) ? 1 : 0;
  }
  const auto work = static_cast<double>(store.sweep_work() - before);
  return {work / static_cast<double>(keys), work / static_cast<double>(admitted), store.stats()};
}

TEST_CASE("a reject_new_keys shard admits a new key as soon as any cell is idle") {
  // The login-throttle case: cells inserted after the shard last made room go idle first.
  constexpr std::size_t kCap = 1024;
  Store store(
      {.max_keys_per_shard = kCap, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1});
  std::mt19937_64 rng(3);
  for (std::size_t i = 0; i < kCap; ++i) {  // half held an hour, half one second
    REQUIRE(touch(store, digest_in_shard(rng, 0), 0, i % 2 == 0 ? 3600 * kSecond : kSecond));
  }
  for (std::size_t i = 0; i < kCap / 2; ++i) {  // at 2 s the short half is replaced
    REQUIRE(touch(store, digest_in_shard(rng, 0), 2 * kSecond, kSecond));
  }
  std::size_t admitted = 0;
  for (std::size_t i = 0; i < kCap / 2; ++i) {  // at 4 s the replacements are idle in turn
    admitted += touch(store, digest_in_shard(rng, 0), 4 * kSecond, kSecond) ? 1 : 0;
  }
  CHECK(admitted == kCap / 2);
  CHECK(store.stats() ==
        sluice::StoreStats{.size = kCap, .idle_reclaimed = kCap, .capacity_denials = 0});
}

TEST_CASE("a reject_new_keys cell whose update brings its idle time forward is reclaimed then") {
  // A login that succeeded, or a permit given back: the cell goes idle before the time it was
  // indexed under, behind a cell that stays live longer.
  constexpr std::size_t kCap = 2;
  Store store(
      {.max_keys_per_shard = kCap, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1});
  std::uint64_t counter = 0;
  const std::vector<sluice::KeyDigest> keys = keys_in_shard(store, 0, 3, counter);
  REQUIRE(touch(store, keys[0], 0, 3600 * kSecond));  // live for an hour
  REQUIRE(touch(store, keys[1], 0, 7200 * kSecond));  // indexed as live for two hours...
  store.update_removing_idle(  // ...then cut short: idle from 2 s on, still tracked until then
      keys[1], kSecond,
      [](HoldCell& cell, std::int64_t) {
        cell.fresh_at = 2 * kSecond;
        return true;
      },
      [](sluice::StoreFull) { return false; });
  REQUIRE(tracked(store) == 2);
  CHECK(refused(store, keys[2], kSecond, kSecond) == std::optional<std::int64_t>(kSecond));
  CHECK(touch(store, keys[2], 2 * kSecond, 7200 * kSecond));  // the cut-short cell made room
  CHECK(store.stats().idle_reclaimed == 1);
  // The same through update: cut short again, and reclaimed.
  store.update(
      keys[2], 2 * kSecond,
      [](HoldCell& cell, std::int64_t) {
        cell.fresh_at = 2 * kSecond + 1;
        return true;
      },
      [](sluice::StoreFull) { return false; });
  CHECK(touch(store, keys[1], 2 * kSecond + 1, kSecond));
  CHECK(store.stats().idle_reclaimed == 2);
}

TEST_CASE("a reject_new_keys flood at the expiry rate examines at most 4 slots per insert") {
  constexpr std::size_t kCap = 16384;
  const FloodWork flood = reject_flood(kCap, 8 * kCap, kCap);
  INFO("examined per new key " << flood.per_new_key << ", per admitted " << flood.per_admitted);
  CHECK(flood.stats ==
        sluice::StoreStats{.size = kCap, .idle_reclaimed = 8 * kCap, .capacity_denials = 0});
  CHECK(flood.per_new_key <= 4.0);
}

TEST_CASE("a reject_new_keys flood at twice the expiry rate examines at most 4 slots per new key") {
  constexpr std::size_t kCap = 16384;
  const FloodWork flood = reject_flood(kCap, 16 * kCap, 2 * kCap);
  INFO("examined per new key " << flood.per_new_key << ", per admitted " << flood.per_admitted);
  // Every cell is replaced when it goes idle and every other new key is refused.
  CHECK(flood.stats ==
        sluice::StoreStats{.size = kCap, .idle_reclaimed = 8 * kCap, .capacity_denials = 8 * kCap});
  CHECK(flood.per_new_key <= 4.0);
  CHECK(flood.per_admitted <= 4.0);
}

TEST_CASE("store options outside the supported cap range are invalid") {
  CHECK(sluice::validate({.max_keys_per_shard = 2, .seed = 1}).ok());
  CHECK(sluice::validate({.max_keys_per_shard = sluice::kMaxKeysPerShard, .seed = 1}).ok());
  CHECK(sluice::validate({.max_keys_per_shard = 0, .seed = 1}) ==
        absl::InvalidArgumentError("max_keys_per_shard must be in [2, 2^32], got 0"));
  CHECK(sluice::validate({.max_keys_per_shard = std::size_t{1} << 62, .seed = 1}).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a store built directly with a cap near 2^62 clamps it and keeps inserting") {
  Store store({.max_keys_per_shard = (std::size_t{1} << 62) + 5, .seed = 1});
  std::size_t admitted = 0;
  for (int i = 0; i < 10'000; ++i) {
    admitted += touch(store, store.digest("k" + std::to_string(i)), 0, kSecond) ? 1 : 0;
  }
  CHECK(store.options().max_keys_per_shard == sluice::kMaxKeysPerShard);
  CHECK(admitted == 10'000);
  CHECK(tracked(store) == 10'000);
}

TEST_CASE("a reject_new_keys denial waits for the earliest cell, touched or inserted late") {
  constexpr std::size_t kCap = 8;
  constexpr std::int64_t kHalf = kSecond / 2;
  Store store(
      {.max_keys_per_shard = kCap, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1});
  std::mt19937_64 rng(5);
  std::vector<sluice::KeyDigest> keys;
  for (std::size_t i = 0; i < kCap + 2; ++i) keys.push_back(digest_in_shard(rng, 0));
  for (std::size_t i = 0; i < kCap; ++i) {  // idle at 5 s, 6 s, ..., 12 s
    REQUIRE(touch(store, keys[i], 0, (5 + std::int64_t(i)) * kSecond));
  }
  REQUIRE(touch(store, keys[0], kSecond, 20 * kSecond));  // now idle at 21 s
  // At 6 s the first cell indexed (5 s) is live; the second (6 s) is idle and makes room for a
  // key idle at 6.5 s, before any older cell.
  REQUIRE(touch(store, keys[kCap], 6 * kSecond, kHalf));

  const std::optional<std::int64_t> retry = refused(store, keys[kCap + 1], 6 * kSecond, kSecond);
  REQUIRE(retry.has_value());
  CHECK(*retry == kHalf);
  CHECK(touch(store, keys[kCap + 1], 6 * kSecond + kHalf, kSecond));
  CHECK(store.find(keys[0])->touches == 2);
  CHECK_FALSE(store.find(keys[1]).has_value());
  CHECK_FALSE(store.find(keys[kCap]).has_value());
  CHECK(store.stats() ==
        sluice::StoreStats{.size = kCap, .idle_reclaimed = 2, .capacity_denials = 1});
}

TEST_CASE("a reject_new_keys store refuses a new key only while no cell of its shard is idle") {
  constexpr std::size_t kCap = 16;
  Store store(
      {.max_keys_per_shard = kCap, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1});
  std::mt19937_64 rng(11);
  std::vector<sluice::KeyDigest> candidates;  // keys that may be tracked (shard 0)
  std::int64_t now = 0;
  std::uint64_t refusals = 0, while_idle = 0, wrong_retry = 0;
  for (int i = 0; i < 20'000; ++i) {
    now += static_cast<std::int64_t>(rng() % (kSecond / 4));
    const bool new_key = candidates.empty() || rng() % 2 == 0;
    if (new_key) candidates.push_back(digest_in_shard(rng, 0));
    const sluice::KeyDigest key =
        new_key ? candidates.back() : candidates[rng() % candidates.size()];
    const auto hold = static_cast<std::int64_t>(1 + rng() % (8 * kSecond));
    const std::optional<std::int64_t> retry = refused(store, key, now, hold);
    if (!retry) continue;
    ++refusals;
    std::erase_if(candidates, [&](const sluice::KeyDigest& k) { return !store.find(k); });
    std::int64_t earliest = std::numeric_limits<std::int64_t>::max();
    for (const auto& k : candidates) earliest = std::min(earliest, store.find(k)->fresh_at);
    while_idle += earliest <= now ? 1 : 0;
    wrong_retry += earliest - now != *retry ? 1 : 0;
  }
  CHECK(refusals > 1000);  // the premise: the shard was often full of live cells
  CHECK(while_idle == 0);
  CHECK(wrong_retry == 0);
}

TEST_CASE("a peek on an unknown key stores nothing") {
  Store store({.seed = 1});
  bool seen = store.update(
      store.digest("ghost"), 0, [](HoldCell&, std::int64_t) { return true; },
      [](sluice::StoreFull) { return false; });
  CHECK(seen);
  CHECK(tracked(store) == 0);
}

TEST_CASE("a shard never sees time go backwards") {
  Store store({.seed = 1});
  auto key = store.digest("k");
  std::int64_t seen = 0;
  auto at = [&](std::int64_t now) {
    store.update(
        key, now, [&](HoldCell&, std::int64_t clamped) { return seen = clamped, true; },
        [](sluice::StoreFull) { return false; });
    return seen;
  };
  CHECK(at(100) == 100);
  CHECK(at(50) == 100);
  CHECK(at(150) == 150);
}

TEST_CASE("threads hammering overlapping keys lose no update") {
  Store store({.max_keys_per_shard = 1024, .seed = 2});
  constexpr int kThreads = 4;
  constexpr int kKeys = 64;
  constexpr int kRounds = 2000;
  std::vector<sluice::KeyDigest> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(store.digest("shared-" + std::to_string(i)));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        touch(store, keys[static_cast<std::size_t>((r + t * 7) % kKeys)], 0, 3600 * kSecond);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::uint64_t total = 0;
  for (const auto& key : keys) total += store.find(key)->touches;
  CHECK(total == std::uint64_t{kThreads} * kRounds);
  CHECK(tracked(store) == kKeys);
}

TEST_CASE("eight threads on one key, more threads than cores, lose no update") {
  for (sluice::Overflow overflow : {sluice::Overflow::kEvict, sluice::Overflow::kRejectNewKeys}) {
    Store store({.max_keys_per_shard = 16, .overflow = overflow, .seed = 3});
    const sluice::KeyDigest hot = store.digest("hot");
    constexpr int kThreads = 8;
    constexpr int kRounds = 5'000;
    std::atomic<int> refused{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (int r = 0; r < kRounds; ++r) {
          if (!touch(store, hot, 0, 3600 * kSecond)) refused.fetch_add(1);
        }
      });
    }
    for (auto& thread : threads) thread.join();
    CHECK(refused.load() == 0);
    CHECK(store.find(hot)->touches == std::uint64_t{kThreads} * kRounds);
    CHECK(tracked(store) == 1);
  }
}

TEST_CASE("digests are stable for a seed and seeded XXH3-128 of the key bytes") {
  sluice::KeyHasher a(1234), b(1234);
  CHECK(a("203.0.113.7") == b("203.0.113.7"));
  XXH128_hash_t expected = XXH3_128bits_withSeed("203.0.113.7", 11, 1234);
  CHECK(a("203.0.113.7") == sluice::KeyDigest{expected.low64, expected.high64});
  CHECK(a("203.0.113.7") != a("203.0.113.8"));
}

TEST_CASE("different seeds spread keys over different shards") {
  Store one({.seed = 1});
  Store two({.seed = 2});
  int moved = 0;
  constexpr int kKeys = 10'000;
  for (int i = 0; i < kKeys; ++i) {
    std::string key = "10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256);
    moved += Store::shard_index(one.digest(key)) != Store::shard_index(two.digest(key));
  }
  // Independent placement moves 63/64 of keys; allow generous slack.
  CHECK(moved > kKeys * 9 / 10);
}

TEST_CASE("a store without an injected seed picks a random one") {
  Store one(sluice::StoreOptions{});
  Store two(sluice::StoreOptions{});
  CHECK(one.seed() != two.seed());
}

TEST_CASE("composite keys are unambiguous") {
  auto encode = [](std::initializer_list<std::string_view> parts) {
    std::string out;
    for (auto part : parts) sluice::append_key_part(out, part);
    return out;
  };
  CHECK(encode({"a|b", "c"}) != encode({"a", "b|c"}));
  CHECK(encode({"ab", ""}) != encode({"a", "b"}));
  CHECK(encode({"", "ab"}) != encode({"ab"}));
  CHECK(encode({"x"}) == std::string("\x01\x00\x00\x00x", 5));
}

namespace {

// Ends `key`'s hold at once (a reset); the store then removes it.
void forget(Store& store, const sluice::KeyDigest& key, std::int64_t now) {
  store.update_removing_idle(
      key, now,
      [](HoldCell& cell, std::int64_t) {
        cell = HoldCell{};
        return true;
      },
      [](sluice::StoreFull) { return false; });
}

}  // namespace

TEST_CASE("update_removing_idle removes a key its update left idle and keeps a live one") {
  Store store({.max_keys_per_shard = 8, .seed = 1});
  const sluice::KeyDigest a = store.digest("a");
  const sluice::KeyDigest b = store.digest("b");
  REQUIRE(touch(store, a, 0, kSecond));
  REQUIRE(touch(store, b, 0, kSecond));
  forget(store, a, 0);
  CHECK_FALSE(store.find(a).has_value());
  CHECK(store.find(b).has_value());
  CHECK(tracked(store) == 1);
  // An update that leaves the cell live keeps the key.
  const bool touched = store.update_removing_idle(
      b, 0,
      [](HoldCell& cell, std::int64_t) {
        ++cell.touches;
        return true;
      },
      [](sluice::StoreFull) { return false; });
  CHECK(touched);
  CHECK(store.find(b)->touches == 2);
  // An absent key is not stored by an update that leaves it idle.
  forget(store, store.digest("never"), 0);
  CHECK(tracked(store) == 1);
}

TEST_CASE("a removed key frees its room in a full reject_new_keys shard at once") {
  Store store({.max_keys_per_shard = 4, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 2});
  std::uint64_t counter = 0;
  const std::vector<sluice::KeyDigest> keys = keys_in_shard(store, 5, 6, counter);
  for (std::size_t i = 0; i < 4; ++i) REQUIRE(touch(store, keys[i], 0, 3600 * kSecond));
  REQUIRE_FALSE(touch(store, keys[4], 0, kSecond));
  forget(store, keys[2], 0);
  CHECK(touch(store, keys[4], 0, kSecond));
  CHECK_FALSE(touch(store, keys[5], 0, kSecond));
  CHECK(store.stats().capacity_denials == 2);
}

TEST_CASE("stale index entries of removed keys never remove a key twice or lose one") {
  constexpr std::size_t kCap = 8;
  Store store(
      {.max_keys_per_shard = kCap, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 3});
  std::uint64_t counter = 0;
  std::mt19937_64 random(11);
  std::vector<sluice::KeyDigest> live;
  std::int64_t now = 0;
  for (int round = 0; round < 20'000; ++round) {
    now += 1000;
    const std::uint64_t action = random() % 3;
    if (action == 0 && !live.empty()) {
      const std::size_t i = random() % live.size();
      forget(store, live[i], now);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      const sluice::KeyDigest key = keys_in_shard(store, 9, 1, counter)[0];
      // Holds between 1 µs and 20 µs: some keys go idle by themselves, some are removed.
      if (touch(store, key, now, 1000 * static_cast<std::int64_t>(1 + random() % 20))) {
        live.push_back(key);
      } else {
        // Refused only while every tracked key of the shard is live.
        CHECK(tracked(store) == kCap);
      }
    }
    std::erase_if(live, [&](const sluice::KeyDigest& d) {
      const std::optional<HoldCell> cell = store.find(d);
      return !cell || cell->idle(now);
    });
    REQUIRE(tracked(store) >= live.size());
    REQUIRE(tracked(store) <= kCap);
  }
  // Examined work stays amortized O(1) per operation despite stale entries.
  CHECK(store.sweep_work() <= 20'000 * 8);
}

TEST_CASE("removal markers in a kEvict shard are not counted as reclaimed idle cells") {
  Store store({.max_keys_per_shard = 4, .seed = 4});
  std::uint64_t counter = 0;
  const std::vector<sluice::KeyDigest> keys = keys_in_shard(store, 1, 6, counter);
  for (std::size_t i = 0; i < 4; ++i) REQUIRE(touch(store, keys[i], 0, 3600 * kSecond));
  forget(store, keys[0], 0);
  forget(store, keys[1], 0);
  REQUIRE(touch(store, keys[4], 0, 3600 * kSecond));
  REQUIRE(touch(store, keys[5], 0, 3600 * kSecond));
  REQUIRE(touch(store, store.digest("x"), 0, 1));  // may land elsewhere: no sweep needed there
  CHECK(store.stats().idle_reclaimed == 0);
  CHECK(store.stats().live_evicted == 0);
}

TEST_CASE("a lock set holds every shard of its keys once, in any order, inline and past eight") {
  Store a, b;
  std::vector<std::pair<Store*, sluice::KeyDigest>> keys;
  for (int i = 0; i < 14; ++i) {  // repeats of one key and of one shard, across two stores
    Store& store = i % 3 == 0 ? b : a;
    keys.emplace_back(&store, store.digest("k" + std::to_string(i % 5)));
  }
  for (std::size_t n = 1; n <= keys.size(); ++n) {
    for (bool reversed : {false, true}) {
      std::vector<std::pair<Store*, sluice::KeyDigest>> used(keys.begin(), keys.begin() + n);
      if (reversed) std::reverse(used.begin(), used.end());
      sluice::ShardLockSet set;
      for (const auto& [store, digest] : used) set.add(*store, digest);
      {
        const sluice::HeldShardLocks held(set);     // a lock taken twice would never return
        for (const auto& [store, digest] : used) {  // asserts (in debug builds) that it is held
          REQUIRE(store->update_locked(
              held, digest, 0,
              [](HoldCell& cell, std::int64_t) {
                cell.fresh_at = kSecond;
                return ++cell.touches > 0;
              },
              [](sluice::StoreFull) { return false; }));
        }
      }
      for (const auto& [store, digest] : used) {  // every lock was released
        REQUIRE(touch(*store, digest, 0, kSecond));
      }
    }
  }
}
