// reset(key) and inspect(key) over Redis, against a real redis-server each test case starts, and
// their parity with the in-memory GcraLimiter on the same inputs.
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"
#include "redis_fixture.hpp"
#include "sluice/clock.hpp"
#include "sluice/gcra.hpp"
#include "sluice/redis.hpp"

namespace {

using sluice::Decision;
using sluice::GcraWindow;
using sluice::Reason;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

constexpr nanoseconds kT0 = seconds(1'700'000'000);  // a server time, ns since the Unix epoch

const std::vector<GcraWindow> kWindows = {{.requests = 3, .period = seconds(1)},
                                          {.requests = 10, .period = seconds(60), .burst = 5}};

// The time of every client made with timed() options: tests set it, then check (the scripts
// decide at it instead of the server's TIME).
sluice::ManualClock server_time(kT0);
sluice::redis::ClientOptions timed(sluice::redis::ClientOptions options) {
  options.time_source = [] { return server_time.now(); };
  return options;
}

sluice::redis::RedisGcraLimiter make_redis(const sluice_test::RedisFixture& server) {
  auto limiter = sluice::redis::RedisGcraLimiter::create(kWindows, timed(server.options()));
  INFO(limiter.status());
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

sluice::GcraLimiter<sluice::ManualClock> make_memory(sluice::ManualClock clock) {
  auto limiter = sluice::GcraLimiter<sluice::ManualClock>::create(kWindows, {.seed = 1}, clock);
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

Decision redis_at(sluice::redis::RedisGcraLimiter& limiter, std::string_view key, nanoseconds t,
                  std::uint64_t cost = 1) {
  server_time.set(t);
  auto d = limiter.check(key, cost);
  INFO(d.status());
  REQUIRE(d.ok());
  return *d;
}

}  // namespace

TEST_CASE("over Redis, reset unblocks a spent key at the server's own time") {
  sluice_test::RedisFixture server;
  sluice::redis::RedisGcraLimiter limiter = make_redis(server);
  for (int i = 0; i < 3; ++i) REQUIRE(limiter.check("k")->allowed());
  REQUIRE(limiter.check("k")->reason == Reason::kQuotaExceeded);
  REQUIRE(limiter.reset("k").ok());
  for (int i = 0; i < 3; ++i) CHECK(limiter.check("k")->allowed());
  CHECK(limiter.check("k")->reason == Reason::kQuotaExceeded);
  CHECK(limiter.reset("never-seen").ok());
}

TEST_CASE("over Redis, inspect equals the next peek, consumes nothing and creates no state") {
  sluice_test::RedisFixture server;
  sluice::redis::RedisGcraLimiter limiter = make_redis(server);
  const nanoseconds t = kT0;
  server_time.set(t);
  auto fresh = limiter.inspect("k");
  REQUIRE(fresh.ok());
  CHECK(*fresh == Decision{.reason = Reason::kAllowed, .limit = 3, .remaining = 3});
  REQUIRE(redis_at(limiter, "k", t, 2).allowed());
  auto seen = limiter.inspect("k");
  REQUIRE(seen.ok());
  CHECK(*seen == redis_at(limiter, "k", t, 0));
  CHECK(seen->remaining == 1);
  CHECK(redis_at(limiter, "k", t).allowed());  // inspect left the last unit in place
  CHECK(redis_at(limiter, "k", t).reason == Reason::kQuotaExceeded);
}

TEST_CASE("reset and inspect over Redis decide exactly as in memory on the same inputs") {
  sluice_test::RedisFixture server;
  sluice::redis::RedisGcraLimiter redis = make_redis(server);
  sluice::ManualClock clock(kT0);
  sluice::GcraLimiter<sluice::ManualClock> memory = make_memory(clock);
  std::mt19937_64 random(17);
  for (int step = 0; step < 400; ++step) {
    clock.advance(milliseconds(random() % 500));
    const nanoseconds t = clock.now();
    server_time.set(t);
    const std::string key = (random() % 4 == 0) ? "b" : "a";
    switch (random() % 5) {
      case 0: {
        REQUIRE(redis.reset(key).ok());
        memory.reset(key);
        break;
      }
      case 1: {
        server_time.set(t);
        auto r = redis.inspect(key);
        REQUIRE(r.ok());
        CHECK(*r == memory.inspect(key));
        break;
      }
      default: {
        const std::uint64_t cost = 1 + random() % 3;
        auto m = memory.check(key, cost);
        REQUIRE(m.ok());
        CHECK(redis_at(redis, key, t, cost) == *m);
      }
    }
  }
}

TEST_CASE("reset over a stopped server fails within the timeout and never reports success") {
  sluice_test::RedisFixture server;
  auto limiter =
      sluice::redis::RedisGcraLimiter::create(kWindows, server.options(milliseconds(200)));
  REQUIRE(limiter.ok());
  server.redis.kill();
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = limiter->reset("k");
  CHECK_FALSE(status.ok());
  CHECK(std::chrono::steady_clock::now() - start < seconds(2));
  CHECK_FALSE(limiter->inspect("k").ok());
}
