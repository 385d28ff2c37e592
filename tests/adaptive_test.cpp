#include "sluice/adaptive.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "catch.hpp"

using namespace std::chrono_literals;
using sluice::AdaptiveController;
using sluice::AdaptivePolicy;
using sluice::UpstreamResponse;

namespace {

// target 100 ms, 10% errors, floor 100‰, ×0.5 per bad interval, +100‰ per good one, 1 s steps;
// the control law alone: one answer from one client is enough to judge an interval.
AdaptivePolicy policy() { return {.target_latency = 100ms, .min_samples = 1, .min_clients = 1}; }

// The digest of the client behind an answer (the engine hashes the request's address).
constexpr std::uint64_t kClient = 7;

UpstreamResponse ok(std::chrono::nanoseconds latency) { return {.latency = latency}; }

}  // namespace

TEST_CASE("a new controller runs at the full limit") {
  AdaptiveController c(policy(), 0s);
  CHECK(c.factor(0s) == 1000);
  CHECK(c.factor(10s) == 1000);
  CHECK(c.state(10s).decreases == 0);
}

TEST_CASE("a slow upstream halves the factor once per interval down to the minimum") {
  AdaptiveController c(policy(), 0s);
  std::vector<std::uint32_t> trajectory;
  for (int second = 0; second < 6; ++second) {
    c.record(std::chrono::seconds(second) + 500ms, ok(300ms), kClient);
    trajectory.push_back(c.factor(std::chrono::seconds(second + 1)));
  }
  CHECK(trajectory == std::vector<std::uint32_t>{500, 250, 125, 100, 100, 100});
}

TEST_CASE("latency at the target is healthy, one nanosecond above it is not") {
  AdaptiveController at(policy(), 0s);
  at.record(500ms, ok(100ms), kClient);
  CHECK(at.factor(1s) == 1000);

  AdaptiveController above(policy(), 0s);
  above.record(500ms, ok(100ms + 1ns), kClient);
  CHECK(above.factor(1s) == 500);
}

TEST_CASE("the latency average moves an eighth of the way to each sample") {
  AdaptiveController c(policy(), 0s);
  c.record(1ms, ok(80ms), kClient);
  CHECK(c.state(1ms).latency_ewma == 80ms);
  c.record(2ms, ok(160ms), kClient);
  CHECK(c.state(2ms).latency_ewma == 90ms);  // 80 + (160 − 80) / 8
  c.record(3ms, ok(0ms), kClient);
  CHECK(c.state(3ms).latency_ewma == 78750us);  // 90 − 90 / 8
}

TEST_CASE("an error ratio above the threshold shrinks the factor, at the threshold it does not") {
  AdaptiveController at(policy(), 0s);  // 1 error in 10 = 100‰: not above
  for (int i = 0; i < 9; ++i) at.record(100ms, ok(10ms), kClient);
  at.record(100ms, {.latency = 10ms, .status = 502}, kClient);
  CHECK(at.factor(1s) == 1000);

  AdaptiveController above(policy(), 0s);  // 2 in 10 (one of them no answer at all)
  for (int i = 0; i < 8; ++i) above.record(100ms, ok(10ms), kClient);
  above.record(100ms, {.latency = 10ms, .status = 500}, kClient);
  above.record(100ms, {.latency = 10ms, .status = 0}, kClient);
  CHECK(above.state(900ms).errors == 2);
  CHECK(above.factor(1s) == 500);
  CHECK(above.state(1s).errors == 0);  // counts start over with each interval
}

TEST_CASE("a healthy upstream recovers the factor additively up to the full limit") {
  AdaptiveController c(policy(), 0s);
  c.record(500ms, ok(1s), kClient);
  c.record(1500ms, ok(1s), kClient);
  c.record(2500ms, ok(1s), kClient);
  REQUIRE(c.factor(3s) == 125);
  std::vector<std::uint32_t> trajectory;
  for (int second = 3; second < 13; ++second) {
    for (int i = 0; i < 20; ++i) {  // pulls the average under the target within one interval
      c.record(std::chrono::seconds(second) + std::chrono::milliseconds(500 + i), ok(1ms), kClient);
    }
    trajectory.push_back(c.factor(std::chrono::seconds(second + 1)));
  }
  CHECK(trajectory.front() == 225);
  CHECK(trajectory.back() == 1000);
  for (std::size_t i = 1; i < trajectory.size(); ++i) {
    CHECK(trajectory[i] >= trajectory[i - 1]);
    CHECK(trajectory[i] - trajectory[i - 1] <= 100);
  }
}

