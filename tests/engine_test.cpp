#include "sluice/engine.hpp"

#include <algorithm>
#include <atomic>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "engine_fixture.hpp"
#include "example_config.hpp"
#include "sluice/clock.hpp"
#include "sluice/request_path.hpp"
#include "sluice/runtime_engine.hpp"

using namespace std::chrono_literals;
using Engine = sluice::testing::TestEngine;
using sluice::Selector;
using sluice::testing::admitted;
using sluice::testing::documented_example;
using sluice::testing::field;
using sluice::testing::kWall;
using sluice::testing::make_engine;
using sluice::testing::on_route;
using sluice::testing::rule;

namespace {}  // namespace

TEST_CASE("the documented example admits a burst of 20 per ip and answers the 21st with 429") {
  sluice::ManualClock clock;
  Engine engine = make_engine(documented_example(), clock);
  for (int i = 1; i <= 20; ++i) {
    sluice::Evaluation e = engine.evaluate(on_route("203.0.113.7", "public"));
    REQUIRE(e.allowed);
    REQUIRE(field(e, "X-RateLimit-Remaining") == std::to_string(20 - i));
  }
  sluice::Evaluation denied = engine.evaluate(on_route("203.0.113.7", "public"));
  CHECK_FALSE(denied.allowed);
  CHECK(engine.rule(denied.binding->rule).compiled.label == "public-api-limits/per-ip");
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
  CHECK(engine.evaluate(on_route("198.51.100.1", "public")).allowed);  // another ip is unaffected
  clock.advance(100ms);
  CHECK(engine.evaluate(on_route("203.0.113.7", "public")).allowed);
}

TEST_CASE("a global limit and a route limit layer additively") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "global", .rate_limits = {rule("all", {Selector::kIp}, {.s = 100})}},
                   {.name = "per-route",
                    .rate_limits = {rule("route", {Selector::kIp, Selector::kRoute}, {.s = 10})}}},
      .gateway = {.global_policies = {"global"}}};
  for (int r = 0; r < 12; ++r) {
    config.routes.push_back({.name = absl::StrCat("r", r), .policies = {"per-route"}});
  }
  Engine engine = make_engine(config, clock);
  CHECK(admitted(engine, on_route("10.0.0.1", "r0"), 15) == 10);  // held at 10/s on one route
  int total = 10;
  for (int r = 1; r < 12; ++r) {
    total += admitted(engine, on_route("10.0.0.1", absl::StrCat("r", r)), 15);
  }
  CHECK(total == 100);  // all routes together held at 100/s
}

TEST_CASE(
    "a consumer rule binds the fields over a route rule and Retry-After is the longest wait") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "gold",
                    .rate_limits = {rule("per-consumer", {Selector::kCredential}, {.s = 1})}},
                   {.name = "slow",
                    .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 1})}}},
      .routes = {{.name = "api", .policies = {"slow"}}},
      .consumers = {{.name = "acme", .credentials = {"tok-1"}, .policies = {"gold"}}}};
  Engine engine = make_engine(config, clock);
  sluice::RequestContext request = on_route("10.0.0.1", "api");
  request.credential = "tok-1";
  request.consumer = "acme";
  REQUIRE(engine.evaluate(request).allowed);
  sluice::Evaluation denied = engine.evaluate(request);
  CHECK_FALSE(denied.allowed);
  CHECK(engine.rule(denied.binding->rule).compiled.label == "gold/per-consumer");
  CHECK(field(denied, "X-RateLimit-Limit") == "1");
  CHECK(field(denied, "Retry-After") == "60");  // the route rule waits a minute, the consumer 1 s
  CHECK(denied.retry_after == 60s);
}

TEST_CASE("all_or_nothing consumes nothing in admitting rules when one rule denies") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "tight",
                    .rate_limits = {rule("tight", {Selector::kIp}, {.minute = 1})}},
                   {.name = "loose",
                    .rate_limits = {rule("loose", {Selector::kIp}, {.minute = 10})}}},
      .routes = {{.name = "both", .policies = {"tight", "loose"}},
                 {.name = "loose-only", .policies = {"loose"}}}};
  Engine engine = make_engine(config, clock);
  CHECK(admitted(engine, on_route("10.0.0.1", "both"), 5) == 1);
  // The loose rule saw one admitted request only: 9 left, so this one leaves 8.
  CHECK(field(engine.evaluate(on_route("10.0.0.1", "loose-only")), "X-RateLimit-Remaining") == "8");
}

TEST_CASE("all_or_nothing puts back an earlier rule's reservation when a later rule denies") {
  sluice::ManualClock clock;
  // The loose rule is decided first: it reserves before the tight one denies.
  sluice::PolicyConfig config{
      .policies = {{.name = "loose",
                    .rate_limits = {rule("loose", {Selector::kIp}, {.minute = 10})}},
                   {.name = "tight",
                    .rate_limits = {rule("tight", {Selector::kIp}, {.minute = 1})}}},
      .routes = {{.name = "both", .policies = {"loose", "tight"}},
                 {.name = "loose-only", .policies = {"loose"}}}};
  Engine engine = make_engine(config, clock);
  CHECK(admitted(engine, on_route("10.0.0.1", "both"), 5) == 1);
  CHECK(field(engine.evaluate(on_route("10.0.0.1", "loose-only")), "X-RateLimit-Remaining") == "8");
  // A client the loose rule has not seen yet is decided without being tracked, then inserted.
  CHECK(admitted(engine, on_route("10.0.0.2", "both"), 3) == 1);
  CHECK(field(engine.evaluate(on_route("10.0.0.2", "loose-only")), "X-RateLimit-Remaining") == "8");
}

TEST_CASE("every_rule lets admitting rules consume when another rule denies") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "tight",
                    .rate_limits = {rule("tight", {Selector::kIp}, {.minute = 1})}},
                   {.name = "loose",
                    .rate_limits = {rule("loose", {Selector::kIp}, {.minute = 10})}}},
      .routes = {{.name = "both", .policies = {"tight", "loose"}},
                 {.name = "loose-only", .policies = {"loose"}}},
      .engine = {.consumption = sluice::ConsumptionMode::kEveryRule}};
  Engine engine = make_engine(config, clock);
  CHECK(admitted(engine, on_route("10.0.0.1", "both"), 5) == 1);
  CHECK(field(engine.evaluate(on_route("10.0.0.1", "loose-only")), "X-RateLimit-Remaining") == "4");
}

TEST_CASE("a dry-run bundle reports its would-be denial without enforcing or adding fields") {
  sluice::ManualClock clock;
  sluice::PolicyConfig live_only{
      .policies = {{.name = "live", .rate_limits = {rule("live", {Selector::kIp}, {.minute = 10})}},
                   {.name = "trial",
                    .rate_limits = {rule("trial", {Selector::kIp}, {.minute = 1})},
                    .dry_run = true}},
      .routes = {{.name = "api", .policies = {"live"}}}};
  sluice::PolicyConfig with_dry = live_only;
  with_dry.routes[0].policies.push_back("trial");
  sluice::ManualClock other_clock;
  Engine reference = make_engine(live_only, other_clock);
  Engine engine = make_engine(with_dry, clock);

  for (int i = 0; i < 12; ++i) {
    sluice::Evaluation e = engine.evaluate(on_route("10.0.0.1", "api"));
    sluice::Evaluation r = reference.evaluate(on_route("10.0.0.1", "api"));
    REQUIRE(e.allowed == r.allowed);  // live rules decide exactly as without the dry-run bundle
    REQUIRE(e.fields == r.fields);    // and the dry-run bundle adds no fields
    // From the 11th request on the live rule denies: all or nothing, the trial rule is not asked.
    REQUIRE(e.dry_denied.has_value() == (i >= 1 && i < 10));
    if (e.dry_denied) {
      CHECK(engine.rule(e.dry_denied->rule).compiled.label == "trial/trial");
      CHECK(e.dry_denied->decision.retry_after == 1min);  // its bucket advanced only on admission
    }
  }
  clock.advance(1min);
  other_clock.advance(1min);
  CHECK_FALSE(engine.evaluate(on_route("10.0.0.1", "api")).dry_denied.has_value());
  const auto stats = engine.stats();
  CHECK(stats[1].label == "trial/trial");
  CHECK(stats[1].dry_denied == 9);
  CHECK(stats[1].admitted == 11);  // the requests admitted while it applied
  CHECK(stats[0].admitted == 11);
  CHECK(stats[0].denied == 2);
}

TEST_CASE("a legacy rate_limit limits per route and applies together with rate_limits") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "old",
                    .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 2})},
                    .rate_limit = sluice::LegacyRateLimit{.requests = 3, .window_seconds = 60}}},
      .routes = {{.name = "api", .policies = {"old"}}}};
  Engine engine = make_engine(config, clock);
  CHECK(admitted(engine, on_route("10.0.0.1", "api"), 5) == 2);  // per-ip binds first
  CHECK(admitted(engine, on_route("10.0.0.2", "api"), 5) == 1);  // the route's 3 are shared
  sluice::Evaluation e = engine.evaluate(on_route("10.0.0.3", "api"));
  CHECK(engine.rule(e.binding->rule).compiled.label == "old/rate_limit");
}

TEST_CASE(
    "a credential rule keys on the client ip until the request carries an authenticated "
    "credential") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "c",
                    .rate_limits = {rule("per-cred", {Selector::kCredential}, {.minute = 1})}}},
      .gateway = {.global_policies = {"c"}}};
  Engine engine = make_engine(config, clock);
  sluice::RequestContext anonymous{.client_ip = "10.0.0.1", .path = "/"};
  sluice::RequestContext token = anonymous;
  token.credential = "10.0.0.1";  // a credential spelled like the ip is still its own key
  token.consumer = "alice";       // authenticated by the gateway
  sluice::RequestContext token_elsewhere = token;
  token_elsewhere.client_ip = "10.9.9.9";
  CHECK(engine.evaluate(anonymous).allowed);
  CHECK_FALSE(engine.evaluate(anonymous).allowed);
  CHECK(engine.evaluate(token).allowed);
  CHECK_FALSE(engine.evaluate(token_elsewhere).allowed);  // the same credential from another ip
}

TEST_CASE("unrouted requests hit listener and global rules under their own route component") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies =
          {{.name = "flood",
            .rate_limits = {rule("flood", {Selector::kIp, Selector::kRoute}, {.minute = 1})}},
           {.name = "edge", .rate_limits = {rule("edge", {Selector::kIp}, {.minute = 3})}},
           {.name = "route-only", .rate_limits = {rule("ro", {Selector::kIp}, {.minute = 1})}}},
      .routes = {{.name = "u", .policies = {"route-only"}}},
      .listeners = {{.name = "public", .policies = {"edge"}}},
      .gateway = {.global_policies = {"flood"}}};
  Engine engine = make_engine(config, clock);
  sluice::RequestContext unrouted{.client_ip = "10.0.0.1", .listener = "public", .path = "/nope"};
  sluice::Evaluation first = engine.evaluate(unrouted);
  CHECK(first.allowed);
  CHECK(first.live_rules == 2);  // listener and global; no route rule
  CHECK_FALSE(engine.evaluate(unrouted).allowed);
  sluice::RequestContext routed = unrouted;
  routed.route = "u";
  CHECK(engine.evaluate(routed).allowed);  // route "u" is not the unrouted component
}

