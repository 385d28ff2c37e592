#include "sluice/prometheus.hpp"

#include <string>

#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "engine_fixture.hpp"
#include "example_config.hpp"
#include "promtool.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"
#ifdef SLUICE_TEST_REDIS
#include <atomic>
#include <chrono>
#include <cstdint>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include "redis_fixture.hpp"
#include "sluice/redis/limiter.hpp"
#include "sluice/redis/prometheus.hpp"
#endif

using Engine = sluice::testing::TestEngine;
using sluice::Selector;
using sluice::testing::on_route;
using sluice::testing::rule;

namespace {

using sluice_test::find_promtool;
using sluice_test::promtool_check;
using sluice_test::PromtoolResult;

// A live bundle `api` (2/s per ip) and a dry-run bundle `shadow` (1/s per ip), both global.
sluice::PolicyConfig small_config(std::string api = "api", std::string shadow = "shadow",
                                  std::string live_rule = "per-ip") {
  return {.policies = {{.name = api,
                        .rate_limits = {rule(std::move(live_rule), {Selector::kIp}, {.s = 2})}},
                       {.name = shadow,
                        .rate_limits = {rule("strict", {Selector::kIp}, {.s = 1})},
                        .dry_run = true}},
          .gateway = {.global_policies = {api, shadow}}};
}

Engine make(const sluice::PolicyConfig& config) { return sluice::testing::make_engine(config); }

// Three requests from one address: admitted, admitted (the dry-run rule would deny), denied
// (by the live rule: not charged to the dry-run one); and one request to an exempt path.
void drive(const Engine& engine) {
  for (int i = 0; i < 3; ++i) engine.evaluate(on_route("203.0.113.7", "r"));
  engine.evaluate({.client_ip = "203.0.113.7", .path = "/healthz"});
}

}  // namespace

TEST_CASE("the exposition of a small engine is exactly the documented families and samples") {
  Engine engine = make(small_config());
  drive(engine);
  CHECK(sluice::prometheus_text(engine) ==
        "# HELP sluice_engine_evaluations_total Requests the engine evaluated (exempt paths "
        "excluded).\n"
        "# TYPE sluice_engine_evaluations_total counter\n"
        "sluice_engine_evaluations_total 3\n"
        "# HELP sluice_engine_backend_errors_total Evaluations during which the limiter backend "
        "failed.\n"
        "# TYPE sluice_engine_backend_errors_total counter\n"
        "sluice_engine_backend_errors_total 0\n"
        "# HELP sluice_engine_reloads_total Successful config reloads.\n"
        "# TYPE sluice_engine_reloads_total counter\n"
        "sluice_engine_reloads_total 0\n"
        "# HELP sluice_engine_failed_reloads_total Config reloads that failed and kept the "
        "previous config.\n"
        "# TYPE sluice_engine_failed_reloads_total counter\n"
        "sluice_engine_failed_reloads_total 0\n"
        "# HELP sluice_rule_allowed_total Admitted requests the rule applied to (for a dry-run "
        "rule, also those it would deny).\n"
        "# TYPE sluice_rule_allowed_total counter\n"
        "sluice_rule_allowed_total{rule=\"api/per-ip\",dry_run=\"false\"} 2\n"
        "sluice_rule_allowed_total{rule=\"shadow/strict\",dry_run=\"true\"} 2\n"
        "# HELP sluice_rule_denied_total Requests the rule denied (live rules).\n"
        "# TYPE sluice_rule_denied_total counter\n"
        "sluice_rule_denied_total{rule=\"api/per-ip\",dry_run=\"false\"} 1\n"
        "sluice_rule_denied_total{rule=\"shadow/strict\",dry_run=\"true\"} 0\n"
        "# HELP sluice_rule_dry_denied_total Requests the rule would have denied (dry-run "
        "rules).\n"
        "# TYPE sluice_rule_dry_denied_total counter\n"
        "sluice_rule_dry_denied_total{rule=\"api/per-ip\",dry_run=\"false\"} 0\n"
        "sluice_rule_dry_denied_total{rule=\"shadow/strict\",dry_run=\"true\"} 1\n"
        "# HELP sluice_rule_evictions_total Live keys evicted from the rule's full store (each "
        "got a fresh bucket).\n"
        "# TYPE sluice_rule_evictions_total counter\n"
        "sluice_rule_evictions_total{rule=\"api/per-ip\",dry_run=\"false\"} 0\n"
        "sluice_rule_evictions_total{rule=\"shadow/strict\",dry_run=\"true\"} 0\n"
        "# HELP sluice_rule_idle_reclaimed_total Idle keys dropped from the rule's full store.\n"
        "# TYPE sluice_rule_idle_reclaimed_total counter\n"
        "sluice_rule_idle_reclaimed_total{rule=\"api/per-ip\",dry_run=\"false\"} 0\n"
        "sluice_rule_idle_reclaimed_total{rule=\"shadow/strict\",dry_run=\"true\"} 0\n"
        "# HELP sluice_rule_capacity_denials_total New keys denied because the rule's store was "
        "full.\n"
        "# TYPE sluice_rule_capacity_denials_total counter\n"
        "sluice_rule_capacity_denials_total{rule=\"api/per-ip\",dry_run=\"false\"} 0\n"
        "sluice_rule_capacity_denials_total{rule=\"shadow/strict\",dry_run=\"true\"} 0\n"
        "# HELP sluice_rule_keys Keys the rule's store holds.\n"
        "# TYPE sluice_rule_keys gauge\n"
        "sluice_rule_keys{rule=\"api/per-ip\",dry_run=\"false\"} 1\n"
        "sluice_rule_keys{rule=\"shadow/strict\",dry_run=\"true\"} 1\n");
}

