// sluice::redis and the server's memory bound, against a real redis-server each test starts.
//
// Creating a limiter, and every new connection, reads maxmemory and maxmemory-policy and refuses
// settings under which a spray of identities either grows memory without bound or evicts a spent
// budget, with the commands that fix them. Under the accepted settings (a bound and volatile-ttl)
// a spray of fifty times what fits evicts the sprayed keys, and a client whose budget is spent
// stays limited throughout.
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "redis_fixture.hpp"
#include "redis_server.hpp"
#include "sluice/redis.hpp"

namespace {

// Batches of 500 pipelined checks share one deadline: generous, so that a slow machine (or a
// sanitizer build) measures what the server answers rather than the deadline.
constexpr std::chrono::milliseconds kSprayTimeout{10'000};

using sluice::Decision;
using sluice::redis::MemoryCheck;
using std::chrono::seconds;

constexpr std::uint64_t kPerHour = 5;

// What a freshly installed redis-server runs with: no memory bound, and noeviction.
const std::vector<std::string> kStockSettings = {"--maxmemory", "0", "--maxmemory-policy",
                                                 "noeviction"};

bool contains(const absl::Status& status, std::string_view text) {
  return std::string_view(status.message().data(), status.message().size()).find(text) !=
         std::string_view::npos;
}

sluice::redis::RedisGcraLimiter make_limiter(sluice::redis::ClientOptions options) {
  auto limiter = sluice::redis::RedisGcraLimiter::create(
      {{.requests = kPerHour, .period = seconds(3600)}}, std::move(options));
  INFO(limiter.status());
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

// A field of INFO (e.g. "used_memory" in section "memory"), as an integer.
std::uint64_t info_field(const sluice_test::RedisServer& redis, std::string_view section,
                         std::string_view field) {
  sluice_test::Reply r = redis.command({"INFO", section});
  REQUIRE(r);
  REQUIRE(r->type == REDIS_REPLY_STRING);
  const std::string_view text(r->str, r->len);
  const std::string prefix =
      absl::StrCat("\r\n", absl::string_view(field.data(), field.size()), ":");
  const std::size_t at = text.find(prefix);
  REQUIRE(at != std::string_view::npos);
  const std::size_t begin = at + prefix.size();
  const std::string_view value = text.substr(begin, text.find("\r\n", begin) - begin);
  std::uint64_t n = 0;
  REQUIRE(absl::SimpleAtoi(absl::string_view(value.data(), value.size()), &n));
  return n;
}

void config_set(const sluice_test::RedisServer& redis, std::string_view name,
                std::string_view value) {
  sluice_test::Reply r = redis.command({"CONFIG", "SET", name, value});
  REQUIRE(r);
  REQUIRE(r->type == REDIS_REPLY_STATUS);
}

// One check of `count` fresh identities, pipelined in batches; adds up the outcomes.
struct Outcomes {
  int allowed = 0;
  int denied = 0;
  int unavailable = 0;  // OOM and other passing server states
  int other_errors = 0;
};
void spray(sluice::redis::Client& client, const sluice::redis::Limit& limit, int first, int count,
           Outcomes& out) {
  constexpr int kBatch = 500;
  for (int start = first; start < first + count; start += kBatch) {
    std::vector<std::string> keys;
    std::vector<sluice::redis::CheckItem> items;
    for (int i = start; i < std::min(start + kBatch, first + count); ++i) {
      keys.push_back(absl::StrCat("spray-", i));
    }
    for (const std::string& key : keys) {
      items.push_back({.key = key, .limit = &limit});
    }
    for (const absl::StatusOr<Decision>& d : client.check_pipelined(items)) {
      if (d.ok()) {
        ++(d->allowed() ? out.allowed : out.denied);
      } else if (d.status().code() == absl::StatusCode::kUnavailable) {
        ++out.unavailable;
      } else {
        ++out.other_errors;
      }
    }
  }
}

// Bytes one sprayed identity adds to used_memory (measured over `n` keys on an unbounded server).
std::uint64_t bytes_per_key(sluice_test::RedisFixture& s, int n) {
  config_set(s.redis, "maxmemory", "0");
  auto options = s.options(kSprayTimeout);
  options.connection.memory_check = MemoryCheck::kAllowUnbounded;
  auto limiter = make_limiter(options);
  REQUIRE(limiter.check("warm-up").ok());  // the connection and the script are loaded
  const std::uint64_t before = info_field(s.redis, "memory", "used_memory");
  Outcomes out;
  spray(*limiter.client(), limiter.limit(), 0, n, out);
  REQUIRE(out.allowed == n);
  const std::uint64_t after = info_field(s.redis, "memory", "used_memory");
  REQUIRE(s.redis.command({"FLUSHALL"}));
  return (after - before) / static_cast<std::uint64_t>(n);
}

}  // namespace

TEST_CASE(
    "a stock redis-server is refused when the limiter is created with the settings that fix it") {
  sluice_test::RedisFixture s;
  s.redis.set_extra_args(kStockSettings);
  REQUIRE(s.redis.restart().empty());
  auto refused = sluice::redis::RedisGcraLimiter::create(
      {{.requests = kPerHour, .period = seconds(3600)}}, s.options(kSprayTimeout));
  INFO(refused.status());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(refused.status(), "maxmemory is 0"));
  CHECK(contains(refused.status(), "CONFIG SET maxmemory <bytes>"));
  CHECK(contains(refused.status(), "CONFIG SET maxmemory-policy volatile-ttl"));
  CHECK(s.redis.keys().empty());

  config_set(s.redis, "maxmemory", "64mb");
  config_set(s.redis, "maxmemory-policy", "volatile-ttl");
  auto limiter = make_limiter(s.options(kSprayTimeout));
  absl::StatusOr<Decision> d = limiter.check("k");
  INFO(d.status());
  CHECK((d.ok() && d->allowed()));
}

TEST_CASE("a replica is refused at creation: it would refuse every check's write") {
  sluice_test::RedisFixture s;
  s.redis.set_extra_args({"--replicaof", "127.0.0.1", "1"});  // a primary that is not there
  REQUIRE(s.redis.restart().empty());
  auto refused = sluice::redis::RedisGcraLimiter::create(
      {{.requests = kPerHour, .period = seconds(3600)}}, s.options(kSprayTimeout));
  INFO(refused.status());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(refused.status(), "the server is a replica"));
  CHECK(contains(refused.status(), "point the client at the primary"));
}

