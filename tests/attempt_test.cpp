#include "sluice/attempt.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "sluice/clock.hpp"

using namespace std::chrono_literals;
using Limiter = sluice::AttemptLimiter<sluice::ManualClock>;
using sluice::AttemptDecision;
using sluice::AttemptReason;

namespace {

// 1 s after the first failure, doubling up to 8 s; failures forgotten after 1 h; 30 s leases.
constexpr sluice::AttemptPolicy kPolicy{
    .initial_delay = 1s, .delay_cap = 8s, .quiet_period = 1h, .lease = 30s};
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

Limiter make(sluice::ManualClock clock, sluice::AttemptPolicy policy = kPolicy,
             sluice::StoreOptions options = {.seed = 7}) {
  auto limiter = Limiter::create(policy, options, clock);
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

AttemptDecision begin(Limiter& limiter, std::string_view subject = "alice") {
  absl::StatusOr<AttemptDecision> d = limiter.begin(subject);
  REQUIRE(d.ok());
  return *d;
}

// Begins an attempt that must be admitted and fails it.
void fail_once(Limiter& limiter, std::string_view subject = "alice") {
  AttemptDecision d = begin(limiter, subject);
  REQUIRE(d.admitted());
  REQUIRE(limiter.fail(d.receipt).ok());
}

// The documented memory: one record is one 64-byte store slot (digest and cell).
static_assert(sizeof(sluice::ShardedStore<sluice::detail::AttemptCell>::Slot) == 64);

}  // namespace

TEST_CASE("a policy needs positive durations with initial <= cap <= quiet") {
  using P = sluice::AttemptPolicy;
  CHECK(kPolicy.validate().ok());
  CHECK(P{.initial_delay = 0s, .delay_cap = 8s, .quiet_period = 1h, .lease = 30s}
            .validate()
            .message() == "attempt policy: initial_delay must be > 0, got 0ns");
  CHECK(P{.initial_delay = 1s, .delay_cap = 8s, .quiet_period = 1h, .lease = -1ns}
            .validate()
            .message() == "attempt policy: lease must be > 0, got -1ns");
  CHECK(P{.initial_delay = 9s, .delay_cap = 8s, .quiet_period = 1h, .lease = 30s}
            .validate()
            .message() == "attempt policy: delay_cap must be >= initial_delay");
  CHECK(P{.initial_delay = 1s, .delay_cap = 8s, .quiet_period = 7s, .lease = 30s}
            .validate()
            .message() == "attempt policy: quiet_period must be >= delay_cap");
  CHECK(Limiter::create(P{}, {}, sluice::ManualClock()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the fingerprint changes with every parameter") {
  const std::uint64_t base = kPolicy.fingerprint();
  sluice::AttemptPolicy p = kPolicy;
  CHECK(p.fingerprint() == base);
  p.initial_delay = 2s;
  CHECK(p.fingerprint() != base);
  p = kPolicy;
  p.delay_cap = 9s;
  CHECK(p.fingerprint() != base);
  p = kPolicy;
  p.quiet_period = 2h;
  CHECK(p.fingerprint() != base);
  p = kPolicy;
  p.lease = 31s;
  CHECK(p.fingerprint() != base);
}

TEST_CASE("the delay doubles from the initial delay and stops at the cap") {
  CHECK(kPolicy.delay_after(0) == 0s);
  CHECK(kPolicy.delay_after(1) == 1s);
  CHECK(kPolicy.delay_after(2) == 2s);
  CHECK(kPolicy.delay_after(3) == 4s);
  CHECK(kPolicy.delay_after(4) == 8s);
  CHECK(kPolicy.delay_after(5) == 8s);
  CHECK(kPolicy.delay_after(64) == 8s);
  CHECK(kPolicy.delay_after(std::uint64_t{1} << 63) == 8s);
  CHECK(kPolicy.delay_after(std::numeric_limits<std::uint64_t>::max()) == 8s);
}

TEST_CASE("delay arithmetic saturates at the cap for the largest durations") {
  const sluice::AttemptPolicy huge{.initial_delay = 1ns,
                                   .delay_cap = std::chrono::nanoseconds::max(),
                                   .quiet_period = std::chrono::nanoseconds::max(),
                                   .lease = std::chrono::nanoseconds::max()};
  REQUIRE(huge.validate().ok());
  CHECK(huge.delay_after(63) == std::chrono::nanoseconds{std::int64_t{1} << 62});
  CHECK(huge.delay_after(64) == std::chrono::nanoseconds::max());
  CHECK(huge.delay_after(std::uint64_t{1} << 63) == std::chrono::nanoseconds::max());
  const sluice::AttemptPolicy big_start{.initial_delay = std::chrono::nanoseconds{kMax / 2 + 1},
                                        .delay_cap = std::chrono::nanoseconds::max(),
                                        .quiet_period = std::chrono::nanoseconds::max(),
                                        .lease = 1s};
  CHECK(big_start.delay_after(1) == std::chrono::nanoseconds{kMax / 2 + 1});
  CHECK(big_start.delay_after(2) == std::chrono::nanoseconds::max());
}

TEST_CASE("each failure doubles the wait before the next attempt, up to the cap") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  const std::chrono::nanoseconds expected[] = {1s, 2s, 4s, 8s, 8s, 8s};
  std::uint64_t failures = 0;
  for (std::chrono::nanoseconds wait : expected) {
    fail_once(limiter);
    ++failures;
    CHECK(begin(limiter) == AttemptDecision{.reason = AttemptReason::kBackoff,
                                            .retry_after = wait,
                                            .failures = failures});
    clock.advance(wait - 1ns);
    CHECK(begin(limiter).retry_after == 1ns);
    clock.advance(1ns);
  }
  CHECK(begin(limiter).admitted());
}

TEST_CASE("a succeeded subject's room goes to a new subject while another's failures last") {
  // One shard of two records: a failing subject (live for the quiet period) ahead of a user who
  // logged in; the succeeded record is idle, and a new subject takes its room.
  sluice::ManualClock clock;
  constexpr sluice::AttemptPolicy kShortLease{
      .initial_delay = 1s, .delay_cap = 8s, .quiet_period = 1h, .lease = 30s};
  const std::uint64_t seed = 7;
  auto limiter = sluice::AttemptLimiter<sluice::ManualClock>::create(
      kShortLease, {.max_keys_per_shard = 2, .seed = seed}, clock);
  REQUIRE(limiter.ok());
  const std::uint64_t fingerprint = kShortLease.fingerprint();
  sluice::ShardedStore<sluice::detail::AttemptCell> probe(
      {.seed = XXH3_64bits_withSeed(&fingerprint, sizeof fingerprint, seed)});
  std::vector<std::string> subjects;  // three subjects of one shard
  for (int i = 0; subjects.size() < 3; ++i) {
    std::string s = "user:" + std::to_string(i);
    if (subjects.empty() ||
        probe.shard_index(probe.digest(s)) == probe.shard_index(probe.digest(subjects[0]))) {
      subjects.push_back(s);
    }
  }
  absl::StatusOr<sluice::AttemptDecision> attacker = limiter->begin(subjects[0]);
  REQUIRE(attacker.ok());
  clock.advance(1s);
  REQUIRE(limiter->fail(attacker->receipt).ok());  // live for an hour
  absl::StatusOr<sluice::AttemptDecision> user = limiter->begin(subjects[1]);
  REQUIRE(user.ok());
  clock.advance(1s);
  REQUIRE(limiter->succeed(user->receipt).ok());
  clock.advance(1s);
  absl::StatusOr<sluice::AttemptDecision> newcomer = limiter->begin(subjects[2]);
  REQUIRE(newcomer.ok());
  CHECK(newcomer->reason == sluice::AttemptReason::kAdmitted);
}

TEST_CASE("a success clears the failures") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  fail_once(limiter);
  clock.advance(1s);
  fail_once(limiter);
  clock.advance(2s);
  AttemptDecision d = begin(limiter);
  REQUIRE(d.admitted());
  CHECK(d.failures == 2);
  REQUIRE(limiter.succeed(d.receipt).ok());
  AttemptDecision next = begin(limiter);
  CHECK(next.admitted());
  CHECK(next.failures == 0);
  REQUIRE(limiter.fail(next.receipt).ok());
  CHECK(begin(limiter).retry_after == 1s);  // the sequence starts over
}

TEST_CASE("abandoning an attempt counts as a failure") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  AttemptDecision d = begin(limiter);
  REQUIRE(limiter.abandon(d.receipt).ok());
  CHECK(begin(limiter) ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 1s, .failures = 1});
}

