// The `local` failure mode against a real redis-server that each test case starts, kills, stops or
// restarts: sluice::redis::LocalFallbackLimiter and the policy engine with
// on_backend_error: local.
//
// Time: the local share and the retry interval run on a ManualClock (the limiter's clock; for the
// engine, the `clock` of the backend options, which ClockedRedisBackend below supplies); Redis
// decides at a fixed server time through the documented testing hooks, so every count is exact.
// steady_clock appears only to bound how long a run of checks waits, never to time a rate.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "example_config.hpp"
#include "redis_fixture.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"
#include "sluice/prometheus.hpp"
#include "sluice/redis/engine_backend.hpp"
#include "sluice/redis/limiter.hpp"
#include "sluice/redis/local_fallback.hpp"

namespace {

using namespace std::chrono_literals;
using sluice::GcraWindow;
using sluice::ManualClock;
using sluice::Selector;
using sluice::redis::FallbackDecision;
using sluice::redis::LocalFallbackLimiter;
using sluice::redis::RedisEngineBackend;
using sluice::redis::RedisGcraLimiter;
using sluice::testing::field;
using sluice::testing::on_route;
using sluice::testing::rule;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

constexpr nanoseconds kT0 = std::chrono::seconds(1'700'000'000);  // server time, ns since epoch

// A client of `server` whose scripts decide at kT0 instead of the server's TIME.
std::shared_ptr<sluice::redis::Client> client_at_t0(const sluice_test::RedisFixture& server,
                                                    milliseconds timeout) {
  sluice::redis::ClientOptions options = server.options(timeout);
  options.time_source = [] { return kT0; };
  auto client = sluice::redis::Client::create(options);
  REQUIRE(client.ok());
  return *std::move(client);
}
constexpr nanoseconds kRetry = 1s;

// 10 per minute; at 500 permille a replica enforces 5 per minute alone.
const std::vector<GcraWindow> kTenPerMinute = {{.requests = 10, .period = 1min}};

// A Redis limiter over `server` deciding at kT0.
RedisGcraLimiter shared_limiter(const sluice_test::RedisFixture& server,
                                milliseconds timeout = milliseconds(300)) {
  auto limiter = RedisGcraLimiter::create(kTenPerMinute, client_at_t0(server, timeout));
  INFO(limiter.status());
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

LocalFallbackLimiter<ManualClock> fallback(RedisGcraLimiter shared, ManualClock clock,
                                           std::uint64_t share_permille = 500) {
  auto limiter = LocalFallbackLimiter<ManualClock>::create(
      std::move(shared), {.share_permille = share_permille, .retry_interval = kRetry}, clock);
  INFO(limiter.status());
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

FallbackDecision check(LocalFallbackLimiter<ManualClock>& limiter, std::string_view key,
                       std::uint64_t cost = 1) {
  absl::StatusOr<FallbackDecision> d = limiter.check(key, cost);
  INFO(d.status());
  REQUIRE(d.ok());
  return *d;
}

struct Tally {
  int admitted = 0;
  int degraded = 0;
};

// `n` checks of one key; how many were admitted and how many decided locally.
Tally checks(LocalFallbackLimiter<ManualClock>& limiter, std::string_view key, int n) {
  Tally t;
  for (int i = 0; i < n; ++i) {
    const FallbackDecision d = check(limiter, key);
    t.admitted += d.decision.allowed() ? 1 : 0;
    t.degraded += d.degraded ? 1 : 0;
  }
  return t;
}

// RedisEngineBackend with a ManualClock in its options: the engine runs the local share and the
// retry interval on the options' `clock`, so this test drives them. Every decision is Redis's.
struct ClockedRedisBackend {
  struct Options {
    RedisEngineBackend::Options redis{};
    ManualClock clock{};
  };
  static absl::StatusOr<ClockedRedisBackend> create(std::span<const sluice::CompiledRule> rules,
                                                    const ClockedRedisBackend* previous,
                                                    const Options& options) {
    auto redis =
        RedisEngineBackend::create(rules, previous ? &previous->redis : nullptr, options.redis);
    if (!redis.ok()) return redis.status();
    return ClockedRedisBackend{.redis = *std::move(redis)};
  }
  absl::Status check_rules(std::span<const sluice::RuleKey> keys, sluice::ConsumptionMode mode,
                           std::span<sluice::Decision> out) {
    return redis.check_rules(keys, mode, out);
  }
  sluice::StoreStats rule_store_stats(std::size_t rule) const {
    return redis.rule_store_stats(rule);
  }
  RedisEngineBackend redis;
};
using Engine = sluice::BasicRateLimitEngine<ClockedRedisBackend>;

// Route `public` with one rule: 10 per minute per client address.
sluice::PolicyConfig ten_per_minute(sluice::FailureMode mode) {
  return {.policies = {{.name = "api",
                        .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 10})}}},
          .routes = {{.name = "public", .path_prefix = "/v1", .policies = {"api"}}},
          .engine = {.on_backend_error = mode, .local_share_permille = 500}};
}

Engine engine(const sluice::PolicyConfig& config, const sluice_test::RedisFixture& server,
              ManualClock clock) {
  auto e = Engine::create(
      config, {.redis = {.client = client_at_t0(server, milliseconds(300))}, .clock = clock});
  INFO(e.status());
  REQUIRE(e.ok());
  return *std::move(e);
}

struct EngineTally {
  int allowed = 0;
  int degraded = 0;
  int errors = 0;
};

EngineTally evaluations(const Engine& e, std::string_view ip, int n) {
  EngineTally t;
  for (int i = 0; i < n; ++i) {
    const sluice::Evaluation r = e.evaluate(on_route(ip, "public"));
    t.allowed += r.allowed ? 1 : 0;
    t.degraded += r.degraded ? 1 : 0;
    t.errors += r.backend_error.ok() ? 0 : 1;
  }
  return t;
}

}  // namespace

