// The engine's settled costs: evaluate(request, e, settlement) on an estimated cost, then
// settle(settlement, actual) over every live rule of the request.
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <random>
#include <vector>

#include "catch.hpp"
#include "engine_fixture.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"
#ifdef SLUICE_TEST_REDIS
#include "redis_fixture.hpp"
#include "sluice/redis.hpp"
#include "sluice/redis/engine_backend.hpp"
#endif

namespace {

using namespace std::chrono_literals;
using sluice::Selector;
using Engine = sluice::testing::TestEngine;

// 10 per second per client address and 100 per minute per route on /api.
sluice::PolicyConfig config(sluice::ConsumptionMode mode = sluice::ConsumptionMode::kAllOrNothing) {
  return {.policies = {{.name = "api",
                        .rate_limits = {{.name = "per-ip",
                                         .selector = {Selector::kIp},
                                         .requests_per = {.s = 10}},
                                        {.name = "per-route",
                                         .selector = {Selector::kRoute},
                                         .requests_per = {.minute = 100}}}}},
          .routes = {{.name = "api", .path_prefix = "/api", .policies = {"api"}}},
          .engine = {.consumption = mode}};
}

// `ip` must outlive the request (RequestContext holds views): literals here.
sluice::RequestContext request(std::uint64_t cost, std::string_view ip = "203.0.113.7") {
  return {.client_ip = ip, .route = "api", .path = "/api/x", .cost = cost};
}

Engine make(sluice::ManualClock clock, const sluice::PolicyConfig& c = config()) {
  return sluice::testing::make_engine(c, std::move(clock));
}

template <class E>
std::uint64_t remaining(const E& engine, std::string_view rule) {
  auto d = engine.inspect(rule, request(1));
  REQUIRE(d.ok());
  return d->remaining;
}

}  // namespace

TEST_CASE("settling above the estimate charges the difference in every live rule") {
  for (auto mode : {sluice::ConsumptionMode::kAllOrNothing, sluice::ConsumptionMode::kEveryRule}) {
    sluice::ManualClock clock;
    Engine engine = make(clock, config(mode));
    sluice::Evaluation e;
    Engine::Settlement s;
    engine.evaluate(request(2), e, s);
    REQUIRE(e.allowed);
    REQUIRE(s.open());
    CHECK(s.estimate() == 2);
    REQUIRE(engine.settle(s, 5).ok());
    CHECK_FALSE(s.open());
    CHECK(remaining(engine, "api/per-ip") == 5);
    CHECK(remaining(engine, "api/per-route") == 95);
    CHECK(engine.settle(s, 5).code() == absl::StatusCode::kFailedPrecondition);
  }
}

TEST_CASE("settling below the estimate refunds the surplus in every live rule") {
  sluice::ManualClock clock;
  Engine engine = make(clock);
  sluice::Evaluation e;
  Engine::Settlement s;
  engine.evaluate(request(8), e, s);
  REQUIRE(s.open());
  REQUIRE(engine.settle(s, 3).ok());
  CHECK(remaining(engine, "api/per-ip") == 7);
  CHECK(remaining(engine, "api/per-route") == 97);
}

TEST_CASE("a charge past the bucket makes the client wait until it is paid off") {
  sluice::ManualClock clock;
  Engine engine = make(clock);
  sluice::Evaluation e;
  Engine::Settlement s;
  engine.evaluate(request(1), e, s);
  REQUIRE(engine.settle(s, 25).ok());  // 15 beyond the per-ip bucket of 10
  sluice::Evaluation next = engine.evaluate(request(1));
  CHECK_FALSE(next.allowed);
  CHECK(next.retry_after == 1600ms);
  CHECK(engine.evaluate(request(1, "203.0.113.8")).allowed);  // another client is not charged
}

TEST_CASE("a client in debt keeps its debt across a reload that raises its limit") {
  sluice::ManualClock clock;
  Engine engine = make(clock);
  sluice::Evaluation e;
  Engine::Settlement s;
  engine.evaluate(request(1), e, s);
  REQUIRE(engine.settle(s, 25).ok());  // 15 beyond the per-ip bucket of 10: 1.5 s of debt
  sluice::PolicyConfig raised = config();
  raised.policies[0].rate_limits[0].requests_per.s = 20;
  auto next = engine.reload(raised);
  REQUIRE(next.ok());
  sluice::Evaluation after = next->evaluate(request(1));
  CHECK_FALSE(after.allowed);
  CHECK(after.retry_after == 1550ms);  // the 1.5 s of debt, then one emission interval of 20/s
  CHECK(next->evaluate(request(1, "203.0.113.8")).allowed);
}