TEST_CASE("a subject has at most one attempt in flight") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  AttemptDecision first = begin(limiter);
  REQUIRE(first.admitted());
  CHECK(first.receipt.token() == 1);
  clock.advance(10s);
  CHECK(begin(limiter) ==
        AttemptDecision{.reason = AttemptReason::kAttemptActive, .retry_after = 20s});
  CHECK(begin(limiter, "bob").admitted());  // other subjects are independent
  REQUIRE(limiter.succeed(first.receipt).ok());
  AttemptDecision second = begin(limiter);
  CHECK(second.admitted());
  CHECK(second.receipt.token() == 2);
}

TEST_CASE("an attempt not completed within its lease fails at the lease deadline") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  AttemptDecision d = begin(limiter);
  clock.advance(30s - 1ns);
  CHECK(begin(limiter).reason == AttemptReason::kAttemptActive);
  clock.advance(1ns);  // the deadline: the attempt failed now; the backoff runs from here
  CHECK(begin(limiter) ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 1s, .failures = 1});
  CHECK(limiter.succeed(d.receipt).code() == absl::StatusCode::kFailedPrecondition);
  clock.advance(10s);  // noticed late: the failure still dates from the deadline
  CHECK(begin(limiter).admitted());
}

TEST_CASE("a late completion cannot change a newer attempt") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  AttemptDecision old = begin(limiter);
  clock.advance(31s);  // old's lease expired at 30 s (1 failure, backoff until 31 s)
  AttemptDecision current = begin(limiter);
  REQUIRE(current.admitted());
  CHECK(current.failures == 1);
  CHECK(limiter.succeed(old.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(limiter.fail(old.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(limiter.abandon(old.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(begin(limiter).reason == AttemptReason::kAttemptActive);  // current is untouched
  REQUIRE(limiter.fail(current.receipt).ok());
  CHECK(begin(limiter) ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 2s, .failures = 2});
}

TEST_CASE("a receipt completes its attempt once") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  AttemptDecision d = begin(limiter);
  REQUIRE(limiter.fail(d.receipt).ok());
  CHECK(limiter.succeed(d.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(begin(limiter).failures == 1);
}

TEST_CASE("a receipt completed in the nanosecond it began cannot complete the next attempt") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  AttemptDecision first = begin(limiter);
  REQUIRE(limiter.succeed(first.receipt).ok());
  AttemptDecision second = begin(limiter);  // same nanosecond, new token
  REQUIRE(second.admitted());
  CHECK(limiter.succeed(first.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(begin(limiter).reason == AttemptReason::kAttemptActive);
}

TEST_CASE("receipts of another limiter and empty receipts are refused") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  Limiter other = make(clock, kPolicy, {.seed = 8});
  AttemptDecision d = begin(other);
  REQUIRE(begin(limiter).admitted());
  CHECK(limiter.fail(d.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(limiter.fail(sluice::AttemptReceipt()).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("failures are forgotten exactly a quiet period after the last failure") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  fail_once(limiter, "alice");
  fail_once(limiter, "bob");
  clock.advance(1h - 1ns);
  CHECK(begin(limiter, "alice").failures == 1);  // one ns early: remembered
  clock.advance(1ns);
  AttemptDecision d = begin(limiter, "bob");
  CHECK(d.admitted());
  CHECK(d.failures == 0);
}

TEST_CASE("a lease longer than the quiet period keeps the state alive") {
  sluice::ManualClock clock;
  Limiter limiter =
      make(clock, {.initial_delay = 1s, .delay_cap = 8s, .quiet_period = 1min, .lease = 1h});
  fail_once(limiter);
  clock.advance(1s);
  AttemptDecision d = begin(limiter);
  REQUIRE(d.admitted());
  clock.advance(59min);  // far past the quiet period, inside the lease
  CHECK(begin(limiter) == AttemptDecision{.reason = AttemptReason::kAttemptActive,
                                          .retry_after = 1min,
                                          .failures = 1});
  REQUIRE(limiter.fail(d.receipt).ok());
  CHECK(begin(limiter) ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 2s, .failures = 2});
}

TEST_CASE("a clock that goes backwards does not shorten a backoff") {
  sluice::ManualClock clock(100s);
  Limiter limiter = make(clock);
  fail_once(limiter);
  clock.set(0s);
  CHECK(begin(limiter) ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 1s, .failures = 1});
}

TEST_CASE("the failure count saturates") {
  sluice::detail::AttemptCell cell;
  cell.active = true;
  cell.lease_end = 10;
  cell.quiet_end = 100;
  cell.failures = std::numeric_limits<std::uint32_t>::max();
  cell.settle(10);
  CHECK_FALSE(cell.active);
  CHECK(cell.failures == std::numeric_limits<std::uint32_t>::max());
  CHECK(sluice::kMaxAttemptFailures == std::numeric_limits<std::uint32_t>::max());
}

TEST_CASE("the largest durations and clock readings neither overflow nor wrap") {
  const std::int64_t late = std::int64_t{1} << 62;  // the latest supported clock reading
  sluice::ManualClock clock(std::chrono::nanoseconds{late});
  Limiter limiter = make(clock, {.initial_delay = 1ns,
                                 .delay_cap = std::chrono::nanoseconds::max(),
                                 .quiet_period = std::chrono::nanoseconds::max(),
                                 .lease = std::chrono::nanoseconds::max()});
  AttemptDecision d = begin(limiter);
  REQUIRE(d.admitted());
  CHECK(begin(limiter) == AttemptDecision{.reason = AttemptReason::kAttemptActive,
                                          .retry_after = std::chrono::nanoseconds{kMax - late}});
  REQUIRE(limiter.fail(d.receipt).ok());
  CHECK(begin(limiter) ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 1ns, .failures = 1});
  clock.set(std::chrono::nanoseconds::max());  // saturated to 2^62: still 1 ns short
  CHECK(begin(limiter).retry_after == 1ns);
}

TEST_CASE("waits from the earliest clock reading saturate instead of overflowing") {
  sluice::ManualClock clock(std::chrono::nanoseconds{-(std::int64_t{1} << 62)});
  Limiter limiter = make(clock, {.initial_delay = std::chrono::nanoseconds::max(),
                                 .delay_cap = std::chrono::nanoseconds::max(),
                                 .quiet_period = std::chrono::nanoseconds::max(),
                                 .lease = std::chrono::nanoseconds::max()});
  AttemptDecision d = begin(limiter);
  REQUIRE(d.admitted());
  CHECK(begin(limiter) == AttemptDecision{.reason = AttemptReason::kAttemptActive,
                                          .retry_after = std::chrono::nanoseconds::max()});
  REQUIRE(limiter.fail(d.receipt).ok());
  CHECK(begin(limiter) == AttemptDecision{.reason = AttemptReason::kBackoff,
                                          .retry_after = std::chrono::nanoseconds::max(),
                                          .failures = 1});
}

TEST_CASE(
    "a full store at the latest clock reading with the longest leases reports a finite wait") {
  const std::int64_t late = std::int64_t{1} << 62;
  sluice::ManualClock clock(std::chrono::nanoseconds{late});
  Limiter limiter = make(clock,
                         {.initial_delay = 1ns,
                          .delay_cap = std::chrono::nanoseconds::max(),
                          .quiet_period = std::chrono::nanoseconds::max(),
                          .lease = std::chrono::nanoseconds::max()},
                         {.max_keys_per_shard = 2, .seed = 7});
  AttemptDecision full;
  for (int i = 0; i < 1000 && full.reason != AttemptReason::kStoreFull; ++i) {
    full = begin(limiter, "user" + std::to_string(i));
  }
  // Every record is leased "forever": its wait is saturated at 2^62 − 1 ns, not overflowed.
  CHECK(full == AttemptDecision{.reason = AttemptReason::kStoreFull,
                                .retry_after = std::chrono::nanoseconds{late - 1}});
}

TEST_CASE("a full store denies new subjects and never evicts failure state") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock, kPolicy, {.max_keys_per_shard = 2, .seed = 7});
  // 64 shards of 2 records: among 129 subjects at least one finds its shard full.
  std::vector<std::string> admitted;
  std::string denied;
  for (int i = 0; i < 1000 && denied.empty(); ++i) {
    const std::string subject = "user" + std::to_string(i);
    AttemptDecision d = begin(limiter, subject);
    if (d.reason == AttemptReason::kStoreFull) {
      // Every record of that shard failed at 0 s and is remembered for 1 h.
      CHECK(d == AttemptDecision{.reason = AttemptReason::kStoreFull, .retry_after = 1h});
      denied = subject;
    } else {
      REQUIRE(d.admitted());
      REQUIRE(limiter.fail(d.receipt).ok());
      admitted.push_back(subject);
    }
  }
  REQUIRE_FALSE(denied.empty());
  CHECK(limiter.stats().capacity_denials == 1);
  CHECK(limiter.stats().live_evicted == 0);
  for (const std::string& subject : admitted) {  // every tracked subject keeps its failure
    CHECK(begin(limiter, subject) ==
          AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 1s, .failures = 1});
  }
  clock.advance(1h);  // every failure (at 0 s) is forgotten: the shard has room again
  CHECK(begin(limiter, denied).admitted());
}

TEST_CASE("threads beginning on one subject with a frozen clock get exactly one receipt") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  constexpr int kThreads = 8;
  std::atomic<int> admitted{0};
  std::atomic<int> active{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      while (!go.load()) {
      }
      for (int i = 0; i < 100; ++i) {
        absl::StatusOr<AttemptDecision> d = limiter.begin("alice");
        if (d.ok() && d->admitted()) admitted.fetch_add(1);
        if (d.ok() && d->reason == AttemptReason::kAttemptActive) active.fetch_add(1);
      }
    });
  }
  go.store(true);
  for (std::thread& thread : threads) thread.join();
  CHECK(admitted.load() == 1);
  CHECK(active.load() == kThreads * 100 - 1);
}

