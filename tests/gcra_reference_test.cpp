// Reference scenarios: the public behaviour of governor (Rust), redis-cell (CL.THROTTLE) and
// go-redis/redis_rate (Go), translated to sluice's parameters and asserted exactly (S5: "must
// agree with the public behaviour of governor, redis-cell and redis_rate on the same inputs").
// Each scenario names the repository, file and test (or README example) it comes from.
//
// Translation rules, stated once:
// - governor `Quota::per_X(n)` is {requests = n, period = X, burst = n};
//   `.allow_burst(b)` sets burst = b; `Quota::with_period(p)` is {1, p, 1}. governor's
//   `check_n(n)` is cost n; its `InsufficientCapacity` (n > burst) is our InvalidArgument.
//   `NotUntil::wait_time_from(now)` is our retry_after; `remaining_burst_capacity()` is our
//   remaining for an allowed decision (governor reports nothing for a denial).
//   governor truncates the emission interval to whole nanoseconds; S5 keeps it exact (see the
//   per_second(3) scenario).
// - redis-cell `CL.THROTTLE key max_burst count period [quantity]` is {count, period,
//   burst = max_burst + 1}; its reported limit (max_burst + 1) is our limit. Its retry_after is
//   -1 when allowed (ours 0) and the module reports whole seconds rounded up (we assert ns).
//   A quantity above the limit is "limited, remaining = limit, retry -1" there and
//   InvalidArgument (state untouched) here. It reports remaining after a denial as we do.
// - redis_rate `Limit{Rate, Period, Burst}` is {Rate, Period, Burst}; `PerSecond(n)` is
//   {n, 1s, n}. `AllowN(n)` is cost n, `AllowN(0)` is our peek (cost 0; its `Allowed` is 0
//   there, our reason is kAllowed). RetryAfter is -1 when allowed (ours 0). Its tests run
//   against a live Redis and its TIME, so they assert with InDelta tolerances (e.g. ResetAfter
//   999ms ± 10ms): under a frozen ManualClock the exact values are the centres those tolerances
//   allow for (1s here). It has no Reset that we mirror; a fresh key stands in for `Reset`.
//   Its Lua rounds remaining to nearest (floor(x + 0.5)); S5 floors. Every step below is at a
//   whole multiple of the emission interval where the two agree.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "catch.hpp"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/fixed_window.hpp"
#include "sluice/gcra.hpp"

using namespace std::chrono_literals;

namespace {

using sluice::Decision;
using sluice::Reason;
using Ns = std::chrono::nanoseconds;
using Gcra = sluice::GcraLimiter<sluice::ManualClock>;
using FixedWindows = sluice::FixedWindowLimiter<sluice::ManualClock>;

Decision allow(std::uint64_t limit, std::uint64_t remaining, Ns reset_after,
               std::size_t binding_window = 0) {
  return Decision{.reason = Reason::kAllowed,
                  .limit = limit,
                  .remaining = remaining,
                  .retry_after = 0ns,
                  .reset_after = reset_after,
                  .binding_window = binding_window};
}

Decision deny(std::uint64_t limit, std::uint64_t remaining, Ns retry_after, Ns reset_after,
              std::size_t binding_window = 0) {
  return Decision{.reason = Reason::kQuotaExceeded,
                  .limit = limit,
                  .remaining = remaining,
                  .retry_after = retry_after,
                  .reset_after = reset_after,
                  .binding_window = binding_window};
}

// One check: at clock time `at`, `cost` units; `expected` empty means InvalidArgument.
struct Step {
  Ns at;
  std::uint64_t cost;
  std::optional<Decision> expected;
};

const std::optional<Decision> kInvalidCost = std::nullopt;

template <class Limiter>
void run(Limiter& limiter, sluice::ManualClock& clock, std::string_view key,
         const std::vector<Step>& steps) {
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    clock.set(step.at);
    const absl::StatusOr<Decision> d = limiter.check(key, step.cost);
    INFO("step " << i << ": at " << step.at.count() << "ns cost " << step.cost);
    if (!step.expected) {
      CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
      continue;
    }
    REQUIRE(d.ok());
    CHECK(*d == *step.expected);
  }
}

