#include "sluice/engine_events.hpp"

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "engine_fixture.hpp"
#include "example_config.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"

using namespace std::chrono_literals;
using Engine = sluice::testing::TestEngine;
using sluice::Selector;
using sluice::testing::on_route;
using sluice::testing::rule;

namespace {

// Every event as one line of text, copied while the hook runs (views are valid only then).
struct Recorder {
  std::shared_ptr<std::vector<std::string>> lines = std::make_shared<std::vector<std::string>>();
  std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();

  sluice::EngineEventHook hook() const {
    return [lines = lines, mutex = mutex](const sluice::EngineEvent& event) {
      std::string line = std::visit(
          [](const auto& e) -> std::string {
            using E = std::decay_t<decltype(e)>;
            if constexpr (std::is_same_v<E, sluice::DryRunDenialEvent>) {
              return absl::StrCat("dry-run ", std::string(e.rule_label), " rule=", e.rule,
                                  " retry_after_ms=", e.decision.retry_after / 1ms,
                                  " suppressed=", e.suppressed);
            } else if constexpr (std::is_same_v<E, sluice::BackendErrorEvent>) {
              return absl::StrCat("backend-error ", e.status.ToString(),
                                  " suppressed=", e.suppressed);
            } else if constexpr (std::is_same_v<E, sluice::EvictionEvent>) {
              return absl::StrCat("evicted ", std::string(e.rule_label), " rule=", e.rule,
                                  " n=", e.evicted);
            } else {
              return absl::StrCat("reload ", e.status.ToString(), " rules=", e.rules,
                                  " kept=", e.rules_kept);
            }
          },
          event);
      std::lock_guard lock(*mutex);
      lines->push_back(std::move(line));
    };
  }
  std::vector<std::string> take() const {
    std::lock_guard lock(*mutex);
    return std::exchange(*lines, {});
  }
};

// A live bundle `api` (2/s per ip) and a dry-run bundle `shadow` (1/s per ip), both global.
sluice::PolicyConfig config_with_shadow() {
  return {.policies = {{.name = "api", .rate_limits = {rule("per-ip", {Selector::kIp}, {.s = 2})}},
                       {.name = "shadow",
                        .rate_limits = {rule("strict", {Selector::kIp}, {.s = 1})},
                        .dry_run = true}},
          .gateway = {.global_policies = {"api", "shadow"}}};
}

Engine make(const sluice::PolicyConfig& config, sluice::ManualClock clock, const Recorder& events,
            sluice::StoreOptions store = {.seed = 1}) {
  return sluice::testing::make_engine(config, std::move(clock), events.hook(), store);
}

// An in-memory backend that fails every check with `*failure` while it is not OK. Its clock (the
// inner backend's ManualClock) is the engine's time.
class FlakyBackend {
 public:
  using Inner = sluice::InMemoryBackend<sluice::ManualClock>;
  struct Options {
    Inner::Options inner{};
    std::shared_ptr<absl::Status> failure = std::make_shared<absl::Status>();
  };
  static absl::StatusOr<FlakyBackend> create(std::span<const sluice::CompiledRule> rules,
                                             const FlakyBackend* previous, const Options& options) {
    auto inner = Inner::create(rules, previous ? &previous->inner_ : nullptr, options.inner);
    if (!inner.ok()) return inner.status();
    return FlakyBackend(*std::move(inner), options.failure);
  }
  absl::Status check_rules(std::span<const sluice::RuleKey> keys, sluice::ConsumptionMode mode,
                           std::span<sluice::Decision> out) {
    if (!failure_->ok()) return *failure_;
    return inner_.check_rules(keys, mode, out);
  }
  sluice::StoreStats rule_store_stats(std::size_t rule) const {
    return inner_.rule_store_stats(rule);
  }
  std::chrono::nanoseconds now() const { return inner_.now(); }

 private:
  FlakyBackend(Inner inner, std::shared_ptr<absl::Status> failure)
      : inner_(std::move(inner)), failure_(std::move(failure)) {}
  Inner inner_;
  std::shared_ptr<absl::Status> failure_;  // set by the test's thread only
};
static_assert(sluice::EngineBackend<FlakyBackend>);
using FlakyEngine = sluice::BasicRateLimitEngine<FlakyBackend>;

FlakyEngine make_flaky(sluice::ManualClock clock, const Recorder& events,
                       const FlakyBackend::Options& options) {
  FlakyBackend::Options o = options;  // assigned member-wise: GCC 12 -O2 reports a false
  o.inner.store.seed = 1;             // maybe-uninitialized for the nested designated initializer
  o.inner.clock = clock;
  auto engine = FlakyEngine::create(config_with_shadow(), o, {}, events.hook());
  REQUIRE(engine.ok());
  return *std::move(engine);
}

const absl::Status kDown = absl::UnavailableError("backend down (test)");
const absl::Status kSlow = absl::DeadlineExceededError("backend slow (test)");

}  // namespace

