// sluice::redis::RedisAttemptLimiter against a real redis-server that each test case starts.
//
// Time is driven through the limiters' time source (ClientOptions::time_source), which hands the
// script a server time instead of TIME; the parity test replays one scripted sequence against the
// in-memory limiter on a ManualClock and demands identical answers.
#include "sluice/redis/attempt_limiter.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "redis_fixture.hpp"
#include "redis_server.hpp"
#include "sluice/attempt.hpp"
#include "sluice/clock.hpp"
#include "sluice/redis/detail/cluster.hpp"

namespace {

using namespace std::chrono_literals;
using sluice::AttemptDecision;
using sluice::AttemptReason;
using sluice::redis::RedisAttemptLimiter;
using std::chrono::microseconds;

constexpr microseconds kT0 = 1'700'000'000s;  // a server time, µs since the Unix epoch
constexpr sluice::AttemptPolicy kPolicy{
    .initial_delay = 1s, .delay_cap = 8s, .quiet_period = 1min, .lease = 5s};

using Server = sluice_test::RedisFixture;  // one redis-server per test case

// The time of every limiter `make` creates (its client's time source): tests set it through
// at(), and the script decides at it instead of the server's TIME.
sluice::ManualClock server_time(kT0);
sluice::redis::ClientOptions timed(sluice::redis::ClientOptions options) {
  options.time_source = [] { return server_time.now(); };
  return options;
}

RedisAttemptLimiter make(const Server& server, sluice::AttemptPolicy policy = kPolicy) {
  auto limiter = RedisAttemptLimiter::create(policy, timed(server.options()));
  INFO(limiter.status());
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

// `limiter` (made by make()) at `t`.
RedisAttemptLimiter& at(RedisAttemptLimiter& limiter, microseconds t) {
  server_time.set(t);
  return limiter;
}

AttemptDecision begin_at(RedisAttemptLimiter& limiter, microseconds t,
                         std::string_view subject = "alice") {
  absl::StatusOr<AttemptDecision> d = at(limiter, t).begin(subject);
  INFO(d.status());
  REQUIRE(d.ok());
  return *d;
}

std::int64_t pttl(const Server& server, const std::string& key) {
  sluice_test::Reply r = server.redis.command({"PTTL", key});
  REQUIRE(r);
  REQUIRE(r->type == REDIS_REPLY_INTEGER);
  return r->integer;
}

std::int64_t integer(const Server& server, std::initializer_list<std::string_view> command) {
  sluice_test::Reply r = server.redis.command(command);
  REQUIRE(r);
  REQUIRE(r->type == REDIS_REPLY_INTEGER);
  return r->integer;
}

// The server's count of writes since its last save: unchanged across commands that write nothing.
std::int64_t writes(const Server& server) {
  sluice_test::Reply r = server.redis.command({"INFO", "persistence"});
  REQUIRE(r);
  REQUIRE(r->type == REDIS_REPLY_STRING);
  const std::string info(r->str, r->len);
  const std::string field = "rdb_changes_since_last_save:";
  const std::size_t at = info.find(field);
  REQUIRE(at != std::string::npos);
  return std::stoll(info.substr(at + field.size()));
}

// The subject's hash, field by field (empty when the key is absent).
std::map<std::string, std::string> record(const Server& server, const std::string& key) {
  sluice_test::Reply r = server.redis.command({"HGETALL", key});
  REQUIRE(r);
  std::map<std::string, std::string> out;
  for (std::size_t i = 0; r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
    out[std::string(r->element[i]->str, r->element[i]->len)] =
        std::string(r->element[i + 1]->str, r->element[i + 1]->len);
  }
  return out;
}

}  // namespace

TEST_CASE("over redis each failure doubles the wait up to the cap and success clears it") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  microseconds t = kT0;
  std::uint64_t failures = 0;
  for (microseconds wait : {1s, 2s, 4s, 8s, 8s}) {
    AttemptDecision d = begin_at(limiter, t);
    REQUIRE(d.admitted());
    CHECK(d.failures == failures);
    REQUIRE(at(limiter, t).fail(d.receipt).ok());
    ++failures;
    CHECK(begin_at(limiter, t) == AttemptDecision{.reason = AttemptReason::kBackoff,
                                                  .retry_after = wait,
                                                  .failures = failures});
    CHECK(begin_at(limiter, t + wait - 1us).retry_after == 1us);
    t += wait;
  }
  AttemptDecision d = begin_at(limiter, t);
  REQUIRE(d.admitted());
  REQUIRE(at(limiter, t).succeed(d.receipt).ok());
  AttemptDecision after = begin_at(limiter, t);
  CHECK(after.admitted());
  CHECK(after.failures == 0);
}

