// reserve, cancel, wait, check_estimated and settle over Redis, against a real redis-server the
// test starts, and their parity with the in-memory GcraLimiter on the same scripted inputs.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "redis_fixture.hpp"
#include "sluice/clock.hpp"
#include "sluice/gcra.hpp"
#include "sluice/redis.hpp"

namespace {

using sluice::Decision;
using sluice::GcraWindow;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using Memory = sluice::GcraLimiter<sluice::ManualClock>;
using Redis = sluice::redis::RedisGcraLimiter;

constexpr nanoseconds kT0 = seconds(1'700'000'000);  // a server time, ns since the Unix epoch

// Its keys outlive their windows by an hour (sluice_test::hold_keys): the parity scripts decide at
// hooked times while the server expires keys by real time.
// `clock`, when given, is the client's time source (ns since the Unix epoch); else the server's
// TIME.
Redis make_redis(const sluice_test::RedisFixture& server, std::vector<GcraWindow> windows,
                 std::optional<sluice::ManualClock> clock = std::nullopt) {
  sluice::redis::ClientOptions options = server.options();
  if (clock) options.time_source = [clock] { return clock->now(); };
  auto made = sluice::redis::Client::create(options);
  REQUIRE(made.ok());
  std::shared_ptr<sluice::redis::Client> client = *std::move(made);
  sluice_test::hold_keys(*client);
  auto limiter = Redis::create(std::move(windows), std::move(client));
  INFO(limiter.status());
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

Memory make_memory(sluice::ManualClock clock, std::vector<GcraWindow> windows) {
  auto limiter = Memory::create(std::move(windows), {.seed = 1}, std::move(clock));
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

// A random script of checks, reservations, cancels, estimated checks and settles (up and down),
// resets and clock moves on one key, applied to both limiters at the same times.
void expect_same_script(const sluice_test::RedisFixture& server,
                        const std::vector<GcraWindow>& windows, std::uint64_t seed, int steps) {
  sluice::ManualClock clock(kT0);
  Memory memory = make_memory(clock, windows);
  Redis redis = make_redis(server, windows, clock);
  const std::string key = "script-" + std::to_string(seed);
  std::uint64_t max_cost = ~std::uint64_t{0};
  for (const GcraWindow& w : memory.windows()) max_cost = std::min(max_cost, w.burst);
  std::mt19937_64 random(seed);
  std::vector<std::pair<Memory::Reservation, Redis::Reservation>> reservations;
  std::vector<std::pair<Memory::Receipt, Redis::Receipt>> receipts;
  std::string trace;
  for (int step = 0; step < steps; ++step) {
    INFO("step " << step << " after " << trace);
    const std::uint64_t cost = 1 + random() % max_cost;
    const auto op = random() % 9;
    trace += std::to_string(op) + (op == 0 ? "" : "/" + std::to_string(cost)) + " ";
    switch (op) {
      case 0:
        clock.advance(nanoseconds{static_cast<std::int64_t>(random() % 900'000'000)});
        break;
      case 1: {
        auto a = memory.check(key, cost);
        auto b = redis.check(key, cost);
        INFO(b.status());
        REQUIRE(b.ok());
        REQUIRE(*a == *b);
        break;
      }
      case 2: {
        const nanoseconds max_wait{static_cast<std::int64_t>(random() % 3'000'000'000)};
        auto a = memory.reserve(key, cost, max_wait);
        auto b = redis.reserve(key, cost, max_wait);
        INFO(a.status() << " / " << b.status());
        REQUIRE(a.status().code() == b.status().code());
        if (a.ok()) {
          REQUIRE(a->wait() == b->wait());
          REQUIRE(a->instant() == b->instant());
          reservations.emplace_back(*std::move(a), *std::move(b));
        }
        break;
      }
      case 3:
        if (!reservations.empty()) {
          const std::size_t i = random() % reservations.size();
          auto b = redis.cancel(reservations[i].second);
          INFO(b.status());
          REQUIRE(b.ok());
          REQUIRE(memory.cancel(reservations[i].first) == *b);
          reservations.erase(reservations.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
      case 4: {
        const std::uint64_t estimate = random() % (max_cost + 1);
        auto a = memory.check_estimated(key, estimate);
        auto b = redis.check_estimated(key, estimate);
        INFO(b.status());
        REQUIRE(b.ok());
        REQUIRE(a->decision == b->decision);
        REQUIRE(a->receipt.open() == b->receipt.open());
        if (a->receipt.open()) receipts.emplace_back(std::move(a->receipt), std::move(b->receipt));
        break;
      }
      case 5:
        if (!receipts.empty()) {
          const std::size_t i = random() % receipts.size();
          const std::uint64_t actual = random() % (3 * max_cost + 1);
          auto a = memory.settle(receipts[i].first, actual);
          auto b = redis.settle(receipts[i].second, actual);
          INFO(b.status());
          REQUIRE(a.ok());
          REQUIRE(b.ok());
          REQUIRE(*a == *b);
          receipts.erase(receipts.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
      case 6:
        if (random() % 4 == 0) {
          memory.reset(key);
          REQUIRE(redis.reset(key).ok());
        }
        break;
      default: {
        auto b = redis.inspect(key);
        REQUIRE(b.ok());
        REQUIRE(memory.inspect(key) == *b);
      }
    }
  }
}

}  // namespace

TEST_CASE("over Redis, reservations, cancels and settles answer as in memory, step for step") {
  sluice_test::RedisFixture server;
  expect_same_script(server, {{.requests = 3, .period = seconds(1)}}, 1, 1500);
  expect_same_script(server, {{.requests = 3, .period = seconds(1), .burst = 6}}, 2, 1500);
  expect_same_script(server,
                     {{.requests = 2, .period = seconds(1)},
                      {.requests = 7, .period = seconds(10)},
                      {.requests = 100, .period = std::chrono::minutes(1), .burst = 10}},
                     3, 1500);
}

TEST_CASE("over Redis, a reservation waits at the server's clock and its cancel gives it back") {
  sluice_test::RedisFixture server;
  Redis limiter = make_redis(server, {{.requests = 1, .period = seconds(60)}});
  auto first = limiter.reserve("k");
  REQUIRE(first.ok());
  CHECK(first->wait() == nanoseconds{0});
  auto second = limiter.reserve("k");
  REQUIRE(second.ok());
  // The server's clock moved a little between the two calls.
  CHECK(second->wait() > seconds(59));
  CHECK(second->wait() <= seconds(60));
  CHECK(limiter.reserve("k", 1, seconds(1)).status().code() == absl::StatusCode::kDeadlineExceeded);
  auto cancelled = limiter.cancel(*second);
  REQUIRE(cancelled.ok());
  CHECK(*cancelled);
  CHECK_FALSE(second->cancellable());
  auto again = limiter.cancel(*second);
  REQUIRE(again.ok());
  CHECK_FALSE(*again);
  auto third = limiter.reserve("k");
  REQUIRE(third.ok());
  CHECK(third->wait() > seconds(59));  // one booking ahead of it again, not two
  CHECK(limiter.reserve("k", 2).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(limiter.reserve("k", 0).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("over Redis, after a reset an old reservation or receipt gives nothing back") {
  sluice_test::RedisFixture server;
  Redis limiter = make_redis(server, {{.requests = 1, .period = seconds(60), .burst = 5}});
  for (int i = 0; i < 5; ++i) REQUIRE(limiter.check("k")->allowed());
  auto r = limiter.reserve("k", 5);  // a minute or more ahead: it cannot pass during the test
  REQUIRE(r.ok());
  REQUIRE(r->wait() > seconds(60));
  auto e = limiter.check_estimated("other", 5);
  REQUIRE(e.ok());
  REQUIRE(e->decision.allowed());
  REQUIRE(limiter.reset("k").ok());
  REQUIRE(limiter.reset("other").ok());
  for (int i = 0; i < 5; ++i) {
    REQUIRE(limiter.check("k")->allowed());
    REQUIRE(limiter.check("other")->allowed());
  }
  auto cancelled = limiter.cancel(*r);
  REQUIRE(cancelled.ok());
  CHECK(*cancelled);                           // not passed: cancelled...
  CHECK_FALSE(limiter.check("k")->allowed());  // ...but nothing given back
  auto settled = limiter.settle(e->receipt, 0);
  REQUIRE(settled.ok());
  CHECK(settled->remaining == 0);
  CHECK_FALSE(limiter.check("other")->allowed());
}

TEST_CASE("over Redis, a charge past the bucket puts the key in debt, bounded at 2^52 ns") {
  sluice_test::RedisFixture server;
  Redis limiter =
      make_redis(server, {{.requests = 10, .period = seconds(1)}}, sluice::ManualClock(kT0));
  auto e = limiter.check_estimated("k", 2);
  REQUIRE(e.ok());
  auto after = limiter.settle(e->receipt, 25);
  REQUIRE(after.ok());
  CHECK_FALSE(after->allowed());
  CHECK(after->retry_after == std::chrono::milliseconds(1500));
  auto huge = limiter.check_estimated("big", 0);
  REQUIRE(huge.ok());
  auto saturated = limiter.settle(huge->receipt, std::uint64_t{1} << 32);
  REQUIRE(saturated.ok());
  CHECK(saturated->retry_after == nanoseconds{(std::int64_t{1} << 52) - 1'000'000'000});
  // The key still works: the check script accepts the largest debt.
  CHECK_FALSE(limiter.check("big")->allowed());
  CHECK(limiter.reserve("big").status().code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("over Redis, a receipt from before a reset never gives back after it, as in memory") {
  // 100 per second. Two receipts of 50; the earlier one refunds everything, so the key's debt
  // (0.5 s) ends before the later receipt's TAT (1 s). Then a reset, a new client's full bucket,
  // and the later receipt's refund once the debt the key had at the reset has drained (real
  // time: Redis expires keys by its own clock).
  sluice_test::RedisFixture server;
  const std::vector<GcraWindow> windows = {{.requests = 100, .period = seconds(1), .burst = 100}};
  sluice::ManualClock clock(kT0);
  Memory memory = make_memory(clock, windows);
  sluice::redis::ClientOptions options = server.options();
  options.time_source = [clock] { return clock.now(); };
  auto made = Redis::create(windows, options);  // real expiry: no hold_keys
  REQUIRE(made.ok());
  Redis redis = *std::move(made);
  auto memory_early = memory.check_estimated("k", 50);
  auto redis_early = redis.check_estimated("k", 50);
  auto memory_late = memory.check_estimated("k", 50);
  auto redis_late = redis.check_estimated("k", 50);
  REQUIRE(redis_early.ok());
  REQUIRE(redis_late.ok());
  REQUIRE(redis_late->decision == memory_late->decision);
  REQUIRE(*memory.settle(memory_early->receipt, 0) == *redis.settle(redis_early->receipt, 0));
  memory.reset("k");
  REQUIRE(redis.reset("k").ok());
  for (int i = 0; i < 100; ++i) {
    REQUIRE(memory.check("k")->allowed());
    REQUIRE(redis.check("k")->allowed());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // past 0.5 s, before 1 s
  auto memory_refund = memory.settle(memory_late->receipt, 0);
  auto redis_refund = redis.settle(redis_late->receipt, 0);
  REQUIRE(redis_refund.ok());
  CHECK(*redis_refund == *memory_refund);
  int memory_extra = 0, redis_extra = 0;
  for (int i = 0; i < 100; ++i) {
    memory_extra += memory.check("k")->allowed() ? 1 : 0;
    redis_extra += redis.check("k")->allowed() ? 1 : 0;
  }
  CHECK(memory_extra == 0);
  CHECK(redis_extra == memory_extra);
}
