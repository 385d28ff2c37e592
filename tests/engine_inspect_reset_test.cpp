// The engine's operator calls: inspect(rule label, request) and reset(rule label, request), in
// memory and (SLUICE_TEST_REDIS) over a real redis-server the test starts.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

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

// 3 per minute per client address on /api, 5 per minute per consumer (address when anonymous).
sluice::PolicyConfig config() {
  return {.policies = {{.name = "api",
                        .rate_limits = {{.name = "per-ip",
                                         .selector = {Selector::kIp},
                                         .requests_per = {.minute = 3}},
                                        {.name = "per-consumer",
                                         .selector = {Selector::kCredential},
                                         .requests_per = {.minute = 5}}}}},
          .routes = {{.name = "api", .path_prefix = "/api", .policies = {"api"}}},
          .consumers = {{.name = "alice", .credentials = {"token-a"}}}};
}

// `ip` must outlive the request (RequestContext holds views): literals here.
sluice::RequestContext from(std::string_view ip) {
  return {.client_ip = ip, .route = "api", .path = "/api/x"};
}

using sluice::testing::admitted;

// The same specification for every backend.
template <class E>
void expect_operator_calls(const E& engine) {
  const sluice::RequestContext client = from("203.0.113.7");
  auto fresh = engine.inspect("api/per-ip", client);
  REQUIRE(fresh.ok());
  CHECK(fresh->allowed());
  CHECK(fresh->remaining == 3);

  REQUIRE(admitted(engine, client, 4) == 3);
  auto spent = engine.inspect("api/per-ip", client);
  REQUIRE(spent.ok());
  CHECK(spent->remaining == 0);
  CHECK(spent->limit == 3);
  CHECK(spent->reset_after > 59s);
  // The other rule saw the three admitted requests too (the fourth was denied, consuming none).
  CHECK(engine.inspect("api/per-consumer", client)->remaining == 2);
  // Inspecting consumed nothing.
  CHECK(admitted(engine, client, 1) == 0);

  // Resetting by label and attributes frees that client in that rule only.
  REQUIRE(engine.reset("api/per-ip", client).ok());
  CHECK(engine.inspect("api/per-ip", client)->remaining == 3);
  CHECK(engine.inspect("api/per-consumer", client)->remaining == 2);
  CHECK(admitted(engine, client, 3) == 2);  // the per-consumer rule binds now
  CHECK(engine.inspect("api/per-ip", from("203.0.113.8"))->remaining == 3);

  // Attributes choose the key: an authenticated consumer is keyed by credential, not address.
  sluice::RequestContext alice = from("198.51.100.1");
  alice.credential = "token-a";
  alice.consumer = "alice";
  REQUIRE(admitted(engine, alice, 1) == 1);
  sluice::RequestContext alice_elsewhere = from("198.51.100.99");
  alice_elsewhere.credential = "token-a";
  alice_elsewhere.consumer = "alice";
  CHECK(engine.inspect("api/per-consumer", alice_elsewhere)->remaining == 4);

  CHECK(engine.inspect("api/nope", client).status().code() == absl::StatusCode::kNotFound);
  CHECK(engine.reset("nope", client).code() == absl::StatusCode::kNotFound);
}

}  // namespace

TEST_CASE("the engine inspects and resets one rule's key chosen by request attributes") {
  sluice::ManualClock clock;
  auto engine = Engine::create(config(), {.store = {.seed = 1}, .clock = clock});
  REQUIRE(engine.ok());
  expect_operator_calls(*engine);
}