TEST_CASE("over redis an unfinished attempt fails at its lease deadline and stays fenced") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  AttemptDecision old = begin_at(limiter, kT0);
  CHECK(begin_at(limiter, kT0 + 2s) ==
        AttemptDecision{.reason = AttemptReason::kAttemptActive, .retry_after = 3s});
  CHECK(begin_at(limiter, kT0 + 5s) ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 1s, .failures = 1});
  AttemptDecision current = begin_at(limiter, kT0 + 6s);
  REQUIRE(current.admitted());
  CHECK(current.receipt.token() == 2);
  CHECK(at(limiter, kT0 + 6s).succeed(old.receipt).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(begin_at(limiter, kT0 + 6s).reason == AttemptReason::kAttemptActive);
  REQUIRE(at(limiter, kT0 + 7s).fail(current.receipt).ok());
  CHECK(begin_at(limiter, kT0 + 7s) ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 2s, .failures = 2});
}

TEST_CASE("over redis failures are forgotten after the quiet period and the clock is clamped") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  AttemptDecision d = begin_at(limiter, kT0);
  REQUIRE(at(limiter, kT0).fail(d.receipt).ok());
  CHECK(begin_at(limiter, kT0 - 10s).retry_after == 1s);  // a clock step back is clamped
  CHECK(begin_at(limiter, kT0 + 1min - 1us).failures == 1);
  sluice::AttemptReceipt leased = begin_at(limiter, kT0 + 1min - 1us, "bob").receipt;
  REQUIRE(at(limiter, kT0 + 1min).fail(leased).ok());
  AttemptDecision later = begin_at(limiter, kT0 + 2min, "bob");
  CHECK(later.admitted());
  CHECK(later.failures == 0);
}

TEST_CASE("redis and memory answer a scripted sequence identically") {
  Server server;
  RedisAttemptLimiter redis = make(server);
  sluice::ManualClock clock;
  auto memory = sluice::AttemptLimiter<sluice::ManualClock>::create(kPolicy, {.seed = 3}, clock);
  REQUIRE(memory.ok());

  const std::string subjects[] = {"alice", "bob", "carol"};
  struct Held {
    sluice::AttemptReceipt redis, memory;
  };
  std::vector<std::vector<Held>> receipts(3);  // every receipt ever issued, per subject
  std::mt19937_64 random(2026);
  microseconds t = kT0;
  // Strictly increasing times, as a server's TIME would be.
  std::map<AttemptReason, int> reasons;  // the sequence must reach every answer
  std::map<absl::StatusCode, int> completions;
  const microseconds steps[] = {1us, 1us, 100ms, 250ms, 500ms, 999ms, 1s, 2s, 5s, 70s};
  for (int i = 0; i < 600; ++i) {
    t += steps[random() % std::size(steps)];
    clock.set(t);
    const std::size_t s = random() % 3;
    const int op = static_cast<int>(random() % 6);  // 0-2 begin, 3 succeed, 4-5 fail
    INFO("step " << i << " op " << op << " subject " << subjects[s]);
    if (op <= 2 || receipts[s].empty()) {
      absl::StatusOr<AttemptDecision> r = at(redis, t).begin(subjects[s]);
      absl::StatusOr<AttemptDecision> m = memory->begin(subjects[s]);
      REQUIRE(r.ok());
      REQUIRE(m.ok());
      CHECK(r->reason == m->reason);
      CHECK(r->retry_after == m->retry_after);
      CHECK(r->failures == m->failures);
      ++reasons[m->reason];
      if (r->admitted() && m->admitted()) receipts[s].push_back({r->receipt, m->receipt});
      continue;
    }
    // Complete the newest receipt most of the time, an older one otherwise.
    const std::size_t n = receipts[s].size();
    const Held& held = receipts[s][random() % 4 != 0 ? n - 1 : random() % n];
    const bool success = op == 3;
    const absl::Status r =
        success ? at(redis, t).succeed(held.redis) : at(redis, t).fail(held.redis);
    const absl::Status m = success ? memory->succeed(held.memory) : memory->fail(held.memory);
    CHECK(r.code() == m.code());
    ++completions[m.code()];
  }
  CHECK(reasons[AttemptReason::kAdmitted] > 20);
  CHECK(reasons[AttemptReason::kAttemptActive] > 20);
  CHECK(reasons[AttemptReason::kBackoff] > 20);
  CHECK(completions[absl::StatusCode::kOk] > 20);
  CHECK(completions[absl::StatusCode::kFailedPrecondition] > 20);
}

