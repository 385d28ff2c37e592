// reset(key) and inspect(key) on the in-memory limiters (GcraLimiter, FixedWindowLimiter).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"
#include "sluice/clock.hpp"
#include "sluice/fixed_window.hpp"
#include "sluice/gcra.hpp"

using namespace std::chrono_literals;
using Gcra = sluice::GcraLimiter<sluice::ManualClock>;
using Fixed = sluice::FixedWindowLimiter<sluice::ManualClock>;
using sluice::Decision;
using sluice::Reason;

namespace {

Gcra make_gcra(sluice::ManualClock clock, sluice::StoreOptions options = {.seed = 1}) {
  auto limiter = Gcra::create({{.requests = 3, .period = 1s}, {.requests = 10, .period = 60s}},
                              options, clock);
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}
Fixed make_fixed(sluice::ManualClock clock) {
  auto limiter =
      Fixed::create({{.limit = 3, .window = 1s}, {.limit = 10, .window = 60s}}, {.seed = 1}, clock);
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}
template <class L>
Decision check(L& limiter, std::string_view key, std::uint64_t cost = 1) {
  auto d = limiter.check(key, cost);
  REQUIRE(d.ok());
  return *d;
}

}  // namespace

TEST_CASE("reset unblocks a spent GCRA key exactly as a key never seen") {
  sluice::ManualClock clock(50s);
  Gcra limiter = make_gcra(clock);
  for (int i = 0; i < 3; ++i) REQUIRE(check(limiter, "k").allowed());
  REQUIRE(check(limiter, "k").reason == Reason::kQuotaExceeded);
  limiter.reset("k");
  CHECK(limiter.stats().size == 0);  // its room is free at once
  // The same sequence as a fresh key, decision for decision, including the next denial.
  for (int i = 0; i < 4; ++i) CHECK(check(limiter, "k") == check(limiter, "fresh"));
}

TEST_CASE("reset of one key leaves every other key's state alone") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra(clock);
  for (int i = 0; i < 3; ++i) REQUIRE(check(limiter, "other").allowed());
  limiter.reset("k");  // never seen: nothing to do
  limiter.reset("k");
  CHECK(check(limiter, "other").reason == Reason::kQuotaExceeded);
}

TEST_CASE("GCRA inspect equals the next peek and consumes nothing") {
  sluice::ManualClock clock(7s);
  Gcra inspected = make_gcra(clock);
  Gcra twin = make_gcra(clock);
  std::mt19937_64 random(5);
  for (int step = 0; step < 5000; ++step) {
    clock.advance(std::chrono::milliseconds(random() % 400));
    const Decision seen = inspected.inspect("k");
    CHECK(seen == check(inspected, "k", 0));
    CHECK(seen == check(twin, "k", 0));
    CHECK(seen.allowed());
    const std::uint64_t cost = 1 + random() % 3;
    // A request of `cost` passes iff it fits what inspect reported for the binding window
    // (every other window has at least as much left).
    const Decision d = check(inspected, "k", cost);
    CHECK(d == check(twin, "k", cost));
    CHECK(d.allowed() == (cost <= seen.remaining));
  }
}

TEST_CASE("GCRA inspect of a spent key reports nothing left and when it is full again") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra(clock);
  for (int i = 0; i < 3; ++i) REQUIRE(check(limiter, "k").allowed());
  CHECK(limiter.inspect("k") == Decision{.reason = Reason::kAllowed,
                                         .limit = 3,
                                         .remaining = 0,
                                         .reset_after = 1s,
                                         .binding_window = 0});
  CHECK(limiter.inspect("unknown") == Decision{.reason = Reason::kAllowed,
                                               .limit = 3,
                                               .remaining = 3,
                                               .reset_after = 0s,
                                               .binding_window = 0});
  CHECK(limiter.stats().size == 1);  // inspecting stored nothing
}

TEST_CASE("GCRA inspect of a new key at a full reject_new_keys shard is not a capacity denial") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra(
      clock, {.max_keys_per_shard = 2, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1});
  int i = 0;
  while (check(limiter, std::to_string(i)).reason != Reason::kStoreFull) ++i;
  CHECK(limiter.inspect(std::to_string(i)).remaining == 3);
  CHECK(limiter.stats().capacity_denials == 1);
}

TEST_CASE("reset unblocks a spent fixed-window key exactly as a key never seen") {
  sluice::ManualClock clock(3s);
  Fixed limiter = make_fixed(clock);
  for (int i = 0; i < 3; ++i) REQUIRE(check(limiter, "k").allowed());
  REQUIRE(check(limiter, "k").reason == Reason::kQuotaExceeded);
  clock.advance(400ms);
  limiter.reset("k");
  CHECK(limiter.stats().size == 0);
  for (int i = 0; i < 4; ++i) CHECK(check(limiter, "k") == check(limiter, "fresh"));
}

TEST_CASE("fixed-window inspect equals the next peek and consumes nothing") {
  sluice::ManualClock clock(1s);
  Fixed inspected = make_fixed(clock);
  Fixed twin = make_fixed(clock);
  std::mt19937_64 random(6);
  for (int step = 0; step < 5000; ++step) {
    clock.advance(std::chrono::milliseconds(random() % 400));
    const Decision seen = inspected.inspect("k");
    CHECK(seen == check(inspected, "k", 0));
    CHECK(seen == check(twin, "k", 0));
    const std::uint64_t cost = 1 + random() % 3;
    const Decision d = check(inspected, "k", cost);
    CHECK(d == check(twin, "k", cost));
    CHECK(d.allowed() == (cost <= seen.remaining));
  }
  CHECK(inspected.inspect("unknown").remaining == 3);
}
