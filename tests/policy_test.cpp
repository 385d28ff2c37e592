#include "sluice/policy.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "sluice/clock.hpp"
#include "sluice/credential_resolver.hpp"

using namespace std::chrono_literals;
using sluice::Selector;

namespace {

// `name` as a fingerprint spells it: a 4-byte little-endian length, then the bytes.
std::string part(std::string_view name) {
  std::string out(4, '\0');
  out[0] = static_cast<char>(name.size());  // every name here is shorter than 256 bytes
  out.append(name);
  return out;
}

// The documented example bundle.
sluice::Bundle public_api_limits() {
  return sluice::Bundle{
      .name = "public-api-limits",
      .rate_limits = {{.name = "per-ip",
                       .selector = {Selector::kIp},
                       .requests_per = {.s = 10, .minute = 600},
                       .burst = 20},
                      {.name = "per-route-flood",
                       .selector = {Selector::kIp, Selector::kRoute},
                       .requests_per = {.minute = 2000}}},
  };
}

// A valid gateway layout that every invalid case below breaks in one place.
sluice::PolicyConfig valid_config() {
  return sluice::PolicyConfig{
      .policies = {public_api_limits(),
                   {.name = "login", .rate_limit = sluice::LegacyRateLimit{5, 60}},
                   {.name = "shadow",
                    .rate_limits = {{.selector = {Selector::kCredential},
                                     .requests_per = {.hour = 1000}}},
                    .dry_run = true}},
      .routes = {{.name = "public",
                  .service = "api-svc",
                  .path_prefix = "/v1",
                  .policies = {"public-api-limits"}},
                 {.name = "login",
                  .service = "api-svc",
                  .listener = "https",
                  .path_prefix = "/login",
                  .policies = {"login"}},
                 {.name = "admin", .path_prefix = "/admin"}},
      .services = {{.name = "api-svc", .policies = {"shadow"}}},
      .listeners = {{.name = "https", .policies = {"shadow"}}},
      .consumers = {{.name = "acme", .credentials = {"token-a", "token-b"}, .policies = {"login"}},
                    {.name = "globex", .credentials = {"token-c"}}},
      .gateway = {.global_policies = {"public-api-limits"}},
  };
}

struct InvalidCase {
  std::function<void(sluice::PolicyConfig&)> breakage;
  std::string message;
};

void check_invalid_cases(const std::vector<InvalidCase>& cases) {
  for (const InvalidCase& c : cases) {
    sluice::PolicyConfig config = valid_config();
    c.breakage(config);
    absl::Status status = sluice::validate(config);
    INFO("expected: " << c.message);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()) == c.message);
    // compile_policies refuses the same config with the same message.
    auto compiled = sluice::compile_policies(config);
    CHECK(compiled.status() == status);
  }
}

sluice::CompiledRule only_rule(const sluice::Bundle& bundle) {
  auto compiled = sluice::compile_bundle(bundle);
  REQUIRE(compiled.ok());
  REQUIRE(compiled->rules.size() == 1);
  return compiled->rules.front();
}

}  // namespace

TEST_CASE("a complete gateway layout is valid") { CHECK(sluice::validate(valid_config()).ok()); }

TEST_CASE("prefixes that differ only in case coexist while both routes are case_sensitive") {
  sluice::PolicyConfig config = valid_config();
  config.routes[2].path_prefix = "/V1";  // routes[0] is /v1 on every listener
  CHECK(sluice::validate(config).ok());
  // routes[1] is /login on the https listener only: another listener, another prefix space.
  config.routes[2] = {.name = "admin", .path_prefix = "/LOGIN", .case_sensitive = false};
  CHECK(sluice::validate(config).ok());
}

TEST_CASE("model defaults match the documentation") {
  sluice::PolicyConfig config;
  CHECK(config.gateway.exempt_paths == std::vector<std::string>{"/healthz", "/readyz", "/metrics"});
  CHECK(config.gateway.global_policies.empty());
  CHECK(config.engine.consumption == sluice::ConsumptionMode::kAllOrNothing);
  CHECK(config.engine.on_backend_error == sluice::FailureMode::kFailOpen);
  CHECK_FALSE(config.engine.local_share_permille.has_value());
  CHECK(config.engine.local_retry_interval_ms == 1000);
  CHECK_FALSE(sluice::Bundle{}.dry_run);
  CHECK(sluice::Route{}.case_sensitive);
  CHECK(sluice::validate(config).ok());  // nothing configured is a valid (empty) config
}

TEST_CASE("invalid bundles are rejected with the path of the bad value") {
  check_invalid_cases({
      {[](auto& c) { c.policies[0].name = ""; }, "policies[0].name must not be empty"},
      {[](auto& c) { c.policies[2].name = "login"; },
       "policies[2].name: duplicate bundle name \"login\" (also policies[1])"},
      {[](auto& c) { c.policies[1].name = "bad\x01name\""; },
       "policies[1].name: \"bad\\x01name\\\"\" must contain only printable ASCII characters "
       "(0x20-0x7E)"},
      {[](auto& c) { c.policies[1].rate_limit.reset(); },
       "policies[1] must set rate_limits or rate_limit"},
      {[](auto& c) { c.policies[1].rate_limit->window_seconds = 0; },
       "policies[1].rate_limit.window_seconds must be > 0"},
      {[](auto& c) { c.policies[1].rate_limit->requests = 0; },
       "policies[1].rate_limit.requests must be > 0"},
      {[](auto& c) { c.policies[1].rate_limit->window_seconds = 31'536'001; },
       "policies[1].rate_limit.window_seconds must be <= 31536000"},
      {[](auto& c) { c.policies[1].rate_limit->requests = (std::uint64_t{1} << 32) + 1; },
       "policies[1].rate_limit.requests must be <= 4294967296"},
  });
}