TEST_CASE("a route name the config lacks is unrouted and shares the unrouted key") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "flood",
                    .rate_limits = {rule("flood", {Selector::kIp, Selector::kRoute},
                                         {.minute = 1})}}},
      .routes = {{.name = "known"}},
      .gateway = {.global_policies = {"flood"}}};
  Engine engine = make_engine(config, clock);
  sluice::RequestContext request{.client_ip = "198.51.100.7", .path = "/nope"};
  REQUIRE(engine.evaluate(request).allowed);  // unrouted: its one request of the minute
  // A gateway that passes on a route name a client chose (a Host header, a path segment):
  // every name the config lacks is the same unrouted key, spent.
  for (int i = 0; i < 50; ++i) {
    const std::string name = absl::StrCat("no-such-route-", i);
    request.route = name;
    CHECK_FALSE(engine.evaluate(request).allowed);
  }
  request.route = "known";
  CHECK(engine.evaluate(request).allowed);  // a real route is a key of its own
}

TEST_CASE("exempt paths get no rule and no fields") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "g", .rate_limits = {rule("g", {Selector::kIp}, {.minute = 1})}}},
      .gateway = {.global_policies = {"g"}}};
  Engine engine = make_engine(config, clock);
  for (int i = 0; i < 5; ++i) {
    sluice::Evaluation e = engine.evaluate({.client_ip = "10.0.0.1", .path = "/healthz"});
    CHECK(e.exempt);
    CHECK(e.allowed);
    CHECK(e.fields.empty());
  }
  CHECK(engine.evaluate({.client_ip = "10.0.0.1", .path = "/"}).allowed);
}

TEST_CASE("an exempt path is matched byte for byte: another spelling of it is limited") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "g", .rate_limits = {rule("g", {Selector::kIp}, {.minute = 1})}}},
      .gateway = {.global_policies = {"g"}}};
  Engine engine = make_engine(config, clock);
  const sluice::RequestContext upper{.client_ip = "10.0.0.1", .path = "/HEALTHZ"};
  CHECK_FALSE(engine.evaluate(upper).exempt);
  CHECK(admitted(engine, upper, 2) == 0);  // the first evaluation spent the one request
}

TEST_CASE("a reload keeps the state of unchanged rules and a changed rule's spent share") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "a", .rate_limits = {rule("same", {Selector::kIp}, {.minute = 2})}},
                   {.name = "b",
                    .rate_limits = {rule("changing", {Selector::kIp}, {.minute = 2})}}},
      .routes = {{.name = "x", .policies = {"a"}}, {.name = "y", .policies = {"b"}}}};
  Engine first = make_engine(config, clock);
  CHECK(admitted(first, on_route("10.0.0.1", "x"), 3) == 2);
  CHECK(admitted(first, on_route("10.0.0.1", "y"), 3) == 2);

  config.policies[1].rate_limits[0].requests_per.minute = 3;
  auto second = first.reload(config);
  REQUIRE(second.ok());
  CHECK(admitted(*second, on_route("10.0.0.1", "x"), 3) == 0);  // nothing extra across a reload
  CHECK(admitted(*second, on_route("10.0.0.1", "y"), 5) == 0);  // spent stays spent
  CHECK(admitted(*second, on_route("10.0.0.2", "y"), 5) == 3);  // a new client: the new burst
  CHECK(second->stats()[0].admitted == 2);                      // counters carry over too
  CHECK(second->stats()[0].denied == 4);
}

namespace {

// One bundle "b" with one rule "r" keyed by ip, attached to route "x".
sluice::PolicyConfig one_rule(sluice::RequestsPer per,
                              std::optional<std::uint64_t> burst = std::nullopt) {
  return {.policies = {{.name = "b", .rate_limits = {rule("r", {Selector::kIp}, per, burst)}}},
          .routes = {{.name = "x", .policies = {"b"}}}};
}

Engine reloaded(const Engine& engine, const sluice::PolicyConfig& config) {
  auto next = engine.reload(config);
  REQUIRE(next.ok());
  return *std::move(next);
}

}  // namespace

TEST_CASE("lowering a limit mid-burst leaves each client its spent share of the new burst") {
  sluice::ManualClock clock;
  Engine first = make_engine(one_rule({.minute = 100}), clock);
  REQUIRE(admitted(first, on_route("10.0.0.1", "x"), 60) == 60);    // 60% of the bucket used
  REQUIRE(admitted(first, on_route("10.0.0.2", "x"), 101) == 100);  // spent
  Engine second = reloaded(first, one_rule({.minute = 10}));
  CHECK(admitted(second, on_route("10.0.0.1", "x"), 20) == 4);   // 40% of 10, not a fresh 10
  CHECK(admitted(second, on_route("10.0.0.2", "x"), 20) == 0);   // spent stays spent
  CHECK(admitted(second, on_route("10.0.0.3", "x"), 20) == 10);  // a new client: the new burst
  clock.advance(6s);  // one emission interval of the new rate
  CHECK(admitted(second, on_route("10.0.0.2", "x"), 20) == 1);
}

TEST_CASE("raising a limit gives each client its unspent share of the new burst, no more") {
  sluice::ManualClock clock;
  Engine first = make_engine(one_rule({.minute = 10}), clock);
  REQUIRE(admitted(first, on_route("10.0.0.1", "x"), 6) == 6);
  REQUIRE(admitted(first, on_route("10.0.0.2", "x"), 11) == 10);
  Engine second = reloaded(first, one_rule({.minute = 100}));
  CHECK(admitted(second, on_route("10.0.0.1", "x"), 200) == 40);
  CHECK(admitted(second, on_route("10.0.0.2", "x"), 200) == 0);
}

TEST_CASE("a burst change carries each client's spent share into the new burst") {
  sluice::ManualClock clock;
  Engine first = make_engine(one_rule({.s = 10}, 50), clock);
  REQUIRE(admitted(first, on_route("10.0.0.1", "x"), 25) == 25);  // half of the burst
  Engine second = reloaded(first, one_rule({.s = 10}, 10));
  CHECK(admitted(second, on_route("10.0.0.1", "x"), 20) == 5);
}

TEST_CASE("a window added by a reload starts empty and a removed window is dropped") {
  sluice::ManualClock clock;
  Engine first = make_engine(one_rule({.s = 10, .minute = 20}), clock);
  REQUIRE(admitted(first, on_route("10.0.0.1", "x"), 15) == 10);  // the second's burst is spent
  // The per-second window goes: the minute's share (10 of 20 used) carries, not a fresh 20.
  Engine second = reloaded(first, one_rule({.minute = 20}));
  CHECK(admitted(second, on_route("10.0.0.1", "x"), 30) == 10);
  REQUIRE(admitted(second, on_route("10.0.0.2", "x"), 4) == 4);  // 20% of the minute
  // A per-second window comes: it starts empty, next to the minute's carried share.
  Engine third = reloaded(second, one_rule({.s = 5, .minute = 40}));
  CHECK(admitted(third, on_route("10.0.0.1", "x"), 30) == 0);  // the minute stays spent
  CHECK(admitted(third, on_route("10.0.0.2", "x"), 30) == 5);  // the new window's whole burst
}

TEST_CASE("a legacy rule's window length change carries each client's spent share") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "b",
                    .rate_limit = sluice::LegacyRateLimit{.requests = 10, .window_seconds = 60}}},
      .routes = {{.name = "x", .policies = {"b"}}}};
  Engine first = make_engine(config, clock);
  REQUIRE(admitted(first, on_route("10.0.0.1", "x"), 5) == 5);
  config.policies[0].rate_limit = sluice::LegacyRateLimit{.requests = 4, .window_seconds = 30};
  Engine second = reloaded(first, config);
  CHECK(admitted(second, on_route("10.0.0.1", "x"), 10) == 2);
}

TEST_CASE("a changed selector or rule name starts the rule fresh") {
  sluice::ManualClock clock;
  Engine first = make_engine(one_rule({.minute = 2}), clock);
  REQUIRE(admitted(first, on_route("10.0.0.1", "x"), 3) == 2);
  sluice::PolicyConfig renamed = one_rule({.minute = 2});
  renamed.policies[0].rate_limits[0].name = "r2";
  CHECK(admitted(reloaded(first, renamed), on_route("10.0.0.1", "x"), 3) == 2);
  sluice::PolicyConfig reselected = one_rule({.minute = 2});
  reselected.policies[0].rate_limits[0].selector = {Selector::kIp, Selector::kRoute};
  CHECK(admitted(reloaded(first, reselected), on_route("10.0.0.1", "x"), 3) == 2);
}

TEST_CASE("an invalid config fails with InvalidArgument naming its path") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = documented_example();
  config.policies[0].rate_limits[1].requests_per.minute = 0;
  auto engine = Engine::create(config, {.clock = clock});
  REQUIRE_FALSE(engine.ok());
  CHECK(engine.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(engine.status().message() == "policies[0].rate_limits[1].requests_per.minute must be > 0");
}

TEST_CASE("a cost above a rule's burst denies the request and reports the error") {
  sluice::ManualClock clock;
  Engine engine = make_engine(documented_example(), clock);
  sluice::RequestContext request = on_route("10.0.0.1", "public");
  request.cost = 21;
  sluice::Evaluation e = engine.evaluate(request);
  CHECK_FALSE(e.allowed);
  CHECK(e.backend_error.code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("routes and consumers resolve from the config") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "g", .rate_limits = {rule("g", {Selector::kIp}, {.minute = 1})}}},
      .routes = {{.name = "all", .service = "svc", .path_prefix = "/"},
                 {.name = "v1", .path_prefix = "/v1"},
                 {.name = "admin", .listener = "internal", .path_prefix = "/v1/admin"}},
      .services = {{.name = "svc"}},
      .listeners = {{.name = "internal"}, {.name = "public"}},
      .consumers = {{.name = "acme", .credentials = {"tok-1", "tok-2"}}}};
  Engine engine = make_engine(config, clock);
  CHECK(engine.match_route("public", "/v1/admin/x")->route == "v1");
  CHECK(engine.match_route("internal", "/v1/admin/x")->route == "admin");
  CHECK(engine.match_route("public", "/other")->route == "all");
  CHECK(engine.match_route("public", "/other")->service == "svc");
  CHECK(engine.consumer_for("tok-2") == "acme");
  CHECK_FALSE(engine.consumer_for("tok-3").has_value());
  // A consumer by name, as a credential resolver answers it: a view into the engine, or none.
  const std::string asked = "acme";
  const std::optional<std::string_view> named = engine.consumer_named(asked);
  REQUIRE(named.has_value());
  CHECK(*named == "acme");
  CHECK(named->data() != asked.data());
  CHECK_FALSE(engine.consumer_named("tok-1").has_value());
}