TEST_CASE("a denied request, a peek or a bad cost leaves the settlement closed") {
  sluice::ManualClock clock;
  Engine engine = make(clock);
  REQUIRE(engine.evaluate(request(10)).allowed);
  sluice::Evaluation e;
  Engine::Settlement s;
  engine.evaluate(request(1), e, s);
  CHECK_FALSE(e.allowed);
  CHECK_FALSE(s.open());
  CHECK(engine.settle(s, 0).code() == absl::StatusCode::kFailedPrecondition);
  engine.evaluate(request(0, "198.51.100.1"), e, s);
  CHECK(e.allowed);
  CHECK_FALSE(s.open());
  engine.evaluate(request(11, "198.51.100.2"), e, s);
  CHECK(e.backend_error.code() == absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(s.open());
  // An actual cost above 2^32 is refused and leaves an open settlement open.
  engine.evaluate(request(1, "198.51.100.3"), e, s);
  REQUIRE(s.open());
  CHECK(engine.settle(s, (std::uint64_t{1} << 32) + 1).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(s.open());
}

TEST_CASE("a request that a fixed-window rule applies to is counted but books nothing") {
  sluice::ManualClock clock;
  sluice::PolicyConfig c = config();
  c.policies[0].rate_limits[1].algorithm = sluice::Algorithm::kFixedWindow;
  Engine engine = make(clock, c);
  sluice::Evaluation e;
  Engine::Settlement s;
  engine.evaluate(request(4), e, s);
  CHECK(e.allowed);
  CHECK_FALSE(s.open());
  CHECK(engine.settle(s, 1).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(remaining(engine, "api/per-ip") == 6);      // the estimate stays taken
  CHECK(remaining(engine, "api/per-route") == 96);  // in the fixed window too
}

TEST_CASE("a settlement outlives a reload and settles the rules it was evaluated under") {
  sluice::ManualClock clock;
  Engine engine = make(clock);
  sluice::Evaluation e;
  Engine::Settlement s;
  engine.evaluate(request(2), e, s);
  REQUIRE(s.open());
  auto next = engine.reload(config());  // same rules: their state carries over
  REQUIRE(next.ok());
  REQUIRE(next->settle(s, 6).ok());
  CHECK(remaining(*next, "api/per-ip") == 4);
}

TEST_CASE("a charge settled after a reload that changed the rule's rate still lands", "[attack]") {
  sluice::ManualClock clock;
  Engine engine = make(clock);
  sluice::Evaluation e;
  Engine::Settlement s;
  engine.evaluate(request(1), e, s);
  REQUIRE(s.open());
  sluice::PolicyConfig raised = config();
  raised.policies[0].rate_limits[0].requests_per.s = 20;
  auto next = engine.reload(raised);
  REQUIRE(next.ok());
  // The request turned out to cost 25, 15 beyond the per-ip bucket: the client owes it under the
  // rule's new rate as it would had the charge come before the reload.
  REQUIRE(next->settle(s, 25).ok());
  CHECK_FALSE(next->evaluate(request(1)).allowed);
}

TEST_CASE("an adaptive rule settles at the factor it was evaluated with") {
  sluice::ManualClock clock;
  sluice::PolicyConfig c = config();
  c.policies[0].rate_limits.resize(1);
  sluice::AdaptivePolicy adaptive;
  adaptive.target_latency = 100ms;
  adaptive.minimum_factor_permille = 500;
  adaptive.max_hold = 10s;
  adaptive.min_samples = 1;  // one client's 503 is enough here
  adaptive.min_clients = 1;
  c.policies[0].rate_limits[0].adaptive = adaptive;
  Engine engine = make(clock, c);
  REQUIRE(engine.record_upstream(request(1), {.latency = 1ms, .status = 503}).ok());  // factor 1/2
  REQUIRE(remaining(engine, "api/per-ip") == 5);
  sluice::Evaluation e;
  Engine::Settlement s;
  engine.evaluate(request(1), e, s);
  REQUIRE(s.open());
  REQUIRE(engine.settle(s, 3).ok());
  CHECK(remaining(engine, "api/per-ip") == 2);
}

#ifdef SLUICE_TEST_REDIS
namespace {

using RedisEngine = sluice::redis::RedisRateLimitEngine;
// The Redis engine decides at this Unix time plus the test's clock.
constexpr std::chrono::nanoseconds kEpoch{std::int64_t{1'700'000'000} * 1'000'000'000};

// `c`'s mode names the keys, so that each mode starts from fresh state on one server.
RedisEngine make_redis(const sluice_test::RedisFixture& server, sluice::ManualClock clock,
                       const sluice::PolicyConfig& c = config()) {
  sluice::redis::ClientOptions options = server.options();
  options.key_prefix +=
      c.engine.consumption == sluice::ConsumptionMode::kEveryRule ? "every:" : "all:";
  options.time_source = [clock] { return kEpoch + clock.now(); };
  auto client = sluice::redis::Client::create(options);
  REQUIRE(client.ok());
  sluice_test::hold_keys(**client);
  auto engine = RedisEngine::create(c, {.client = *client});
  INFO(engine.status());
  REQUIRE(engine.ok());
  return *std::move(engine);
}

}  // namespace

TEST_CASE("over Redis, settling charges or refunds every live rule, once") {
  sluice_test::RedisFixture server;
  for (auto mode : {sluice::ConsumptionMode::kAllOrNothing, sluice::ConsumptionMode::kEveryRule}) {
    sluice::ManualClock clock;
    RedisEngine engine = make_redis(server, clock, config(mode));
    sluice::Evaluation e;
    RedisEngine::Settlement up, down;
    engine.evaluate(request(2), e, up);
    REQUIRE(e.allowed);
    REQUIRE(up.open());
    REQUIRE(engine.settle(up, 5).ok());
    CHECK(remaining(engine, "api/per-ip") == 5);
    CHECK(remaining(engine, "api/per-route") == 95);
    CHECK(engine.settle(up, 5).code() == absl::StatusCode::kFailedPrecondition);
    engine.evaluate(request(4), e, down);
    REQUIRE(down.open());
    REQUIRE(engine.settle(down, 1).ok());  // 3 back
    CHECK(remaining(engine, "api/per-ip") == 4);
    CHECK(remaining(engine, "api/per-route") == 94);
  }
}

TEST_CASE("over Redis, a denied request leaves the settlement closed and nothing booked") {
  sluice_test::RedisFixture server;
  sluice::ManualClock clock;
  RedisEngine engine = make_redis(server, clock);
  REQUIRE(engine.evaluate(request(10)).allowed);
  sluice::Evaluation e;
  RedisEngine::Settlement s;
  engine.evaluate(request(1), e, s);
  CHECK_FALSE(e.allowed);
  CHECK_FALSE(s.open());
  CHECK(remaining(engine, "api/per-route") == 90);  // all or nothing: the denial took nothing
}

TEST_CASE("over Redis, a settlement from before a reset gives nothing back, and a charge lands") {
  sluice_test::RedisFixture server;
  sluice::ManualClock clock;
  RedisEngine engine = make_redis(server, clock);
  sluice::Evaluation e;
  RedisEngine::Settlement refund, charge;
  engine.evaluate(request(6), e, refund);
  engine.evaluate(request(1), e, charge);
  REQUIRE(refund.open());
  REQUIRE(charge.open());
  REQUIRE(engine.reset("api/per-ip", request(1)).ok());
  REQUIRE(engine.evaluate(request(4)).allowed);  // the per-ip key now holds 4 of 10
  REQUIRE(engine.settle(refund, 0).ok());
  CHECK(remaining(engine, "api/per-ip") == 6);  // the reset key keeps what came after it
  CHECK(remaining(engine, "api/per-route") == 95);  // 100 − 6 − 1 − 4 + 6: the unreset rule refunds
  REQUIRE(engine.settle(charge, 3).ok());
  CHECK(remaining(engine, "api/per-ip") == 4);
}

TEST_CASE("over Redis, settlements decide exactly as in memory (random script)") {
  sluice_test::RedisFixture server;
  for (auto mode : {sluice::ConsumptionMode::kAllOrNothing, sluice::ConsumptionMode::kEveryRule}) {
    sluice::ManualClock clock;
    Engine memory = make(clock, config(mode));
    RedisEngine redis = make_redis(server, clock, config(mode));
    std::mt19937_64 rng(mode == sluice::ConsumptionMode::kAllOrNothing ? 7 : 8);
    const auto pick = [&](std::uint64_t n) {
      return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng);
    };
    constexpr std::string_view kIps[] = {"203.0.113.1", "203.0.113.2"};
    std::vector<std::pair<Engine::Settlement, RedisEngine::Settlement>> open;
    for (int step = 0; step < 400; ++step) {
      INFO("step " << step);
      const std::string_view ip = kIps[pick(2)];
      switch (pick(8)) {
        case 0:
        case 1:
        case 2: {
          const std::uint64_t cost = pick(6);
          sluice::Evaluation em, er;
          Engine::Settlement sm;
          RedisEngine::Settlement sr;
          memory.evaluate(request(cost, ip), em, sm);
          redis.evaluate(request(cost, ip), er, sr);
          REQUIRE(er.backend_error.ok());
          REQUIRE(em.allowed == er.allowed);
          REQUIRE(em.retry_after == er.retry_after);
          REQUIRE(sm.open() == sr.open());
          if (sm.open()) open.emplace_back(std::move(sm), std::move(sr));
          break;
        }
        case 3:
        case 4:
          if (!open.empty()) {
            const std::size_t i = pick(open.size());
            const std::uint64_t actual = pick(16);
            REQUIRE(memory.settle(open[i].first, actual).ok());
            REQUIRE(redis.settle(open[i].second, actual).ok());
            open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
          }
          break;
        case 5:
          if (pick(4) == 0) {
            REQUIRE(memory.reset("api/per-ip", request(1, ip)).ok());
            REQUIRE(redis.reset("api/per-ip", request(1, ip)).ok());
          }
          break;
        default:
          clock.advance(std::chrono::milliseconds(pick(700)));
      }
      for (std::string_view rule : {"api/per-ip", "api/per-route"}) {
        auto dm = memory.inspect(rule, request(1, ip));
        auto dr = redis.inspect(rule, request(1, ip));
        REQUIRE(dm.ok());
        REQUIRE(dr.ok());
        INFO(rule);
        REQUIRE(*dm == *dr);
      }
    }
  }
}
#endif
