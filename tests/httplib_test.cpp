#include "sluice/httplib.hpp"

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "engine_fixture.hpp"
#include "example_config.hpp"
#include "sluice/clock.hpp"
#include "sluice/credential_resolver.hpp"
#ifdef SLUICE_TEST_YAML
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "names_config.hpp"
#include "sluice/yaml/reloading_engine.hpp"
#endif

using namespace std::chrono_literals;
using Engine = sluice::testing::TestEngine;
using Limiter = sluice::HttplibLimiter<Engine>;
using sluice::Selector;
using sluice::testing::kWall;
using sluice::testing::rule;

namespace {

// Route `items` (/v1/items): 2 per minute per client address, and 2 per minute per consumer
// credential; consumer `acme` authenticates with token "acme-token".
sluice::PolicyConfig items_config() {
  return {
      .policies = {{.name = "items-per-ip",
                    .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 2})}},
                   {.name = "acme-tier",
                    .rate_limits = {rule("per-credential", {Selector::kCredential},
                                         {.minute = 2})}}},
      .routes = {{.name = "items", .path_prefix = "/v1/items", .policies = {"items-per-ip"}}},
      .consumers = {{.name = "acme", .credentials = {"acme-token"}, .policies = {"acme-tier"}}}};
}

// items_config() behind the proxies `trusted` (gateway.trusted_proxies).
sluice::PolicyConfig items_behind(std::vector<std::string> trusted) {
  sluice::PolicyConfig config = items_config();
  config.gateway.trusted_proxies = std::move(trusted);
  return config;
}

// The headers nginx at 127.0.0.1 adds for a client at `client` (proxy_add_x_forwarded_for, and
// the RFC 7239 form some setups add as well).
httplib::Headers forwarded_for(const std::string& client) {
  return {{"X-Forwarded-For", client}, {"Forwarded", "for=" + client}};
}

std::shared_ptr<const Engine> make_engine(const sluice::PolicyConfig& config,
                                          sluice::ManualClock clock) {
  auto engine = Engine::create(config, {.store = {.seed = 1}, .clock = clock});
  REQUIRE(engine.ok());
  return std::make_shared<const Engine>(*std::move(engine));
}

Limiter::Options options_with() {
  return {.wall_clock = [] { return kWall; }};
}

// An httplib::Server with `limiter` installed and one handler (GET /v1/items and /healthz answer
// "ok"), serving on 127.0.0.1 at a free port from a background thread; stopped on destruction.
class TestServer {
 public:
  explicit TestServer(const Limiter& limiter)
      : TestServer([&limiter](httplib::Server& server) { limiter.install(server); }) {}
  // A server that `install` sets up.
  explicit TestServer(const std::function<void(httplib::Server&)>& install) {
    install(server_);
    server_.Get("/v1/items", [](const httplib::Request&, httplib::Response& response) {
      response.set_content("ok", "text/plain");
    });
    server_.Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
      response.set_content("ok", "text/plain");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    REQUIRE(port_ > 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 1000 && !server_.is_running(); ++i) {
      std::this_thread::sleep_for(5ms);  // waits for the listener, not for a rate
    }
    REQUIRE(server_.is_running());
  }
  ~TestServer() {
    server_.stop();
    thread_.join();
  }
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;

  // GET `path`, sent byte for byte, with `headers`; the response (a failed request fails the
  // test).
  httplib::Response get(const std::string& path, const httplib::Headers& headers = {}) const {
    httplib::Client client("127.0.0.1", port_);
    client.set_url_encode(false);  // cpp-httplib would send ';' as %3B
    client.set_connection_timeout(5s);
    client.set_read_timeout(5s);
    httplib::Result result = client.Get(path.c_str(), headers);
    REQUIRE(result);
    return result.value();
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

std::string header(const httplib::Response& response, const char* name) {
  return response.has_header(name) ? response.get_header_value(name) : "<absent>";
}

}  // namespace

TEST_CASE(
    "an admitted request carries the fields; the one over the limit gets 429, Retry-After "
    "and a JSON body") {
  sluice::ManualClock clock;
  const TestServer server(Limiter(make_engine(items_config(), clock), options_with()));

  const httplib::Response first = server.get("/v1/items");
  CHECK(first.status == 200);
  CHECK(first.body == "ok");
  CHECK(header(first, "X-RateLimit-Limit") == "2");
  CHECK(header(first, "X-RateLimit-Remaining") == "1");
  CHECK(header(first, "X-RateLimit-Reset") == "1700000030");
  CHECK(header(first, "Retry-After") == "<absent>");
  CHECK(header(first, "RateLimit-Policy") == R"("items-per-ip/per-ip/minute";q=2;w=60)");
  CHECK(server.get("/v1/items").status == 200);

  const httplib::Response denied = server.get("/v1/items");
  CHECK(denied.status == 429);
  CHECK(header(denied, "Retry-After") == "30");
  CHECK(header(denied, "X-RateLimit-Remaining") == "0");
  CHECK(header(denied, "X-RateLimit-Reset") == "1700000060");
  CHECK(header(denied, "RateLimit") == R"("items-per-ip/per-ip/minute";r=0;t=30)");
  CHECK(header(denied, "Content-Type") == "application/json");
  CHECK(denied.body == "{\"error\":\"rate limited\",\"retry_after_seconds\":30}\n");

  clock.advance(30s);
  CHECK(server.get("/v1/items").status == 200);
}

TEST_CASE("an exempt path is routed by the server and gets no fields") {
  sluice::ManualClock clock;
  const TestServer server(Limiter(make_engine(items_config(), clock), options_with()));
  for (int i = 0; i < 5; ++i) {
    const httplib::Response health = server.get("/healthz");
    CHECK(health.status == 200);
    CHECK(health.body == "ok");
    CHECK(header(health, "X-RateLimit-Limit") == "<absent>");
  }
}

TEST_CASE("an X-Forwarded-For written by an untrusted peer does not pick the bucket") {
  sluice::ManualClock clock;
  // 127.0.0.1, where the requests come from, is not a trusted proxy.
  const TestServer server(
      Limiter(make_engine(items_behind({"10.0.0.0/8"}), clock), options_with()));
  CHECK(server.get("/v1/items", {{"X-Forwarded-For", "198.51.100.1"}}).status == 200);
  CHECK(server.get("/v1/items", {{"Forwarded", "for=198.51.100.2"}}).status == 200);
  const httplib::Response third = server.get(
      "/v1/items", {{"X-Forwarded-For", "198.51.100.3"}, {"Forwarded", "for=192.0.2.9"}});
  CHECK(third.status == 429);  // all three are the peer, 127.0.0.1
}

TEST_CASE("behind a trusted proxy the client is the rightmost untrusted X-Forwarded-For entry") {
  sluice::ManualClock clock;
  const TestServer server(
      Limiter(make_engine(items_behind({"127.0.0.1/32"}), clock), options_with()));
  // The client writes a fresh fake entry each time; its proxy appended its real address.
  CHECK(server.get("/v1/items", {{"X-Forwarded-For", "10.0.0.1, 198.51.100.7"}}).status == 200);
  CHECK(server.get("/v1/items", {{"X-Forwarded-For", "10.0.0.2, 198.51.100.7"}}).status == 200);
  CHECK(server.get("/v1/items", {{"X-Forwarded-For", "10.0.0.3, 198.51.100.7"}}).status == 429);
  // Another client behind the same proxy has its own bucket.
  CHECK(server.get("/v1/items", {{"X-Forwarded-For", "198.51.100.8"}}).status == 200);
}

// [attack] An IPv6-only service behind a stateless translator with a prefix of its own sees
// every IPv4 client in one /64: one client spends the per-ip budget of all of them.
TEST_CASE("IPv4 clients behind the config's translation prefix have a bucket each") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = items_behind({"127.0.0.1/32"});
  const TestServer shared(Limiter(make_engine(config, clock), options_with()));
  CHECK(shared.get("/v1/items", {{"X-Forwarded-For", "2001:db8:46::c633:6401"}}).status == 200);
  CHECK(shared.get("/v1/items", {{"X-Forwarded-For", "2001:db8:46::c633:6402"}}).status == 200);
  CHECK(shared.get("/v1/items", {{"X-Forwarded-For", "2001:db8:46::c633:6403"}}).status == 429);