TEST_CASE("a dry-run denial reports the rule's label and would-be decision, never the key") {
  sluice::ManualClock clock;
  Recorder events;
  Engine engine = make(config_with_shadow(), clock, events);
  CHECK(engine.evaluate(on_route("203.0.113.7", "r")).allowed);
  CHECK(events.take().empty());
  CHECK(engine.evaluate(on_route("203.0.113.7", "r")).allowed);  // the dry-run rule would deny
  const std::vector<std::string> lines = events.take();
  CHECK(lines ==
        std::vector<std::string>{"dry-run shadow/strict rule=1 retry_after_ms=1000 suppressed=0"});
  CHECK(lines[0].find("203.0.113") == std::string::npos);
}

TEST_CASE("one client cannot make a dry-run rule raise an event per request", "[attack]") {
  // The live rule admits 100 a second per ip, the dry run 1: every request of a client after its
  // first in a second would be denied by the dry run. A hook that logs each event would write
  // one line per such request, so the client would set the service's log volume.
  const sluice::PolicyConfig config{
      .policies = {{.name = "api", .rate_limits = {rule("per-ip", {Selector::kIp}, {.s = 100})}},
                   {.name = "shadow",
                    .rate_limits = {rule("strict", {Selector::kIp}, {.s = 1})},
                    .dry_run = true}},
      .gateway = {.global_policies = {"api", "shadow"}}};
  sluice::ManualClock clock;
  Recorder events;
  Engine engine = make(config, clock, events);
  for (int i = 0; i < 50; ++i) CHECK(engine.evaluate(on_route("203.0.113.7", "r")).allowed);
  CHECK(events.take() ==
        std::vector<std::string>{"dry-run shadow/strict rule=1 retry_after_ms=1000 suppressed=0"});
  CHECK(engine.stats()[1].dry_denied == 49);  // the counter counts every would-be denial

  clock.advance(999ms);
  CHECK(engine.evaluate(on_route("203.0.113.7", "r")).allowed);
  CHECK(events.take().empty());
  clock.advance(1ms);  // t = 1 s: the next event carries the 48 + 1 held back
  for (int i = 0; i < 3; ++i) CHECK(engine.evaluate(on_route("203.0.113.7", "r")).allowed);
  CHECK(events.take() ==
        std::vector<std::string>{"dry-run shadow/strict rule=1 retry_after_ms=1000 suppressed=49"});
  CHECK(engine.stats()[1].dry_denied == 52);
}

TEST_CASE("a failing backend reports a backend error and counts it") {
  sluice::ManualClock clock;
  Recorder events;
  FlakyBackend::Options options;
  FlakyEngine engine = make_flaky(clock, events, options);
  *options.failure = kDown;
  const sluice::Evaluation e = engine.evaluate(on_route("203.0.113.7", "r"));
  CHECK(e.allowed);  // fail-open by default
  CHECK(events.take() ==
        std::vector<std::string>{"backend-error UNAVAILABLE: backend down (test) suppressed=0"});
  CHECK(engine.engine_stats() == sluice::EngineStats{.evaluations = 1, .backend_errors = 1});

  *options.failure = absl::OkStatus();
  CHECK(engine.evaluate(on_route("203.0.113.7", "r")).allowed);
  CHECK(events.take().empty());
  CHECK(engine.engine_stats() == sluice::EngineStats{.evaluations = 2, .backend_errors = 1});
}

TEST_CASE("backend errors are reported at most once a second with the count of those held back") {
  sluice::ManualClock clock;
  Recorder events;
  FlakyBackend::Options options;
  FlakyEngine engine = make_flaky(clock, events, options);
  *options.failure = kDown;
  for (int i = 0; i < 13; ++i) engine.evaluate(on_route("203.0.113.7", "r"));
  CHECK(events.take() ==
        std::vector<std::string>{"backend-error UNAVAILABLE: backend down (test) suppressed=0"});
  CHECK(engine.engine_stats().backend_errors == 13);  // the counter counts every one

  clock.advance(999ms);
  engine.evaluate(on_route("203.0.113.7", "r"));
  CHECK(events.take().empty());

  clock.advance(1ms);  // t = 1 s: the next event carries the 13 held back
  engine.evaluate(on_route("203.0.113.7", "r"));
  engine.evaluate(on_route("203.0.113.7", "r"));
  CHECK(events.take() ==
        std::vector<std::string>{"backend-error UNAVAILABLE: backend down (test) suppressed=13"});

  clock.advance(1s);  // t = 2 s
  engine.evaluate(on_route("203.0.113.7", "r"));
  CHECK(events.take() ==
        std::vector<std::string>{"backend-error UNAVAILABLE: backend down (test) suppressed=1"});
  CHECK(engine.engine_stats().backend_errors == 17);
}

