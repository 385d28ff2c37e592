// The engine's settled costs: evaluate(request, e, settlement) on an estimated cost, then
// settle(settlement, actual) over every live rule of the request.
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "catch.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"

namespace {

using namespace std::chrono_literals;
using sluice::Selector;
using Engine = sluice::BasicRateLimitEngine<sluice::InMemoryBackend<sluice::ManualClock>>;

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
  auto engine = Engine::create(c, {.store = {.seed = 1}, .clock = std::move(clock)});
  REQUIRE(engine.ok());
  return *std::move(engine);
}

std::uint64_t remaining(const Engine& engine, std::string_view rule) {
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

TEST_CASE("an adaptive rule settles at the factor it was evaluated with") {
  sluice::ManualClock clock;
  sluice::PolicyConfig c = config();
  c.policies[0].rate_limits.resize(1);
  sluice::AdaptivePolicy adaptive;
  adaptive.target_latency = 100ms;
  adaptive.minimum_factor_permille = 500;
  adaptive.max_hold = 10s;
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