Gcra make_gcra(std::vector<sluice::GcraWindow> windows, const sluice::ManualClock& clock) {
  absl::StatusOr<Gcra> limiter = Gcra::create(std::move(windows), {}, clock);
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

FixedWindows make_fixed(std::vector<sluice::FixedWindow> windows,
                        const sluice::ManualClock& clock) {
  absl::StatusOr<FixedWindows> limiter = FixedWindows::create(std::move(windows), {}, clock);
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// redis-cell
// ---------------------------------------------------------------------------------------------

// brandur/redis-cell README.md, "Response": `CL.THROTTLE user123 15 30 60 1` answers
// [0, 16, 15, -1, 2]: allowed, limit 16 (max_burst + 1), remaining 15, retry -1, reset 2 s.
// Continued with the same algorithm (src/cell/mod.rs `rate_limit`): the 16th request at the same
// instant empties the bucket and the 17th waits one emission interval (2 s).
TEST_CASE("redis-cell README CL.THROTTLE user123 15 30 60 1 answers limit 16 and remaining 15") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 30, .period = 60s, .burst = 16}}, clock);
  std::vector<Step> steps{{0s, 1, allow(16, 15, 2s)}};
  for (std::int64_t k = 2; k <= 16; ++k) {
    steps.push_back({0s, 1, allow(16, static_cast<std::uint64_t>(16 - k), k * 2s)});
  }
  steps.push_back({0s, 1, deny(16, 0, 2s, 32s)});
  run(limiter, clock, "user123", steps);
}

// brandur/redis-cell src/cell/mod.rs (later redis-cell-impl/src/lib.rs), test `it_rate_limits`:
// RateQuota{max_burst: 4, max_rate: Rate::per_second(1)}, limit 5. Every case, in order, with
// its (remaining, reset_after, retry_after, limited) translated as described at the top.
TEST_CASE("redis-cell it_rate_limits cases 0 to 14 agree step by step") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 1, .period = 1s, .burst = 5}}, clock);
  run(limiter, clock, "foo",
      {
          // case 0: volume 6 > limit 5 — redis-cell: limited, remaining 5, retry -1.
          {0ms, 6, kInvalidCost},
          // cases 1-5: the burst drains; case 1 shows case 0 consumed nothing.
          {0ms, 1, allow(5, 4, 1s)},
          {0ms, 1, allow(5, 3, 2s)},
          {0ms, 1, allow(5, 2, 3s)},
          {0ms, 1, allow(5, 1, 4s)},
          {0ms, 1, allow(5, 0, 5s)},
          // case 6: limited, remaining 0, reset 5 s, retry 1 s.
          {0ms, 1, deny(5, 0, 1s, 5s)},
          // cases 7-11.
          {3000ms, 1, allow(5, 2, 3000ms)},
          {3100ms, 1, allow(5, 1, 3900ms)},
          {4000ms, 1, allow(5, 1, 4000ms)},
          {8000ms, 1, allow(5, 4, 1000ms)},
          {9500ms, 1, allow(5, 4, 1000ms)},
          // case 12: a zero-volume request only peeks.
          {9500ms, 0, allow(5, 4, 1s)},
          // case 13: volume 2 uses two units.
          {9500ms, 2, allow(5, 2, 3s)},
          // case 14: volume 5 does not fit: limited, remaining 2, reset 3 s, retry 3 s.
          {9500ms, 5, deny(5, 2, 3s, 3s)},
      });
}

