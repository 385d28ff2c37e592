#include "sluice/yaml.hpp"

#include <cstddef>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>

#include "catch.hpp"
#include "engine_fixture.hpp"

using sluice::Selector;

namespace {

// The message of the error that loading `text` reports ("" if it loads).
std::string error_of(std::string_view text) {
  absl::StatusOr<sluice::PolicyConfig> config = sluice::yaml::load_config(text);
  if (config.ok()) return "";
  CHECK(config.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

// The examples/gateway/gateway.yaml config, written out as structs.
sluice::PolicyConfig gateway_example() {
  return sluice::PolicyConfig{
      .policies = {{.name = "global-per-ip",
                    .rate_limits = {{.name = "per-ip",
                                     .selector = {Selector::kIp},
                                     .requests_per = {.s = 20, .minute = 600},
                                     .burst = 40}}},
                   {.name = "listener-flood",
                    .rate_limits = {{.name = "per-ip-route",
                                     .selector = {Selector::kIp, Selector::kRoute},
                                     .requests_per = {.minute = 300}}}},
                   {.name = "catalog-capacity",
                    .rate_limits = {{.name = "per-route",
                                     .selector = {Selector::kRoute},
                                     .requests_per = {.s = 100}}}},
                   {.name = "items-per-client",
                    .rate_limits = {{.name = "per-credential",
                                     .selector = {Selector::kCredential, Selector::kRoute},
                                     .requests_per = {.minute = 30}}}},
                   {.name = "login-throttle",
                    .rate_limit = sluice::LegacyRateLimit{.requests = 5, .window_seconds = 60}},
                   {.name = "search-shadow",
                    .rate_limits = {{.name = "strict-per-ip",
                                     .selector = {Selector::kIp},
                                     .requests_per = {.minute = 2}}},
                    .dry_run = true},
                   {.name = "partner-tier",
                    .rate_limits = {{.name = "per-credential",
                                     .selector = {Selector::kCredential},
                                     .requests_per = {.minute = 1000, .hour = 20000},
                                     .burst = 100}}},
                   {.name = "trial-tier",
                    .rate_limits = {{.name = "per-credential",
                                     .selector = {Selector::kCredential},
                                     .requests_per = {.minute = 3}}}}},
      .routes = {{.name = "items",
                  .service = "catalog",
                  .path_prefix = "/v1/items",
                  .policies = {"items-per-client"}},
                 {.name = "search",
                  .service = "catalog",
                  .path_prefix = "/v1/search",
                  .policies = {"search-shadow"}},
                 {.name = "login",
                  .service = "auth",
                  .listener = "public",
                  .path_prefix = "/login",
                  .policies = {"login-throttle"}}},
      .services = {{.name = "catalog", .policies = {"catalog-capacity"}}, {.name = "auth"}},
      .listeners = {{.name = "public", .policies = {"listener-flood"}}, {.name = "internal"}},
      .consumers =
          {{.name = "acme", .credentials = {"acme-secret-token"}, .policies = {"partner-tier"}},
           {.name = "trial", .credentials = {"trial-secret-token"}, .policies = {"trial-tier"}}},
      .gateway = {.global_policies = {"global-per-ip"},
                  .exempt_paths = {"/healthz", "/readyz", "/metrics"},
                  .trusted_proxies = {"127.0.0.1/32"}},
      .engine = {.consumption = sluice::ConsumptionMode::kAllOrNothing,
                 .on_backend_error = sluice::FailureMode::kFailOpen},
  };
}

}  // namespace

// --- valid configs
// --------------------------------------------------------------------------------

TEST_CASE("the gateway example loads into the structs it spells out") {
  absl::StatusOr<sluice::PolicyConfig> config =
      sluice::yaml::load_config_file(SLUICE_GATEWAY_EXAMPLE_YAML);
  REQUIRE(config.status().ToString() == "OK");
  CHECK(*config == gateway_example());
}

TEST_CASE("the documented policies example loads with defaults for everything omitted") {
  auto config = sluice::yaml::load_config(R"(policies:
  - name: public-api-limits
    rate_limits:
      - name: per-ip
        selector: [ip]
        requests_per: { s: 10, minute: 600 }
        burst: 20
      - selector: [route, ip]
        requests_per: { minute: 2000 }
routes:
  - name: public
    service: api-svc
    path_prefix: /v1
    policies: [public-api-limits]
services:
  - name: api-svc
)");
  REQUIRE(config.ok());
  CHECK(*config == sluice::PolicyConfig{
                       .policies = {{.name = "public-api-limits",
                                     .rate_limits = {{.name = "per-ip",
                                                      .selector = {Selector::kIp},
                                                      .requests_per = {.s = 10, .minute = 600},
                                                      .burst = 20},
                                                     {.selector = {Selector::kRoute, Selector::kIp},
                                                      .requests_per = {.minute = 2000}}}}},
                       .routes = {{.name = "public",
                                   .service = "api-svc",
                                   .path_prefix = "/v1",
                                   .policies = {"public-api-limits"}}},
                       .services = {{.name = "api-svc"}},
                   });
}

TEST_CASE("an empty mapping is a valid config that limits nothing") {
  auto config = sluice::yaml::load_config("{}");
  REQUIRE(config.ok());
  CHECK(*config == sluice::PolicyConfig{});
}

TEST_CASE("limits_nothing: true loads as spelled on a config without rules") {
  auto config = sluice::yaml::load_config("limits_nothing: true\nlisteners: [{ name: public }]\n");
  REQUIRE(config.ok());
  CHECK(config->limits_nothing);
}

TEST_CASE("engine modes and an empty exempt list load as spelled") {
  auto config = sluice::yaml::load_config(
      "engine: {consumption: every_rule, on_backend_error: fail_closed}\n"
      "gateway: {exempt_paths: []}\n");
  REQUIRE(config.ok());
  CHECK(config->engine.consumption == sluice::ConsumptionMode::kEveryRule);
  CHECK(config->engine.on_backend_error == sluice::FailureMode::kFailClosed);
  CHECK(config->gateway.exempt_paths.empty());
}

// Behind an upstream that routes without regard to case (Express by default, ASP.NET, IIS),
// `/LOGIN` is served by the login handler. A route matched byte for byte leaves it unrouted, so
// the login throttle never applies to it: a client picks its own bucket by picking a spelling.
TEST_CASE("a route declared case-insensitive throttles every spelling its upstream serves",
          "[attack]") {
  auto config = sluice::yaml::load_config(R"(policies:
  - name: login-throttle
    rate_limit: { requests: 1, window_seconds: 60 }
routes:
  - name: login
    path_prefix: /login
    case_sensitive: false
    policies: [login-throttle]
)");
  REQUIRE(config.status().ToString() == "OK");
  sluice::testing::TestEngine engine = sluice::testing::make_engine(*config);
  int admitted = 0;
  for (std::string_view path : {"/login", "/LOGIN", "/Login/x", "/lOgIn"}) {
    const auto route = engine.match_route("", path);
    REQUIRE(route.has_value());  // the upstream serves every one of them from its login handler
    CHECK(route->route == "login");
    admitted +=
        engine.evaluate({.client_ip = "203.0.113.7", .route = route->route, .path = path}).allowed
            ? 1
            : 0;
  }
  CHECK(admitted == 1);
}

// --- invalid configs: each asserts the exact message
// ----------------------------------------------

TEST_CASE("an unknown top-level key is an error that suggests the key meant") {
  CHECK(error_of("polices:\n  - name: a\n") ==
        "1:1: (root): unknown key \"polices\" (did you mean \"policies\"?)");
}

TEST_CASE("limits_nothing on a config that attaches rules is an error at the flag") {
  CHECK(error_of("limits_nothing: true\n"
                 "policies: [{ name: a, rate_limit: { requests: 5, window_seconds: 60 } }]\n"
                 "gateway: { global_policies: [a] }\n") ==
        "1:17: limits_nothing: is true, but the config enforces 1 rule; remove limits_nothing "
        "(it lets a config without rules replace a running one)");
}

TEST_CASE("an explicit empty path_prefix is an error, in either spelling") {
  const std::string head =
      "policies: [{ name: a, rate_limit: { requests: 5, window_seconds: 60 } }]\nroutes:\n";
  CHECK(error_of(head + "  - { name: login, path_prefix: \"\", policies: [a] }\n") ==
        "3:33: routes[0].path_prefix: must not be empty (it would match no request); omit it for "
        "a route the application names itself");
  CHECK(error_of(head + "  - { name: login, match: { path: { type: prefix, value: '' } }, "
                        "policies: [a] }\n") ==
        "3:58: routes[0].match.path.value: must not be empty (it would match no request); omit "
        "it for a route the application names itself");
}

TEST_CASE("a path_prefix with a query or a fragment is an error, not a route that limits nothing",
          "[attack]") {
  // Routes see the path before '?', and no client sends a fragment: such a prefix matches nothing.
  const std::string head =
      "policies: [{ name: a, rate_limit: { requests: 5, window_seconds: 60 } }]\nroutes:\n";
  CHECK(error_of(head + "  - { name: search, path_prefix: \"/search?q=\", policies: [a] }\n") ==
        "3:34: routes[0].path_prefix: \"/search?q=\" can match no request: a request's path ends "
        "before '?' (the query) and '#' (the fragment), so a prefix holds neither");
  CHECK(error_of(head + "  - { name: docs, match: { path: { type: prefix, value: '/docs#top' } }, "
                        "policies: [a] }\n") ==
        "3:57: routes[0].path_prefix: \"/docs#top\" can match no request: a request's path ends "
        "before '?' (the query) and '#' (the fragment), so a prefix holds neither");
}

TEST_CASE("an exempt path that no request path can equal is an error, not a path left limited",
          "[attack]") {
  // Exempt paths are compared with the normalized path, byte for byte.
  const std::string head = "gateway:\n  exempt_paths: [";
  CHECK(error_of(head + "//healthz]\n") ==
        "2:18: gateway.exempt_paths[0]: \"//healthz\" can match no request: request paths are "
        "normalized before routes are matched (repeated '/' merged, dot segments removed, "
        "unreserved characters, sub-delims but ';', ':' and '@' decoded, other bytes "
        "percent-encoded in upper case); write \"/healthz\"");
  CHECK(error_of(head + "'/healthz?full=1']\n") ==
        "2:18: gateway.exempt_paths[0]: \"/healthz?full=1\" can match no request: a request's "
        "path ends before '?' (the query) and '#' (the fragment), so a path holds neither");
  CHECK(error_of(head + "\"/healthz\\n\"]\n") ==
        "2:18: gateway.exempt_paths[0]: \"/healthz\\x0a\" must contain only printable ASCII "
        "characters (0x20-0x7E)");
}

TEST_CASE("a typo in a rule key is an error rather than a dropped burst") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limits:
      - selector: [ip]
        requests_per: { s: 10 }
        brust: 20
)") == "6:9: policies[0].rate_limits[0]: unknown key \"brust\" (did you mean \"burst\"?)");
}