TEST_CASE("a denied attempt answers with Retry-After in whole seconds, rounded up") {
  const AttemptDecision denied{.reason = AttemptReason::kBackoff, .retry_after = 1500ms};
  CHECK(sluice::attempt_fields(denied) ==
        sluice::HttpFields{{sluice::kRetryAfterField, std::string("2")}});
  const AttemptDecision brief{.reason = AttemptReason::kAttemptActive, .retry_after = 1ns};
  CHECK(sluice::attempt_fields(brief) ==
        sluice::HttpFields{{sluice::kRetryAfterField, std::string("1")}});
  CHECK(sluice::attempt_fields(AttemptDecision{}).empty());
}

TEST_CASE("inspecting an unknown subject reports an admission and stores nothing") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  absl::StatusOr<AttemptDecision> d = limiter.inspect("alice");
  REQUIRE(d.ok());
  CHECK(*d == AttemptDecision{});  // admitted, no receipt, no wait, no failures
  CHECK_FALSE(d->receipt.valid());
  CHECK(limiter.stats().size == 0);
  CHECK(begin(limiter).receipt.token() == 1);  // no attempt was counted
}

TEST_CASE("inspecting reports the backoff and failures without changing them") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  fail_once(limiter);
  clock.advance(1s);
  fail_once(limiter);  // 2 failures: wait 2 s from 1 s
  clock.advance(500ms);
  const AttemptDecision expected{
      .reason = AttemptReason::kBackoff, .retry_after = 1500ms, .failures = 2};
  CHECK(*limiter.inspect("alice") == expected);
  CHECK(*limiter.inspect("alice") == expected);
  CHECK(begin(limiter) == expected);
  clock.advance(1500ms);
  AttemptDecision d = begin(limiter);
  CHECK(d.admitted());
  CHECK(d.failures == 2);
  CHECK(d.receipt.token() == 3);
}