// brandur/redis-cell tests/e2e.rs, test `it_works`: `CL.THROTTLE user123 0 1 2 1` (max_burst 0,
// one token per 2 s): [0, 1, 0, -1, 2], then [1, 1, 0, 2, 2], then after sleeping retry_after
// (2 s) [0, 1, 0, -1, 2]. The 1 ns-earlier step is ours: redis-cell would report it as 1 s.
TEST_CASE("redis-cell e2e it_works max_burst 0 admits one token per 2 s") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 1, .period = 2s, .burst = 1}}, clock);
  run(limiter, clock, "user123",
      {
          {0s, 1, allow(1, 0, 2s)},
          {0s, 1, deny(1, 0, 2s, 2s)},
          {2s - 1ns, 1, deny(1, 0, 1ns, 1ns)},
          {2s, 1, allow(1, 0, 2s)},
      });
}

// ---------------------------------------------------------------------------------------------
// go-redis/redis_rate
// ---------------------------------------------------------------------------------------------

// go-redis/redis_rate rate_test.go, test `TestAllow`: PerSecond(10). Allow → remaining 9,
// ResetAfter 100ms; (Reset, then) Allow → 9 / 100ms; AllowN 2 → 7 / 300ms; AllowN 7 → 0 /
// 999ms ± 10ms (exactly 1 s on a frozen clock); AllowN 1000 → denied with RetryAfter ≈ 99 s, which
// can never pass: our InvalidArgument, state untouched (the next step shows it).
// Then TestAllowAtMost's full-bucket step: RetryAfter 99ms ± 10ms, ResetAfter 999ms ± 10ms,
// remaining 0, for a single unit: exactly 100ms / 1 s here.
TEST_CASE("redis_rate TestAllow PerSecond 10 drains by Allow and AllowN") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 10, .period = 1s}}, clock);
  run(limiter, clock, "test_id", {{0s, 1, allow(10, 9, 100ms)}});
  run(limiter, clock, "test_id after Reset",
      {
          {0s, 1, allow(10, 9, 100ms)},
          {0s, 2, allow(10, 7, 300ms)},
          {0s, 7, allow(10, 0, 1s)},
          {0s, 1000, kInvalidCost},
          {0s, 1, deny(10, 0, 100ms, 1s)},
      });
}

// go-redis/redis_rate rate_test.go, tests `TestAllowN_IncrementZero` and `TestAllowAtMost`:
// AllowN(0) on a missing key → Remaining 10, RetryAfter -1, ResetAfter 0; after Allow → 9 /
// 100ms; peeks never change anything. (AllowAtMost admits a partial count; its steps are
// translated to the cost it actually admitted: 2, then 7.)
TEST_CASE("redis_rate AllowN 0 peeks without consuming") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 10, .period = 1s}}, clock);
  run(limiter, clock, "test_id",
      {
          {0s, 0, allow(10, 10, 0ns)},
          {0s, 1, allow(10, 9, 100ms)},
          {0s, 0, allow(10, 9, 100ms)},
          {0s, 2, allow(10, 7, 300ms)},
          {0s, 0, allow(10, 7, 300ms)},
          {0s, 7, allow(10, 0, 1s)},
          {0s, 0, allow(10, 0, 1s)},
          {0s, 1, deny(10, 0, 100ms, 1s)},
      });
}

// go-redis/redis_rate rate_test.go, test `TestRetryAfter`: Limit{Rate: 1, Period: 1ms,
// Burst: 1}; every denial's RetryAfter ≤ 1ms. Here the exact values: the wait shrinks with time.
TEST_CASE("redis_rate TestRetryAfter 1 per ms never asks to wait more than 1 ms") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 1, .period = 1ms, .burst = 1}}, clock);
  run(limiter, clock, "test_id",
      {
          {0us, 1, allow(1, 0, 1ms)},
          {0us, 1, deny(1, 0, 1ms, 1ms)},
          {400us, 1, deny(1, 0, 600us, 600us)},
          {1ms - 1ns, 1, deny(1, 0, 1ns, 1ns)},
          {1ms, 1, allow(1, 0, 1ms)},
      });
}

// ---------------------------------------------------------------------------------------------
// governor
// ---------------------------------------------------------------------------------------------