namespace {
// A backend whose every call fails, to show the failure modes; `calls` counts them.
struct FailingBackend {
  struct Options {};
  static inline std::atomic<int> calls{0};
  static absl::StatusOr<FailingBackend> create(std::span<const sluice::CompiledRule>,
                                               const FailingBackend*, const Options&) {
    return FailingBackend{};
  }
  absl::Status check_rules(std::span<const sluice::RuleKey>, sluice::ConsumptionMode,
                           std::span<sluice::Decision>) {
    ++calls;
    return absl::UnavailableError("backend down");
  }
  sluice::StoreStats rule_store_stats(std::size_t) const { return {}; }
};
}  // namespace

TEST_CASE("a backend failure follows the fail-open or fail-closed setting and is reported") {
  sluice::PolicyConfig config = documented_example();
  auto open = sluice::BasicRateLimitEngine<FailingBackend>::create(config);
  REQUIRE(open.ok());
  sluice::Evaluation e = open->evaluate(on_route("10.0.0.1", "public"));
  CHECK(e.allowed);
  CHECK(e.backend_error.code() == absl::StatusCode::kUnavailable);
  CHECK(e.fields.empty());

  config.engine.on_backend_error = sluice::FailureMode::kFailClosed;
  auto closed = sluice::BasicRateLimitEngine<FailingBackend>::create(config);
  REQUIRE(closed.ok());
  CHECK_FALSE(closed->evaluate(on_route("10.0.0.1", "public")).allowed);
}

// [attack] A request with live and dry-run rules asked a failing backend twice, one group after
// the other: against a stalled Redis it waited two command timeouts (601 ms at 300 ms).
TEST_CASE("a backend that fails the live rules is not asked again for the dry-run rules") {
  const sluice::PolicyConfig config{
      .policies = {{.name = "live", .rate_limits = {rule("live", {Selector::kIp}, {.minute = 10})}},
                   {.name = "trial",
                    .rate_limits = {rule("trial", {Selector::kIp}, {.minute = 1})},
                    .dry_run = true}},
      .routes = {{.name = "api", .policies = {"live", "trial"}}}};
  for (const sluice::FailureMode mode :
       {sluice::FailureMode::kFailOpen, sluice::FailureMode::kFailClosed}) {
    sluice::PolicyConfig c = config;
    c.engine.on_backend_error = mode;
    auto engine = sluice::BasicRateLimitEngine<FailingBackend>::create(c);
    REQUIRE(engine.ok());
    FailingBackend::calls = 0;
    const sluice::Evaluation e = engine->evaluate(on_route("10.0.0.1", "api"));
    CHECK(e.allowed == (mode == sluice::FailureMode::kFailOpen));
    CHECK(e.backend_error.code() == absl::StatusCode::kUnavailable);
    CHECK_FALSE(e.dry_denied.has_value());
    CHECK(FailingBackend::calls == 1);
  }
}

TEST_CASE("threads evaluating overlapping rules all-or-nothing admit exactly the tighter budget") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "ip", .rate_limits = {rule("ip", {Selector::kIp}, {.hour = 500})}},
                   {.name = "route",
                    .rate_limits = {rule("route", {Selector::kRoute}, {.hour = 300})}}},
      .routes = {{.name = "a", .policies = {"ip", "route"}}, {.name = "b", .policies = {"ip"}}}};
  Engine engine = make_engine(config, clock);
  std::atomic<int> on_a{0}, on_b{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 400; ++i) {
        bool a = (i + t) % 2 == 0;
        if (engine.evaluate(on_route("10.0.0.1", a ? "a" : "b")).allowed) ++(a ? on_a : on_b);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(on_a.load() <= 300);
  CHECK(on_a.load() + on_b.load() == 500);  // the ip budget is spent exactly, never overdrawn
}

TEST_CASE("an observer sees every non-exempt evaluation and survives a reload") {
  sluice::ManualClock clock;
  std::vector<bool> seen;
  auto engine = Engine::create(documented_example(), {.store = {.seed = 1}, .clock = clock},
                               [&](const sluice::Evaluation& e) { seen.push_back(e.allowed); });
  REQUIRE(engine.ok());
  for (int i = 0; i < 21; ++i) engine->evaluate(on_route("10.0.0.1", "public"));
  engine->evaluate({.client_ip = "10.0.0.1", .path = "/healthz"});
  REQUIRE(seen.size() == 21);
  CHECK(seen.back() == false);
  auto next = engine->reload(documented_example());
  REQUIRE(next.ok());
  next->evaluate(on_route("10.0.0.1", "public"));
  CHECK(seen.size() == 22);
}

// --- request identity a client cannot choose ------------------------------------------------

namespace {

sluice::PolicyConfig per_credential_10_per_minute() {
  return {
      .policies = {{.name = "c",
                    .rate_limits = {rule("per-cred", {Selector::kCredential}, {.minute = 10})}}},
      .gateway = {.global_policies = {"c"}}};
}

}  // namespace

TEST_CASE(
    "a client sending a fresh unauthenticated token per request is held to its address's bucket") {
  sluice::ManualClock clock;
  Engine engine = make_engine(per_credential_10_per_minute(), clock);
  int allowed = 0;
  for (int i = 0; i < 14; ++i) {
    const std::string token = absl::StrCat("random-token-", i * 7919);
    allowed +=
        engine.evaluate({.client_ip = "198.51.100.9", .credential = token, .path = "/"}).allowed;
  }
  CHECK(allowed == 10);
}

TEST_CASE("an empty credential, consumer or route is the same as an absent one") {
  sluice::ManualClock clock;
  Engine engine = make_engine(per_credential_10_per_minute(), clock);
  // Two anonymous clients with empty credentials do not share one "empty credential" bucket.
  for (int i = 0; i < 10; ++i) {
    REQUIRE(
        engine
            .evaluate({.client_ip = "198.51.100.1", .credential = "", .consumer = "", .path = "/"})
            .allowed);
  }
  CHECK(
      engine.evaluate({.client_ip = "198.51.100.2", .credential = "", .consumer = "", .path = "/"})
          .allowed);
  CHECK_FALSE(engine.evaluate({.client_ip = "198.51.100.1", .path = "/"}).allowed);
}

TEST_CASE("a request that names only its route gets its service's bundles") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "svc", .rate_limits = {rule("svc", {Selector::kIp}, {.minute = 1})}}},
      .routes = {{.name = "orders", .service = "backend", .path_prefix = "/orders"}},
      .services = {{.name = "backend", .policies = {"svc"}}}};
  Engine engine = make_engine(config, clock);
  sluice::RequestContext request{.client_ip = "10.0.0.1", .route = "orders", .path = "/orders"};
  CHECK(engine.evaluate(request).allowed);
  sluice::Evaluation second = engine.evaluate(request);
  CHECK_FALSE(second.allowed);
  CHECK(engine.rule(second.binding->rule).compiled.label == "svc/svc");
}

TEST_CASE("a request naming another service than its route's is an InvalidArgument and denied") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "svc", .rate_limits = {rule("svc", {Selector::kIp}, {.minute = 1})}}},
      .routes = {{.name = "orders", .service = "backend", .path_prefix = "/orders"}},
      .services = {{.name = "backend", .policies = {"svc"}}, {.name = "other"}}};
  Engine engine = make_engine(config, clock);
  sluice::Evaluation e = engine.evaluate(
      {.client_ip = "10.0.0.1", .route = "orders", .service = "other", .path = "/orders"});
  CHECK_FALSE(e.allowed);
  CHECK(e.backend_error ==
        absl::InvalidArgumentError("the request names service \"other\" but route \"orders\" "
                                   "belongs to service \"backend\""));
  CHECK(engine.stats()[0].denied == 0);
}

TEST_CASE("the longest prefix wins and on an equal prefix a listener's own route wins") {
  sluice::ManualClock clock;
  for (bool listener_route_first : {true, false}) {
    sluice::Route everywhere{.name = "everywhere", .path_prefix = "/api"};
    sluice::Route on_public{.name = "on-public", .listener = "public", .path_prefix = "/api"};
    sluice::Route longer{.name = "longer", .path_prefix = "/api/v2"};
    sluice::PolicyConfig config{.listeners = {{.name = "public"}, {.name = "internal"}}};
    config.routes = listener_route_first
                        ? std::vector<sluice::Route>{on_public, everywhere, longer}
                        : std::vector<sluice::Route>{longer, everywhere, on_public};
    Engine engine = make_engine(config, clock);
    CHECK(engine.match_route("public", "/api/x")->route == "on-public");
    CHECK(engine.match_route("internal", "/api/x")->route == "everywhere");
    CHECK(engine.match_route("public", "/api/v2/x")->route == "longer");
  }
}

namespace {

// The route `engine` matches for the raw request path `raw`, or "<unrouted>".
std::string routed(const Engine& engine, std::string_view raw) {
  const absl::StatusOr<std::string> path = sluice::normalize_request_path(raw);
  REQUIRE(path.ok());
  const auto match = engine.match_route("", *path);
  return match ? std::string(match->route) : std::string("<unrouted>");
}

}  // namespace

TEST_CASE("a route that is not case_sensitive matches its prefix in any ASCII case, and only it") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .routes = {{.name = "login", .path_prefix = "/login", .case_sensitive = false},
                 {.name = "api", .path_prefix = "/Api"},
                 {.name = "cafe", .path_prefix = "/caf%C3%A9", .case_sensitive = false}}};
  Engine engine = make_engine(config, clock);
  const auto route_of = [&](std::string_view raw) { return routed(engine, raw); };
  CHECK(route_of("/login") == "login");
  CHECK(route_of("/LOGIN") == "login");
  CHECK(route_of("/LoGiN/reset") == "login");
  CHECK(route_of("/%4cogin") == "login");  // %4c decodes to L before the match
  CHECK(route_of("/logi") == "<unrouted>");
  CHECK(route_of("/Api/x") == "api");
  CHECK(route_of("/api/x") == "<unrouted>");  // a case_sensitive route matches byte for byte
  CHECK(route_of("/API/x") == "<unrouted>");
  CHECK(route_of("/CAF%c3%a9") == "cafe");        // hex digits are upper case on both sides
  CHECK(route_of("/caf%C3%89") == "<unrouted>");  // not an ASCII letter: compared as it is
}