TEST_CASE("idle intervals after fast answers are healthy and are applied lazily all at once") {
  AdaptiveController c(policy(), 0s);
  c.record(500ms, {.latency = 1ms, .status = 500},
           kClient);  // errors, not latency: the average is fast
  c.record(1500ms, {.latency = 1ms, .status = 500}, kClient);
  REQUIRE(c.factor(2s) == 250);
  // Nothing for 5 s: intervals ending at 3 s ... 7 s recover 100‰ each.
  CHECK(c.factor(7s) == 750);
  CHECK(c.factor(1000s) == 1000);
}

TEST_CASE("idle intervals while the upstream was last seen slow hold the factor") {
  AdaptiveController c(policy(), 0s);
  c.record(500ms, ok(1s), kClient);
  c.record(1500ms, ok(1s), kClient);
  REQUIRE(c.factor(2s) == 250);
  // A slow upstream admitted at a low rate: most intervals see no answer. They hold the factor.
  CHECK(c.factor(7s) == 250);
  c.record(7500ms, ok(1s), kClient);
  CHECK(c.factor(8s) == 125);  // an interval with a slow answer still shrinks it
  CHECK(c.factor(1000s) == 125);
  // Fast answers pull the average under the target; from then on idle intervals recover.
  for (int i = 0; i < 30; ++i) c.record(1000s + std::chrono::milliseconds(i), ok(1ms), kClient);
  CHECK(c.state(1000s).latency_ewma <= 100ms);
  CHECK(c.factor(1001s) == 225);
  CHECK(c.factor(1005s) == 625);
}

TEST_CASE("a 503 drops to the minimum at once and holds it for its Retry-After") {
  AdaptiveController c(policy(), 0s);
  c.record(200ms, {.latency = 5ms, .status = 503, .retry_after = 3s}, kClient);
  CHECK(c.factor(200ms) == 100);
  CHECK(c.state(200ms).hold_remaining == 3s);
  CHECK(c.factor(3s) == 100);  // boundaries at 1, 2, 3 s fall inside the hold (until 3.2 s)
  CHECK(c.factor(4s) == 200);  // the interval ending at 4 s is the first to recover
  CHECK(c.factor(12s) == 1000);
}

TEST_CASE("a 429 without Retry-After holds for one interval and the hold is capped") {
  AdaptiveController c(policy(), 0s);
  c.record(0s, {.latency = 1ms, .status = 429}, kClient);
  CHECK(c.factor(999ms) == 100);
  CHECK(c.factor(1s) == 200);  // held until 1 s: the interval ending at 1 s recovers
  AdaptivePolicy short_hold = policy();
  short_hold.max_hold = 10s;
  AdaptiveController capped(short_hold, 0s);
  capped.record(0s, {.latency = 1ms, .status = 429, .retry_after = 24h}, kClient);
  CHECK(capped.state(0s).hold_remaining == 10s);
  CHECK(capped.factor(9s) == 100);
  CHECK(capped.factor(10s) == 200);
}

TEST_CASE("one client's 503s with Retry-After: 300 do not lower the factor") {
  AdaptiveController c({.target_latency = 100ms}, 0s);
  for (int i = 0; i < 20; ++i) {
    c.record(std::chrono::milliseconds(10 * i),
             {.latency = 5ms, .status = 503, .retry_after = 300s}, kClient);
  }
  CHECK(c.factor(200ms) == 1000);
  CHECK(c.state(200ms).hold_remaining == 0s);
  CHECK(c.factor(1s) == 1000);  // 20 errors of 20 answers, all from one client: not overloaded
}

TEST_CASE("503s from enough distinct clients drop the factor, held no longer than the cap") {
  AdaptiveController c({.target_latency = 100ms}, 0s);  // 5 samples from 3 clients, 30 s cap
  for (std::uint64_t client = 1; client <= 4; ++client) {
    c.record(100ms, {.latency = 5ms, .status = 503, .retry_after = 300s}, client);
  }
  CHECK(c.factor(100ms) == 1000);  // four answers: one short of the minimum
  c.record(100ms, {.latency = 5ms, .status = 503, .retry_after = 300s}, 1);
  CHECK(c.factor(100ms) == 100);
  CHECK(c.state(100ms).hold_remaining == 30s);
  CHECK(c.factor(30s) == 100);
  CHECK(c.factor(31s) == 200);  // the interval ending at 31 s is the first after the hold
}