TEST_CASE("redis keeps one hashed record per subject without a TTL, indexed by when it goes idle") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  const std::string key = limiter.redis_key("alice@example.com");
  CHECK(key.size() == std::string("test:{attempts}:").size() + 32);
  CHECK(key.rfind("test:{attempts}:", 0) == 0);
  CHECK(key.find("alice") == std::string::npos);
  const std::string index = limiter.index_key();
  CHECK(index == "test:{attempts}:index");

  AttemptDecision d = begin_at(limiter, kT0, "alice@example.com");
  REQUIRE(d.admitted());
  CHECK(server.redis.keys().size() == 2);
  CHECK(pttl(server, key) == -1);  // no TTL: no volatile-* policy can evict it
  CHECK(pttl(server, index) == -1);
  const auto idle_at = [&](const std::string& record) {
    sluice_test::Reply r = server.redis.command({"ZSCORE", index, record});
    REQUIRE(r);
    REQUIRE(r->type == REDIS_REPLY_STRING);
    return microseconds{std::stoll(std::string(r->str, r->len))};
  };
  CHECK(idle_at(key) == kT0 + 5s + 1min);  // lease 5 s, then the quiet minute
  REQUIRE(at(limiter, kT0 + 1s).fail(d.receipt).ok());
  CHECK(idle_at(key) == kT0 + 1s + 1min);  // quiet 1 min from the failure
  CHECK(pttl(server, key) == -1);

  // A success idles the record once the clock has left its attempt's microsecond.
  AttemptDecision bob = begin_at(limiter, kT0, "bob");
  REQUIRE(at(limiter, kT0).succeed(bob.receipt).ok());
  CHECK(idle_at(limiter.redis_key("bob")) == kT0 + 1us);
  AttemptDecision carol = begin_at(limiter, kT0 + 1us, "carol");  // sweeps bob's record
  CHECK(integer(server, {"EXISTS", limiter.redis_key("bob")}) == 0);
  REQUIRE(at(limiter, kT0 + 2us).succeed(carol.receipt).ok());
  CHECK(integer(server, {"EXISTS", limiter.redis_key("carol")}) == 0);
  CHECK(integer(server, {"ZCARD", index}) == 1);
}

