// sluice::redis against a real redis-server that each test case starts for itself.
//
// Decisions are asserted to exact hand-computed values. Time is controlled through the clients'
// time source (ClientOptions::time_source, reading a ManualClock), which hands the script a
// server time instead of TIME; tests that use the real TIME only rely on outcomes that
// sub-second timing cannot change.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "redis_fixture.hpp"
#include "redis_server.hpp"
#include "sluice/clock.hpp"
#include "sluice/redis.hpp"
#include "sluice/redis/detail/server_check.hpp"

namespace {

using sluice::Decision;
using sluice::GcraWindow;
using sluice::Reason;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

constexpr nanoseconds kT0 = seconds(1'700'000'000);  // a server time, ns since the Unix epoch

using Server = sluice_test::RedisFixture;

sluice::redis::RedisGcraLimiter make_limiter(std::vector<GcraWindow> windows,
                                             sluice::redis::ClientOptions options) {
  auto limiter = sluice::redis::RedisGcraLimiter::create(std::move(windows), std::move(options));
  INFO(limiter.status());
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

Decision allowed(std::uint64_t limit, std::uint64_t remaining, nanoseconds reset,
                 std::size_t binding = 0) {
  return Decision{.reason = Reason::kAllowed,
                  .limit = limit,
                  .remaining = remaining,
                  .retry_after = nanoseconds(0),
                  .reset_after = reset,
                  .binding_window = binding};
}
Decision denied(std::uint64_t limit, std::uint64_t remaining, nanoseconds retry, nanoseconds reset,
                std::size_t binding = 0) {
  return Decision{.reason = Reason::kQuotaExceeded,
                  .limit = limit,
                  .remaining = remaining,
                  .retry_after = retry,
                  .reset_after = reset,
                  .binding_window = binding};
}

// The time of every client made with timed() options: tests set it, then check (the scripts
// decide at it instead of the server's TIME).
sluice::ManualClock server_time(kT0);
sluice::redis::ClientOptions timed(sluice::redis::ClientOptions options) {
  options.time_source = [] { return server_time.now(); };
  return options;
}

// limiter.check(key, cost) at `t`; the limiter's client must have timed() options.
Decision at(sluice::redis::RedisGcraLimiter& limiter, std::string_view key, nanoseconds t,
            std::uint64_t cost = 1) {
  server_time.set(t);
  absl::StatusOr<Decision> d = limiter.check(key, cost);
  INFO(d.status());
  REQUIRE(d.ok());
  return *d;
}

bool exists(const Server& s, const std::string& key) {
  sluice_test::Reply r = s.redis.command({"EXISTS", key});
  return r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

}  // namespace

// --- GCRA semantics, exact values ------------------------------------------------------------

TEST_CASE("three per second admits three at once then denies with the exact wait") {
  Server s;
  auto limiter = make_limiter({{.requests = 3, .period = seconds(1)}}, timed(s.options()));
  // T = 333,333,333⅓ ns: waits round up to whole nanoseconds.
  CHECK(at(limiter, "k", kT0) == allowed(3, 2, nanoseconds(333'333'334)));
  CHECK(at(limiter, "k", kT0) == allowed(3, 1, nanoseconds(666'666'667)));
  CHECK(at(limiter, "k", kT0) == allowed(3, 0, nanoseconds(1'000'000'000)));
  CHECK(at(limiter, "k", kT0) ==
        denied(3, 0, nanoseconds(333'333'334), nanoseconds(1'000'000'000)));
  // One nanosecond short of a token: a third of a nanosecond to go, reported as 1 ns.
  CHECK(at(limiter, "k", kT0 + nanoseconds(333'333'333)) ==
        denied(3, 0, nanoseconds(1), nanoseconds(666'666'667)));
  CHECK(at(limiter, "k", kT0 + nanoseconds(333'333'334)) ==
        allowed(3, 0, nanoseconds(1'000'000'000)));
}

TEST_CASE("a denied request consumes nothing") {
  Server s;
  auto limiter = make_limiter({{.requests = 1, .period = seconds(10)}}, timed(s.options()));
  CHECK(at(limiter, "k", kT0).allowed());
  for (int i = 0; i < 5; ++i) {
    CHECK(at(limiter, "k", kT0 + seconds(5)) ==
          denied(1, 0, nanoseconds(seconds(5)), nanoseconds(seconds(5))));
  }
  CHECK(at(limiter, "k", kT0 + seconds(10)) == allowed(1, 0, nanoseconds(seconds(10))));
}

TEST_CASE("cost zero peeks without changing or creating state") {
  Server s;
  auto limiter = make_limiter({{.requests = 4, .period = seconds(1)}}, timed(s.options()));
  CHECK(at(limiter, "fresh", kT0, 0) == allowed(4, 4, nanoseconds(0)));
  CHECK_FALSE(exists(s, limiter.redis_key("fresh")));
  CHECK(at(limiter, "k", kT0, 3) == allowed(4, 1, nanoseconds(750'000'000)));
  CHECK(at(limiter, "k", kT0, 0) == allowed(4, 1, nanoseconds(750'000'000)));
  CHECK(at(limiter, "k", kT0, 0) == allowed(4, 1, nanoseconds(750'000'000)));
  CHECK(at(limiter, "k", kT0 + milliseconds(250), 0) == allowed(4, 2, nanoseconds(500'000'000)));
}

TEST_CASE("a cost above the smallest burst is an invalid argument that touches nothing") {
  Server s;
  auto limiter = make_limiter({{.requests = 100, .period = seconds(60)},
                               {.requests = 10, .period = seconds(1), .burst = 3}},
                              s.options());
  absl::StatusOr<Decision> d = limiter.check("k", 4);
  CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(exists(s, limiter.redis_key("k")));
  CHECK(limiter.check("k", 3).ok());
}

TEST_CASE(
    "stacked windows bind the least remaining window when allowed and the first denying one when "
    "denied") {
  Server s;
  // Given longest first: the limiter sorts shortest period first.
  auto limiter =
      make_limiter({{.requests = 5, .period = seconds(60)}, {.requests = 2, .period = seconds(1)}},
                   timed(s.options()));
  REQUIRE(limiter.windows()[0].period == seconds(1));
  REQUIRE(limiter.windows()[1].burst == 5);
  CHECK(at(limiter, "k", kT0) == allowed(2, 1, nanoseconds(500'000'000), 0));
  CHECK(at(limiter, "k", kT0) == allowed(2, 0, nanoseconds(1'000'000'000), 0));
  CHECK(at(limiter, "k", kT0) ==
        denied(2, 0, nanoseconds(500'000'000), nanoseconds(1'000'000'000), 0));
  CHECK(at(limiter, "k", kT0 + seconds(1)) == allowed(2, 1, nanoseconds(500'000'000), 0));
  CHECK(at(limiter, "k", kT0 + seconds(1)) == allowed(2, 0, nanoseconds(1'000'000'000), 0));
  // The minute window now has 10 s of room left of its 12 s interval: it binds with 0 remaining.
  CHECK(at(limiter, "k", kT0 + seconds(2)) == allowed(5, 0, nanoseconds(seconds(58)), 1));
  // The second window alone denies: it binds although it is the longer one.
  CHECK(at(limiter, "k", kT0 + seconds(3)) ==
        denied(5, 0, nanoseconds(seconds(9)), nanoseconds(seconds(57)), 1));
}

TEST_CASE("retry after is the longest wait of all denying windows and is exactly enough") {
  Server s;
  auto limiter =
      make_limiter({{.requests = 1, .period = seconds(1)}, {.requests = 2, .period = seconds(10)}},
                   timed(s.options()));
  CHECK(at(limiter, "k", kT0) == allowed(1, 0, nanoseconds(seconds(1)), 0));
  // Both windows have 0 remaining: the tie goes to the shorter one.
  CHECK(at(limiter, "k", kT0 + seconds(1)) == allowed(1, 0, nanoseconds(seconds(1)), 0));
  // Both deny: the first binds, the wait is the second's 3.5 s.
  CHECK(at(limiter, "k", kT0 + milliseconds(1500)) ==
        denied(1, 0, nanoseconds(3'500'000'000), nanoseconds(500'000'000), 0));
  CHECK(at(limiter, "k", kT0 + seconds(5) - nanoseconds(1)) ==
        denied(2, 0, nanoseconds(1), nanoseconds(5'000'000'001), 1));
  CHECK(at(limiter, "k", kT0 + seconds(5)) == allowed(1, 0, nanoseconds(seconds(1)), 0));
}

TEST_CASE("three per second admits exactly three in every one of a thousand seconds") {
  Server s;
  auto limiter = make_limiter({{.requests = 3, .period = seconds(1)}}, timed(s.options()));
  int mismatches = 0;
  for (int second = 0; second < 1000; ++second) {
    const nanoseconds t = kT0 + seconds(second);
    mismatches += at(limiter, "k", t) != allowed(3, 2, nanoseconds(333'333'334));
    mismatches += at(limiter, "k", t) != allowed(3, 1, nanoseconds(666'666'667));
    mismatches += at(limiter, "k", t) != allowed(3, 0, nanoseconds(1'000'000'000));
    mismatches +=
        at(limiter, "k", t) != denied(3, 0, nanoseconds(333'333'334), nanoseconds(1'000'000'000));
  }
  CHECK(mismatches == 0);
}

TEST_CASE("a clock that goes back replenishes nothing") {
  Server s;
  auto limiter = make_limiter({{.requests = 1, .period = seconds(1)}}, timed(s.options()));
  CHECK(at(limiter, "k", kT0 + seconds(10)).allowed());
  // Decided as of the latest time seen: the same wait as at kT0 + 10 s.
  CHECK(at(limiter, "k", kT0) == denied(1, 0, nanoseconds(seconds(1)), nanoseconds(seconds(1))));
  CHECK(at(limiter, "k", kT0 + seconds(11)).allowed());
}

// --- arithmetic extremes: every value must stay exact ------------------------------------------

TEST_CASE("the largest request count and refill time stay exact to the nanosecond") {
  Server s;
  constexpr std::uint64_t kMax = sluice::redis::kMaxRequests;  // 2^52 - 1
  // T = 1 ns exactly, a bucket of 2^52 - 1 requests that refills in 2^52 - 1 ns (52 days).
  auto limiter =
      make_limiter({{.requests = kMax, .period = nanoseconds(kMax)}}, timed(s.options()));
  const nanoseconds t = seconds(9'000'000'000);  // year 2255: 9e18 ns
  CHECK(at(limiter, "k", t, kMax) == allowed(kMax, 0, nanoseconds(kMax)));
  CHECK(at(limiter, "k", t) == denied(kMax, 0, nanoseconds(1), nanoseconds(kMax)));
  CHECK(at(limiter, "k", t + nanoseconds(kMax - 2)) == allowed(kMax, kMax - 3, nanoseconds(3)));
}

TEST_CASE("an emission interval far below a nanosecond stays exact") {
  Server s;
  constexpr std::uint64_t kMax = sluice::redis::kMaxRequests;
  // 2^52 - 1 requests per second: T ≈ 2.2e-7 ns, kept as an exact fraction.
  auto limiter = make_limiter({{.requests = kMax, .period = seconds(1)}}, timed(s.options()));
  CHECK(at(limiter, "k", kT0, kMax) == allowed(kMax, 0, nanoseconds(seconds(1))));
  CHECK(at(limiter, "k", kT0) == denied(kMax, 0, nanoseconds(1), nanoseconds(seconds(1))));
  // One nanosecond refills 4,503,599.6 requests: 4,503,598 remain after this one.
  CHECK(at(limiter, "k", kT0 + nanoseconds(1)) ==
        allowed(kMax, 4'503'598, nanoseconds(seconds(1))));
}

TEST_CASE("windows outside the exact range are invalid arguments") {
  using sluice::redis::Limit;
  CHECK(Limit::create({}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Limit::create({{.requests = 0, .period = seconds(1)}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Limit::create({{.requests = 1, .period = nanoseconds(0)}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Limit::create({{.requests = sluice::redis::kMaxRequests + 1, .period = seconds(1)}})
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(Limit::create({{.requests = 1, .period = sluice::redis::kMaxRefill}}).ok());
  CHECK(Limit::create({{.requests = 1, .period = sluice::redis::kMaxRefill + nanoseconds(1)}})
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(Limit::create({{.requests = 10, .period = seconds(1), .burst = 11}})->max_cost() == 11);
  // A refill of 2^52 + 1/3 ns (3·2^52 + 1 ns over 3 requests) is above the bound, exactly.
  const auto above = Limit::create(
      {{.requests = 3, .period = nanoseconds((std::int64_t{3} << 52) + 1), .burst = 1}});
  CHECK(above.status().message() ==
        "sluice::redis: windows[0].burst × period / requests must be at most 2^52 ns");
  CHECK(Limit::create({{.requests = 3, .period = nanoseconds(std::int64_t{3} << 52), .burst = 1}})
            .ok());
  CHECK(Limit::fixed_window({{.limit = 1, .window = sluice::redis::kMaxRefill + nanoseconds(1)}})
            .status()
            .message() ==
        "sluice::redis: windows[0].window must be at most 2^52 ns, got "
        "4503599627370497ns");
}

// --- the batched call ----------------------------------------------------------------------------

TEST_CASE("a batch whose items all pass reserves every item in one call") {
  Server s;
  server_time.set(kT0);
  auto client = sluice::redis::Client::create(timed(s.options()));
  REQUIRE(client.ok());
  auto per_ip = sluice::redis::Limit::create({{.requests = 2, .period = seconds(1)}});
  auto per_route = sluice::redis::Limit::create({{.requests = 1, .period = seconds(1)}});
  REQUIRE((per_ip.ok() && per_route.ok()));
  const sluice::redis::CheckItem items[] = {{.key = "ip:10.0.0.1", .limit = &*per_ip},
                                            {.key = "route:/login", .limit = &*per_route}};
  auto first = (*client)->check_all(items);
  REQUIRE(first.ok());
  CHECK((*first)[0] == allowed(2, 1, nanoseconds(500'000'000)));
  CHECK((*first)[1] == allowed(1, 0, nanoseconds(1'000'000'000)));
}

TEST_CASE("a batch with one denied item reserves nothing in any item") {
  Server s;
  server_time.set(kT0);
  auto client = sluice::redis::Client::create(timed(s.options()));
  REQUIRE(client.ok());
  auto per_ip = sluice::redis::Limit::create({{.requests = 2, .period = seconds(1)}});
  auto per_route = sluice::redis::Limit::create({{.requests = 1, .period = seconds(1)}});
  REQUIRE((per_ip.ok() && per_route.ok()));
  const sluice::redis::CheckItem items[] = {{.key = "ip:10.0.0.1", .limit = &*per_ip},
                                            {.key = "route:/login", .limit = &*per_route}};
  REQUIRE((*client)->check_all(items).ok());
  auto second = (*client)->check_all(items);
  REQUIRE(second.ok());
  // Each item reports what a lone check would say; the route denies, so nothing is reserved.
  CHECK((*second)[0] == allowed(2, 0, nanoseconds(1'000'000'000)));
  CHECK((*second)[1] == denied(1, 0, nanoseconds(1'000'000'000), nanoseconds(1'000'000'000)));
  const sluice::redis::CheckItem peek[] = {{.key = "ip:10.0.0.1", .limit = &*per_ip, .cost = 0}};
  auto after = (*client)->check_all(peek);
  REQUIRE(after.ok());
  CHECK((*after)[0] == allowed(2, 1, nanoseconds(500'000'000)));
}

TEST_CASE("a key repeated in a batch sees the earlier occurrences") {
  Server s;
  server_time.set(kT0);
  auto client = sluice::redis::Client::create(timed(s.options()));
  REQUIRE(client.ok());
  auto limit = sluice::redis::Limit::create({{.requests = 2, .period = seconds(1)}});
  REQUIRE(limit.ok());
  const sluice::redis::CheckItem twice[] = {{.key = "k", .limit = &*limit},
                                            {.key = "k", .limit = &*limit}};
  auto d = (*client)->check_all(twice);
  REQUIRE(d.ok());
  CHECK((*d)[0] == allowed(2, 1, nanoseconds(500'000'000)));
  CHECK((*d)[1] == allowed(2, 0, nanoseconds(1'000'000'000)));
  const sluice::redis::CheckItem thrice[] = {{.key = "j", .limit = &*limit},
                                             {.key = "j", .limit = &*limit},
                                             {.key = "j", .limit = &*limit}};
  auto e = (*client)->check_all(thrice);
  REQUIRE(e.ok());
  CHECK((*e)[2] == denied(2, 0, nanoseconds(500'000'000), nanoseconds(1'000'000'000)));
  const sluice::redis::CheckItem peek[] = {{.key = "j", .limit = &*limit, .cost = 0}};
  CHECK((*(*client)->check_all(peek))[0] == allowed(2, 2, nanoseconds(0)));
}

TEST_CASE("pipelined checks answer each item on its own") {
  Server s;
  auto client = sluice::redis::Client::create(s.options());
  REQUIRE(client.ok());
  auto limit = sluice::redis::Limit::create({{.requests = 2, .period = seconds(3600)}});
  REQUIRE(limit.ok());
  std::vector<sluice::redis::CheckItem> items(3, {.key = "k", .limit = &*limit});
  items.push_back({.key = "other", .limit = &*limit, .cost = 3});  // above the burst
  auto results = (*client)->check_pipelined(items);
  REQUIRE(results.size() == 4);
  CHECK((results[0].ok() && results[0]->allowed() && results[0]->remaining == 1));
  CHECK((results[1].ok() && results[1]->allowed() && results[1]->remaining == 0));
  CHECK((results[2].ok() && !results[2]->allowed()));
  CHECK(results[3].status().code() == absl::StatusCode::kInvalidArgument);
}

// --- shared budget --------------------------------------------------------------------------

TEST_CASE("two replicas with concurrent callers admit exactly the burst in total") {
  Server s;
  // Two limiters with their own clients and connections, as two service replicas. A token
  // refills every 36 s, far longer than the test, so exactly 100 may pass.
  auto replica_a = make_limiter({{.requests = 100, .period = seconds(3600)}}, s.options());
  auto replica_b = make_limiter({{.requests = 100, .period = seconds(3600)}}, s.options());
  REQUIRE(replica_a.client() != replica_b.client());
  std::atomic<int> admitted{0}, errors{0};
  std::vector<std::thread> threads;
  threads.reserve(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto& limiter = t % 2 == 0 ? replica_a : replica_b;
      for (int i = 0; i < 40; ++i) {
        absl::StatusOr<Decision> d = limiter.check("shared-key");
        if (!d.ok()) {
          errors.fetch_add(1);
        } else if (d->allowed()) {
          admitted.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  CHECK(errors.load() == 0);
  CHECK(admitted.load() == 100);
}

TEST_CASE("the pool never opens more than max connections and callers wait for a free one") {
  Server s;
  auto options = s.options();
  options.connection.max_connections = 2;
  auto limiter = make_limiter({{.requests = 1'000'000, .period = seconds(1)}}, options);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  threads.reserve(6);
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        failures += !limiter.check("k").ok();
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  CHECK(failures.load() == 0);
  CHECK(limiter.client()->pool_for_testing().open_connections() <= 2);
}

TEST_CASE("a check waits no longer than the command timeout for a free connection") {
  Server s;
  auto options = s.options(milliseconds(200));
  options.connection.max_connections = 1;
  auto limiter = make_limiter({{.requests = 10, .period = seconds(1)}}, options);
  {
    auto held = limiter.client()->pool_for_testing().acquire();  // the only connection, busy
    REQUIRE(held.ok());
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<Decision> d = limiter.check("k");
    const auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK(d.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(elapsed >= milliseconds(150));
    CHECK(elapsed < milliseconds(200 + 700));
  }  // the connection is returned
  CHECK(limiter.check("k").ok());
}

TEST_CASE("TCP connections work like unix socket ones") {
  Server s;
  auto options = timed(s.options());
  options.connection.unix_socket.clear();
  options.connection.host = "127.0.0.1";
  options.connection.port = s.redis.port();
  auto limiter = make_limiter({{.requests = 2, .period = seconds(1)}}, options);
  CHECK(at(limiter, "k", kT0) == allowed(2, 1, nanoseconds(500'000'000)));
}

// --- faults -----------------------------------------------------------------------------------

TEST_CASE("a killed server gives Unavailable within the timeout and a restart recovers") {
  Server s;
  auto limiter =
      make_limiter({{.requests = 10, .period = seconds(1)}}, s.options(milliseconds(500)));
  REQUIRE(limiter.check("k").ok());
  s.redis.kill();
  for (int attempt = 0; attempt < 3; ++attempt) {  // the pooled connection, then fresh ones
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<Decision> d = limiter.check("k");
    const auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK(d.status().code() == absl::StatusCode::kUnavailable);
    CHECK(elapsed < milliseconds(500));
  }
  REQUIRE(s.redis.restart().empty());
  absl::StatusOr<Decision> d = limiter.check("k");
  INFO(d.status());
  CHECK((d.ok() && d->allowed()));
}

TEST_CASE("a stopped server gives DeadlineExceeded within the timeout") {
  Server s;
  auto limiter =
      make_limiter({{.requests = 10, .period = seconds(1)}}, s.options(milliseconds(300)));
  REQUIRE(limiter.check("k").ok());
  s.redis.stop();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Decision> d = limiter.check("k");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  s.redis.resume();
  CHECK(d.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(elapsed >= milliseconds(250));
  CHECK(elapsed < milliseconds(300 + 700));
  absl::StatusOr<Decision> after = limiter.check("k");
  INFO(after.status());
  CHECK(after.ok());
}

TEST_CASE("a server that turned read-only replica is Unavailable and a new primary recovers") {
  Server s;
  auto limiter = make_limiter({{.requests = 10, .period = seconds(1)}}, s.options());
  REQUIRE(limiter.check("k").ok());
  // A replica of an unreachable primary serves reads and refuses writes, as after a failover.
  REQUIRE(s.redis.command({"REPLICAOF", "127.0.0.1", "1"}));
  absl::StatusOr<Decision> d = limiter.check("fresh");
  INFO(d.status());
  CHECK(d.status().code() == absl::StatusCode::kUnavailable);
  REQUIRE(s.redis.command({"REPLICAOF", "NO", "ONE"}));
  CHECK(limiter.check("fresh").ok());
}

TEST_CASE("an unreachable server is Unavailable") {
  auto options = sluice::redis::ClientOptions{};
  options.connection.unix_socket = "/nonexistent/sluice-redis.sock";
  auto limiter = make_limiter({{.requests = 1, .period = seconds(1)}}, options);
  CHECK(limiter.check("k").status().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("a client set for Redis Cluster is refused at creation by a server that is not one") {
  Server s;
  sluice::redis::ClientOptions options = s.options();
  options.connection.unix_socket.clear();
  options.connection.port = s.redis.port();
  options.cluster = true;
  auto client = sluice::redis::Client::create(options);
  INFO(client.status());
  CHECK(client.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(client.status().message().find("set ClientOptions::cluster = false") !=
        std::string_view::npos);
}

TEST_CASE("a server older than the scripts need is refused, naming the version to run") {
  using sluice::redis::detail::server_version_status;
  const absl::Status old = server_version_status("4.0.14");
  CHECK(old.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(old.message().find("Redis 4.0.14") != std::string_view::npos);
  CHECK(old.message().find("Redis 5.0 or later") != std::string_view::npos);
  CHECK(server_version_status("5.0.0").ok());
  CHECK(server_version_status("7.0.15").ok());
  CHECK(server_version_status("10.1.2").ok());
  CHECK(server_version_status("").code() == absl::StatusCode::kFailedPrecondition);
  CHECK(server_version_status("x.y").code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("a script flush is repaired transparently by reloading the script") {
  Server s;
  auto limiter = make_limiter({{.requests = 3, .period = seconds(1)}}, timed(s.options()));
  CHECK(at(limiter, "k", kT0) == allowed(3, 2, nanoseconds(333'333'334)));
  REQUIRE(s.redis.command({"SCRIPT", "FLUSH"}));
  CHECK(at(limiter, "k", kT0) == allowed(3, 1, nanoseconds(666'666'667)));
  sluice_test::Reply exists_reply =
      s.redis.command({"SCRIPT", "EXISTS", limiter.client()->script_sha()});
  REQUIRE(exists_reply);
  REQUIRE(exists_reply->type == REDIS_REPLY_ARRAY);
  CHECK(exists_reply->element[0]->integer == 1);
}

TEST_CASE("the locally computed script SHA-1 is the one Redis computes") {
  Server s;
  auto client = sluice::redis::Client::create(s.options());
  REQUIRE(client.ok());
  sluice_test::Reply sha =
      s.redis.command({"SCRIPT", "LOAD", std::string(sluice::redis::kGcraScript)});
  REQUIRE(sha);
  REQUIRE(sha->type == REDIS_REPLY_STRING);
  CHECK(std::string(sha->str, sha->len) == (*client)->script_sha());
  CHECK(sluice::redis::detail::sha1_hex("abc") == "a9993e364706816aba3e25717850c26c9cd0d89d");
}

TEST_CASE("a key of the wrong type at the digest key is an Internal error and never an allow") {
  Server s;
  auto limiter = make_limiter({{.requests = 3, .period = seconds(1)}}, s.options());
  REQUIRE(s.redis.command({"HSET", limiter.redis_key("hash"), "f", "v"}));
  CHECK(limiter.check("hash").status().code() == absl::StatusCode::kInternal);
  REQUIRE(s.redis.command({"SET", limiter.redis_key("garbage"), "not a sluice state"}));
  CHECK(limiter.check("garbage").status().code() == absl::StatusCode::kInternal);
  // Right size and wrong content: a NaN debt.
  std::string nan_state(32, '\xff');
  REQUIRE(s.redis.command({"SET", limiter.redis_key("nan"), nan_state}));
  CHECK(limiter.check("nan").status().code() == absl::StatusCode::kInternal);
}

TEST_CASE("a script reply of the wrong shape is an Internal error and never a crash") {
  Server s;
  for (const char* body :
       {"return 1", "return {1, 2, 3}", "return 'short'", "return struct.pack('<ddd', 1, 0, 0)",
        "return redis.status_reply('OK')", "return struct.pack('<ddd', 1, 1700000000, 0) .. '1'"}) {
    auto limiter = make_limiter({{.requests = 3, .period = seconds(1)}}, s.options());
    limiter.client()->replace_script_for_testing(body);
    absl::StatusOr<Decision> d = limiter.check("k");
    INFO(body);
    CHECK(d.status().code() == absl::StatusCode::kInternal);
  }
}

// --- hygiene ----------------------------------------------------------------------------------

TEST_CASE(
    "a key maps to the same Redis key in every release, so replicas of mixed versions share") {
  // Pinned: the digest (XXH3-128 seeded with key_seed and the windows' fingerprint) and its hex.
  sluice::redis::ClientOptions options;  // connects lazily: no server needed
  options.key_prefix = "test:";
  options.key_seed = 42;
  auto client = sluice::redis::Client::create(options);
  REQUIRE(client.ok());
  auto limit = sluice::redis::Limit::create({{.requests = 600, .period = seconds(60)},
                                             {.requests = 10, .period = seconds(1), .burst = 20}});
  REQUIRE(limit.ok());
  CHECK((*client)->redis_key("alice", *limit) == "test:{ebb4d97dbb74e2eee506d40dee95c158}");
}

TEST_CASE("Redis holds only prefixed hex digests with a hash tag and never raw key bytes") {
  Server s;
  auto limiter = make_limiter({{.requests = 5, .period = seconds(60)}}, s.options());
  const std::vector<std::string> identities = {"alice@example.com", "10.0.0.1", "Bearer abc123",
                                               std::string("bin\0ary", 7)};
  for (const std::string& id : identities) {
    REQUIRE(limiter.check(id).ok());
  }
  const std::vector<std::string> keys = s.redis.keys();
  CHECK(keys.size() == identities.size());
  for (const std::string& key : keys) {
    INFO(key);
    CHECK(key.size() == 5 + 34);
    CHECK(key.rfind("test:{", 0) == 0);
    CHECK(key.back() == '}');
    CHECK(key.find_first_not_of("0123456789abcdef", 6) == key.size() - 1);
    for (const std::string& id : identities) {
      CHECK(key.find(id) == std::string::npos);
    }
    sluice_test::Reply ttl = s.redis.command({"PTTL", key});
    REQUIRE(ttl);
    CHECK(ttl->integer > 0);
  }
}

TEST_CASE("a key expires when its windows are full again") {
  Server s;
  auto limiter = make_limiter({{.requests = 10, .period = seconds(10)}}, s.options());
  REQUIRE(limiter.check("k").ok());
  // One request is 1 s of debt: the key lives 1 s, rounded up to the next millisecond.
  sluice_test::Reply ttl = s.redis.command({"PTTL", limiter.redis_key("k")});
  REQUIRE(ttl);
  CHECK(ttl->integer > 500);
  CHECK(ttl->integer <= 1001);
}

TEST_CASE("idle keys vanish on their own") {
  Server s;
  auto limiter = make_limiter({{.requests = 1, .period = milliseconds(200)}}, s.options());
  REQUIRE(limiter.check("k").ok());
  const std::string key = limiter.redis_key("k");
  CHECK(exists(s, key));
  const auto deadline = std::chrono::steady_clock::now() + seconds(3);
  while (exists(s, key) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));  // waiting for a TTL, not measuring a rate
  }
  CHECK_FALSE(exists(s, key));
}

TEST_CASE("different limits and seeds never share a Redis key") {
  auto a = sluice::redis::RedisGcraLimiter::create({{.requests = 1, .period = seconds(1)}});
  auto b = sluice::redis::RedisGcraLimiter::create({{.requests = 2, .period = seconds(1)}});
  sluice::redis::ClientOptions other_seed;
  other_seed.key_seed = 7;
  auto c =
      sluice::redis::RedisGcraLimiter::create({{.requests = 1, .period = seconds(1)}}, other_seed);
  auto a2 = sluice::redis::RedisGcraLimiter::create({{.requests = 1, .period = seconds(1)}});
  REQUIRE((a.ok() && b.ok() && c.ok() && a2.ok()));
  CHECK(a->redis_key("k") != b->redis_key("k"));
  CHECK(a->redis_key("k") != c->redis_key("k"));
  CHECK(a->redis_key("k") == a2->redis_key("k"));
  CHECK(a->redis_key("k") != a->redis_key("k2"));
}