TEST_CASE("append_prometheus_text appends to what the string already holds") {
  Engine engine = make(small_config());
  std::string out = "# existing\n";
  sluice::append_prometheus_text(out, engine);
  CHECK(out == "# existing\n" + sluice::prometheus_text(engine));
}

TEST_CASE("reloads and failed reloads are counted and the counters survive a reload") {
  Engine engine = make(small_config());
  drive(engine);
  auto next = engine.reload(small_config());
  REQUIRE(next.ok());
  sluice::PolicyConfig broken = small_config();
  broken.policies[0].rate_limits[0].requests_per.s = 0;
  CHECK_FALSE(next->reload(broken).ok());
  const std::string text = sluice::prometheus_text(*next);
  CHECK(text.find("\nsluice_engine_evaluations_total 3\n") != std::string::npos);
  CHECK(text.find("\nsluice_engine_reloads_total 1\n") != std::string::npos);
  CHECK(text.find("\nsluice_engine_failed_reloads_total 1\n") != std::string::npos);
  CHECK(text.find("\nsluice_rule_denied_total{rule=\"api/per-ip\",dry_run=\"false\"} 1\n") !=
        std::string::npos);
}

TEST_CASE("label values escape backslash, double quote and line feed and nothing else") {
  std::string out;
  sluice::detail::append_prometheus_label_value(out, "a\\b\"c\nd} e,f=\"g\t");
  CHECK(out == "a\\\\b\\\"c\\nd} e,f=\\\"g\t");
}