TEST_CASE("policies redis cannot hold exactly are invalid arguments") {
  Server server;
  sluice::AttemptPolicy p = kPolicy;
  p.lease = 1500ns;
  CHECK(RedisAttemptLimiter::create(p, server.options()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  p = kPolicy;
  p.quiet_period = sluice::redis::kMaxAttemptDuration + 1us;
  CHECK(RedisAttemptLimiter::create(p, server.options()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  p.quiet_period = sluice::redis::kMaxAttemptDuration;
  CHECK(RedisAttemptLimiter::create(p, server.options()).ok());
  CHECK(RedisAttemptLimiter::create({}, server.options()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("over redis the longest durations stay exact") {
  Server server;
  const sluice::AttemptPolicy longest{.initial_delay = 1us,
                                      .delay_cap = sluice::redis::kMaxAttemptDuration,
                                      .quiet_period = sluice::redis::kMaxAttemptDuration,
                                      .lease = sluice::redis::kMaxAttemptDuration};
  RedisAttemptLimiter limiter = make(server, longest);
  REQUIRE(begin_at(limiter, kT0).admitted());
  CHECK(begin_at(limiter, kT0 + 1us) ==
        AttemptDecision{.reason = AttemptReason::kAttemptActive,
                        .retry_after = sluice::redis::kMaxAttemptDuration - 1us});
  // The lease expires: failure 1 at its deadline; the wait after it is 1 µs.
  const microseconds deadline = kT0 + sluice::redis::kMaxAttemptDuration;
  CHECK(begin_at(limiter, deadline) ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 1us, .failures = 1});
}

TEST_CASE("threads beginning on one subject over redis get exactly one receipt") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  std::atomic<int> admitted{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        absl::StatusOr<AttemptDecision> d = limiter.begin("alice");
        if (!d.ok()) errors.fetch_add(1);
        if (d.ok() && d->admitted()) admitted.fetch_add(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(errors.load() == 0);
  CHECK(admitted.load() == 1);  // the lease (5 s) outlasts the test
}

TEST_CASE("a stock redis-server is refused when the attempt limiter is created") {
  Server server;
  server.redis.set_extra_args({"--maxmemory", "0", "--maxmemory-policy", "noeviction"});
  REQUIRE(server.redis.restart().empty());
  auto refused = RedisAttemptLimiter::create(kPolicy, server.options());
  INFO(refused.status());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(refused.status().message().find("CONFIG SET maxmemory <bytes>") != std::string_view::npos);

  server.redis.kill();  // unreachable: created all the same
  REQUIRE(RedisAttemptLimiter::create(kPolicy, server.options()).ok());
}

TEST_CASE("a killed redis gives Unavailable and a restarted one recovers") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  absl::StatusOr<AttemptDecision> d = limiter.begin("alice");
  REQUIRE(d.ok());
  server.redis.kill();
  CHECK(limiter.begin("bob").status().code() == absl::StatusCode::kUnavailable);
  CHECK(limiter.fail(d->receipt).code() == absl::StatusCode::kUnavailable);
  REQUIRE(server.redis.restart().empty());  // empty data set, no scripts loaded
  absl::StatusOr<AttemptDecision> again = limiter.begin("bob");
  INFO(again.status());
  REQUIRE(again.ok());
  CHECK(again->admitted());
}

TEST_CASE("a stopped redis gives DeadlineExceeded within the timeout") {
  Server server;
  auto limiter = RedisAttemptLimiter::create(kPolicy, server.options(300ms));
  REQUIRE(limiter.ok());
  absl::StatusOr<AttemptDecision> d = limiter->begin("alice");
  REQUIRE(d.ok());
  server.redis.stop();
  const auto start = std::chrono::steady_clock::now();
  const absl::Status status = limiter->fail(d->receipt);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  server.redis.resume();
  CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(elapsed < 300ms + 700ms);
}

TEST_CASE("a flushed script is reloaded transparently") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  REQUIRE(begin_at(limiter, kT0).admitted());
  REQUIRE(server.redis.command({"SCRIPT", "FLUSH"}));
  CHECK(begin_at(limiter, kT0).reason == AttemptReason::kAttemptActive);
  sluice_test::Reply sha = server.redis.command({"SCRIPT", "EXISTS", limiter.script_sha()});
  REQUIRE(sha);
  REQUIRE(sha->elements == 1);
  CHECK(sha->element[0]->integer == 1);
}

TEST_CASE("a foreign value at a subject's key is an Internal error and never an admission") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  REQUIRE(server.redis.command({"SET", limiter.redis_key("alice"), "x"}));
  CHECK(limiter.begin("alice").status().code() == absl::StatusCode::kInternal);
}

TEST_CASE("over redis inspecting or resetting an unknown subject creates no key") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  absl::StatusOr<AttemptDecision> at_time = limiter.inspect("alice");
  INFO(at_time.status());
  REQUIRE(at_time.ok());
  CHECK(*at_time == AttemptDecision{});
  absl::StatusOr<AttemptDecision> at_t0 = at(limiter, kT0).inspect("alice");
  REQUIRE(at_t0.ok());
  CHECK(*at_t0 == AttemptDecision{});
  CHECK(limiter.reset("bob").ok());
  CHECK(at(limiter, kT0).reset("bob").ok());
  CHECK(integer(server, {"EXISTS", limiter.redis_key("alice"), limiter.redis_key("bob")}) == 0);
  CHECK(integer(server, {"DBSIZE"}) == 0);
  CHECK(begin_at(limiter, kT0).receipt.token() == 1);  // no attempt was counted
}

TEST_CASE("over redis inspecting reports the backoff and writes nothing") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  const std::string key = limiter.redis_key("alice");
  AttemptDecision d = begin_at(limiter, kT0);
  REQUIRE(at(limiter, kT0).fail(d.receipt).ok());
  d = begin_at(limiter, kT0 + 1s);
  REQUIRE(at(limiter, kT0 + 1s).fail(d.receipt).ok());  // 2 failures: wait 2 s
  const std::map<std::string, std::string> before = record(server, key);
  const std::int64_t ttl = pttl(server, key);
  const std::int64_t written = writes(server);

  const AttemptDecision expected{
      .reason = AttemptReason::kBackoff, .retry_after = 1500ms, .failures = 2};
  CHECK(*at(limiter, kT0 + 1500ms).inspect("alice") == expected);
  CHECK(*at(limiter, kT0 + 1500ms).inspect("alice") == expected);
  // A later look does not move the record's clock: begin still sees its own time.
  CHECK(at(limiter, kT0 + 2500ms).inspect("alice")->retry_after == 500ms);
  CHECK(writes(server) == written);
  CHECK(record(server, key) == before);
  CHECK(pttl(server, key) <= ttl);  // no expiry extended

  CHECK(begin_at(limiter, kT0 + 1500ms) == expected);
  AttemptDecision next = begin_at(limiter, kT0 + 3s);
  CHECK(next.admitted());
  CHECK(next.failures == 2);
  CHECK(next.receipt.token() == 3);
}

TEST_CASE("over redis inspecting a lapsed lease counts it without writing it") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  const std::string key = limiter.redis_key("alice");
  REQUIRE(begin_at(limiter, kT0).admitted());
  CHECK(*at(limiter, kT0 + 2s).inspect("alice") ==
        AttemptDecision{.reason = AttemptReason::kAttemptActive, .retry_after = 3s});
  const std::map<std::string, std::string> before = record(server, key);
  const AttemptDecision lapsed{.reason = AttemptReason::kBackoff, .retry_after = 1s, .failures = 1};
  CHECK(*at(limiter, kT0 + 5s).inspect("alice") == lapsed);
  CHECK(*at(limiter, kT0 + 5s).inspect("alice") == lapsed);
  CHECK(record(server, key) == before);
  CHECK(record(server, key).at("active") == "1");
  CHECK(begin_at(limiter, kT0 + 5s) == lapsed);
}

TEST_CASE("over redis a reset clears the backoff and leaves a stale receipt harmless") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  AttemptDecision d = begin_at(limiter, kT0);
  REQUIRE(at(limiter, kT0).fail(d.receipt).ok());
  AttemptDecision in_flight = begin_at(limiter, kT0 + 1s);
  REQUIRE(in_flight.admitted());
  REQUIRE(in_flight.failures == 1);
  REQUIRE(at(limiter, kT0 + 2s).reset("alice").ok());
  CHECK(*at(limiter, kT0 + 2s).inspect("alice") == AttemptDecision{});
  CHECK(at(limiter, kT0 + 3s).fail(in_flight.receipt).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(at(limiter, kT0 + 3s).succeed(in_flight.receipt).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(*at(limiter, kT0 + 3s).inspect("alice") == AttemptDecision{});
  AttemptDecision next = begin_at(limiter, kT0 + 4s);
  REQUIRE(next.admitted());
  CHECK(next.failures == 0);
  CHECK(at(limiter, kT0 + 4s).fail(in_flight.receipt).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(begin_at(limiter, kT0 + 4s) ==
        AttemptDecision{.reason = AttemptReason::kAttemptActive, .retry_after = 5s});
  REQUIRE(at(limiter, kT0 + 4s).fail(next.receipt).ok());
  CHECK(begin_at(limiter, kT0 + 4s) ==  // the sequence starts over
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 1s, .failures = 1});
}

TEST_CASE("over redis a reset deletes the record and its index entry") {
  Server server;
  auto made = RedisAttemptLimiter::create(kPolicy, server.options());  // the server's TIME
  REQUIRE(made.ok());
  RedisAttemptLimiter& limiter = *made;
  absl::StatusOr<AttemptDecision> d = limiter.begin("alice");
  REQUIRE(d.ok());
  REQUIRE(limiter.fail(d->receipt).ok());
  REQUIRE(limiter.reset("alice").ok());  // microseconds after the begin: the record is idle
  CHECK(integer(server, {"DBSIZE"}) == 0);
  absl::StatusOr<AttemptDecision> next = limiter.begin("alice");
  REQUIRE(next.ok());
  CHECK(next->admitted());
  CHECK(next->failures == 0);
}

TEST_CASE("redis and memory answer a script with inspect and reset identically") {
  Server server;
  RedisAttemptLimiter redis = make(server);
  sluice::ManualClock clock;
  auto memory = sluice::AttemptLimiter<sluice::ManualClock>::create(kPolicy, {.seed = 3}, clock);
  REQUIRE(memory.ok());

  enum class Op { kBegin, kInspect, kReset, kSucceed, kFail };
  struct Step {
    microseconds at;  // after kT0; strictly increasing, as the server's TIME would be
    Op op;
    std::string_view subject;
    std::size_t receipt;  // completions: the index of the receipt among those issued
  };
  const Step script[] = {
      {0s, Op::kBegin, "alice", 0},       {1s, Op::kInspect, "alice", 0},
      {1100ms, Op::kFail, "alice", 0},    {1500ms, Op::kInspect, "alice", 0},
      {2100ms, Op::kBegin, "alice", 0},   {3s, Op::kBegin, "alice", 0},
      {3500ms, Op::kReset, "alice", 0},   {4s, Op::kFail, "alice", 1},
      {4500ms, Op::kInspect, "alice", 0}, {5s, Op::kBegin, "alice", 0},
      {5500ms, Op::kFail, "alice", 2},    {6s, Op::kBegin, "alice", 0},
      {6100ms, Op::kInspect, "alice", 0}, {7s, Op::kReset, "bob", 0},
      {8s, Op::kInspect, "bob", 0},       {9s, Op::kBegin, "bob", 0},
      {14s, Op::kInspect, "bob", 0},      {14500ms, Op::kInspect, "bob", 0},
      {20s, Op::kInspect, "bob", 0},      {20500ms, Op::kBegin, "bob", 0},
      {21s, Op::kReset, "bob", 0},        {21500ms, Op::kSucceed, "bob", 4},
      {22s, Op::kInspect, "bob", 0},      {22500ms, Op::kBegin, "bob", 0},
      {23s, Op::kSucceed, "bob", 5},      {23500ms, Op::kInspect, "bob", 0},
  };
  struct Held {
    sluice::AttemptReceipt redis, memory;
  };
  std::vector<Held> receipts;
  std::map<AttemptReason, int> inspected;
  for (const Step& step : script) {
    const microseconds t = kT0 + step.at;
    clock.set(t);
    INFO("at " << step.at.count() << "us op " << static_cast<int>(step.op) << " " << step.subject);
    if (step.op == Op::kBegin || step.op == Op::kInspect) {
      const bool look = step.op == Op::kInspect;
      absl::StatusOr<AttemptDecision> r =
          look ? at(redis, t).inspect(step.subject) : at(redis, t).begin(step.subject);
      absl::StatusOr<AttemptDecision> m =
          look ? memory->inspect(step.subject) : memory->begin(step.subject);
      REQUIRE(r.ok());
      REQUIRE(m.ok());
      CHECK(r->reason == m->reason);
      CHECK(r->retry_after == m->retry_after);
      CHECK(r->failures == m->failures);
      CHECK(r->receipt.valid() == m->receipt.valid());
      if (look) ++inspected[m->reason];
      if (!look && r->admitted() && m->admitted()) receipts.push_back({r->receipt, m->receipt});
      continue;
    }
    absl::Status r, m;
    if (step.op == Op::kReset) {
      r = at(redis, t).reset(step.subject);
      m = memory->reset(step.subject);
    } else {
      REQUIRE(step.receipt < receipts.size());
      const Held& held = receipts[step.receipt];
      const bool success = step.op == Op::kSucceed;
      r = success ? at(redis, t).succeed(held.redis) : at(redis, t).fail(held.redis);
      m = success ? memory->succeed(held.memory) : memory->fail(held.memory);
    }
    CHECK(r.code() == m.code());
  }
  CHECK(receipts.size() == 6);
  CHECK(inspected[AttemptReason::kAdmitted] > 0);
  CHECK(inspected[AttemptReason::kAttemptActive] > 0);
  CHECK(inspected[AttemptReason::kBackoff] > 0);
}

TEST_CASE("a spray of subjects that fills a 3 MB server never evicts a failing subject's record") {
  Server server;
  REQUIRE(server.redis.command({"CONFIG", "SET", "maxmemory", "3mb"}));
  const sluice::AttemptPolicy login{
      .initial_delay = 1s, .delay_cap = 15min, .quiet_period = 24h, .lease = 30s};
  RedisAttemptLimiter limiter = make(server, login);
  microseconds t = kT0;
  for (std::uint64_t failures = 0; failures < 11; ++failures) {
    t += std::chrono::ceil<microseconds>(login.delay_after(failures));
    AttemptDecision d = begin_at(limiter, t, "victim");
    REQUIRE(d.admitted());
    REQUIRE(at(limiter, t).fail(d.receipt).ok());
  }
  const AttemptDecision locked{
      .reason = AttemptReason::kBackoff, .retry_after = 899s, .failures = 11};
  REQUIRE(begin_at(limiter, t + 1s, "victim") == locked);

  // One attempt per fresh subject until the server has refused a hundred writes for memory.
  int admitted = 0;
  int out_of_memory = 0;
  for (int i = 0; i < 40'000 && out_of_memory < 100; ++i) {
    absl::StatusOr<AttemptDecision> d = at(limiter, t + 1s).begin(absl::StrCat("sprayed-", i));
    if (d.ok()) {
      REQUIRE(d->admitted());
      ++admitted;
    } else {
      INFO(d.status());
      REQUIRE(d.status().code() == absl::StatusCode::kUnavailable);
      REQUIRE(d.status().message().find("OOM") != std::string_view::npos);
      ++out_of_memory;
    }
  }
  CAPTURE(admitted);
  CHECK(out_of_memory == 100);  // memory really ran out: writes fail closed
  CHECK(begin_at(limiter, t + 1s, "victim") == locked);
  CHECK(integer(server, {"EXISTS", limiter.redis_key("victim")}) == 1);
}

TEST_CASE("a full record store denies a new subject until its earliest record goes idle") {
  Server server;
  auto limiter = RedisAttemptLimiter::create(kPolicy, timed(server.options()), {.max_records = 3});
  REQUIRE(limiter.ok());
  std::map<std::string_view, AttemptDecision> held;
  for (std::string_view subject : {"alice", "bob", "carol"}) {
    held[subject] = begin_at(*limiter, kT0, subject);  // leased: idle at 65 s
    REQUIRE(held[subject].admitted());
  }
  REQUIRE(at(*limiter, kT0 + 1s).fail(held["bob"].receipt).ok());  // idle at 61 s

  CHECK(begin_at(*limiter, kT0 + 1s, "dave") ==
        AttemptDecision{.reason = AttemptReason::kStoreFull, .retry_after = 60s});
  CHECK(*at(*limiter, kT0 + 1s).inspect("dave") == AttemptDecision{});
  CHECK(integer(server, {"EXISTS", limiter->redis_key("dave")}) == 0);
  CHECK(integer(server, {"ZCARD", limiter->index_key()}) == 3);
  // Subjects already tracked keep working while the store is full.
  CHECK(begin_at(*limiter, kT0 + 1s, "bob") ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 1s, .failures = 1});
  CHECK(begin_at(*limiter, kT0 + 1s, "alice") ==
        AttemptDecision{.reason = AttemptReason::kAttemptActive, .retry_after = 4s});
  REQUIRE(at(*limiter, kT0 + 2s).fail(held["carol"].receipt).ok());  // idle at 62 s
  CHECK(begin_at(*limiter, kT0 + 2s, "dave") ==
        AttemptDecision{.reason = AttemptReason::kStoreFull, .retry_after = 59s});

  // At 61 s bob's failure is forgotten: the sweep deletes his record and dave takes its place.
  AttemptDecision dave = begin_at(*limiter, kT0 + 61s, "dave");
  CHECK(dave.admitted());
  CHECK(dave.failures == 0);
  CHECK(integer(server, {"EXISTS", limiter->redis_key("bob")}) == 0);
  CHECK(integer(server, {"ZCARD", limiter->index_key()}) == 3);
  AttemptDecision carol = begin_at(*limiter, kT0 + 61s, "carol");
  CHECK(carol.admitted());
  CHECK(carol.failures == 1);
}

TEST_CASE("the limiter deletes idle records itself, at most sixteen per writing call") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  for (int i = 0; i < 40; ++i) {  // forgotten at 1 min
    const std::string subject = absl::StrCat("sprayed-", i);
    const AttemptDecision begun = begin_at(limiter, kT0, subject);
    REQUIRE(at(limiter, kT0).fail(begun.receipt).ok());
  }
  AttemptDecision victim = begin_at(limiter, kT0 + 30s, "victim");
  REQUIRE(at(limiter, kT0 + 30s).fail(victim.receipt).ok());  // forgotten at 90 s
  REQUIRE(integer(server, {"DBSIZE"}) == 42);

  CHECK(*at(limiter, kT0 + 1min).inspect("nobody") == AttemptDecision{});
  CHECK(integer(server, {"DBSIZE"}) == 42);  // inspecting deletes nothing
  REQUIRE(at(limiter, kT0 + 1min).reset("nobody").ok());
  CHECK(integer(server, {"DBSIZE"}) == 42 - 16);
  REQUIRE(begin_at(limiter, kT0 + 1min, "fresh").admitted());
  CHECK(integer(server, {"DBSIZE"}) == 42 - 32 + 1);
  REQUIRE(begin_at(limiter, kT0 + 1min, "fresh").reason == AttemptReason::kAttemptActive);
  CHECK(integer(server, {"DBSIZE"}) == 3);  // the victim, fresh and the index
  for (const std::string& key : server.redis.keys()) {
    INFO(key);
    CHECK(pttl(server, key) == -1);
  }
  CHECK(*at(limiter, kT0 + 1min).inspect("victim") == AttemptDecision{.failures = 1});
  REQUIRE(at(limiter, kT0 + 90s).reset("nobody").ok());
  CHECK(integer(server, {"EXISTS", limiter.redis_key("victim")}) == 0);
  CHECK(integer(server, {"ZCARD", limiter.index_key()}) == 1);  // fresh, still leased
}