// An upstream that ignores case with Unicode's case mappings (Java's equalsIgnoreCase, Spring's
// case-insensitive path patterns, which lower-case with Character.toLowerCase) reads four letters
// outside ASCII as ASCII ones: dotless ı and dotted İ as i, long ſ as s, the Kelvin sign K as k.
// It serves /log%C4%B1n from its /login handler; a route that compared them as other bytes would
// leave it unrouted, and the client would escape the login throttle by spelling one letter.
TEST_CASE("a route that ignores case matches the non-ASCII letters that fold to its ASCII ones",
          "[attack]") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "throttle",
                    .rate_limits = {rule("r", {Selector::kIp, Selector::kRoute}, {.minute = 1})}}},
      .routes = {{.name = "login",
                  .path_prefix = "/login",
                  .case_sensitive = false,
                  .policies = {"throttle"}},
                 {.name = "session", .path_prefix = "/session", .case_sensitive = false},
                 {.name = "keys", .path_prefix = "/keys", .case_sensitive = false},
                 {.name = "kit", .path_prefix = "/kit"}}};
  Engine engine = make_engine(config, clock);
  const auto route_of = [&](std::string_view raw) { return routed(engine, raw); };
  CHECK(route_of("/log%C4%B1n") == "login");        // ı (U+0131)
  CHECK(route_of("/LOG%C4%B0N") == "login");        // İ (U+0130)
  CHECK(route_of("/%C5%BFession") == "session");    // ſ (U+017F)
  CHECK(route_of("/%E2%84%AAeys") == "keys");       // K (U+212A)
  CHECK(route_of("/%E2%84%AAit") == "<unrouted>");  // a case_sensitive route: byte for byte
  CHECK(route_of("/log%C3%AFn") == "<unrouted>");   // ï folds to no ASCII letter

  const auto login = engine.match_route("", "/login");
  const auto dotless = engine.match_route("", "/log%C4%B1n");
  REQUIRE(login.has_value());
  REQUIRE(dotless.has_value());
  CHECK(admitted(engine, on_route("203.0.113.7", login->route), 1) == 1);
  CHECK(admitted(engine, on_route("203.0.113.7", dotless->route), 1) == 0);  // the same bucket
}

TEST_CASE("a route that ignores case keeps the precedence: longest prefix, then the listener's") {
  sluice::ManualClock clock;
  for (bool listener_route_first : {true, false}) {
    sluice::Route everywhere{.name = "everywhere", .path_prefix = "/api", .case_sensitive = false};
    sluice::Route on_public{
        .name = "on-public", .listener = "public", .path_prefix = "/API", .case_sensitive = false};
    sluice::Route longer{.name = "longer", .path_prefix = "/api/v2"};
    sluice::PolicyConfig config{.listeners = {{.name = "public"}, {.name = "internal"}}};
    config.routes = listener_route_first
                        ? std::vector<sluice::Route>{on_public, everywhere, longer}
                        : std::vector<sluice::Route>{longer, everywhere, on_public};
    Engine engine = make_engine(config, clock);
    CHECK(engine.match_route("public", "/api/x")->route == "on-public");
    CHECK(engine.match_route("internal", "/Api/x")->route == "everywhere");
    CHECK(engine.match_route("internal", "/api/v2/x")->route == "longer");
    CHECK(engine.match_route("internal", "/API/V2/x")->route == "everywhere");  // longer: bytes
  }
}

TEST_CASE("turning case_sensitive off keeps every route's keys across a reload") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "b",
                    .rate_limits = {rule("r", {Selector::kIp, Selector::kRoute}, {.minute = 2})}}},
      .routes = {{.name = "login", .path_prefix = "/login", .policies = {"b"}},
                 {.name = "api", .path_prefix = "/api", .policies = {"b"}}}};
  Engine first = make_engine(config, clock);
  REQUIRE(admitted(first, on_route("10.0.0.1", "login"), 3) == 2);
  REQUIRE(admitted(first, on_route("10.0.0.1", "api"), 3) == 2);

  config.routes[0].case_sensitive = false;
  Engine second = reloaded(first, config);
  CHECK(admitted(second, on_route("10.0.0.1", "login"), 1) == 0);  // its key is its name
  CHECK(admitted(second, on_route("10.0.0.1", "api"), 1) == 0);    // an unchanged route's too
  CHECK(second.stats()[0].admitted == 4);                          // the rule kept its state
  const auto upper = second.match_route("", "/LOGIN");
  REQUIRE(upper.has_value());
  CHECK(admitted(second, on_route("10.0.0.1", upper->route), 1) == 0);  // the spent login bucket
}

TEST_CASE("counters add up: admissions while a rule applied, its own denials, no peeks") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "tight",
                    .rate_limits = {rule("tight", {Selector::kIp}, {.minute = 1})}},
                   {.name = "loose",
                    .rate_limits = {rule("loose", {Selector::kIp}, {.minute = 5})}},
                   {.name = "shadow",
                    .rate_limits = {rule("shadow", {Selector::kIp}, {.minute = 2})},
                    .dry_run = true}},
      .routes = {{.name = "r", .policies = {"tight", "loose", "shadow"}}}};
  Engine engine = make_engine(config, clock);
  sluice::RequestContext request{.client_ip = "10.0.0.1", .route = "r", .path = "/"};
  sluice::RequestContext peek = request;
  peek.cost = 0;
  engine.evaluate(peek);
  engine.evaluate(request);  // admitted by both live rules
  engine.evaluate(peek);
  engine.evaluate(request);  // denied by tight only
  engine.evaluate(request);  // denied by tight only
  const auto stats = engine.stats();
  CHECK(stats[0].admitted == 1);
  CHECK(stats[0].denied == 2);
  CHECK(stats[1].admitted == 1);  // loose admitted all three, but only one request got through
  CHECK(stats[1].denied == 0);
  CHECK(stats[2].admitted == 1);
  CHECK(stats[2].dry_denied == 0);  // charged only for the admitted request, as if enforced
}

TEST_CASE("whatever validates compiles: the largest supported rule runs in the engine") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "max",
                    .rate_limits = {rule("max", {Selector::kIp},
                                         {.s = sluice::kMaxRequestsPerWindow},
                                         sluice::max_burst(sluice::kMaxRequestsPerWindow, 1))},
                    .rate_limit = sluice::LegacyRateLimit{sluice::kMaxRequestsPerWindow,
                                                          sluice::kMaxWindowSeconds}}},
      .gateway = {.global_policies = {"max"}}};
  REQUIRE(sluice::validate(config).ok());
  auto engine = Engine::create(config, {.store = {.seed = 1}, .clock = clock});
  REQUIRE(engine.ok());
  CHECK(engine->evaluate({.client_ip = "10.0.0.1", .path = "/"}).allowed);
}

TEST_CASE("an IPv6 client rotating addresses inside its /64 is held to one bucket") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "p", .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 10})}}},
      .gateway = {.global_policies = {"p"}}};
  Engine engine = make_engine(config, clock);
  int allowed = 0;
  for (int i = 0; i < 50; ++i) {
    const std::string address = absl::StrCat("2001:db8:1:2:", i, ":", i * 31, "::", i + 1);
    allowed += engine.evaluate({.client_ip = address, .path = "/"}).allowed;
  }
  CHECK(allowed == 10);
  CHECK(engine.evaluate({.client_ip = "2001:db8:1:3::1", .path = "/"}).allowed);  // next /64
}

TEST_CASE("address prefixes are configurable per gateway and per rule") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "p",
                    .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 1}),
                                    {.name = "per-subnet",
                                     .selector = {Selector::kIp},
                                     .requests_per = {.minute = 3},
                                     .address_prefixes = sluice::AddressPrefixes{.ipv4 = 16}}}}},
      .gateway = {.global_policies = {"p"}, .address_prefixes = {.ipv4 = 24, .ipv6 = 48}}};
  Engine engine = make_engine(config, clock);
  CHECK(engine.rule(0).compiled.address_prefixes == sluice::AddressPrefixes{24, 48});
  CHECK(engine.rule(1).compiled.address_prefixes == sluice::AddressPrefixes{16, 64});
  CHECK(engine.evaluate({.client_ip = "192.0.2.1", .path = "/"}).allowed);
  CHECK_FALSE(engine.evaluate({.client_ip = "192.0.2.200", .path = "/"}).allowed);  // same /24
  CHECK(engine.evaluate({.client_ip = "192.0.3.1", .path = "/"}).allowed);          // next /24
  CHECK(engine.evaluate({.client_ip = "192.0.4.1", .path = "/"}).allowed);  // 3rd in the /16
  sluice::Evaluation fifth = engine.evaluate({.client_ip = "192.0.5.1", .path = "/"});
  CHECK_FALSE(fifth.allowed);  // the /16 rule's 3 are spent (the denied 2nd consumed nothing)
  CHECK(engine.rule(fifth.binding->rule).compiled.label == "p/per-subnet");
}

TEST_CASE("unparsable client addresses share one bucket instead of one each") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "p", .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 3})}}},
      .gateway = {.global_policies = {"p"}}};
  Engine engine = make_engine(config, clock);
  int allowed = 0;
  for (int i = 0; i < 20; ++i) {
    allowed += engine.evaluate({.client_ip = absl::StrCat("not-an-ip-", i), .path = "/"}).allowed;
  }
  CHECK(allowed == 3);
}

TEST_CASE("bad address prefixes and trusted proxies are rejected naming their path") {
  sluice::PolicyConfig config = documented_example();
  config.gateway.address_prefixes.ipv6 = 129;
  CHECK(sluice::validate(config).message() ==
        "gateway.address_prefixes.ipv6 must be in [0, 128], got 129");
  config.gateway.address_prefixes = {};
  config.policies[0].rate_limits[0].address_prefixes = sluice::AddressPrefixes{.ipv4 = 33};
  CHECK(sluice::validate(config).message() ==
        "policies[0].rate_limits[0].address_prefixes.ipv4 must be in [0, 32], got 33");
  config.policies[0].rate_limits[0].address_prefixes.reset();
  config.gateway.trusted_proxies = {"10.0.0.0/8", "not-a-network"};
  CHECK(sluice::validate(config).message().substr(0, 28) == "gateway.trusted_proxies[1]: ");
}

TEST_CASE(
    "trusted proxies that hold every address are refused, since behind them each client names its "
    "own key",
    "[attack]") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "p", .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 3})}}},
      .gateway = {.global_policies = {"p"}, .trusted_proxies = {"0.0.0.0/0"}}};
  // What such a config does if it is accepted: a client connecting straight from 203.0.113.7
  // is a "trusted proxy" itself, so the address it writes in X-Forwarded-For is the client.
  if (sluice::validate(config).ok()) {
    Engine engine = make_engine(config, clock);
    int allowed = 0;
    for (int i = 0; i < 20; ++i) {
      const sluice::ClientAddress client = engine.client_addresses().resolve(
          "203.0.113.7", "", absl::StrCat("198.51.100.", i, ", 203.0.113.7"));
      allowed += engine.evaluate({.client = client, .path = "/"}).allowed;
    }
    CHECK(allowed == 3);  // one client, one bucket
  }
  const std::vector<std::vector<std::string>> every_address = {
      {"0.0.0.0/0"},
      {"::/0"},
      {"10.0.0.0/8", "0.0.0.0/1", "128.0.0.0/1"},
      {"::ffff:0.0.0.0/96"},  // every IPv4 address in its IPv4-mapped form
      {"::/1", "8000::/1"},
      {"0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/3"},  // every unicast IPv4 address
      {"::/1"},                                     // every global unicast IPv6 address
  };
  for (const std::vector<std::string>& proxies : every_address) {
    CAPTURE(proxies);
    config.gateway.trusted_proxies = proxies;
    const absl::Status status = sluice::validate(config);
    CHECK(absl::StartsWith(status.message(), "gateway.trusted_proxies: "));
    CHECK(absl::StrContains(status.message(), "list only the networks of your own proxies"));
  }
  // Wide lists that leave some address untrusted are the operator's to choose.
  for (const std::vector<std::string>& proxies : std::vector<std::vector<std::string>>{
           {"0.0.0.0/1"}, {"0.0.0.0/1", "128.0.0.0/2"}, {"2000::/4", "::ffff:10.0.0.0/104"}}) {
    CAPTURE(proxies);
    config.gateway.trusted_proxies = proxies;
    CHECK(sluice::validate(config).ok());
  }
}