// boinkor-net/governor governor/tests/direct.rs, test `rejects_too_many` (per_second(2)):
// allowed at 0 and 1 ms, not at 2 ms, allowed again at 1002 and 1003 ms, not at 1004 ms.
// retry_after is NotUntil::wait_time_from(now) = earliest − now (earliest = TAT − τ).
TEST_CASE("governor rejects_too_many per_second 2") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 2, .period = 1s}}, clock);
  run(limiter, clock, "direct",
      {
          {0ms, 1, allow(2, 1, 500ms)},
          {1ms, 1, allow(2, 0, 999ms)},
          {2ms, 1, deny(2, 0, 498ms, 998ms)},
          {1002ms, 1, allow(2, 1, 500ms)},
          {1003ms, 1, allow(2, 0, 999ms)},
          {1004ms, 1, deny(2, 0, 498ms, 998ms)},
      });
}

// boinkor-net/governor governor/tests/keyed_dashmap.rs, test
// `rejects_too_many`: the same sequence for keys 1 and 2 on one clock that keeps running; key 2
// starts fresh at 1004 ms, untouched by key 1.
TEST_CASE("governor keyed rejects_too_many keeps one bucket per key") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 2, .period = 1s}}, clock);
  auto from = [](Ns start) {
    return std::vector<Step>{
        {start + 0ms, 1, allow(2, 1, 500ms)},       {start + 1ms, 1, allow(2, 0, 999ms)},
        {start + 2ms, 1, deny(2, 0, 498ms, 998ms)}, {start + 1002ms, 1, allow(2, 1, 500ms)},
        {start + 1003ms, 1, allow(2, 0, 999ms)},    {start + 1004ms, 1, deny(2, 0, 498ms, 998ms)},
    };
  };
  run(limiter, clock, "1", from(0ms));
  run(limiter, clock, "2", from(1004ms));
}

// boinkor-net/governor governor/tests/direct.rs, test
// `does_not_allow_one_extra_cell_after_longer_interval` (reproducer for governor issues #107 and
// #249): per_second(5) admits 5 then denies; after 2 s idle it again admits exactly 5.
TEST_CASE("governor admits no extra cell after a long idle interval") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 5, .period = 1s}}, clock);
  auto burst_at = [](Ns t) {
    return std::vector<Step>{
        {t, 1, allow(5, 4, 200ms)}, {t, 1, allow(5, 3, 400ms)}, {t, 1, allow(5, 2, 600ms)},
        {t, 1, allow(5, 1, 800ms)}, {t, 1, allow(5, 0, 1s)},    {t, 1, deny(5, 0, 200ms, 1s)},
    };
  };
  run(limiter, clock, "direct", burst_at(0s));
  run(limiter, clock, "direct", burst_at(2s));
}

// boinkor-net/governor governor/tests/direct.rs, test `never_allows_more_than_capacity_all`
// (per_second(4), check_n(2)): two batches at 0, none at 1 ms, two at 1001 and 1002 ms, none at
// 1003 ms.
TEST_CASE("governor check_n 2 on per_second 4 never exceeds capacity") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 4, .period = 1s}}, clock);
  run(limiter, clock, "direct",
      {
          {0ms, 2, allow(4, 2, 500ms)},
          {0ms, 2, allow(4, 0, 1s)},
          {1ms, 2, deny(4, 0, 499ms, 999ms)},
          {1001ms, 2, allow(4, 2, 500ms)},
          {1002ms, 2, allow(4, 0, 999ms)},
          {1003ms, 2, deny(4, 0, 498ms, 998ms)},
      });
}

// boinkor-net/governor governor/tests/direct.rs, tests `all_capacity_check_rejects_excess` and
// `rejects_too_many_all`: check_n(15), (7), (6) on per_second(5) are InsufficientCapacity(5) —
// also after 3 s — and check_n(5) then passes.
TEST_CASE("governor InsufficientCapacity is InvalidArgument and consumes nothing") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 5, .period = 1s}}, clock);
  run(limiter, clock, "direct",
      {
          {0s, 15, kInvalidCost},
          {0s, 7, kInvalidCost},
          {0s, 6, kInvalidCost},
          {3s, 15, kInvalidCost},
          {3s, 5, allow(5, 0, 1s)},
      });
}