TEST_CASE("each status code of backend errors is rate-limited on its own") {
  sluice::ManualClock clock;
  Recorder events;
  FlakyBackend::Options options;
  FlakyEngine engine = make_flaky(clock, events, options);
  for (const absl::Status& failure : {kDown, kSlow, kDown, kSlow, kSlow}) {
    *options.failure = failure;
    engine.evaluate(on_route("203.0.113.7", "r"));
  }
  CHECK(events.take() == std::vector<std::string>{
                             "backend-error UNAVAILABLE: backend down (test) suppressed=0",
                             "backend-error DEADLINE_EXCEEDED: backend slow (test) suppressed=0"});

  clock.advance(1s);
  engine.evaluate(on_route("203.0.113.7", "r"));  // still slow
  *options.failure = kDown;
  engine.evaluate(on_route("203.0.113.7", "r"));
  CHECK(events.take() == std::vector<std::string>{
                             "backend-error DEADLINE_EXCEEDED: backend slow (test) suppressed=2",
                             "backend-error UNAVAILABLE: backend down (test) suppressed=1"});
}

TEST_CASE("a reloaded generation keeps holding back the backend errors of the previous one") {
  sluice::ManualClock clock;
  Recorder events;
  FlakyBackend::Options options;
  FlakyEngine engine = make_flaky(clock, events, options);
  *options.failure = kDown;
  engine.evaluate(on_route("203.0.113.7", "r"));
  engine.evaluate(on_route("203.0.113.7", "r"));
  auto next = engine.reload(config_with_shadow());
  REQUIRE(next.ok());
  events.take();
  next->evaluate(on_route("203.0.113.7", "r"));
  CHECK(events.take().empty());
  clock.advance(1s);
  next->evaluate(on_route("203.0.113.7", "r"));
  CHECK(events.take() ==
        std::vector<std::string>{"backend-error UNAVAILABLE: backend down (test) suppressed=2"});
}

TEST_CASE("a cost no rule can admit is the request's error, not a backend error") {
  sluice::ManualClock clock;
  Recorder events;
  Engine engine = make(config_with_shadow(), clock, events);
  sluice::RequestContext request = on_route("203.0.113.7", "r");
  request.cost = 100;
  const sluice::Evaluation e = engine.evaluate(request);
  CHECK(e.backend_error.code() == absl::StatusCode::kInvalidArgument);
  CHECK(events.take().empty());
  CHECK(engine.engine_stats() == sluice::EngineStats{.evaluations = 1});
}

TEST_CASE("evictions are reported at most once per rule per second with every eviction counted") {
  sluice::ManualClock clock;
  Recorder events;
  const sluice::PolicyConfig config{
      .policies = {{.name = "api", .rate_limits = {rule("per-ip", {Selector::kIp}, {.s = 1})}}},
      .gateway = {.global_policies = {"api"}}};
  Engine engine = make(config, clock, events, {.max_keys_per_shard = 2, .seed = 1});
  auto spray = [&](int first, int count) {
    for (int i = first; i < first + count; ++i) {
      engine.evaluate(on_route(absl::StrCat("10.0.", i / 256, ".", i % 256), "r"));
    }
  };
  auto evicted = [&] { return engine.stats()[0].store.live_evicted; };

  spray(0, 1000);  // each key is live for 1 s: a full shard must evict
  const std::uint64_t first_second = evicted();
  REQUIRE(first_second > 0);
  CHECK(events.take().empty());  // the first look (first request) saw none; the next is at 1 s

  clock.advance(999ms);
  spray(1000, 10);
  CHECK(events.take().empty());

  clock.advance(1ms);  // t = 1 s
  spray(2000, 1);
  CHECK(events.take() ==
        std::vector<std::string>{absl::StrCat("evicted api/per-ip rule=0 n=", evicted())});
  const std::uint64_t reported = evicted();
  spray(3000, 500);  // more evictions within the same second: held back, not lost
  CHECK(events.take().empty());
  REQUIRE(evicted() > reported);

  clock.advance(1s);  // t = 2 s
  spray(4000, 1);
  CHECK(events.take() == std::vector<std::string>{
                             absl::StrCat("evicted api/per-ip rule=0 n=", evicted() - reported)});

  clock.advance(1s);  // t = 3 s: every key is idle, so a sweep evicts no live key
  const std::uint64_t before = evicted();
  spray(5000, 1);
  CHECK(evicted() == before);
  CHECK(events.take().empty());  // the rule was looked at, and nothing new was evicted
}