TEST_CASE("an unknown key far from every known one lists the keys allowed there") {
  CHECK(error_of("routes:\n  - name: r\n    upstream: http://x\n") ==
        "3:5: routes[0]: unknown key \"upstream\" (expected one of name, service, listener, "
        "path_prefix, match, case_sensitive, policies)");
}

TEST_CASE("a scalar where a sequence belongs is a type error") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limits:
      - selector: ip
        requests_per: { s: 10 }
)") == "4:19: policies[0].rate_limits[0].selector: expected a sequence, got a scalar");
}

TEST_CASE("a word where a rate belongs is a type error that quotes it") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limits:
      - selector: [ip]
        requests_per: { s: ten }
)") == "5:28: policies[0].rate_limits[0].requests_per.s: expected a non-negative integer, got "
       "\"ten\"");
}

TEST_CASE("a negative rate is an error") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limits:
      - selector: [ip]
        requests_per: { minute: -5 }
)") == "5:33: policies[0].rate_limits[0].requests_per.minute: expected a non-negative integer, "
       "got \"-5\"");
}

TEST_CASE("a quoted number is a string and not a rate") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limit: { requests: "5", window_seconds: 60 }
)") == "3:29: policies[0].rate_limit.requests: expected a non-negative integer, got the string "
       "\"5\"");
}