TEST_CASE("inspecting an attempt in flight takes no lease and records no lapsed lease") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  AttemptDecision d = begin(limiter);
  clock.advance(10s);
  CHECK(*limiter.inspect("alice") ==
        AttemptDecision{.reason = AttemptReason::kAttemptActive, .retry_after = 20s});
  REQUIRE(limiter.fail(d.receipt).ok());  // the receipt is still the active attempt's
  clock.advance(1s);
  AttemptDecision second = begin(limiter);
  REQUIRE(second.admitted());
  clock.advance(30s);  // second's lease lapsed now: counted in the answer, not written
  const AttemptDecision lapsed{.reason = AttemptReason::kBackoff, .retry_after = 2s, .failures = 2};
  CHECK(*limiter.inspect("alice") == lapsed);
  CHECK(*limiter.inspect("alice") == lapsed);
  CHECK(begin(limiter) == lapsed);  // one failure for the lapsed lease, not one per look
}

TEST_CASE("a reset clears the backoff: the next attempt is decided as for a new subject") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  fail_once(limiter);
  clock.advance(1s);
  fail_once(limiter);
  clock.advance(2s);
  fail_once(limiter);
  clock.advance(3s);
  REQUIRE(begin(limiter) ==
          AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 1s, .failures = 3});
  REQUIRE(limiter.reset("alice").ok());
  CHECK(limiter.stats().size == 0);  // its room is free at once
  CHECK(*limiter.inspect("alice") == AttemptDecision{});
  AttemptDecision d = begin(limiter);
  CHECK(d.admitted());
  CHECK(d.failures == 0);
  REQUIRE(limiter.fail(d.receipt).ok());
  CHECK(begin(limiter) ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 1s, .failures = 1});
}

