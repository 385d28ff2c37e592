#include "sluice/gcra.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/numeric/int128.h"
#include "catch.hpp"
#include "sluice/clock.hpp"

using namespace std::chrono_literals;
using Limiter = sluice::GcraLimiter<sluice::ManualClock>;
using sluice::Reason;

namespace {

Limiter make(std::vector<sluice::GcraWindow> windows, sluice::ManualClock clock,
             sluice::StoreOptions options = {.seed = 1}) {
  auto limiter = Limiter::create(std::move(windows), options, clock);
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

sluice::Decision check(Limiter& limiter, std::string_view key = "k", std::uint64_t cost = 1) {
  auto d = limiter.check(key, cost);
  REQUIRE(d.ok());
  return *d;
}

constexpr std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

}  // namespace

TEST_CASE("three per second admits at exactly ceil(k/3 s) forever with no drift") {
  sluice::ManualClock clock;
  Limiter limiter = make({{.requests = 3, .period = 1s}}, clock);
  for (int i = 0; i < 3; ++i) REQUIRE(check(limiter).allowed());  // the burst

  // A client that retries after exactly retry_after: its k-th admission after the burst lands at
  // ceil(k·10⁹/3) ns; 1 ns earlier it is still denied.
  for (std::uint64_t k = 1; k <= 1'000'000; ++k) {
    sluice::Decision denied = check(limiter);
    REQUIRE(denied.reason == Reason::kQuotaExceeded);
    const std::int64_t due = static_cast<std::int64_t>(ceil_div(k * 1'000'000'000, 3));
    REQUIRE(clock.now().count() + denied.retry_after.count() == due);
    clock.set(std::chrono::nanoseconds(due - 1));
    REQUIRE_FALSE(check(limiter).allowed());
    clock.set(std::chrono::nanoseconds(due));
    REQUIRE(check(limiter).allowed());
  }
  CHECK(clock.now() == std::chrono::nanoseconds(333'333'333'333'334));
}

TEST_CASE("one per hour admits one and then asks for the hour") {
  sluice::ManualClock clock(5s);
  Limiter limiter = make({{.requests = 1, .period = 1h}}, clock);
  sluice::Decision first = check(limiter);
  CHECK(first == sluice::Decision{
                     .reason = Reason::kAllowed, .limit = 1, .remaining = 0, .reset_after = 1h});
  clock.advance(59min);
  CHECK(check(limiter) == sluice::Decision{.reason = Reason::kQuotaExceeded,
                                           .limit = 1,
                                           .remaining = 0,
                                           .retry_after = 1min,
                                           .reset_after = 1min});
  clock.advance(1min);
  CHECK(check(limiter).allowed());
}

TEST_CASE("a billion per second drains its whole burst at once and refills per nanosecond") {
  sluice::ManualClock clock;
  Limiter limiter = make({{.requests = 1'000'000'000, .period = 1s}}, clock);
  sluice::Decision all = check(limiter, "k", 1'000'000'000);
  CHECK(all.allowed());
  CHECK(all.remaining == 0);
  CHECK(all.reset_after == 1s);
  sluice::Decision more = check(limiter);
  CHECK(more.reason == Reason::kQuotaExceeded);
  CHECK(more.retry_after == 1ns);
  clock.advance(1ns);
  CHECK(check(limiter).allowed());
}

TEST_CASE("clock values near 2^62 ns work and readings beyond it saturate") {
  const std::int64_t near = (std::int64_t{1} << 62) - 10'000'000'000;
  sluice::ManualClock clock{std::chrono::nanoseconds(near)};
  Limiter limiter = make({{.requests = 2, .period = 10s}}, clock);
  CHECK(check(limiter).remaining == 1);
  CHECK(check(limiter).remaining == 0);
  sluice::Decision denied = check(limiter);
  CHECK(denied.retry_after == 5s);
  clock.advance(5s);
  CHECK(check(limiter).allowed());
  clock.set(std::chrono::nanoseconds(std::numeric_limits<std::int64_t>::max()));
  CHECK(check(limiter).allowed());  // saturated to 2^62: admitted, nothing overflows
}

TEST_CASE("a peek reports availability and changes nothing") {
  sluice::ManualClock clock;
  Limiter limiter = make({{.requests = 5, .period = 1s}}, clock);
  CHECK(check(limiter, "k", 0) ==
        sluice::Decision{.reason = Reason::kAllowed, .limit = 5, .remaining = 5});
  CHECK(limiter.stats().size == 0);  // a peek at an unknown key stores nothing
  check(limiter, "k", 2);
  sluice::Decision peek = check(limiter, "k", 0);
  CHECK(peek.remaining == 3);
  CHECK(peek.reset_after == 400ms);
  CHECK(check(limiter, "k", 0) == peek);
  CHECK(check(limiter, "k", 3).remaining == 0);
}

TEST_CASE("a cost above a window's burst is an error and changes nothing") {
  sluice::ManualClock clock;
  Limiter limiter =
      make({{.requests = 10, .period = 1s}, {.requests = 100, .period = 1min, .burst = 4}}, clock);
  check(limiter, "k", 1);
  auto result = limiter.check("k", 5);
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(result.status().message() ==
        "cost 5 exceeds the burst 4 of window 1 and can never be admitted");
  CHECK(check(limiter, "k", 0).remaining == 3);
}

TEST_CASE("a clock that goes backwards replenishes nothing") {
  sluice::ManualClock clock(10s);
  Limiter limiter = make({{.requests = 1, .period = 1s}}, clock);
  check(limiter);
  clock.set(5s);
  sluice::Decision denied = check(limiter);
  CHECK(denied.reason == Reason::kQuotaExceeded);
  CHECK(denied.retry_after == 1s);  // measured from 10 s, the latest time seen
  clock.set(11s);
  CHECK(check(limiter).allowed());
}

TEST_CASE("create rejects bad windows naming the bad value") {
  sluice::ManualClock clock;
  auto error = [&](std::vector<sluice::GcraWindow> windows) {
    auto limiter = Limiter::create(std::move(windows), {}, clock);
    REQUIRE_FALSE(limiter.ok());
    CHECK(limiter.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(limiter.status().message());
  };
  CHECK(error({}) == "windows must not be empty");
  CHECK(error({{.requests = 0, .period = 1s}}) ==
        "windows[0].requests must be in [1, 2^32], got 0");
  CHECK(error({{.requests = 1, .period = 1s}, {.requests = 1, .period = 0s}}) ==
        "windows[1].period must be > 0, got 0ns");
  CHECK(error({{.requests = 1, .period = -1s}}) ==
        "windows[0].period must be > 0, got -1000000000ns");
  CHECK(error({{.requests = 1, .period = std::chrono::hours(24 * 500)}}) ==
        "windows[0].period must be at most 2^55 ns, got 43200000000000000ns");
  CHECK(error({{.requests = 1, .period = 1s, .burst = (std::uint64_t{1} << 32) + 1}}) ==
        "windows[0].burst must be in [1, 2^32], got 4294967297");
  CHECK(error({{.requests = 1, .period = std::chrono::hours(24 * 400), .burst = 1u << 30}}) ==
        "windows[0].burst × period / requests must be at most 2^60 ns");
  CHECK(error({{1, 1s}, {1, 2s}, {1, 3s}, {1, 4s}, {1, 5s}}) ==
        "at most 4 windows are supported, got 5");
}

TEST_CASE("a refill time a third of a nanosecond above 2^60 ns is refused") {
  // 307 × 11266333921239547 ns = 3·2^60 + 1 ns: a refill of 2^60 + 1/3 ns, which rounds down
  // to the bound but is above it. A refill of exactly 2^60 ns is taken.
  constexpr std::chrono::nanoseconds kPeriod{11'266'333'921'239'547};
  sluice::ManualClock clock;
  auto above = Limiter::create({{.requests = 3, .period = kPeriod, .burst = 307}}, {}, clock);
  REQUIRE_FALSE(above.ok());
  CHECK(above.status().message() == "windows[0].burst × period / requests must be at most 2^60 ns");
  CHECK(Limiter::create({{.requests = 1,
                          .period = std::chrono::nanoseconds{std::int64_t{1} << 28},
                          .burst = std::uint64_t{1} << 32}},
                        {}, clock)
            .ok());
}

TEST_CASE("windows are sorted shortest first with bursts defaulted") {
  sluice::ManualClock clock;
  Limiter limiter =
      make({{.requests = 600, .period = 1min}, {.requests = 10, .period = 1s, .burst = 20}}, clock);
  CHECK(limiter.windows() ==
        std::vector<sluice::GcraWindow>{{.requests = 10, .period = 1s, .burst = 20},
                                        {.requests = 600, .period = 1min, .burst = 600}});
}

TEST_CASE("a request denied by the longer window leaves the shorter window untouched") {
  sluice::ManualClock clock;
  // 1/s burst 2, and 20 per 2 s burst 1 (one request per 100 ms).
  Limiter limiter =
      make({{.requests = 1, .period = 1s, .burst = 2}, {.requests = 20, .period = 2s, .burst = 1}},
           clock);
  CHECK(check(limiter).allowed());
  sluice::Decision denied = check(limiter);
  CHECK(denied == sluice::Decision{.reason = Reason::kQuotaExceeded,
                                   .limit = 1,
                                   .remaining = 0,
                                   .retry_after = 100ms,
                                   .reset_after = 100ms,
                                   .binding_window = 1});
  clock.advance(100ms);
  // Had the denial consumed from the 1-second window, this would be denied.
  sluice::Decision next = check(limiter);
  CHECK(next.allowed());
  CHECK(next.binding_window == 0);
  CHECK(next.remaining == 0);
}

TEST_CASE("when two windows deny the shorter binds and retry_after is the longer wait") {
  sluice::ManualClock clock;
  Limiter limiter =
      make({{.requests = 1, .period = 1s, .burst = 2}, {.requests = 20, .period = 2s, .burst = 1}},
           clock);
  check(limiter);
  clock.advance(100ms);
  check(limiter);
  sluice::Decision denied = check(limiter);  // 1 s window waits 900 ms, 2 s window 100 ms
  CHECK(denied.reason == Reason::kQuotaExceeded);
  CHECK(denied.binding_window == 0);
  CHECK(denied.limit == 2);
  CHECK(denied.retry_after == 900ms);
  clock.advance(900ms - 1ns);
  CHECK_FALSE(check(limiter).allowed());
  clock.advance(1ns);
  CHECK(check(limiter).allowed());
}

TEST_CASE("an admission binds the window with the least remaining") {
  sluice::ManualClock clock;
  Limiter limiter = make({{.requests = 10, .period = 1s}, {.requests = 12, .period = 1min}}, clock);
  sluice::Decision first = check(limiter);
  CHECK(first.binding_window == 0);
  CHECK(first.remaining == 9);
  for (int i = 0; i < 9; ++i) check(limiter);
  clock.advance(1s);
  sluice::Decision later = check(limiter);  // 1 s window: 9 left; 1 min window: 1 left
  CHECK(later.binding_window == 1);
  CHECK(later.limit == 12);
  CHECK(later.remaining == 1);
}

TEST_CASE("threads racing on one key with a frozen clock admit exactly the burst") {
  sluice::ManualClock clock;
  Limiter limiter = make({{.requests = 1000, .period = 1h}}, clock);
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        auto d = limiter.check("hot");
        if (d.ok() && d->allowed()) admitted.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(admitted.load() == 1000);
}

// Replays `steps` random (advance, cost) steps through a limiter with `windows` and checks every
// decision against a 128-bit reference (TAT·requests + fraction in one integer): admission, the
// binding window, its remaining and its limit. `advance` draws the time between steps.
template <class Advance>
void gcra_reference_replay(const std::vector<sluice::GcraWindow>& windows, int steps,
                           std::uint64_t max_cost, Advance&& advance) {
  sluice::ManualClock clock;
  Limiter limiter = make(windows, clock);
  struct Window {
    absl::int128 tat = std::numeric_limits<std::int64_t>::min();
    std::int64_t requests, period;
    std::uint64_t burst;
  };
  std::vector<Window> model;
  for (const auto& w : windows)
    model.push_back({.requests = static_cast<std::int64_t>(w.requests),
                     .period = w.period.count(),
                     .burst = w.burst});
  std::mt19937_64 random(11);
  for (int step = 0; step < steps; ++step) {
    clock.advance(advance(random));
    const std::uint64_t cost = random() % (max_cost + 1);
    const absl::int128 now = clock.now().count();
    std::vector<absl::int128> next;
    std::size_t first_denied = model.size();
    for (std::size_t i = 0; i < model.size(); ++i) {
      const Window& w = model[i];
      const absl::int128 at = now * w.requests;
      next.push_back(std::max(w.tat, at) + absl::int128(cost) * w.period);
      const bool admits = next[i] - at <= absl::int128(w.burst) * w.period;
      if (!admits && first_denied == model.size()) first_denied = i;
    }
    const sluice::Decision d = check(limiter, "k", cost);
    INFO("step " << step << " cost " << cost);
    if (first_denied != model.size()) {
      REQUIRE_FALSE(d.allowed());
      REQUIRE(d.binding_window == first_denied);
      continue;
    }
    REQUIRE(d.allowed());
    std::size_t binding = 0;
    absl::int128 least = -1;
    for (std::size_t i = 0; i < model.size(); ++i) {
      const Window& w = model[i];
      const absl::int128 room = absl::int128(w.burst) * w.period - (next[i] - now * w.requests);
      const absl::int128 left = room / w.period;  // room ≥ 0: floor
      if (i == 0 || left < least) {
        least = left;
        binding = i;
      }
      if (cost != 0) model[i].tat = next[i];
    }
    REQUIRE(d.binding_window == binding);
    REQUIRE(d.remaining == static_cast<std::uint64_t>(least));
    REQUIRE(d.limit == model[binding].burst);
  }
}

TEST_CASE("stacked windows report the binding window and remaining of a 128-bit reference") {
  // Awkward rates (intervals with fractions, different bursts) so that windows tie, cross and
  // differ by a fraction of a request.
  gcra_reference_replay(
      {{.requests = 7, .period = 1s, .burst = 5},
       {.requests = 29, .period = 3s, .burst = 11},
       {.requests = 400, .period = 1min, .burst = 50}},
      20'000, 5, [](std::mt19937_64& random) {
        return std::chrono::nanoseconds(static_cast<std::int64_t>(random() % 300'000'000));
      });
}

TEST_CASE("stacked windows stepped by whole intervals match the 128-bit reference") {
  // Whole-ns intervals (100 ms, 50 ms, 25 ms) and steps of whole intervals: each window's TAT
  // often lands exactly on now (a window that starts afresh) while another is still ahead, and
  // fresh windows tie on burst − cost.
  gcra_reference_replay(
      {{.requests = 10, .period = 1s, .burst = 4},
       {.requests = 1'200, .period = 1min, .burst = 4},
       {.requests = 144'000, .period = 1h, .burst = 9}},
      20'000, 4, [](std::mt19937_64& random) {
        return std::chrono::milliseconds(25 * static_cast<std::int64_t>(random() % 6));
      });
}

TEST_CASE("stacked windows with exactly the same room bind the shorter period") {
  sluice::ManualClock clock;
  // The same interval (100 ms) and burst: every admission leaves both windows the same room.
  Limiter limiter =
      make({{.requests = 10, .period = 1s}, {.requests = 600, .period = 1min, .burst = 10}}, clock);
  for (int i = 0; i < 25; ++i) {
    const sluice::Decision d = check(limiter);
    if (d.allowed()) REQUIRE(d.binding_window == 0);
    clock.advance(std::chrono::milliseconds(i % 3 == 0 ? 100 : 0));
  }
}

TEST_CASE("eight threads flooding one key with stacked windows admit exactly the tightest burst") {
  sluice::ManualClock clock;
  Limiter limiter =
      make({{.requests = 600, .period = 1min}, {.requests = 500, .period = 1h}}, clock);
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto d = limiter.check("hot");
        if (d.ok() && d->allowed()) admitted.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(admitted.load() == 500);
  const sluice::Decision after = limiter.inspect("hot");
  CHECK(after.remaining == 0);
  CHECK(after.binding_window == 1);
}

TEST_CASE("eight threads flooding one key under a window that never binds lose no admission") {
  sluice::ManualClock clock;
  Limiter limiter = make({{.requests = 1'000'000, .period = 1s, .burst = 1'000'000}}, clock);
  constexpr int kThreads = 8;
  constexpr int kChecks = 2'000;
  std::vector<std::thread> threads;
  std::atomic<int> admitted{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kChecks; ++i) {  // no REQUIRE off the main thread (Catch2)
        auto d = limiter.check("hot");
        if (d.ok() && d->allowed()) admitted.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(admitted.load() == kThreads * kChecks);
  // Every admission took exactly one unit: the bucket holds the rest, not one more or less.
  CHECK(limiter.inspect("hot").remaining == 1'000'000 - kThreads * kChecks);
}

TEST_CASE("a key spray through the limiter stays within the store bound") {
  sluice::ManualClock clock;
  Limiter limiter =
      make({{.requests = 1, .period = 1min}}, clock, {.max_keys_per_shard = 16, .seed = 1});
  for (int i = 0; i < 20'000; ++i) REQUIRE(check(limiter, "ip-" + std::to_string(i)).allowed());
  sluice::StoreStats stats = limiter.stats();
  CHECK(stats.size <= sluice::kStoreShards * 16);
  CHECK(stats.live_evicted > 0);
  CHECK(stats.size + stats.live_evicted + stats.idle_reclaimed == 20'000);
}

TEST_CASE("a full reject_new_keys limiter answers store full for new keys only") {
  sluice::ManualClock clock;
  Limiter limiter =
      make({{.requests = 1, .period = 1min}}, clock,
           {.max_keys_per_shard = 2, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1});
  int full = 0;
  sluice::Decision last;
  for (int i = 0; i < 1000; ++i) {
    sluice::Decision d = check(limiter, "user-" + std::to_string(i));
    if (d.reason == Reason::kStoreFull) {
      ++full;
      last = d;
    }
  }
  CHECK(full == 1000 - static_cast<int>(limiter.stats().size));
  CHECK(limiter.stats().size == 2 * sluice::kStoreShards);
  CHECK(last.retry_after == 1min);
  CHECK(limiter.stats().capacity_denials == static_cast<std::uint64_t>(full));
  CHECK(limiter.stats().live_evicted == 0);
}

TEST_CASE("create rejects a store cap below 2 or above 2^32") {
  auto error = [](std::size_t cap) {
    auto limiter = Limiter::create({{.requests = 1, .period = 1s}},
                                   {.max_keys_per_shard = cap, .seed = 1}, sluice::ManualClock());
    REQUIRE_FALSE(limiter.ok());
    CHECK(limiter.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(limiter.status().message());
  };
  CHECK(error(1) == "max_keys_per_shard must be in [2, 2^32], got 1");
  CHECK(error((std::size_t{1} << 32) + 1) ==
        "max_keys_per_shard must be in [2, 2^32], got 4294967297");
  CHECK(error(std::numeric_limits<std::size_t>::max()) ==
        "max_keys_per_shard must be in [2, 2^32], got 18446744073709551615");
}