TEST_CASE("a rate beyond 64 bits is out of range") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limit: { requests: 18446744073709551616, window_seconds: 60 }
)") == "3:29: policies[0].rate_limit.requests: \"18446744073709551616\" is out of range (at most "
       "18446744073709551615)");
}

TEST_CASE("an empty selector is an error at the selector") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limits:
      - selector: []
        requests_per: { s: 10 }
)") == "4:19: policies[0].rate_limits[0].selector: must not be empty");
}

TEST_CASE("an unknown selector name is an error naming the ones that exist") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limits:
      - selector: [ip, host]
        requests_per: { s: 10 }
)") == "4:24: policies[0].rate_limits[0].selector[1]: unknown selector \"host\" (expected ip, "
       "credential or route)");
}

TEST_CASE("a zero rate is an error at the rate") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limits:
      - selector: [ip]
        requests_per: { s: 10 }
      - selector: [ip]
        requests_per: { s: 0 }
)") == "7:28: policies[0].rate_limits[1].requests_per.s: must be > 0");
}

TEST_CASE("burst 0 is an error at the burst") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limits:
      - selector: [ip]
        requests_per: { s: 10 }
        burst: 0
)") == "6:16: policies[0].rate_limits[0].burst: must be >= 1");
}

TEST_CASE("a rule's algorithm loads, and an unknown one is an error at its value") {
  auto config = sluice::yaml::load_config(R"(policies:
  - name: a
    rate_limits:
      - selector: [ip]
        requests_per: { minute: 10 }
        algorithm: fixed_window
)");
  REQUIRE(config.ok());
  CHECK(config->policies[0].rate_limits[0].algorithm == sluice::Algorithm::kFixedWindow);
  CHECK(error_of(R"(policies:
  - name: a
    rate_limits:
      - selector: [ip]
        requests_per: { minute: 10 }
        algorithm: sliding
)") == "6:20: policies[0].rate_limits[0].algorithm: unknown algorithm \"sliding\" (expected "
       "gcra or fixed_window)");
}