// boinkor-net/governor governor/tests/direct.rs, test `correct_wait_time`: per_second(5); 20
// times advance 1 ms and check; on a denial advance by wait_time_from(now) and the retry must
// pass. All 20 conform. Exact here: the first wait is 195 ms, every later one 199 ms, and the
// 20th admission lands at 3001 ms.
TEST_CASE("governor correct_wait_time waiting retry_after always admits") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 5, .period = 1s}}, clock);
  const std::vector<Decision> first_five{allow(5, 4, 200ms), allow(5, 3, 399ms), allow(5, 2, 598ms),
                                         allow(5, 1, 797ms), allow(5, 0, 996ms)};
  int conforming = 0;
  for (std::size_t i = 0; i < 20; ++i) {
    INFO("iteration " << i);
    clock.advance(1ms);
    const absl::StatusOr<Decision> d = limiter.check("direct");
    REQUIRE(d.ok());
    if (i < first_five.size()) {
      CHECK(*d == first_five[i]);
    } else {
      CHECK(d->retry_after == (i == 5 ? 195ms : 199ms));
    }
    if (!d->allowed()) {
      clock.advance(d->retry_after);
      const absl::StatusOr<Decision> retried = limiter.check("direct");
      REQUIRE(retried.ok());
      CHECK(*retried == allow(5, 0, 1s));
      if (!retried->allowed()) continue;
    }
    ++conforming;
  }
  CHECK(conforming == 20);
  CHECK(clock.now() == 3001ms);
}

// boinkor-net/governor governor/tests/middleware.rs, test `state_information`: per_second(4)
// with StateInformationMiddleware reports remaining_burst_capacity 3, 2, 1, 0, then denies.
TEST_CASE("governor state_information remaining counts down 3 2 1 0") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 4, .period = 1s}}, clock);
  run(limiter, clock, "direct",
      {
          {0s, 1, allow(4, 3, 250ms)},
          {0s, 1, allow(4, 2, 500ms)},
          {0s, 1, allow(4, 1, 750ms)},
          {0s, 1, allow(4, 0, 1s)},
          {0s, 1, deny(4, 0, 250ms, 1s)},
      });
}

// boinkor-net/governor governor/tests/middleware.rs, test
// `state_snapshot_tracks_quota_accurately`: Quota::with_period(90ms).allow_burst(2) reports
// remaining 1, 0, then denies. After 120 s idle that test (at commit c859d338) expects
// Ok(2), Ok(1), Ok(0) — three admissions from a bucket of 2, the extra cell that governor's own
// direct.rs reproducer (issues #107 and #249) forbids. S5 and the reproducer agree: after idle
// the bucket is exactly full again (2 admissions, remaining 1 then 0), then a denial.
TEST_CASE("governor with_period 90ms allow_burst 2 refills to exactly 2 after idle") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 1, .period = 90ms, .burst = 2}}, clock);
  run(limiter, clock, "direct",
      {
          {0s, 1, allow(2, 1, 90ms)},
          {0s, 1, allow(2, 0, 180ms)},
          {0s, 1, deny(2, 0, 90ms, 180ms)},
          {120s, 1, allow(2, 1, 90ms)},
          {120s, 1, allow(2, 0, 180ms)},
          {120s, 1, deny(2, 0, 90ms, 180ms)},
      });
}