TEST_CASE("503s from too few distinct clients do not drop the factor however many they are") {
  AdaptiveController c({.target_latency = 100ms}, 0s);
  for (int i = 0; i < 50; ++i) {
    c.record(100ms, {.latency = 5ms, .status = 503, .retry_after = 300s},
             static_cast<std::uint64_t>(i % 2));
  }
  CHECK(c.factor(100ms) == 1000);
  CHECK(c.factor(1s) == 1000);
}

TEST_CASE("slow answers shrink the factor only with enough answers from enough clients") {
  AdaptiveController one({.target_latency = 100ms}, 0s);
  for (int i = 0; i < 20; ++i) one.record(500ms, ok(1s), kClient);
  CHECK(one.factor(1s) == 1000);
  AdaptiveController few({.target_latency = 100ms}, 0s);
  for (std::uint64_t client = 1; client <= 4; ++client) few.record(500ms, ok(1s), client);
  CHECK(few.factor(1s) == 1000);  // four answers: one short of the minimum
  AdaptiveController many({.target_latency = 100ms}, 0s);
  for (std::uint64_t client = 1; client <= 5; ++client) many.record(500ms, ok(1s), client);
  CHECK(many.factor(1s) == 500);
}

TEST_CASE("one client's slow answers cannot keep the factor from recovering") {
  AdaptiveController c({.target_latency = 100ms}, 0s);
  for (std::uint64_t client = 1; client <= 5; ++client) c.record(500ms, ok(1s), client);
  REQUIRE(c.factor(1s) == 500);  // a real slow-down, seen by five clients
  // Then every interval: ten other clients get twenty fast answers, and client 666's ten 10 s
  // answers after them keep the average far above the target. Not overloaded (one troubled
  // client), and enough answers to judge: healthy, so the factor recovers.
  for (int s = 1; s <= 5; ++s) {
    const auto at = std::chrono::seconds(s) + 100ms;
    for (int i = 0; i < 20; ++i) c.record(at, ok(10ms), static_cast<std::uint64_t>(i % 10));
    for (int i = 0; i < 10; ++i) c.record(at, ok(10s), 666);
  }
  CHECK(c.state(5s).latency_ewma > 100ms);
  CHECK(c.factor(6s) == 1000);
  // An interval with too few answers to judge still holds while the average is above target.
  c.record(6500ms, ok(120s), 666);
  CHECK(c.factor(7s) == 1000);
  AdaptiveController held({.target_latency = 100ms}, 0s);
  for (std::uint64_t client = 1; client <= 5; ++client) held.record(500ms, ok(1s), client);
  REQUIRE(held.factor(1s) == 500);
  held.record(1500ms, ok(1s), 666);  // one answer: too few to judge, and slow
  CHECK(held.factor(2s) == 500);
  CHECK(held.factor(10s) == 500);  // quiet intervals hold too
}

TEST_CASE("one client's single slow answer does not tip other clients' tail into a decrease",
          "[attack]") {
  // Twenty clients get fast answers, two of them one answer just above the target (an ordinary
  // tail: three distinct troubled clients need only one more). Alone, the average stays far
  // under the target and the interval is healthy.
  const auto traffic = [](AdaptiveController& c) {
    for (std::uint64_t client = 10; client < 30; ++client) c.record(100ms, ok(10ms), client);
    c.record(200ms, ok(101ms), 1);
    c.record(200ms, ok(101ms), 2);
  };
  AdaptiveController tail({.target_latency = 100ms}, 0s);
  traffic(tail);
  REQUIRE(tail.factor(1s) == 1000);
  // Client 666 adds one answer that took a minute (a request it held open). That one answer
  // must not lower the limit of the twenty-two others.
  AdaptiveController attacked({.target_latency = 100ms}, 0s);
  traffic(attacked);
  attacked.record(300ms, ok(60s), 666);
  CHECK(attacked.state(300ms).latency_ewma <= 100ms);
  CHECK(attacked.factor(1s) == 1000);
}