TEST_CASE("a request path is normalized before it is matched, and an ambiguous one is refused") {
  struct Case {
    std::string raw;
    std::string normalized;  // "" when refused
  };
  const std::vector<Case> cases = {
      {"/", "/"},
      {"/v1/items", "/v1/items"},
      {"/v1/items/", "/v1/items/"},
      {"/v1/items/../../login", "/login"},
      {"/v1/items/%2e%2e/%2E%2E/login", "/login"},
      {"/v1/items/.%2e/.%2E/login", "/login"},
      {"/v1/./items/./42", "/v1/items/42"},
      {"/v1/items/..", "/v1/"},
      {"/v1/items/.", "/v1/items/"},
      {"/v1//items///42", "/v1/items/42"},
      {"/v1/items//../login", "/v1/login"},
      {"/v1/%69tems/%7E%2D%5F", "/v1/items/~-_"},              // unreserved characters decoded
      {"/v1/a%20b/%3b/%e2%82%ac", "/v1/a%20b/%3B/%E2%82%AC"},  // others kept, hex upper case
      {"/v1/items%3Abatch/%40me/%21%24%26%27%28%29%2A%2B%2C%3D", "/v1/items:batch/@me/!$&'()*+,="},
      {"/caf\xC3\xA9/a\"b/%5B%5d/[]", "/caf%C3%A9/a%22b/%5B%5D/%5B%5D"},  // raw bytes encoded
      {"/v1/items;x", "/v1/items;x"},  // a parameter of the last segment
      {"/api;v=1/login", ""},          // a parameter before the last segment
      {"/api/login;x/", ""},
      {"/api;x/../login", "/login"},
      {"/v1/...", "/v1/..."},  // not a dot segment
      {"/v1/..a/.b", "/v1/..a/.b"},
      {"/..", ""},                          // climbs above the root
      {"/v1/../../login", ""},              // climbs above the root
      {"/%2e%2e/login", ""},                // climbs above the root
      {"/v1/items%2F..%2F..%2Flogin", ""},  // an encoded '/'
      {"/v1/items%2f..", ""},
      {"/v1/items%5C..", ""},  // an encoded '\'
      {"/v1/items\\..\\login", ""},
      {"/v1/items%00", ""},
      {"/v1/items/..;/login", ""},  // a dot segment with parameters
      {"/v1/%", ""},
      {"/v1/%4", ""},
      {"/v1/%zz", ""},
      {"/v1/a\tb", ""},
      {"v1/items", ""},
      {"", ""},
      {"http://example.com/v1/items", ""},
  };
  for (const Case& c : cases) {
    INFO("raw path: " << c.raw);
    const absl::StatusOr<std::string> normalized = sluice::normalize_request_path(c.raw);
    if (c.normalized.empty()) {
      CHECK(normalized.status().code() == absl::StatusCode::kInvalidArgument);
    } else {
      REQUIRE(normalized.ok());
      CHECK(*normalized == c.normalized);
    }
  }
  CHECK(sluice::normalize_request_path("/v1/../../etc").status().message() ==
        "the path climbs above the root");
}

// --- the backend chosen at run time (sluice/runtime_engine.hpp) -------------------------------

namespace {

using RuntimeBackend = sluice::VariantBackend<sluice::InMemoryBackend<sluice::ManualClock>>;
using RuntimeEngine = sluice::BasicRateLimitEngine<RuntimeBackend>;

// The documented example with `backend` as its section.
sluice::PolicyConfig example_on(sluice::BackendConfig backend) {
  sluice::PolicyConfig config = documented_example();
  config.backend = std::move(backend);
  return config;
}

}  // namespace

TEST_CASE("an engine whose backend the config chooses decides as the static engine of it") {
  sluice::ManualClock clock;
  const Engine fixed = make_engine(documented_example(), clock);
  RuntimeBackend::Options options;
  options.backend =
      sluice::InMemoryBackend<sluice::ManualClock>::Options{.store = {.seed = 1}, .clock = clock};
  auto chosen = RuntimeEngine::create(documented_example(), options);
  REQUIRE(chosen.ok());
  for (int i = 1; i <= 22; ++i) {
    const sluice::Evaluation a = fixed.evaluate(on_route("203.0.113.7", "public"));
    const sluice::Evaluation b = chosen->evaluate(on_route("203.0.113.7", "public"));
    INFO("request " << i);
    CHECK(a.allowed == b.allowed);
    CHECK(field(a, "X-RateLimit-Remaining") == field(b, "X-RateLimit-Remaining"));
    CHECK(field(a, "Retry-After") == field(b, "Retry-After"));
  }
  CHECK(chosen->stats()[0].denied == fixed.stats()[0].denied);
}

TEST_CASE("the runtime engine runs in memory without a backend section, and settles there") {
  auto engine = sluice::RuntimeRateLimitEngine::create(documented_example());
  REQUIRE(engine.ok());
  sluice::Evaluation e;
  sluice::RuntimeRateLimitEngine::Settlement settlement;
  engine->evaluate(on_route("203.0.113.7", "public"), e, settlement);
  REQUIRE(e.allowed);
  CHECK(engine->settle(settlement, 3).ok());  // the in-memory backend books
  CHECK(engine->reset("public-api-limits/per-ip", on_route("203.0.113.7", "public")).ok());
}

TEST_CASE("a backend this build does not include is refused when the engine is created") {
  const auto engine = sluice::RuntimeRateLimitEngine::create(
      example_on({.type = sluice::BackendKind::kRedis, .unix_socket = "/run/redis.sock"}));
  CHECK(engine.status().code() == absl::StatusCode::kInvalidArgument);
#ifndef SLUICE_WITH_REDIS
  CHECK(engine.status().message() ==
        "backend.type: redis is not in this build of sluice (link sluice::redis, built where "
        "hiredis is found)");
#endif
}

TEST_CASE("an engine whose backend is its C++ type refuses a config that names a backend") {
  const auto engine =
      sluice::RateLimitEngine::create(example_on({.type = sluice::BackendKind::kMemory}));
  CHECK(engine.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(engine.status().message(), "use sluice::RuntimeRateLimitEngine"));
}

TEST_CASE("a backend chosen both in code and in the config is refused") {
  RuntimeBackend::Options options;
  options.backend = sluice::InMemoryBackend<sluice::ManualClock>::Options{};
  const auto engine =
      RuntimeEngine::create(example_on({.type = sluice::BackendKind::kMemory}), options);
  CHECK(engine.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(engine.status().message(), "also chosen in code"));
}