  config.gateway.ipv4_translation_prefixes = {"2001:db8:46::/96"};
  const TestServer own(Limiter(make_engine(config, clock), options_with()));
  for (const char* client :
       {"2001:db8:46::c633:6401", "2001:db8:46::c633:6402", "2001:db8:46::c633:6403"}) {
    INFO(client);
    CHECK(own.get("/v1/items", {{"X-Forwarded-For", client}}).status == 200);
    CHECK(own.get("/v1/items", {{"X-Forwarded-For", client}}).status == 200);
    CHECK(own.get("/v1/items", {{"X-Forwarded-For", client}}).status == 429);
  }
  // The client is the IPv4 address: the same client written in IPv4 (a dual path) shares it.
  CHECK(own.get("/v1/items", {{"X-Forwarded-For", "198.51.100.1"}}).status == 429);
}

TEST_CASE(
    "a consumer's token is limited on its own bucket; an unknown token is limited by "
    "address, then refused with 401") {
  sluice::ManualClock clock;
  const TestServer server(Limiter(make_engine(items_config(), clock), options_with()));
  const httplib::Headers acme = {{"Authorization", "Bearer acme-token"}};
  const httplib::Headers forged = {{"Authorization", "Bearer made-up"}};

  CHECK(server.get("/v1/items", acme).status == 200);
  CHECK(server.get("/v1/items", acme).status == 200);
  CHECK(server.get("/v1/items", acme).status == 429);  // acme-tier: 2 per minute
  // acme's requests used the address's per-ip bucket too (2 per minute): it is spent.
  CHECK(server.get("/v1/items", forged).status == 429);
  clock.advance(60s);
  CHECK(server.get("/v1/items", forged).status == 401);  // limited, then refused
  CHECK(server.get("/v1/items", {{"Authorization", "bearer made-up-2"}}).status == 401);
  CHECK(server.get("/v1/items").status == 429);  // the forged tokens spent the address's bucket
}

TEST_CASE("a request keeps the engine generation it evaluated with while a reload replaces it") {
  sluice::ManualClock clock;
  std::mutex mutex;
  std::shared_ptr<const Engine> current = make_engine(items_config(), clock);
  Limiter::Options options = options_with();
  std::optional<std::string> seen_route;
  options.on_admitted = [&](const httplib::Request&, httplib::Response& response,
                            const Limiter::LimitedRequest& limited) {
    {
      // Another thread's reload: the source now serves a new generation, the old one is released.
      std::lock_guard lock(mutex);
      current = make_engine(items_config(), clock);
    }
    std::lock_guard lock(mutex);
    seen_route = std::string(limited.route->route);  // a view into the released generation
    response.set_content("answered", "text/plain");
    return Limiter::HandlerResponse::Handled;
  };
  const TestServer server(Limiter(
      [&] {
        std::lock_guard lock(mutex);
        return current;
      },
      std::move(options)));
  const httplib::Response response = server.get("/v1/items");
  CHECK(response.status == 200);
  CHECK(response.body == "answered");
  std::lock_guard lock(mutex);
  CHECK(seen_route == "items");
}

namespace {

// items_config, plus route `login` (/login: 1 per minute for the route) and a global limit of 4
// per minute per client address.
sluice::PolicyConfig items_and_login_config() {
  sluice::PolicyConfig config = items_config();
  config.policies.push_back(
      {.name = "login-throttle",
       .rate_limits = {rule("per-route", {Selector::kRoute}, {.minute = 1})}});
  config.policies.push_back(
      {.name = "global", .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = 4})}});
  config.routes.push_back(
      {.name = "login", .path_prefix = "/login", .policies = {"login-throttle"}});
  config.gateway.global_policies = {"global"};
  return config;
}

// Answers every admitted request 200 "ok", recording "<route> <path>" of each as handed on.
class HandedOn {
 public:
  void install(Limiter::Options& options) {
    options.on_admitted = [this](const httplib::Request&, httplib::Response& response,
                                 const Limiter::LimitedRequest& limited) {
      std::lock_guard lock(mutex_);
      seen_.push_back(absl::StrCat(std::string(limited.route ? limited.route->route : "(none)"),
                                   " ", limited.path));
      response.set_content("ok", "text/plain");
      return Limiter::HandlerResponse::Handled;
    };
  }
  std::vector<std::string> seen() const {
    std::lock_guard lock(mutex_);
    return seen_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> seen_;
};

}  // namespace

TEST_CASE("a path with dot segments is limited by the route it resolves to and handed on so") {
  sluice::ManualClock clock;
  Limiter::Options options = options_with();
  HandedOn handed_on;
  handed_on.install(options);
  const TestServer server(
      Limiter(make_engine(items_and_login_config(), clock), std::move(options)));

  CHECK(server.get("/v1/items/../../login").status == 200);
  const httplib::Response encoded = server.get("/v1/items/%2e%2e/%2E%2E/login");
  CHECK(encoded.status == 429);  // the login route's one request per minute is spent
  CHECK(header(encoded, "RateLimit-Policy") == R"("login-throttle/per-route/minute";q=1;w=60)");
  CHECK(server.get("/v1/items/.%2e/.%2E/login").status == 429);
  CHECK(handed_on.seen() == std::vector<std::string>{"login /login"});
}