// boinkor-net/governor governor/src/quota.rs, `Quota` docs: per_hour(2).allow_burst(90)
// replenishes one cell per 30 min and the whole burst in 45 h (burst_size_replenished_in).
TEST_CASE("governor per_hour 2 allow_burst 90 refills fully in 45 hours") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 2, .period = 1h, .burst = 90}}, clock);
  std::vector<Step> steps;
  for (std::int64_t k = 1; k <= 90; ++k) {
    steps.push_back({0s, 1, allow(90, static_cast<std::uint64_t>(90 - k), k * 30min)});
  }
  steps.push_back({0s, 1, deny(90, 0, 30min, 45h)});
  steps.push_back({45h, 0, allow(90, 90, 0ns)});
  run(limiter, clock, "direct", steps);
}

// boinkor-net/governor governor/src/quota.rs, `Quota::per_second`: the replenish interval is
// 1s / n truncated to whole ns (333 333 333 ns for 3), so governor's TAT after 3 cells is
// 999 999 999 ns and it admits the 4th at 333 333 333 ns. S5 deliberately keeps T = 1/3 s exact
// ("3 per second drifts by nothing"): the 4th is admitted 1 ns later, at ceil(10⁹/3) ns.
TEST_CASE("governor per_second 3 translated with an exact emission interval") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra({{.requests = 3, .period = 1s}}, clock);
  run(limiter, clock, "direct",
      {
          {0ns, 1, allow(3, 2, 333'333'334ns)},
          {0ns, 1, allow(3, 1, 666'666'667ns)},
          {0ns, 1, allow(3, 0, 1s)},
          {0ns, 1, deny(3, 0, 333'333'334ns, 1s)},
          {333'333'333ns, 1, deny(3, 0, 1ns, 666'666'667ns)},
          {333'333'334ns, 1, allow(3, 0, 1s)},
      });
}

// ---------------------------------------------------------------------------------------------
// S5 stacking, derived by hand: W0 = {1 per 1 s, burst 2} (T 1 s, τ 2 s) and
// W1 = {20 per 2 s, burst 1} (T 100 ms, τ 100 ms), shortest period first.
// ---------------------------------------------------------------------------------------------

TEST_CASE("stacked GCRA windows decide atomically and bind as S5 says") {
  sluice::ManualClock clock;
  Gcra limiter = make_gcra(
      {{.requests = 1, .period = 1s, .burst = 2}, {.requests = 20, .period = 2s, .burst = 1}},
      clock);
  run(limiter, clock, "a",
      {
          // W0 TAT 1 s (remaining 1), W1 TAT 100 ms (remaining 0): W1 has least remaining.
          {0ms, 1, allow(1, 0, 100ms, 1)},
          // W0 would admit, W1 denies: binding W1, and W0 does not advance.
          {0ms, 1, deny(1, 0, 100ms, 100ms, 1)},
          // W0 2 s − 0.1 s ahead (remaining 0), W1 100 ms (remaining 0): tie → shorter period.
          // Had the denial above advanced W0, this would be denied (2.9 s > τ).
          {100ms, 1, allow(2, 0, 1900ms, 0)},
          // W0 denies (3 s − 0.2 s > 2 s), W1 would admit: binding W0, wait 800 ms.
          {200ms, 1, deny(2, 0, 800ms, 1800ms, 0)},
          // Both admit: W0 TAT 3 s, W1 TAT 1.1 s.
          {1s, 1, allow(2, 0, 2s, 0)},
          // Both deny: W0 waits 1 s, W1 100 ms; retry_after is the longer, binding W0.
          {1s, 1, deny(2, 0, 1s, 2s, 0)},
          {1s, 0, allow(2, 0, 2s, 0)},
          // After retry_after every window admits.
          {2s, 1, allow(2, 0, 2s, 0)},
      });
  // A fresh limiter and clock: a shard clamps readings earlier than the latest it has seen, and
  // "a" and "b" may share a shard.
  sluice::ManualClock clock_b;
  Gcra limiter_b = make_gcra(
      {{.requests = 1, .period = 1s, .burst = 2}, {.requests = 20, .period = 2s, .burst = 1}},
      clock_b);
  run(limiter_b, clock_b, "b",
      {
          {0ms, 1, allow(1, 0, 100ms, 1)},
          // W0 TAT 2 s (1.05 s ahead, remaining 0), W1 TAT 1.05 s: tie → W0.
          {950ms, 1, allow(2, 0, 1050ms, 0)},
          // Both deny: W0 waits 50 ms, W1 100 ms. The binding window is still W0 (the first
          // denying), but retry_after is W1's longer wait.
          {950ms, 1, deny(2, 0, 100ms, 1050ms, 0)},
          // 1 ns before that wait ends W0 admits and W1 alone denies, by 1 ns.
          {1050ms - 1ns, 1, deny(1, 0, 1ns, 1ns, 1)},
          {1050ms, 1, allow(2, 0, 1950ms, 0)},
      });
}