TEST_CASE("reloads report success with the rules kept, and failures with their status") {
  sluice::ManualClock clock;
  Recorder events;
  Engine engine = make(config_with_shadow(), clock, events);
  sluice::PolicyConfig changed = config_with_shadow();
  changed.policies[1].rate_limits[0].requests_per.s = 5;  // a changed rule starts fresh
  auto next = engine.reload(changed);
  REQUIRE(next.ok());
  sluice::PolicyConfig broken = changed;
  broken.policies[0].rate_limits[0].requests_per.s = 0;
  CHECK_FALSE(next->reload(broken).ok());
  next->report_failed_reload(absl::NotFoundError("gateway.yaml: no such file"));
  CHECK(events.take() ==
        std::vector<std::string>{
            "reload OK rules=2 kept=1",
            "reload INVALID_ARGUMENT: policies[0].rate_limits[0].requests_per.s must be > 0 "
            "rules=0 kept=0",
            "reload NOT_FOUND: gateway.yaml: no such file rules=0 kept=0"});
  CHECK(next->engine_stats() == sluice::EngineStats{.reloads = 1, .failed_reloads = 2});
  CHECK(engine.engine_stats() == next->engine_stats());  // one set of counters for all generations
}

TEST_CASE("a reloaded generation keeps the event hook") {
  sluice::ManualClock clock;
  Recorder events;
  Engine engine = make(config_with_shadow(), clock, events);
  auto next = engine.reload(config_with_shadow());
  REQUIRE(next.ok());
  events.take();
  next->evaluate(on_route("203.0.113.7", "r"));
  next->evaluate(on_route("203.0.113.7", "r"));
  CHECK(events.take() ==
        std::vector<std::string>{"dry-run shadow/strict rule=1 retry_after_ms=1000 suppressed=0"});
}

TEST_CASE("an engine without a hook counts but reports nothing") {
  sluice::ManualClock clock;
  auto engine = Engine::create(config_with_shadow(), {.store = {.seed = 1}, .clock = clock});
  REQUIRE(engine.ok());
  for (int i = 0; i < 3; ++i) engine->evaluate(on_route("203.0.113.7", "r"));
  CHECK(engine->engine_stats() == sluice::EngineStats{.evaluations = 3});
  CHECK(engine->stats()[1].dry_denied == 1);  // the 3rd, denied live, is not charged to it
}

TEST_CASE("a dry-run rule's peek at a key in debt answers the would-be denial and raises no event",
          "[attack]") {
  sluice::ManualClock clock;
  Recorder events;
  // Live: 1000 per second per address. On trial: 10 per second per address.
  const sluice::PolicyConfig config{
      .policies = {{.name = "wide", .rate_limits = {rule("per-ip", {Selector::kIp}, {.s = 1000})}},
                   {.name = "trial",
                    .rate_limits = {rule("tokens", {Selector::kIp}, {.s = 10})},
                    .dry_run = true}},
      .gateway = {.global_policies = {"wide", "trial"}}};
  Engine engine = make(config, clock, events);
  sluice::Evaluation e;
  Engine::Settlement settlement;
  engine.evaluate(on_route("10.0.0.1", "r"), e, settlement);
  REQUIRE(e.allowed);
  REQUIRE(engine.settle(settlement, 25).ok());  // `trial` is 15 beyond its bucket: in debt
  REQUIRE(events.take().empty());

  sluice::RequestContext peek = on_route("10.0.0.1", "r");
  peek.cost = 0;
  const sluice::Evaluation peeked = engine.evaluate(peek);
  CHECK(peeked.allowed);
  REQUIRE(peeked.dry_denied.has_value());  // the caller that peeks sees the would-be denial
  CHECK(peeked.dry_denied->decision.retry_after == 1500ms);
  CHECK(events.take().empty());  // but it is no request the rule would have refused

  CHECK(engine.evaluate(on_route("10.0.0.1", "r")).allowed);  // a request of cost 1 is one
  CHECK(events.take() ==
        std::vector<std::string>{"dry-run trial/tokens rule=1 retry_after_ms=1600 suppressed=0"});
}