TEST_CASE("a path parameter before the last segment cannot move a request to a shorter route",
          "[attack]") {
  // Java servlet containers drop each segment's ";parameters": they serve /api;v=1/login as
  // /api/login, which the route `api` must not limit in place of `api-login`.
  sluice::ManualClock clock;
  const sluice::PolicyConfig config{
      .policies = {{.name = "login-throttle",
                    .rate_limits = {rule("per-route", {Selector::kRoute}, {.minute = 1})}}},
      .routes = {
          {.name = "api", .path_prefix = "/api"},
          {.name = "api-login", .path_prefix = "/api/login", .policies = {"login-throttle"}}}};
  Limiter::Options options = options_with();
  HandedOn handed_on;
  handed_on.install(options);
  const TestServer server(Limiter(make_engine(config, clock), std::move(options)));

  CHECK(server.get("/api/login").status == 200);  // the route's one request per minute
  for (const char* path : {"/api;v=1/login", "/api;/login", "/api/x;y/../login;z/"}) {
    INFO(path);
    const httplib::Response refused = server.get(path);
    CHECK(refused.status == 400);
    CHECK(refused.body == "{\"error\":\"ambiguous request path\"}\n");
  }
  // A parameter of the last segment leaves the route as it is (;jsessionid=...).
  CHECK(server.get("/api/login;jsessionid=1").status == 429);
  CHECK(handed_on.seen() == std::vector<std::string>{"api-login /api/login"});
}

TEST_CASE("a character sent raw or percent-encoded is limited by the same route", "[attack]") {
  // Upstreams (and cpp-httplib's own routes) decode %3A and %C3%A9 before routing: either
  // spelling of /v1/items:batch or /café is served by that path, and must be limited by its route.
  sluice::ManualClock clock;
  const sluice::PolicyConfig config{
      .policies = {{.name = "throttle",
                    .rate_limits = {rule("per-route", {Selector::kRoute}, {.minute = 1})}}},
      .routes = {{.name = "items", .path_prefix = "/v1/items"},
                 {.name = "batch", .path_prefix = "/v1/items:batch", .policies = {"throttle"}},
                 {.name = "cafe", .path_prefix = "/caf%C3%A9", .policies = {"throttle"}}}};
  Limiter::Options options = options_with();
  HandedOn handed_on;
  handed_on.install(options);
  const TestServer server(Limiter(make_engine(config, clock), std::move(options)));

  CHECK(server.get("/v1/items:batch").status == 200);  // the route's one request per minute
  for (const char* path : {"/v1/items%3Abatch", "/v1/items%3abatch", "/v1/items%3A%62atch"}) {
    INFO(path);
    CHECK(server.get(path).status == 429);
  }
  CHECK(server.get("/caf%c3%a9").status == 200);
  CHECK(server.get("/caf\xC3\xA9").status == 429);  // the raw UTF-8 bytes
  CHECK(handed_on.seen() == std::vector<std::string>{"batch /v1/items:batch", "cafe /caf%C3%A9"});
}

TEST_CASE("an ambiguous path is answered 400, and counts against the global limits") {
  sluice::ManualClock clock;
  const TestServer server(Limiter(make_engine(items_and_login_config(), clock), options_with()));
  for (const char* path :
       {"/../login", "/v1/items%2F..%2F..%2Flogin", "/v1/items%5C..%5Clogin", "/v1/items%00"}) {
    INFO(path);
    const httplib::Response refused = server.get(path);
    CHECK(refused.status == 400);
    CHECK(refused.body == "{\"error\":\"ambiguous request path\"}\n");
  }
  CHECK(server.get("/../login").status == 429);  // the client's 4 per minute are spent
}

TEST_CASE("a path the server's own routes would read differently is answered 400") {
  sluice::ManualClock clock;
  const TestServer server(Limiter(make_engine(items_config(), clock), options_with()));
  CHECK(server.get("/v1/./items").status == 400);  // limited as /v1/items, routed as written
  CHECK(server.get("/v1/items").status == 200);
}

TEST_CASE("without an engine every request is answered 503") {
  const TestServer server(Limiter([] { return std::shared_ptr<const Engine>(); }));
  const httplib::Response response = server.get("/v1/items");
  CHECK(response.status == 503);
  CHECK(response.body == "{\"error\":\"rate limiter unavailable\"}\n");
}

TEST_CASE("an upstream's Retry-After counts only as delay-seconds, capped at one day") {
  auto parse = [](const char* value) {
    httplib::Headers headers;
    if (value != nullptr) headers.emplace("Retry-After", value);
    return Limiter::upstream_response(503, headers, 7ms);
  };
  const sluice::UpstreamResponse plain = parse("12");
  CHECK(plain.status == 503);
  CHECK(plain.latency == 7ms);
  CHECK(plain.retry_after == 12s);
  CHECK(parse(nullptr).retry_after == 0s);
  CHECK(parse("").retry_after == 0s);
  CHECK(parse("-5").retry_after == 0s);
  CHECK(parse("+5").retry_after == 0s);
  CHECK(parse(" 5").retry_after == 0s);
  CHECK(parse("1.5").retry_after == 0s);
  CHECK(parse("Wed, 21 Oct 2015 07:28:00 GMT").retry_after == 0s);  // an HTTP-date: none
  CHECK(parse("86401").retry_after == 24h);
  CHECK(parse("99999999999999999999999999").retry_after == 24h);  // overflows: the cap
}