TEST_CASE("every key an attempt limiter touches shares one cluster slot") {
  Server server;
  for (std::string prefix : {"test:", "login{tenant-7}:", "odd{", "a}b{c}:"}) {
    INFO(prefix);
    sluice::redis::ClientOptions options = server.options();
    options.key_prefix = prefix;
    RedisAttemptLimiter limiter = [&] {
      auto created = RedisAttemptLimiter::create(kPolicy, options);
      REQUIRE(created.ok());
      return *std::move(created);
    }();
    const std::size_t slot = sluice::redis::detail::key_slot(limiter.index_key());
    for (std::string_view subject : {"alice", "bob", "carol", "dave"}) {
      CHECK(sluice::redis::detail::key_slot(limiter.redis_key(subject)) == slot);
    }
  }
  sluice::redis::ClientOptions empty_tag = server.options();
  empty_tag.key_prefix = "login{}:";
  CHECK(RedisAttemptLimiter::create(kPolicy, empty_tag).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(
      RedisAttemptLimiter::create(kPolicy, server.options(), {.max_records = 0}).status().code() ==
      absl::StatusCode::kInvalidArgument);
  CHECK(RedisAttemptLimiter::create(kPolicy, server.options(), {.max_records = (1ULL << 32) + 1})
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("one attempt record costs a bounded number of bytes of server memory") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  REQUIRE(begin_at(limiter, kT0, "warm-up").admitted());  // the connection and the script
  const auto used_memory = [&] {
    sluice_test::Reply r = server.redis.command({"MEMORY", "STATS"});
    REQUIRE(r);
    REQUIRE(r->type == REDIS_REPLY_ARRAY);
    for (std::size_t i = 0; i + 1 < r->elements; i += 2) {
      if (std::string_view(r->element[i]->str, r->element[i]->len) == "total.allocated") {
        return static_cast<std::uint64_t>(r->element[i + 1]->integer);
      }
    }
    FAIL("MEMORY STATS has no total.allocated");
    return std::uint64_t{0};
  };
  constexpr int kRecords = 10'000;
  const std::uint64_t before = used_memory();
  for (int i = 0; i < kRecords; ++i) {
    REQUIRE(begin_at(limiter, kT0, absl::StrCat("subject-", i)).admitted());
  }
  const std::uint64_t per_record = (used_memory() - before) / kRecords;
  CAPTURE(per_record);
  CHECK(per_record >= 200);  // docs/attempts.md: 448 bytes on Redis 7.0 (jemalloc, 64-bit)
  CHECK(per_record <= 600);
}

TEST_CASE("a record an earlier version kept with a TTL is adopted without losing its failures") {
  Server server;
  RedisAttemptLimiter limiter = make(server);
  const std::string legacy = limiter.legacy_redis_key("alice");
  CHECK(legacy.size() == std::string("test:{").size() + 32 + 1);
  // What the previous script wrote after three failures, the last at kT0 (wait 4 s, quiet 1 min).
  const std::string t0 = absl::StrCat(kT0.count());
  const std::string retry = absl::StrCat((kT0 + 4s).count());
  const std::string quiet = absl::StrCat((kT0 + 1min).count());
  REQUIRE(server.redis.command({"HSET", legacy, "seen", t0, "token", "3", "started", t0, "active",
                                "0", "lease_end", t0, "retry_at", retry, "quiet_end", quiet,
                                "failures", "3"}));
  REQUIRE(integer(server, {"PEXPIRE", legacy, "3600000"}) == 1);

  const AttemptDecision locked{.reason = AttemptReason::kBackoff, .retry_after = 3s, .failures = 3};
  CHECK(*at(limiter, kT0 + 1s).inspect("alice") == locked);
  CHECK(begin_at(limiter, kT0 + 1s, "alice") == locked);
  AttemptDecision d = begin_at(limiter, kT0 + 4s, "alice");
  REQUIRE(d.admitted());
  CHECK(d.failures == 3);
  CHECK(d.receipt.token() == 4);
  CHECK(integer(server, {"EXISTS", legacy}) == 0);
  CHECK(pttl(server, limiter.redis_key("alice")) == -1);
  CHECK(integer(server, {"ZCARD", limiter.index_key()}) == 1);
  REQUIRE(at(limiter, kT0 + 5s).fail(d.receipt).ok());
  CHECK(begin_at(limiter, kT0 + 5s, "alice") ==
        AttemptDecision{.reason = AttemptReason::kBackoff, .retry_after = 8s, .failures = 4});
}