TEST_CASE("a server that refuses scripts is refused at creation: every check would fail") {
  sluice_test::RedisFixture s;
  const bool renamed = GENERATE(false, true);
  if (renamed) {
    s.redis.set_extra_args({"--rename-command", "EVALSHA", ""});
    REQUIRE(s.redis.restart().empty());
  } else {
    REQUIRE(s.redis.command({"ACL", "SETUSER", "default", "-evalsha"}));
  }
  auto refused = sluice::redis::RedisGcraLimiter::create(
      {{.requests = kPerHour, .period = seconds(3600)}}, s.options(kSprayTimeout));
  INFO(refused.status());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(refused.status(), "the server refuses to run scripts"));
  CHECK(contains(refused.status(), renamed ? "unknown command" : "NOPERM"));
}

TEST_CASE("an eviction policy other than volatile-ttl is refused at creation saying what it does") {
  sluice_test::RedisFixture s;
  const auto [policy, effect] = GENERATE(table<std::string, std::string>(
      {{"allkeys-lru", "evicts any key, least recently used first"},
       {"allkeys-lfu", "evicts any key, least frequently used first"},
       {"allkeys-random", "evicts any key at random"},
       {"volatile-lru", "evicts keys with an expiry, least recently used first"},
       {"volatile-lfu", "evicts keys with an expiry, least frequently used first"},
       {"volatile-random", "evicts keys with an expiry at random"},
       {"noeviction", "evicts nothing: once maxmemory is reached every write fails with OOM"}}));
  config_set(s.redis, "maxmemory-policy", policy);
  auto refused = sluice::redis::RedisGcraLimiter::create(
      {{.requests = kPerHour, .period = seconds(3600)}}, s.options(kSprayTimeout));
  INFO(refused.status());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(
      contains(refused.status(), absl::StrCat("maxmemory-policy is ", policy, ", which ", effect)));
  CHECK(contains(refused.status(), "CONFIG SET maxmemory-policy volatile-ttl"));
  CHECK(s.redis.keys().empty());
}