TEST_CASE("an upstream's answers fed back through the adapter move the route's adaptive factor") {
  sluice::ManualClock clock;
  sluice::Rule limited = rule("per-ip", {Selector::kIp}, {.minute = 10});
  limited.adaptive = sluice::AdaptivePolicy{.target_latency = 100ms,
                                            .minimum_factor_permille = 200,
                                            .interval = 1s,
                                            .max_hold = 10s,
                                            .min_samples = 1,  // one client's answer is enough
                                            .min_clients = 1};
  const sluice::PolicyConfig config{
      .policies = {{.name = "adaptive", .rate_limits = {limited}}},
      .routes = {{.name = "api", .path_prefix = "/api", .policies = {"adaptive"}}}};
  const std::shared_ptr<const Engine> engine = make_engine(config, clock);

  // The handler plays the upstream: it answers what `upstream` says and feeds that back.
  std::mutex mutex;
  httplib::Headers upstream_headers;
  int upstream_status = 200;
  Limiter::Options options = options_with();
  options.on_admitted = [&](const httplib::Request& request, httplib::Response& response,
                            const Limiter::LimitedRequest& request_limited) {
    std::lock_guard lock(mutex);
    const sluice::UpstreamResponse answer =
        Limiter::upstream_response(upstream_status, upstream_headers, 5ms);
    CHECK(Limiter::record_upstream(request, request_limited, answer).ok());
    response.status = upstream_status;
    return Limiter::HandlerResponse::Handled;
  };
  const TestServer server(Limiter(engine, std::move(options)));
  auto factor = [&] { return engine->stats()[0].adaptive->factor_permille; };

  CHECK(server.get("/api/a").status == 200);
  CHECK(factor() == 1000);
  {
    std::lock_guard lock(mutex);
    upstream_status = 503;
    upstream_headers = {{"Retry-After", "4"}};
  }
  CHECK(server.get("/api/a").status == 503);
  CHECK(factor() == 200);  // a 503 drops the factor to the minimum at once
  CHECK(engine->stats()[0].adaptive->hold_remaining == 4s);
  // At factor 200 a request takes what 5 took at factor 1000. The burst holds 10; the two
  // requests at factor 1000 took 2: one more fits (and reaches the failing upstream), then none.
  CHECK(server.get("/api/a").status == 503);
  CHECK(server.get("/api/a").status == 429);
  CHECK(engine->stats()[0].admitted == 3);
}

// --- identity settings from the config

TEST_CASE(
    "behind a proxy trusted only by the config's gateway.trusted_proxies, each forwarded client "
    "has its own bucket") {
  sluice::ManualClock clock;
  // No trusted proxy in code: only the config trusts 127.0.0.1, where the requests come from.
  const TestServer server(
      Limiter(make_engine(items_behind({"127.0.0.1/32"}), clock), options_with()));
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.7")).status == 200);
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.7")).status == 200);
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.7")).status == 429);
  // Another client behind the same proxy: its first request is admitted.
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.8")).status == 200);
}