// ---------------------------------------------------------------------------------------------
// Fixed windows (S6)
// ---------------------------------------------------------------------------------------------

TEST_CASE("a fixed window is anchored at the first admitted request of an idle key") {
  sluice::ManualClock clock;
  FixedWindows limiter = make_fixed({{.limit = 3, .window = 60s}}, clock);
  run(limiter, clock, "k",
      {
          // A peek on an idle key reports a full window and anchors nothing.
          {5s, 0, allow(3, 3, 0ns)},
          {10s, 1, allow(3, 2, 60s)},
          {40s, 1, allow(3, 1, 30s)},
          {70s - 1ns, 1, allow(3, 0, 1ns)},
          // 1 ns before anchor + window the window is still closed.
          {70s - 1ns, 1, deny(3, 0, 1ns, 1ns)},
          // It reopens exactly at anchor + window, anchored anew there.
          {70s, 1, allow(3, 2, 60s)},
          // After an idle gap the next window starts at the next admitted request, not at a
          // multiple of the window from the first anchor.
          {200s, 1, allow(3, 2, 60s)},
      });
}

TEST_CASE("a denied fixed-window request consumes nothing and does not move the window") {
  sluice::ManualClock clock;
  FixedWindows limiter = make_fixed({{.limit = 2, .window = 60s}}, clock);
  run(limiter, clock, "k",
      {
          {0s, 1, allow(2, 1, 60s)},
          {0s, 3, kInvalidCost},
          {0s, 1, allow(2, 0, 60s)},
          {20s, 1, deny(2, 0, 40s, 40s)},
          {30s, 1, deny(2, 0, 30s, 30s)},
          {30s, 1, deny(2, 0, 30s, 30s)},
          {60s - 1ns, 1, deny(2, 0, 1ns, 1ns)},
          {60s, 1, allow(2, 1, 60s)},
          {60s, 1, allow(2, 0, 60s)},
      });
}

TEST_CASE("stacked minute and day fixed windows decide atomically") {
  sluice::ManualClock clock;
  FixedWindows limiter =
      make_fixed({{.limit = 5, .window = 60s}, {.limit = 7, .window = 24h}}, clock);
  run(limiter, clock, "k",
      {
          {0s, 1, allow(5, 4, 60s, 0)},
          {0s, 1, allow(5, 3, 60s, 0)},
          {0s, 1, allow(5, 2, 60s, 0)},
          {0s, 1, allow(5, 1, 60s, 0)},
          {0s, 1, allow(5, 0, 60s, 0)},
          // The minute denies; the day would admit but counts nothing.
          {0s, 1, deny(5, 0, 60s, 60s, 0)},
          // New minute; the day holds 5 (not 6), so 1 then 0 remain and the day binds.
          {60s, 1, allow(7, 1, 24h - 60s, 1)},
          {60s, 1, allow(7, 0, 24h - 60s, 1)},
          // The day denies; the minute would admit.
          {60s, 1, deny(7, 0, 24h - 60s, 24h - 60s, 1)},
          // The minute has long reopened; the day reopens exactly at its anchor + 24 h.
          {24h - 1ns, 1, deny(7, 0, 1ns, 1ns, 1)},
          {24h, 1, allow(5, 4, 60s, 0)},
      });
}