TEST_CASE("invalid rules are rejected with the path of the bad value") {
  check_invalid_cases({
      {[](auto& c) { c.policies[0].rate_limits[1].requests_per.s = 0; },
       "policies[0].rate_limits[1].requests_per.s must be > 0"},
      {[](auto& c) { c.policies[0].rate_limits[0].requests_per.minute = 0; },
       "policies[0].rate_limits[0].requests_per.minute must be > 0"},
      {[](auto& c) {
         c.policies[2].rate_limits[0].requests_per.hour = (std::uint64_t{1} << 32) + 1;
       },
       "policies[2].rate_limits[0].requests_per.hour must be <= 4294967296"},
      {[](auto& c) { c.policies[0].rate_limits[1].requests_per = {}; },
       "policies[0].rate_limits[1].requests_per must set at least one of s, minute, hour"},
      {[](auto& c) { c.policies[0].rate_limits[0].selector.clear(); },
       "policies[0].rate_limits[0].selector must not be empty"},
      {[](auto& c) {
         c.policies[0].rate_limits[1].selector = {Selector::kRoute, Selector::kRoute};
       },
       "policies[0].rate_limits[1].selector[1]: duplicate selector \"route\""},
      {[](auto& c) { c.policies[0].rate_limits[0].selector = {static_cast<Selector>(7)}; },
       "policies[0].rate_limits[0].selector[0]: unknown selector 7"},
      {[](auto& c) { c.policies[0].rate_limits[0].burst = 0; },
       "policies[0].rate_limits[0].burst must be >= 1"},
      {[](auto& c) { c.policies[0].rate_limits[0].burst = 315'360'001; },
       "policies[0].rate_limits[0].burst must be <= 315360000 (a full bucket must refill within "
       "365 days)"},
      {[](auto& c) { c.policies[0].rate_limits[0].algorithm = sluice::Algorithm::kFixedWindow; },
       "policies[0].rate_limits[0].burst must equal the requests of the shortest window (10) in a "
       "fixed_window rule, or be absent"},
      {[](auto& c) {
         c.policies[0].rate_limits[1].algorithm = sluice::Algorithm::kFixedWindow;
         c.policies[0].rate_limits[1].adaptive = sluice::AdaptivePolicy{.target_latency = 100ms};
       },
       "policies[0].rate_limits[1].adaptive needs algorithm gcra"},
      {[](auto& c) { c.policies[0].rate_limits[1].name = "per-ip"; },
       "policies[0].rate_limits[1].name: duplicate rule name \"per-ip\" (also "
       "policies[0].rate_limits[0])"},
      {[](auto& c) { c.policies[0].rate_limits[1].name = "tab\there"; },
       "policies[0].rate_limits[1].name: \"tab\\x09here\" must contain only printable ASCII "
       "characters (0x20-0x7E)"},
  });
}