TEST_CASE(
    "creating an adapter with trusted proxies that contradict the config's "
    "gateway.trusted_proxies fails, naming both lists") {
  sluice::ManualClock clock;
  const auto engine = make_engine(items_behind({"127.0.0.1/32", "10.0.0.0/8"}), clock);

  const auto contradicting = Limiter::create(engine, options_with(), {"192.0.2.0/24"});
  CHECK(contradicting.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(contradicting.status().message() ==
        "the adapter's trusted proxies [192.0.2.0/24] contradict the config's "
        "gateway.trusted_proxies [10.0.0.0/8, 127.0.0.1/32]: the adapter takes its trusted "
        "proxies from the config and follows its reloads; set them in gateway.trusted_proxies "
        "and give the adapter none");
  // A subset contradicts too: the config trusts a proxy the code does not.
  CHECK(Limiter::create(engine, options_with(), {"127.0.0.1/32"}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Limiter::create(engine, options_with(), {"10.0.0.1/8"}).status().message() ==
        "trusted_networks[0]: network \"10.0.0.1/8\": host bits are set; write the network "
        "address");
  // No proxies in code, or the config's own in another order: created.
  CHECK(Limiter::create(engine, options_with()).ok());
  CHECK(Limiter::create(engine, options_with(), {"10.0.0.0/8", "127.0.0.1/32"}).ok());

  const auto untrusting = make_engine(items_config(), clock);  // the config trusts no proxy
  CHECK(Limiter::create(untrusting, options_with(), {"127.0.0.1/32"}).status().message() ==
        "the adapter's trusted proxies [127.0.0.1/32] contradict the config's "
        "gateway.trusted_proxies []: the adapter takes its trusted proxies from the config and "
        "follows its reloads; set them in gateway.trusted_proxies and give the adapter none");
  const auto none = Limiter::create([] { return std::shared_ptr<const Engine>(); }, options_with(),
                                    {"127.0.0.1/32"});
  CHECK(none.status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE(
    "creating an adapter for a listener the config lacks fails, since that listener's rules and "
    "routes would never apply",
    "[attack]") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = items_config();
  config.listeners = {{.name = "public", .policies = {"items-per-ip"}}};
  config.routes[0].policies.clear();  // the per-ip limit is the listener's
  const auto engine = make_engine(config, clock);
  Limiter::Options options = options_with();
  options.listener = "pubic";  // a typo of the config's "public"

  const auto created = Limiter::create(engine, options);
  if (created.ok()) {  // what such an adapter does: the listener's 2 per minute never apply
    const TestServer server(*created);
    int admitted = 0;
    for (int i = 0; i < 5; ++i) admitted += server.get("/v1/items").status == 200;
    CHECK(admitted == 2);
  }
  CHECK(created.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(created.status().message() ==
        "the adapter's listener \"pubic\" is none of the config's listeners, so no listener's "
        "bundles and no route on a listener would apply to its requests; name one of the config's "
        "listeners (listeners[].name), or none");
  options.listener = "public";
  CHECK(Limiter::create(engine, options).ok());
  options.listener = "";  // no listener: only routes on every listener, and global bundles
  CHECK(Limiter::create(engine, options).ok());
}

TEST_CASE("an adapter created with the config's own trusted proxies still follows the config") {
  sluice::ManualClock clock;
  auto created = Limiter::create(make_engine(items_behind({"127.0.0.1/32"}), clock), options_with(),
                                 {"127.0.0.1/32"});
  REQUIRE(created.ok());
  const TestServer server(*created);
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.7")).status == 200);
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.8")).status == 200);
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.8")).status == 200);
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.8")).status == 429);
}

#ifdef SLUICE_TEST_YAML
namespace {

// A fresh directory under the system's temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "sluice_httplib_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// items_config()'s per-ip rule as YAML, behind the proxies `trusted` (a YAML sequence).
void write_items_yaml(const std::string& path, const std::string& trusted) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << absl::StrCat(
      "policies:\n"
      "  - name: items-per-ip\n"
      "    rate_limits:\n"
      "      - { name: per-ip, selector: [ip], requests_per: { minute: 2 } }\n"
      "routes:\n"
      "  - { name: items, path_prefix: /v1/items, policies: [items-per-ip] }\n"
      "gateway:\n"
      "  trusted_proxies: ",
      trusted, "\n");
}

}  // namespace

TEST_CASE(
    "an adapter over a reloading holder resolves clients by the trusted proxies of the "
    "generation it evaluates with") {
  sluice::ManualClock clock;
  const TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write_items_yaml(path, "[10.0.0.0/8]");  // 127.0.0.1 is not trusted yet
  auto holder = sluice::yaml::ReloadingEngine<Engine>::create(
      path, {.backend = {.store = {.seed = 1}, .clock = clock}});
  REQUIRE(holder.ok());
  sluice::yaml::ReloadingEngine<Engine>& reloading = **holder;
  const TestServer server(Limiter([&reloading] { return reloading.current(); }, options_with()));
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.7")).status == 200);
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.7")).status == 200);
  // Both clients are the proxy, 127.0.0.1, whose bucket is spent.
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.8")).status == 429);

  write_items_yaml(path, "[127.0.0.1/32]");
  REQUIRE(reloading.reload().ok());
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.8")).status == 200);
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.7")).status == 200);

  write_items_yaml(path, "[]");  // no proxy trusted: every request is the peer's again
  REQUIRE(reloading.reload().ok());
  CHECK(server.get("/v1/items", forwarded_for("198.51.100.9")).status == 429);
}

TEST_CASE("install over a holder limits with its current generation and serves its metrics") {
  sluice::ManualClock clock;
  const TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write_items_yaml(path, "[]");
  auto holder = sluice::yaml::ReloadingEngine<Engine>::create(
      path, {.backend = {.store = {.seed = 1}, .clock = clock}});
  REQUIRE(holder.ok());
  const TestServer server([&holder](httplib::Server& s) {
    REQUIRE(sluice::install(s, **holder, {.limiter = options_with()}).ok());
  });
  CHECK(server.get("/v1/items").status == 200);
  CHECK(server.get("/v1/items").status == 200);
  const httplib::Response denied = server.get("/v1/items");
  CHECK(denied.status == 429);
  CHECK(header(denied, "Retry-After") == "30");
  CHECK(header(denied, "X-RateLimit-Limit") == "2");

  REQUIRE((*holder)->reload().ok());  // the next request and scrape see the new generation
  const httplib::Response metrics = server.get("/metrics");
  CHECK(metrics.status == 200);
  CHECK(header(metrics, "Content-Type") == sluice::kPrometheusContentType);
  CHECK(absl::StrContains(
      metrics.body,
      "\nsluice_rule_denied_total{rule=\"items-per-ip/per-ip\",dry_run=\"false\"} 1\n"));
  CHECK(absl::StrContains(metrics.body, "\nsluice_engine_reloads_total 1\n"));
  CHECK(server.get("/v1/items").status == 429);  // an unchanged rule keeps its spent budget
}

TEST_CASE("install without a metrics path adds no route") {
  sluice::ManualClock clock;
  const TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write_items_yaml(path, "[]");
  auto holder = sluice::yaml::ReloadingEngine<Engine>::create(
      path, {.backend = {.store = {.seed = 1}, .clock = clock}});
  REQUIRE(holder.ok());
  const TestServer server([&holder](httplib::Server& s) {
    REQUIRE(sluice::install(s, **holder, {.limiter = options_with(), .metrics_path = ""}).ok());
  });
  CHECK(server.get("/metrics").status == 404);
}

namespace {

// A holder over `path`, written with listener "public" and consumer "unknown".
std::unique_ptr<sluice::yaml::ReloadingEngine<Engine>> names_holder(const std::string& path,
                                                                    sluice::ManualClock clock) {
  write_names_yaml(path, "public", "unknown");
  auto holder = sluice::yaml::ReloadingEngine<Engine>::create(
      path, {.backend = {.store = {.seed = 1}, .clock = clock}});
  REQUIRE(holder.ok());
  return *std::move(holder);
}

// How many of `count` requests for /v1/items (with `headers`) were answered 200.
int passed(const TestServer& server, int count, const httplib::Headers& headers = {}) {
  int ok = 0;
  for (int i = 0; i < count; ++i) ok += server.get("/v1/items", headers).status == 200 ? 1 : 0;
  return ok;
}

}  // namespace

TEST_CASE(
    "a reload that renames the listener an adapter over the holder serves is refused, since its "
    "limits would never apply",
    "[attack]") {
  sluice::ManualClock clock;
  const TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  const auto holder = names_holder(path, clock);
  Limiter::Options options = options_with();
  options.listener = "public";
  const TestServer server([&holder, &options](httplib::Server& s) {
    REQUIRE(sluice::install(s, *holder, {.limiter = options, .metrics_path = ""}).ok());
  });

  write_names_yaml(path, "external", "unknown");  // renamed: the adapter's requests match none
  const absl::Status reloaded = holder->reload();
  if (reloaded.ok()) {  // what the adapter does then: its listener's limit never applies
    CHECK(passed(server, 5) == 5);
  }
  CHECK(reloaded.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(reloaded.message() ==
        absl::StrCat(path,
                     ": the config has no listener \"public\", which a running adapter serves (its "
                     "listener setting): that listener's bundles and routes would no longer apply "
                     "to the adapter's requests, which would all pass; keep a listener named "
                     "\"public\" in listeners[], or give the adapter another listener (recreate "
                     "it) before removing this one"));
  CHECK(passed(server, 5) == 2);  // the running generation still limits the listener
  CHECK(holder->current()->engine_stats().failed_reloads == 1);
}

TEST_CASE(
    "a reload that drops the unknown consumer of an adapter over the holder is refused, since "
    "every unknown credential would be refused instead of limited",
    "[attack]") {
  sluice::ManualClock clock;
  const TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  const auto holder = names_holder(path, clock);
  Limiter::Options options = options_with();
  options.unknown_consumer = "unknown";
  const TestServer server([&holder, &options](httplib::Server& s) {
    REQUIRE(sluice::install(s, *holder, {.limiter = options, .metrics_path = ""}).ok());
  });
  const httplib::Headers random_key = {{"Authorization", "Bearer random-1"}};

  write_names_yaml(path, "public", "anonymous");  // the adapter's unknown consumer is gone
  const absl::Status reloaded = holder->reload();
  if (reloaded.ok()) {  // what the adapter does then: every unknown key is refused with 401
    CHECK(passed(server, 5, random_key) == 0);
  }
  CHECK(reloaded.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(passed(server, 5, random_key) == 2);  // limited as the consumer "unknown", by address
}

TEST_CASE(
    "a reload that keeps the names an adapter over the holder needs goes through, and a spent "
    "budget stays spent") {
  sluice::ManualClock clock;
  const TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  const auto holder = names_holder(path, clock);
  Limiter::Options options = options_with();
  options.listener = "public";
  options.unknown_consumer = "unknown";
  const absl::StatusOr<Limiter> limiter = Limiter::create(*holder, options);
  REQUIRE(limiter.ok());
  const TestServer server(*limiter);
  CHECK(passed(server, 2) == 2);

  std::ofstream(path, std::ios::app) << "  - { name: partner }\n";  // one more consumer
  REQUIRE(holder->reload().ok());
  CHECK(holder->current()->engine_stats().reloads == 1);
  CHECK(passed(server, 1) == 0);  // the listener's rule kept its state
}

TEST_CASE("creating an adapter over a holder refuses a listener its current config lacks") {
  sluice::ManualClock clock;
  const TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  const auto holder = names_holder(path, clock);
  Limiter::Options options = options_with();
  options.listener = "pubilc";  // a typo
  const absl::StatusOr<Limiter> limiter = Limiter::create(*holder, options);
  CHECK(limiter.status().code() == absl::StatusCode::kInvalidArgument);
  const TestServer untouched([&holder, &options](httplib::Server& s) {
    CHECK(sluice::install(s, *holder, {.limiter = options}).code() ==
          absl::StatusCode::kInvalidArgument);
  });
  CHECK(untouched.get("/v1/items").status == 200);  // nothing was installed

  write_names_yaml(path, "other", "anonymous");  // nothing was registered either
  CHECK(holder->reload().ok());
}

TEST_CASE("once an adapter over the holder is gone, a reload may drop the names it needed") {
  sluice::ManualClock clock;
  const TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  const auto holder = names_holder(path, clock);
  Limiter::Options options = options_with();
  options.listener = "public";
  {
    const absl::StatusOr<Limiter> limiter = Limiter::create(*holder, options);
    REQUIRE(limiter.ok());
    const Limiter copy = *limiter;  // a copy keeps the names required
    write_names_yaml(path, "external", "unknown");
    CHECK(holder->reload().code() == absl::StatusCode::kFailedPrecondition);
  }
  CHECK(holder->reload().ok());
}
#endif

// --- API keys from the service's own store (sluice/credential_resolver.hpp) -------------------

namespace {

// Route `items` (/v1/items): `per_ip` per minute per address for everyone. Consumer `customer`
// (keys of the service's store, none in the config): 2 per minute per key. Consumer `unknown`:
// 1 per minute per address, for keys no one owns.
sluice::PolicyConfig api_key_config(std::uint64_t per_ip) {
  return {.policies = {{.name = "items-per-ip",
                        .rate_limits = {rule("per-ip", {Selector::kIp}, {.minute = per_ip})}},
                       {.name = "customer-tier",
                        .rate_limits = {rule("per-key", {Selector::kCredential}, {.minute = 2})}},
                       {.name = "unknown-tier",
                        .rate_limits = {rule("unknown", {Selector::kCredential}, {.minute = 1})}}},
          .routes = {{.name = "items", .path_prefix = "/v1/items", .policies = {"items-per-ip"}}},
          .consumers = {{.name = "customer", .policies = {"customer-tier"}},
                        {.name = "unknown", .policies = {"unknown-tier"}}}};
}

// The service's store: "key-<n>" belongs to `customer`; anything else to no one.
absl::StatusOr<std::optional<std::string>> key_store(std::string_view key) {
  if (key.starts_with("key-")) return std::optional<std::string>("customer");
  return std::optional<std::string>();
}

sluice::CredentialResolver<sluice::ManualClock> key_resolver(sluice::ManualClock clock) {
  auto resolver = sluice::CredentialResolver<sluice::ManualClock>::create(
      key_store, {.max_entries = 8, .known_ttl = 60s, .unknown_ttl = 60s}, clock);
  REQUIRE(resolver.ok());
  return *std::move(resolver);
}

Limiter::Options api_key_options(const sluice::CredentialResolver<sluice::ManualClock>& resolver,
                                 std::string unknown_consumer) {
  Limiter::Options options = options_with();
  options.credential = Limiter::header_credential("X-Api-Key");
  options.consumer_of = resolver;
  options.unknown_consumer = std::move(unknown_consumer);
  return options;
}

httplib::Headers api_key(const std::string& key) { return {{"X-Api-Key", key}}; }

}  // namespace

TEST_CASE("each API key the service's store knows is limited on its own bucket of its consumer") {
  sluice::ManualClock clock;
  const auto resolver = key_resolver(clock);
  std::vector<std::string> consumers;
  Limiter::Options options = api_key_options(resolver, "unknown");
  options.on_evaluated = [&](const httplib::Request&, const Limiter::LimitedRequest& limited) {
    consumers.push_back(std::string(limited.consumer.value_or("<none>")));
  };
  const TestServer server(Limiter(make_engine(api_key_config(100), clock), std::move(options)));

  CHECK(server.get("/v1/items", api_key("key-1")).status == 200);
  const httplib::Response second = server.get("/v1/items", api_key("key-1"));
  CHECK(second.status == 200);
  CHECK(header(second, "X-RateLimit-Remaining") == "0");  // customer-tier binds: 2 per minute
  CHECK(server.get("/v1/items", api_key("key-1")).status == 429);
  CHECK(server.get("/v1/items", api_key("key-2")).status == 200);  // another key: its own
  CHECK(consumers == std::vector<std::string>{"customer", "customer", "customer", "customer"});
}

TEST_CASE(
    "a client spraying random API keys gets the unknown consumer's one bucket by address, not "
    "the anonymous one, not one per key, and the cache stays bounded") {
  sluice::ManualClock clock;
  const auto resolver = key_resolver(clock);
  std::vector<sluice::CredentialStatus> statuses;
  Limiter::Options options = api_key_options(resolver, "unknown");
  options.on_evaluated = [&](const httplib::Request&, const Limiter::LimitedRequest& limited) {
    statuses.push_back(limited.credential_status);
    CHECK(std::string(limited.consumer.value_or("<none>")) ==
          (limited.credential ? "unknown" : "<none>"));
  };
  const TestServer server(Limiter(make_engine(api_key_config(100), clock), std::move(options)));

  const httplib::Response first = server.get("/v1/items", api_key("random-0"));
  CHECK(first.status == 200);
  CHECK(header(first, "X-RateLimit-Limit") == "1");  // the unknown consumer's rule binds
  for (int i = 1; i < 40; ++i) {                     // a fresh key each time buys nothing
    CHECK(server.get("/v1/items", api_key(absl::StrCat("random-", i))).status == 429);
  }
  CHECK(resolver.size() <= 8);
  // The anonymous caller at the same address is not in the unknown consumer's bucket; the
  // route's per-address rule counted the admitted requests (all or nothing): the first and this.
  const httplib::Response anonymous = server.get("/v1/items");
  CHECK(anonymous.status == 200);
  CHECK(header(anonymous, "X-RateLimit-Remaining") == "98");
  CHECK(statuses.size() == 41);
  CHECK(statuses.front() == sluice::CredentialStatus::kUnknown);
  CHECK(statuses.back() == sluice::CredentialStatus::kNone);
}

TEST_CASE("by default an unknown API key is limited by address, then refused with 401") {
  sluice::ManualClock clock;
  const auto resolver = key_resolver(clock);
  const TestServer server(
      Limiter(make_engine(api_key_config(2), clock), api_key_options(resolver, "")));
  const httplib::Response refused = server.get("/v1/items", api_key("random-1"));
  CHECK(refused.status == 401);
  CHECK(refused.body == "{\"error\":\"unknown credential\"}\n");
  CHECK(server.get("/v1/items", api_key("random-2")).status == 401);
  CHECK(server.get("/v1/items", api_key("random-3")).status == 429);  // the address's 2 per minute
  CHECK(server.get("/v1/items").status == 429);  // the sprayed keys spent the address's bucket
  CHECK(server.get("/healthz", api_key("random-4")).status == 200);  // exempt: routed as is
}

TEST_CASE("an unknown consumer the config does not define refuses unknown keys with 401") {
  sluice::ManualClock clock;
  const auto resolver = key_resolver(clock);
  const TestServer server(
      Limiter(make_engine(api_key_config(100), clock), api_key_options(resolver, "no-such")));
  CHECK(server.get("/v1/items", api_key("random-1")).status == 401);
  CHECK(server.get("/v1/items", api_key("key-1")).status == 200);
}

TEST_CASE(
    "creating an adapter whose unknown consumer the config lacks fails, since it would refuse "
    "every unknown key",
    "[attack]") {
  sluice::ManualClock clock;
  const auto resolver = key_resolver(clock);
  const auto engine = make_engine(api_key_config(100), clock);
  const auto created = Limiter::create(engine, api_key_options(resolver, "unknwon"));  // a typo
  if (created.ok()) {  // what such an adapter does: unknown keys are refused, not limited
    const TestServer server(*created);
    CHECK(server.get("/v1/items", api_key("random-1")).status == 200);
  }
  CHECK(created.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(created.status().message() ==
        "the adapter's unknown consumer \"unknwon\" is none of the config's consumers, so every "
        "unknown credential would be refused instead of limited as that consumer's; name one of "
        "the config's consumers (consumers[].name), or none to refuse unknown credentials");
  CHECK(Limiter::create(engine, api_key_options(resolver, "unknown")).ok());
  CHECK(Limiter::create(engine, api_key_options(resolver, "")).ok());
}

TEST_CASE("a failing key store: the request is limited by address, then answered 503") {
  sluice::ManualClock clock;
  Limiter::Options options = options_with();
  options.credential = Limiter::header_credential("X-Api-Key");
  options.consumer_of = [](std::string_view) -> absl::StatusOr<std::optional<std::string>> {
    return absl::UnavailableError("store down");
  };
  const TestServer server(Limiter(make_engine(api_key_config(1), clock), std::move(options)));
  const httplib::Response failed = server.get("/v1/items", api_key("key-1"));
  CHECK(failed.status == 503);
  CHECK(failed.body == "{\"error\":\"credential store unavailable\"}\n");
  CHECK(server.get("/v1/items", api_key("key-1")).status == 429);
}

TEST_CASE(
    "a key the store gives a consumer the config does not define is limited by address, then "
    "answered 503",
    "[attack]") {
  sluice::ManualClock clock;
  std::vector<sluice::CredentialStatus> statuses;
  std::vector<std::string> consumers;
  Limiter::Options options = options_with();
  options.credential = Limiter::header_credential("X-Api-Key");
  options.consumer_of = [](std::string_view) -> absl::StatusOr<std::optional<std::string>> {
    return std::optional<std::string>("gold");  // a class the loaded config lacks
  };
  options.on_evaluated = [&](const httplib::Request&, const Limiter::LimitedRequest& limited) {
    statuses.push_back(limited.credential_status);
    consumers.push_back(std::string(limited.consumer.value_or("<none>")));
  };
  const TestServer server(Limiter(make_engine(api_key_config(1), clock), std::move(options)));
  const httplib::Response failed = server.get("/v1/items", api_key("key-1"));
  CHECK(failed.status == 503);
  CHECK(failed.body == "{\"error\":\"credential store unavailable\"}\n");
  CHECK(server.get("/v1/items", api_key("key-2")).status == 429);  // the address's 1 per minute
  CHECK(statuses ==
        std::vector<sluice::CredentialStatus>(2, sluice::CredentialStatus::kLookupFailed));
  CHECK(consumers == std::vector<std::string>{"<none>", "<none>"});
}

TEST_CASE("a header the operator trusts keys each value on its own bucket") {
  sluice::ManualClock clock;
  Limiter::Options options = options_with();
  options.credential = Limiter::header_credential("X-Consumer-Id");  // set by the auth proxy
  options.consumer_of = sluice::trust_credential_as("customer");
  const TestServer server(Limiter(make_engine(api_key_config(100), clock), std::move(options)));
  const httplib::Headers a = {{"X-Consumer-Id", "tenant-a"}};
  const httplib::Headers b = {{"X-Consumer-Id", "tenant-b"}};
  CHECK(server.get("/v1/items", a).status == 200);
  CHECK(server.get("/v1/items", a).status == 200);
  CHECK(server.get("/v1/items", a).status == 429);
  CHECK(server.get("/v1/items", b).status == 200);
  // Sent twice, the header is ambiguous: an unknown credential (refused), not the anonymous
  // caller, and not a tenant's.
  const httplib::Response twice =
      server.get("/v1/items", {{"X-Consumer-Id", "tenant-a"}, {"X-Consumer-Id", "tenant-c"}});
  CHECK(twice.status == 401);
}

TEST_CASE("a known API key sent twice is an unknown credential, not an anonymous caller") {
  sluice::ManualClock clock;
  const auto resolver = key_resolver(clock);
  std::vector<sluice::CredentialStatus> statuses;
  Limiter::Options options = api_key_options(resolver, "unknown");
  options.on_evaluated = [&](const httplib::Request&, const Limiter::LimitedRequest& limited) {
    statuses.push_back(limited.credential_status);
  };
  const TestServer server(Limiter(make_engine(api_key_config(2), clock), std::move(options)));
  const httplib::Headers twice = {{"X-Api-Key", "key-1"}, {"X-Api-Key", "key-1"}};
  // Limited by address (2 per minute), then refused, never admitted as the anonymous caller.
  CHECK(server.get("/v1/items", twice).status == 401);
  CHECK(server.get("/v1/items", twice).status == 401);
  for (int i = 0; i < 3; ++i) CHECK(server.get("/v1/items", twice).status == 429);
  CHECK(statuses == std::vector<sluice::CredentialStatus>(5, sluice::CredentialStatus::kUnknown));
}

TEST_CASE("an Authorization header sent twice, or Bearer and a tab, is an unknown credential") {
  sluice::ManualClock clock;
  const TestServer server(Limiter(make_engine(api_key_config(100), clock), options_with()));
  CHECK(server.get("/v1/items", {{"Authorization", "Bearer a"}, {"Authorization", "Bearer b"}})
            .status == 401);
  CHECK(server.get("/v1/items", {{"Authorization", "Bearer\tk1"}}).status == 401);
  CHECK(server.get("/v1/items", {{"Authorization", "Basic dXNlcg=="}}).status == 200);  // none
}

TEST_CASE(
    "a known API key sent without its scheme cannot pass its own limit as an anonymous "
    "request",
    "[attack]") {
  sluice::ManualClock clock;
  const auto resolver = key_resolver(clock);
  Limiter::Options options = options_with();  // the credential: Authorization: Bearer <token>
  options.consumer_of = resolver;
  options.unknown_consumer = "unknown";
  const TestServer server(Limiter(make_engine(api_key_config(100), clock), std::move(options)));
  const httplib::Headers bearer = {{"Authorization", "Bearer key-1"}};
  CHECK(server.get("/v1/items", bearer).status == 200);
  CHECK(server.get("/v1/items", bearer).status == 200);
  CHECK(server.get("/v1/items", bearer).status == 429);  // the key's 2 per minute
  // A service that strips "Bearer " only where it is present reads key-1 from a bare token: it
  // must not be served as an anonymous request, by address, past the key's limit.
  CHECK(server.get("/v1/items", {{"Authorization", "key-1"}}).status == 401);
  CHECK(server.get("/v1/items", {{"Authorization", " key-1 "}}).status == 401);
  // Another scheme with its parameters is no credential of this service's: an anonymous request.
  CHECK(server.get("/v1/items", {{"Authorization", "Basic dXNlcg=="}}).status == 200);
}

TEST_CASE("a known API key sent twice cannot pass its own limit as the unknown consumer's request",
          "[attack]") {
  sluice::ManualClock clock;
  const auto resolver = key_resolver(clock);
  std::vector<std::string> consumers;
  Limiter::Options options = api_key_options(resolver, "unknown");
  options.on_evaluated = [&](const httplib::Request&, const Limiter::LimitedRequest& limited) {
    consumers.push_back(std::string(limited.consumer.value_or("<none>")));
  };
  const TestServer server(Limiter(make_engine(api_key_config(100), clock), std::move(options)));
  CHECK(server.get("/v1/items", api_key("key-1")).status == 200);
  CHECK(server.get("/v1/items", api_key("key-1")).status == 200);
  CHECK(server.get("/v1/items", api_key("key-1")).status == 429);  // the key's 2 per minute
  consumers.clear();
  // The server's own handler reads the first value (get_header_value): key-1 again. The unknown
  // consumer's bucket by address must not serve it past the key's limit.
  const httplib::Response twice =
      server.get("/v1/items", {{"X-Api-Key", "key-1"}, {"X-Api-Key", "key-1"}});
  CHECK(twice.status == 401);
  CHECK(twice.body == "{\"error\":\"unknown credential\"}\n");
  CHECK(server.get("/v1/items", {{"X-Api-Key", "key-1"}, {"X-Api-Key", "key-2"}}).status == 401);
  CHECK(consumers == std::vector<std::string>{"<none>", "<none>"});  // no class's bundles
}

TEST_CASE(
    "a bearer token after several spaces is that token and one followed by another word is "
    "refused",
    "[attack]") {
  sluice::ManualClock clock;
  const auto resolver = key_resolver(clock);
  Limiter::Options options = options_with();  // the credential of Authorization: Bearer
  options.consumer_of = resolver;
  options.unknown_consumer = "unknown";
  const TestServer server(Limiter(make_engine(api_key_config(100), clock), std::move(options)));
  const httplib::Headers bearer = {{"Authorization", "Bearer key-1"}};
  CHECK(server.get("/v1/items", bearer).status == 200);
  CHECK(server.get("/v1/items", bearer).status == 200);
  CHECK(server.get("/v1/items", bearer).status == 429);  // the key's 2 per minute
  // RFC 6750 allows one or more spaces after the scheme: a server that follows it reads key-1.
  CHECK(server.get("/v1/items", {{"Authorization", "Bearer   key-1"}}).status == 429);
  // A server that splits on whitespace may read key-1 here too: ambiguous, refused.
  const httplib::Response two_words =
      server.get("/v1/items", {{"Authorization", "Bearer key-1 key-9"}});
  CHECK(two_words.status == 401);
  CHECK(two_words.body == "{\"error\":\"unknown credential\"}\n");
}

TEST_CASE("a known API key followed by a NUL byte cannot pass its own limit", "[attack]") {
  sluice::ManualClock clock;
  const auto resolver = key_resolver(clock);
  std::vector<std::string> read_by_server;  // the value as a handler's get_header_value reads it
  std::vector<std::string> presented;       // the credential as the limiter reads it
  Limiter::Options options = api_key_options(resolver, "unknown");
  options.on_evaluated = [&](const httplib::Request& request,
                             const Limiter::LimitedRequest& limited) {
    read_by_server.push_back(request.get_header_value("X-Api-Key"));
    presented.push_back(std::string(limited.credential.value_or("<none>")));
  };
  const TestServer server(Limiter(make_engine(api_key_config(100), clock), std::move(options)));
  CHECK(server.get("/v1/items", api_key("key-1")).status == 200);
  CHECK(server.get("/v1/items", api_key("key-1")).status == 200);
  CHECK(server.get("/v1/items", api_key("key-1")).status == 429);  // the key's 2 per minute
  // cpp-httplib decodes %00 in a header value; get_header_value stops at the NUL: key-1.
  CHECK(server.get("/v1/items", api_key("key-1%00x")).status == 401);
  REQUIRE(read_by_server.size() == 4);
  CHECK(read_by_server.back() == "key-1");
  CHECK(presented.back() != "key-1");  // the limiter saw other bytes than the handler reads
}