TEST_CASE("a clock reading earlier than one already seen is clamped") {
  AdaptiveController c(policy(), 10s);
  c.record(10500ms, ok(1s), kClient);
  CHECK(c.factor(11s) == 500);
  c.record(1s, ok(1s), kClient);  // clamped to 11 s: counts in the interval ending at 12 s
  CHECK(c.factor(5s) == 500);
  CHECK(c.factor(12s) == 250);
}

TEST_CASE("extreme readings and latencies neither overflow nor wrap") {
  AdaptiveController c(policy(),
                       std::chrono::nanoseconds(std::numeric_limits<std::int64_t>::max() - 1000));
  c.record(std::chrono::nanoseconds::max(), {.latency = std::chrono::nanoseconds::max()}, kClient);
  CHECK(c.state(std::chrono::nanoseconds::max()).latency_ewma == 200ms);  // twice the target
  CHECK(c.factor(std::chrono::nanoseconds::max()) == 1000);  // no interval ends past the range

  AdaptiveController negative(policy(), -5s);
  negative.record(-4500ms, {.latency = -1s}, kClient);  // a negative latency counts as 0
  CHECK(negative.state(-4500ms).latency_ewma == 0ns);
  CHECK(negative.factor(-4s) == 1000);
}

TEST_CASE("invalid policies are refused with the field named") {
  CHECK(AdaptivePolicy{}.validate("r.").message() ==
        "r.target_latency must be more than 0 and at most 24 hours");
  CHECK(AdaptivePolicy{.target_latency = 1ms, .minimum_factor_permille = 0}.validate().message() ==
        "minimum_factor_permille must be 1 ... 1000");
  CHECK(!AdaptivePolicy{.target_latency = 1ms, .decrease_permille = 1000}.validate().ok());
  CHECK(!AdaptivePolicy{.target_latency = 1ms, .recovery_permille = 0}.validate().ok());
  CHECK(!AdaptivePolicy{.target_latency = 1ms, .error_ratio_permille = 1001}.validate().ok());
  CHECK(!AdaptivePolicy{.target_latency = 1ms, .interval = 0s}.validate().ok());
  CHECK(!AdaptivePolicy{.target_latency = 1ms, .max_hold = -1s}.validate().ok());
  CHECK(AdaptivePolicy{.target_latency = 1ms, .min_samples = 0}.validate().message() ==
        "min_samples must be 1 ... 1000000");
  CHECK(AdaptivePolicy{.target_latency = 1ms, .min_clients = 9}.validate().message() ==
        "min_clients must be 1 ... 8");
  CHECK(AdaptivePolicy{.target_latency = 1ms, .min_samples = 2}.validate().message() ==
        "min_clients must be at most min_samples");
  CHECK(!AdaptivePolicy{.target_latency = 1ms, .max_retry_after = -1s}.validate().ok());
  CHECK(AdaptivePolicy{.target_latency = 1ms}.validate().ok());
  CHECK(policy().validate().ok());
}

TEST_CASE("adaptive units round the scaled cost up") {
  CHECK(sluice::adaptive_units(1, 1000) == 1000);
  CHECK(sluice::adaptive_units(1, 500) == 2000);
  CHECK(sluice::adaptive_units(1, 300) == 3334);  // ⌈10⁶ / 300⌉
  CHECK(sluice::adaptive_units(7, 1) == 7000000);
  CHECK(sluice::adaptive_units(std::numeric_limits<std::uint64_t>::max(), 1) ==
        std::numeric_limits<std::uint64_t>::max());
}

TEST_CASE("concurrent records and reads keep the factor within its bounds") {
  AdaptiveController c(policy(), 0s);
  std::atomic<bool> out_of_bounds{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const auto now = std::chrono::milliseconds(i * 5);
        if (t % 2 == 0) {
          c.record(now,
                   {.latency = (i / 200) % 2 == 0 ? 500ms : 1ms, .status = i % 97 == 0 ? 503 : 200},
                   kClient);
        }
        const std::uint32_t f = c.factor(now);
        if (f < 100 || f > 1000) out_of_bounds = true;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(!out_of_bounds);
  CHECK(c.state(100s).decreases > 0);
}