TEST_CASE("a duplicate bundle name is an error at the second name") {
  CHECK(error_of(R"(policies:
  - name: login
    rate_limit: { requests: 5, window_seconds: 60 }
  - name: login
    rate_limit: { requests: 10, window_seconds: 60 }
)") == "4:11: policies[1].name: duplicate bundle name \"login\" (also policies[0])");
}

TEST_CASE("an attachment naming no bundle is an error at the reference") {
  CHECK(error_of(R"(policies:
  - name: login
    rate_limit: { requests: 5, window_seconds: 60 }
routes:
  - name: r
    path_prefix: /login
    policies: [login, logn]
)") == "7:23: routes[0].policies[1]: unknown bundle \"logn\"");
}

TEST_CASE("an unknown consumption mode is an error naming the modes") {
  CHECK(error_of("engine:\n  consumption: all\n") ==
        "2:16: engine.consumption: unknown consumption mode \"all\" (expected all_or_nothing or "
        "every_rule)");
}

TEST_CASE("an unknown failure mode is an error naming the modes") {
  CHECK(error_of("engine: { on_backend_error: open }\n") ==
        "1:29: engine.on_backend_error: unknown failure mode \"open\" (expected fail_open, "
        "fail_closed or local)");
}

TEST_CASE("the local failure mode loads with its share and retry interval") {
  auto config = sluice::yaml::load_config(
      "engine:\n"
      "  on_backend_error: local\n"
      "  local_share_permille: 250\n"
      "  local_retry_interval_ms: 500\n");
  REQUIRE(config.ok());
  CHECK(config->engine == sluice::EngineOptions{.on_backend_error = sluice::FailureMode::kLocal,
                                                .local_share_permille = 250,
                                                .local_retry_interval_ms = 500});
}

TEST_CASE("the local failure mode without a share is an error at the engine") {
  CHECK(error_of("engine:\n  on_backend_error: local\n") ==
        "2:3: engine.local_share_permille: must be set when engine.on_backend_error is local (the "
        "permille of every limit each replica enforces alone, e.g. 1000 / replicas)");
}

TEST_CASE("a local share above 1000 permille is an error at the share") {
  CHECK(error_of("engine: { on_backend_error: local, local_share_permille: 1001 }\n") ==
        "1:58: engine.local_share_permille: must be in [1, 1000], got 1001");
}

TEST_CASE("a local retry interval of 0 ms is an error at the interval") {
  CHECK(error_of("engine:\n  local_retry_interval_ms: 0\n") ==
        "2:28: engine.local_retry_interval_ms: must be in [1, 3600000], got 0");
}

TEST_CASE("a local share that is not an integer is a type error") {
  CHECK(error_of("engine: { local_share_permille: 0.5 }\n") ==
        "1:33: engine.local_share_permille: expected a non-negative integer, got \"0.5\"");
}

TEST_CASE("a key given twice is an error rather than a silent override") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limits:
      - selector: [ip]
        requests_per: { s: 10 }
        burst: 20
        burst: 200
)") == "7:9: policies[0].rate_limits[0]: duplicate key \"burst\"");
}

TEST_CASE("a rule without requests_per is an error at the rule") {
  CHECK(error_of(R"(policies:
  - name: a
    rate_limits:
      - name: per-ip
        selector: [ip]
)") == "4:9: policies[0].rate_limits[0]: missing required key \"requests_per\"");
}

