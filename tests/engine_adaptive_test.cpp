// The engine with adaptive rules: a rule's limit follows the factor its upstream drives.
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "engine_fixture.hpp"
#include "example_config.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"

using namespace std::chrono_literals;
using Engine = sluice::testing::TestEngine;
using sluice::Selector;
using sluice::testing::admitted;
using sluice::testing::make_engine;
using sluice::testing::on_route;
using sluice::testing::rule;

namespace {

// Route `api` (upstream "backend") with one adaptive rule: 10 per minute per ip, burst 10; and
// route `other` with a fixed rule of the same size. By default the rule judges the control law
// alone: one answer from one client is enough to move it.
sluice::PolicyConfig config(sluice::AdaptivePolicy adaptive = {
                                .target_latency = 100ms, .min_samples = 1, .min_clients = 1}) {
  sluice::Rule limited = rule("per-ip", {Selector::kIp}, {.minute = 10});
  limited.adaptive = adaptive;
  return {.policies = {{.name = "adaptive", .rate_limits = {limited}},
                       {.name = "fixed",
                        .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 10})}}},
          .routes = {{.name = "api", .path_prefix = "/api", .policies = {"adaptive"}},
                     {.name = "other", .path_prefix = "/other", .policies = {"fixed"}}}};
}

// One overloaded interval: a slow answer now, then the clock moves to the interval's end.
void slow_interval(const Engine& engine, sluice::ManualClock& clock) {
  REQUIRE(engine.record_upstream(on_route("192.0.2.1", "api"), {.latency = 1s}).ok());
  clock.advance(1s);
}

std::uint32_t factor(const Engine& engine, std::size_t rule = 0) {
  return engine.stats()[rule].adaptive->factor_permille;
}

}  // namespace

TEST_CASE("an adaptive rule at factor 1 admits exactly its configured limit") {
  sluice::ManualClock clock;
  Engine engine = make_engine(config(), clock);
  sluice::Evaluation first = engine.evaluate(on_route("203.0.113.7", "api"));
  CHECK(first.binding->decision.limit == 10);
  CHECK(first.binding->decision.remaining == 9);
  CHECK(admitted(engine, on_route("203.0.113.7", "api"), 10) == 9);
  CHECK(factor(engine) == 1000);
}

TEST_CASE("a slow upstream halves requests and burst, and the fields say so") {
  sluice::ManualClock clock;
  Engine engine = make_engine(config({.target_latency = 100ms,
                                      .minimum_factor_permille = 500,
                                      .min_samples = 1,
                                      .min_clients = 1}),
                              clock);
  slow_interval(engine, clock);
  REQUIRE(factor(engine) == 500);
  std::vector<std::uint64_t> remaining;
  for (int i = 0; i < 6; ++i) {
    sluice::Evaluation e = engine.evaluate(on_route("203.0.113.7", "api"));
    CHECK(e.binding->decision.limit == 5);
    if (e.allowed) remaining.push_back(e.binding->decision.remaining);
  }
  CHECK(remaining == std::vector<std::uint64_t>{4, 3, 2, 1, 0});
  // Half the rate too: one request per 12 s instead of 6 s, while the upstream stays slow.
  for (int second = 0; second < 11; ++second) slow_interval(engine, clock);
  REQUIRE(factor(engine) == 500);
  CHECK_FALSE(engine.evaluate(on_route("203.0.113.7", "api")).allowed);
  slow_interval(engine, clock);
  CHECK(engine.evaluate(on_route("203.0.113.7", "api")).allowed);
}

TEST_CASE("a factor change keeps what a key has already spent") {
  sluice::ManualClock clock;
  Engine engine = make_engine(config(), clock);
  CHECK(admitted(engine, on_route("203.0.113.7", "api"), 4) == 4);  // 6 of 10 left
  slow_interval(engine, clock);  // 1 s passes: 1/6 of a request refills
  // 6 + 1/6 requests' worth of units, in requests of twice the size: 3 left.
  sluice::Evaluation e = engine.evaluate(on_route("203.0.113.7", "api"));
  CHECK(e.binding->decision.remaining == 2);
  CHECK(admitted(engine, on_route("203.0.113.7", "api"), 5) == 2);
  // Recovery: with the factor back at 1 the same bucket is counted in whole requests again.
  for (int i = 0; i < 30; ++i) {  // fast answers pull the latency average under the target
    REQUIRE(engine.record_upstream(on_route("192.0.2.1", "api"), {.latency = 1ms}).ok());
  }
  clock.advance(20s);  // healthy intervals: +100‰ each; 20 s also refill 3 1/3 requests
  REQUIRE(factor(engine) == 1000);
  sluice::Evaluation peek =
      engine.evaluate({.client_ip = "203.0.113.7", .route = "api", .cost = 0});
  CHECK(peek.binding->decision.remaining == 3);
}