TEST_CASE("a reload that changes the backend section is refused and the running one counts it") {
  auto engine =
      sluice::RuntimeRateLimitEngine::create(example_on({.type = sluice::BackendKind::kMemory}));
  REQUIRE(engine.ok());
  CHECK(engine->reload(example_on({.type = sluice::BackendKind::kMemory})).ok());
  const auto moved = engine->reload(documented_example());  // the section removed
  CHECK(moved.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(engine->engine_stats().failed_reloads == 1);
}

TEST_CASE("a backend section with a member its type does not read is invalid") {
  CHECK(sluice::validate(example_on({.type = sluice::BackendKind::kMemory, .key_seed = 7}))
            .message() == "backend.key_seed: is not read by type memory; remove it");
  CHECK(sluice::validate(example_on({.type = sluice::BackendKind::kRedis, .address = "10.0.0.5"}))
            .message() ==
        "backend.address: must be host:port (an IPv6 address in brackets: "
        "[::1]:6379)");
  CHECK(sluice::validate(example_on({.type = sluice::BackendKind::kRedisCluster,
                                     .address = "[2001:db8::5]:7000"}))
            .ok());
}

namespace {

// A fixed-window rule keyed by ip.
sluice::Rule fixed_rule(std::string name, sluice::RequestsPer per) {
  sluice::Rule r = rule(std::move(name), {Selector::kIp}, per);
  r.algorithm = sluice::Algorithm::kFixedWindow;
  return r;
}

// Bundles "first" and "second" with one rule each, both on route "both"; route "first-only"
// and "second-only" carry one each.
sluice::PolicyConfig two_rules(
    sluice::Rule first, sluice::Rule second,
    sluice::ConsumptionMode mode = sluice::ConsumptionMode::kAllOrNothing) {
  return {.policies = {{.name = "first", .rate_limits = {std::move(first)}},
                       {.name = "second", .rate_limits = {std::move(second)}}},
          .routes = {{.name = "both", .policies = {"first", "second"}},
                     {.name = "first-only", .policies = {"first"}},
                     {.name = "second-only", .policies = {"second"}}},
          .engine = {.consumption = mode}};
}

}  // namespace

TEST_CASE("a fixed-window rule counts its requests until the window's end, then opens a new one") {
  sluice::ManualClock clock;
  Engine engine =
      make_engine({.policies = {{.name = "b", .rate_limits = {fixed_rule("r", {.minute = 3})}}},
                   .routes = {{.name = "x", .policies = {"b"}}}},
                  clock);
  sluice::Evaluation e = engine.evaluate(on_route("10.0.0.1", "x"));
  REQUIRE(e.allowed);
  CHECK(e.binding->decision.limit == 3);
  CHECK(e.binding->decision.remaining == 2);
  CHECK(e.binding->decision.reset_after == 60s);  // the window opened with this request
  clock.advance(20s);
  CHECK(admitted(engine, on_route("10.0.0.1", "x"), 2) == 2);  // no refill within the window
  sluice::Evaluation denied = engine.evaluate(on_route("10.0.0.1", "x"));
  REQUIRE_FALSE(denied.allowed);
  CHECK(denied.binding->decision.remaining == 0);
  CHECK(denied.binding->decision.retry_after == 40s);
  CHECK(denied.binding->decision.reset_after == 40s);
  CHECK(field(denied, "Retry-After") == "40");
  CHECK(field(denied, "RateLimit-Policy") == "\"b/r/minute\";q=3;w=60");
  clock.advance(40s - 1ns);  // the last nanosecond of the window
  denied = engine.evaluate(on_route("10.0.0.1", "x"));
  REQUIRE_FALSE(denied.allowed);
  CHECK(denied.binding->decision.retry_after == 1ns);
  clock.advance(1ns);  // the window's end: a new window opens with the next admitted request
  e = engine.evaluate(on_route("10.0.0.1", "x"));
  REQUIRE(e.allowed);
  CHECK(e.binding->decision.remaining == 2);
  CHECK(e.binding->decision.reset_after == 60s);
  CHECK(admitted(engine, on_route("10.0.0.2", "x"), 5) == 3);  // another key, its own window
}

TEST_CASE("all_or_nothing: a GCRA rule that denies leaves a fixed window untouched, either order") {
  sluice::ManualClock clock;
  const sluice::Rule tight = rule("tight", {Selector::kIp}, {.minute = 1});
  const sluice::Rule window = fixed_rule("window", {.minute = 5});
  for (const bool window_first : {true, false}) {
    Engine engine =
        make_engine(window_first ? two_rules(window, tight) : two_rules(tight, window), clock);
    CHECK(admitted(engine, on_route("10.0.0.1", "both"), 5) == 1);
    const char* only = window_first ? "first-only" : "second-only";
    sluice::Evaluation e = engine.evaluate(on_route("10.0.0.1", only));
    REQUIRE(e.allowed);
    CHECK(e.binding->decision.remaining == 3);  // 5 - the admitted request - this one
    CHECK(e.binding->decision.reset_after == 60s);
  }
}

TEST_CASE("all_or_nothing: a fixed window that denies leaves a GCRA rule untouched, either order") {
  sluice::ManualClock clock;
  const sluice::Rule window = fixed_rule("window", {.minute = 1});
  const sluice::Rule loose = rule("loose", {Selector::kIp}, {.minute = 10});
  for (const bool window_first : {true, false}) {
    Engine engine =
        make_engine(window_first ? two_rules(window, loose) : two_rules(loose, window), clock);
    CHECK(admitted(engine, on_route("10.0.0.1", "both"), 5) == 1);
    sluice::Evaluation denied = engine.evaluate(on_route("10.0.0.1", "both"));
    REQUIRE_FALSE(denied.allowed);
    CHECK(engine.rule(denied.binding->rule).compiled.label ==
          (window_first ? "first/window" : "second/window"));
    CHECK(denied.binding->decision.retry_after == 60s);
    const char* only = window_first ? "second-only" : "first-only";
    CHECK(field(engine.evaluate(on_route("10.0.0.1", only)), "X-RateLimit-Remaining") == "8");
  }
}

TEST_CASE("every_rule: the admitting rule consumes whether a fixed window or GCRA denies") {
  sluice::ManualClock clock;
  constexpr auto kEvery = sluice::ConsumptionMode::kEveryRule;
  Engine gcra_consumes = make_engine(
      two_rules(fixed_rule("w", {.minute = 1}), rule("g", {Selector::kIp}, {.minute = 10}), kEvery),
      clock);
  CHECK(admitted(gcra_consumes, on_route("10.0.0.1", "both"), 5) == 1);
  CHECK(field(gcra_consumes.evaluate(on_route("10.0.0.1", "second-only")),
              "X-RateLimit-Remaining") == "4");
  Engine window_consumes = make_engine(
      two_rules(rule("g", {Selector::kIp}, {.minute = 1}), fixed_rule("w", {.minute = 10}), kEvery),
      clock);
  CHECK(admitted(window_consumes, on_route("10.0.0.1", "both"), 5) == 1);
  CHECK(field(window_consumes.evaluate(on_route("10.0.0.1", "second-only")),
              "X-RateLimit-Remaining") == "4");
}

TEST_CASE("a dry-run fixed window reports its would-be denial until its window ends") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config =
      two_rules(rule("live", {Selector::kIp}, {.minute = 100}), fixed_rule("trial", {.minute = 2}));
  config.policies[1].dry_run = true;
  Engine engine = make_engine(config, clock);
  for (int i = 0; i < 4; ++i) {
    sluice::Evaluation e = engine.evaluate(on_route("10.0.0.1", "both"));
    REQUIRE(e.allowed);
    REQUIRE(e.dry_denied.has_value() == (i >= 2));
    if (e.dry_denied) CHECK(e.dry_denied->decision.retry_after == 60s);
  }
  clock.advance(60s);
  CHECK_FALSE(engine.evaluate(on_route("10.0.0.1", "both")).dry_denied.has_value());
}

TEST_CASE(
    "a change of algorithm starts a rule fresh, and a fixed window's new limit keeps its count") {
  sluice::ManualClock clock;
  auto config = [](sluice::Algorithm algorithm, std::uint64_t per_minute) {
    sluice::PolicyConfig c = one_rule({.minute = per_minute});
    c.policies[0].rate_limits[0].algorithm = algorithm;
    return c;
  };
  constexpr auto kFixed = sluice::Algorithm::kFixedWindow;
  Engine first = make_engine(config(kFixed, 3), clock);
  REQUIRE(admitted(first, on_route("10.0.0.1", "x"), 5) == 3);
  clock.advance(30s);
  Engine raised = reloaded(first, config(kFixed, 5));
  CHECK(admitted(raised, on_route("10.0.0.1", "x"), 5) == 2);  // 3 of 5 counted already
  sluice::Evaluation denied = raised.evaluate(on_route("10.0.0.1", "x"));
  CHECK(denied.binding->decision.retry_after == 30s);  // the same window's end
  Engine gcra = reloaded(raised, config(sluice::Algorithm::kGcra, 5));
  CHECK(admitted(gcra, on_route("10.0.0.1", "x"), 10) == 5);  // another identity: fresh
}

TEST_CASE(
    "requests the live rules deny do not drain a dry-run rule, so enforcing it later denies no "
    "one else",
    "[attack]") {
  sluice::ManualClock clock;
  // Live: 1 per minute per address. On trial: 5 per minute for the whole route.
  sluice::PolicyConfig config{
      .policies = {{.name = "live",
                    .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 1})}},
                   {.name = "trial",
                    .rate_limits = {rule("route", {Selector::kRoute}, {.minute = 5})},
                    .dry_run = true}},
      .routes = {{.name = "api", .policies = {"live", "trial"}}}};
  Engine engine = make_engine(config, clock);
  // One client floods: its first request runs, the per-ip rule denies the other 19.
  CHECK(admitted(engine, on_route("203.0.113.66", "api"), 20) == 1);
  // Enforced together (all_or_nothing), the trial rule would have been charged once: another
  // client's request is not a would-be denial.
  sluice::Evaluation other = engine.evaluate(on_route("10.0.0.1", "api"));
  REQUIRE(other.allowed);
  CHECK_FALSE(other.dry_denied.has_value());
  CHECK(engine.stats()[1].dry_denied == 0);
  // Switched to enforcing (its state is kept), it has 3 of 5 left for everyone else.
  config.policies[1].dry_run = false;
  Engine enforcing = reloaded(engine, config);
  CHECK(admitted(enforcing, on_route("10.0.0.2", "api"), 1) == 1);
}

TEST_CASE("inspecting or resetting a route rule for a route the config lacks is NotFound",
          "[attack]") {
  sluice::ManualClock clock;
  // A route-wide rule that also limits all unrouted traffic together (404 floods).
  sluice::PolicyConfig config{
      .policies = {{.name = "b",
                    .rate_limits = {rule("flood", {Selector::kRoute}, {.minute = 2})}}},
      .routes = {{.name = "api"}},
      .gateway = {.global_policies = {"b"}}};
  Engine engine = make_engine(config, clock);
  sluice::RequestContext unrouted{.client_ip = "203.0.113.66", .path = "/nope"};
  REQUIRE(admitted(engine, unrouted, 5) == 2);  // the unrouted bucket is spent
  // An operator names a route that is not (or no longer) in the config: that is an error, not
  // the bucket every client's unrouted traffic shares.
  const sluice::RequestContext typo = on_route("10.0.0.1", "apii");
  CHECK(engine.inspect("b/flood", typo).status().code() == absl::StatusCode::kNotFound);
  CHECK(engine.reset("b/flood", typo).code() == absl::StatusCode::kNotFound);
  CHECK(admitted(engine, unrouted, 1) == 0);  // still limited
}

TEST_CASE(
    "inspecting or resetting an address rule for a request without an address is "
    "InvalidArgument, not the key every unparsable address shares",
    "[attack]") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config{
      .policies = {{.name = "b",
                    .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 2}),
                                    rule("per-caller", {Selector::kCredential}, {.minute = 2})}}},
      .routes = {{.name = "api", .policies = {"b"}}}};
  Engine engine = make_engine(config, clock);
  const sluice::RequestContext garbled = on_route("not an address", "api");
  REQUIRE(admitted(engine, garbled, 5) == 2);  // the shared "invalid" bucket is spent
  // An operator's request that names no address (a forgotten field) is an error for a rule
  // keyed by address, directly or as the anonymous caller's credential.
  const sluice::RequestContext no_address{.route = "api"};
  for (const char* label : {"b/per-ip", "b/per-caller"}) {
    INFO(label);
    CHECK(engine.inspect(label, no_address).status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(engine.reset(label, no_address).code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(admitted(engine, garbled, 1) == 0);  // still limited
  // The shared bucket is reached by naming an unparsable address on purpose.
  const sluice::RequestContext invalid = on_route("invalid", "api");
  CHECK(engine.inspect("b/per-ip", invalid)->remaining == 0);
  REQUIRE(engine.reset("b/per-ip", invalid).ok());
  REQUIRE(engine.reset("b/per-caller", invalid).ok());
  CHECK(admitted(engine, garbled, 1) == 1);
}

TEST_CASE("a peek at a key in debt counts as no denial", "[attack]") {
  sluice::ManualClock clock;
  // Live: 10 per second per address. On trial: 10 per second per address.
  sluice::PolicyConfig config{
      .policies = {{.name = "live", .rate_limits = {rule("per-ip", {Selector::kIp}, {.s = 10})}},
                   {.name = "wide", .rate_limits = {rule("per-ip", {Selector::kIp}, {.s = 1000})}},
                   {.name = "trial",
                    .rate_limits = {rule("tokens", {Selector::kIp}, {.s = 10})},
                    .dry_run = true}},
      .routes = {{.name = "api", .policies = {"live"}},
                 {.name = "tried", .policies = {"wide", "trial"}}}};
  Engine engine = make_engine(config, clock);
  for (const char* route : {"api", "tried"}) {
    sluice::Evaluation e;
    Engine::Settlement settlement;
    engine.evaluate(on_route("10.0.0.1", route), e, settlement);
    REQUIRE(e.allowed);
    REQUIRE(engine.settle(settlement, 25).ok());  // 15 beyond the bucket: in debt
  }
  sluice::RequestContext peek = on_route("10.0.0.1", "api");
  peek.cost = 0;
  const sluice::Evaluation live = engine.evaluate(peek);
  CHECK_FALSE(live.allowed);  // a peek reports the debt
  peek.route = "tried";
  const sluice::Evaluation dry = engine.evaluate(peek);
  CHECK(dry.allowed);
  CHECK(dry.dry_denied.has_value());
  // Neither is a request this rule refused: the counters count requests of cost 1 or more.
  const std::vector<sluice::RuleStats> stats = engine.stats();
  REQUIRE(stats.size() == 3);
  CHECK(stats[0].label == "live/per-ip");
  CHECK(stats[0].admitted == 1);
  CHECK(stats[0].denied == 0);
  CHECK(stats[2].label == "trial/tokens");
  CHECK(stats[2].admitted == 1);
  CHECK(stats[2].dry_denied == 0);
}

TEST_CASE("a settled cost is charged to a dry-run rule as to the live rules", "[attack]") {
  sluice::ManualClock clock;
  // Live: 1000 units per minute per address. On trial: 100 per minute.
  sluice::PolicyConfig config{
      .policies = {{.name = "live",
                    .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 1000})}},
                   {.name = "trial",
                    .rate_limits = {rule("tokens", {Selector::kIp}, {.minute = 100})},
                    .dry_run = true}},
      .routes = {{.name = "api", .policies = {"live", "trial"}}}};
  Engine engine = make_engine(config, clock);
  const sluice::RequestContext request = on_route("10.0.0.1", "api");  // estimated at 1
  int would_deny = 0;
  for (int i = 0; i < 5; ++i) {
    sluice::Evaluation e;
    Engine::Settlement settlement;
    engine.evaluate(request, e, settlement);
    REQUIRE(e.allowed);
    would_deny += e.dry_denied ? 1 : 0;
    REQUIRE(engine.settle(settlement, 90).ok());  // each request used 90
  }
  // Enforcing, the trial rule would admit two requests (each estimated at 1, the second when 90
  // of 100 are spent), then hold the client in debt: it would deny the other three.
  CHECK(would_deny == 3);
  CHECK(engine.inspect("trial/tokens", request)->remaining == 0);
  CHECK(engine.inspect("live/per-ip", request)->remaining == 550);
}