TEST_CASE("opting out of the bound accepts unbounded memory and noeviction but no other policy") {
  sluice_test::RedisFixture s;
  auto options = s.options(kSprayTimeout);
  options.connection.memory_check = MemoryCheck::kAllowUnbounded;
  config_set(s.redis, "maxmemory", "0");
  CHECK(make_limiter(options).check("a").ok());
  config_set(s.redis, "maxmemory", "64mb");
  config_set(s.redis, "maxmemory-policy", "noeviction");
  CHECK(make_limiter(options).check("b").ok());
  config_set(s.redis, "maxmemory-policy", "allkeys-lru");
  auto refused = sluice::redis::RedisGcraLimiter::create(
      {{.requests = kPerHour, .period = seconds(3600)}}, options);
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("a limiter created while Redis is down checks the server when it first answers") {
  sluice_test::RedisFixture s;
  s.redis.kill();
  auto limiter = make_limiter(s.options(kSprayTimeout));  // unreachable: created all the same
  CHECK(limiter.check("k").status().code() == absl::StatusCode::kUnavailable);
  s.redis.set_extra_args(kStockSettings);
  REQUIRE(s.redis.restart().empty());
  absl::StatusOr<Decision> d = limiter.check("k");
  INFO(d.status());
  CHECK(d.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(d.status(), "CONFIG SET maxmemory-policy volatile-ttl"));
  CHECK(s.redis.keys().empty());
}

TEST_CASE("settings are read on every new connection so a reconfigured server is refused") {
  sluice_test::RedisFixture s;
  auto limiter = make_limiter(s.options(kSprayTimeout));
  REQUIRE(limiter.check("k").ok());
  s.redis.set_extra_args({"--maxmemory-policy", "allkeys-lru"});
  REQUIRE(s.redis.restart().empty());
  CHECK(limiter.check("k").status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("a server with CONFIG renamed is refused at creation unless the check is skipped") {
  sluice_test::RedisFixture s;
  s.redis.set_extra_args({"--rename-command", "CONFIG", ""});
  REQUIRE(s.redis.restart().empty());
  auto options = s.options(kSprayTimeout);
  auto refused = sluice::redis::RedisGcraLimiter::create(
      {{.requests = kPerHour, .period = seconds(3600)}}, options);
  INFO(refused.status());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(refused.status(), "MemoryCheck::kSkip"));
  options.connection.memory_check = MemoryCheck::kSkip;
  absl::StatusOr<Decision> skipped = make_limiter(options).check("k");
  INFO(skipped.status());
  CHECK((skipped.ok() && skipped->allowed()));
}

TEST_CASE("one sprayed identity costs a bounded number of bytes of server memory") {
  sluice_test::RedisFixture s;
  const std::uint64_t per_key = bytes_per_key(s, 20'000);
  CAPTURE(per_key);
  CHECK(per_key >= 50);
  CHECK(per_key <= 400);
}

TEST_CASE("under a 2 MB bound a spray of fifty times what fits never frees a spent budget") {
  sluice_test::RedisFixture s;
  const std::uint64_t per_key = bytes_per_key(s, 5'000);
  config_set(s.redis, "maxmemory", "2mb");
  const std::uint64_t used = info_field(s.redis, "memory", "used_memory");
  REQUIRE(used < 2 * 1024 * 1024);
  const int fit = static_cast<int>((2 * 1024 * 1024 - used) / per_key);
  CAPTURE(per_key, used, fit);

  auto limiter = make_limiter(s.options(kSprayTimeout));
  for (std::uint64_t i = 0; i < kPerHour; ++i) {
    REQUIRE(limiter.check("spent").value().allowed());
  }
  REQUIRE_FALSE(limiter.check("spent").value().allowed());

  Outcomes sprayed;
  int spent_admitted = 0;
  int spent_errors = 0;
  int fresh_admitted = 0;
  constexpr int kRounds = 50;
  for (int round = 0; round < kRounds; ++round) {
    spray(*limiter.client(), limiter.limit(), round * fit, fit, sprayed);
    absl::StatusOr<Decision> d = limiter.check("spent");
    spent_admitted += d.ok() && d->allowed();
    spent_errors += !d.ok();
    if (round == kRounds / 2) {  // a new client spends its budget in the middle of the spray
      for (int i = 0; i < 20; ++i) {
        absl::StatusOr<Decision> f = limiter.check("fresh");
        fresh_admitted += f.ok() && f->allowed();
      }
    }
  }
  CAPTURE(sprayed.allowed, sprayed.denied, sprayed.unavailable, sprayed.other_errors, spent_errors);
  CHECK(spent_admitted == 0);
  CHECK(fresh_admitted <= static_cast<int>(kPerHour));
  // Every sprayed identity was seen once: an admission is its real first request, a failure is
  // an error the caller sees (Unavailable for OOM), never a decision made on lost state.
  CHECK(sprayed.allowed + sprayed.unavailable == kRounds * fit);
  CHECK(sprayed.denied == 0);
  CHECK(sprayed.other_errors == 0);
  // The spray did overflow the bound: keys were evicted, and the spent budget was not one of them.
  CHECK(info_field(s.redis, "stats", "evicted_keys") > 0);
  CHECK(info_field(s.redis, "memory", "used_memory") <= 2 * 1024 * 1024 + 64 * 1024);
  sluice_test::Reply ttl = s.redis.command({"PTTL", limiter.redis_key("spent")});
  REQUIRE(ttl);
  CHECK(ttl->integer > 3'000'000);  // still there, a whole hour's refill pending
}

TEST_CASE("under noeviction a full server answers OOM as an error and admits nothing") {
  sluice_test::RedisFixture s;
  const std::uint64_t per_key = bytes_per_key(s, 5'000);
  config_set(s.redis, "maxmemory", "2mb");
  config_set(s.redis, "maxmemory-policy", "noeviction");
  const std::uint64_t used = info_field(s.redis, "memory", "used_memory");
  const int fit = static_cast<int>((2 * 1024 * 1024 - used) / per_key);
  auto options = s.options(kSprayTimeout);
  options.connection.memory_check = MemoryCheck::kAllowUnbounded;
  auto limiter = make_limiter(options);
  for (std::uint64_t i = 0; i < kPerHour; ++i) {
    REQUIRE(limiter.check("spent").value().allowed());
  }

  Outcomes sprayed;
  spray(*limiter.client(), limiter.limit(), 0, 2 * fit, sprayed);
  CAPTURE(fit, sprayed.allowed, sprayed.unavailable);
  REQUIRE(sprayed.unavailable > 0);  // the server is full
  CHECK(sprayed.other_errors == 0);
  // A pipelined batch's query and reply buffers count against maxmemory until the server's cron
  // shrinks them (10 times a second), so the spray can run out before its keys fill the bound.
  // Fill what is left one check at a time, until a round after the cron has run adds nothing.
  int topped_up = 0;
  for (int round = 0, added = 1; added > 0 && round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    added = 0;
    while (topped_up < fit && limiter.check(absl::StrCat("top-up-", topped_up)).ok()) {
      ++topped_up;
      ++added;
    }
  }
  CAPTURE(topped_up);
  REQUIRE(topped_up < fit);

  absl::StatusOr<Decision> spent = limiter.check("spent");
  CHECK_FALSE((spent.ok() && spent->allowed()));
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<Decision> fresh = limiter.check("fresh");
    INFO(fresh.status());
    CHECK(fresh.status().code() == absl::StatusCode::kUnavailable);
    CHECK(fresh.status().message().find("OOM") != std::string_view::npos);
  }
}