TEST_CASE("a burst is bounded by a year of the shortest window's rate") {
  sluice::Bundle bundle{.name = "b",
                        .rate_limits = {{.selector = {Selector::kIp},
                                         .requests_per = {.minute = 1, .hour = 10},
                                         .burst = 525'600}}};
  CHECK(sluice::validate_bundle(bundle).ok());
  bundle.rate_limits[0].burst = 525'601;
  CHECK(sluice::validate_bundle(bundle).message() ==
        "bundle.rate_limits[0].burst must be <= 525600 (a full bucket must refill within 365 "
        "days)");
}

TEST_CASE("invalid scopes and references are rejected with the path of the bad value") {
  check_invalid_cases({
      {[](auto& c) { c.routes[2].policies = {"x"}; },
       "routes[2].policies[0]: unknown bundle \"x\""},
      {[](auto& c) { c.routes[0].policies.push_back("public-api-limits"); },
       "routes[0].policies[1]: bundle \"public-api-limits\" is already attached at "
       "routes[0].policies[0]"},
      {[](auto& c) { c.routes[1].name = "public"; },
       "routes[1].name: duplicate route name \"public\" (also routes[0])"},
      {[](auto& c) { c.routes[0].name = ""; }, "routes[0].name must not be empty"},
      {[](auto& c) { c.routes[0].service = "nope"; },
       "routes[0].service: unknown service \"nope\""},
      {[](auto& c) { c.routes[2].listener = "udp"; },
       "routes[2].listener: unknown listener \"udp\""},
      {[](auto& c) { c.routes[2].path_prefix = "admin"; },
       "routes[2].path_prefix: \"admin\" must start with '/' and contain only printable ASCII "
       "characters"},
      {[](auto& c) { c.routes[2].path_prefix = "/v1"; },
       "routes[2].path_prefix: \"/v1\" is already matched by routes[0] on the same listener"},
      // A route that ignores case matches every spelling of its prefix.
      {[](auto& c) {
         c.routes[2].path_prefix = "/V1";
         c.routes[2].case_sensitive = false;
       },
       "routes[2].path_prefix: \"/V1\" is already matched by routes[0] on the same listener (the "
       "prefixes differ only in case, and routes[2] sets case_sensitive: false)"},
      {[](auto& c) {
         c.routes[0].case_sensitive = false;
         c.routes[2].path_prefix = "/V1";
       },
       "routes[2].path_prefix: \"/V1\" is already matched by routes[0] on the same listener (the "
       "prefixes differ only in case, and routes[0] sets case_sensitive: false)"},
      {[](auto& c) {
         c.routes[2].path_prefix = "/v1";
         c.routes[2].case_sensitive = false;
       },
       "routes[2].path_prefix: \"/v1\" is already matched by routes[0] on the same listener"},
      {[](auto& c) { c.routes.push_back({.name = "by-name", .case_sensitive = false}); },
       "routes[3].case_sensitive: is false, but the route has no path_prefix to match; remove "
       "case_sensitive or set a path_prefix"},
      // Routes match normalized paths: a prefix that normalization changes matches nothing.
      {[](auto& c) { c.routes[2].path_prefix = "/v1//login"; },
       "routes[2].path_prefix: \"/v1//login\" can match no request: request paths are normalized "
       "before routes are matched (repeated '/' merged, dot segments removed, unreserved "
       "characters, sub-delims but ';', ':' and '@' decoded, other bytes percent-encoded in upper "
       "case); write \"/v1/login\""},
      {[](auto& c) { c.routes[2].path_prefix = "/v1/x/../login"; },
       "routes[2].path_prefix: \"/v1/x/../login\" can match no request: request paths are "
       "normalized before routes are matched (repeated '/' merged, dot segments removed, "
       "unreserved characters, sub-delims but ';', ':' and '@' decoded, other bytes "
       "percent-encoded in upper case); write \"/v1/login\""},
      {[](auto& c) { c.routes[2].path_prefix = "/%7Euser"; },
       "routes[2].path_prefix: \"/%7Euser\" can match no request: request paths are normalized "
       "before routes are matched (repeated '/' merged, dot segments removed, unreserved "
       "characters, sub-delims but ';', ':' and '@' decoded, other bytes percent-encoded in upper "
       "case); write \"/~user\""},
      {[](auto& c) { c.routes[2].path_prefix = "/a%3bb"; },
       "routes[2].path_prefix: \"/a%3bb\" can match no request: request paths are normalized "
       "before routes are matched (repeated '/' merged, dot segments removed, unreserved "
       "characters, sub-delims but ';', ':' and '@' decoded, other bytes percent-encoded in upper "
       "case); write \"/a%3Bb\""},
      {[](auto& c) { c.routes[2].path_prefix = "/v1/items%3Abatch"; },
       "routes[2].path_prefix: \"/v1/items%3Abatch\" can match no request: request paths are "
       "normalized before routes are matched (repeated '/' merged, dot segments removed, "
       "unreserved characters, sub-delims but ';', ':' and '@' decoded, other bytes "
       "percent-encoded in upper case); write \"/v1/items:batch\""},
      {[](auto& c) { c.routes[2].path_prefix = "/files%2Fx"; },
       "routes[2].path_prefix: \"/files%2Fx\" can match no request: the path encodes '/', '\\' or "
       "NUL (%2F, %5C, %00)"},
      {[](auto& c) { c.routes[2].path_prefix = "/../x"; },
       "routes[2].path_prefix: \"/../x\" can match no request: the path climbs above the root"},
      {[](auto& c) { c.services.push_back({.name = "api-svc"}); },
       "services[1].name: duplicate service name \"api-svc\" (also services[0])"},
      {[](auto& c) {
         c.services[0].policies = {"shadow", "nope"};
       },
       "services[0].policies[1]: unknown bundle \"nope\""},
      {[](auto& c) { c.listeners[0].name = ""; }, "listeners[0].name must not be empty"},
      {[](auto& c) { c.listeners[0].policies = {"Shadow"}; },
       "listeners[0].policies[0]: unknown bundle \"Shadow\""},
      {[](auto& c) { c.consumers[1].name = "acme"; },
       "consumers[1].name: duplicate consumer name \"acme\" (also consumers[0])"},
      {[](auto& c) { c.consumers[1].policies = {"missing"}; },
       "consumers[1].policies[0]: unknown bundle \"missing\""},
      {[](auto& c) { c.consumers[0].credentials[1] = ""; },
       "consumers[0].credentials[1] must not be empty"},
      {[](auto& c) { c.consumers[1].credentials = {"token-b"}; },
       "consumers[1].credentials[0]: duplicate credential (also consumers[0].credentials[1])"},
      {[](auto& c) {
         c.gateway.global_policies = {"public-api-limits", "ghost"};
       },
       "gateway.global_policies[1]: unknown bundle \"ghost\""},
      {[](auto& c) { c.gateway.exempt_paths.push_back("healthz"); },
       "gateway.exempt_paths[3]: \"healthz\" must start with '/'"},
      {[](auto& c) { c.engine.consumption = static_cast<sluice::ConsumptionMode>(5); },
       "engine.consumption: unknown mode 5"},
      {[](auto& c) { c.engine.on_backend_error = static_cast<sluice::FailureMode>(9); },
       "engine.on_backend_error: unknown mode 9"},
  });
}

TEST_CASE("a config at every size cap validates and reports the last duplicate") {
  // Untrusted configs may be large: validation is linear, so this stays fast even under ASan.
  sluice::PolicyConfig config;
  for (std::size_t i = 0; i < sluice::kMaxBundles; ++i) {
    config.policies.push_back(
        {.name = "b" + std::to_string(i), .rate_limit = sluice::LegacyRateLimit{1, 1}});
  }
  for (std::size_t i = 0; i < sluice::kMaxRoutes; ++i) {
    config.routes.push_back({.name = "r" + std::to_string(i),
                             .path_prefix = "/" + std::to_string(i),
                             .policies = {"b" + std::to_string(i % sluice::kMaxBundles)}});
  }
  for (std::size_t i = 0; i < sluice::kMaxAttachedRules; ++i) {
    config.gateway.global_policies.push_back("b" + std::to_string(i));
  }
  CHECK(sluice::validate(config).ok());

  config.routes.back().policies.push_back(config.routes.back().policies[0]);
  CHECK(sluice::validate(config).message() ==
        "routes[4095].policies[1]: bundle \"b1023\" is already attached at "
        "routes[4095].policies[0]");
}

TEST_CASE("configs past a size cap are rejected naming the cap") {
  auto with_bundles = [](std::size_t n, std::size_t rules_each) {
    sluice::PolicyConfig config;
    for (std::size_t i = 0; i < n; ++i) {
      sluice::Bundle bundle{.name = "b" + std::to_string(i)};
      for (std::size_t j = 0; j < rules_each; ++j) {
        bundle.rate_limits.push_back({.selector = {Selector::kIp}, .requests_per = {.s = 1}});
      }
      config.policies.push_back(std::move(bundle));
    }
    return config;
  };
  CHECK(sluice::validate(with_bundles(sluice::kMaxBundles + 1, 1)).message() ==
        "policies: at most 1024 bundles are supported, got 1025");
  CHECK(sluice::validate(with_bundles(1, sluice::kMaxRulesPerBundle + 1)).message() ==
        "policies[0].rate_limits: at most 64 rules per bundle are supported, got 65");
  CHECK(sluice::validate(with_bundles(17, 64)).message() ==
        "policies: at most 1024 rules in all are supported, got 1088");

  sluice::PolicyConfig wide = with_bundles(2, 20);
  wide.gateway.global_policies = {"b0", "b1"};
  CHECK(sluice::validate(wide).message() ==
        "gateway.global_policies attaches 40 rules; at most 32 are supported");

  sluice::PolicyConfig long_name = with_bundles(1, 1);
  long_name.policies[0].name = std::string(257, 'n');
  CHECK(sluice::validate(long_name).message() ==
        "policies[0].name must be at most 256 bytes, got 257");

  sluice::PolicyConfig routes;
  routes.routes.resize(sluice::kMaxRoutes + 1);
  CHECK(sluice::validate(routes).message() ==
        "routes: at most 4096 routes are supported, got 4097");
}

TEST_CASE("two rules can never print the same label") {
  sluice::PolicyConfig slash = {
      .policies = {{.name = "a",
                    .rate_limits = {
                        {.name = "b/c", .selector = {Selector::kIp}, .requests_per = {.s = 1}}}}}};
  CHECK(sluice::validate(slash).message() ==
        "policies[0].rate_limits[0].name: \"b/c\" must not contain '/'");

  sluice::PolicyConfig shadowed = {
      .policies = {{.name = "a",
                    .rate_limits = {{.selector = {Selector::kIp}, .requests_per = {.s = 1}},
                                    {.name = "rate_limits[0]",
                                     .selector = {Selector::kIp},
                                     .requests_per = {.s = 2}}},
                    .rate_limit = sluice::LegacyRateLimit{1, 1}}}};
  CHECK(sluice::validate(shadowed).message() ==
        "policies[0].rate_limits[1]: label \"a/rate_limits[0]\" is also the label of "
        "policies[0].rate_limits[0]");
  shadowed.policies[0].rate_limits[1].name = "rate_limit";
  CHECK(sluice::validate(shadowed).message() ==
        "policies[0].rate_limits[1]: label \"a/rate_limit\" is also the label of "
        "policies[0].rate_limit");
}

TEST_CASE("the same path prefix may serve different listeners") {
  sluice::PolicyConfig config = valid_config();
  config.routes[2].path_prefix = "/v1";
  config.routes[2].listener = "https";
  CHECK(sluice::validate(config).ok());
}

TEST_CASE("the documented example compiles to three windows in two rules") {
  auto compiled = sluice::compile_bundle(public_api_limits());
  REQUIRE(compiled.ok());
  CHECK(compiled->name == "public-api-limits");
  CHECK_FALSE(compiled->dry_run);
  REQUIRE(compiled->rules.size() == 2);

  const sluice::CompiledRule& per_ip = compiled->rules[0];
  CHECK(per_ip.bundle == "public-api-limits");
  CHECK(per_ip.name == "per-ip");
  CHECK(per_ip.label == "public-api-limits/per-ip");
  CHECK(per_ip.index == 0);
  CHECK_FALSE(per_ip.legacy);
  CHECK(per_ip.selector == std::vector<Selector>{Selector::kIp});
  CHECK(per_ip.windows == std::vector<sluice::GcraWindow>{{10, 1s, 20}, {600, 60s, 600}});
  CHECK(per_ip.fingerprint == "sluice.rule.v1;bundle=" + part("public-api-limits") +
                                  ";rule=name:" + part("per-ip") +
                                  ";selector=ip;"
                                  "windows=10/1000000000ns/20,600/60000000000ns/600");

  const sluice::CompiledRule& flood = compiled->rules[1];
  CHECK(flood.label == "public-api-limits/per-route-flood");
  CHECK(flood.index == 1);
  CHECK(flood.selector == std::vector<Selector>{Selector::kIp, Selector::kRoute});
  CHECK(flood.windows == std::vector<sluice::GcraWindow>{{2000, 60s, 2000}});
  CHECK(flood.fingerprint == "sluice.rule.v1;bundle=" + part("public-api-limits") +
                                 ";rule=name:" + part("per-route-flood") +
                                 ";"
                                 "selector=ip,route;windows=2000/60000000000ns/2000");
}

TEST_CASE("only the shortest window takes the burst and windows are sorted shortest first") {
  sluice::CompiledRule rule =
      only_rule({.name = "b",
                 .rate_limits = {{.selector = {Selector::kCredential},
                                  .requests_per = {.s = 5, .minute = 100, .hour = 1000},
                                  .burst = 7}}});
  CHECK(rule.windows ==
        std::vector<sluice::GcraWindow>{{5, 1s, 7}, {100, 60s, 100}, {1000, 3600s, 1000}});

  sluice::CompiledRule minutely_and_hourly =
      only_rule({.name = "b",
                 .rate_limits = {{.selector = {Selector::kIp},
                                  .requests_per = {.minute = 30, .hour = 600},
                                  .burst = 1}}});
  CHECK(minutely_and_hourly.windows ==
        std::vector<sluice::GcraWindow>{{30, 60s, 1}, {600, 3600s, 600}});
}

TEST_CASE("burst defaults to the shortest window's requests") {
  sluice::CompiledRule rule =
      only_rule({.name = "b",
                 .rate_limits = {
                     {.selector = {Selector::kIp}, .requests_per = {.minute = 60, .hour = 500}}}});
  CHECK(rule.windows == std::vector<sluice::GcraWindow>{{60, 60s, 60}, {500, 3600s, 500}});
}

TEST_CASE("a burst smaller than the rate is kept as the bucket size") {
  sluice::CompiledRule rule = only_rule(
      {.name = "b",
       .rate_limits = {{.selector = {Selector::kIp}, .requests_per = {.s = 100}, .burst = 1}}});
  CHECK(rule.windows == std::vector<sluice::GcraWindow>{{100, 1s, 1}});
}

TEST_CASE("the legacy rate_limit compiles to one route-keyed window with burst equal to requests") {
  sluice::CompiledRule rule =
      only_rule({.name = "login", .rate_limit = sluice::LegacyRateLimit{5, 60}});
  CHECK(rule.legacy);
  CHECK(rule.name.empty());
  CHECK(rule.index == 0);
  CHECK(rule.label == "login/rate_limit");
  CHECK(rule.selector == std::vector<Selector>{Selector::kRoute});
  CHECK(rule.windows == std::vector<sluice::GcraWindow>{{5, 60s, 5}});
  CHECK(rule.fingerprint == "sluice.rule.v1;bundle=" + part("login") +
                                ";rule=legacy;selector=route;"
                                "windows=5/60000000000ns/5");
}

TEST_CASE("legacy rate_limit and rate_limits in one bundle both apply") {
  sluice::Bundle bundle = public_api_limits();
  bundle.rate_limit = sluice::LegacyRateLimit{.requests = 100, .window_seconds = 10};
  auto compiled = sluice::compile_bundle(bundle);
  REQUIRE(compiled.ok());
  REQUIRE(compiled->rules.size() == 3);
  CHECK(compiled->rules[0].label == "public-api-limits/per-ip");
  CHECK(compiled->rules[1].label == "public-api-limits/per-route-flood");
  const sluice::CompiledRule& legacy = compiled->rules[2];
  CHECK(legacy.legacy);
  CHECK(legacy.index == 2);
  CHECK(legacy.label == "public-api-limits/rate_limit");
  CHECK(legacy.selector == std::vector<Selector>{Selector::kRoute});
  CHECK(legacy.windows == std::vector<sluice::GcraWindow>{{100, 10s, 100}});
}

TEST_CASE("a fixed-window rule keeps its windows and marks its fingerprint and identity") {
  sluice::Bundle bundle = public_api_limits();
  bundle.rate_limits[0].burst = 10;  // equal to the shortest window's requests: accepted
  bundle.rate_limits[0].algorithm = sluice::Algorithm::kFixedWindow;
  auto fixed = sluice::compile_bundle(bundle);
  auto gcra = sluice::compile_bundle(public_api_limits());
  REQUIRE(fixed.ok());
  REQUIRE(gcra.ok());
  const sluice::CompiledRule& rule = fixed->rules[0];
  CHECK(rule.algorithm == sluice::Algorithm::kFixedWindow);
  CHECK(rule.windows == std::vector<sluice::GcraWindow>{{10, 1s, 10}, {600, 60s, 600}});
  CHECK(rule.fingerprint == "sluice.rule.v1;bundle=" + part("public-api-limits") +
                                ";rule=name:" + part("per-ip") +
                                ";selector=ip;windows=10/1000000000ns/10,600/60000000000ns/600;"
                                "algorithm=fixed_window");
  // A change of algorithm is a change of identity: the rule starts fresh.
  CHECK(rule.identity != gcra->rules[0].identity);
  CHECK(fixed->rules[1].algorithm == sluice::Algorithm::kGcra);
  CHECK(fixed->rules[1].fingerprint == gcra->rules[1].fingerprint);
  CHECK(sluice::parse_algorithm("fixed_window") == sluice::Algorithm::kFixedWindow);
  CHECK(sluice::parse_algorithm("gcra") == sluice::Algorithm::kGcra);
  CHECK(!sluice::parse_algorithm("sliding").has_value());
}

TEST_CASE("an unnamed rule is labelled and fingerprinted by its position") {
  sluice::CompiledRule rule = only_rule(
      {.name = "shadow",
       .rate_limits = {{.selector = {Selector::kCredential}, .requests_per = {.hour = 1000}}},
       .dry_run = true});
  CHECK(rule.dry_run);
  CHECK(rule.label == "shadow/rate_limits[0]");
  CHECK(rule.fingerprint == "sluice.rule.v1;bundle=" + part("shadow") +
                                ";rule=index:0;selector=credential;"
                                "windows=1000/3600000000000ns/1000");
}

TEST_CASE("selector order in the config does not matter") {
  sluice::Bundle forward = public_api_limits();
  sluice::Bundle backward = public_api_limits();
  backward.rate_limits[1].selector = {Selector::kRoute, Selector::kIp};
  auto a = sluice::compile_bundle(forward);
  auto b = sluice::compile_bundle(backward);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->rules[1].selector == b->rules[1].selector);
  CHECK(a->rules[1].fingerprint == b->rules[1].fingerprint);
}

TEST_CASE("fingerprints are stable across compilations and config order of named rules") {
  auto first = sluice::compile_bundle(public_api_limits());
  auto second = sluice::compile_bundle(public_api_limits());
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  CHECK(*first == *second);

  sluice::Bundle reordered = public_api_limits();
  std::swap(reordered.rate_limits[0], reordered.rate_limits[1]);
  auto swapped = sluice::compile_bundle(reordered);
  REQUIRE(swapped.ok());
  CHECK(swapped->rules[1].fingerprint == first->rules[0].fingerprint);
  CHECK(swapped->rules[0].fingerprint == first->rules[1].fingerprint);
}

TEST_CASE("a fingerprint changes with every field that defines the rule") {
  const sluice::CompiledRule original =
      only_rule({.name = "b",
                 .rate_limits = {{.name = "r",
                                  .selector = {Selector::kIp},
                                  .requests_per = {.s = 10, .minute = 600},
                                  .burst = 20}}});
  struct Change {
    std::string what;
    bool keeps_identity;  // only the windows change: keys carry their spent share
    std::function<void(sluice::Bundle&)> apply;
  };
  const std::vector<Change> changes = {
      {"bundle name", false, [](sluice::Bundle& b) { b.name = "c"; }},
      {"rule name", false, [](sluice::Bundle& b) { b.rate_limits[0].name = "s"; }},
      {"unnamed", false, [](sluice::Bundle& b) { b.rate_limits[0].name = ""; }},
      {"selector", false,
       [](sluice::Bundle& b) { b.rate_limits[0].selector = {Selector::kCredential}; }},
      {"added selector", false,
       [](sluice::Bundle& b) { b.rate_limits[0].selector.push_back(Selector::kRoute); }},
      {"address prefixes", false,
       [](sluice::Bundle& b) {
         b.rate_limits[0].address_prefixes = sluice::AddressPrefixes{.ipv4 = 24, .ipv6 = 48};
       }},
      {"s", true, [](sluice::Bundle& b) { b.rate_limits[0].requests_per.s = 11; }},
      {"minute", true, [](sluice::Bundle& b) { b.rate_limits[0].requests_per.minute = 601; }},
      {"added hour", true, [](sluice::Bundle& b) { b.rate_limits[0].requests_per.hour = 10000; }},
      {"removed s", true, [](sluice::Bundle& b) { b.rate_limits[0].requests_per.s.reset(); }},
      {"burst", true, [](sluice::Bundle& b) { b.rate_limits[0].burst = 21; }},
      {"default burst", true, [](sluice::Bundle& b) { b.rate_limits[0].burst.reset(); }},
  };
  for (const Change& change : changes) {
    sluice::Bundle bundle{.name = "b",
                          .rate_limits = {{.name = "r",
                                           .selector = {Selector::kIp},
                                           .requests_per = {.s = 10, .minute = 600},
                                           .burst = 20}}};
    change.apply(bundle);
    INFO("changed: " << change.what);
    const sluice::CompiledRule changed = only_rule(bundle);
    CHECK(changed.fingerprint != original.fingerprint);
    CHECK((changed.identity == original.identity) == change.keeps_identity);
  }
}

TEST_CASE("a fingerprint ignores dry_run so shadow buckets carry over to enforcement") {
  sluice::Bundle live = public_api_limits();
  sluice::Bundle shadow = public_api_limits();
  shadow.dry_run = true;
  auto a = sluice::compile_bundle(live);
  auto b = sluice::compile_bundle(shadow);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(b->dry_run);
  CHECK(b->rules[0].dry_run);
  CHECK(a->rules[0].fingerprint == b->rules[0].fingerprint);
}

TEST_CASE("an unnamed rule's fingerprint follows its position") {
  sluice::Rule unnamed{.selector = {Selector::kIp}, .requests_per = {.s = 1}};
  sluice::Rule other{.selector = {Selector::kRoute}, .requests_per = {.s = 2}};
  auto one = sluice::compile_bundle({.name = "b", .rate_limits = {unnamed}});
  auto two = sluice::compile_bundle({.name = "b", .rate_limits = {other, unnamed}});
  REQUIRE(one.ok());
  REQUIRE(two.ok());
  CHECK(one->rules[0].fingerprint != two->rules[1].fingerprint);
}

TEST_CASE("a legacy window change changes the legacy fingerprint") {
  auto a = only_rule({.name = "login", .rate_limit = sluice::LegacyRateLimit{5, 60}});
  auto b = only_rule({.name = "login", .rate_limit = sluice::LegacyRateLimit{5, 61}});
  auto c = only_rule({.name = "login", .rate_limit = sluice::LegacyRateLimit{6, 60}});
  CHECK(a.fingerprint != b.fingerprint);
  CHECK(a.fingerprint != c.fingerprint);
  CHECK(a.identity == b.identity);  // the same rule with other limits
  CHECK(a.identity == c.identity);
}

TEST_CASE("names cannot be spliced to forge another rule's fingerprint") {
  // ("a;rule=name:1:b", unnamed) and ("a", "b") must differ even though their text overlaps.
  auto spliced =
      only_rule({.name = "a;rule=name:1:b",
                 .rate_limits = {{.selector = {Selector::kIp}, .requests_per = {.s = 1}}}});
  auto plain = only_rule(
      {.name = "a",
       .rate_limits = {{.name = "b", .selector = {Selector::kIp}, .requests_per = {.s = 1}}}});
  CHECK(spliced.fingerprint != plain.fingerprint);
}

TEST_CASE("compile_bundle reports problems under the path it is given") {
  sluice::Bundle bundle = public_api_limits();
  bundle.rate_limits[1].requests_per.minute = 0;
  CHECK(sluice::compile_bundle(bundle).status() ==
        absl::InvalidArgumentError("bundle.rate_limits[1].requests_per.minute must be > 0"));
  CHECK(sluice::compile_bundle(bundle, "policies[4]").status().message() ==
        "policies[4].rate_limits[1].requests_per.minute must be > 0");
}

TEST_CASE("compile_policies compiles every bundle in declaration order") {
  auto compiled = sluice::compile_policies(valid_config());
  REQUIRE(compiled.ok());
  REQUIRE(compiled->size() == 3);
  CHECK((*compiled)[0].name == "public-api-limits");
  CHECK((*compiled)[0].rules.size() == 2);
  CHECK((*compiled)[1].rules[0].windows == std::vector<sluice::GcraWindow>{{5, 60s, 5}});
  CHECK((*compiled)[2].dry_run);
  CHECK((*compiled)[2].rules[0].windows == std::vector<sluice::GcraWindow>{{1000, 3600s, 1000}});
}

TEST_CASE("the largest supported values compile") {
  sluice::CompiledRule rule =
      only_rule({.name = "max",
                 .rate_limits = {{.selector = {Selector::kIp},
                                  .requests_per = {.s = sluice::kMaxRequestsPerWindow},
                                  .burst = sluice::max_burst(sluice::kMaxRequestsPerWindow, 1)}}});
  CHECK(rule.windows[0].burst == sluice::kMaxBurst);  // what the GCRA limiter supports
  sluice::CompiledRule legacy =
      only_rule({.name = "year",
                 .rate_limit = sluice::LegacyRateLimit{sluice::kMaxRequestsPerWindow,
                                                       sluice::kMaxWindowSeconds}});
  CHECK(legacy.windows[0].period == 31'536'000s);
}

TEST_CASE("selectors and modes round-trip through their config spelling") {
  for (Selector s : {Selector::kIp, Selector::kCredential, Selector::kRoute}) {
    CHECK(sluice::parse_selector(sluice::to_string(s)) == s);
  }
  CHECK(sluice::to_string(Selector::kCredential) == "credential");
  CHECK_FALSE(sluice::parse_selector("IP").has_value());
  CHECK(sluice::parse_consumption_mode("every_rule") == sluice::ConsumptionMode::kEveryRule);
  CHECK(sluice::parse_consumption_mode("all_or_nothing") == sluice::ConsumptionMode::kAllOrNothing);
  CHECK_FALSE(sluice::parse_consumption_mode("all").has_value());
  CHECK(sluice::parse_failure_mode("fail_closed") == sluice::FailureMode::kFailClosed);
  CHECK(sluice::to_string(sluice::FailureMode::kFailOpen) == "fail_open");
  CHECK_FALSE(sluice::parse_failure_mode("open").has_value());
  CHECK(sluice::parse_failure_mode("local") == sluice::FailureMode::kLocal);
  CHECK(sluice::to_string(sluice::FailureMode::kLocal) == "local");
}

TEST_CASE("the local failure mode needs a share and bounds it and its retry interval") {
  check_invalid_cases({
      {[](auto& c) { c.engine.on_backend_error = sluice::FailureMode::kLocal; },
       "engine.local_share_permille must be set when engine.on_backend_error is local (the "
       "permille of every limit each replica enforces alone, e.g. 1000 / replicas)"},
      {[](auto& c) {
         c.engine.on_backend_error = sluice::FailureMode::kLocal;
         c.engine.local_share_permille = 0;
       },
       "engine.local_share_permille must be in [1, 1000], got 0"},
      {[](auto& c) { c.engine.local_share_permille = 1001; },
       "engine.local_share_permille must be in [1, 1000], got 1001"},
      {[](auto& c) { c.engine.local_retry_interval_ms = 0; },
       "engine.local_retry_interval_ms must be in [1, 3600000], got 0"},
      {[](auto& c) { c.engine.local_retry_interval_ms = 3'600'001; },
       "engine.local_retry_interval_ms must be in [1, 3600000], got 3600001"},
  });
}

TEST_CASE("the local failure mode is valid with a share at either end of its range") {
  sluice::PolicyConfig config;
  config.engine = {.on_backend_error = sluice::FailureMode::kLocal,
                   .local_share_permille = 1,
                   .local_retry_interval_ms = 3'600'000};
  CHECK(sluice::validate(config).ok());
  config.engine.local_share_permille = 1000;
  config.engine.local_retry_interval_ms = 1;
  CHECK(sluice::validate(config).ok());
  // A share set under another mode is kept for a later switch to local, and still range-checked.
  config.engine.on_backend_error = sluice::FailureMode::kFailClosed;
  CHECK(sluice::validate(config).ok());
}

// --- CredentialResolver: API keys from the service's own store, behind a bounded cache --------

namespace {

// A store of API keys that counts how often it is asked: "key-1" ... belong to "customer".
struct CountingStore {
  std::shared_ptr<int> asked = std::make_shared<int>(0);
  absl::StatusOr<std::optional<std::string>> operator()(std::string_view key) const {
    ++*asked;
    if (key == "store-down") return absl::UnavailableError("store down");
    if (key.starts_with("key-")) return std::optional<std::string>("customer");
    return std::optional<std::string>();
  }
};

sluice::CredentialResolver<sluice::ManualClock> make_resolver(
    const CountingStore& store, sluice::ManualClock clock,
    sluice::CredentialCacheOptions options = {
        .max_entries = 64, .known_ttl = 60s, .unknown_ttl = 10s}) {
  auto resolver = sluice::CredentialResolver<sluice::ManualClock>::create(store, options, clock);
  REQUIRE(resolver.ok());
  return *std::move(resolver);
}

}  // namespace

TEST_CASE("a resolver asks the store once per key while the answer is fresh, then again") {
  sluice::ManualClock clock;
  const CountingStore store;
  const auto resolver = make_resolver(store, clock);
  CHECK(*resolver.resolve("key-1") == std::optional<std::string>("customer"));
  CHECK(*resolver.resolve("key-1") == std::optional<std::string>("customer"));
  CHECK(*store.asked == 1);
  clock.advance(60s - 1ns);
  CHECK(*resolver.resolve("key-1") == std::optional<std::string>("customer"));
  CHECK(*store.asked == 1);
  clock.advance(1ns);  // known_ttl has passed
  CHECK(*resolver.resolve("key-1") == std::optional<std::string>("customer"));
  CHECK(*store.asked == 2);
}

TEST_CASE("a resolver caches an unknown key for unknown_ttl, and never caches an error") {
  sluice::ManualClock clock;
  const CountingStore store;
  const auto resolver = make_resolver(store, clock);
  CHECK(*resolver.resolve("forged") == std::nullopt);
  CHECK(*resolver.resolve("forged") == std::nullopt);
  CHECK(*store.asked == 1);
  clock.advance(10s);
  CHECK(*resolver.resolve("forged") == std::nullopt);
  CHECK(*store.asked == 2);

  CHECK(resolver.resolve("store-down").status().code() == absl::StatusCode::kUnavailable);
  CHECK(resolver.resolve("store-down").status().code() == absl::StatusCode::kUnavailable);
  CHECK(*store.asked == 4);
  CHECK(resolver.size() == 1);  // "forged" only
}

TEST_CASE("a resolver never asks the store about an empty or oversized key") {
  sluice::ManualClock clock;
  const CountingStore store;
  const auto resolver = make_resolver(store, clock);
  CHECK(*resolver.resolve("") == std::nullopt);
  const std::string huge = "key-" + std::string(sluice::kMaxCredentialBytes, 'x');
  CHECK(*resolver.resolve(huge) == std::nullopt);
  CHECK(*store.asked == 0);
  CHECK(resolver.size() == 0);
}

TEST_CASE("a client spraying random keys cannot grow the cache beyond max_entries") {
  sluice::ManualClock clock;
  const CountingStore store;
  const auto resolver = make_resolver(store, clock);
  CHECK(*resolver.resolve("key-1") == std::optional<std::string>("customer"));
  for (int i = 0; i < 10'000; ++i) {
    CHECK(*resolver.resolve(absl::StrCat("random-", i * 7919)) == std::nullopt);
    REQUIRE(resolver.size() <= 64);
  }
  CHECK(resolver.size() == 64);  // 16 shards × 4 entries, all full
  CHECK(*store.asked == 10'001);
  // The least recently used went first: the early random keys are asked again.
  CHECK(*resolver.resolve("random-0") == std::nullopt);
  CHECK(*store.asked == 10'002);
}

TEST_CASE("a resolver shared by threads answers each key right and stays within its bound") {
  sluice::ManualClock clock;
  std::atomic<int> wrong{0};
  const auto resolver = sluice::CredentialResolver<sluice::ManualClock>::create(
      [](std::string_view key) -> absl::StatusOr<std::optional<std::string>> {
        if (key.starts_with("key-")) return std::optional<std::string>("customer");
        return std::optional<std::string>();
      },
      {.max_entries = 32, .known_ttl = 60s, .unknown_ttl = 60s}, clock);
  REQUIRE(resolver.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2'000; ++i) {
        const bool owned = (i + t) % 2 == 0;
        const std::string key = absl::StrCat(owned ? "key-" : "random-", i % 97);
        const auto answer = resolver->resolve(key);
        if (!answer.ok() || answer->has_value() != owned) wrong.fetch_add(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(wrong.load() == 0);
  CHECK(resolver->size() <= 32);
}

TEST_CASE("made-up keys never push a known key out of a resolver's cache") {
  sluice::ManualClock clock;
  int lookups = 0;
  auto resolver = sluice::CredentialResolver<sluice::ManualClock>::create(
      [&lookups](std::string_view key) -> absl::StatusOr<std::optional<std::string>> {
        ++lookups;
        if (key == "k1") return std::optional<std::string>("customer");
        return std::optional<std::string>();
      },
      {.max_entries = 1, .known_ttl = 5min, .unknown_ttl = 30s}, clock);
  REQUIRE(resolver.ok());
  REQUIRE(resolver->resolve("k1").value() == "customer");
  for (int i = 0; i < 100; ++i) {
    CHECK_FALSE(resolver->resolve(absl::StrCat("rnd", i)).value().has_value());
  }
  CHECK(lookups == 101);
  CHECK(resolver->resolve("k1").value() == "customer");
  CHECK(lookups == 101);  // still cached
  CHECK(resolver->size() == 1);
}

TEST_CASE("a resolver refuses options that cannot work") {
  const CountingStore store;
  using Resolver = sluice::CredentialResolver<sluice::ManualClock>;
  CHECK(Resolver::create({}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Resolver::create(store, {.max_entries = 0}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Resolver::create(store, {.known_ttl = 0s}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Resolver::create(store, {.unknown_ttl = -1s}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Resolver::create(store, {.max_entries = 3}).ok());  // fewer entries than shards
}

TEST_CASE("a resolver with fewer entries than shards keeps at most max_entries") {
  sluice::ManualClock clock;
  const CountingStore store;
  const auto resolver =
      make_resolver(store, clock, {.max_entries = 3, .known_ttl = 60s, .unknown_ttl = 60s});
  for (int i = 0; i < 100; ++i) (void)resolver.resolve(absl::StrCat("key-", i));
  CHECK(resolver.size() <= 3);
  resolver.clear();
  CHECK(resolver.size() == 0);
}

TEST_CASE("trust_credential_as gives every presented value the one consumer") {
  const sluice::ConsumerLookup trusted = sluice::trust_credential_as("partner");
  CHECK(*trusted("anything") == std::optional<std::string>("partner"));
  CHECK(*trusted("") == std::nullopt);
}