// --- the limiter
// ----------------------------------------------------------------------------------

TEST_CASE("the local share floors every window's requests and burst and never drops below one") {
  sluice_test::RedisFixture server;
  auto shared = RedisGcraLimiter::create(
      {{.requests = 10, .period = 1min}, {.requests = 3, .period = 1s, .burst = 7}},
      server.client());
  REQUIRE(shared.ok());
  LocalFallbackLimiter<ManualClock> half = fallback(*shared, ManualClock());
  CHECK(half.local().windows() ==
        std::vector<GcraWindow>{{.requests = 1, .period = 1s, .burst = 3},
                                {.requests = 5, .period = 1min, .burst = 5}});
  LocalFallbackLimiter<ManualClock> least = fallback(*shared, ManualClock(), 1);
  CHECK(least.local().windows() ==
        std::vector<GcraWindow>{{.requests = 1, .period = 1s, .burst = 1},
                                {.requests = 1, .period = 1min, .burst = 1}});
}

TEST_CASE("a share outside 1 to 1000 permille or a retry interval of zero is refused") {
  sluice_test::RedisFixture server;
  RedisGcraLimiter shared = shared_limiter(server);
  auto zero = LocalFallbackLimiter<>::create(shared, {.share_permille = 0});
  CHECK(zero.status().message() == "share_permille must be in [1, 1000], got 0");
  auto above = LocalFallbackLimiter<>::create(shared, {.share_permille = 1001});
  CHECK(above.status().message() == "share_permille must be in [1, 1000], got 1001");
  auto no_wait =
      LocalFallbackLimiter<>::create(shared, {.share_permille = 500, .retry_interval = 0ns});
  CHECK(no_wait.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(LocalFallbackLimiter<>::create(shared, {.share_permille = 1000}).ok());
}

TEST_CASE("a killed Redis leaves a client exactly the local share, every decision degraded") {
  sluice_test::RedisFixture server;
  ManualClock clock;
  LocalFallbackLimiter<ManualClock> limiter = fallback(shared_limiter(server), clock);
  const Tally before = checks(limiter, "client", 3);
  CHECK(before.admitted == 3);
  CHECK(before.degraded == 0);

  server.redis.kill();
  const FallbackDecision first = check(limiter, "client");  // the failing call, decided locally
  CHECK(first.degraded);
  CHECK(first.decision.allowed());
  CHECK(first.decision.limit == 5);
  CHECK(first.decision.remaining == 4);
  const auto start = std::chrono::steady_clock::now();
  const Tally after = checks(limiter, "client", 99);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(after.admitted == 4);  // 5 in all: 500 permille of 10 per minute
  CHECK(after.degraded == 99);
  CHECK(elapsed < 50ms);
  CHECK(limiter.backend_errors() == 1);  // no check after the first called Redis
  CHECK(limiter.degraded_decisions() == 100);
  CHECK(limiter.degraded());
}

TEST_CASE("inspect and reset reach Redis while it answers, and the local share while it fails") {
  sluice_test::RedisFixture server;
  ManualClock clock;
  LocalFallbackLimiter<ManualClock> limiter = fallback(shared_limiter(server), clock);
  checks(limiter, "client", 10);
  absl::StatusOr<FallbackDecision> spent = limiter.inspect("client");
  REQUIRE(spent.ok());
  CHECK_FALSE(spent->degraded);
  CHECK(spent->decision.remaining == 0);
  REQUIRE(limiter.reset("client").ok());
  CHECK(limiter.inspect("client")->decision.remaining == 10);  // Redis forgot the key

  server.redis.kill();
  CHECK(checks(limiter, "client", 5).admitted == 5);  // the local share: 5 of 5
  absl::StatusOr<FallbackDecision> local = limiter.inspect("client");
  REQUIRE(local.ok());
  CHECK(local->degraded);
  CHECK(local->decision.remaining == 0);
  // Redis is down: the reset reports it, and still frees the key in the local share.
  CHECK_FALSE(limiter.reset("client").ok());
  CHECK(limiter.inspect("client")->decision.remaining == 5);
}

TEST_CASE("a Redis that stops answering costs one timeout, then checks are local at once") {
  sluice_test::RedisFixture server;
  ManualClock clock;
  LocalFallbackLimiter<ManualClock> limiter =
      fallback(shared_limiter(server, milliseconds(100)), clock);
  REQUIRE_FALSE(check(limiter, "client").degraded);

  server.redis.stop();  // the process freezes: replies never come, each call would time out
  CHECK(check(limiter, "client").degraded);  // waits out one command timeout
  const auto start = std::chrono::steady_clock::now();
  const Tally after = checks(limiter, "client", 100);
  CHECK(std::chrono::steady_clock::now() - start < 50ms);  // 100 timeouts would be 10 s
  CHECK(after.degraded == 100);
  CHECK(after.admitted == 4);  // the local share (5) less the first degraded admission
  CHECK(limiter.backend_errors() == 1);
  server.redis.resume();
}

TEST_CASE("a failed probe is decided locally and the next waits another retry interval") {
  sluice_test::RedisFixture server;
  ManualClock clock;
  LocalFallbackLimiter<ManualClock> limiter = fallback(shared_limiter(server), clock);
  REQUIRE_FALSE(check(limiter, "client").degraded);
  server.redis.kill();
  CHECK(check(limiter, "client").degraded);
  clock.advance(kRetry - 1ns);
  CHECK(check(limiter, "client").degraded);
  CHECK(limiter.backend_errors() == 1);  // not yet due: Redis was not called
  clock.advance(1ns);
  CHECK(check(limiter, "client").degraded);  // the probe, which fails
  CHECK(limiter.backend_errors() == 2);
  CHECK(check(limiter, "client").degraded);
  CHECK(limiter.backend_errors() == 2);
}

TEST_CASE("a restarted Redis decides again after the retry interval, shared between limiters") {
  sluice_test::RedisFixture server;
  ManualClock clock;
  LocalFallbackLimiter<ManualClock> a = fallback(shared_limiter(server), clock);
  LocalFallbackLimiter<ManualClock> b = fallback(shared_limiter(server), clock);
  REQUIRE_FALSE(check(a, "client").degraded);
  server.redis.kill();
  CHECK(check(a, "client").degraded);

  REQUIRE(server.redis.restart().empty());  // an empty server: the shared state is gone
  CHECK(check(a, "client").degraded);       // the retry interval has not passed
  clock.advance(kRetry);
  const FallbackDecision back = check(a, "client");
  CHECK_FALSE(back.degraded);
  CHECK(back.decision.limit == 10);
  CHECK(back.decision.remaining == 9);
  CHECK_FALSE(a.degraded());
  const Tally other = checks(b, "client", 4);  // another replica consumes from the same budget
  CHECK(other.admitted == 4);
  CHECK(other.degraded == 0);
  CHECK(check(a, "client").decision.remaining == 4);
}

TEST_CASE(
    "a cost the local bucket cannot hold takes all of it, one above the shared burst is refused") {
  sluice_test::RedisFixture server;
  ManualClock clock;
  LocalFallbackLimiter<ManualClock> limiter = fallback(shared_limiter(server), clock);
  server.redis.kill();
  const FallbackDecision big = check(limiter, "client", 8);
  CHECK(big.degraded);
  CHECK(big.decision.allowed());
  CHECK(big.decision.remaining == 0);
  CHECK_FALSE(check(limiter, "client", 1).decision.allowed());
  CHECK(limiter.check("client", 11).status().code() == absl::StatusCode::kInvalidArgument);
}

// --- the engine
// -----------------------------------------------------------------------------------

TEST_CASE(
    "an engine in local mode decides on its share while Redis is dead, degraded and counted") {
  sluice_test::RedisFixture server;
  ManualClock clock;
  const Engine e = engine(ten_per_minute(sluice::FailureMode::kLocal), server, clock);
  REQUIRE(evaluations(e, "10.0.0.1", 3).allowed == 3);

  server.redis.kill();
  const sluice::Evaluation first = e.evaluate(on_route("10.0.0.1", "public"));
  CHECK(first.degraded);
  CHECK(first.allowed);
  CHECK(first.backend_error.ok());
  CHECK(field(first, "X-RateLimit-Limit") == "5");
  CHECK(field(first, "X-RateLimit-Remaining") == "4");
  const auto start = std::chrono::steady_clock::now();
  const EngineTally after = evaluations(e, "10.0.0.1", 99);
  CHECK(std::chrono::steady_clock::now() - start < 50ms);
  CHECK(after.allowed == 4);
  CHECK(after.degraded == 99);
  CHECK(after.errors == 0);

  const sluice::EngineStats stats = e.engine_stats();
  CHECK(stats.backend_errors == 1);  // one failed call; the rest never reached Redis
  CHECK(stats.degraded_evaluations == 100);
  CHECK(e.backend_failing());
  const sluice::RuleStats rule = e.stats()[0];
  CHECK(rule.admitted == 3 + 5);
  CHECK(rule.denied == 95);
  CHECK(rule.degraded == 100);
  const std::string text = sluice::prometheus_text(e);
  CHECK(text.find("\nsluice_engine_degraded_evaluations_total 100\n") != std::string::npos);
  CHECK(text.find("\nsluice_rule_degraded_total{rule=\"api/per-ip\",dry_run=\"false\"} 100\n") !=
        std::string::npos);
}

TEST_CASE("threads evaluating during an outage together admit exactly the local share") {
  sluice_test::RedisFixture server;
  ManualClock clock;
  const Engine e = engine(ten_per_minute(sluice::FailureMode::kLocal), server, clock);
  server.redis.kill();
  std::atomic<int> allowed{0}, degraded{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      const EngineTally tally = evaluations(e, "10.0.0.1", 50);
      allowed += tally.allowed;
      degraded += tally.degraded;
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(allowed == 5);
  CHECK(degraded == 200);
  CHECK(e.engine_stats().backend_errors >= 1);  // calls that raced the first failure
  CHECK(e.engine_stats().backend_errors <= 4);  // at most one per thread: then all skip Redis
}

TEST_CASE("the Redis engine goes local at once after one timeout of a frozen server") {
  sluice_test::RedisFixture server;
  auto created = sluice::redis::RedisRateLimitEngine::create(
      ten_per_minute(sluice::FailureMode::kLocal),
      {.client = client_at_t0(server, milliseconds(100))});
  REQUIRE(created.ok());
  const sluice::redis::RedisRateLimitEngine& e = *created;
  REQUIRE_FALSE(e.evaluate(on_route("10.0.0.1", "public")).degraded);

  server.redis.stop();
  CHECK(e.evaluate(on_route("10.0.0.1", "public")).degraded);  // one command timeout
  const auto start = std::chrono::steady_clock::now();
  int degraded = 0;
  for (int i = 0; i < 100; ++i) degraded += e.evaluate(on_route("10.0.0.1", "public")).degraded;
  CHECK(std::chrono::steady_clock::now() - start < 50ms);  // well within the 1 s retry interval
  CHECK(degraded == 100);
  CHECK(e.engine_stats().backend_errors == 1);
  server.redis.resume();
}

TEST_CASE("two engines share decisions again once a restarted Redis answers a probe") {
  sluice_test::RedisFixture server;
  ManualClock clock;
  const Engine a = engine(ten_per_minute(sluice::FailureMode::kLocal), server, clock);
  const Engine b = engine(ten_per_minute(sluice::FailureMode::kLocal), server, clock);
  REQUIRE(evaluations(a, "10.0.0.1", 1).degraded == 0);
  server.redis.kill();
  CHECK(evaluations(a, "10.0.0.1", 1).degraded == 1);
  clock.advance(kRetry);
  CHECK(evaluations(a, "10.0.0.1", 1).degraded == 1);  // the probe fails: still local
  CHECK(a.engine_stats().backend_errors == 2);

  REQUIRE(server.redis.restart().empty());             // an empty server: the shared state is gone
  CHECK(evaluations(a, "10.0.0.1", 1).degraded == 1);  // not yet due
  clock.advance(kRetry);
  const sluice::Evaluation back = a.evaluate(on_route("10.0.0.1", "public"));
  CHECK_FALSE(back.degraded);
  CHECK(field(back, "X-RateLimit-Limit") == "10");
  CHECK(field(back, "X-RateLimit-Remaining") == "9");
  CHECK_FALSE(a.backend_failing());
  const EngineTally other = evaluations(b, "10.0.0.1", 4);
  CHECK(other.allowed == 4);
  CHECK(other.degraded == 0);
  CHECK(field(a.evaluate(on_route("10.0.0.1", "public")), "X-RateLimit-Remaining") == "4");
}

TEST_CASE("a reload during an outage stays local and carries the local share's state") {
  sluice_test::RedisFixture server;
  ManualClock clock;
  sluice::PolicyConfig config = ten_per_minute(sluice::FailureMode::kLocal);
  const Engine first = engine(config, server, clock);
  server.redis.kill();
  REQUIRE(evaluations(first, "10.0.0.1", 2).degraded == 2);
  auto second = first.reload(config);
  REQUIRE(second.ok());
  const sluice::Evaluation e = second->evaluate(on_route("10.0.0.1", "public"));
  CHECK(e.degraded);
  CHECK(field(e, "X-RateLimit-Remaining") == "2");
  CHECK(second->engine_stats().backend_errors == 1);  // the reload did not call Redis again
  // Another share changes the local windows: each key keeps the share of its local bucket it spent
  // (3 of 5 is 6 of the new 10), so this request is the seventh and 3 remain, not a fresh 9.
  config.engine.local_share_permille = 1000;
  auto third = second->reload(config);
  REQUIRE(third.ok());
  CHECK(field(third->evaluate(on_route("10.0.0.1", "public")), "X-RateLimit-Remaining") == "3");
}

TEST_CASE("fail_open and fail_closed still call Redis for every request and never degrade") {
  sluice_test::RedisFixture server;
  ManualClock clock;
  const Engine open = engine(ten_per_minute(sluice::FailureMode::kFailOpen), server, clock);
  const Engine closed = engine(ten_per_minute(sluice::FailureMode::kFailClosed), server, clock);
  REQUIRE(evaluations(open, "10.0.0.1", 1).allowed == 1);
  REQUIRE(evaluations(closed, "10.0.0.2", 1).allowed == 1);
  server.redis.kill();
  const EngineTally o = evaluations(open, "10.0.0.1", 3);
  CHECK(o.allowed == 3);
  CHECK(o.degraded == 0);
  CHECK(o.errors == 3);
  const EngineTally c = evaluations(closed, "10.0.0.2", 3);
  CHECK(c.allowed == 0);
  CHECK(c.degraded == 0);
  CHECK(c.errors == 3);
  CHECK(open.engine_stats().backend_errors == 3);
  CHECK(closed.engine_stats().backend_errors == 3);
  CHECK(open.engine_stats().degraded_evaluations == 0);
  CHECK(sluice::prometheus_text(open).find("degraded") == std::string::npos);
}