TEST_CASE("a receipt of the attempt in flight at a reset is stale and recreates no failure") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  fail_once(limiter);
  clock.advance(1s);
  AttemptDecision in_flight = begin(limiter);
  REQUIRE(in_flight.admitted());
  clock.advance(1s);
  REQUIRE(limiter.reset("alice").ok());
  clock.advance(1s);
  CHECK(limiter.fail(in_flight.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(limiter.abandon(in_flight.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(limiter.succeed(in_flight.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(limiter.stats().size == 0);
  CHECK(*limiter.inspect("alice") == AttemptDecision{});
  AttemptDecision next = begin(limiter);
  REQUIRE(next.admitted());
  CHECK(next.failures == 0);
  CHECK(limiter.fail(in_flight.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(begin(limiter) ==
        AttemptDecision{.reason = AttemptReason::kAttemptActive, .retry_after = 30s});
}

TEST_CASE("a reset in the nanosecond of a begin keeps that begin's receipt stale") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  AttemptDecision first = begin(limiter);
  REQUIRE(limiter.reset("alice").ok());
  AttemptDecision second = begin(limiter);  // same nanosecond: the record kept its token
  REQUIRE(second.admitted());
  CHECK(second.receipt.token() == 2);
  CHECK(limiter.fail(first.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(begin(limiter) ==
        AttemptDecision{.reason = AttemptReason::kAttemptActive, .retry_after = 30s});
}

TEST_CASE("resetting an unknown subject is OK and stores nothing") {
  sluice::ManualClock clock;
  Limiter limiter = make(clock);
  CHECK(limiter.reset("nobody").ok());
  CHECK(limiter.stats().size == 0);
}