TEST_CASE("a request refused for a cost beyond a live rule's burst charges no dry-run rule",
          "[attack]") {
  sluice::ManualClock clock;
  // Live: a burst of 10 per address. On trial: 100 per minute for the whole route.
  sluice::PolicyConfig config{
      .policies = {{.name = "live",
                    .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 10})}},
                   {.name = "trial",
                    .rate_limits = {rule("route", {Selector::kRoute}, {.minute = 100})},
                    .dry_run = true}},
      .routes = {{.name = "api", .policies = {"live", "trial"}}},
      .engine = {.consumption = sluice::ConsumptionMode::kEveryRule}};
  Engine engine = make_engine(config, clock);
  sluice::RequestContext huge = on_route("203.0.113.66", "api");
  huge.cost = 50;  // no live rule can ever admit it: refused as invalid
  for (int i = 0; i < 2; ++i) {
    sluice::Evaluation e = engine.evaluate(huge);
    REQUIRE_FALSE(e.allowed);
    REQUIRE(e.backend_error.code() == absl::StatusCode::kInvalidArgument);
  }
  // Enforced, the trial rule would have been refused with the request: nothing spent.
  CHECK(engine.inspect("trial/route", on_route("10.0.0.1", "api"))->remaining == 100);
}

// --- a denied request's keys as they stand, in the call that denied it (StandingBackend) -------

namespace {

using MemoryBackend = sluice::InMemoryBackend<sluice::ManualClock>;
static_assert(sluice::StandingBackend<MemoryBackend> && sluice::StandingBackend<RuntimeBackend>);

}  // namespace

TEST_CASE("a denied request's admitting keys report as they stand, as a peek after it would") {
  sluice::ManualClock clock;
  RuntimeBackend::Options options;
  options.backend = MemoryBackend::Options{.clock = clock};
  auto one = RuntimeBackend::create(sluice::testing::standing_rules(), nullptr, options);
  auto two = MemoryBackend::create(sluice::testing::standing_rules(), nullptr, {.clock = clock});
  REQUIRE(one.ok());
  REQUIRE(two.ok());
  using K = sluice::RuleKey;
  // GCRA only (decided in one pass), with the fixed window (decided, then committed), and nine
  // keys (more than the one-pass path takes).
  const std::vector<std::vector<K>> requests = {
      {{0, "a", 2}, {1, "u", 1}},
      {{0, "a", 1}, {1, "u", 1}},
      {{1, "x", 1}, {0, "a", 1}},  // a denies: x as it stands, not less 1
      {{2, "t", 3}, {0, "b", 3}, {1, "v", 2}},
      {{0, "b", 1}, {2, "t", 1}, {1, "v", 1}},  // b and v deny: t as it stands
      {{2, "t", 2}, {1, "w", 1}},               // t denies: w as it stands
      {{0, "c", 1},
       {0, "d", 2},
       {0, "e", 1},
       {0, "f", 3},
       {0, "g", 1},
       {0, "h", 2},
       {0, "i", 1},
       {0, "j", 1},
       {0, "b", 1}},  // b denies, of nine
  };
  int denied_with_room = 0;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    INFO("request " << r);
    clock.advance(111ms);
    std::vector<sluice::Decision> a(requests[r].size());
    std::vector<sluice::Decision> b(requests[r].size());
    REQUIRE(one->check_rules_as_they_stand(requests[r], a).ok());
    REQUIRE(sluice::testing::decide_then_peek(*two, requests[r], b));
    CHECK(a == b);
    const bool denied = std::any_of(a.begin(), a.end(), [](const auto& d) { return !d.allowed(); });
    const bool room = std::any_of(a.begin(), a.end(),
                                  [](const auto& d) { return d.allowed() && d.remaining > 0; });
    denied_with_room += denied && room ? 1 : 0;
  }
  CHECK(denied_with_room >= 4);
  // Nothing was consumed by a denied request: the next checks agree too.
  clock.advance(1ns);
  for (const auto& keys : requests) {
    std::vector<sluice::Decision> a(keys.size());
    std::vector<sluice::Decision> b(keys.size());
    REQUIRE(one->check_rules(keys, sluice::ConsumptionMode::kEveryRule, a).ok());
    REQUIRE(two->check_rules(keys, sluice::ConsumptionMode::kEveryRule, b).ok());
    CHECK(a == b);
  }
}

// --- a (rule, key) repeated in one request: decided in order, all or nothing ------------------

namespace {

using sluice::testing::checked_one_by_one;
using sluice::testing::repeat_rules;
using K = sluice::RuleKey;

// Every backend made here digests keys alike (a fixed seed): a reset voids the bookings of the
// keys that share the reset key's shard, so two backends compared after one must share shards.
MemoryBackend memory_backend(const sluice::ManualClock& clock) {
  sluice::StoreOptions store;
  store.seed = 0x5eed;
  auto backend = MemoryBackend::create(repeat_rules(), nullptr, {.store = store, .clock = clock});
  REQUIRE(backend.ok());
  return *std::move(backend);
}

std::vector<sluice::Decision> all_or_nothing(MemoryBackend& backend, std::span<const K> keys) {
  std::vector<sluice::Decision> out(keys.size());
  REQUIRE(backend.check_rules(keys, sluice::ConsumptionMode::kAllOrNothing, out).ok());
  return out;
}

// Rule `rule`'s key `key` as it stands (a check at cost 0).
sluice::Decision peek(MemoryBackend& backend, std::size_t rule, std::string_view key) {
  std::vector<sluice::Decision> out(1);
  REQUIRE(
      backend.check_rules(std::vector<K>{{rule, key, 0}}, sluice::ConsumptionMode::kEveryRule, out)
          .ok());
  return out[0];
}

bool all_allowed(std::span<const sluice::Decision> out) {
  return std::all_of(out.begin(), out.end(), [](const auto& d) { return d.allowed(); });
}

}  // namespace

TEST_CASE("a key repeated in an all-or-nothing request is charged per occurrence when all fit",
          "[attack]") {
  sluice::ManualClock clock;
  MemoryBackend backend = memory_backend(clock);
  MemoryBackend reference = memory_backend(clock);
  const std::vector<K> fresh = {{0, "a", 1}, {0, "a", 1}};
  CHECK(all_or_nothing(backend, fresh) == checked_one_by_one(reference, fresh));
  CHECK(peek(backend, 0, "a").remaining == 1);
  const std::vector<K> tracked = {{0, "a", 0}, {0, "a", 1}};
  CHECK(all_or_nothing(backend, tracked) == checked_one_by_one(reference, tracked));
  CHECK(peek(backend, 0, "a").remaining == 0);
}

TEST_CASE("a repeated key whose later occurrence does not fit denies and consumes nothing",
          "[attack]") {
  sluice::ManualClock clock;
  MemoryBackend backend = memory_backend(clock);
  MemoryBackend reference = memory_backend(clock);
  const std::vector<K> first = {{0, "a", 1}};
  REQUIRE(all_or_nothing(backend, first)[0].allowed());
  REQUIRE(checked_one_by_one(reference, first)[0].allowed());
  const sluice::Decision before = peek(backend, 0, "a");
  REQUIRE(before.remaining == 2);
  // Two reservations of one cell, then a denial: both must be put back.
  const std::vector<K> thrice = {{0, "a", 1}, {0, "a", 1}, {0, "a", 1}};
  const std::vector<sluice::Decision> out = all_or_nothing(backend, thrice);
  CHECK(out == checked_one_by_one(reference, thrice));
  CHECK(out[0].remaining == 1);
  CHECK(out[1].remaining == 0);
  CHECK_FALSE(out[2].allowed());
  CHECK(peek(backend, 0, "a") == before);
}

TEST_CASE("a new key repeated under a burst of 1 is denied the second time and consumes nothing",
          "[attack]") {
  sluice::ManualClock clock;
  MemoryBackend backend = memory_backend(clock);
  MemoryBackend reference = memory_backend(clock);
  MemoryBackend untouched = memory_backend(clock);
  const std::vector<K> twice = {{3, "f", 1}, {0, "b", 1}, {3, "f", 1}};
  const std::vector<sluice::Decision> out = all_or_nothing(backend, twice);
  CHECK(out == checked_one_by_one(reference, twice));
  CHECK(out[0].allowed());
  CHECK_FALSE(out[2].allowed());
  CHECK(peek(backend, 3, "f") == peek(untouched, 3, "f"));
  CHECK(peek(backend, 0, "b") == peek(untouched, 0, "b"));
}

TEST_CASE("a fixed window repeated in one request is decided in order and consumes nothing",
          "[attack]") {
  sluice::ManualClock clock;
  MemoryBackend backend = memory_backend(clock);
  MemoryBackend reference = memory_backend(clock);
  MemoryBackend untouched = memory_backend(clock);
  const std::vector<K> over = {{2, "t", 3}, {2, "t", 2}};  // a window of 4
  const std::vector<sluice::Decision> out = all_or_nothing(backend, over);
  CHECK(out == checked_one_by_one(reference, over));
  CHECK_FALSE(out[1].allowed());
  CHECK(peek(backend, 2, "t") == peek(untouched, 2, "t"));
}

