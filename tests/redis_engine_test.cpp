// The policy engine over Redis (sluice::redis::RedisEngineBackend) against a real redis-server
// that each test case starts for itself, and the Redis limiter's parity with the in-memory one.
//
// Time: tests that need exact values hand the script a server time through the client's time
// source (ClientOptions::time_source) and compare with the in-memory side on a ManualClock at the
// same instants; tests on the real TIME only assert what sub-second timing cannot change.
#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "example_config.hpp"
#include "redis_fixture.hpp"
#include "redis_server.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"
#include "sluice/gcra.hpp"
#include "sluice/redis.hpp"
#include "sluice/redis/engine_backend.hpp"
#include "sluice/runtime_engine.hpp"

namespace {

using namespace std::chrono_literals;
using sluice::Decision;
using sluice::Selector;
using sluice::redis::RedisEngineBackend;
using sluice::redis::RedisRateLimitEngine;
using sluice::testing::documented_example;
using sluice::testing::field;
using sluice::testing::kWall;
using sluice::testing::on_route;
using sluice::testing::rule;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

using MemoryEngine = sluice::BasicRateLimitEngine<sluice::InMemoryBackend<sluice::ManualClock>>;
constexpr nanoseconds kT0 = std::chrono::seconds(1'700'000'000);  // server time, ns since epoch
// A private redis-server (sluice_test::RedisFixture) and the engine tests' own probes of it.
struct Server : sluice_test::RedisFixture {
  // A client whose scripts keep every key an hour longer than its windows need (hold_keys).
  // With `clock`, the scripts decide at kT0 + clock.now(): the same instants as an in-memory
  // limiter or engine on `clock`.
  std::shared_ptr<sluice::redis::Client> client_holding_keys(
      std::optional<sluice::ManualClock> clock = std::nullopt) const {
    sluice::redis::ClientOptions o = options();
    if (clock) o.time_source = [clock] { return kT0 + clock->now(); };
    auto made = sluice::redis::Client::create(o);
    REQUIRE(made.ok());
    std::shared_ptr<sluice::redis::Client> c = *std::move(made);
    sluice_test::hold_keys(*c);
    return c;
  }
  // The names of the commands that clients send while `body` runs (not those a script issues).
  template <class Body>
  std::vector<std::string> monitor(Body body) const {
    redisContext* c = redisConnectUnix(redis.unix_socket().c_str());
    REQUIRE(c != nullptr);
    REQUIRE(c->err == 0);
    const timeval timeout{5, 0};
    redisSetTimeout(c, timeout);
    sluice_test::Reply ok(static_cast<redisReply*>(redisCommand(c, "MONITOR")));
    REQUIRE(ok);
    body();
    const std::string marker = "sluice-monitor-end";
    redis.command({"ECHO", marker});
    std::vector<std::string> names;
    for (;;) {
      void* raw = nullptr;
      if (redisGetReply(c, &raw) != REDIS_OK || raw == nullptr) break;  // timed out: fails below
      sluice_test::Reply line(static_cast<redisReply*>(raw));
      const std::string_view text(line->str, line->len);  // ts [db source] "CMD" "arg" ...
      if (text.find(marker) != std::string_view::npos) {
        redisFree(c);
        return names;
      }
      const std::size_t source = text.find('[');
      if (text.substr(source, 7) == "[0 lua]") continue;
      const std::size_t name = text.find('"', source) + 1;
      names.emplace_back(text.substr(name, text.find('"', name) - name));
    }
    redisFree(c);
    FAIL("MONITOR never showed the end marker");
    return names;
  }
  // Calls per command name since the last CONFIG RESETSTAT (INFO commandstats).
  std::map<std::string, std::uint64_t> command_calls() const {
    std::map<std::string, std::uint64_t> calls;
    sluice_test::Reply info = redis.command({"INFO", "commandstats"});
    REQUIRE(info);
    REQUIRE(info->str != nullptr);
    const std::string_view text(info->str, info->len);
    std::size_t pos = 0;
    while ((pos = text.find("cmdstat_", pos)) != std::string_view::npos) {
      const std::size_t colon = text.find(':', pos);
      const std::size_t value = text.find("calls=", colon) + 6;
      const std::size_t end = text.find(',', value);
      std::uint64_t count = 0;
      const auto parsed = std::from_chars(text.data() + value, text.data() + end, count);
      REQUIRE(parsed.ec == std::errc());
      calls[std::string(text.substr(pos + 8, colon - pos - 8))] = count;
      pos = end;
    }
    return calls;
  }
};

// Two rules on one route, one tight: the all_or_nothing and every_rule cases.
sluice::PolicyConfig tight_and_loose(sluice::ConsumptionMode mode) {
  return {.policies = {{.name = "tight",
                        .rate_limits = {rule("tight", {Selector::kIp}, {.minute = 1})}},
                       {.name = "loose",
                        .rate_limits = {rule("loose", {Selector::kIp}, {.minute = 10})}}},
          .routes = {{.name = "both", .policies = {"tight", "loose"}},
                     {.name = "loose-only", .policies = {"loose"}}},
          .engine = {.consumption = mode}};
}

RedisRateLimitEngine make(const sluice::PolicyConfig& config, RedisEngineBackend::Options options) {
  auto engine = RedisRateLimitEngine::create(config, std::move(options));
  INFO(engine.status());
  REQUIRE(engine.ok());
  return *std::move(engine);
}

int admitted(const RedisRateLimitEngine& engine, const sluice::RequestContext& request, int n) {
  int count = 0;
  for (int i = 0; i < n; ++i) {
    sluice::Evaluation e = engine.evaluate(request);
    INFO(e.backend_error);
    REQUIRE(e.backend_error.ok());
    count += e.allowed;
  }
  return count;
}

// Runs the same 120 scripted requests (two clients, costs 1 and 3) through both engines: the
// first `at_once` at one instant, then the clock steps through the parity steps. Checks that the
// evaluations agree field by field; returns how many of the first `at_once` Redis admitted.
int expect_same_evaluations(const RedisRateLimitEngine& redis, const MemoryEngine& memory,
                            sluice::ManualClock& clock, int at_once) {
  const nanoseconds steps[] = {0ns, 0ns, 1ms, 0ns, 99ms, 1ns, 333'333'333ns, 0ns, 2s, 0ns, 70s};
  int step = 0;
  int admissions = 0;
  for (int i = 0; i < 120; ++i) {
    if (i >= at_once) clock.advance(steps[step++ % std::size(steps)]);
    sluice::RequestContext request =
        on_route(i % 7 == 6 ? "198.51.100.1" : "203.0.113.7", "public");
    request.cost = i % 5 == 4 ? 3 : 1;
    const sluice::Evaluation r = redis.evaluate(request);
    const sluice::Evaluation m = memory.evaluate(request);
    INFO("request " << i << ": " << r.backend_error);
    REQUIRE(r.backend_error.ok());
    CHECK(r.allowed == m.allowed);
    CHECK(r.binding == m.binding);
    CHECK(r.retry_after == m.retry_after);
    CHECK(r.fields == m.fields);
    if (i < at_once) admissions += r.allowed;
  }
  return admissions;
}

}  // namespace

static_assert(sluice::EngineBackend<RedisEngineBackend>);

TEST_CASE("the documented example over Redis admits 20 per ip then denies in one round trip each") {
  Server server;
  RedisRateLimitEngine engine = make(documented_example(), {.client = server.client()});
  // Open the engine's connection (its connect and memory check are not an evaluation's), load
  // the script and clear the counters, so every command counted below is an evaluation's.
  REQUIRE(engine.evaluate(on_route("192.0.2.200", "public")).backend_error.ok());
  server.redis.command({"SCRIPT", "LOAD", sluice::redis::kGcraScript});
  server.redis.command({"CONFIG", "RESETSTAT"});
  std::vector<sluice::Evaluation> evaluations;  // back to back: 21 take far less than 100 ms
  for (int i = 1; i <= 21; ++i)
    evaluations.push_back(engine.evaluate(on_route("203.0.113.7", "public")));
  CHECK(server.command_calls()["evalsha"] == 21);  // both rules in one script call each
  for (int i = 1; i <= 21; ++i) {
    const sluice::Evaluation& e = evaluations[i - 1];
    INFO("request " << i << ": " << e.backend_error);
    REQUIRE(e.backend_error.ok());
    CHECK(e.live_rules == 2);
    if (i <= 20) {
      REQUIRE(e.allowed);
      CHECK(field(e, "X-RateLimit-Remaining") == std::to_string(20 - i));
      continue;
    }
    CHECK_FALSE(e.allowed);  // the 100 ms that refill one request have not passed
    CHECK(engine.rule(e.binding->rule).compiled.label == "public-api-limits/per-ip");
    CHECK(e.binding->decision.binding_window == 0);
    CHECK(field(e, "Retry-After") == "1");
    CHECK(field(e, "X-RateLimit-Limit") == "20");
    CHECK(field(e, "X-RateLimit-Remaining") == "0");
    CHECK(field(e, "RateLimit-Policy") ==
          "\"public-api-limits/per-ip/s\";q=10;w=1, "
          "\"public-api-limits/per-ip/minute\";q=600;w=60");
    CHECK(field(e, "RateLimit").starts_with("\"public-api-limits/per-ip/s\";r=0;t="));
  }

  // MONITOR lists every command a client sends (script-issued ones tagged "lua"): another ip's
  // 21 evaluations send exactly 21 EVALSHA and nothing else, so each sends exactly one.
  std::vector<std::string> sent = server.monitor([&] {
    for (int i = 0; i < 21; ++i) engine.evaluate(on_route("198.51.100.1", "public"));
  });
  CHECK(sent == std::vector<std::string>(21, "EVALSHA"));
}

TEST_CASE("the documented example over Redis gives the in-memory engine's evaluations exactly") {
  Server server;
  sluice::ManualClock clock;
  RedisRateLimitEngine redis =
      make(documented_example(), {.client = server.client_holding_keys(clock)});
  auto memory = MemoryEngine::create(documented_example(), {.store = {.seed = 1}, .clock = clock});
  REQUIRE(memory.ok());
  expect_same_evaluations(redis, *memory, clock, 21);

  // The 21st request of a fresh ip at one instant: the documented 429, exactly.
  for (int i = 0; i < 20; ++i) REQUIRE(redis.evaluate(on_route("192.0.2.1", "public")).allowed);
  sluice::Evaluation denied = redis.evaluate(on_route("192.0.2.1", "public"));
  CHECK_FALSE(denied.allowed);
  CHECK(denied.fields == sluice::HttpFields{
                             {"Retry-After", "1"},
                             {"X-RateLimit-Limit", "20"},
                             {"X-RateLimit-Remaining", "0"},
                             {"X-RateLimit-Reset", "1700000002"},
                             {"RateLimit-Policy",
                              "\"public-api-limits/per-ip/s\";q=10;w=1, "
                              "\"public-api-limits/per-ip/minute\";q=600;w=60"},
                             {"RateLimit", "\"public-api-limits/per-ip/s\";r=0;t=1"},
                         });
  CHECK(denied.retry_after == 100ms);
  clock.advance(100ms);
  CHECK(redis.evaluate(on_route("192.0.2.1", "public")).allowed);
}

TEST_CASE(
    "an adaptive rule over Redis gives the in-memory engine's evaluations at a reduced factor") {
  Server server;
  sluice::ManualClock clock;
  sluice::PolicyConfig config = documented_example();
  config.policies[0].rate_limits[0].adaptive =
      sluice::AdaptivePolicy{.target_latency = 100ms,
                             .minimum_factor_permille = 500,
                             .max_hold = 2h,
                             .min_samples = 1,  // one client's 503 is enough here
                             .min_clients = 1,
                             .max_retry_after = 2h};
  RedisRateLimitEngine redis = make(config, {.client = server.client_holding_keys(clock)});
  auto memory = MemoryEngine::create(config, {.store = {.seed = 1}, .clock = clock});
  REQUIRE(memory.ok());
  // A 503 holding for an hour: both controllers sit at 500‰ for the whole run, whatever their
  // clocks (the Redis engine's controller runs on the steady clock).
  const sluice::UpstreamResponse overloaded{.latency = 1ms, .status = 503, .retry_after = 1h};
  REQUIRE(redis.record_upstream(on_route("203.0.113.7", "public"), overloaded).ok());
  REQUIRE(memory->record_upstream(on_route("203.0.113.7", "public"), overloaded).ok());
  const int admissions = expect_same_evaluations(redis, *memory, clock, 11);
  // At one instant, half of 203.0.113.7's burst of 20: requests 0-5, 7 and 8 (costs 1, 1, 1, 1,
  // 3, 1, 1, 1); request 9 (cost 3) and 10 find no room. Request 6 is another client's.
  CHECK(admissions == 9);
  CHECK(redis.stats()[0].adaptive->factor_permille == 500);
}

TEST_CASE("all_or_nothing over Redis consumes nothing in admitting rules when one rule denies") {
  Server server;
  RedisRateLimitEngine engine =
      make(tight_and_loose(sluice::ConsumptionMode::kAllOrNothing), {.client = server.client()});
  CHECK(admitted(engine, on_route("10.0.0.1", "both"), 5) == 1);
  // The loose rule saw one admitted request only: 9 left, so this one leaves 8.
  CHECK(field(engine.evaluate(on_route("10.0.0.1", "loose-only")), "X-RateLimit-Remaining") == "8");
}

TEST_CASE("every_rule over Redis lets admitting rules consume when another rule denies") {
  Server server;
  RedisRateLimitEngine engine =
      make(tight_and_loose(sluice::ConsumptionMode::kEveryRule), {.client = server.client()});
  server.redis.command({"SCRIPT", "LOAD", sluice::redis::kGcraScript});
  server.redis.command({"CONFIG", "RESETSTAT"});
  CHECK(admitted(engine, on_route("10.0.0.1", "both"), 5) == 1);
  CHECK(server.command_calls()["evalsha"] == 10);  // one script call per rule, pipelined
  CHECK(field(engine.evaluate(on_route("10.0.0.1", "loose-only")), "X-RateLimit-Remaining") == "4");
}

TEST_CASE("a killed Redis fails open or closed as configured and a restart recovers") {
  Server server;
  sluice::PolicyConfig config = documented_example();
  RedisRateLimitEngine open = make(config, {.client = server.client(milliseconds(300))});
  config.engine.on_backend_error = sluice::FailureMode::kFailClosed;
  RedisRateLimitEngine closed = make(config, {.client = server.client(milliseconds(300))});
  REQUIRE(admitted(open, on_route("10.0.0.1", "public"), 1) == 1);
  REQUIRE(admitted(closed, on_route("10.0.0.2", "public"), 1) == 1);

  server.redis.kill();
  const auto start = std::chrono::steady_clock::now();
  sluice::Evaluation e = open.evaluate(on_route("10.0.0.1", "public"));
  CHECK(e.allowed);
  CHECK(e.backend_error.code() == absl::StatusCode::kUnavailable);
  CHECK(e.fields.empty());
  sluice::Evaluation c = closed.evaluate(on_route("10.0.0.2", "public"));
  CHECK_FALSE(c.allowed);
  CHECK(c.backend_error.code() == absl::StatusCode::kUnavailable);
  CHECK(std::chrono::steady_clock::now() - start < 2s);

  REQUIRE(server.redis.restart().empty());  // an empty server: no state, no script
  sluice::Evaluation after = closed.evaluate(on_route("10.0.0.2", "public"));
  INFO(after.backend_error);
  CHECK(after.backend_error.ok());
  CHECK(after.allowed);
  CHECK(field(after, "X-RateLimit-Remaining") == "19");
  CHECK(open.evaluate(on_route("10.0.0.1", "public")).backend_error.ok());
}

TEST_CASE("a client and an engine over a stock redis-server are refused at creation") {
  Server server;
  server.redis.set_extra_args({"--maxmemory", "0", "--maxmemory-policy", "noeviction"});
  REQUIRE(server.redis.restart().empty());
  auto client = sluice::redis::Client::create(server.options(milliseconds(300)));
  INFO(client.status());
  CHECK(client.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(client.status().message().find("CONFIG SET maxmemory-policy volatile-ttl") !=
        std::string_view::npos);

  // A client made while Redis was down is created all the same; the engine checks the server.
  server.redis.kill();
  auto lazy = sluice::redis::Client::create(server.options(milliseconds(300)));
  REQUIRE(lazy.ok());
  REQUIRE(server.redis.restart().empty());
  auto engine = RedisRateLimitEngine::create(documented_example(), {.client = *lazy});
  INFO(engine.status());
  CHECK(engine.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(engine.status().message().find("CONFIG SET maxmemory <bytes>") != std::string_view::npos);
  CHECK(server.redis.keys().empty());

  REQUIRE(server.redis.command({"CONFIG", "SET", "maxmemory", "64mb"}));
  REQUIRE(server.redis.command({"CONFIG", "SET", "maxmemory-policy", "volatile-ttl"}));
  RedisRateLimitEngine fixed = make(documented_example(), {.client = *lazy});
  CHECK(admitted(fixed, on_route("10.0.0.1", "public"), 1) == 1);
  CHECK_FALSE(server.redis.keys().empty());
}

TEST_CASE("a reload over Redis keeps an unchanged rule's state and carries a changed rule's") {
  Server server;
  sluice::PolicyConfig config{
      .policies = {{.name = "a", .rate_limits = {rule("same", {Selector::kIp}, {.minute = 2})}},
                   {.name = "b",
                    .rate_limits = {rule("changing", {Selector::kIp}, {.minute = 2})}}},
      .routes = {{.name = "x", .policies = {"a"}}, {.name = "y", .policies = {"b"}}}};
  RedisRateLimitEngine first = make(config, {.client = server.client()});
  CHECK(admitted(first, on_route("10.0.0.1", "x"), 3) == 2);
  CHECK(admitted(first, on_route("10.0.0.1", "y"), 3) == 2);
  CHECK(server.redis.keys().size() == 2);

  config.policies[1].rate_limits[0].requests_per.minute = 3;
  auto second = first.reload(config);
  REQUIRE(second.ok());
  CHECK(admitted(*second, on_route("10.0.0.1", "x"), 3) == 0);  // nothing extra across a reload
  // The changed rule's key had spent its whole bucket: it has spent the whole new one too.
  CHECK(admitted(*second, on_route("10.0.0.1", "y"), 5) == 0);
  CHECK(server.redis.keys().size() == 3);  // the same key for `same`, a new one for `changing`
  CHECK(second->stats()[0].admitted == 2);
  CHECK(second->stats()[0].denied == 4);
  CHECK(second->stats()[0].store == sluice::StoreStats{});  // the keys live in Redis
}

namespace {

// One ip on one route under `windows`.
sluice::PolicyConfig per_ip(sluice::RequestsPer windows,
                            sluice::ConsumptionMode mode = sluice::ConsumptionMode::kAllOrNothing) {
  return {.policies = {{.name = "p", .rate_limits = {rule("per-ip", {Selector::kIp}, windows)}}},
          .routes = {{.name = "x", .policies = {"p"}}},
          .engine = {.consumption = mode}};
}

// Sends `request` `n` times to both engines; checks that they decide each one alike, field by
// field; returns how many Redis admitted.
template <class Remote>
int same_admissions(const Remote& remote, const MemoryEngine& memory,
                    const sluice::RequestContext& request, int n) {
  int count = 0;
  for (int i = 0; i < n; ++i) {
    const sluice::Evaluation r = remote.evaluate(request);
    const sluice::Evaluation m = memory.evaluate(request);
    INFO("request " << i << ": " << r.backend_error);
    REQUIRE(r.backend_error.ok());
    CHECK(r.allowed == m.allowed);
    CHECK(r.retry_after == m.retry_after);
    CHECK(r.fields == m.fields);
    count += r.allowed;
  }
  return count;
}

// A Redis engine and an in-memory one on `clock`, both on `config`, reloaded together.
struct Twins {
  RedisRateLimitEngine redis;
  MemoryEngine memory;

  void reload(const sluice::PolicyConfig& config) {
    auto r = redis.reload(config);
    auto m = memory.reload(config);
    REQUIRE(r.ok());
    REQUIRE(m.ok());
    redis = *std::move(r);
    memory = *std::move(m);
  }
  int same(const sluice::RequestContext& request, int n) {
    return same_admissions(redis, memory, request, n);
  }
};

Twins twins(const Server& server, sluice::ManualClock clock, const sluice::PolicyConfig& config) {
  auto memory = MemoryEngine::create(config, {.store = {.seed = 1}, .clock = clock});
  REQUIRE(memory.ok());
  return {make(config, {.client = server.client_holding_keys(clock)}), *std::move(memory)};
}

}  // namespace

TEST_CASE("a limit lowered over Redis mid-burst leaves each client its spent share, as memory") {
  Server server;
  sluice::ManualClock clock;
  Twins t = twins(server, clock, per_ip({.minute = 100}));
  const sluice::RequestContext a = on_route("10.0.0.1", "x");
  CHECK(t.same(a, 60) == 60);
  clock.advance(1ns);

  t.reload(per_ip({.minute = 10}));
  CHECK(t.same(a, 20) == 4);                           // 40 % of the new 10, not a fresh 10
  CHECK(t.same(on_route("10.0.0.2", "x"), 20) == 10);  // a client the old rule never saw
  clock.advance(6s);                                   // one emission interval of 10/minute
  CHECK(t.same(a, 3) == 1);
  clock.advance(59s);  // 9.83 emission intervals
  CHECK(t.same(a, 12) == 9);

  // A new client's first check looks for a state to carry (the script's CARRY reply, the read
  // of its old key, the check) until no key can hold state under the old windows: their refill
  // (60 s) plus a minute's margin after the reload. Then it is one call again.
  REQUIRE(server.redis.command({"CONFIG", "RESETSTAT"}));
  CHECK(t.same(on_route("10.0.0.3", "x"), 1) == 1);
  CHECK(server.command_calls()["evalsha"] == 3);
  clock.advance(2min);
  REQUIRE(server.redis.command({"CONFIG", "RESETSTAT"}));
  CHECK(t.same(on_route("10.0.0.4", "x"), 1) == 1);
  CHECK(server.command_calls()["evalsha"] == 1);
}

TEST_CASE("a limit raised over Redis gives no more than the share a client had left, as memory") {
  Server server;
  sluice::ManualClock clock;
  Twins t = twins(server, clock, per_ip({.minute = 100}));
  const sluice::RequestContext a = on_route("10.0.0.1", "x");
  CHECK(t.same(a, 60) == 60);
  clock.advance(333'333'333ns);

  t.reload(per_ip({.minute = 1000}));
  // 40.55 % of 100 left (a third of a second refilled 0.55), so 405 of 1000, rounded down.
  CHECK(t.same(a, 420) == 405);
}

TEST_CASE("a window added over Redis starts full and a removed one is dropped, as memory") {
  Server server;
  sluice::ManualClock clock;
  Twins t = twins(server, clock, per_ip({.minute = 100}));
  const sluice::RequestContext a = on_route("10.0.0.1", "x");
  CHECK(t.same(a, 95) == 95);

  t.reload(per_ip({.s = 3, .minute = 100}));  // the minute window keeps its 95 spent
  CHECK(t.same(a, 10) == 3);
  clock.advance(1s);
  CHECK(t.same(a, 10) == 3);  // the minute window's 2 left + 1.67 refilled, the second's 3

  t.reload(per_ip({.s = 3}));  // the second window alone: its state is carried
  CHECK(t.same(a, 10) == 0);
  clock.advance(1s);
  CHECK(t.same(a, 10) == 3);
}

TEST_CASE("two limit changes over Redis in a row carry a key the middle one never saw") {
  Server server;
  sluice::ManualClock clock;
  Twins t = twins(server, clock, per_ip({.minute = 100}));
  const sluice::RequestContext a = on_route("10.0.0.1", "x");
  CHECK(t.same(a, 50) == 50);
  t.reload(per_ip({.minute = 20}));
  t.reload(per_ip({.minute = 10}));
  CHECK(t.same(a, 10) == 5);
}

TEST_CASE("a lowered limit over Redis is carried in both modes and for a settled request") {
  for (auto mode : {sluice::ConsumptionMode::kAllOrNothing, sluice::ConsumptionMode::kEveryRule}) {
    Server server;
    sluice::ManualClock clock;
    Twins t = twins(server, clock, per_ip({.minute = 100}, mode));
    const sluice::RequestContext a = on_route("10.0.0.1", "x");
    CHECK(t.same(a, 60) == 60);
    t.reload(per_ip({.minute = 10}, mode));
    sluice::Evaluation r, m;
    RedisRateLimitEngine::Settlement booked;
    MemoryEngine::Settlement expected;
    t.redis.evaluate(a, r, booked);  // the key's first check after the reload carries it
    t.memory.evaluate(a, m, expected);
    REQUIRE(r.backend_error.ok());
    CHECK(r.fields == m.fields);
    REQUIRE(booked.open());
    REQUIRE(t.redis.settle(booked, 3).ok());
    REQUIRE(t.memory.settle(expected, 3).ok());
    CHECK(t.same(a, 10) == 1);  // 4 carried, 3 settled
  }
}

TEST_CASE("a charge settled over Redis after a reload and the key's next check lands as in memory",
          "[attack]") {
  Server server;
  sluice::ManualClock clock;
  Twins t = twins(server, clock, per_ip({.minute = 100}));
  const sluice::RequestContext a = on_route("10.0.0.1", "x");
  sluice::Evaluation r, m;
  RedisRateLimitEngine::Settlement booked;
  MemoryEngine::Settlement expected;
  t.redis.evaluate(a, r, booked);
  t.memory.evaluate(a, m, expected);
  REQUIRE(booked.open());
  REQUIRE(expected.open());
  t.reload(per_ip({.minute = 200}));
  CHECK(t.same(a, 1) == 1);  // the key's first check in the new generation carries it
  // The request turned out to cost 150: 149 more units, charged under the new rule too.
  REQUIRE(t.redis.settle(booked, 150).ok());
  REQUIRE(t.memory.settle(expected, 150).ok());
  CHECK(t.same(a, 100) == 48);  // 200 − 2 carried and checked − 150 settled
}

TEST_CASE("settling a request of six rules waits for a stalled Redis one command timeout",
          "[attack]") {
#if defined(ABSL_HAVE_THREAD_SANITIZER) || defined(ABSL_HAVE_ADDRESS_SANITIZER)
  constexpr milliseconds kSlack(1500);
#else
  constexpr milliseconds kSlack(500);
#endif
  Server server;
  sluice::PolicyConfig config{.routes = {{.name = "x", .policies = {"p"}}}};
  config.policies.push_back({.name = "p"});
  for (int r = 1; r <= 6; ++r) {
    config.policies[0].rate_limits.push_back(
        rule(absl::StrCat("rule-", r), {Selector::kIp}, {.minute = 100u * r}));
  }
  RedisRateLimitEngine engine = make(config, {.client = server.client(300ms)});
  sluice::Evaluation e;
  RedisRateLimitEngine::Settlement settlement;
  engine.evaluate(on_route("10.0.0.1", "x"), e, settlement);
  REQUIRE(settlement.open());
  server.redis.stop();
  const auto start = std::chrono::steady_clock::now();
  const absl::Status settled = engine.settle(settlement, 50);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  server.redis.resume();
  CHECK(settled.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(elapsed < 300ms + kSlack);
}

TEST_CASE("a reset after a limit change over Redis gives the new burst, not a carried one") {
  Server server;
  sluice::ManualClock clock;
  Twins t = twins(server, clock, per_ip({.minute = 100}));
  const sluice::RequestContext a = on_route("10.0.0.1", "x");
  CHECK(t.same(a, 100) == 100);
  t.reload(per_ip({.minute = 10}));
  REQUIRE(t.redis.reset("p/per-ip", a).ok());
  CHECK(t.redis.inspect("p/per-ip", a)->remaining == 10);
}

TEST_CASE("two Redis engines on separate clients share one budget exactly") {
  Server server;
  sluice::PolicyConfig config{
      .policies = {{.name = "shared",
                    .rate_limits = {rule("per-ip", {Selector::kIp}, {.hour = 50}),
                                    rule("per-route", {Selector::kIp, Selector::kRoute},
                                         {.hour = 1000})}}},
      .routes = {{.name = "public", .policies = {"shared"}}}};
  RedisRateLimitEngine replica_a = make(config, {.client = server.client()});
  RedisRateLimitEngine replica_b = make(config, {.client = server.client()});
  std::atomic<int> allowed{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    const RedisRateLimitEngine& engine = t % 2 == 0 ? replica_a : replica_b;
    threads.emplace_back([&engine, &allowed, &errors] {
      for (int i = 0; i < 30; ++i) {
        sluice::Evaluation e = engine.evaluate(on_route("10.0.0.1", "public"));
        errors += e.backend_error.ok() ? 0 : 1;
        allowed += e.allowed ? 1 : 0;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(errors == 0);
  CHECK(allowed == 50);  // 180 attempts; one more token takes 72 s
}

TEST_CASE("a rule outside the Redis range is an invalid argument naming the rule") {
  Server server;
  sluice::PolicyConfig config = documented_example();
  // 2000 per hour as a bucket refills in 2000 h (83 days): valid in memory, beyond 2^52 ns.
  config.policies[0].rate_limits.push_back(rule("slow", {Selector::kIp}, {.hour = 1}, 2000));
  auto engine = RedisRateLimitEngine::create(config, {.client = server.client()});
  REQUIRE_FALSE(engine.ok());
  CHECK(engine.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(engine.status().message()).starts_with("public-api-limits/slow: "));

  auto no_client = RedisRateLimitEngine::create(documented_example(), {});
  CHECK(no_client.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a cost above a rule's burst over Redis denies and consumes nothing anywhere") {
  Server server;
  RedisRateLimitEngine engine = make(documented_example(), {.client = server.client()});
  sluice::RequestContext request = on_route("10.0.0.1", "public");
  request.cost = 21;
  sluice::Evaluation e = engine.evaluate(request);
  CHECK_FALSE(e.allowed);
  CHECK(e.backend_error.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(e.backend_error.message()).starts_with("public-api-limits/per-ip: "));
  CHECK(server.redis.keys().empty());
}

// --- Parity of RedisGcraLimiter with the in-memory GcraLimiter ---------------------------------

namespace {

struct Step {
  nanoseconds advance;
  std::string_view key;
  std::uint64_t cost;
};

// Runs `steps` through both limiters at the same instants (Redis at kT0 + the manual clock) and
// requires identical decisions, field by field. Returns how many were denied.
int run_parity(Server& server, const std::vector<sluice::GcraWindow>& windows,
               const std::vector<Step>& steps) {
  sluice::ManualClock clock;
  auto memory = sluice::GcraLimiter<sluice::ManualClock>::create(windows, {.seed = 7}, clock);
  REQUIRE(memory.ok());
  auto redis = sluice::redis::RedisGcraLimiter::create(windows, server.client_holding_keys(clock));
  REQUIRE(redis.ok());
  int denied = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    clock.advance(steps[i].advance);
    absl::StatusOr<Decision> m = memory->check(steps[i].key, steps[i].cost);
    absl::StatusOr<Decision> r = redis->check(steps[i].key, steps[i].cost);
    INFO("step " << i << " at " << clock.now().count() << " ns, key " << steps[i].key << ", cost "
                 << steps[i].cost);
    REQUIRE(m.ok());
    INFO(r.status());
    REQUIRE(r.ok());
    CHECK(r->reason == m->reason);
    CHECK(r->limit == m->limit);
    CHECK(r->remaining == m->remaining);
    CHECK(r->retry_after == m->retry_after);
    CHECK(r->reset_after == m->reset_after);
    CHECK(r->binding_window == m->binding_window);
    denied += m->allowed() ? 0 : 1;
  }
  return denied;
}

// A reproducible mix of bursts, exact and odd gaps, peeks and costs up to `max_cost`.
std::vector<Step> scripted(std::uint64_t max_cost, std::uint64_t seed) {
  const nanoseconds gaps[] = {0ns,           0ns, 0ns,    1ns,          333'333'333ns,
                              333'333'334ns, 1ms, 7ms,    99'999'999ns, 100ms,
                              250ms,         1s,  1500ms, 20s,          61s};
  const std::string_view keys[] = {"alpha", "beta"};
  std::vector<Step> steps;
  std::uint64_t x = seed;
  for (int i = 0; i < 250; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;  // a fixed LCG: same steps each run
    const std::uint64_t r = x >> 33;
    const std::uint64_t cost_pick = (r >> 8) % 8;
    const std::uint64_t cost = cost_pick == 0 ? 0 : cost_pick <= 4 ? 1 : 1 + (r >> 12) % max_cost;
    steps.push_back({.advance = gaps[r % std::size(gaps)],
                     .key = keys[(r >> 4) % 2],
                     .cost = std::min(cost, max_cost)});
  }
  return steps;
}

}  // namespace

TEST_CASE("Redis and in-memory GCRA decide three per second identically in exact thirds") {
  Server server;
  const std::vector<sluice::GcraWindow> windows = {{.requests = 3, .period = 1s}};
  std::vector<Step> steps;
  for (int s = 0; s < 4; ++s) {
    for (int i = 0; i < 4; ++i) steps.push_back({0ns, "k", 1});  // 3 pass, the 4th is denied
    steps.push_back({0ns, "k", 0});                              // a peek
    steps.push_back({333'333'333ns, "k", 1});                    // 1 ns short of a third
    steps.push_back({1ns, "k", 1});                              // exactly a third
    steps.push_back({333'333'334ns, "k", 1});
    steps.push_back({333'333'333ns, "k", 1});
  }
  CHECK(run_parity(server, windows, steps) > 4);
}

TEST_CASE("Redis and in-memory GCRA decide scripted sequences identically for several windows") {
  Server server;
  const std::vector<std::vector<sluice::GcraWindow>> sets = {
      {{.requests = 3, .period = 1s}},
      {{.requests = 10, .period = 1s, .burst = 20}, {.requests = 600, .period = 60s}},
      {{.requests = 5, .period = 1s},
       {.requests = 30, .period = 60s},
       {.requests = 100, .period = 1h}},
      {{.requests = 7, .period = 3s, .burst = 4}, {.requests = 11, .period = 13s, .burst = 9}},
      {{.requests = 1'000'000, .period = 1s, .burst = 3}},
      {{.requests = 2, .period = 1h, .burst = 5}},
  };
  std::uint64_t seed = 1;
  for (const auto& windows : sets) {
    std::uint64_t max_cost = UINT64_MAX;
    for (const auto& w : windows)
      max_cost = std::min(max_cost, w.burst == 0 ? w.requests : w.burst);
    INFO("window set " << seed);
    CHECK(run_parity(server, windows, scripted(max_cost, seed++)) > 0);  // denials were covered
  }
}

TEST_CASE("the runtime engine runs on the Redis server its config's backend section names") {
  Server server;
  sluice::PolicyConfig config = documented_example();
  config.backend = {.type = sluice::BackendKind::kRedis,
                    .unix_socket = server.redis.unix_socket(),
                    .key_prefix = "runtime:",
                    .key_seed = 42};
  auto engine = sluice::RuntimeRateLimitEngine::create(config);
  REQUIRE(engine.ok());
  int admitted = 0;
  for (int i = 0; i < 21; ++i) {
    const sluice::Evaluation e = engine->evaluate(on_route("203.0.113.7", "public"));
    REQUIRE(e.backend_error.ok());
    admitted += e.allowed;
  }
  CHECK(admitted == 20);  // per-ip: burst 20; the 100 ms that refill one cannot pass in 21 calls
  const std::vector<std::string> keys = server.redis.keys();
  CHECK(!keys.empty());
  CHECK(std::all_of(keys.begin(), keys.end(),
                    [](const std::string& k) { return k.starts_with("runtime:"); }));

  // A second engine on the same section shares the budget: the state is on the server.
  auto replica = sluice::RuntimeRateLimitEngine::create(config);
  REQUIRE(replica.ok());
  CHECK_FALSE(replica->evaluate(on_route("203.0.113.7", "public")).allowed);
}

TEST_CASE("the runtime engine refuses a Redis server without bounded memory when created") {
  Server server;
  server.redis.command({"CONFIG", "SET", "maxmemory", "0"});
  sluice::PolicyConfig config = documented_example();
  config.backend = {.type = sluice::BackendKind::kRedis, .unix_socket = server.redis.unix_socket()};
  const auto engine = sluice::RuntimeRateLimitEngine::create(config);
  CHECK(engine.status().code() == absl::StatusCode::kFailedPrecondition);
}

namespace {

// The documented example with its per-ip rule a fixed window of 10 a second and 600 a minute.
sluice::PolicyConfig fixed_window_example(sluice::ConsumptionMode mode) {
  sluice::PolicyConfig config = documented_example();
  config.policies[0].rate_limits[0].burst.reset();
  config.policies[0].rate_limits[0].algorithm = sluice::Algorithm::kFixedWindow;
  config.engine.consumption = mode;
  return config;
}

}  // namespace

TEST_CASE("a fixed-window rule over Redis gives the in-memory engine's evaluations exactly") {
  for (auto mode : {sluice::ConsumptionMode::kAllOrNothing, sluice::ConsumptionMode::kEveryRule}) {
    Server server;
    sluice::ManualClock clock;
    const sluice::PolicyConfig config = fixed_window_example(mode);
    RedisRateLimitEngine redis = make(config, {.client = server.client_holding_keys(clock)});
    auto memory = MemoryEngine::create(config, {.store = {.seed = 1}, .clock = clock});
    REQUIRE(memory.ok());
    // At one instant: 10 units in the second's window (costs 1, 1, 1, 1, 3, 1, 1, 1 of
    // 203.0.113.7; request 6 is another client's), then none.
    CHECK(expect_same_evaluations(redis, *memory, clock, 11) == 9);
    // The window's edges, exactly: the last nanosecond of a second's window, then the next.
    for (int i = 0; i < 10; ++i) REQUIRE(redis.evaluate(on_route("192.0.2.1", "public")).allowed);
    sluice::Evaluation denied = redis.evaluate(on_route("192.0.2.1", "public"));
    CHECK_FALSE(denied.allowed);
    CHECK(denied.retry_after == 1s);
    CHECK(denied.binding->decision.reset_after == 1s);
    clock.advance(1s - 1ns);
    CHECK(redis.evaluate(on_route("192.0.2.1", "public")).retry_after == 1ns);
    clock.advance(1ns);
    sluice::Evaluation next = redis.evaluate(on_route("192.0.2.1", "public"));
    CHECK(next.allowed);
    CHECK(next.binding->decision.remaining == 9);
  }
}

TEST_CASE("all_or_nothing over Redis decides a fixed window and a GCRA rule together") {
  Server server;
  // The fixed window denies: the GCRA rule consumes nothing.
  sluice::PolicyConfig config = tight_and_loose(sluice::ConsumptionMode::kAllOrNothing);
  config.policies[0].rate_limits[0].algorithm = sluice::Algorithm::kFixedWindow;
  RedisRateLimitEngine fixed_denies = make(config, {.client = server.client()});
  CHECK(admitted(fixed_denies, on_route("10.0.0.1", "both"), 5) == 1);
  CHECK(field(fixed_denies.evaluate(on_route("10.0.0.1", "loose-only")), "X-RateLimit-Remaining") ==
        "8");
  // The GCRA rule denies: the fixed window counts nothing.
  config = tight_and_loose(sluice::ConsumptionMode::kAllOrNothing);
  config.policies[1].rate_limits[0].algorithm = sluice::Algorithm::kFixedWindow;
  RedisRateLimitEngine gcra_denies = make(config, {.client = server.client()});
  CHECK(admitted(gcra_denies, on_route("10.0.0.2", "both"), 5) == 1);
  sluice::Evaluation e = gcra_denies.evaluate(on_route("10.0.0.2", "loose-only"));
  CHECK(e.binding->decision.remaining == 8);
  CHECK(e.binding->decision.reset_after > 59s);  // the window opened by the first request
  CHECK(e.binding->decision.reset_after <= 60s);
}

TEST_CASE("a fixed-window rule over Redis keeps its count across an unchanged reload only") {
  Server server;
  sluice::PolicyConfig config{
      .policies = {{.name = "b", .rate_limits = {rule("w", {Selector::kIp}, {.minute = 3})}}},
      .routes = {{.name = "x", .policies = {"b"}}}};
  config.policies[0].rate_limits[0].algorithm = sluice::Algorithm::kFixedWindow;
  RedisRateLimitEngine first = make(config, {.client = server.client()});
  CHECK(admitted(first, on_route("10.0.0.1", "x"), 5) == 3);
  auto same = first.reload(config);  // an unchanged rule: the same keys, the same count
  REQUIRE(same.ok());
  CHECK(admitted(*same, on_route("10.0.0.1", "x"), 5) == 0);
  // A changed window is not carried over Redis: the rule's keys start fresh.
  config.policies[0].rate_limits[0].requests_per.minute = 4;
  auto changed = same->reload(config);
  REQUIRE(changed.ok());
  CHECK(admitted(*changed, on_route("10.0.0.1", "x"), 6) == 4);
}

TEST_CASE("a denied request over Redis reports its keys as they stand from its one script call") {
  // The two-call answer on keys of their own (prefix), at the same instants: the denial, then a
  // peek at cost 0. Repeated keys included: a repeated key reports its state before the call,
  // not the reservation its first occurrence made in the script.
  Server server;
  sluice::ManualClock clock;
  const auto backend = [&](const char* prefix) {
    sluice::redis::ClientOptions o = server.options();
    o.key_prefix += prefix;
    o.time_source = [clock] { return kT0 + clock.now(); };
    auto client = sluice::redis::Client::create(o);
    REQUIRE(client.ok());
    sluice_test::hold_keys(**client);
    auto b = RedisEngineBackend::create(sluice::testing::standing_rules(), nullptr,
                                        {.client = *std::move(client)});
    REQUIRE(b.ok());
    return *std::move(b);
  };
  RedisEngineBackend one = backend("one:");
  RedisEngineBackend two = backend("two:");
  const auto script_calls = [&] {
    sluice_test::Reply info = server.redis.command({"INFO", "commandstats"});
    REQUIRE(info != nullptr);
    const std::string text(info->str, info->len);
    const std::size_t at = text.find("cmdstat_evalsha:calls=");
    REQUIRE(at != std::string::npos);
    return std::stol(text.substr(at + std::string_view("cmdstat_evalsha:calls=").size()));
  };
  using K = sluice::RuleKey;
  const std::vector<std::vector<K>> requests = sluice::testing::standing_requests();
  std::vector<Decision> warm(1);  // the script loaded (NOSCRIPT, then EVALSHA again)
  REQUIRE(one.check_rules_as_they_stand(std::vector<K>{{0, "warm", 1}}, warm).ok());
  int denied_with_room = 0;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    INFO("request " << r);
    clock.advance(111ms);
    std::vector<Decision> a(requests[r].size());
    std::vector<Decision> b(requests[r].size());
    const long before = script_calls();
    REQUIRE(one.check_rules_as_they_stand(requests[r], a).ok());
    CHECK(script_calls() - before == 1);
    REQUIRE(sluice::testing::decide_then_peek(two, requests[r], b));
    CHECK(a == b);
    const bool denied = std::any_of(a.begin(), a.end(), [](const auto& d) { return !d.allowed(); });
    denied_with_room += denied && std::any_of(a.begin(), a.end(), [](const auto& d) {
                          return d.allowed() && d.remaining > 0;
                        });
  }
  CHECK(denied_with_room >= 3);
}

TEST_CASE("a key repeated in one request over Redis is decided as in memory, in every way",
          "[attack]") {
  // The in-order semantics of check_rules (sluice/engine/backend.hpp): each way on keys of its
  // own (prefix), field by field against the in-memory backend at the same instants.
  using sluice::testing::RepeatedWay;
  Server server;
  int way_index = 0;
  for (RepeatedWay way : {RepeatedWay::kAllOrNothing, RepeatedWay::kEveryRule,
                          RepeatedWay::kAsTheyStand, RepeatedWay::kBooking}) {
    INFO("way " << static_cast<int>(way));
    sluice::ManualClock memory_clock;
    sluice::ManualClock redis_clock;
    auto memory = sluice::InMemoryBackend<sluice::ManualClock>::create(
        sluice::testing::repeat_rules(), nullptr, {.clock = memory_clock});
    REQUIRE(memory.ok());
    sluice::redis::ClientOptions o = server.options();
    o.key_prefix += "way" + std::to_string(way_index++) + ":";
    o.time_source = [redis_clock] { return kT0 + redis_clock.now(); };
    auto client = sluice::redis::Client::create(o);
    REQUIRE(client.ok());
    sluice_test::hold_keys(**client);
    auto redis = RedisEngineBackend::create(sluice::testing::repeat_rules(), nullptr,
                                            {.client = *std::move(client)});
    REQUIRE(redis.ok());
    const auto expected = sluice::testing::run_repeated_key_requests(*memory, memory_clock, way);
    const auto got = sluice::testing::run_repeated_key_requests(*redis, redis_clock, way);
    REQUIRE(got.decisions.size() == expected.decisions.size());
    for (std::size_t r = 0; r < expected.decisions.size(); ++r) {
      INFO("request " << r);
      CHECK(got.decisions[r] == expected.decisions[r]);
    }
    CHECK(got.booked == expected.booked);
  }
}

TEST_CASE("each booking of a key repeated over Redis gives back only what its own occurrence holds",
          "[attack]") {
  // As in memory (engine_test.cpp): booked at t0, rule 0's first occurrence holds [t0, t0 + 2T)
  // and the second [t0 + 2T, t0 + 3T), T = 1/3 s; refunded in full at t0 + 2.4T, the first gives
  // back nothing and the second 0.6T, field by field as the in-memory backend.
  Server server;
  sluice::ManualClock memory_clock;
  sluice::ManualClock redis_clock;
  using MemoryBackend = sluice::InMemoryBackend<sluice::ManualClock>;
  auto memory =
      MemoryBackend::create(sluice::testing::repeat_rules(), nullptr, {.clock = memory_clock});
  REQUIRE(memory.ok());
  auto redis = RedisEngineBackend::create(sluice::testing::repeat_rules(), nullptr,
                                          {.client = server.client_holding_keys(redis_clock)});
  REQUIRE(redis.ok());
  const std::vector<sluice::RuleKey> twice = {{0, "a", 2}, {0, "a", 1}};
  std::vector<Decision> in_memory(twice.size());
  std::vector<Decision> over_redis(twice.size());
  std::vector<MemoryBackend::Booking> memory_bookings;
  std::vector<RedisEngineBackend::Booking> redis_bookings;
  REQUIRE(memory
              ->check_rules_booking(twice, sluice::ConsumptionMode::kAllOrNothing, in_memory,
                                    memory_bookings)
              .ok());
  REQUIRE(redis
              ->check_rules_booking(twice, sluice::ConsumptionMode::kAllOrNothing, over_redis,
                                    redis_bookings)
              .ok());
  REQUIRE(over_redis == in_memory);
  REQUIRE(redis_bookings.size() == 2);
  REQUIRE(memory_bookings.size() == 2);
  memory_clock.advance(800ms);
  redis_clock.advance(800ms);
  for (std::size_t i = 0; i < twice.size(); ++i) {
    INFO("occurrence " << i);
    const absl::StatusOr<Decision> expected = MemoryBackend::settle_booking(memory_bookings[i], 0);
    const absl::StatusOr<Decision> got = RedisEngineBackend::settle_booking(redis_bookings[i], 0);
    REQUIRE(expected.ok());
    REQUIRE(got.ok());
    CHECK(got->remaining == (i == 0 ? 2 : 3));
    CHECK(*got == *expected);
  }
}