TEST_CASE("a bundle without any limit is an error at the bundle") {
  CHECK(error_of("policies:\n  - name: a\n    dry_run: true\n") ==
        "2:5: policies[0]: must set rate_limits or rate_limit");
}

TEST_CASE("case_sensitive loads as spelled and defaults to true") {
  auto config = sluice::yaml::load_config(
      "routes:\n  - { name: a, path_prefix: /a, case_sensitive: false }\n"
      "  - { name: b, path_prefix: /b, case_sensitive: true }\n  - { name: c, path_prefix: /c }\n");
  REQUIRE(config.status().ToString() == "OK");
  CHECK_FALSE(config->routes[0].case_sensitive);
  CHECK(config->routes[1].case_sensitive);
  CHECK(config->routes[2].case_sensitive);
}

TEST_CASE("case_sensitive takes only true or false") {
  CHECK(error_of("routes:\n  - name: a\n    path_prefix: /a\n    case_sensitive: no\n") ==
        "4:21: routes[0].case_sensitive: expected true or false, got \"no\"");
  CHECK(error_of("routes:\n  - name: a\n    path_prefix: /a\n    case_sensitive: \"false\"\n") ==
        "4:21: routes[0].case_sensitive: expected true or false, got the string \"false\"");
}

TEST_CASE("a case-insensitive route whose prefix another route spells differently is an error") {
  CHECK(error_of(R"(routes:
  - { name: login, path_prefix: /login }
  - { name: shouting, path_prefix: /LOGIN, case_sensitive: false }
)") == "3:36: routes[1].path_prefix: \"/LOGIN\" is already matched by routes[0] on the same "
       "listener (the prefixes differ only in case, and routes[1] sets case_sensitive: false)");
  CHECK(error_of("routes:\n  - { name: r, case_sensitive: false }\n") ==
        "2:32: routes[0].case_sensitive: is false, but the route has no path_prefix to match; "
        "remove case_sensitive or set a path_prefix");
}

TEST_CASE("dry_run takes only true or false") {
  CHECK(error_of("policies:\n  - name: a\n    dry_run: yes\n") ==
        "3:14: policies[0].dry_run: expected true or false, got \"yes\"");
}

TEST_CASE("a legacy window of zero seconds is an error") {
  CHECK(error_of("policies:\n  - name: a\n    rate_limit: { requests: 5, window_seconds: 0 }\n") ==
        "3:48: policies[0].rate_limit.window_seconds: must be > 0");
}

TEST_CASE("a null name is a type error") {
  CHECK(error_of("services:\n  - name:\n") == "2:5: services[0].name: expected a string, got null");
}

TEST_CASE("a match type other than prefix is an error") {
  CHECK(error_of(R"(routes:
  - name: r
    match:
      path: { type: exact, value: /login }
)") == "4:21: routes[0].match.path.type: unknown match type \"exact\" (expected prefix)");
}

