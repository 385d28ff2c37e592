#include "sluice/concurrency.hpp"

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "sluice/clock.hpp"
#include "sluice/http_fields.hpp"

using namespace std::chrono_literals;
using Limiter = sluice::ConcurrencyLimiter<sluice::ManualClock>;
using sluice::ConcurrencyPermit;
using sluice::Reason;

namespace {

Limiter make(sluice::ConcurrencyLimit limit, sluice::ManualClock clock,
             sluice::StoreOptions options = {.seed = 1}) {
  auto limiter = Limiter::create(limit, options, clock);
  INFO(limiter.status());
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

}  // namespace

TEST_CASE("exactly max_in_flight permits are granted and the next is denied until the lease") {
  sluice::ManualClock clock(100s);
  Limiter limiter = make({.max_in_flight = 3, .lease = 30s}, clock);
  std::vector<ConcurrencyPermit> permits;
  for (std::uint64_t i = 0; i < 3; ++i) {
    clock.advance(1s);
    permits.push_back(limiter.acquire("k"));
    REQUIRE(permits.back().held());
    CHECK(permits.back().decision() ==
          sluice::Decision{
              .reason = Reason::kAllowed, .limit = 3, .remaining = 2 - i, .reset_after = 30s});
  }
  clock.advance(1s);  // t = 104 s; leases end at 131, 132, 133 s
  ConcurrencyPermit denied = limiter.acquire("k");
  CHECK_FALSE(denied.held());
  CHECK_FALSE(static_cast<bool>(denied));
  CHECK(denied.decision() == sluice::Decision{.reason = Reason::kQuotaExceeded,
                                              .limit = 3,
                                              .remaining = 0,
                                              .retry_after = 27s,
                                              .reset_after = 29s});
  CHECK_FALSE(denied.release());  // nothing held: nothing to give back
  CHECK(limiter.acquire("other").held());
}

TEST_CASE("destroying a permit gives its slot back and the key is forgotten with its last permit") {
  sluice::ManualClock clock;
  Limiter limiter = make({.max_in_flight = 1, .lease = 10s}, clock);
  {
    ConcurrencyPermit permit = limiter.acquire("k");
    REQUIRE(permit.held());
    CHECK(limiter.stats().size == 1);
    CHECK_FALSE(limiter.acquire("k").held());
  }
  CHECK(limiter.stats().size == 0);
  CHECK(limiter.acquire("k").held());
}

TEST_CASE("release is idempotent: a second release frees nothing of a later holder") {
  sluice::ManualClock clock;
  Limiter limiter = make({.max_in_flight = 1, .lease = 10s}, clock);
  ConcurrencyPermit first = limiter.acquire("k");
  CHECK(first.release());
  CHECK_FALSE(first.held());
  ConcurrencyPermit second = limiter.acquire("k");
  REQUIRE(second.held());
  CHECK_FALSE(first.release());
  CHECK_FALSE(limiter.acquire("k").held());  // second still holds the only slot
}

TEST_CASE("a moved permit releases once, from its new owner") {
  sluice::ManualClock clock;
  Limiter limiter = make({.max_in_flight = 1, .lease = 10s}, clock);
  ConcurrencyPermit moved;
  {
    ConcurrencyPermit permit = limiter.acquire("k");
    moved = std::move(permit);
    CHECK_FALSE(
        permit.held());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  }
  CHECK_FALSE(limiter.acquire("k").held());
  ConcurrencyPermit other = std::move(moved);  // move-construct keeps the slot
  CHECK_FALSE(limiter.acquire("k").held());
  other = ConcurrencyPermit();  // move-assign over a held permit releases it
  CHECK(limiter.acquire("k").held());
}

TEST_CASE("a leaked permit stops counting exactly when its lease runs out") {
  sluice::ManualClock clock;
  Limiter limiter = make({.max_in_flight = 2, .lease = 5s}, clock);
  std::optional<ConcurrencyPermit> leaked(limiter.acquire("k"));  // not released in time
  clock.advance(1s);
  ConcurrencyPermit held = limiter.acquire("k");
  REQUIRE(held.held());
  clock.set(5s - 1ns);
  ConcurrencyPermit denied = limiter.acquire("k");
  CHECK_FALSE(denied.held());
  CHECK(denied.decision().retry_after == 1ns);
  clock.set(5s);
  ConcurrencyPermit after = limiter.acquire("k");
  CHECK(after.held());
  CHECK(after.decision().remaining == 0);
  CHECK_FALSE(leaked->release());            // the lease had run out and its slot was taken again
  CHECK_FALSE(limiter.acquire("k").held());  // ... and the new holder still has it
}

TEST_CASE("a stale permit released after its slot was reused cannot free the new holder") {
  sluice::ManualClock clock;
  Limiter limiter = make({.max_in_flight = 1, .lease = 1s}, clock);
  ConcurrencyPermit stale = limiter.acquire("k");
  clock.advance(1s);
  ConcurrencyPermit fresh = limiter.acquire("k");  // the same slot, a new serial
  REQUIRE(fresh.held());
  CHECK(fresh.serial() != stale.serial());
  CHECK_FALSE(stale.release());
  CHECK_FALSE(limiter.acquire("k").held());
  CHECK(fresh.release());
  CHECK(limiter.acquire("k").held());
}

TEST_CASE("a stale permit cannot free a slot of the key after the key was forgotten and retaken") {
  sluice::ManualClock clock;
  Limiter limiter = make({.max_in_flight = 1, .lease = 1s}, clock);
  ConcurrencyPermit stale = limiter.acquire("k");
  clock.advance(1s);
  {
    ConcurrencyPermit between = limiter.acquire("k");
    REQUIRE(between.held());
  }  // the key is removed here: its cell is fresh the next time
  CHECK(limiter.stats().size == 0);
  ConcurrencyPermit fresh = limiter.acquire("k");
  REQUIRE(fresh.held());
  CHECK_FALSE(stale.release());
  CHECK_FALSE(limiter.acquire("k").held());
}

TEST_CASE("inspect reports free slots and lease ends without taking a slot") {
  sluice::ManualClock clock(100s);
  Limiter limiter = make({.max_in_flight = 2, .lease = 30s}, clock);
  CHECK(limiter.inspect("k") ==
        sluice::Decision{.reason = Reason::kAllowed, .limit = 2, .remaining = 2});
  CHECK(limiter.stats().size == 0);  // an inspected key takes no room
  ConcurrencyPermit first = limiter.acquire("k");
  clock.advance(5s);
  const sluice::Decision one_held{
      .reason = Reason::kAllowed, .limit = 2, .remaining = 1, .reset_after = 25s};
  CHECK(limiter.inspect("k") == one_held);
  CHECK(limiter.inspect("k") == one_held);  // consumes nothing
  ConcurrencyPermit second = limiter.acquire("k");
  REQUIRE(second.held());  // the inspects took no slot
  clock.advance(5s);       // t = 110 s; leases end at 130 and 135 s
  const sluice::Decision full{.reason = Reason::kQuotaExceeded,
                              .limit = 2,
                              .remaining = 0,
                              .retry_after = 20s,
                              .reset_after = 25s};
  CHECK(limiter.inspect("k") == full);
  CHECK(limiter.acquire("k").decision() == full);  // exactly what an acquire sees
  clock.advance(20s);                              // the first lease runs out
  CHECK(
      limiter.inspect("k") ==
      sluice::Decision{.reason = Reason::kAllowed, .limit = 2, .remaining = 1, .reset_after = 5s});
}

TEST_CASE("reset frees every slot of a key, and its old permits cannot free a later holder") {
  sluice::ManualClock clock;
  Limiter limiter = make({.max_in_flight = 2, .lease = 1h}, clock);
  ConcurrencyPermit a = limiter.acquire("k");
  ConcurrencyPermit b = limiter.acquire("k");
  ConcurrencyPermit other = limiter.acquire("other");
  REQUIRE(b.held());
  REQUIRE_FALSE(limiter.acquire("k").held());
  limiter.reset("k");
  CHECK(limiter.stats().size == 1);  // only "other" keeps room
  CHECK(limiter.inspect("k").remaining == 2);
  CHECK(limiter.inspect("other").remaining == 1);  // other keys keep their permits
  ConcurrencyPermit c = limiter.acquire("k");
  ConcurrencyPermit d = limiter.acquire("k");
  REQUIRE(c.held());
  REQUIRE(d.held());
  CHECK_FALSE(a.release());  // the slot a had now carries c's serial
  CHECK_FALSE(b.release());
  CHECK_FALSE(limiter.acquire("k").held());  // c and d still hold both slots
  limiter.reset("never-seen");               // does nothing
  CHECK(limiter.stats().size == 2);
}

TEST_CASE("a clock that steps back neither ends nor extends a lease") {
  sluice::ManualClock clock(10s);
  Limiter limiter = make({.max_in_flight = 1, .lease = 5s}, clock);
  ConcurrencyPermit leaked = limiter.acquire("k");  // lease ends at 15 s
  clock.set(20s);
  ConcurrencyPermit after = limiter.acquire("k");  // lease ends at 25 s
  REQUIRE(after.held());
  clock.set(0s);  // read as 20 s: the lease taken at 20 s still runs until 25 s
  ConcurrencyPermit denied = limiter.acquire("k");
  CHECK_FALSE(denied.held());
  CHECK(denied.decision().retry_after == 5s);
  CHECK_FALSE(leaked.release());
}

TEST_CASE("a full shard denies new keys with a capacity denial and never evicts a held key") {
  sluice::ManualClock clock;
  // Two keys per shard; 64 shards: spray enough keys that some shard is full.
  Limiter limiter =
      make({.max_in_flight = 1, .lease = 10s}, clock, {.max_keys_per_shard = 2, .seed = 7});
  std::vector<ConcurrencyPermit> held;
  std::vector<std::string> held_keys;
  ConcurrencyPermit refused;
  std::string refused_key;
  for (int i = 0; i < 10'000 && refused_key.empty(); ++i) {
    clock.advance(1ms);
    std::string key = absl::StrCat("key-", i);
    ConcurrencyPermit p = limiter.acquire(key);
    if (p.held()) {
      held.push_back(std::move(p));
      held_keys.push_back(std::move(key));
    } else {
      refused = std::move(p);
      refused_key = std::move(key);
    }
  }
  REQUIRE_FALSE(refused_key.empty());
  CHECK(refused.decision().reason == Reason::kStoreFull);
  CHECK(refused.decision().limit == 1);
  CHECK(refused.decision().retry_after > 0ns);
  CHECK(refused.decision().retry_after <= 10s);
  CHECK(limiter.stats().capacity_denials == 1);
  CHECK(limiter.stats().live_evicted == 0);
  // Every held key is still enforced.
  for (const std::string& key : held_keys) CHECK_FALSE(limiter.acquire(key).held());
  // Giving back every permit frees the room at once, without waiting for a lease.
  held.clear();
  CHECK(limiter.stats().size == 0);
  CHECK(limiter.acquire(refused_key).held());
}

TEST_CASE("a full shard reclaims a key whose leases ran out for a new key") {
  sluice::ManualClock clock;
  Limiter limiter =
      make({.max_in_flight = 1, .lease = 10s}, clock, {.max_keys_per_shard = 2, .seed = 7});
  std::vector<ConcurrencyPermit> leaked;
  std::string refused_key;
  for (int i = 0; i < 10'000 && refused_key.empty(); ++i) {
    std::string key = absl::StrCat("key-", i);
    ConcurrencyPermit p = limiter.acquire(key);
    if (p.held()) {
      leaked.push_back(std::move(p));
    } else {
      refused_key = std::move(key);
      CHECK(p.decision().retry_after == 10s);
    }
  }
  REQUIRE_FALSE(refused_key.empty());
  clock.advance(10s - 1ns);
  CHECK(limiter.acquire(refused_key).decision().reason == Reason::kStoreFull);
  clock.advance(1ns);
  CHECK(limiter.acquire(refused_key).held());
}

TEST_CASE("a key sprayer that gives permits back cannot fill a shard's room with stale entries") {
  sluice::ManualClock clock;
  Limiter limiter =
      make({.max_in_flight = 1, .lease = 10s}, clock, {.max_keys_per_shard = 4, .seed = 3});
  for (int i = 0; i < 200'000; ++i) {
    ConcurrencyPermit p = limiter.acquire(absl::StrCat("spray-", i));
    REQUIRE(p.held());
  }
  CHECK(limiter.stats().size == 0);
  CHECK(limiter.stats().capacity_denials == 0);
  // Tables stay within 2·cap slots per shard (a slot: 16-byte digest + 4 slots of 16 bytes).
  CHECK(limiter.memory_bytes() <= sluice::kStoreShards * 8 * (16 + 4 * 16));
}

TEST_CASE("create rejects a limit it cannot enforce, naming the value") {
  sluice::ManualClock clock;
  auto zero = Limiter::create({.max_in_flight = 0, .lease = 1s}, {}, clock);
  CHECK(zero.status().message() == "max_in_flight must be in [1, 64], got 0");
  auto many = Limiter::create({.max_in_flight = 65, .lease = 1s}, {}, clock);
  CHECK(many.status().message() == "max_in_flight must be in [1, 64], got 65");
  auto no_lease = Limiter::create({.max_in_flight = 1, .lease = 0s}, {}, clock);
  CHECK(no_lease.status().message() == "lease must be in [1ns, 2^60 ns], got 0ns");
  auto huge =
      Limiter::create({.max_in_flight = 1, .lease = std::chrono::nanoseconds::max()}, {}, clock);
  CHECK_FALSE(huge.ok());
  auto store = Limiter::create({.max_in_flight = 1, .lease = 1s},
                               {.max_keys_per_shard = 1, .seed = 1}, clock);
  CHECK_FALSE(store.ok());
}

TEST_CASE("the largest lease at the latest clock reading does not overflow") {
  sluice::ManualClock clock(std::chrono::nanoseconds::max());
  Limiter limiter = make({.max_in_flight = 1, .lease = std::chrono::nanoseconds(1LL << 60)}, clock);
  ConcurrencyPermit p = limiter.acquire("k");
  REQUIRE(p.held());
  CHECK(p.decision().reset_after == std::chrono::nanoseconds(1LL << 60));
  ConcurrencyPermit denied = limiter.acquire("k");
  CHECK(denied.decision().retry_after == std::chrono::nanoseconds(1LL << 60));
}

TEST_CASE("each size class holds exactly max_in_flight permits") {
  for (std::uint64_t n : {1u, 4u, 5u, 16u, 17u, 64u}) {
    sluice::ManualClock clock;
    Limiter limiter = make({.max_in_flight = n, .lease = 1s}, clock);
    std::vector<ConcurrencyPermit> permits;
    for (std::uint64_t i = 0; i < n; ++i) {
      permits.push_back(limiter.acquire("k"));
      REQUIRE(permits.back().held());
    }
    CHECK_FALSE(limiter.acquire("k").held());
  }
}

TEST_CASE("concurrency fields use the concurrent-requests quota unit") {
  CHECK(sluice::concurrency_policy_field("upstream", 8) ==
        sluice::HttpField{"RateLimit-Policy", "\"upstream\";q=8;qu=\"concurrent-requests\""});
  sluice::Decision allowed{.reason = Reason::kAllowed, .limit = 8, .remaining = 5};
  CHECK(sluice::concurrency_field("upstream", allowed) ==
        sluice::HttpField{"RateLimit", "\"upstream\";r=5"});
  sluice::Decision denied{.reason = Reason::kQuotaExceeded, .limit = 8, .retry_after = 1500ms};
  CHECK(sluice::concurrency_field("upstream", denied) ==
        sluice::HttpField{"RateLimit", "\"upstream\";r=0;t=2"});
  // A policy name an attacker chose cannot break out of the string.
  CHECK(sluice::concurrency_policy_value("a\";q=1", 8) ==
        "\"a\\\";q=1\";q=8;qu=\"concurrent-requests\"");
}

TEST_CASE("eight threads never hold more than max_in_flight permits of one key at once") {
  sluice::ManualClock clock;  // frozen: no lease runs out during the test
  constexpr std::uint64_t kMax = 3;
  Limiter limiter = make({.max_in_flight = kMax, .lease = 1h}, clock);
  std::atomic<std::uint64_t> in_flight{0};
  std::atomic<std::uint64_t> most{0};
  std::atomic<std::uint64_t> granted{0};
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20'000; ++i) {
        ConcurrencyPermit p = limiter.acquire("shared");
        if (!p) continue;
        const std::uint64_t now_in = in_flight.fetch_add(1) + 1;
        if (now_in > kMax) over = true;
        std::uint64_t seen = most.load();
        while (seen < now_in && !most.compare_exchange_weak(seen, now_in)) {
        }
        granted.fetch_add(1);
        in_flight.fetch_sub(1);  // still inside the permit's lifetime
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK_FALSE(over.load());
  CHECK(most.load() <= kMax);
  CHECK(granted.load() > 0);
  CHECK(limiter.stats().size == 0);  // every permit was given back
}

TEST_CASE("keys whose permits come and go keep the tables at their smallest size") {
  sluice::ManualClock clock;
  Limiter limiter = make({.max_in_flight = 1, .lease = 10s}, clock);
  for (int i = 0; i < 100'000; ++i) {
    ConcurrencyPermit p = limiter.acquire(absl::StrCat("churn-", i));
    REQUIRE(p.held());
  }
  // 8 slots per shard (the initial size), each a 16-byte digest and 4 slots of 16 bytes.
  CHECK(limiter.memory_bytes() == sluice::kStoreShards * 8 * (16 + 4 * 16));
}
