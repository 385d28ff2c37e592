// The Envoy rate limit service (sluice/envoy.hpp) driven over gRPC on 127.0.0.1 by a client
// generated from the same protos, through the reference-format fixtures in tests/envoy/config.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "promtool.hpp"
#include "sluice/clock.hpp"
#include "sluice/envoy.hpp"
#ifdef SLUICE_TEST_REDIS
#include "redis_cluster.hpp"
#include "redis_fixture.hpp"
#include "sluice/redis.hpp"
#include "sluice/redis/engine_backend.hpp"
#endif

using namespace std::chrono_literals;

namespace {

namespace rls = ::envoy::service::ratelimit::v3;
using Backend = sluice::InMemoryBackend<sluice::ManualClock>;
constexpr auto kOk = rls::RateLimitResponse::OK;
constexpr auto kOverLimit = rls::RateLimitResponse::OVER_LIMIT;

sluice::envoy::ServiceConfig fixtures() {
  absl::StatusOr<sluice::envoy::ServiceConfig> config =
      sluice::envoy::load_config_directory(SLUICE_ENVOY_CONFIG_DIR);
  REQUIRE(config.ok());
  return *config;
}

// A limiter over `config` served on an ephemeral port of 127.0.0.1, and a client of it.
template <class B>
class BasicEnvoyServer {
 public:
  BasicEnvoyServer(const sluice::envoy::ServiceConfig& config,
                   typename sluice::envoy::BasicLimiter<B>::Options options) {
    auto created = sluice::envoy::BasicLimiter<B>::create(config, std::move(options));
    INFO(created.status());
    REQUIRE(created.ok());
    limiter_ = *std::move(created);
    service_ = std::make_unique<sluice::envoy::BasicRateLimitService<B>>(*limiter_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    REQUIRE(server_ != nullptr);
    REQUIRE(port != 0);
    stub_ = rls::RateLimitService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  BasicEnvoyServer(const BasicEnvoyServer&) = delete;
  BasicEnvoyServer& operator=(const BasicEnvoyServer&) = delete;
  ~BasicEnvoyServer() { server_->Shutdown(std::chrono::system_clock::now() + 5s); }

  grpc::Status call(const rls::RateLimitRequest& request, rls::RateLimitResponse& response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 20s);
    return stub_->ShouldRateLimit(&context, request, &response);
  }
  // A call that must succeed.
  rls::RateLimitResponse ok(const rls::RateLimitRequest& request) {
    rls::RateLimitResponse response;
    const grpc::Status status = call(request, response);
    INFO(status.error_message());
    REQUIRE(status.ok());
    REQUIRE(response.statuses_size() == request.descriptors_size());
    return response;
  }

  sluice::envoy::BasicLimiter<B>& limiter() { return *limiter_; }

 private:
  std::unique_ptr<sluice::envoy::BasicLimiter<B>> limiter_;
  std::unique_ptr<sluice::envoy::BasicRateLimitService<B>> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<rls::RateLimitService::Stub> stub_;
};

struct WithManualClock {
  sluice::ManualClock clock_;
};

// In memory, on a manual clock.
class EnvoyServer : private WithManualClock, public BasicEnvoyServer<Backend> {
 public:
  explicit EnvoyServer(const sluice::envoy::ServiceConfig& config, bool headers = false)
      : BasicEnvoyServer<Backend>(config,
                                  {.response_headers = headers, .backend = {.clock = clock_}}) {}
  sluice::ManualClock& clock() { return clock_; }
};

using Entries = std::initializer_list<std::pair<const char*, const char*>>;

// Adds a descriptor of `entries` to `request`.
envoy::extensions::common::ratelimit::v3::RateLimitDescriptor& add(rls::RateLimitRequest& request,
                                                                   Entries entries) {
  auto* d = request.add_descriptors();
  for (const auto& [key, value] : entries) {
    auto* e = d->add_entries();
    e->set_key(key);
    e->set_value(value);
  }
  return *d;
}

rls::RateLimitRequest request(const char* domain, std::initializer_list<Entries> descriptors,
                              std::uint32_t hits = 0) {
  rls::RateLimitRequest r;
  r.set_domain(domain);
  r.set_hits_addend(hits);
  for (const Entries& e : descriptors) add(r, e);
  return r;
}

std::int64_t reset_ms(const rls::RateLimitResponse::DescriptorStatus& s) {
  return s.duration_until_reset().seconds() * 1000 + s.duration_until_reset().nanos() / 1'000'000;
}

}  // namespace

TEST_CASE("envoy: a key without a value counts each value apart", "[envoy]") {
  EnvoyServer server(fixtures());
  const auto from = [](const char* ip) {
    return request("edge_proxy_per_ip", {{{"remote_address", ip}}});
  };
  rls::RateLimitResponse first = server.ok(from("10.0.0.1"));
  CHECK(first.overall_code() == kOk);
  const auto& s = first.statuses(0);
  CHECK(s.code() == kOk);
  CHECK(s.current_limit().requests_per_unit() == 10);
  CHECK(s.current_limit().unit() == rls::RateLimitResponse::RateLimit::SECOND);
  CHECK(s.current_limit().name() == "edge_proxy_per_ip.remote_address");
  CHECK(s.limit_remaining() == 9);
  CHECK(reset_ms(s) == 100);  // one hit of 10 per second refills in 100 ms
  for (int i = 0; i < 9; ++i) CHECK(server.ok(from("10.0.0.1")).overall_code() == kOk);
  rls::RateLimitResponse over = server.ok(from("10.0.0.1"));
  CHECK(over.overall_code() == kOverLimit);
  CHECK(over.statuses(0).code() == kOverLimit);
  CHECK(over.statuses(0).limit_remaining() == 0);
  CHECK(server.ok(from("10.0.0.2")).overall_code() == kOk);
  server.clock().advance(100ms);  // one hit's worth back
  CHECK(server.ok(from("10.0.0.1")).overall_code() == kOk);
  CHECK(server.ok(from("10.0.0.1")).overall_code() == kOverLimit);
}

TEST_CASE("envoy: an exact value wins over the key alone, and a limit of 0 denies", "[envoy]") {
  EnvoyServer server(fixtures());
  rls::RateLimitResponse r =
      server.ok(request("edge_proxy_per_ip", {{{"remote_address", "50.0.0.5"}}}));
  CHECK(r.overall_code() == kOverLimit);
  CHECK(r.statuses(0).current_limit().requests_per_unit() == 0);
  CHECK(r.statuses(0).current_limit().name() == "edge_proxy_per_ip.remote_address_50.0.0.5");
}

TEST_CASE("envoy: a limit applies only where the descriptor ends (most specific)", "[envoy]") {
  EnvoyServer server(fixtures());
  rls::RateLimitResponse r =
      server.ok(request("messaging", {{{"message_type", "marketing"}, {"to_number", "555"}},
                                      {{"to_number", "555"}},
                                      {{"message_type", "marketing"}},
                                      {{"message_type", "other"}, {"to_number", "555"}},
                                      {{"to_number", "555"}, {"extra", "x"}}}));
  CHECK(r.overall_code() == kOk);
  CHECK(r.statuses(0).current_limit().requests_per_unit() == 5);
  CHECK(r.statuses(0).current_limit().unit() == rls::RateLimitResponse::RateLimit::DAY);
  CHECK(r.statuses(0).limit_remaining() == 4);
  CHECK(r.statuses(1).current_limit().requests_per_unit() == 100);
  CHECK(r.statuses(1).limit_remaining() == 99);
  for (int i : {2, 3, 4}) {
    INFO(i);
    CHECK_FALSE(r.statuses(i).has_current_limit());
    CHECK(r.statuses(i).code() == kOk);
    CHECK(r.statuses(i).limit_remaining() == 0);
  }
}

TEST_CASE("envoy: an over-limit request consumes nothing on any descriptor", "[envoy]") {
  EnvoyServer server(fixtures());
  const auto both = request(
      "messaging", {{{"message_type", "marketing"}, {"to_number", "1"}}, {{"to_number", "1"}}});
  for (int i = 0; i < 5; ++i) CHECK(server.ok(both).overall_code() == kOk);
  rls::RateLimitResponse over = server.ok(both);
  CHECK(over.overall_code() == kOverLimit);
  CHECK(over.statuses(0).code() == kOverLimit);
  CHECK(over.statuses(0).limit_remaining() == 0);
  CHECK(over.statuses(1).code() == kOk);
  CHECK(over.statuses(1).limit_remaining() == 95);  // as it stands: this request took nothing
  rls::RateLimitResponse alone = server.ok(request("messaging", {{{"to_number", "1"}}}));
  CHECK(alone.statuses(0).limit_remaining() == 94);
}

TEST_CASE("envoy: hits_addend counts per request, a descriptor's overrides it", "[envoy]") {
  EnvoyServer server(fixtures());
  auto r = request("messaging", {{{"to_number", "a"}}, {{"to_number", "b"}}}, 7);
  add(r, {{"to_number", "c"}}).mutable_hits_addend()->set_value(20);
  add(r, {{"to_number", "d"}}).mutable_hits_addend()->set_value(0);
  rls::RateLimitResponse out = server.ok(r);
  CHECK(out.statuses(0).limit_remaining() == 93);
  CHECK(out.statuses(1).limit_remaining() == 93);
  CHECK(out.statuses(2).limit_remaining() == 80);
  CHECK(out.statuses(3).limit_remaining() == 100);  // a descriptor's 0 only checks
  CHECK(server.ok(request("messaging", {{{"to_number", "e"}}}, 0)).statuses(0).limit_remaining() ==
        99);  // the request's 0 is 1
}

TEST_CASE("envoy: a descriptor's hits_addend of 0 checks its limit and counts nothing",
          "[envoy][attack]") {
  // As the reference service reads it: a descriptor that sets its hits_addend to 0 asks whether
  // its limit is over, without adding a hit (a check before the cost is known). 100 such checks
  // must leave the number's 100 a day untouched for the messages that do count.
  EnvoyServer server(fixtures());
  auto check = request("messaging", {});
  add(check, {{"to_number", "555"}}).mutable_hits_addend()->set_value(0);
  rls::RateLimitResponse checked;
  for (int i = 0; i < 100; ++i) checked = server.ok(check);
  CHECK(checked.overall_code() == kOk);
  CHECK(checked.statuses(0).limit_remaining() == 100);
  rls::RateLimitResponse sent = server.ok(request("messaging", {{{"to_number", "555"}}}));
  CHECK(sent.overall_code() == kOk);
  CHECK(sent.statuses(0).limit_remaining() == 99);
  // A limit of 0 is over as it stands, checked or not.
  auto blocked = request("edge_proxy_per_ip", {});
  add(blocked, {{"remote_address", "50.0.0.5"}}).mutable_hits_addend()->set_value(0);
  CHECK(server.ok(blocked).overall_code() == kOverLimit);
}

TEST_CASE("envoy: more hits than a limit's burst answer OVER_LIMIT and consume nothing",
          "[envoy]") {
  EnvoyServer server(fixtures());
  auto r = request("messaging",
                   {{{"to_number", "9"}}, {{"message_type", "marketing"}, {"to_number", "9"}}});
  r.mutable_descriptors(1)->mutable_hits_addend()->set_value(6);  // the marketing limit is 5
  rls::RateLimitResponse out = server.ok(r);
  CHECK(out.overall_code() == kOverLimit);
  CHECK(out.statuses(0).code() == kOk);
  CHECK(out.statuses(0).limit_remaining() == 100);
  CHECK(out.statuses(1).code() == kOverLimit);
  CHECK(out.statuses(1).limit_remaining() == 5);
  CHECK(server.ok(request("messaging", {{{"to_number", "9"}}})).statuses(0).limit_remaining() ==
        99);
}

TEST_CASE("envoy: descriptors of one request on the same counter are decided together", "[envoy]") {
  EnvoyServer server(fixtures());
  const auto twice = request("mongo_cps", {{{"database", "tmp_a"}}, {{"database", "tmp_a"}}});
  rls::RateLimitResponse r = server.ok(twice);  // 2 hits of a burst of 2
  CHECK(r.overall_code() == kOk);
  CHECK(r.statuses(0).limit_remaining() == 0);
  CHECK(r.statuses(1).limit_remaining() == 0);
  server.clock().advance(500ms);                   // one hit back
  rls::RateLimitResponse over = server.ok(twice);  // 2 hits do not fit in 1
  CHECK(over.overall_code() == kOverLimit);
  CHECK(over.statuses(0).code() == kOverLimit);
  CHECK(server.ok(request("mongo_cps", {{{"database", "tmp_a"}}})).overall_code() == kOk);
  // Three at once never fit a burst of 2: nothing is taken.
  const auto thrice = request(
      "mongo_cps", {{{"database", "tmp_b"}}, {{"database", "tmp_b"}}, {{"database", "tmp_b"}}});
  rls::RateLimitResponse never = server.ok(thrice);
  CHECK(never.overall_code() == kOverLimit);
  CHECK(never.statuses(2).limit_remaining() == 2);
}

TEST_CASE("envoy: a limit override applies with a counter of its own", "[envoy]") {
  EnvoyServer server(fixtures());
  auto with_override = [](Entries entries) {
    rls::RateLimitRequest r = request("messaging", {});
    auto& d = add(r, entries);
    d.mutable_limit()->set_requests_per_unit(2);
    d.mutable_limit()->set_unit(envoy::type::v3::MINUTE);
    return r;
  };
  // Where nothing is configured.
  CHECK(server.ok(with_override({{"unconfigured", "x"}})).statuses(0).limit_remaining() == 1);
  CHECK(server.ok(with_override({{"unconfigured", "x"}})).overall_code() == kOk);
  rls::RateLimitResponse over = server.ok(with_override({{"unconfigured", "x"}}));
  CHECK(over.overall_code() == kOverLimit);
  CHECK(over.statuses(0).current_limit().requests_per_unit() == 2);
  CHECK(over.statuses(0).current_limit().unit() == rls::RateLimitResponse::RateLimit::MINUTE);
  // Where a limit is configured: the override decides, and the configured counter is untouched.
  CHECK(server.ok(with_override({{"to_number", "7"}})).statuses(0).limit_remaining() == 1);
  CHECK(server.ok(request("messaging", {{{"to_number", "7"}}})).statuses(0).limit_remaining() ==
        99);
}

TEST_CASE("envoy: an override of 0 denies and one of 2^32-1 per second is honoured", "[envoy]") {
  EnvoyServer server(fixtures());
  auto with_override = [](std::uint32_t n) {
    rls::RateLimitRequest r = request("messaging", {});
    auto& d = add(r, {{"to_number", "8"}});
    d.mutable_limit()->set_requests_per_unit(n);
    d.mutable_limit()->set_unit(envoy::type::v3::SECOND);
    return r;
  };
  rls::RateLimitResponse none = server.ok(with_override(0));
  CHECK(none.overall_code() == kOverLimit);
  CHECK(none.statuses(0).current_limit().requests_per_unit() == 0);
  rls::RateLimitResponse most = server.ok(with_override(4'294'967'295U));
  CHECK(most.overall_code() == kOk);
  CHECK(most.statuses(0).current_limit().requests_per_unit() == 4'294'967'295U);
  CHECK(most.statuses(0).limit_remaining() == 4'294'967'294U);
  CHECK(server.limiter().ignored_overrides() == 0);
  // The configured 100 a day was not touched by either.
  CHECK(server.ok(request("messaging", {{{"to_number", "8"}}})).statuses(0).limit_remaining() ==
        99);
}

TEST_CASE("envoy: an unknown domain answers OK for every descriptor", "[envoy]") {
  EnvoyServer server(fixtures());
  rls::RateLimitResponse r =
      server.ok(request("nobody", {{{"remote_address", "1"}}, {{"to_number", "2"}}}));
  CHECK(r.overall_code() == kOk);
  for (const auto& s : r.statuses()) {
    CHECK(s.code() == kOk);
    CHECK_FALSE(s.has_current_limit());
  }
  // Counted, so that a domain misspelt on either side shows instead of limiting nothing quietly.
  server.ok(request("edge_proxy_per_ip", {{{"remote_address", "10.0.0.1"}}}));
  CHECK(server.limiter().unknown_domain_calls() == 1);
  std::string metrics;
  sluice::envoy::append_prometheus_text(metrics, server.limiter());
  CHECK(metrics.find("\nsluice_envoy_unknown_domain_calls_total 1\n") != std::string::npos);
  sluice_test::check_promtool_accepts(metrics);
}

TEST_CASE("envoy: shadow mode counts without denying and unlimited never limits", "[envoy]") {
  EnvoyServer server(fixtures());
  const auto r = request("messaging", {{{"sender", "s"}}, {{"internal", "true"}}});
  rls::RateLimitResponse first = server.ok(r);
  CHECK(first.statuses(0).limit_remaining() == 0);
  rls::RateLimitResponse second = server.ok(r);
  CHECK(second.overall_code() == kOk);
  CHECK(second.statuses(0).code() == kOk);
  CHECK(second.statuses(0).current_limit().requests_per_unit() == 1);
  CHECK(second.statuses(1).code() == kOk);
  CHECK_FALSE(second.statuses(1).has_current_limit());
  CHECK(second.statuses(1).limit_remaining() == 4294967295u);
  bool found = false;
  for (const sluice::envoy::LimitStats& s : server.limiter().stats()) {
    if (s.label != "messaging.sender") continue;
    found = true;
    CHECK(s.total_hits == 2);
    CHECK(s.shadow_mode == 1);
    CHECK(s.over_limit == 0);
  }
  CHECK(found);
  std::string metrics;
  sluice::envoy::append_prometheus_text(metrics, server.limiter());
  CHECK(metrics.find("sluice_envoy_shadow_mode_total{limit=\"messaging.sender\"} 1\n") !=
        std::string::npos);
  CHECK(metrics.find("sluice_envoy_hits_total{limit=\"messaging.internal_true\"} 2\n") !=
        std::string::npos);
  CHECK(metrics.find("sluice_envoy_backend_errors_total{failure_mode=\"fail_open\"} 0\n") !=
        std::string::npos);
}

TEST_CASE("envoy: a limit replaced by another matched limit does not apply", "[envoy]") {
  EnvoyServer server(fixtures());
  const auto both = request("mongo_cps", {{{"tenant", "t"}}, {{"tenant_vip", "t"}}});
  for (int i = 0; i < 5; ++i) {
    rls::RateLimitResponse r = server.ok(both);
    CHECK(r.overall_code() == kOk);
    CHECK_FALSE(r.statuses(0).has_current_limit());
    CHECK(r.statuses(1).current_limit().name() == "vip");
  }
  // Alone, per_tenant applies (3 a minute).
  for (int i = 0; i < 3; ++i) {
    CHECK(server.ok(request("mongo_cps", {{{"tenant", "t"}}})).overall_code() == kOk);
  }
  CHECK(server.ok(request("mongo_cps", {{{"tenant", "t"}}})).overall_code() == kOverLimit);
}

TEST_CASE("envoy: a value ending in * matches by prefix", "[envoy]") {
  EnvoyServer server(fixtures());
  const auto tmp = request("mongo_cps", {{{"database", "tmp_42"}}});
  CHECK(server.ok(tmp).statuses(0).current_limit().requests_per_unit() == 2);
  CHECK(server.ok(tmp).overall_code() == kOk);
  CHECK(server.ok(tmp).overall_code() == kOverLimit);
  CHECK(server.ok(request("mongo_cps", {{{"database", "users"}}})).statuses(0).limit_remaining() ==
        499);
}

TEST_CASE("envoy: entries whose values join alike count apart", "[envoy]") {
  // A client picks the bytes of its values, separators and NUL included: no pair of entry lists
  // may land on one counter, or one client could spend another's.
  using sluice::envoy::Entry;
  const sluice::envoy::ServiceConfig config{
      .domains = {
          {.domain = "d",
           .descriptors = {{.key = "a",
                            .descriptors = {{.key = "b",
                                             .rate_limit = sluice::envoy::Limit{
                                                 .windows = {{.requests = 1, .period = 1h}}}}}}}}}};
  sluice::ManualClock clock;
  auto limiter =
      sluice::envoy::BasicLimiter<Backend>::create(config, {.backend = {.clock = clock}});
  REQUIRE(limiter.ok());
  using namespace std::string_view_literals;
  const std::pair<std::string_view, std::string_view> values[] = {
      {"x|"sv, "y"sv},  {"x"sv, "|y"sv},          {"x\0"sv, "y"sv},
      {"x"sv, "\0y"sv}, {"x\x01\0\0\0"sv, "y"sv}, {"x"sv, "\x01\0\0\0y"sv}};
  for (const auto& [a, b] : values) {
    const Entry entries[] = {{"a", a}, {"b", b}};
    const sluice::envoy::Descriptor d[] = {{.entries = entries}};
    sluice::envoy::Response r;
    REQUIRE((*limiter)->should_rate_limit({.domain = "d", .descriptors = d}, r).ok());
    CHECK(r.overall_code == sluice::envoy::Code::kOk);  // each the first hit of its own counter
  }
}

TEST_CASE("envoy: sluice's periods, bursts and stacked windows", "[envoy]") {
  EnvoyServer server(fixtures());
  // 100 per 5 minutes with a burst of 10: reported as 20 a minute.
  const auto key = request("sluice_api", {{{"api_key", "k"}}});
  rls::RateLimitResponse first = server.ok(key);
  CHECK(first.statuses(0).current_limit().name() == "five_minutes");
  CHECK(first.statuses(0).current_limit().unit() == rls::RateLimitResponse::RateLimit::MINUTE);
  CHECK(first.statuses(0).current_limit().requests_per_unit() == 20);
  CHECK(first.statuses(0).limit_remaining() == 9);
  CHECK(reset_ms(first.statuses(0)) == 3000);  // 5 min / 100
  // 2 a second and 5 a minute: the minute binds after five.
  const auto user = request("sluice_api", {{{"user", "u"}}});
  for (int i = 0; i < 5; ++i) {
    CHECK(server.ok(user).overall_code() == kOk);
    server.clock().advance(1s);
  }
  rls::RateLimitResponse over = server.ok(user);
  CHECK(over.overall_code() == kOverLimit);
  CHECK(over.statuses(0).current_limit().unit() == rls::RateLimitResponse::RateLimit::MINUTE);
  CHECK(over.statuses(0).current_limit().requests_per_unit() == 5);
}

TEST_CASE("envoy: a fixed window counts per window and reports the time to its end", "[envoy]") {
  // tests/envoy/config/sluice_fixed.yaml: a fixed window of 3 per 10 s ("tenant") and a GCRA
  // limit of 2 a second ("user").
  EnvoyServer server(fixtures(), /*headers=*/true);
  const auto tenant = request("sluice_fixed", {{{"tenant", "t"}}});
  rls::RateLimitResponse first = server.ok(tenant);
  CHECK(first.overall_code() == kOk);
  CHECK(first.statuses(0).current_limit().name() == "tenant_window");
  // 3 per 10 s: nearest unit a minute, 18 a minute.
  CHECK(first.statuses(0).current_limit().unit() == rls::RateLimitResponse::RateLimit::MINUTE);
  CHECK(first.statuses(0).current_limit().requests_per_unit() == 18);
  CHECK(first.statuses(0).limit_remaining() == 2);
  CHECK(reset_ms(first.statuses(0)) == 10'000);  // the window opened with this call
  server.clock().advance(4s);
  CHECK(server.ok(tenant).statuses(0).limit_remaining() == 1);  // no refill within the window
  rls::RateLimitResponse last = server.ok(tenant);
  CHECK(last.statuses(0).limit_remaining() == 0);
  CHECK(reset_ms(last.statuses(0)) == 6'000);
  rls::RateLimitResponse over = server.ok(tenant);
  CHECK(over.overall_code() == kOverLimit);
  CHECK(over.statuses(0).code() == kOverLimit);
  CHECK(over.statuses(0).limit_remaining() == 0);
  CHECK(reset_ms(over.statuses(0)) == 6'000);
  bool retry_after = false;
  for (const auto& h : over.response_headers_to_add()) {
    if (h.key() == "Retry-After") retry_after = h.value() == "6";
  }
  CHECK(retry_after);
  server.clock().advance(6s - 1ns);
  CHECK(server.ok(tenant).overall_code() == kOverLimit);  // the window's last nanosecond
  server.clock().advance(1ns);
  rls::RateLimitResponse next = server.ok(tenant);  // a new window opens
  CHECK(next.overall_code() == kOk);
  CHECK(next.statuses(0).limit_remaining() == 2);
  CHECK(reset_ms(next.statuses(0)) == 10'000);
}

TEST_CASE("envoy: a fixed window and a GCRA limit are decided all or nothing", "[envoy]") {
  EnvoyServer server(fixtures());
  // The GCRA limit denies: the fixed window counts nothing and reports itself as it stands.
  for (int i = 0; i < 2; ++i)
    REQUIRE(server.ok(request("sluice_fixed", {{{"user", "u"}}})).overall_code() == kOk);
  rls::RateLimitResponse denied =
      server.ok(request("sluice_fixed", {{{"tenant", "t"}}, {{"user", "u"}}}));
  CHECK(denied.overall_code() == kOverLimit);
  CHECK(denied.statuses(0).code() == kOk);
  CHECK(denied.statuses(0).limit_remaining() == 3);
  CHECK(reset_ms(denied.statuses(0)) == 0);  // nothing counted: no window open
  CHECK(denied.statuses(1).code() == kOverLimit);
  CHECK(server.ok(request("sluice_fixed", {{{"tenant", "t"}}})).statuses(0).limit_remaining() == 2);
  // The fixed window denies: the GCRA limit consumes nothing.
  const auto t2 = request("sluice_fixed", {{{"tenant", "t2"}}});
  for (int i = 0; i < 3; ++i) REQUIRE(server.ok(t2).overall_code() == kOk);
  denied = server.ok(request("sluice_fixed", {{{"tenant", "t2"}}, {{"user", "u2"}}}));
  CHECK(denied.overall_code() == kOverLimit);
  CHECK(denied.statuses(0).code() == kOverLimit);
  CHECK(denied.statuses(1).code() == kOk);
  CHECK(denied.statuses(1).limit_remaining() == 2);
  CHECK(server.ok(request("sluice_fixed", {{{"user", "u2"}}})).statuses(0).limit_remaining() == 1);
}

TEST_CASE("envoy: response headers describe the binding limit when switched on", "[envoy]") {
  EnvoyServer off(fixtures());
  CHECK(off.ok(request("mongo_cps", {{{"database", "tmp_1"}}})).response_headers_to_add_size() ==
        0);
  EnvoyServer server(fixtures(), true);
  const auto tmp = request("mongo_cps", {{{"database", "tmp_1"}}, {{"database", "users"}}});
  rls::RateLimitResponse ok = server.ok(tmp);
  REQUIRE(ok.response_headers_to_add_size() == 2);
  CHECK(ok.response_headers_to_add(0).key() == "RateLimit-Policy");
  CHECK(ok.response_headers_to_add(0).value() == "\"mongo_cps.database_tmp_*\";q=2;w=1");
  CHECK(ok.response_headers_to_add(1).key() == "RateLimit");
  CHECK(ok.response_headers_to_add(1).value() == "\"mongo_cps.database_tmp_*\";r=1;t=1");
  server.ok(tmp);
  rls::RateLimitResponse over = server.ok(tmp);
  REQUIRE(over.response_headers_to_add_size() == 3);
  CHECK(over.response_headers_to_add(1).value() == "\"mongo_cps.database_tmp_*\";r=0;t=1");
  CHECK(over.response_headers_to_add(2).key() == "Retry-After");
  CHECK(over.response_headers_to_add(2).value() == "1");
}

TEST_CASE("envoy: requests beyond the bounds answer INVALID_ARGUMENT", "[envoy]") {
  EnvoyServer server(fixtures());
  auto refused = [&](const rls::RateLimitRequest& r) {
    rls::RateLimitResponse response;
    const grpc::Status status = server.call(r, response);
    INFO(status.error_message());
    return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT;
  };
  CHECK(refused(request("", {{{"a", "b"}}})));
  CHECK(refused(request("messaging", {})));
  CHECK(refused(request("messaging", {{}})));
  CHECK(refused(request("messaging", {{{"", "b"}}})));
  CHECK(refused(request(std::string(257, 'd').c_str(), {{{"a", "b"}}})));
  CHECK(refused(request("messaging", {{{std::string(257, 'k').c_str(), "v"}}})));
  rls::RateLimitRequest many = request("messaging", {});
  for (int i = 0; i < 65; ++i) add(many, {{"to_number", "1"}});
  CHECK(refused(many));
  // Far beyond the bounds, the same reasons (the service converts one past each bound).
  rls::RateLimitResponse response;
  rls::RateLimitRequest more = request("messaging", {});
  for (int i = 0; i < 100'000; ++i) more.add_descriptors();
  CHECK(server.call(more, response).error_message() == "more than 64 descriptors");
  rls::RateLimitRequest wide = request("messaging", {{{"to_number", "1"}}, {}});
  for (int i = 0; i < 100'000; ++i) wide.mutable_descriptors(1)->add_entries()->set_key("k");
  CHECK(server.call(wide, response).error_message() == "descriptors[1] has more than 32 entries");
  // Nothing was counted by the refused requests.
  CHECK(server.ok(request("messaging", {{{"to_number", "1"}}})).statuses(0).limit_remaining() ==
        99);
}

TEST_CASE("envoy: a limit name that every answer would repeat is bounded at load",
          "[envoy][attack]") {
  // A limit's name goes into every status and RateLimit field that names the limit: a call of 64
  // descriptors under a 70 KB name makes an answer past gRPC's 4 MiB message limit, the call
  // fails, and a proxy that fails open admits it. A control byte in it breaks the fields.
  const auto with_name = [](const std::string& name) {
    return sluice::envoy::load_domain_config(
        absl::StrCat("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: \"", name,
                     "\", unit: second, requests_per_unit: 1}\n"),
        "d.yaml");
  };
  auto long_name = with_name(std::string(70'000, 'n'));
  REQUIRE(long_name.ok());
  auto limiter = sluice::envoy::Limiter::create({.domains = {*long_name}});
  CHECK(limiter.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(limiter.status().message(), "name"));
  auto control = with_name("a\\x1b[2Jb");  // YAML's escape: the ESC byte itself
  REQUIRE(control.ok());
  CHECK(sluice::envoy::Limiter::create({.domains = {*control}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  auto fine = with_name(std::string(256, 'n'));
  REQUIRE(fine.ok());
  CHECK(sluice::envoy::Limiter::create({.domains = {*fine}}).ok());
}

TEST_CASE("envoy: a domain or key no request may carry is refused when the limits are loaded",
          "[envoy][attack]") {
  // A call whose domain or key is past RequestBounds is answered INVALID_ARGUMENT, which a proxy
  // that fails open (Envoy's default) admits: a limit on such a domain or key would limit
  // nothing, so it is refused where it is configured instead.
  const std::string limit = "    rate_limit: {unit: second, requests_per_unit: 0}\n";
  const std::string long_domain(257, 'd');
  auto domain = sluice::envoy::load_domain_config(
      absl::StrCat("domain: ", long_domain, "\ndescriptors:\n  - key: k\n", limit), "d.yaml");
  REQUIRE(domain.ok());
  auto limiter = sluice::envoy::Limiter::create({.domains = {*domain}});
  CHECK(limiter.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(limiter.status().message(), "max_domain_bytes"));

  const std::string long_key(257, 'k');
  auto keyed = sluice::envoy::load_domain_config(
      absl::StrCat("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: ", long_key,
                   "\n", "    ", limit),
      "d.yaml");
  REQUIRE(keyed.ok());
  auto key_limiter = sluice::envoy::Limiter::create({.domains = {*keyed}});
  CHECK(key_limiter.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(key_limiter.status().message(), "max_key_bytes"));

  // Within the bounds, the same limits load, and wider bounds admit the longer ones.
  auto wide = sluice::envoy::Limiter::create(
      {.domains = {*domain, *keyed}}, {.bounds = {.max_domain_bytes = 257, .max_key_bytes = 257}});
  CHECK(wide.ok());
  if (wide.ok()) {
    const sluice::envoy::Entry entries[] = {{"k", "v"}};
    const sluice::envoy::Descriptor descriptors[] = {{.entries = entries}};
    sluice::envoy::Response response;
    REQUIRE((*wide)
                ->should_rate_limit({.domain = long_domain, .descriptors = descriptors}, response)
                .ok());
    CHECK(response.overall_code == sluice::envoy::Code::kOverLimit);
  }
}

TEST_CASE("envoy: a request beyond the bounds is refused before anything is allocated for it",
          "[envoy][attack]") {
  // gRPC accepts 4 MiB: two million empty descriptors, two bytes each on the wire and some 70
  // bytes each as a status, so the bounds must refuse such a request before its statuses exist.
  sluice::ManualClock clock;
  auto limiter =
      sluice::envoy::BasicLimiter<Backend>::create(fixtures(), {.backend = {.clock = clock}});
  REQUIRE(limiter.ok());
  const std::vector<sluice::envoy::Descriptor> descriptors(100'000);
  sluice::envoy::Response response;
  const absl::Status s =
      (*limiter)->should_rate_limit({.domain = "messaging", .descriptors = descriptors}, response);
  CHECK(s.message() == "more than 64 descriptors");
  CHECK(response.statuses.empty());
  CHECK(response.statuses.capacity() == 0);
}

TEST_CASE("envoy: a long value is decided, never an error that a proxy would admit", "[envoy]") {
  EnvoyServer server(fixtures());
  // A blocked address beside a path a client padded: the call is decided, the address denied.
  const std::string path = "/login?pad=" + std::string(70000, 'a');
  const auto padded =
      request("edge_proxy_per_ip", {{{"remote_address", "50.0.0.5"}}, {{"path", path.c_str()}}});
  rls::RateLimitResponse r = server.ok(padded);
  CHECK(r.overall_code() == kOverLimit);
  CHECK(r.statuses(0).code() == kOverLimit);
  CHECK(r.statuses(1).code() == kOk);  // no limit for `path`
  // A long value is counted under its own key like any other.
  const std::string long_address(70000, '7');
  const auto mine = request("edge_proxy_per_ip", {{{"remote_address", long_address.c_str()}}});
  CHECK(server.ok(mine).statuses(0).limit_remaining() == 9);
  CHECK(server.ok(mine).statuses(0).limit_remaining() == 8);
  CHECK(server.ok(request("edge_proxy_per_ip", {{{"remote_address", "7"}}}))
            .statuses(0)
            .limit_remaining() == 9);
}

TEST_CASE("envoy: a value that is not UTF-8 is decided, never an error that a proxy would admit",
          "[envoy][attack]") {
  // HTTP header values may hold any byte from 0x80 up (obs-text), and Envoy copies a header into
  // a descriptor's value as it came: a client that sends one must not turn the call, and with
  // it the blocked address beside it, into an error that Envoy's default failure mode admits.
  EnvoyServer server(fixtures());
  const auto padded = request("edge_proxy_per_ip", {{{"remote_address", "50.0.0.5"}},
                                                    {{"user_agent", "caf\xe9 \xff\xfe"}}});
  rls::RateLimitResponse r = server.ok(padded);
  CHECK(r.overall_code() == kOverLimit);
  CHECK(r.statuses(0).code() == kOverLimit);
  CHECK(r.statuses(1).code() == kOk);  // no limit for `user_agent`
  // A value that is not UTF-8 is counted under its own bytes like any other.
  const auto mine = request("edge_proxy_per_ip", {{{"remote_address", "10.0.0.\xff"}}});
  CHECK(server.ok(mine).statuses(0).limit_remaining() == 9);
  CHECK(server.ok(mine).statuses(0).limit_remaining() == 8);
  CHECK(server.ok(request("edge_proxy_per_ip", {{{"remote_address", "10.0.0.\xfe"}}}))
            .statuses(0)
            .limit_remaining() == 9);
}

TEST_CASE("envoy: an override of unknown unit is decided as if absent, never an error",
          "[envoy][attack]") {
  // An override comes from Envoy's metadata, which a filter may fill from anything: one without a
  // unit must not turn the call into an error that Envoy's default failure mode admits, the
  // blocked address beside it included.
  EnvoyServer server(fixtures());
  auto r = request("edge_proxy_per_ip",
                   {{{"remote_address", "50.0.0.5"}}, {{"remote_address", "10.0.0.1"}}});
  r.mutable_descriptors(1)->mutable_limit()->set_requests_per_unit(1000);  // unit UNKNOWN
  rls::RateLimitResponse out = server.ok(r);
  CHECK(out.overall_code() == kOverLimit);
  CHECK(out.statuses(0).code() == kOverLimit);
  CHECK(out.statuses(1).code() == kOk);
  CHECK(out.statuses(1).current_limit().requests_per_unit() == 10);  // the configured limit
  // A unit past Envoy's enum is unknown too.
  r.mutable_descriptors(1)->mutable_limit()->set_unit(
      static_cast<envoy::type::v3::RateLimitUnit>(99));
  CHECK(server.ok(r).overall_code() == kOverLimit);
  CHECK(server.limiter().ignored_overrides() == 2);
  std::string metrics;
  sluice::envoy::append_prometheus_text(metrics, server.limiter());
  CHECK(metrics.find("\nsluice_envoy_ignored_overrides_total 2\n") != std::string::npos);
}

TEST_CASE("envoy: overrides beyond the bound are decided as if absent", "[envoy]") {
  sluice::ManualClock clock;
  auto limiter = sluice::envoy::BasicLimiter<Backend>::create(
      fixtures(), {.bounds = {.max_overrides = 2}, .backend = {.clock = clock}});
  REQUIRE(limiter.ok());
  using sluice::envoy::Descriptor;
  using sluice::envoy::Entry;
  using sluice::envoy::LimitOverride;
  using sluice::envoy::Unit;
  const Entry junk[] = {{"junk", "x"}};
  const Entry blocked[] = {{"remote_address", "50.0.0.5"}};
  const Entry client[] = {{"remote_address", "10.0.0.1"}};
  sluice::envoy::Response r;
  for (std::uint32_t n : {1U, 2U, 3U}) {  // the third has no counter
    const Descriptor d[] = {
        {.entries = junk, .limit = LimitOverride{.requests_per_unit = n, .unit = Unit::kSecond}}};
    REQUIRE(
        (*limiter)->should_rate_limit({.domain = "edge_proxy_per_ip", .descriptors = d}, r).ok());
  }
  CHECK((*limiter)->ignored_overrides() == 1);
  // A new override now: the call is still decided, by the configured limits.
  const LimitOverride fresh{.requests_per_unit = 100, .unit = Unit::kMinute};
  const Descriptor both[] = {{.entries = blocked}, {.entries = client, .limit = fresh}};
  REQUIRE(
      (*limiter)->should_rate_limit({.domain = "edge_proxy_per_ip", .descriptors = both}, r).ok());
  CHECK(r.overall_code == sluice::envoy::Code::kOverLimit);
  REQUIRE(r.statuses[1].current_limit.has_value());
  CHECK(r.statuses[1].current_limit->requests_per_unit == 10);  // the configured 10 per second
  CHECK((*limiter)->ignored_overrides() == 2);
}

TEST_CASE("envoy: each override counts on its own, with no share carried between them", "[envoy]") {
  sluice::ManualClock clock;
  auto limiter = sluice::envoy::BasicLimiter<Backend>::create(
      fixtures(), {.response_headers = true, .backend = {.clock = clock}});
  REQUIRE(limiter.ok());
  using sluice::envoy::Descriptor;
  using sluice::envoy::Entry;
  using sluice::envoy::LimitOverride;
  using sluice::envoy::Unit;
  const Entry tenant[] = {{"tenant", "victim"}};
  sluice::envoy::Response r;
  const Descriptor one[] = {
      {.entries = tenant, .limit = LimitOverride{.requests_per_unit = 1, .unit = Unit::kSecond}}};
  REQUIRE((*limiter)->should_rate_limit({.domain = "messaging", .descriptors = one}, r).ok());
  REQUIRE(r.overall_code == sluice::envoy::Code::kOk);
  REQUIRE(r.headers.size() >= 1);
  CHECK(r.headers[0].value == "\"override.1/second\";q=1;w=1");
  // A second override of the same entries starts full: one hit of 1 per second is not a day
  // spent of 1,000 per day.
  const Descriptor big[] = {
      {.entries = tenant, .limit = LimitOverride{.requests_per_unit = 1000, .unit = Unit::kDay}}};
  REQUIRE((*limiter)->should_rate_limit({.domain = "messaging", .descriptors = big}, r).ok());
  CHECK(r.overall_code == sluice::envoy::Code::kOk);
  CHECK(r.statuses[0].limit_remaining == 999);
  CHECK(r.headers[0].value == "\"override.1000/day\";q=1000;w=86400");
}

TEST_CASE("envoy: a huge hits_addend saturates the counters instead of wrapping them", "[envoy]") {
  sluice::ManualClock clock;
  auto limiter =
      sluice::envoy::BasicLimiter<Backend>::create(fixtures(), {.backend = {.clock = clock}});
  REQUIRE(limiter.ok());
  const sluice::envoy::Entry a[] = {{"remote_address", "10.0.0.1"}};
  const sluice::envoy::Entry b[] = {{"remote_address", "10.0.0.2"}};
  const sluice::envoy::Descriptor huge[] = {
      {.entries = a, .hits_addend = std::numeric_limits<std::uint64_t>::max()}};
  const sluice::envoy::Descriptor one[] = {{.entries = b}};
  sluice::envoy::Response r;
  REQUIRE(
      (*limiter)->should_rate_limit({.domain = "edge_proxy_per_ip", .descriptors = huge}, r).ok());
  CHECK(r.overall_code == sluice::envoy::Code::kOverLimit);
  REQUIRE(
      (*limiter)->should_rate_limit({.domain = "edge_proxy_per_ip", .descriptors = one}, r).ok());
  bool found = false;
  for (const sluice::envoy::LimitStats& s : (*limiter)->stats()) {
    if (s.label != "edge_proxy_per_ip.remote_address") continue;
    found = true;
    CHECK(s.total_hits == std::numeric_limits<std::uint64_t>::max());
    CHECK(s.over_limit == std::numeric_limits<std::uint64_t>::max());
    CHECK(s.within_limit == 1);
  }
  CHECK(found);
}

TEST_CASE("envoy: limits whose paths read alike get labels of their own", "[envoy]") {
  auto domain = sluice::envoy::load_domain_config(R"(domain: d
descriptors:
  - key: a
    value: b_c
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a_b
    value: c
    rate_limit: {unit: second, requests_per_unit: 1}
)",
                                                  "d.yaml");
  REQUIRE(domain.ok());
  auto limiter = sluice::envoy::Limiter::create({.domains = {*domain}});
  REQUIRE(limiter.ok());
  const std::vector<sluice::envoy::LimitStats> stats = (*limiter)->stats();
  REQUIRE(stats.size() == 2);
  CHECK(stats[0].label == "d.a_b_c");
  CHECK(stats[1].label == "d.a_b_c#2");
}

TEST_CASE("envoy: a limit on a value that is not UTF-8 is reported in UTF-8", "[envoy][attack]") {
  // A file in Latin-1 blocks one user agent byte for byte. The limit's path names it in
  // current_limit.name, a protobuf string: with the raw byte there, Envoy could not read the
  // answer and its default failure mode would admit the very client the limit blocks.
  const std::string latin1 = "caf\xe9";  // "café" in Latin-1
  const std::string name = "t\xff";
  auto domain = sluice::envoy::load_domain_config(
      absl::StrCat("domain: d\ndescriptors:\n", "  - key: user_agent\n    value: ", latin1, "\n",
                   "    rate_limit: {unit: second, requests_per_unit: 0}\n",
                   "  - key: tenant\n    rate_limit: {name: \"", name, "\", unit: second, ",
                   "requests_per_unit: 1}\n",
                   "  - key: vip\n    rate_limit: {unit: second, requests_per_unit: 5, ",
                   "replaces: [{name: \"", name, "\"}]}\n"),
      "d.yaml");
  REQUIRE(domain.ok());
  EnvoyServer server({.domains = {*domain}});
  rls::RateLimitResponse blocked = server.ok(request("d", {{{"user_agent", latin1.c_str()}}}));
  CHECK(blocked.overall_code() == kOverLimit);
  CHECK(blocked.statuses(0).current_limit().name() == "d.user_agent_caf\\xe9");
  rls::RateLimitResponse named = server.ok(request("d", {{{"tenant", "a"}}}));
  CHECK(named.statuses(0).current_limit().name() == "t\\xff");
  // A replaces entry still names the limit it replaces.
  rls::RateLimitResponse both = server.ok(request("d", {{{"tenant", "a"}}, {{"vip", "a"}}}));
  CHECK(both.overall_code() == kOk);
  CHECK_FALSE(both.statuses(0).has_current_limit());
  std::string metrics;
  sluice::envoy::append_prometheus_text(metrics, server.limiter());
  CHECK(metrics.find("sluice_envoy_hits_total{limit=\"d.user_agent_caf\\\\xe9\"} 1\n") !=
        std::string::npos);
  // Well-formed UTF-8 is kept as it is; an overlong form, a surrogate and a cut sequence are not.
  CHECK(sluice::detail::utf8_escaped("caf\xc3\xa9 \xf0\x9f\x98\x80") ==
        "caf\xc3\xa9 \xf0\x9f\x98\x80");
  CHECK(sluice::detail::utf8_escaped("\xc0\xaf\xed\xa0\x80\xe2\x82") ==
        "\\xc0\\xaf\\xed\\xa0\\x80\\xe2\\x82");
}

TEST_CASE("envoy: a configured limit and an override never share a label or counters", "[envoy]") {
  // Domain "override", key "5/second": the path reads as the label of an override of 5/second.
  auto domain = sluice::envoy::load_domain_config(R"(domain: override
descriptors:
  - key: 5/second
    rate_limit: {unit: minute, requests_per_unit: 100}
)",
                                                  "o.yaml");
  REQUIRE(domain.ok());
  const sluice::envoy::ServiceConfig config{.domains = {*domain}};
  auto limiter = sluice::envoy::Limiter::create(config);
  REQUIRE(limiter.ok());
  const sluice::envoy::Entry configured_entry{.key = "5/second", .value = "x"};
  const sluice::envoy::Entry other_entry{.key = "k", .value = "x"};
  const sluice::envoy::Descriptor configured{.entries = {&configured_entry, 1}};
  const sluice::envoy::Descriptor overridden{
      .entries = {&other_entry, 1},
      .limit = sluice::envoy::LimitOverride{.requests_per_unit = 5,
                                            .unit = sluice::envoy::Unit::kSecond}};
  sluice::envoy::Response response;
  REQUIRE((*limiter)
              ->should_rate_limit({.domain = "override", .descriptors = {&configured, 1}}, response)
              .ok());
  for (int i = 0; i < 2; ++i) {
    REQUIRE(
        (*limiter)
            ->should_rate_limit({.domain = "override", .descriptors = {&overridden, 1}}, response)
            .ok());
  }
  const auto check_apart = [&] {
    const std::vector<sluice::envoy::LimitStats> stats = (*limiter)->stats();
    REQUIRE(stats.size() == 2);
    CHECK(stats[0].label == "override.5/second");    // the configured limit's path
    CHECK(stats[1].label == "override.5/second#2");  // a metric series of its own
    CHECK(stats[0].total_hits == 1);
    CHECK(stats[1].total_hits == 2);
  };
  check_apart();
  REQUIRE((*limiter)->reload(config).ok());  // counters are kept across reloads, still apart
  check_apart();
}

TEST_CASE("envoy: a reload that drops every enforcing limit is refused unless it says so",
          "[envoy]") {
  sluice::envoy::ServiceConfig config = fixtures();
  EnvoyServer server(config);
  const auto blocked = request("edge_proxy_per_ip", {{{"remote_address", "50.0.0.5"}}});
  REQUIRE(server.ok(blocked).overall_code() == kOverLimit);
  // A file caught while it was written: a domain whose limits are not there yet.
  auto partial = sluice::envoy::load_domain_config(
      "domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n", "edge.yaml");
  REQUIRE(partial.ok());
  const absl::Status refused = server.limiter().reload({.domains = {*partial}});
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(server.limiter().reload({}).code() == absl::StatusCode::kFailedPrecondition);  // no file
  CHECK(server.ok(blocked).overall_code() == kOverLimit);  // the running config still limits
  // Shadow mode and unlimited limits cannot deny either.
  sluice::envoy::ServiceConfig observing = config;
  for (auto& d : observing.domains) {
    for (auto& node : d.descriptors) node.shadow_mode = true;
  }
  // Other domains' nested limits stay enforcing, but edge_proxy_per_ip keeps none.
  CHECK(server.limiter().reload(observing).code() == absl::StatusCode::kFailedPrecondition);
  // Said on purpose, it loads.
  auto empty = sluice::envoy::load_domain_config(
      "domain: edge_proxy_per_ip\nlimits_nothing: true\n", "edge.yaml");
  REQUIRE(empty.ok());
  REQUIRE(server.limiter().reload({.domains = {*empty}}).ok());
  CHECK(server.ok(blocked).overall_code() == kOk);
}

TEST_CASE(
    "envoy: a reload that drops every enforcing limit of one domain is refused unless it "
    "says so",
    "[envoy][attack]") {
  const sluice::envoy::ServiceConfig config = fixtures();
  EnvoyServer server(config);
  const auto blocked = request("edge_proxy_per_ip", {{{"remote_address", "50.0.0.5"}}});
  REQUIRE(server.ok(blocked).overall_code() == kOverLimit);
  // One domain's file caught while it was written; the other domains' files are whole.
  auto with_edge = [&](std::string_view text) {
    absl::StatusOr<sluice::envoy::DomainConfig> edge =
        sluice::envoy::load_domain_config(text, "edge.yaml");
    REQUIRE(edge.ok());
    sluice::envoy::ServiceConfig next = config;
    for (auto& d : next.domains) {
      if (d.domain == "edge_proxy_per_ip") d = *edge;
    }
    return next;
  };
  const absl::Status refused = server.limiter().reload(
      with_edge("domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n"));
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(refused.message() ==
        "edge.yaml: domain \"edge_proxy_per_ip\" has no limit that can deny a request, where the "
        "running one has 2, so it would limit none of its calls; if the file is still being "
        "written, replace it atomically instead (write a temporary file, then rename it over "
        "this one); to remove every limit of the domain on purpose, add `limits_nothing: true` "
        "to its file");
  CHECK(server.ok(blocked).overall_code() == kOverLimit);  // the running config still limits
  // Said on purpose, it loads.
  REQUIRE(
      server.limiter().reload(with_edge("domain: edge_proxy_per_ip\nlimits_nothing: true\n")).ok());
  CHECK(server.ok(blocked).overall_code() == kOk);
}

TEST_CASE("envoy: a reload keeps every unchanged limit's counters", "[envoy]") {
  sluice::envoy::ServiceConfig config = fixtures();
  EnvoyServer server(config);
  const auto ip = request("edge_proxy_per_ip", {{{"remote_address", "1"}}});
  const auto db = request("mongo_cps", {{{"database", "users"}}});
  server.ok(ip);
  server.ok(db);
  for (auto& d : config.domains) {
    if (d.domain == "mongo_cps") d.descriptors[0].rate_limit->windows[0].requests = 50;
  }
  REQUIRE(server.limiter().reload(config).ok());
  CHECK(server.ok(ip).statuses(0).limit_remaining() == 8);
  rls::RateLimitResponse changed = server.ok(db);
  CHECK(changed.statuses(0).current_limit().requests_per_unit() == 50);
  CHECK(changed.statuses(0).limit_remaining() < 49);  // carried its spent share, not fresh
  config.domains.front().descriptors.front().key.clear();
  CHECK_FALSE(server.limiter().reload(config).ok());  // refused: the running config stays
  CHECK(server.ok(ip).statuses(0).limit_remaining() == 7);
}

namespace {

// A backend whose calls wait at a gate while it is shut, and which records which thread destroys
// each of its generations (by its first rule's label): the thread that frees a configuration.
class GateBackend {
 public:
  struct Shared {
    std::mutex mutex;
    std::condition_variable changed;
    bool open = true;
    int waiting = 0;  // calls at the shut gate
    std::vector<std::pair<std::string, std::thread::id>> destroyed;
  };
  struct Options {
    std::shared_ptr<Shared> shared;
  };

  static absl::StatusOr<GateBackend> create(std::span<const sluice::CompiledRule> rules,
                                            const GateBackend* /*previous*/,
                                            const Options& options) {
    GateBackend b;
    b.shared_ = options.shared;
    b.label_ = rules.empty() ? "" : rules.front().label;
    return b;
  }
  GateBackend() = default;
  GateBackend(GateBackend&&) = default;  // the moved-from one records nothing
  GateBackend& operator=(GateBackend&&) = default;
  ~GateBackend() {
    if (shared_ == nullptr) return;
    std::lock_guard lock(shared_->mutex);
    shared_->destroyed.emplace_back(label_, std::this_thread::get_id());
  }

  absl::Status check_rules(std::span<const sluice::RuleKey> /*keys*/,
                           sluice::ConsumptionMode /*mode*/, std::span<sluice::Decision> out) {
    std::unique_lock lock(shared_->mutex);
    ++shared_->waiting;
    shared_->changed.notify_all();
    shared_->changed.wait(lock, [&] { return shared_->open; });
    --shared_->waiting;
    for (sluice::Decision& d : out) d = sluice::Decision{.limit = 10, .remaining = 9};
    return absl::OkStatus();
  }
  sluice::StoreStats rule_store_stats(std::size_t /*rule*/) const { return {}; }

 private:
  std::shared_ptr<Shared> shared_;
  std::string label_;
};

sluice::envoy::ServiceConfig one_limit(const std::string& key) {
  return {.domains = {{.domain = "d",
                       .descriptors = {{.key = key,
                                        .rate_limit = sluice::envoy::Limit{
                                            .windows = {{.requests = 10, .period = 1s}}}}}}}};
}

// The threads that destroyed the generations whose first rule is `label`.
std::vector<std::thread::id> destroyed_on(GateBackend::Shared& shared, const std::string& label) {
  std::lock_guard lock(shared.mutex);
  std::vector<std::thread::id> threads;
  for (const auto& [destroyed, thread] : shared.destroyed) {
    if (destroyed == label) threads.push_back(thread);
  }
  return threads;
}

}  // namespace

namespace {

// A backend that is down: every call fails, as one to a stalled Redis does at its timeout, and
// is counted.
class DownBackend {
 public:
  struct Options {
    std::shared_ptr<std::atomic<int>> calls;
  };
  static absl::StatusOr<DownBackend> create(std::span<const sluice::CompiledRule> /*rules*/,
                                            const DownBackend* /*previous*/,
                                            const Options& options) {
    DownBackend b;
    b.calls_ = options.calls;
    return b;
  }
  absl::Status check_rules(std::span<const sluice::RuleKey> /*keys*/,
                           sluice::ConsumptionMode /*mode*/, std::span<sluice::Decision> /*out*/) {
    ++*calls_;
    return absl::DeadlineExceededError("timed out");
  }
  sluice::StoreStats rule_store_stats(std::size_t /*rule*/) const { return {}; }

 private:
  std::shared_ptr<std::atomic<int>> calls_;
};

}  // namespace

TEST_CASE("envoy: a call waits for a failing backend once even with shadow mode limits",
          "[envoy][attack]") {
  // Each call to a stalled Redis waits --redis-timeout-ms. A second one for the shadow mode
  // limits doubles the wait, past an Envoy timeout set between the two, and Envoy then decides
  // by its own failure mode (by default: admit) whatever --redis-failure-mode says.
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto limiter = sluice::envoy::BasicLimiter<DownBackend>::create(
      fixtures(), {.on_backend_error = sluice::FailureMode::kFailClosed, .backend = {calls}});
  REQUIRE(limiter.ok());
  const sluice::envoy::Entry number[] = {{"to_number", "555"}};
  const sluice::envoy::Entry sender[] = {{"sender", "s"}};  // shadow mode
  const sluice::envoy::Descriptor d[] = {{.entries = number}, {.entries = sender}};
  sluice::envoy::Response response;
  REQUIRE((*limiter)->should_rate_limit({.domain = "messaging", .descriptors = d}, response).ok());
  CHECK(response.overall_code == sluice::envoy::Code::kOverLimit);
  CHECK(response.backend_failed);
  CHECK(calls->load() == 1);
}

TEST_CASE("envoy: a call that lets go of a replaced configuration last leaves freeing it to a poll",
          "[envoy]") {
  auto shared = std::make_shared<GateBackend::Shared>();
  auto limiter =
      sluice::envoy::BasicLimiter<GateBackend>::create(one_limit("k"), {.backend = {shared}});
  REQUIRE(limiter.ok());
  shared->open = false;
  const sluice::envoy::Entry entry{.key = "k", .value = "v"};
  const sluice::envoy::Descriptor descriptor{.entries = {&entry, 1}};
  sluice::envoy::Response response;
  absl::Status decided;
  std::thread call([&] {  // decides on the first configuration, held at the gate
    decided =
        (*limiter)->should_rate_limit({.domain = "d", .descriptors = {&descriptor, 1}}, response);
  });
  {
    std::unique_lock lock(shared->mutex);
    REQUIRE(shared->changed.wait_for(lock, 20s, [&] { return shared->waiting == 1; }));
  }
  const absl::Status reloaded = (*limiter)->reload(one_limit("j"));
  CHECK((*limiter)->collect_replaced() == 1);  // held by the call: nothing to free, no wait
  {
    std::lock_guard lock(shared->mutex);
    shared->open = true;
  }
  shared->changed.notify_all();
  call.join();  // the call let go of the first configuration last: it only handed it back
  CHECK(reloaded.ok());
  CHECK(decided.ok());
  CHECK(destroyed_on(*shared, "d.k").empty());  // not by the call

  std::size_t still_held = 1;
  std::thread::id poller;
  std::thread poll([&] {
    poller = std::this_thread::get_id();
    still_held = (*limiter)->collect_replaced();
  });
  poll.join();
  CHECK(still_held == 0);
  CHECK(destroyed_on(*shared, "d.k") == std::vector<std::thread::id>{poller});
}

TEST_CASE("envoy: a reload frees the configuration it replaced at once when no call holds it",
          "[envoy]") {
  auto shared = std::make_shared<GateBackend::Shared>();
  auto limiter =
      sluice::envoy::BasicLimiter<GateBackend>::create(one_limit("k"), {.backend = {shared}});
  REQUIRE(limiter.ok());
  REQUIRE((*limiter)->reload(one_limit("j")).ok());
  CHECK(destroyed_on(*shared, "d.k") == std::vector<std::thread::id>{std::this_thread::get_id()});
  CHECK((*limiter)->collect_replaced() == 0);
}

TEST_CASE("envoy: a reload returns at once while a call holds the configuration it replaced",
          "[envoy][attack]") {
  auto shared = std::make_shared<GateBackend::Shared>();
  auto limiter =
      sluice::envoy::BasicLimiter<GateBackend>::create(one_limit("k"), {.backend = {shared}});
  REQUIRE(limiter.ok());
  shared->open = false;
  const sluice::envoy::Entry entry{.key = "k", .value = "v"};
  const sluice::envoy::Descriptor descriptor{.entries = {&entry, 1}};
  sluice::envoy::Response response;
  std::thread call([&] {  // a slow call (a backend near its timeout) on the first configuration
    (void)(*limiter)->should_rate_limit({.domain = "d", .descriptors = {&descriptor, 1}}, response);
  });
  {
    std::unique_lock lock(shared->mutex);
    REQUIRE(shared->changed.wait_for(lock, 20s, [&] { return shared->waiting == 1; }));
  }
  std::future<absl::Status> reload =
      std::async(std::launch::async, [&] { return (*limiter)->reload(one_limit("j")); });
  // Bounded: a reload that waits for the call fails here instead of hanging the suite.
  const bool returned = reload.wait_for(5s) == std::future_status::ready;
  {
    std::lock_guard lock(shared->mutex);
    shared->open = true;
  }
  shared->changed.notify_all();
  call.join();
  CHECK(returned);
  CHECK(reload.get().ok());
  CHECK((*limiter)->stats().front().label == "d.j");
}

TEST_CASE("envoy: invalid files are refused with file:line:column", "[envoy]") {
  using sluice::envoy::load_domain_config;
  auto message = [](std::string_view text) {
    absl::StatusOr<sluice::envoy::DomainConfig> d = load_domain_config(text, "f.yaml");
    REQUIRE_FALSE(d.ok());
    return std::string(d.status().message());
  };
  CHECK(message("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, "
                "requests_per_unit: 1}\n") ==
        "f.yaml:4:24: descriptors[0].rate_limit.unit: unknown unit \"fortnight\" (expected "
        "second, minute, hour, day, month or year)");
  CHECK(message("domain: d\ndescriptors:\n  - key: k\n    limit: 3\n") ==
        "f.yaml:4:5: descriptors[0]: unknown key \"limit\" (expected one of key, value, "
        "rate_limit, descriptors, shadow_mode, detailed_metric)");
  CHECK(message("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: "
                "second}\n")
            .starts_with("f.yaml:4:17: descriptors[0].rate_limit: an unlimited"));
  CHECK(message("domain: d\ndescriptors:\n  - key: k\n  - key: k\n")
            .starts_with("f.yaml:4:5: descriptors[1]: duplicate descriptor"));
  CHECK(message("descriptors: []\n").starts_with("f.yaml:1:1: domain:"));
  CHECK(message("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {period: 5 minutes, "
                "requests_per_unit: 1}\n")
            .starts_with("f.yaml:4:26: descriptors[0].rate_limit.period: expected a period"));
  CHECK(message("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: sliding, "
                "unit: second, requests_per_unit: 1}\n") ==
        "f.yaml:4:29: descriptors[0].rate_limit.algorithm: unknown algorithm \"sliding\" "
        "(expected gcra or fixed_window)");
  CHECK(message("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: fixed_window, "
                "unit: second, requests_per_unit: 3, burst: 5}\n") ==
        "f.yaml:4:17: descriptors[0].rate_limit: a fixed_window limit's burst must equal its "
        "requests_per_unit (3), or be absent");
}

TEST_CASE("envoy: a bucket the limiter cannot hold is refused at load with its position",
          "[envoy]") {
  // A bucket of 2^32 - 1 that refills at 1 per second takes 136 years, beyond 2^60 ns.
  const sluice::envoy::ServiceConfig config{
      .domains = {
          {.domain = "d",
           .descriptors = {
               {.key = "k",
                .rate_limit = sluice::envoy::Limit{
                    .windows = {{.requests = 1, .period = 1s, .burst = 4'294'967'295}}}}}}}};
  CHECK_FALSE(sluice::envoy::Limiter::create(config).ok());
  const absl::StatusOr<sluice::envoy::DomainConfig> loaded = sluice::envoy::load_domain_config(
      "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, "
      "burst: 4294967295}\n",
      "f.yaml");
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().message() ==
        "f.yaml:4:17: descriptors[0].rate_limit: burst × period / requests_per_unit (the time an "
        "empty bucket takes to refill) must be at most 2^60 ns, about 36 years");
}

TEST_CASE("envoy: a replaces entry that names no limit of its domain is refused with the fix",
          "[envoy][attack]") {
  // A typo in the name: the VIP limit would never replace the per-tenant one, and every VIP
  // tenant would be held to 3 a minute.
  const absl::StatusOr<sluice::envoy::DomainConfig> typo = sluice::envoy::load_domain_config(
      "domain: d\ndescriptors:\n"
      "  - key: tenant\n"
      "    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 3}\n"
      "  - key: tenant_vip\n"
      "    rate_limit: {name: vip, unit: minute, requests_per_unit: 1000,\n"
      "                 replaces: [{name: per_tenant}, {name: per_tenat}]}\n",
      "f.yaml");
  REQUIRE(typo.ok());
  const auto refused = sluice::envoy::Limiter::create({.domains = {*typo}});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(refused.status().message() ==
        "f.yaml: d.tenant_vip: replaces \"per_tenat\", but no limit of domain \"d\" has that "
        "name, so it replaces nothing; set the name of the limit it should replace "
        "(rate_limit.name), or drop the entry");
  // A name given in a nested level of the domain counts.
  const absl::StatusOr<sluice::envoy::DomainConfig> nested = sluice::envoy::load_domain_config(
      "domain: d\ndescriptors:\n"
      "  - key: org\n"
      "    descriptors:\n"
      "      - key: tenant\n"
      "        rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 3}\n"
      "  - key: tenant_vip\n"
      "    rate_limit: {unit: minute, requests_per_unit: 1000, replaces: [{name: per_tenant}]}\n",
      "f.yaml");
  REQUIRE(nested.ok());
  CHECK(sluice::envoy::Limiter::create({.domains = {*nested}}).ok());
  // The descriptor's path shows the file's bytes escaped (the error goes to a log).
  const absl::StatusOr<sluice::envoy::DomainConfig> control = sluice::envoy::load_domain_config(
      "domain: d\ndescriptors:\n"
      "  - key: \"k\\e[2J\"\n"
      "    rate_limit: {unit: minute, requests_per_unit: 1, replaces: [{name: nobody}]}\n",
      "f.yaml");
  REQUIRE(control.ok());
  const auto escaped = sluice::envoy::Limiter::create({.domains = {*control}});
  REQUIRE_FALSE(escaped.ok());
  CHECK(std::string(escaped.status().message())
            .starts_with("f.yaml: \"d.k\\x1b[2J\": replaces \"nobody\""));
}

TEST_CASE("envoy: a load error shows a configuration's control bytes escaped", "[envoy][attack]") {
  // Whoever writes into the directory picks file names, domains, keys and values; the errors go
  // to a log, where an escape sequence or a line break would forge or hide lines.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    absl::StrCat("sluice_envoy_control_bytes_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  struct RemovedAtEnd {
    std::filesystem::path dir;
    ~RemovedAtEnd() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } const removed{dir};
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
  };
  auto message = [&] {
    const absl::StatusOr<sluice::envoy::ServiceConfig> loaded =
        sluice::envoy::load_config_directory(dir.string());
    REQUIRE_FALSE(loaded.ok());
    return std::string(loaded.status().message());
  };
  const std::string limit =
      "descriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n";
  // The same domain in two files.
  write("a.yaml", "domain: \"d\\e[2J\\nforged\"\n" + limit);
  write("b.yaml", "domain: \"d\\e[2J\\nforged\"\n" + limit);
  CHECK(message() ==
        absl::StrCat(dir.string(), "/b.yaml: duplicate domain \"d\\x1b[2J\\x0aforged\""));
  std::filesystem::remove(dir / "a.yaml");
  std::filesystem::remove(dir / "b.yaml");
  // A file name.
  write("\x1b[2J\nforged.yaml", "domain: d\nlimit: 1\n");
  CHECK(message() == absl::StrCat("\"", dir.string(),
                                  "/\\x1b[2J\\x0aforged.yaml\":2:1: (root): unknown key \"limit\" "
                                  "(expected one of domain, descriptors, limits_nothing)"));
}

TEST_CASE("envoy: a configuration directory that cannot be listed is named escaped",
          "[envoy][attack]") {
  // The service logs every refused reload: a directory whose name holds a line feed or a terminal
  // escape (a mount point named by a volume's label) must not forge or hide a line there.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    absl::StrCat("sluice_envoy_gone_", getpid(),
                                                 "\n2026-12-07 sluice_envoy_rls: reloaded\x1b[2J");
  std::filesystem::remove_all(dir);
  const absl::StatusOr<sluice::envoy::ServiceConfig> loaded =
      sluice::envoy::load_config_directory(dir.string());
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kNotFound);
  const std::string message(loaded.status().message());
  CHECK(std::none_of(message.begin(), message.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }));
  CHECK(message.starts_with(
      absl::StrCat("\"", (std::filesystem::temp_directory_path() / "sluice_envoy_gone_").string(),
                   getpid(), "\\x0a2026-12-07 sluice_envoy_rls: reloaded\\x1b[2J\": ")));
}

TEST_CASE("envoy: a domain file that cannot be read fails the load and is named",
          "[envoy][attack]") {
  // A symlink whose target is gone (a volume not mounted yet) or is no file: skipping it would
  // publish a configuration without its domain, whose calls are then never limited.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("sluice_envoy_unreadable_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  struct RemovedAtEnd {
    std::filesystem::path dir;
    ~RemovedAtEnd() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } const removed{dir};
  std::ofstream(dir / "a.yaml")
      << "domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n";
  std::filesystem::create_symlink(dir / "missing.yaml", dir / "b.yaml");
  absl::StatusOr<sluice::envoy::ServiceConfig> loaded =
      sluice::envoy::load_config_directory(dir.string());
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(loaded.status().message())
            .starts_with(absl::StrCat(dir.string(), "/b.yaml: cannot open the config file")));
  std::filesystem::remove(dir / "b.yaml");
  std::filesystem::create_symlink("/dev/null", dir / "c.yaml");
  loaded = sluice::envoy::load_config_directory(dir.string());
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(loaded.status().message() ==
        absl::StrCat(dir.string(),
                     "/c.yaml: the config file is not a regular file (a character device)"));
  // A subdirectory is skipped, whatever its name.
  std::filesystem::remove(dir / "c.yaml");
  std::filesystem::create_directories(dir / "d.yaml");
  CHECK(sluice::envoy::load_config_directory(dir.string()).ok());
}

#ifdef SLUICE_ENVOY_RLS_BINARY
namespace {

// The service binary on a free port of 127.0.0.1, its configuration in a temporary directory.
class RlsProcess {
 public:
  explicit RlsProcess(const std::string& dir, const std::vector<std::string>& extra = {}) {
    int out[2];
    REQUIRE(pipe(out) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::vector<std::string> args = {SLUICE_ENVOY_RLS_BINARY, "--config-dir",     dir, "--listen",
                                     "127.0.0.1:0",           "--reload-poll-ms", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    REQUIRE(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    std::string line;
    char c = 0;
    while (read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
    close(out[0]);
    const std::string prefix = "sluice_envoy_rls: listening on ";
    INFO(line);
    REQUIRE(line.starts_with(prefix));
    channel_ = grpc::CreateChannel(line.substr(prefix.size()), grpc::InsecureChannelCredentials());
    stub_ = rls::RateLimitService::NewStub(channel_);
  }
  RlsProcess(const RlsProcess&) = delete;
  RlsProcess& operator=(const RlsProcess&) = delete;
  ~RlsProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  rls::RateLimitResponse call(const rls::RateLimitRequest& request) {
    rls::RateLimitResponse response;
    const grpc::Status status = try_call(request, response);
    INFO(status.error_message());
    REQUIRE(status.ok());
    return response;
  }
  // A call that may fail (no assertion: safe on any thread).
  grpc::Status try_call(const rls::RateLimitRequest& request, rls::RateLimitResponse& response,
                        std::chrono::seconds deadline = 20s) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + deadline);
    return stub_->ShouldRateLimit(&context, request, &response);
  }

  // grpc.health.v1.Health/Check for the empty service name: the response's serialized bytes
  // (08 01 is SERVING), through the generic stub (no health proto needed).
  std::string health() {
    std::string bytes;
    const grpc::Status status = try_health(bytes);
    INFO(status.error_message());
    REQUIRE(status.ok());
    return bytes;
  }
  // The health check's status, its response's bytes in `bytes`.
  grpc::Status try_health(std::string& bytes, std::chrono::seconds deadline = 20s) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + deadline);
    grpc::Slice empty(std::string{});  // HealthCheckRequest{service: ""} serializes to no bytes
    grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &response, [&](grpc::Status s) { done.set_value(std::move(s)); });
    const grpc::Status status = done.get_future().get();
    bytes.clear();
    std::vector<grpc::Slice> slices;
    if (status.ok() && response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices)
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    return status;
  }

  void signal(int sig) { REQUIRE(kill(pid_, sig) == 0); }
  pid_t pid() const { return pid_; }
  rls::RateLimitService::Stub& stub() { return *stub_; }

  // The exit status after SIGTERM (the drain), or -1 if it did not exit within 20 s.
  int terminate() {
    signal(SIGTERM);
    return wait_exit();
  }
  // The exit status once the process exits, or -1 if it did not within 20 s.
  int wait_exit() {
    for (int i = 0; i < 2000; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);  // waiting for an exit, not timing a rate
    }
    return -1;
  }

 private:
  pid_t pid_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<rls::RateLimitService::Stub> stub_;
};

void write_file(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path temporary = path.string() + ".tmp";
  std::ofstream(temporary) << text;
  std::filesystem::rename(temporary, path);  // atomically, as operators should
}

}  // namespace

TEST_CASE("envoy: the service binary serves, answers health, reloads on SIGHUP and drains",
          "[envoy][e2e]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("sluice_envoy_rls_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto config = [](int n) {
    return absl::StrCat(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, "
        "requests_per_unit: ",
        n, "}\n");
  };
  write_file(dir / "d.yaml", config(2));
  RlsProcess rls_process(dir.string());
  CHECK(rls_process.health() == std::string("\x08\x01", 2));
  const auto k = request("d", {{{"k", "v"}}});
  CHECK(rls_process.call(k).overall_code() == kOk);
  CHECK(rls_process.call(k).overall_code() == kOk);
  CHECK(rls_process.call(k).overall_code() == kOverLimit);
  write_file(dir / "d.yaml", "domain: d\ndescriptors: [{key: k, bad: 1}]\n");
  rls_process.signal(SIGHUP);  // refused: the last good configuration keeps serving
  write_file(dir / "d.yaml", config(5));
  rls_process.signal(SIGHUP);
  std::uint32_t limit = 0;
  for (int i = 0; i < 500 && limit != 5; ++i) {  // the reload is asynchronous
    limit = rls_process.call(request("d", {{{"k", "other"}}}))
                .statuses(0)
                .current_limit()
                .requests_per_unit();
    if (limit != 5) std::this_thread::sleep_for(10ms);
  }
  CHECK(limit == 5);
  // The changed limit carried the spent share of "v" (2 of 2 spent: all of 5 spent).
  CHECK(rls_process.call(k).overall_code() == kOverLimit);
  CHECK(rls_process.terminate() == 0);
  std::filesystem::remove_all(dir);
}

namespace {

// How the service binary ended when started with `flags` alone: its exit status and stderr.
struct RlsExit {
  int status = -1;
  std::string error;
};

// Runs the binary with `flags` and a configuration directory that does not exist, so that it
// exits at once whether or not the flags are accepted (a refused flag is named on stderr).
RlsExit run_rls(const std::vector<std::string>& flags) {
  int err[2];
  REQUIRE(pipe(err) == 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, err[0]);
  std::vector<std::string> args = {SLUICE_ENVOY_RLS_BINARY, "--config-dir",
                                   "/nonexistent/sluice_envoy_rls"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&actions);
  close(err[1]);
  RlsExit out;
  char buffer[512];
  for (ssize_t n = 0; (n = read(err[0], buffer, sizeof buffer)) > 0;) {
    out.error.append(buffer, static_cast<std::size_t>(n));
  }
  close(err[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

}  // namespace

TEST_CASE("envoy: --redis-max-connections takes 1 to 1000 and a refused value is named",
          "[envoy][e2e]") {
  const std::string refused = "--redis-max-connections takes a number in 1..1000";
  for (const char* bad : {"0", "1001", "-1", "16x", ""}) {
    INFO("--redis-max-connections \"" << bad << "\"");
    const RlsExit exit = run_rls({"--redis-max-connections", bad});
    CHECK(exit.status == 2);
    CHECK(exit.error.find(absl::StrCat(refused, ", not \"", bad, "\"")) != std::string::npos);
    CHECK(exit.error.find("usage: sluice_envoy_rls") != std::string::npos);
  }
  for (const char* good : {"1", "1000"}) {
    INFO("--redis-max-connections " << good);
    const RlsExit exit = run_rls({"--redis-max-connections", good});
    CHECK(exit.status == 2);  // the configuration directory is missing: the flag was accepted
    CHECK(exit.error.find(refused) == std::string::npos);
    CHECK(exit.error.find("/nonexistent/sluice_envoy_rls") != std::string::npos);
  }
  CHECK(run_rls({"--redis-max-connections"}).error.find("--redis-max-connections needs a value") !=
        std::string::npos);
}
#ifdef SLUICE_TEST_REDIS
TEST_CASE("envoy: two service replicas over one Redis share one budget", "[envoy][e2e][redis]") {
  sluice_test::RedisFixture redis;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("sluice_envoy_rls_redis_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_file(dir / "d.yaml",
             "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, "
             "requests_per_unit: 3}\n  - key: j\n    rate_limit: {unit: day, "
             "requests_per_unit: 100}\n");
  const std::vector<std::string> shared = {"--redis-socket",       redis.redis.unix_socket(),
                                           "--redis-key-seed",     "7",
                                           "--redis-failure-mode", "fail_closed"};
  RlsProcess a(dir.string(), shared);
  RlsProcess b(dir.string(), shared);
  const auto both = request("d", {{{"j", "x"}}, {{"k", "x"}}});
  CHECK(a.call(both).overall_code() == kOk);
  CHECK(b.call(both).overall_code() == kOk);
  CHECK(a.call(both).statuses(1).limit_remaining() == 0);
  rls::RateLimitResponse over = b.call(both);
  CHECK(over.overall_code() == kOverLimit);
  CHECK(over.statuses(0).limit_remaining() == 97);  // all or nothing across replicas too
  redis.redis.kill();
  CHECK(a.call(request("d", {{{"j", "y"}}})).overall_code() == kOverLimit);  // fail_closed
  CHECK(a.terminate() == 0);
  CHECK(b.terminate() == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("envoy: two service replicas over one Redis Cluster share one budget",
          "[envoy][e2e][redis][cluster]") {
  sluice_test::RedisCluster& cluster = sluice_test::RedisCluster::shared();
  INFO(cluster.error());
  REQUIRE(cluster.error().empty());
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("sluice_envoy_rls_cluster_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_file(dir / "d.yaml",
             "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, "
             "requests_per_unit: 3}\n  - key: j\n    rate_limit: {unit: day, "
             "requests_per_unit: 100}\n");
  const std::vector<std::string> shared = {
      "--redis-address", absl::StrCat("127.0.0.1:", cluster.seed_port()), "--redis-cluster",
      "--redis-key-seed", absl::StrCat(getpid())};
  RlsProcess a(dir.string(), shared);
  RlsProcess b(dir.string(), shared);
  // Many descriptors: their keys fall in several slots, decided per node.
  rls::RateLimitRequest wide = request("d", {{{"k", "x"}}});
  for (int i = 0; i < 8; ++i) add(wide, {{"j", absl::StrCat("v", i).c_str()}});
  for (int i = 0; i < 3; ++i) CHECK((i % 2 == 0 ? a : b).call(wide).overall_code() == kOk);
  rls::RateLimitResponse over = b.call(wide);
  CHECK(over.overall_code() == kOverLimit);
  CHECK(over.statuses(0).code() == kOverLimit);
  for (int i = 1; i <= 8; ++i) {
    INFO(i);
    CHECK(over.statuses(i).code() == kOk);
    CHECK(over.statuses(i).limit_remaining() == 97);  // given back on every slot
  }
  CHECK(a.terminate() == 0);
  CHECK(b.terminate() == 0);
  std::filesystem::remove_all(dir);
}

namespace {

// A temporary configuration directory holding d.yaml, removed with the object.
class ConfigDir {
 public:
  ConfigDir(const std::string& name, const std::string& text)
      : dir_(std::filesystem::temp_directory_path() / absl::StrCat(name, "_", getpid())) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    write_file(dir_ / "d.yaml", text);
  }
  ConfigDir(const ConfigDir&) = delete;
  ConfigDir& operator=(const ConfigDir&) = delete;
  ~ConfigDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string path() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

// Whether an established TCP connection to 127.0.0.1:`port` (the server's side) holds bytes the
// server has not read: a request waiting in a stopped server. Read from /proc/net/tcp.
bool unread_bytes_at(int port) {
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // the header
  char local[8];
  std::snprintf(local, sizeof local, ":%04X", static_cast<unsigned>(port));
  while (std::getline(tcp, line)) {
    std::istringstream fields(line);
    std::string slot, local_address, remote_address, state, queues;
    fields >> slot >> local_address >> remote_address >> state >> queues;
    const std::size_t colon = queues.find(':');
    if (state == "01" && local_address.ends_with(local) && colon != std::string::npos &&
        std::stoul(queues.substr(colon + 1), nullptr, 16) > 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

TEST_CASE("envoy: the local failure mode limits on the replica's share while Redis is stopped",
          "[envoy][e2e][redis]") {
  sluice_test::RedisFixture redis;
  const ConfigDir dir("sluice_envoy_rls_local",
                      "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, "
                      "requests_per_unit: 10}\n  - key: j\n    rate_limit: {unit: day, "
                      "requests_per_unit: 100}\n");
  RlsProcess rls_process(
      dir.path(),
      {"--redis-socket", redis.redis.unix_socket(), "--redis-failure-mode", "local",
       "--local-share-permille", "500", "--local-retry-ms", "2000", "--redis-timeout-ms", "300"});
  const auto k = request("d", {{{"k", "x"}}});
  for (std::uint32_t left : {9u, 8u, 7u, 6u})
    CHECK(rls_process.call(k).statuses(0).limit_remaining() == left);
  redis.redis.stop();  // frozen: calls time out; then decided locally at once
  // The local share: 5 of 10 a day, fresh (Redis's state is not known here).
  for (std::uint32_t left : {4u, 3u, 2u, 1u, 0u}) {
    rls::RateLimitResponse r = rls_process.call(k);
    CHECK(r.overall_code() == kOk);
    CHECK(r.statuses(0).limit_remaining() == left);
  }
  rls::RateLimitResponse over = rls_process.call(request("d", {{{"j", "x"}}, {{"k", "x"}}}));
  CHECK(over.overall_code() == kOverLimit);
  CHECK(over.statuses(0).code() == kOk);
  CHECK(over.statuses(0).limit_remaining() == 50);  // all or nothing on the local share too
  CHECK(over.statuses(1).code() == kOverLimit);
  redis.redis.resume();
  // After the retry interval a call reaches Redis again: its state is the one before the outage
  // plus the call that timed out, whose script Redis ran when it resumed (6 - 1 - 1).
  rls::RateLimitResponse shared;
  for (int i = 0; i < 500; ++i) {
    shared = rls_process.call(k);
    if (shared.overall_code() == kOk) break;
    std::this_thread::sleep_for(10ms);  // waiting for the retry interval, not timing a rate
  }
  CHECK(shared.overall_code() == kOk);
  CHECK(shared.statuses(0).limit_remaining() == 4);
  CHECK(rls_process.terminate() == 0);
}

TEST_CASE("envoy: a call in flight when SIGTERM arrives completes and new calls are refused",
          "[envoy][e2e][redis]") {
  sluice_test::RedisFixture redis;
  const ConfigDir dir("sluice_envoy_rls_drain",
                      "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, "
                      "requests_per_unit: 100}\n");
  RlsProcess rls_process(dir.path(),
                         {"--redis-address", absl::StrCat("127.0.0.1:", redis.redis.port()),
                          "--redis-timeout-ms", "20000", "--drain-seconds", "20"});
  const auto k = request("d", {{{"k", "v"}}});
  CHECK(rls_process.call(k).statuses(0).limit_remaining() == 99);  // connected to Redis
  redis.redis.stop();
  rls::RateLimitResponse in_flight_response;
  std::future<grpc::Status> in_flight =
      std::async(std::launch::async, [&] { return rls_process.try_call(k, in_flight_response); });
  bool waiting = false;  // the call's script sits unread in the stopped Redis
  for (int i = 0; i < 2000 && !waiting; ++i) {
    waiting = unread_bytes_at(redis.redis.port());
    if (!waiting) std::this_thread::sleep_for(10ms);  // waiting for an event, not a rate
  }
  REQUIRE(waiting);
  rls_process.signal(SIGTERM);
  // The server stops taking calls (health turned NOT_SERVING just before): probes are refused.
  grpc::Status probe;
  std::string bytes;
  for (int i = 0; i < 2000; ++i) {
    probe = rls_process.try_health(bytes, 2s);
    if (!probe.ok()) break;
    std::this_thread::sleep_for(10ms);  // until the signal is handled
  }
  INFO(probe.error_message());
  CHECK_FALSE(probe.ok());
  rls::RateLimitResponse refused;
  CHECK_FALSE(rls_process.try_call(k, refused, 2s).ok());
  CHECK(in_flight.wait_for(0s) == std::future_status::timeout);  // still waiting on Redis
  redis.redis.resume();
  const grpc::Status done = in_flight.get();
  INFO(done.error_message());
  CHECK(done.ok());
  CHECK(in_flight_response.overall_code() == kOk);
  CHECK(in_flight_response.statuses(0).limit_remaining() == 98);  // answered by Redis
  const auto start = std::chrono::steady_clock::now();
  CHECK(rls_process.wait_exit() == 0);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}

namespace {

// The threads of process `pid` now (the Threads: line of /proc/<pid>/status), or -1.
int threads_of(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("Threads:")) return std::stoi(line.substr(8));
  }
  return -1;
}

// The threads of process `pid` that serve calls now: gRPC's synchronous server names them
// "grpcpp_sync_server" (cut to 15 bytes by the kernel).
int serving_threads_of(pid_t pid) {
  int n = 0;
  std::error_code error;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
    std::string name;
    std::getline(std::ifstream(task.path() / "comm"), name);
    if (name.starts_with("grpcpp_sync")) ++n;
  }
  return n;
}

// `n` calls of `request` started at once through the callback API, each answered on a gRPC
// thread of this process: its status and the time it took. No assertion runs on those threads.
class CallFlood {
 public:
  struct Call {
    grpc::ClientContext context;
    rls::RateLimitResponse response;
    grpc::Status status;
    std::chrono::steady_clock::duration took{};
  };

  CallFlood(rls::RateLimitService::Stub& stub, const rls::RateLimitRequest& request, int n)
      : request_(request), left_(n) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) calls_.push_back(std::make_unique<Call>());
    for (std::unique_ptr<Call>& call : calls_) {
      Call* c = call.get();
      c->context.set_deadline(std::chrono::system_clock::now() + 20s);
      stub.async()->ShouldRateLimit(&c->context, &request_, &c->response,
                                    [this, c, start](grpc::Status s) {
                                      std::lock_guard lock(mutex_);
                                      c->status = std::move(s);
                                      c->took = std::chrono::steady_clock::now() - start;
                                      if (--left_ == 0) all_done_.notify_all();
                                    });
    }
  }
  CallFlood(const CallFlood&) = delete;
  CallFlood& operator=(const CallFlood&) = delete;
  ~CallFlood() { wait_for(30s); }  // the callbacks use this object

  // Whether every call was answered within `timeout`.
  bool wait_for(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return all_done_.wait_for(lock, timeout, [&] { return left_ == 0; });
  }
  // Once every call was answered.
  const std::vector<std::unique_ptr<Call>>& calls() const { return calls_; }

 private:
  const rls::RateLimitRequest request_;
  std::vector<std::unique_ptr<Call>> calls_;
  std::mutex mutex_;
  std::condition_variable all_done_;
  int left_;
};

// What a flood of calls did to a service whose Redis was stopped throughout.
struct FloodOutcome {
  int peak_threads = 0;               // the service's, sampled while the calls were in flight
  int peak_serving = 0;               // those of them serving calls (gRPC's synchronous server)
  int prompt = 0;                     // calls answered in under half the Redis timeout
  int exhausted = 0;                  // calls answered RESOURCE_EXHAUSTED
  int other_errors = 0;               // calls answered any other error
  bool health_served = false;         // a health check during the flood answered SERVING promptly
  std::uint32_t remaining_after = 0;  // a fresh key's limit_remaining once Redis resumed
};

constexpr auto kFloodRedisTimeout = 1000ms;

// The service's threads that never serve calls: measured 10 or 11 on 2 cores (the main and
// reload threads; gRPC's timers, resolver, event engine and executor), some of gRPC's growing
// with the cores under load.
int other_threads_bound() { return 12 + 4 * static_cast<int>(std::thread::hardware_concurrency()); }

// `calls` calls at once against sluice_envoy_rls started with `flags` over a Redis stopped
// (SIGSTOP) just before them, and resumed once every call was answered. The limit is 100 a day.
FloodOutcome flood_stalled_redis(const std::vector<std::string>& flags, int calls) {
  sluice_test::RedisFixture redis;
  const ConfigDir dir("sluice_envoy_rls_flood",
                      "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, "
                      "requests_per_unit: 100}\n");
  std::vector<std::string> args = {"--redis-socket", redis.redis.unix_socket(),
                                   "--redis-timeout-ms", absl::StrCat(kFloodRedisTimeout.count())};
  args.insert(args.end(), flags.begin(), flags.end());
  RlsProcess rls_process(dir.path(), args);
  REQUIRE(rls_process.call(request("d", {{{"k", "v"}}})).statuses(0).limit_remaining() == 99);
  redis.redis.stop();  // every call that reaches Redis now waits out its timeout
  FloodOutcome out;
  CallFlood flood(rls_process.stub(), request("d", {{{"k", "flood"}}}), calls);
  std::string health;
  const auto asked = std::chrono::steady_clock::now();
  out.health_served = rls_process.try_health(health, 2s).ok() &&
                      health == std::string("\x08\x01", 2) &&
                      std::chrono::steady_clock::now() - asked < kFloodRedisTimeout / 2;
  for (int i = 0; i < 4000 && !flood.wait_for(2ms); ++i) {  // sampling, not timing a rate
    out.peak_threads = std::max(out.peak_threads, threads_of(rls_process.pid()));
    out.peak_serving = std::max(out.peak_serving, serving_threads_of(rls_process.pid()));
  }
  REQUIRE(flood.wait_for(0ms));
  redis.redis.resume();
  for (const auto& call : flood.calls()) {
    if (call->took < kFloodRedisTimeout / 2) ++out.prompt;
    if (call->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++out.exhausted;
    } else if (!call->status.ok()) {
      ++out.other_errors;
    }
  }
  out.remaining_after =
      rls_process.call(request("d", {{{"k", "after"}}})).statuses(0).limit_remaining();
  CHECK(rls_process.terminate() == 0);
  return out;
}

}  // namespace

TEST_CASE("envoy: a flood of calls against a stalled Redis holds a bounded number of threads",
          "[envoy][e2e][redis]") {
  constexpr int kMaxThreads = 64;  // the service's default --max-threads
  constexpr int kCalls = 160;
  const FloodOutcome flood = flood_stalled_redis({}, kCalls);
  INFO("peak threads " << flood.peak_threads << " (serving " << flood.peak_serving << "), prompt "
                       << flood.prompt << ", exhausted " << flood.exhausted);
  CHECK(flood.peak_serving <= kMaxThreads);
  CHECK(flood.peak_threads <= kMaxThreads + other_threads_bound());
  // The calls beyond the bound (one thread answers them) come back at once.
  CHECK(flood.prompt >= kCalls - (kMaxThreads - 1));
  CHECK(flood.exhausted == flood.prompt);
  CHECK(flood.other_errors == 0);
  CHECK(flood.remaining_after == 99);  // Redis answers again: so does the service, as ever
}

TEST_CASE("envoy: --max-threads N decides N - 1 calls at once and refuses the rest at once",
          "[envoy][e2e][redis]") {
  constexpr int kCalls = 64;
  const FloodOutcome flood = flood_stalled_redis({"--max-threads", "8"}, kCalls);
  INFO("peak threads " << flood.peak_threads << " (serving " << flood.peak_serving << "), prompt "
                       << flood.prompt << ", exhausted " << flood.exhausted);
  CHECK(flood.peak_serving <= 8);
  CHECK(flood.peak_threads <= 8 + other_threads_bound());
  CHECK(flood.exhausted == kCalls - 7);  // 7 waited out Redis's timeout (fail_open: OK)
  CHECK(flood.prompt == flood.exhausted);
  CHECK(flood.other_errors == 0);
  CHECK(flood.health_served);  // probes are not starved: health is not served on those threads
  CHECK(flood.remaining_after == 99);
}

namespace {

// The established TCP connections process `pid` holds to port `port`: the sockets among its
// open files (/proc/<pid>/fd) whose /proc/net/tcp line is ESTABLISHED with that remote port.
// Sockets of other processes are not counted: tests running at the same time may hold
// connections whose remote port is the same number (a client's ephemeral port).
int connections_to(pid_t pid, int port) {
  std::vector<std::string> inodes;
  std::error_code error;
  for (const auto& fd :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"), error)) {
    const std::string target = std::filesystem::read_symlink(fd.path(), error).string();
    if (!error && target.starts_with("socket:[") && target.ends_with("]")) {
      inodes.push_back(target.substr(8, target.size() - 9));
    }
  }
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // the header
  char remote[8];
  std::snprintf(remote, sizeof remote, ":%04X", static_cast<unsigned>(port));
  int n = 0;
  while (std::getline(tcp, line)) {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    std::istringstream fields(line);
    std::string slot, local_address, remote_address, state, queues, timer, retransmits, uid,
        timeout, inode;
    fields >> slot >> local_address >> remote_address >> state >> queues >> timer >> retransmits >>
        uid >> timeout >> inode;
    if (state == "01" && remote_address.ends_with(remote) &&
        std::find(inodes.begin(), inodes.end(), inode) != inodes.end()) {
      ++n;
    }
  }
  return n;
}

// The most connections sluice_envoy_rls, started with `flags` over Redis on TCP, held to Redis
// while `calls` calls waited on it, stopped (the kernel still accepts connections for it).
int peak_redis_connections(const std::vector<std::string>& flags, int calls) {
  sluice_test::RedisFixture redis;
  const ConfigDir dir("sluice_envoy_rls_pool",
                      "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, "
                      "requests_per_unit: 100}\n");
  std::vector<std::string> args = {"--redis-address",
                                   absl::StrCat("127.0.0.1:", redis.redis.port()),
                                   "--redis-timeout-ms", absl::StrCat(kFloodRedisTimeout.count())};
  args.insert(args.end(), flags.begin(), flags.end());
  RlsProcess rls_process(dir.path(), args);
  REQUIRE(rls_process.call(request("d", {{{"k", "v"}}})).statuses(0).limit_remaining() == 99);
  redis.redis.stop();
  int peak = 0;
  {
    CallFlood flood(rls_process.stub(), request("d", {{{"k", "flood"}}}), calls);
    for (int i = 0; i < 4000 && !flood.wait_for(2ms); ++i) {  // sampling, not timing a rate
      peak = std::max(peak, connections_to(rls_process.pid(), redis.redis.port()));
    }
    REQUIRE(flood.wait_for(0ms));
  }
  redis.redis.resume();
  CHECK(rls_process.call(request("d", {{{"k", "after"}}})).statuses(0).limit_remaining() == 99);
  CHECK(rls_process.terminate() == 0);
  return peak;
}

}  // namespace

TEST_CASE("envoy: --redis-max-connections N holds at most N connections to Redis",
          "[envoy][e2e][redis]") {
  constexpr int kCalls = 8;
  CHECK(peak_redis_connections({"--redis-max-connections", "3"}, kCalls) == 3);
  // The default, 16, lets every call have a connection of its own and holds at most 16.
  const int unbounded = peak_redis_connections({}, kCalls);
  CHECK(unbounded >= kCalls);
  CHECK(unbounded <= 16);
}
#endif  // SLUICE_TEST_REDIS
#endif  // SLUICE_ENVOY_RLS_BINARY

#ifdef SLUICE_TEST_REDIS
TEST_CASE("envoy: two replicas over one Redis share one budget, all or nothing", "[envoy][redis]") {
  sluice_test::RedisFixture redis;
  // Server time; a day's limits do not refill within the test.
  using RedisServer = BasicEnvoyServer<sluice::redis::RedisEngineBackend>;
  RedisServer a(fixtures(), {.backend = {.client = redis.client()}});
  RedisServer b(fixtures(), {.backend = {.client = redis.client()}});
  const auto both = request(
      "messaging", {{{"message_type", "marketing"}, {"to_number", "1"}}, {{"to_number", "1"}}});
  for (int i = 0; i < 5; ++i) {
    rls::RateLimitResponse r = (i % 2 == 0 ? a : b).ok(both);
    CHECK(r.overall_code() == kOk);
    CHECK(r.statuses(0).limit_remaining() == static_cast<std::uint32_t>(4 - i));
    CHECK(r.statuses(1).limit_remaining() == static_cast<std::uint32_t>(99 - i));
  }
  rls::RateLimitResponse over = b.ok(both);
  CHECK(over.overall_code() == kOverLimit);
  CHECK(over.statuses(0).code() == kOverLimit);
  CHECK(over.statuses(1).code() == kOk);
  CHECK(over.statuses(1).limit_remaining() == 95);  // nothing consumed
  CHECK(a.ok(request("messaging", {{{"to_number", "1"}}})).statuses(0).limit_remaining() == 94);
}

TEST_CASE("envoy: two replicas over one Redis share a fixed window, all or nothing",
          "[envoy][redis]") {
  sluice_test::RedisFixture redis;
  using RedisServer = BasicEnvoyServer<sluice::redis::RedisEngineBackend>;
  RedisServer a(fixtures(), {.backend = {.client = redis.client()}});
  RedisServer b(fixtures(), {.backend = {.client = redis.client()}});
  const auto tenant = request("sluice_fixed", {{{"tenant", "t"}}});
  for (int i = 0; i < 3; ++i) {
    rls::RateLimitResponse r = (i % 2 == 0 ? a : b).ok(tenant);
    CHECK(r.overall_code() == kOk);
    CHECK(r.statuses(0).limit_remaining() == static_cast<std::uint32_t>(2 - i));
    CHECK(reset_ms(r.statuses(0)) <= 10'000);
    CHECK(reset_ms(r.statuses(0)) > 9'000);  // the server's clock: the window opened just now
  }
  // The window is full: the GCRA limit beside it consumes nothing.
  rls::RateLimitResponse over = b.ok(request("sluice_fixed", {{{"tenant", "t"}}, {{"user", "u"}}}));
  CHECK(over.overall_code() == kOverLimit);
  CHECK(over.statuses(0).code() == kOverLimit);
  CHECK(over.statuses(1).code() == kOk);
  CHECK(over.statuses(1).limit_remaining() == 2);
  CHECK(a.ok(request("sluice_fixed", {{{"user", "u"}}})).statuses(0).limit_remaining() == 1);
}

TEST_CASE("envoy: an override Redis cannot hold is decided as absent, never an error",
          "[envoy][redis]") {
  // A yearly window refills beyond what the Redis scripts hold exactly (2^52 ns): the override
  // gets no counter, and the call is decided by the configured limits, as past max_overrides.
  // An error would fail the whole call, which a proxy that fails open admits.
  sluice_test::RedisFixture redis;
  BasicEnvoyServer<sluice::redis::RedisEngineBackend> server(
      fixtures(), {.backend = {.client = redis.client()}});
  rls::RateLimitRequest r = request("messaging", {});
  auto& d = add(r, {{"to_number", "1"}});
  d.mutable_limit()->set_requests_per_unit(1000);
  d.mutable_limit()->set_unit(envoy::type::v3::YEAR);
  for (std::uint32_t i = 0; i < 2; ++i) {
    rls::RateLimitResponse response;
    const grpc::Status status = server.call(r, response);
    INFO(status.error_message());
    REQUIRE(status.ok());
    CHECK(response.statuses(0).limit_remaining() == 99 - i);  // the configured 100 per day
  }
  CHECK(server.limiter().ignored_overrides() == 2);
}

TEST_CASE("envoy: a Redis failure is decided by the failure mode", "[envoy][redis]") {
  sluice_test::RedisFixture redis;
  using RedisServer = BasicEnvoyServer<sluice::redis::RedisEngineBackend>;
  RedisServer open(fixtures(),
                   {.backend = {.client = redis.client(std::chrono::milliseconds(300))}});
  RedisServer closed(fixtures(),
                     {.on_backend_error = sluice::FailureMode::kFailClosed,
                      .backend = {.client = redis.client(std::chrono::milliseconds(300))}});
  redis.redis.kill();
  const auto db = request("mongo_cps", {{{"database", "users"}}});
  CHECK(open.ok(db).overall_code() == kOk);
  CHECK(closed.ok(db).overall_code() == kOverLimit);
}

TEST_CASE("envoy: the local failure mode decides on the replica's share and counts it",
          "[envoy][redis]") {
  sluice_test::RedisFixture redis;
  using RedisServer = BasicEnvoyServer<sluice::redis::RedisEngineBackend>;
  using Limiter = sluice::envoy::BasicLimiter<sluice::redis::RedisEngineBackend>;
  CHECK_FALSE(Limiter::create(fixtures(), {.on_backend_error = sluice::FailureMode::kLocal,
                                           .backend = {.client = redis.client()}})
                  .ok());  // the share is required
  RedisServer local(fixtures(),
                    {.on_backend_error = sluice::FailureMode::kLocal,
                     .local_share_permille = 500,
                     .local_retry_interval = std::chrono::hours(1),
                     .backend = {.client = redis.client(std::chrono::milliseconds(300))}});
  redis.redis.kill();
  const auto tmp = request("mongo_cps", {{{"database", "tmp_1"}}});  // 2 a second: 1 locally
  rls::RateLimitResponse first = local.ok(tmp);                      // Redis fails: decided locally
  CHECK(first.overall_code() == kOk);
  CHECK(first.statuses(0).limit_remaining() == 0);
  CHECK(local.ok(tmp).overall_code() == kOverLimit);  // decided locally at once
  CHECK(local.limiter().backend_errors() == 1);
  CHECK(local.limiter().local_decisions() >= 2);
  std::string metrics;
  sluice::envoy::append_prometheus_text(metrics, local.limiter());
  CHECK(metrics.find("sluice_envoy_backend_errors_total{failure_mode=\"local\"} 1\n") !=
        std::string::npos);
  CHECK(metrics.find("sluice_envoy_local_decisions_total ") != std::string::npos);
}
#endif  // SLUICE_TEST_REDIS

// --- A denied call's cost: one backend call where the backend reports limits as they stand -----

namespace {

// Forwards to B and counts its calls. With kStanding false it lacks B's
// check_rules_as_they_stand, so a limiter over it takes the two-call fallback (a decision, then
// a peek at cost 0 when the request is denied): the answer the one call must equal.
template <class B, bool kStanding>
class CountedBackend {
 public:
  struct Options {
    typename B::Options inner{};
    std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  };
  static absl::StatusOr<CountedBackend> create(std::span<const sluice::CompiledRule> rules,
                                               const CountedBackend* previous,
                                               const Options& options) {
    absl::StatusOr<B> inner =
        B::create(rules, previous != nullptr ? &previous->inner_ : nullptr, options.inner);
    if (!inner.ok()) return inner.status();
    return CountedBackend(*std::move(inner), options.calls);
  }
  absl::Status check_rules(std::span<const sluice::RuleKey> keys, sluice::ConsumptionMode mode,
                           std::span<sluice::Decision> out) {
    ++*calls_;
    return inner_.check_rules(keys, mode, out);
  }
  absl::Status check_rules_as_they_stand(std::span<const sluice::RuleKey> keys,
                                         std::span<sluice::Decision> out) requires kStanding {
    ++*calls_;
    return inner_.check_rules_as_they_stand(keys, out);
  }
  sluice::StoreStats rule_store_stats(std::size_t rule) const {
    return inner_.rule_store_stats(rule);
  }

 private:
  CountedBackend(B inner, std::shared_ptr<std::atomic<int>> calls)
      : inner_(std::move(inner)), calls_(std::move(calls)) {}
  B inner_;
  std::shared_ptr<std::atomic<int>> calls_;
};

// 3 a second (an interval of 333333333.33 ns), 2 a second and 5 a minute stacked, a fixed window
// of 4 per 10 s, and a shadow mode limit of 1 a second.
sluice::envoy::ServiceConfig standing_config() {
  absl::StatusOr<sluice::envoy::DomainConfig> domain = sluice::envoy::load_domain_config(
      R"(domain: standing
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 2
      stacked:
        - {requests_per_unit: 5, unit: minute}
  - key: tenant
    rate_limit: {name: tenant_window, algorithm: fixed_window, period: 10s, requests_per_unit: 4}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
)",
      "standing.yaml");
  INFO(domain.status());
  REQUIRE(domain.ok());
  return {.domains = {*std::move(domain)}};
}

// One call of the sequence: each descriptor is (key, value, own hits_addend or none).
struct StandingCall {
  std::vector<std::pair<std::string, std::string>> descriptors;
  std::uint32_t hits = 1;
  std::chrono::nanoseconds advance{0};  // on the clock before the call
};

// Calls that admit, then deny on one limit while the others admit with room left (ip, user and
// tenant in both orders, hits of 1 to 3, ip at steps that are no multiple of its 1/3 s
// interval), one whose hits never fit, and denials beside a shadow mode limit.
std::vector<StandingCall> standing_sequence() {
  using D = std::vector<std::pair<std::string, std::string>>;
  const D all = {{"ip", "a"}, {"user", "u"}, {"tenant", "t"}};
  const D reversed = {{"tenant", "t"}, {"user", "u"}, {"ip", "a"}};
  std::vector<StandingCall> calls;
  // The third: user (2 a second) denies; ip and tenant as they stand.
  for (int i = 0; i < 3; ++i) calls.push_back({.descriptors = all, .advance = 100ms});
  calls.push_back({.descriptors = all});                         // user again: nothing was taken
  calls.push_back({.descriptors = reversed, .advance = 111ms});  // user still denies
  calls.push_back({.descriptors = {{"ip", "b"}, {"user", "u"}}, .hits = 2});  // user denies
  calls.push_back(
      {.descriptors = {{"ip", "c"}, {"tenant", "t"}}, .hits = 2});  // tenant fills its window
  calls.push_back({.descriptors = {{"ip", "d"}, {"user", "v"}, {"tenant", "t2"}},
                   .hits = 3,
                   .advance = 1s});  // 3 hits never fit user's burst of 2: only a peek is sent
  calls.push_back({.descriptors = {{"ip", "d"}, {"tenant", "t2"}}, .hits = 3});       // ip d full
  calls.push_back({.descriptors = {{"ip", "d"}, {"tenant", "t2"}}, .advance = 1ns});  // ip denies
  // The fourth: user w denies; ip e as it stands.
  for (int i = 0; i < 4; ++i) {
    calls.push_back({.descriptors = {{"user", "w"}, {"ip", "e"}}, .advance = 250ms});
  }
  calls.push_back({.descriptors = {{"user", "w"}, {"ip", "e"}, {"tenant", "t3"}}, .advance = 1s});
  calls.push_back({.descriptors = {{"shadow", "s"}, {"ip", "f"}}});
  calls.push_back({.descriptors = {{"shadow", "s"}, {"ip", "f"}, {"user", "u"}}});
  // Tenant t denies (its window full) beside a shadow mode limit: ip a as it stands.
  calls.push_back({.descriptors = {{"ip", "a"}, {"shadow", "s"}, {"tenant", "t"}}, .hits = 2});
  return calls;
}

sluice::envoy::Request to_request(const StandingCall& call,
                                  std::vector<std::vector<sluice::envoy::Entry>>& entries,
                                  std::vector<sluice::envoy::Descriptor>& descriptors) {
  entries.clear();
  descriptors.clear();
  for (const auto& [key, value] : call.descriptors) entries.push_back({{key, value}});
  for (const auto& e : entries) descriptors.push_back({.entries = e});
  return {.domain = "standing", .descriptors = descriptors, .hits_addend = call.hits};
}

void require_same_response(const sluice::envoy::Response& one, const sluice::envoy::Response& two) {
  CHECK(one.overall_code == two.overall_code);
  CHECK(one.retry_after == two.retry_after);
  CHECK(one.backend_failed == two.backend_failed);
  CHECK(one.degraded == two.degraded);
  REQUIRE(one.statuses.size() == two.statuses.size());
  for (std::size_t i = 0; i < one.statuses.size(); ++i) {
    INFO("descriptor " << i);
    CHECK(one.statuses[i].code == two.statuses[i].code);
    CHECK(one.statuses[i].current_limit == two.statuses[i].current_limit);
    CHECK(one.statuses[i].limit_remaining == two.statuses[i].limit_remaining);
    CHECK(one.statuses[i].duration_until_reset.count() ==
          two.statuses[i].duration_until_reset.count());
  }
  CHECK(one.headers == two.headers);
}

}  // namespace

TEST_CASE("envoy: a denied call is one backend call in memory, answered as with the peek",
          "[envoy][attack]") {
  sluice::ManualClock clock;
  using Memory = sluice::InMemoryBackend<sluice::ManualClock>;
  auto one_calls = std::make_shared<std::atomic<int>>(0);
  auto two_calls = std::make_shared<std::atomic<int>>(0);
  auto one = sluice::envoy::BasicLimiter<CountedBackend<Memory, true>>::create(
      standing_config(),
      {.response_headers = true, .backend = {.inner = {.clock = clock}, .calls = one_calls}});
  auto two = sluice::envoy::BasicLimiter<CountedBackend<Memory, false>>::create(
      standing_config(),
      {.response_headers = true, .backend = {.inner = {.clock = clock}, .calls = two_calls}});
  REQUIRE(one.ok());
  REQUIRE(two.ok());
  int denied = 0;
  int denied_with_room = 0;  // denied calls where another descriptor admitted with room left
  int two_call_denials = 0;
  std::vector<std::vector<sluice::envoy::Entry>> entries;
  std::vector<sluice::envoy::Descriptor> descriptors;
  const std::vector<StandingCall> sequence = standing_sequence();
  for (std::size_t c = 0; c < sequence.size(); ++c) {
    INFO("call " << c);
    clock.advance(sequence[c].advance);
    const sluice::envoy::Request request = to_request(sequence[c], entries, descriptors);
    const bool shadow = std::any_of(sequence[c].descriptors.begin(), sequence[c].descriptors.end(),
                                    [](const auto& d) { return d.first == "shadow"; });
    const int one_before = one_calls->load();
    const int two_before = two_calls->load();
    sluice::envoy::Response a;
    sluice::envoy::Response b;
    REQUIRE((*one)->should_rate_limit(request, a).ok());
    REQUIRE((*two)->should_rate_limit(request, b).ok());
    require_same_response(a, b);
    if (a.overall_code != sluice::envoy::Code::kOverLimit) continue;
    ++denied;
    const bool room = std::any_of(a.statuses.begin(), a.statuses.end(), [](const auto& s) {
      return s.code == sluice::envoy::Code::kOk && s.limit_remaining > 0;
    });
    denied_with_room += room ? 1 : 0;
    // One call for the enforcing limits, one more for a shadow mode limit's peek.
    CHECK(one_calls->load() - one_before == (shadow ? 2 : 1));
    // The fallback decides, then peeks (only the peek where a hit can never fit).
    two_call_denials += two_calls->load() - two_before == (shadow ? 3 : 2) ? 1 : 0;
  }
  CHECK(denied >= 6);
  CHECK(denied_with_room >= 4);
  CHECK(two_call_denials >= 4);
}

#ifdef SLUICE_TEST_REDIS
namespace {

// The Redis limiters decide at this Unix time plus the test's clock.
constexpr std::chrono::nanoseconds kStandingEpoch{std::int64_t{1'700'000'000} * 1'000'000'000};

// Script calls the server has run (INFO commandstats, cmdstat_evalsha's calls).
long evalsha_calls(const sluice_test::RedisServer& server) {
  sluice_test::Reply info = server.command({"INFO", "commandstats"});
  REQUIRE(info != nullptr);
  REQUIRE(info->type == REDIS_REPLY_STRING);
  const std::string text(info->str, info->len);
  const std::string field = "cmdstat_evalsha:calls=";
  const std::size_t at = text.find(field);
  if (at == std::string::npos) return 0;
  return std::stol(text.substr(at + field.size()));
}

}  // namespace

TEST_CASE("envoy: a denied call over Redis is one script call, answered as with the peek",
          "[envoy][redis][attack]") {
  // A denied call used to cost a second EVALSHA to report each limit as it stands: twice the
  // Redis work for a client that is being denied, and the only calls to time out where Redis
  // answers in between half and all of Envoy's timeout.
  sluice_test::RedisFixture redis;
  sluice::ManualClock clock;
  const auto client = [&](const std::string& prefix) {
    sluice::redis::ClientOptions options = redis.options();
    options.key_prefix += prefix;  // each limiter its own keys
    options.time_source = [clock] { return kStandingEpoch + clock.now(); };
    auto c = sluice::redis::Client::create(options);
    REQUIRE(c.ok());
    sluice_test::hold_keys(**c);
    return *std::move(c);
  };
  using Redis = sluice::redis::RedisEngineBackend;
  auto one = sluice::envoy::BasicLimiter<Redis>::create(
      standing_config(), {.response_headers = true, .backend = {.client = client("one:")}});
  auto two = sluice::envoy::BasicLimiter<CountedBackend<Redis, false>>::create(
      standing_config(),
      {.response_headers = true, .backend = {.inner = {.client = client("two:")}}});
  REQUIRE(one.ok());
  REQUIRE(two.ok());
  int denied = 0;
  int denied_with_room = 0;
  int two_call_denials = 0;
  std::vector<std::vector<sluice::envoy::Entry>> entries;
  std::vector<sluice::envoy::Descriptor> descriptors;
  const std::vector<StandingCall> sequence = standing_sequence();
  for (std::size_t c = 0; c < sequence.size(); ++c) {
    INFO("call " << c);
    clock.advance(sequence[c].advance);
    const sluice::envoy::Request request = to_request(sequence[c], entries, descriptors);
    const bool shadow = std::any_of(sequence[c].descriptors.begin(), sequence[c].descriptors.end(),
                                    [](const auto& d) { return d.first == "shadow"; });
    sluice::envoy::Response a;
    sluice::envoy::Response b;
    const long before_one = evalsha_calls(redis.redis);
    REQUIRE((*one)->should_rate_limit(request, a).ok());
    const long one_calls = evalsha_calls(redis.redis) - before_one;
    const long before_two = evalsha_calls(redis.redis);
    REQUIRE((*two)->should_rate_limit(request, b).ok());
    const long two_calls = evalsha_calls(redis.redis) - before_two;
    REQUIRE_FALSE(a.backend_failed);
    require_same_response(a, b);
    if (a.overall_code != sluice::envoy::Code::kOverLimit) continue;
    ++denied;
    denied_with_room += std::any_of(a.statuses.begin(), a.statuses.end(), [](const auto& s) {
      return s.code == sluice::envoy::Code::kOk && s.limit_remaining > 0;
    });
    // One script call for the enforcing limits, one more for a shadow mode limit's peek.
    CHECK(one_calls == (shadow ? 2 : 1));
    two_call_denials += two_calls == (shadow ? 3 : 2) ? 1 : 0;
  }
  CHECK(denied >= 6);
  CHECK(denied_with_room >= 4);
  CHECK(two_call_denials >= 4);
}
#endif  // SLUICE_TEST_REDIS
