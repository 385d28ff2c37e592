#include "sluice/direct_gcra.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "catch.hpp"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/gcra.hpp"

using namespace std::chrono_literals;
using Direct = sluice::DirectGcraLimiter<sluice::ManualClock>;
using Keyed = sluice::GcraLimiter<sluice::ManualClock>;
using sluice::Decision;
using sluice::Reason;

namespace {

Direct make(std::vector<sluice::GcraWindow> windows, const sluice::ManualClock& clock) {
  absl::StatusOr<Direct> limiter = Direct::create(std::move(windows), clock);
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

Decision check(Direct& limiter, std::uint64_t cost = 1) {
  absl::StatusOr<Decision> d = limiter.check(cost);
  REQUIRE(d.ok());
  return *d;
}

std::string create_error(std::vector<sluice::GcraWindow> windows) {
  absl::StatusOr<Direct> limiter = Direct::create(std::move(windows), sluice::ManualClock());
  REQUIRE_FALSE(limiter.ok());
  CHECK(limiter.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(limiter.status().message());
}

constexpr std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

// Runs `steps` random checks against a DirectGcraLimiter and a GcraLimiter (one key) with the
// same windows, driving one shared ManualClock forwards and sometimes backwards, and requires
// identical results: every Decision field, or the same error.
void require_parity(const std::vector<sluice::GcraWindow>& windows, std::uint64_t seed,
                    std::chrono::nanoseconds start, std::chrono::nanoseconds max_step, int steps) {
  sluice::ManualClock clock(start);
  Direct direct = make(windows, clock);
  absl::StatusOr<Keyed> keyed = Keyed::create(windows, {.seed = 1}, clock);
  REQUIRE(keyed.ok());
  std::uint64_t max_burst = 0;
  for (const sluice::GcraWindow& w : direct.windows()) max_burst = std::max(max_burst, w.burst);
  std::mt19937_64 random(seed);
  for (int i = 0; i < steps; ++i) {
    const std::uint64_t move = random() % 8;
    const auto by = std::chrono::nanoseconds(
        static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(max_step.count() + 1)));
    if (move == 0) clock.advance(-by);  // backwards: both must clamp
    if (move >= 4) clock.advance(by);
    // Mostly cost 1; sometimes a peek, a larger cost, or one above the smallest burst.
    const std::uint64_t pick = random() % 10;
    const std::uint64_t cost =
        pick < 6 ? 1 : (pick == 6 ? 0 : random() % (std::min<std::uint64_t>(max_burst, 50) + 2));
    const absl::StatusOr<Decision> expected = keyed->check("k", cost);
    // check_one, the cost-1 check without a StatusOr, on every other cost-1 step.
    const absl::StatusOr<Decision> actual =
        cost == 1 && i % 2 == 0 ? absl::StatusOr<Decision>(direct.check_one()) : direct.check(cost);
    INFO("seed " << seed << " step " << i << " at " << clock.now().count() << "ns cost " << cost);
    REQUIRE(actual.status() == expected.status());
    if (expected.ok()) REQUIRE(*actual == *expected);
  }
}

}  // namespace

TEST_CASE("direct: three per second admits at exactly ceil(k/3 s) with no drift") {
  sluice::ManualClock clock;
  Direct limiter = make({{.requests = 3, .period = 1s}}, clock);
  for (int i = 0; i < 3; ++i) REQUIRE(check(limiter).allowed());
  for (std::uint64_t k = 1; k <= 100'000; ++k) {
    const Decision denied = check(limiter);
    REQUIRE(denied.reason == Reason::kQuotaExceeded);
    const auto due = static_cast<std::int64_t>(ceil_div(k * 1'000'000'000, 3));
    REQUIRE(clock.now().count() + denied.retry_after.count() == due);
    clock.set(std::chrono::nanoseconds(due - 1));
    REQUIRE_FALSE(check(limiter).allowed());
    clock.set(std::chrono::nanoseconds(due));
    REQUIRE(check(limiter).allowed());
  }
  CHECK(clock.now() == std::chrono::nanoseconds(33'333'333'333'334));
}

TEST_CASE("direct: one per hour admits one and then asks for the hour") {
  sluice::ManualClock clock(5s);
  Direct limiter = make({{.requests = 1, .period = 1h}}, clock);
  CHECK(check(limiter) ==
        Decision{.reason = Reason::kAllowed, .limit = 1, .remaining = 0, .reset_after = 1h});
  clock.advance(59min);
  CHECK(check(limiter) == Decision{.reason = Reason::kQuotaExceeded,
                                   .limit = 1,
                                   .remaining = 0,
                                   .retry_after = 1min,
                                   .reset_after = 1min});
  clock.advance(1min);
  CHECK(check(limiter).allowed());
}

TEST_CASE("direct: a peek reports availability and changes nothing") {
  sluice::ManualClock clock;
  Direct limiter = make({{.requests = 5, .period = 1s}}, clock);
  CHECK(check(limiter, 0) == Decision{.reason = Reason::kAllowed, .limit = 5, .remaining = 5});
  check(limiter, 2);
  const Decision peek = check(limiter, 0);
  CHECK(peek ==
        Decision{.reason = Reason::kAllowed, .limit = 5, .remaining = 3, .reset_after = 400ms});
  CHECK(check(limiter, 0) == peek);
  CHECK(check(limiter, 3).remaining == 0);
  CHECK(check(limiter, 0) ==
        Decision{.reason = Reason::kAllowed, .limit = 5, .remaining = 0, .reset_after = 1s});
}

TEST_CASE("direct: a cost above a window's burst is an error and changes nothing") {
  sluice::ManualClock clock;
  Direct limiter =
      make({{.requests = 10, .period = 1s}, {.requests = 100, .period = 1min, .burst = 4}}, clock);
  check(limiter, 1);
  const absl::StatusOr<Decision> result = limiter.check(5);
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(result.status().message() ==
        "cost 5 exceeds the burst 4 of window 1 and can never be admitted");
  // The largest cost a caller can send names the first window it exceeds and overflows nothing.
  CHECK(limiter.check(std::numeric_limits<std::uint64_t>::max()).status().message() ==
        "cost 18446744073709551615 exceeds the burst 10 of window 0 and can never be admitted");
  CHECK(check(limiter, 0).remaining == 3);
  CHECK(check(limiter, 3).allowed());  // exactly the burst that is left passes
}

TEST_CASE("direct: a clock that goes backwards replenishes nothing") {
  sluice::ManualClock clock(10s);
  Direct limiter = make({{.requests = 1, .period = 1s}}, clock);
  check(limiter);
  clock.set(5s);
  const Decision denied = check(limiter);
  CHECK(denied.reason == Reason::kQuotaExceeded);
  CHECK(denied.retry_after == 1s);  // measured from 10 s, the latest time seen
  clock.set(11s);
  CHECK(check(limiter).allowed());
}

TEST_CASE("direct: a clock set before the epoch works like any other reading") {
  sluice::ManualClock clock(1h);
  Direct limiter = make({{.requests = 2, .period = 1s}}, clock);
  clock.set(-1h);
  CHECK(check(limiter).remaining == 1);
  CHECK(check(limiter).remaining == 0);
  CHECK(check(limiter).retry_after == 500ms);
  clock.set(-1h + 500ms);
  CHECK(check(limiter).allowed());
}

TEST_CASE("direct: clock values near 2^62 ns work and readings beyond it saturate") {
  const std::int64_t near = (std::int64_t{1} << 62) - 10'000'000'000;
  sluice::ManualClock clock{std::chrono::nanoseconds(near)};
  Direct limiter = make({{.requests = 2, .period = 10s}}, clock);
  CHECK(check(limiter).remaining == 1);
  CHECK(check(limiter).remaining == 0);
  CHECK(check(limiter).retry_after == 5s);
  clock.advance(5s);
  CHECK(check(limiter).allowed());
  clock.set(std::chrono::nanoseconds(std::numeric_limits<std::int64_t>::max()));
  CHECK(check(limiter).allowed());  // saturated to 2^62: admitted, nothing overflows
  CHECK(check(limiter).retry_after == 5s);
}

TEST_CASE("direct: create rejects bad windows naming the bad value, as GcraLimiter does") {
  CHECK(create_error({}) == "windows must not be empty");
  CHECK(create_error({{.requests = 0, .period = 1s}}) ==
        "windows[0].requests must be in [1, 2^32], got 0");
  CHECK(create_error({{.requests = 1, .period = 1s}, {.requests = 1, .period = 0s}}) ==
        "windows[1].period must be > 0, got 0ns");
  CHECK(create_error({{.requests = 1, .period = 1s, .burst = (std::uint64_t{1} << 32) + 1}}) ==
        "windows[0].burst must be in [1, 2^32], got 4294967297");
  CHECK(
      create_error({{.requests = 1, .period = std::chrono::hours(24 * 400), .burst = 1u << 30}}) ==
      "windows[0].burst × period / requests must be at most 2^60 ns");
  CHECK(create_error({{1, 1s}, {1, 2s}, {1, 3s}, {1, 4s}, {1, 5s}}) ==
        "at most 4 windows are supported, got 5");
}

TEST_CASE("direct: a window whose TAT one word cannot hold for 9 years is rejected") {
  // 1001 per second: the interval is 999000.999… ns, TATs in 1/1001 ns.
  CHECK(create_error({{.requests = 10, .period = 1s}, {.requests = 1001, .period = 1s}}) ==
        "windows[1]: period / requests needs 1/1001 ns precision, which one 64-bit word holds "
        "for less than 2^58 ns (9 years) of clock; use GcraLimiter, or a period that requests "
        "divides");
  // A count that divides its period fits, and so do small fractions (1/7 and 1/31 ns).
  CHECK(Direct::create({{.requests = 1001, .period = 1001ms}}, sluice::ManualClock()).ok());
  CHECK(Direct::create({{.requests = 7, .period = 1s}, {.requests = 31, .period = 1min}},
                       sluice::ManualClock())
            .ok());
}

TEST_CASE("direct: windows are sorted shortest first with bursts defaulted") {
  sluice::ManualClock clock;
  Direct limiter =
      make({{.requests = 600, .period = 1min}, {.requests = 10, .period = 1s, .burst = 20}}, clock);
  CHECK(limiter.windows() ==
        std::vector<sluice::GcraWindow>{{.requests = 10, .period = 1s, .burst = 20},
                                        {.requests = 600, .period = 1min, .burst = 600}});
}

TEST_CASE("direct: a request denied by the longer window leaves the shorter window untouched") {
  sluice::ManualClock clock;
  Direct limiter =
      make({{.requests = 1, .period = 1s, .burst = 2}, {.requests = 20, .period = 2s, .burst = 1}},
           clock);
  CHECK(check(limiter).allowed());
  CHECK(check(limiter) == Decision{.reason = Reason::kQuotaExceeded,
                                   .limit = 1,
                                   .remaining = 0,
                                   .retry_after = 100ms,
                                   .reset_after = 100ms,
                                   .binding_window = 1});
  clock.advance(100ms);
  const Decision next = check(limiter);  // denied had it consumed from the 1 s window
  CHECK(next == Decision{.reason = Reason::kAllowed,
                         .limit = 2,
                         .remaining = 0,
                         .reset_after = 1900ms,
                         .binding_window = 0});
}

TEST_CASE("direct: when two windows deny the shorter binds and retry_after is the longer wait") {
  sluice::ManualClock clock;
  Direct limiter =
      make({{.requests = 1, .period = 1s, .burst = 2}, {.requests = 20, .period = 2s, .burst = 1}},
           clock);
  check(limiter);
  clock.advance(100ms);
  check(limiter);
  const Decision denied = check(limiter);
  CHECK(denied.reason == Reason::kQuotaExceeded);
  CHECK(denied.binding_window == 0);
  CHECK(denied.limit == 2);
  CHECK(denied.retry_after == 900ms);
  clock.advance(900ms - 1ns);
  CHECK_FALSE(check(limiter).allowed());
  clock.advance(1ns);
  CHECK(check(limiter).allowed());
}

TEST_CASE("direct: an admission binds the window with the least remaining") {
  sluice::ManualClock clock;
  Direct limiter = make({{.requests = 10, .period = 1s}, {.requests = 12, .period = 1min}}, clock);
  CHECK(check(limiter).remaining == 9);
  for (int i = 0; i < 9; ++i) check(limiter);
  clock.advance(1s);
  const Decision later = check(limiter);  // 1 s window: 9 left; 1 min window: 1 left
  CHECK(later.binding_window == 1);
  CHECK(later.limit == 12);
  CHECK(later.remaining == 1);
}

TEST_CASE(
    "direct: every decision, of check and check_one, equals GcraLimiter's for one key, one "
    "window") {
  require_parity({{.requests = 3, .period = 1s}}, 1, 0s, 700ms, 20'000);
  require_parity({{.requests = 1, .period = 1s, .burst = 5}}, 2, 0s, 1500ms, 20'000);
  require_parity({{.requests = 10, .period = 1s}}, 3, 1h, 150ms, 20'000);
  require_parity({{.requests = 1'000'000'000, .period = 1s}}, 4, 0s, 100ns, 20'000);
  require_parity({{.requests = 7, .period = 3s, .burst = 2}}, 5, -1h, 2s, 20'000);
  // Readings that pass 2^62 ns saturate in both.
  require_parity({{.requests = 2, .period = 1s}}, 9,
                 std::chrono::nanoseconds((std::int64_t{1} << 62) - 60'000'000'000), 1s, 20'000);
}

TEST_CASE(
    "direct: every decision, of check and check_one, equals GcraLimiter's for one key, stacked "
    "windows") {
  require_parity(
      {{.requests = 1, .period = 1s, .burst = 2}, {.requests = 20, .period = 2s, .burst = 1}}, 6,
      0s, 300ms, 20'000);
  require_parity({{.requests = 600, .period = 1min},
                  {.requests = 10, .period = 1s, .burst = 20},
                  {.requests = 3000, .period = 1h}},
                 7, 0s, 200ms, 20'000);
  require_parity({{.requests = 3, .period = 1s},
                  {.requests = 7, .period = 3s},
                  {.requests = 9, .period = 5s, .burst = 4},
                  {.requests = 30, .period = 1min}},
                 8, 5s, 900ms, 20'000);
}

TEST_CASE("direct: eight threads with a frozen clock admit exactly the burst") {
  for (std::size_t windows : {1, 3}) {
    sluice::ManualClock clock;
    std::vector<sluice::GcraWindow> limit = {{.requests = 1000, .period = 1h}};
    if (windows == 3) {
      limit = {{.requests = 10, .period = 1s, .burst = 1000},
               {.requests = 2000, .period = 1min},
               {.requests = 5000, .period = 1h}};
    }
    Direct limiter = make(limit, clock);
    std::atomic<int> admitted{0};
    std::vector<std::thread> threads;
    threads.reserve(8);
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 500; ++i) {
          if (i % 3 == 0) {  // the cost-1 check without a StatusOr
            if (limiter.check_one().allowed()) admitted.fetch_add(1);
            continue;
          }
          const absl::StatusOr<Decision> d = limiter.check(i % 5 == 4 ? 0 : 1);
          if (d.ok() && d->allowed() && i % 5 != 4) admitted.fetch_add(1);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    INFO(windows << " windows");
    CHECK(admitted.load() == 1000);
    CHECK(check(limiter, 0).remaining == 0);
  }
}

TEST_CASE("direct: threads racing a moving clock admit no more than the rate allows") {
  // 100 per 10 ms with a burst of 100: over a span S the limiter may admit at most 100 + S/100 µs.
  sluice::ManualClock clock;
  Direct limiter =
      make({{.requests = 100, .period = 10ms}, {.requests = 1000, .period = 1s}}, clock);
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  threads.reserve(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        if (t == 0 && i % 4 == 0) clock.advance(10us);
        const absl::StatusOr<Decision> d = limiter.check();
        if (d.ok() && d->allowed()) admitted.fetch_add(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::int64_t span = clock.now().count();  // 500 advances of 10 µs: 5 ms
  CHECK(span == 5'000'000);
  CHECK(admitted.load() >= 100);                   // the burst at least
  CHECK(admitted.load() <= 100 + span / 100'000);  // and then one per 100 µs at most
}

TEST_CASE("direct: reservations booked from before the epoch never wrap a check into admitting",
          "[attack]") {
  sluice::ManualClock clock;  // the epoch is 0
  Direct limiter =
      make({{.requests = 1, .period = std::chrono::nanoseconds(std::int64_t{1} << 55)}}, clock);
  clock.set(std::chrono::nanoseconds(-(std::int64_t{1} << 62)));
  int booked = 0;
  while (limiter.reserve().ok() && booked < 1000) ++booked;
  REQUIRE(booked > 0);
  // Every reservation is still ahead: the word is deep in debt, so nothing may pass.
  const Decision peek = check(limiter, 0);
  CHECK(peek.reason == Reason::kQuotaExceeded);
  CHECK(peek.retry_after > std::chrono::nanoseconds(0));
  CHECK_FALSE(check(limiter).allowed());
}