TEST_CASE("hostile bundle and rule names cannot break a line or forge a sample") {
  // Names are printable ASCII, so the attack is a quote that closes the label value early.
  Engine engine = make(small_config(R"(a"} 1 # \)", "shadow", R"(r",rule="forged)"));
  drive(engine);
  const std::string text = sluice::prometheus_text(engine);
  CHECK(text.find("sluice_rule_allowed_total{rule=\"a\\\"} 1 # \\\\/r\\\",rule=\\\"forged\","
                  "dry_run=\"false\"} 2\n") != std::string::npos);
  CHECK(text.find("rule=\"forged\"") == std::string::npos);
}

TEST_CASE("promtool check metrics accepts the exposition of an engine that evaluated requests") {
  const std::string promtool = find_promtool();
  if (promtool.empty()) {
    WARN("SKIPPED: promtool not found (Debian package `prometheus`); the exposition is unchecked");
    return;
  }
  Engine engine = make(small_config(R"(a"} 1 # \)", "shadow", R"(r",rule="forged)"));
  drive(engine);
  REQUIRE(engine.reload(small_config()).ok());
  const std::string text = sluice::prometheus_text(engine);
  const PromtoolResult result = promtool_check(promtool, text);
  INFO(result.output);
  CHECK(result.status == 0);
  CHECK(result.output.empty());  // no lint findings either

  const PromtoolResult broken = promtool_check(promtool, "sluice_x{rule=\"a\"b\"} 1\n");
  CHECK(broken.status != 0);  // the check can fail
}

TEST_CASE("adaptive rules add their limit factor and decreases, and promtool accepts them") {
  using namespace std::chrono_literals;
  sluice::PolicyConfig config = small_config();
  config.policies[0].rate_limits[0].adaptive =
      sluice::AdaptivePolicy{.target_latency = 100ms, .min_samples = 1, .min_clients = 1};
  Engine engine = make(config);
  REQUIRE(
      engine.record_upstream(on_route("203.0.113.7", "r"), {.latency = 5ms, .status = 503}).ok());
  const std::string text = sluice::prometheus_text(engine);
  CHECK(text.ends_with(
      "# HELP sluice_rule_limit_factor_permille The adaptive rule's limit factor in permille "
      "(1000 = the configured limit).\n"
      "# TYPE sluice_rule_limit_factor_permille gauge\n"
      "sluice_rule_limit_factor_permille{rule=\"api/per-ip\",dry_run=\"false\"} 100\n"
      "# HELP sluice_rule_limit_decreases_total Times the adaptive rule's limit factor was cut "
      "(overloaded intervals, 429/503 answers).\n"
      "# TYPE sluice_rule_limit_decreases_total counter\n"
      "sluice_rule_limit_decreases_total{rule=\"api/per-ip\",dry_run=\"false\"} 1\n"));
  CHECK(sluice::prometheus_text(make(small_config())).find("limit_factor") == std::string::npos);

  sluice_test::check_promtool_accepts(text);
}

#ifdef SLUICE_TEST_REDIS
TEST_CASE(
    "a Redis client's lost give-backs are a counter beside the engine's, which promtool accepts",
    "[attack]") {
  sluice_test::RedisFixture s;
  const std::shared_ptr<sluice::redis::Client> client = s.client();
  Engine engine = make(small_config());
  drive(engine);
  std::string body;  // what a service over Redis serves: its engine's families, then its client's
  sluice::append_prometheus_text(body, engine);
  const std::size_t engine_end = body.size();
  sluice::redis::append_prometheus_text(body, *client);
  CHECK(body.substr(engine_end) ==
        "# HELP sluice_redis_give_backs_lost_total Checked items whose cost a Redis Cluster slot "
        "booked and could not give back when another slot denied or failed (each stays taken "
        "until its windows drain).\n"
        "# TYPE sluice_redis_give_backs_lost_total counter\n"
        "sluice_redis_give_backs_lost_total 0\n"
        "# HELP sluice_redis_coalesced_checks_total Single-key checks that shared a script call "
        "with at least one other check.\n"
        "# TYPE sluice_redis_coalesced_checks_total counter\n"
        "sluice_redis_coalesced_checks_total 0\n"
        "# HELP sluice_redis_coalesced_calls_peak The most coalescing script calls that were in "
        "flight at once.\n"
        "# TYPE sluice_redis_coalesced_calls_peak gauge\n"
        "sluice_redis_coalesced_calls_peak 0\n");
  sluice_test::check_promtool_accepts(body);
}

TEST_CASE(
    "a Redis client's coalesced checks are a counter and its peak of calls a gauge, which promtool "
    "accepts") {
  sluice_test::RedisFixture s;
  sluice::redis::ClientOptions options = s.options();
  options.max_coalesced_calls = 1;  // a check that finds one call in flight queues
  absl::StatusOr<std::shared_ptr<sluice::redis::Client>> client =
      sluice::redis::Client::create(options);
  REQUIRE(client.ok());
  absl::StatusOr<sluice::redis::RedisGcraLimiter> limiter = sluice::redis::RedisGcraLimiter::create(
      {{.requests = 1'000'000, .period = std::chrono::seconds(1)}}, *client);
  REQUIRE(limiter.ok());
  constexpr int kThreads = 16;
  std::latch start(kThreads);  // every thread checks at once, so that checks queue
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < 25; ++i) {
        errors += limiter->check(t % 2 == 0 ? "even" : "odd").ok() ? 0 : 1;
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  const std::uint64_t coalesced = (*client)->coalesced_checks();
  REQUIRE(errors.load() == 0);
  REQUIRE(coalesced > 0);
  std::string body;
  sluice::redis::append_prometheus_text(body, **client);
  CHECK(body.ends_with(absl::StrCat(
      "\n# HELP sluice_redis_coalesced_checks_total Single-key checks that shared a script call "
      "with at least one other check.\n"
      "# TYPE sluice_redis_coalesced_checks_total counter\n"
      "sluice_redis_coalesced_checks_total ",
      coalesced,
      "\n"
      "# HELP sluice_redis_coalesced_calls_peak The most coalescing script calls that were in "
      "flight at once.\n"
      "# TYPE sluice_redis_coalesced_calls_peak gauge\n"
      "sluice_redis_coalesced_calls_peak 1\n")));
  sluice_test::check_promtool_accepts(body);
}
#endif