TEST_CASE("a route setting both path_prefix and match is an error") {
  CHECK(error_of(R"(routes:
  - name: r
    path_prefix: /a
    match: { path: { type: prefix, value: /b } }
)") == "4:12: routes[0].match: path_prefix and match both set the route's path");
}

TEST_CASE("a path prefix given by match is validated at its value") {
  CHECK(error_of(R"(routes:
  - name: r
    match: { path: { type: prefix, value: login } }
)") == "3:43: routes[0].path_prefix: \"login\" must start with '/' and contain only printable "
       "ASCII characters");
}

TEST_CASE("malformed YAML is a syntax error at its line and column") {
  CHECK(error_of("policies:\n  - name: a\n    rate_limits: [\n") ==
        "4:1: invalid YAML: end of sequence flow not found");
}

TEST_CASE("a second YAML document is an error rather than ignored") {
  CHECK(error_of("engine: {}\n---\npolicies: []\n") ==
        "2:1: (root): expected one YAML document, got another one here");
}

TEST_CASE("a stray comma is a syntax error and not a parser stuck in a loop") {
  CHECK(error_of(",") == "1:1: invalid YAML: unexpected character \",\"");
  CHECK(error_of("engine: {}\n...\n,\n") == "3:1: invalid YAML: unexpected character \",\"");
}

TEST_CASE("an empty document is an error") {
  CHECK(error_of("# nothing here\n") == "1:1: (root): expected a mapping, got an empty document");
}

TEST_CASE("a sequence at the top is a type error") {
  CHECK(error_of("- policies\n") == "1:1: (root): expected a mapping, got a sequence");
}

TEST_CASE("a credential of the wrong type is reported without echoing it") {
  CHECK(error_of("consumers:\n  - name: c\n    credentials: s3cret-token\n") ==
        "3:18: consumers[0].credentials: expected a sequence, got a scalar");
}

TEST_CASE("a duplicate credential is reported without echoing it") {
  CHECK(
      error_of("consumers:\n  - {name: a, credentials: [tok]}\n  - {name: b, credentials: "
               "[tok]}\n") ==
      "3:29: consumers[1].credentials[0]: duplicate credential (also consumers[0].credentials[0])");
}

// --- untrusted input
// ------------------------------------------------------------------------------

TEST_CASE("a config over the size limit is rejected before parsing") {
  std::string text(sluice::yaml::kMaxConfigBytes + 1, ' ');
  CHECK(error_of(text) ==
        "1:1: (root): the config is 2097153 bytes, more than the 2097152 supported");
}

TEST_CASE("an alias bomb is stopped by the node budget") {
  std::string text =
      "policies:\n  - name: a\n    rate_limits:\n      - &r {requests_per: {s: 1}, "
      "selector: [";
  for (int i = 0; i < 2000; ++i) text += "ip, ";
  text += "ip]}\n";
  for (int i = 0; i < 1000; ++i) text += "      - *r\n";
  const std::string message = error_of(text);
  CHECK(message.find(": the config has more than 250000 nodes (each use of an alias counts)") !=
        std::string::npos);
}

TEST_CASE("an alias that repeats a long scalar is stopped by the text budget", "[attack]") {
  // Five uses of a 1 MiB credential read 5 MiB from a config of 1 MiB: a few hundred thousand
  // uses (within the node budget, in a config under 2 MiB) would copy hundreds of GB.
  const std::string text = "consumers:\n  - name: c\n    credentials: [&t " +
                           std::string(std::size_t{1} << 20, 'x') + ", *t, *t, *t, *t]\n";
  // The fourth use passes 4 MiB; an alias has the position of the scalar it repeats.
  CHECK(error_of(text) ==
        "3:19: consumers[0].credentials[3]: the config's scalars hold more than 4194304 bytes "
        "(each use of an alias counts)");
}

TEST_CASE("a config of more nodes than the budget is refused before they are built", "[attack]") {
  // 2 MiB of one-letter list items would make about a million yaml-cpp nodes (some 500 MB)
  // before the reader counted its first one.
  std::string text = "policies: [";
  for (std::size_t i = 0; i < sluice::yaml::kMaxConfigNodes; ++i) text += "a,";
  text += "a]\n";
  // Node 250001 (the map, its key and the sequence come first) is item 249997, at column 500006.
  CHECK(error_of(text) ==
        "1:500006: (root): the config has more than 250000 nodes (each use of an alias counts)");
}

TEST_CASE("nesting deeper than the documented limit is an error that names the limit") {
  const std::string flow = "policies: " + std::string(100000, '[') + std::string(100000, ']');
  CHECK(error_of(flow) == "1:74: (root): the config nests deeper than 64 levels");
  std::string block = "policies:\n";
  for (int i = 1; i <= 100; ++i) block += std::string(static_cast<std::size_t>(i), ' ') + "- \n";
  CHECK(error_of(block) == "64:64: (root): the config nests deeper than 64 levels");
  // Within the limit, nesting is yaml-cpp's and the schema's business, not a nesting error.
  const std::string shallow = "policies: " + std::string(60, '[') + std::string(60, ']');
  CHECK(error_of(shallow).find("nests deeper") == std::string::npos);
}

TEST_CASE("nesting that the text check cannot see is stopped as the parser descends", "[attack]") {
  // A quote inside a plain scalar is no quote, and a `[` inside one opens nothing; the text
  // check took the first to hide the rest of the line and the second to end block indentation.
  const std::string flow =
      "policies: [a'b, " + std::string(100000, '[') + std::string(100000, ']') + "]";
  CHECK(error_of(flow) == "1:79: (root): the config nests deeper than 64 levels");
  std::string block = "limits_nothing: x[\n";
  for (std::size_t i = 0; i < 1000; ++i) block += std::string(i, ' ') + "a:\n";
  CHECK(error_of(block) == "66:65: (root): the config nests deeper than 64 levels");
}

// --- files
// ----------------------------------------------------------------------------------------

TEST_CASE("a file error names the file before the line and column") {
  const std::string path = "yaml_test_bad_config.yaml";
  {
    std::ofstream out(path);
    out << "engine:\n  consumption: all\n";
  }
  auto config = sluice::yaml::load_config_file(path);
  std::remove(path.c_str());
  CHECK(config.status().message() ==
        "yaml_test_bad_config.yaml:2:16: engine.consumption: unknown consumption mode \"all\" "
        "(expected all_or_nothing or every_rule)");
}

TEST_CASE("[attack] a content error quotes a file name with control bytes") {
  // The reloading holder logs these messages: a file named by whoever controls the config
  // directory must not write raw control bytes (a terminal escape, a forged log line) into it.
  const std::string path = "yaml_test_\x1b[2J\nforged.yaml";
  {
    std::ofstream out(path);
    out << "engine:\n  consumption: all\n";
  }
  auto config = sluice::yaml::load_config_file(path);
  std::remove(path.c_str());
  CHECK(config.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(config.status().message())
            .starts_with("\"yaml_test_\\x1b[2J\\x0aforged.yaml\":2:16: engine.consumption: "));
}

TEST_CASE("a missing file is NotFound naming the file") {
  auto config = sluice::yaml::load_config_file("no/such/config.yaml");
  CHECK(config.status().code() == absl::StatusCode::kNotFound);
  CHECK(config.status().message() ==
        "no/such/config.yaml: cannot open the config file: No such file or directory");
}

TEST_CASE("a file over the size limit is rejected without reading all of it") {
  const std::string path = "yaml_test_big_config.yaml";
  {
    std::ofstream out(path);
    out << std::string(sluice::yaml::kMaxConfigBytes + 100000, '#');
  }
  auto config = sluice::yaml::load_config_file(path);
  std::remove(path.c_str());
  CHECK(config.status().message() ==
        "yaml_test_big_config.yaml:1:1: (root): the config is more than 2097152 bytes");
}

TEST_CASE("address prefixes and trusted proxies load per gateway and per rule") {
  auto config = sluice::yaml::load_config(R"(
policies:
  - name: p
    rate_limits:
      - selector: [ip]
        requests_per: { minute: 5 }
        address_prefixes: { ipv4: 24, ipv6: 48 }
gateway:
  global_policies: [p]
  address_prefixes: { ipv6: 56 }
  trusted_proxies: [10.0.0.0/8, "2001:db8::/32"]
)");
  REQUIRE(config.ok());
  CHECK(config->policies[0].rate_limits[0].address_prefixes ==
        sluice::AddressPrefixes{.ipv4 = 24, .ipv6 = 48});
  CHECK(config->gateway.address_prefixes == sluice::AddressPrefixes{.ipv4 = 32, .ipv6 = 56});
  CHECK(config->gateway.trusted_proxies == std::vector<std::string>{"10.0.0.0/8", "2001:db8::/32"});
}

TEST_CASE("IPv4 translation prefixes load per gateway and a bad one is named") {
  auto config = sluice::yaml::load_config(
      "gateway:\n  ipv4_translation_prefixes: [\"2001:db8:46::/96\", \"2001:db8:100::/40\"]\n");
  REQUIRE(config.ok());
  CHECK(config->gateway.ipv4_translation_prefixes ==
        std::vector<std::string>{"2001:db8:46::/96", "2001:db8:100::/40"});
  CHECK(error_of("gateway:\n  ipv4_translation_prefixes: [10.0.0.0/8]\n")
            .starts_with("2:31: gateway.ipv4_translation_prefixes[0]: translation prefix "
                         "\"10.0.0.0/8\": must be an IPv6 prefix of 32, 40, 48, 56, 64 or 96 "
                         "bits"));
}

TEST_CASE("a bad prefix or proxy network is reported at its line and path") {
  CHECK(error_of("gateway:\n  address_prefixes: { ipv4: 40 }\n") ==
        "2:29: gateway.address_prefixes.ipv4: must be in [0, 32], got 40");
  CHECK(error_of("gateway:\n  trusted_proxies: [10.0.0.1/8]\n")
            .starts_with("2:21: gateway.trusted_proxies[0]: "));
}

TEST_CASE("an adaptive block loads with defaults for everything but the target latency") {
  auto config = sluice::yaml::load_config(R"(
policies:
  - name: p
    rate_limits:
      - selector: [ip]
        requests_per: { minute: 60 }
        adaptive: { target_latency_ms: 250, decrease_permille: 700, max_hold_seconds: 30 }
)");
  REQUIRE(config.ok());
  using namespace std::chrono_literals;
  CHECK(config->policies[0].rate_limits[0].adaptive ==
        sluice::AdaptivePolicy{.target_latency = 250ms, .decrease_permille = 700, .max_hold = 30s});
}

TEST_CASE("an adaptive block sets its minimum samples and clients and its Retry-After cap") {
  auto config = sluice::yaml::load_config(R"(
policies:
  - name: p
    rate_limits:
      - selector: [ip]
        requests_per: { minute: 60 }
        adaptive:
          target_latency_ms: 250
          min_samples: 20
          min_clients: 4
          max_retry_after_seconds: 10
)");
  REQUIRE(config.ok());
  using namespace std::chrono_literals;
  CHECK(config->policies[0].rate_limits[0].adaptive ==
        sluice::AdaptivePolicy{
            .target_latency = 250ms, .min_samples = 20, .min_clients = 4, .max_retry_after = 10s});
  CHECK(error_of(R"(policies:
  - name: p
    rate_limits:
      - selector: [ip]
        requests_per: { minute: 60 }
        adaptive: { target_latency_ms: 100, min_clients: 9 }
)") == "6:58: policies[0].rate_limits[0].adaptive.min_clients: must be 1 ... 8");
}

TEST_CASE("an adaptive block without a target latency is an error at the block") {
  CHECK(error_of(R"(policies:
  - name: p
    rate_limits:
      - selector: [ip]
        requests_per: { minute: 60 }
        adaptive: { interval_ms: 500 }
)") == "6:19: policies[0].rate_limits[0].adaptive: missing required key \"target_latency_ms\"");
}

TEST_CASE("an adaptive value out of range is reported at its line") {
  CHECK(error_of(R"(policies:
  - name: p
    rate_limits:
      - selector: [ip]
        requests_per: { minute: 60 }
        adaptive:
          target_latency_ms: 99999999999999999
)") == "7:30: policies[0].rate_limits[0].adaptive.target_latency: must be more than 0 and at "
       "most 24 hours");
  CHECK(error_of(R"(policies:
  - name: p
    rate_limits:
      - selector: [ip]
        requests_per: { minute: 60 }
        adaptive: { target_latency_ms: 100, minimum_factor_permille: 5000000000 }
)") == "6:70: policies[0].rate_limits[0].adaptive.minimum_factor_permille: must be 1 ... 1000");
}

TEST_CASE("an adaptive hold in seconds past any range is an error, not a wrapped short hold",
          "[attack]") {
  // 571849066285 s is 571849066285 * 10^9 ns, which wraps int64 to 3899904 ns (3.9 ms).
  const std::string rule =
      "policies:\n  - name: p\n    rate_limits:\n      - selector: [ip]\n"
      "        requests_per: { minute: 60 }\n        adaptive: { target_latency_ms: 100, ";
  CHECK(error_of(rule + "max_hold_seconds: 571849066285 }\n") ==
        "6:63: policies[0].rate_limits[0].adaptive.max_hold: must be 0 ... 24 hours");
  CHECK(error_of(rule + "max_retry_after_seconds: 571849066285 }\n") ==
        "6:70: policies[0].rate_limits[0].adaptive.max_retry_after: must be 0 ... 24 hours");
}

TEST_CASE("a backend section loads as spelled") {
  const absl::StatusOr<sluice::PolicyConfig> config = sluice::yaml::load_config(R"(
limits_nothing: true
backend:
  type: redis
  unix_socket: /run/redis.sock
  key_prefix: "rl:api:"
  key_seed: 42
  command_timeout_ms: 50
engine: { on_backend_error: fail_closed }
)");
  REQUIRE(config.ok());
  CHECK(config->backend == sluice::BackendConfig{.type = sluice::BackendKind::kRedis,
                                                 .unix_socket = "/run/redis.sock",
                                                 .key_prefix = "rl:api:",
                                                 .key_seed = 42,
                                                 .command_timeout_ms = 50});
  CHECK(config->engine.on_backend_error == sluice::FailureMode::kFailClosed);
}

TEST_CASE("an unknown backend type is an error naming the types there are") {
  CHECK(error_of("limits_nothing: true\nbackend: { type: memcached }\n") ==
        "2:18: backend.type: unknown backend type \"memcached\" (expected memory, redis, "
        "redis_cluster or postgres)");
}

TEST_CASE("a backend member its type does not read is an error at the member") {
  CHECK(error_of("limits_nothing: true\nbackend:\n  type: postgres\n  conninfo: dbname=app\n"
                 "  key_prefix: x\n") ==
        "5:15: backend.key_prefix: is not read by type postgres; remove it");
}