TEST_CASE("more than eight keys with a repeated one are decided in order, all or nothing",
          "[attack]") {
  sluice::ManualClock clock;
  MemoryBackend backend = memory_backend(clock);
  MemoryBackend reference = memory_backend(clock);
  MemoryBackend untouched = memory_backend(clock);
  std::vector<K> nine = {{0, "k1", 1}, {0, "k2", 1}, {0, "k3", 1}, {0, "k4", 1}, {0, "k5", 1},
                         {0, "k6", 1}, {0, "k7", 1}, {3, "h", 1},  {3, "h", 1}};
  const std::vector<sluice::Decision> out = all_or_nothing(backend, nine);
  CHECK(out == checked_one_by_one(reference, nine));
  CHECK_FALSE(out[8].allowed());
  for (const K& k : nine) CHECK(peek(backend, k.rule, k.key) == peek(untouched, k.rule, k.key));
}

TEST_CASE("check_rules_booking decides a repeated key in order and books nothing when denied",
          "[attack]") {
  sluice::ManualClock clock;
  MemoryBackend backend = memory_backend(clock);
  MemoryBackend reference = memory_backend(clock);
  MemoryBackend untouched = memory_backend(clock);
  std::vector<MemoryBackend::Booking> bookings;
  const std::vector<K> twice = {{3, "f", 1}, {3, "f", 1}};
  std::vector<sluice::Decision> out(twice.size());
  REQUIRE(backend.check_rules_booking(twice, sluice::ConsumptionMode::kAllOrNothing, out, bookings)
              .ok());
  CHECK(out == checked_one_by_one(reference, twice));
  CHECK(bookings.empty());
  CHECK(peek(backend, 3, "f") == peek(untouched, 3, "f"));
  // Both fit: each occurrence is decided after the one before it, and booked.
  const std::vector<K> fits = {{0, "a", 1}, {0, "a", 2}};
  out.assign(fits.size(), {});
  REQUIRE(backend.check_rules_booking(fits, sluice::ConsumptionMode::kAllOrNothing, out, bookings)
              .ok());
  CHECK(out == checked_one_by_one(reference, fits));
  CHECK(bookings.size() == 2);
  CHECK(peek(backend, 0, "a").remaining == 0);
}

TEST_CASE("each booking of a repeated key gives back only what its own occurrence holds ahead",
          "[attack]") {
  // Rule 0 refills one request per T = 1/3 s. Booked at t0, the first occurrence holds
  // [t0, t0 + 2T) and the second [t0 + 2T, t0 + 3T); at t0 + 2.4T only the second holds anything
  // ahead. Refunded in full, one after the other, each must give back what the same occurrence
  // booked alone right after the one before it gives back: the first nothing, the second 0.6T.
  sluice::ManualClock clock;
  MemoryBackend backend = memory_backend(clock);
  MemoryBackend reference = memory_backend(clock);
  const std::vector<K> twice = {{0, "a", 2}, {0, "a", 1}};
  std::vector<sluice::Decision> out(twice.size());
  std::vector<sluice::Decision> in_order(twice.size());
  std::vector<MemoryBackend::Booking> bookings;
  std::vector<MemoryBackend::Booking> one_by_one;
  REQUIRE(backend.check_rules_booking(twice, sluice::ConsumptionMode::kAllOrNothing, out, bookings)
              .ok());
  REQUIRE(reference
              .check_rules_booking(twice, sluice::ConsumptionMode::kEveryRule, in_order, one_by_one)
              .ok());
  REQUIRE(out == in_order);
  REQUIRE(bookings.size() == 2);
  REQUIRE(one_by_one.size() == 2);
  clock.advance(800ms);
  const absl::StatusOr<sluice::Decision> first = MemoryBackend::settle_booking(bookings[0], 0);
  const absl::StatusOr<sluice::Decision> first_alone =
      MemoryBackend::settle_booking(one_by_one[0], 0);
  REQUIRE(first.ok());
  REQUIRE(first_alone.ok());
  CHECK(first_alone->remaining == 2);  // nothing back: its booking lies behind now
  CHECK(first->remaining == first_alone->remaining);
  CHECK(*first == *first_alone);
  const absl::StatusOr<sluice::Decision> second = MemoryBackend::settle_booking(bookings[1], 0);
  const absl::StatusOr<sluice::Decision> second_alone =
      MemoryBackend::settle_booking(one_by_one[1], 0);
  REQUIRE(second.ok());
  REQUIRE(second_alone.ok());
  CHECK(second_alone->remaining == 3);  // 0.6T back: the bucket is full
  CHECK(*second == *second_alone);
}

TEST_CASE("bookings of repeated keys settle as the same occurrences booked one by one",
          "[attack]") {
  // Each request all or nothing against the same keys booked one item at a time (kEveryRule),
  // then every booking settled in order at the same later time and actual cost, field by field:
  // new and tracked keys, stacked windows with fractional intervals (rule 1), more than eight
  // keys, a cost of 0 between two costs; a reset between booking and settling voids both alike.
  const std::vector<std::vector<K>> requests = {
      {{0, "a", 1}, {0, "a", 1}, {0, "a", 1}},
      {{0, "a", 2}, {1, "u", 1}, {0, "a", 1}},
      {{1, "u", 1}, {1, "u", 0}, {1, "u", 1}},
      {{0, "k1", 1},
       {0, "k2", 1},
       {0, "k3", 1},
       {0, "k4", 1},
       {0, "k5", 1},
       {0, "k6", 1},
       {0, "k7", 1},
       {0, "b", 1},
       {0, "b", 2}},
  };
  for (std::size_t r = 0; r < requests.size(); ++r) {
    for (const bool tracked : {false, true}) {
      for (const auto later : {0ms, 100ms, 400ms, 700ms, 1100ms}) {
        for (const std::uint64_t actual : {0, 1}) {
          for (const bool reset : {false, true}) {
            INFO("request " << r << ", tracked " << tracked << ", " << later.count()
                            << " ms later, actual " << actual << ", reset " << reset);
            sluice::ManualClock clock;
            MemoryBackend backend = memory_backend(clock);
            MemoryBackend reference = memory_backend(clock);
            const std::vector<K>& keys = requests[r];
            if (tracked) {  // each key has a cell whose bucket is full again
              for (const K& k : keys) {
                all_or_nothing(backend, std::vector<K>{{k.rule, k.key, 1}});
                all_or_nothing(reference, std::vector<K>{{k.rule, k.key, 1}});
              }
              clock.advance(10s);
            }
            std::vector<sluice::Decision> out(keys.size());
            std::vector<sluice::Decision> in_order(keys.size());
            std::vector<MemoryBackend::Booking> bookings;
            std::vector<MemoryBackend::Booking> one_by_one;
            REQUIRE(backend
                        .check_rules_booking(keys, sluice::ConsumptionMode::kAllOrNothing, out,
                                             bookings)
                        .ok());
            REQUIRE(reference
                        .check_rules_booking(keys, sluice::ConsumptionMode::kEveryRule, in_order,
                                             one_by_one)
                        .ok());
            REQUIRE(out == in_order);
            REQUIRE(bookings.size() == keys.size());
            REQUIRE(one_by_one.size() == keys.size());
            clock.advance(later);
            if (reset) {
              REQUIRE(backend.reset_key(keys.back().rule, keys.back().key).ok());
              REQUIRE(reference.reset_key(keys.back().rule, keys.back().key).ok());
            }
            for (std::size_t i = 0; i < keys.size(); ++i) {
              INFO("occurrence " << i);
              const absl::StatusOr<sluice::Decision> got =
                  MemoryBackend::settle_booking(bookings[i], actual);
              const absl::StatusOr<sluice::Decision> expected =
                  MemoryBackend::settle_booking(one_by_one[i], actual);
              REQUIRE(got.ok());
              REQUIRE(expected.ok());
              CHECK(*got == *expected);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("check_rules_as_they_stand reports a repeated key's admitting occurrence as it stood",
          "[attack]") {
  sluice::ManualClock clock;
  MemoryBackend backend = memory_backend(clock);
  MemoryBackend reference = memory_backend(clock);
  MemoryBackend untouched = memory_backend(clock);
  const std::vector<K> twice = {{3, "f", 1}, {0, "b", 1}, {3, "f", 1}};
  std::vector<sluice::Decision> out(twice.size());
  REQUIRE(backend.check_rules_as_they_stand(twice, out).ok());
  const std::vector<sluice::Decision> in_order = checked_one_by_one(reference, twice);
  // The denial after the first occurrence; the admitting ones as they stood before the request.
  CHECK(out[2] == in_order[2]);
  CHECK(out[0] == peek(untouched, 3, "f"));
  CHECK(out[1] == peek(untouched, 0, "b"));
  CHECK(peek(backend, 3, "f") == out[0]);
  CHECK(peek(backend, 0, "b") == out[1]);
}

TEST_CASE("every_rule charges a repeated key once per admitted occurrence, in order", "[attack]") {
  sluice::ManualClock clock;
  MemoryBackend backend = memory_backend(clock);
  MemoryBackend reference = memory_backend(clock);
  const std::vector<K> thrice = {{3, "f", 1}, {0, "a", 2}, {3, "f", 1}, {0, "a", 2}};
  std::vector<sluice::Decision> out(thrice.size());
  REQUIRE(backend.check_rules(thrice, sluice::ConsumptionMode::kEveryRule, out).ok());
  CHECK(out == checked_one_by_one(reference, thrice));
  CHECK(peek(backend, 0, "a") == peek(reference, 0, "a"));
  CHECK(peek(backend, 3, "f") == peek(reference, 3, "f"));
}

TEST_CASE("all-or-nothing requests with repeated keys answer as their items checked in order",
          "[attack]") {
  // Each request against a reference that replays, one item at a time, every earlier request
  // that admitted (at its own time): a denied request must have consumed nothing.
  sluice::ManualClock clock;
  MemoryBackend backend = memory_backend(clock);
  const std::vector<std::vector<K>> requests = sluice::testing::repeated_key_requests();
  std::vector<std::size_t> admitted_requests;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    INFO("request " << r);
    clock.advance(111ms);
    const std::vector<sluice::Decision> out = all_or_nothing(backend, requests[r]);
    sluice::ManualClock replay_clock;
    MemoryBackend reference = memory_backend(replay_clock);
    for (std::size_t earlier : admitted_requests) {
      replay_clock.set(111ms * static_cast<int>(earlier + 1));
      REQUIRE(checked_one_by_one(reference, requests[earlier]).size() == requests[earlier].size());
    }
    replay_clock.set(clock.now());
    CHECK(out == checked_one_by_one(reference, requests[r]));
    if (all_allowed(out)) admitted_requests.push_back(r);
  }
  CHECK(admitted_requests.size() < requests.size());
}