TEST_CASE("inspecting an adaptive rule reports requests at its current factor") {
  sluice::ManualClock clock;
  sluice::PolicyConfig c = config();
  c.policies[0].rate_limits.resize(1);
  c.policies[0].rate_limits[0].requests_per = {.s = 10};
  sluice::AdaptivePolicy adaptive;
  adaptive.target_latency = 100ms;
  adaptive.minimum_factor_permille = 500;
  adaptive.max_hold = 10s;
  adaptive.min_samples = 1;  // one client's 503 is enough here
  adaptive.min_clients = 1;
  c.policies[0].rate_limits[0].adaptive = adaptive;
  auto engine = Engine::create(c, {.store = {.seed = 1}, .clock = clock});
  REQUIRE(engine.ok());
  const sluice::RequestContext client = from("203.0.113.7");
  CHECK(engine->inspect("api/per-ip", client)->remaining == 10);
  // A 503 drops the factor to its minimum at once: the bucket halves.
  REQUIRE(engine->record_upstream(client, {.latency = 1ms, .status = 503}).ok());
  auto halved = engine->inspect("api/per-ip", client);
  REQUIRE(halved.ok());
  CHECK(halved->limit == 5);
  CHECK(halved->remaining == 5);
}

#ifdef SLUICE_TEST_REDIS
TEST_CASE(
    "over Redis, the engine inspects and resets one rule's key chosen by request attributes") {
  sluice_test::RedisFixture server;
  auto client = sluice::redis::Client::create(server.options());
  REQUIRE(client.ok());
  auto engine = sluice::redis::RedisRateLimitEngine::create(config(), {.client = *client});
  INFO(engine.status());
  REQUIRE(engine.ok());
  expect_operator_calls(*engine);
}
#endif

TEST_CASE("an unknown rule label reaches the NotFound message escaped and bounded", "[attack]") {
  // An operator endpoint passes a label from its own request (`/admin/reset?rule=...`) and logs
  // the error: a line feed or a terminal escape in the label must not forge or hide log lines,
  // and a megabyte of label must not become a megabyte of log.
  sluice::ManualClock clock;
  auto engine = Engine::create(config(), {.store = {.seed = 1}, .clock = clock});
  REQUIRE(engine.ok());
  const sluice::RequestContext client = from("203.0.113.7");
  const std::string forged = "api/nope\n2026-12-07T00:00:00Z admin: all keys reset\x1b[2J";
  const auto has_control_byte = [](const std::string& text) {
    return std::any_of(text.begin(), text.end(), [](char c) {
      const auto byte = static_cast<unsigned char>(c);
      return byte < 0x20 || byte == 0x7f;
    });
  };
  const absl::Status inspected = engine->inspect(forged, client).status();
  const absl::Status reset = engine->reset(forged, client);
  for (const absl::Status& s : {inspected, reset}) {
    CHECK(s.code() == absl::StatusCode::kNotFound);
    const std::string message(s.message());
    CHECK_FALSE(has_control_byte(message));
    CHECK(message.find("api/nope\\x0a2026") != std::string::npos);
  }
  const std::string huge(1 << 20, 'x');
  CHECK(engine->inspect(huge, client).status().message().size() < 1024);
}

TEST_CASE("a route or service name a caller passes reaches an error message bounded", "[attack]") {
  // An operator endpoint passes the route from its own request; an integration may pass a
  // service taken from a request. A megabyte of either must not become a megabyte of log.
  sluice::ManualClock clock;
  sluice::PolicyConfig routed{
      .policies = {{.name = "api",
                    .rate_limits = {{.name = "per-route",
                                     .selector = {Selector::kRoute},
                                     .requests_per = {.minute = 3}}}}},
      .routes = {{.name = "api", .service = "svc", .path_prefix = "/api", .policies = {"api"}}},
      .services = {{.name = "svc"}}};
  auto engine = Engine::create(routed, {.store = {.seed = 1}, .clock = clock});
  REQUIRE(engine.ok());
  const std::string huge(1 << 20, 'r');
  const sluice::RequestContext unknown_route{
      .client_ip = "203.0.113.7", .route = huge, .path = "/api/x"};
  const absl::Status inspected = engine->inspect("api/per-route", unknown_route).status();
  CHECK(inspected.code() == absl::StatusCode::kNotFound);
  CHECK(inspected.message().size() < 1024);

  const sluice::RequestContext other_service{
      .client_ip = "203.0.113.7", .route = "api", .service = huge, .path = "/api/x"};
  const sluice::Evaluation e = engine->evaluate(other_service);
  CHECK(e.backend_error.code() == absl::StatusCode::kInvalidArgument);
  CHECK(e.backend_error.message().size() < 1024);
}