TEST_CASE("a factor of a third rounds each request's share up") {
  sluice::ManualClock clock;
  Engine engine = make_engine(
      config(
          {.target_latency = 100ms, .decrease_permille = 333, .min_samples = 1, .min_clients = 1}),
      clock);
  slow_interval(engine, clock);
  REQUIRE(factor(engine) == 333);
  // A request takes ⌈10⁶ / 333⌉ = 3004 thousandths: 3 fit in the bucket of 10 000.
  CHECK(admitted(engine, on_route("203.0.113.7", "api"), 5) == 3);
}

TEST_CASE("a request too big for the reduced bucket needs all of it, never more") {
  sluice::ManualClock clock;
  Engine engine = make_engine(config(), clock);
  slow_interval(engine, clock);
  sluice::RequestContext big{.client_ip = "203.0.113.7", .route = "api", .cost = 8};
  CHECK(engine.evaluate(big).allowed);  // 16 requests' worth capped at the bucket's 10
  CHECK_FALSE(engine.evaluate(on_route("203.0.113.7", "api")).allowed);
  sluice::RequestContext too_big{.client_ip = "198.51.100.1", .route = "api", .cost = 11};
  sluice::Evaluation e = engine.evaluate(too_big);  // above the configured burst: an error
  CHECK_FALSE(e.allowed);
  CHECK(e.backend_error.code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a 503 with Retry-After holds the minimum, then the limit recovers step by step") {
  sluice::ManualClock clock;
  Engine engine = make_engine(config(), clock);
  REQUIRE(engine
              .record_upstream(on_route("192.0.2.1", "api"),
                               {.latency = 5ms, .status = 503, .retry_after = 5s})
              .ok());
  CHECK(factor(engine) == 100);
  CHECK(admitted(engine, on_route("203.0.113.7", "api"), 3) == 1);  // 10 × 0.1
  std::vector<std::uint32_t> trajectory;
  for (int second = 1; second <= 12; ++second) {
    clock.advance(1s);
    trajectory.push_back(factor(engine));
  }
  CHECK(trajectory ==
        std::vector<std::uint32_t>{100, 100, 100, 100, 200, 300, 400, 500, 600, 700, 800, 900});
}

TEST_CASE("one client's 503 with Retry-After: 300 leaves every other client's limit alone") {
  sluice::ManualClock clock;
  Engine engine = make_engine(config({.target_latency = 100ms}), clock);  // the default aggregation
  for (int i = 0; i < 10; ++i) {
    REQUIRE(engine
                .record_upstream(on_route("192.0.2.1", "api"),
                                 {.latency = 5ms, .status = 503, .retry_after = 300s})
                .ok());
  }
  CHECK(factor(engine) == 1000);
  CHECK(admitted(engine, on_route("203.0.113.7", "api"), 11) == 10);
  clock.advance(3s);
  CHECK(factor(engine) == 1000);
  CHECK(engine.stats()[0].adaptive->hold_remaining == 0s);
}

TEST_CASE("one host counts as one client whatever its IPv6 address in a /64 or credential") {
  sluice::ManualClock clock;
  sluice::PolicyConfig cfg = config({.target_latency = 100ms});  // the default aggregation
  cfg.consumers = {{.name = "customer", .credentials = {"k1"}}};
  Engine engine = make_engine(cfg, clock);
  const sluice::UpstreamResponse unavailable{.latency = 5ms, .status = 503, .retry_after = 30s};
  // Five 503s to five addresses of one /64.
  for (const char* ip : {"2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2::3",
                         "2001:db8:1:2:ffff::4", "2001:db8:1:2::5"}) {
    REQUIRE(engine.record_upstream(on_route(ip, "api"), unavailable).ok());
  }
  CHECK(factor(engine) == 1000);
  // Five 503s to one address with and without a credential, under two consumers.
  for (int i = 0; i < 5; ++i) {
    sluice::RequestContext r = on_route("192.0.2.66", "api");
    if (i % 3 == 1) {
      r.credential = "k1";
      r.consumer = "customer";
    } else if (i % 3 == 2) {
      r.credential = "random";
      r.consumer = "unknown";
    }
    REQUIRE(engine.record_upstream(r, unavailable).ok());
  }
  CHECK(factor(engine) == 1000);
  CHECK(admitted(engine, on_route("198.51.100.9", "api"), 11) == 10);
}

TEST_CASE("one client is one network of the config's address prefixes to an adaptive rule",
          "[attack]") {
  sluice::ManualClock clock;
  sluice::PolicyConfig cfg = config({.target_latency = 100ms});  // the default aggregation
  cfg.gateway.address_prefixes = {.ipv6 = 48};  // here one client holds a whole /48
  Engine engine = make_engine(cfg, clock);
  const sluice::UpstreamResponse unavailable{.latency = 5ms, .status = 503, .retry_after = 30s};
  // Five 503s to five /64s of one /48: one client as the config defines it.
  for (const char* ip : {"2001:db8:1:1::1", "2001:db8:1:2::1", "2001:db8:1:3::1", "2001:db8:1:4::1",
                         "2001:db8:1:5::1"}) {
    REQUIRE(engine.record_upstream(on_route(ip, "api"), unavailable).ok());
  }
  CHECK(factor(engine) == 1000);
  CHECK(admitted(engine, on_route("198.51.100.9", "api"), 11) == 10);
}

TEST_CASE("503s from several distinct clients lower the limit, held at most 30 s") {
  sluice::ManualClock clock;
  Engine engine = make_engine(config({.target_latency = 100ms}), clock);
  for (const char* ip : {"192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5"}) {
    REQUIRE(engine
                .record_upstream(on_route(ip, "api"),
                                 {.latency = 5ms, .status = 503, .retry_after = 300s})
                .ok());
  }
  CHECK(factor(engine) == 100);
  CHECK(engine.stats()[0].adaptive->hold_remaining == 30s);
  CHECK(admitted(engine, on_route("203.0.113.7", "api"), 3) == 1);  // 10 × 0.1
  clock.advance(29s);
  CHECK(factor(engine) == 100);
  clock.advance(1s);  // the interval ending at 30 s is the first at or after the hold
  CHECK(factor(engine) == 200);
}

TEST_CASE("a rule on two routes lowers its limit only on the route whose upstream failed") {
  sluice::ManualClock clock;
  sluice::PolicyConfig shared = config({.target_latency = 100ms});
  shared.routes.push_back({.name = "api2", .path_prefix = "/api2", .policies = {"adaptive"}});
  Engine engine = make_engine(shared, clock);
  for (const char* ip : {"192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5"}) {
    REQUIRE(engine
                .record_upstream(on_route(ip, "api2"),
                                 {.latency = 5ms, .status = 503, .retry_after = 10s})
                .ok());
  }
  CHECK(admitted(engine, on_route("203.0.113.8", "api"), 11) == 10);
  CHECK(admitted(engine, on_route("203.0.113.9", "api2"), 3) == 1);  // 10 × 0.1
  CHECK(factor(engine) == 100);  // stats show the rule's lowest route
}

TEST_CASE("upstream responses feed only the adaptive rules that apply to the request") {
  sluice::ManualClock clock;
  Engine engine = make_engine(config(), clock);
  REQUIRE(engine.record_upstream(on_route("192.0.2.1", "other"), {.latency = 1s}).ok());
  REQUIRE(engine.record_upstream({.client_ip = "192.0.2.1", .path = "/x"}, {.latency = 1s}).ok());
  clock.advance(1s);
  CHECK(factor(engine) == 1000);
  CHECK_FALSE(engine.stats()[1].adaptive.has_value());  // the fixed rule has no controller
  CHECK(admitted(engine, on_route("203.0.113.7", "other"), 11) == 10);
}

TEST_CASE("a reload keeps an unchanged adaptive rule's factor and its keys' state") {
  sluice::ManualClock clock;
  Engine engine = make_engine(config(), clock);
  CHECK(admitted(engine, on_route("203.0.113.7", "api"), 2) == 2);
  slow_interval(engine, clock);
  auto same = engine.reload(config());
  REQUIRE(same.ok());
  CHECK(factor(*same) == 500);
  // 8 + 1/6 of 10 left, at half size: 4.
  CHECK(admitted(*same, on_route("203.0.113.7", "api"), 6) == 4);

  // New adaptive parameters: a fresh controller, but the same windows keep the keys' state.
  auto retuned = same->reload(config({.target_latency = 300ms}));
  REQUIRE(retuned.ok());
  CHECK(factor(*retuned) == 1000);
  CHECK_FALSE(retuned->evaluate(on_route("203.0.113.7", "api")).allowed);
}

TEST_CASE("an adaptive rule's counts are validated against the scaled range") {
  sluice::PolicyConfig c = config();
  c.policies[0].rate_limits[0].requests_per = {.s = sluice::kMaxAdaptiveCount + 1};
  CHECK(sluice::validate(c).message() == "policies[0].rate_limits[0].requests_per.s must be <= " +
                                             std::to_string(sluice::kMaxAdaptiveCount));
  c.policies[0].rate_limits[0].requests_per = {.s = 1};
  c.policies[0].rate_limits[0].adaptive->minimum_factor_permille = 0;
  CHECK(sluice::validate(c).message() ==
        "policies[0].rate_limits[0].adaptive.minimum_factor_permille must be 1 ... 1000");
  c.policies[0].rate_limits[0].adaptive->minimum_factor_permille = 1;
  c.policies[0].rate_limits[0].requests_per = {.s = sluice::kMaxAdaptiveCount};
  sluice::ManualClock clock;
  CHECK(Engine::create(c, {.store = {.seed = 1}, .clock = clock}).ok());
}

TEST_CASE("threads evaluating while others feed responses never exceed the bucket") {
  sluice::ManualClock clock;  // frozen: nothing refills
  Engine engine = make_engine(config(), clock);
  std::atomic<int> count{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        if (t % 2 == 0) {
          (void)engine.record_upstream(on_route("192.0.2.1", "api"),
                                       {.latency = 1s, .status = i % 50 == 0 ? 503 : 200});
        }
        count += engine.evaluate(on_route("203.0.113.7", "api")).allowed;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(count >= 1);   // at least the minimum factor's share of the bucket
  CHECK(count <= 10);  // never more than the full bucket
}

namespace {

// One second of the attack scenario below: the factor at its start and what the six normal
// clients got through during it.
struct AttackSecond {
  std::uint32_t factor = 0;
  int admitted = 0;
};

// Six clients send 5 requests per second each through a 20 per second per-ip adaptive rule
// (target 100 ms) to an upstream that answers in 20 ms; at 5 s one other client sends one
// request that the upstream answers 503 with Retry-After: 300. `seconds` of it, under `adaptive`.
std::vector<AttackSecond> one_client_attack(sluice::AdaptivePolicy adaptive, int seconds) {
  sluice::ManualClock clock;
  sluice::Rule limited = rule("per-ip", {Selector::kIp}, {.s = 20});
  limited.adaptive = adaptive;
  Engine engine = make_engine({.policies = {{.name = "upstream", .rate_limits = {limited}}},
                               .routes = {{.name = "api", .policies = {"upstream"}}}},
                              clock);
  const std::string clients[] = {"198.51.100.1", "198.51.100.2", "198.51.100.3",
                                 "198.51.100.4", "198.51.100.5", "198.51.100.6"};
  std::vector<AttackSecond> out;
  for (int second = 0; second < seconds; ++second) {
    AttackSecond now{.factor = factor(engine)};
    for (int tick = 0; tick < 5; ++tick) {
      if (second == 5 && tick == 0) {
        const sluice::RequestContext attacker = on_route("203.0.113.66", "api");
        REQUIRE(engine.evaluate(attacker).allowed);
        REQUIRE(
            engine.record_upstream(attacker, {.latency = 5ms, .status = 503, .retry_after = 300s})
                .ok());
      }
      for (const std::string& ip : clients) {
        const sluice::RequestContext request = on_route(ip, "api");
        if (!engine.evaluate(request).allowed) continue;
        ++now.admitted;
        REQUIRE(engine.record_upstream(request, {.latency = 20ms}).ok());
      }
      clock.advance(200ms);
    }
    out.push_back(now);
  }
  return out;
}

}  // namespace

// The attack docs/adaptive.md plots beside the normal trajectory. With SLUICE_ADAPTIVE_ATTACK
// set, both runs are written there as CSV
// (second,protected_factor,protected_admitted,unprotected_factor,unprotected_admitted) for
// scripts/plot_adaptive_attack.py.
TEST_CASE("one client's 503 with Retry-After 300 moves no factor under the default protection") {
  constexpr int kSeconds = 330;
  // The defaults: min_samples 5, min_clients 3, max_retry_after 30 s.
  const std::vector<AttackSecond> guarded = one_client_attack({.target_latency = 100ms}, kSeconds);
  // What the rule did before those bounds: one answer from one client, Retry-After up to max_hold.
  const std::vector<AttackSecond> open = one_client_attack(
      {.target_latency = 100ms, .min_samples = 1, .min_clients = 1, .max_retry_after = 300s},
      kSeconds);
  if (const char* out = std::getenv("SLUICE_ADAPTIVE_ATTACK")) {
    std::ofstream csv(out);
    csv << "second,protected_factor,protected_admitted,unprotected_factor,unprotected_admitted\n";
    for (int s = 0; s < kSeconds; ++s) {
      csv << s << ',' << guarded[s].factor << ',' << guarded[s].admitted << ',' << open[s].factor
          << ',' << open[s].admitted << '\n';
    }
  }
  for (int s = 0; s < kSeconds; ++s) {
    INFO("second " << s);
    CHECK(guarded[s].factor == 1000);
    CHECK(guarded[s].admitted == 30);  // every request of the six clients
  }
  CHECK(open[5].factor == 1000);
  CHECK(open[6].factor == 100);    // one answer dropped the rule to its floor for everyone
  CHECK(open[304].factor == 100);  // and held it there for the 300 s the upstream asked
  CHECK(open[6].admitted == 12);   // 2 per second per client: a tenth of 20
  CHECK(open[kSeconds - 1].factor == 1000);
}

// The scenario docs/adaptive.md plots: a client sends 50 requests per second through a 20 per
// second rule for 60 s; the upstream answers in 20 ms, except from 10 s to 20 s (400 ms) and one
// 503 with Retry-After: 5 early in second 30. With SLUICE_ADAPTIVE_TRAJECTORY set, the per-second
// trajectory is written there as CSV (second,factor_permille,admitted) for
// scripts/plot_adaptive.py.
TEST_CASE("a slow-down, a 503 and the recovery move the admitted rate as the control law says") {
  sluice::ManualClock clock;
  sluice::Rule limited = rule("per-ip", {Selector::kIp}, {.s = 20});
  // One client: the control law alone, one answer from it is enough to move the factor.
  limited.adaptive =
      sluice::AdaptivePolicy{.target_latency = 100ms, .min_samples = 1, .min_clients = 1};
  Engine engine = make_engine({.policies = {{.name = "upstream", .rate_limits = {limited}}},
                               .routes = {{.name = "api", .policies = {"upstream"}}}},
                              clock);
  const sluice::RequestContext request = on_route("203.0.113.7", "api");
  std::vector<std::pair<std::uint32_t, int>> seconds;  // factor at the second's start, admitted
  for (int second = 0; second < 60; ++second) {
    const std::uint32_t factor_now = factor(engine);
    int count = 0;
    for (int i = 0; i < 50; ++i) {  // the upstream's first answer in second 30 is the 503
      if (!engine.evaluate(request).allowed) {
        clock.advance(20ms);
        continue;
      }
      ++count;
      sluice::UpstreamResponse response{.latency = 20ms};
      if (second >= 10 && second < 20) response.latency = 400ms;
      if (second == 30 && count == 1) response = {.latency = 5ms, .status = 503, .retry_after = 5s};
      REQUIRE(engine.record_upstream(request, response).ok());
      clock.advance(20ms);
    }
    seconds.emplace_back(factor_now, count);
  }
  if (const char* out = std::getenv("SLUICE_ADAPTIVE_TRAJECTORY")) {
    std::ofstream csv(out);
    csv << "second,factor_permille,admitted\n";
    for (std::size_t s = 0; s < seconds.size(); ++s) {
      csv << s << ',' << seconds[s].first << ',' << seconds[s].second << '\n';
    }
  }
  CHECK(seconds[1] == std::pair<std::uint32_t, int>{1000, 20});  // the burst was spent in second 0
  CHECK(seconds[10].first == 1000);
  CHECK(seconds[11].first == 500);  // the first slow interval halves the factor
  CHECK(seconds[14].first == 100);  // 1000 → 500 → 250 → 125 → the floor
  CHECK(seconds[19] == std::pair<std::uint32_t, int>{100, 2});  // 20/s × 0.1
  // The first second of fast answers recovers, though the average is still above the target
  // (an interval with min_samples answers is judged on them).
  CHECK(seconds[21].first == 200);
  CHECK(seconds[26].first == 700);
  CHECK(seconds[30].first == 1000);
  CHECK(seconds[31].first == 100);  // the 503 dropped it to the floor at once
  CHECK(seconds[35].first == 100);  // held through its Retry-After
  CHECK(seconds[36].first == 200);  // then recovery, 100‰ per healthy second
  CHECK(seconds[44].first == 1000);
  CHECK(seconds[59] == std::pair<std::uint32_t, int>{1000, 20});
  for (std::size_t s = 1; s < seconds.size(); ++s) {
    // Never more than the factor's share of 20 per second, plus one for a partly refilled request.
    CHECK(static_cast<std::uint64_t>(seconds[s].second) <= 20 * seconds[s].first / 1000 + 1);
  }
}
