#include "sluice/fixed_window.hpp"

#include <cstddef>
#include <string>
#include <vector>

#include "catch.hpp"
#include "sluice/clock.hpp"

using namespace std::chrono_literals;
using Limiter = sluice::FixedWindowLimiter<sluice::ManualClock>;
using sluice::Reason;

namespace {

Limiter make(std::vector<sluice::FixedWindow> windows, sluice::ManualClock clock) {
  auto limiter = Limiter::create(std::move(windows), {.seed = 1}, clock);
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

sluice::Decision check(Limiter& limiter, std::uint64_t cost = 1) {
  auto d = limiter.check("k", cost);
  REQUIRE(d.ok());
  return *d;
}

}  // namespace

TEST_CASE("a fixed window is anchored at the first admitted request and reopens exactly") {
  sluice::ManualClock clock(300ms);
  Limiter limiter = make({{.limit = 2, .window = 1s}}, clock);
  CHECK(
      check(limiter) ==
      sluice::Decision{.reason = Reason::kAllowed, .limit = 2, .remaining = 1, .reset_after = 1s});
  clock.advance(500ms);
  CHECK(check(limiter).remaining == 0);
  sluice::Decision denied = check(limiter);
  CHECK(denied == sluice::Decision{.reason = Reason::kQuotaExceeded,
                                   .limit = 2,
                                   .remaining = 0,
                                   .retry_after = 500ms,
                                   .reset_after = 500ms});
  clock.set(1300ms - 1ns);  // anchor + window − 1 ns: still the first window
  CHECK(check(limiter).retry_after == 1ns);
  clock.set(1300ms);
  sluice::Decision reopened = check(limiter);
  CHECK(reopened.allowed());
  CHECK(reopened.reset_after == 1s);  // the new window is anchored here
}

TEST_CASE("a fixed-window denial consumes nothing in any window") {
  sluice::ManualClock clock;
  Limiter limiter = make({{.limit = 2, .window = 1s}, {.limit = 3, .window = 1min}}, clock);
  check(limiter);
  check(limiter);
  for (int i = 0; i < 10; ++i) CHECK(check(limiter).reason == Reason::kQuotaExceeded);
  clock.advance(1s);
  sluice::Decision third = check(limiter);
  CHECK(third.allowed());  // the minute window saw only the two admitted requests
  CHECK(third.binding_window == 1);
  CHECK(third.remaining == 0);
}

TEST_CASE("stacked minute and day windows bind the first denying and wait for the longest") {
  sluice::ManualClock clock;
  Limiter limiter = make({{.limit = 7, .window = 24h}, {.limit = 5, .window = 1min}}, clock);
  for (int i = 0; i < 5; ++i) REQUIRE(check(limiter).allowed());
  sluice::Decision minute = check(limiter);
  CHECK(minute.reason == Reason::kQuotaExceeded);
  CHECK(minute.binding_window == 0);  // sorted: the minute window comes first
  CHECK(minute.retry_after == 1min);
  clock.advance(1min);
  CHECK(check(limiter).allowed());
  sluice::Decision last = check(limiter);
  CHECK(last.allowed());
  CHECK(last.binding_window == 1);
  CHECK(last.remaining == 0);
  clock.advance(1min);
  sluice::Decision day = check(limiter);
  CHECK(day.reason == Reason::kQuotaExceeded);
  CHECK(day.binding_window == 1);
  CHECK(day.retry_after == 24h - 2min);
}

TEST_CASE("a fixed-window peek reports and a cost above the limit is an error") {
  sluice::ManualClock clock;
  Limiter limiter = make({{.limit = 4, .window = 1s}}, clock);
  CHECK(check(limiter, 0) ==
        sluice::Decision{.reason = Reason::kAllowed, .limit = 4, .remaining = 4});
  CHECK(limiter.stats().size == 0);
  check(limiter, 3);
  CHECK(check(limiter, 0).remaining == 1);
  auto error = limiter.check("k", 5);
  REQUIRE_FALSE(error.ok());
  CHECK(error.status().message() ==
        "cost 5 exceeds the burst 4 of window 0 and can never be admitted");
  CHECK(check(limiter, 0).remaining == 1);
}

TEST_CASE("a fixed window does not reopen when the clock goes backwards") {
  sluice::ManualClock clock(10s);
  Limiter limiter = make({{.limit = 1, .window = 1s}}, clock);
  check(limiter);
  clock.set(1s);
  CHECK(check(limiter).retry_after == 1s);
}

TEST_CASE("fixed-window create rejects bad windows naming the bad value") {
  sluice::ManualClock clock;
  auto error = [&](std::vector<sluice::FixedWindow> windows) {
    auto limiter = Limiter::create(std::move(windows), {}, clock);
    REQUIRE_FALSE(limiter.ok());
    return std::string(limiter.status().message());
  };
  CHECK(error({}) == "windows must not be empty");
  CHECK(error({{.limit = 0, .window = 1s}}) == "windows[0].limit must be in [1, 2^62], got 0");
  CHECK(error({{.limit = 1, .window = 1s}, {.limit = 1, .window = 0s}}) ==
        "windows[1].window must be > 0, got 0ns");
}

TEST_CASE("fixed-window create rejects a store cap that could wrap") {
  auto limiter = Limiter::create({{.limit = 1, .window = 1s}},
                                 {.max_keys_per_shard = std::size_t{1} << 62, .seed = 1},
                                 sluice::ManualClock());
  REQUIRE_FALSE(limiter.ok());
  CHECK(limiter.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(limiter.status().message() ==
        "max_keys_per_shard must be in [2, 2^32], got " + std::to_string(std::size_t{1} << 62));
}

TEST_CASE("a key carried into an added window is reclaimed once its carried window ends") {
  // A reload that adds a window carries each key with the added window empty. That key must go
  // idle (and give its room to a new key of a full shard) when its carried window ends.
  sluice::ManualClock clock(100s);
  const sluice::StoreOptions options{
      .max_keys_per_shard = 2, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1};
  auto before = Limiter::create({{.limit = 10, .window = 1s}}, options, clock);
  auto after =
      Limiter::create({{.limit = 10, .window = 1s}, {.limit = 10, .window = 1h}}, options, clock);
  REQUIRE(before.ok());
  REQUIRE(after.ok());
  const sluice::ShardedStore<sluice::detail::FixedWindowCell<1>> probe({.seed = 1});
  std::vector<std::string> keys;  // three keys of one shard
  for (int i = 0; keys.size() < 3; ++i) {
    const std::string key = "key-" + std::to_string(i);
    if (keys.empty() ||
        probe.shard_index(probe.digest(key)) == probe.shard_index(probe.digest(keys[0]))) {
      keys.push_back(key);
    }
  }
  REQUIRE(before->check(keys[0]).ok());
  after->carry_from(*before);  // keys[0]: 1 of 10 in its 1 s window, until 101 s
  clock.advance(2s);           // keys[0] is idle: its only counted window ended at 101 s
  REQUIRE(after->check(keys[1])->allowed());
  const absl::StatusOr<sluice::Decision> third = after->check(keys[2]);
  REQUIRE(third.ok());
  CHECK(third->reason == Reason::kAllowed);  // takes the idle key's room
  CHECK(after->stats().capacity_denials == 0);
}

TEST_CASE("a key carried into a lower limit reports no room left and no wrapped count") {
  sluice::ManualClock clock(100s);
  auto before = Limiter::create({{.limit = 100, .window = 1min}}, {.seed = 1}, clock);
  auto after = Limiter::create({{.limit = 50, .window = 1min}}, {.seed = 1}, clock);
  REQUIRE(before.ok());
  REQUIRE(after.ok());
  REQUIRE(before->check("k", 80)->allowed());
  after->carry_from(*before);  // 80 counted, against a limit of 50 now
  clock.advance(10s);
  const absl::StatusOr<sluice::Decision> denied = after->check("k");
  REQUIRE(denied.ok());
  CHECK(*denied == sluice::Decision{.reason = Reason::kQuotaExceeded,
                                    .limit = 50,
                                    .remaining = 0,
                                    .retry_after = 50s,
                                    .reset_after = 50s});
  CHECK(after->inspect("k") ==
        sluice::Decision{
            .reason = Reason::kAllowed, .limit = 50, .remaining = 0, .reset_after = 50s});
}
