// Coalescing: concurrent single-key checks to one Redis node share script calls.
//
// Against a real redis-server each test case starts, and (for the queue's own rules) against the
// coalescer with a fake call that the test holds in flight. Budgets are asserted to exact totals
// at a frozen server time (the testing time hook) or against limits that refill far slower than
// the test runs. Sleeps appear only to hold a server stopped; no rate is measured by sleeping.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <latch>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "redis_fixture.hpp"
#include "redis_server.hpp"
#include "sluice/clock.hpp"
#include "sluice/gcra.hpp"
#include "sluice/redis.hpp"
#include "sluice/redis/detail/coalescer.hpp"

namespace {

using sluice::Decision;
using sluice::GcraWindow;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

using Server = sluice_test::RedisFixture;
namespace sr = sluice::redis;

constexpr nanoseconds kT0 = seconds(1'700'000'000);  // a server time, ns since the Unix epoch

sr::Limit make_limit(std::vector<GcraWindow> windows) {
  absl::StatusOr<sr::Limit> limit = sr::Limit::create(std::move(windows));
  REQUIRE(limit.ok());
  return *std::move(limit);
}

std::shared_ptr<sr::Client> make_client(sr::ClientOptions options) {
  absl::StatusOr<std::shared_ptr<sr::Client>> client = sr::Client::create(std::move(options));
  INFO(client.status());
  REQUIRE(client.ok());
  return *std::move(client);
}

sr::RedisGcraLimiter make_limiter(std::vector<GcraWindow> windows,
                                  std::shared_ptr<sr::Client> client) {
  auto limiter = sr::RedisGcraLimiter::create(std::move(windows), std::move(client));
  INFO(limiter.status());
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}

// INFO commandstats calls of `command` since the last CONFIG RESETSTAT (0 if none).
long long calls_of(const Server& s, std::string_view command) {
  sluice_test::Reply info = s.redis.command({"INFO", "commandstats"});
  REQUIRE(info);
  REQUIRE(info->type == REDIS_REPLY_STRING);
  const std::string text(info->str, info->len);
  const std::string tag = "cmdstat_" + std::string(command) + ":calls=";
  const std::size_t at = text.find(tag);
  return at == std::string::npos ? 0 : std::stoll(text.substr(at + tag.size()));
}

void reset_stats(const Server& s) { s.redis.command({"CONFIG", "RESETSTAT"}); }

// Runs `body(thread_index)` on `threads` threads at once and joins them.
template <class Body>
void on_threads(int threads, Body body) {
  // Every thread starts its calls together: started one by one (slow under TSan), the early
  // threads could finish before the late ones begin, and then nothing overlaps to coalesce.
  std::latch start(threads);
  std::vector<std::thread> running;
  running.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&start, &body, t] {
      start.arrive_and_wait();
      body(t);
    });
  }
  for (std::thread& thread : running) thread.join();
}

// Resumes a stopped server when the test case ends, however it ends.
struct ResumeOnExit {
  sluice_test::RedisServer& server;
  ~ResumeOnExit() { server.resume(); }
};

// A fake call for the coalescer: records each batch's keys and, while `hold` is set, keeps the
// call in flight until the test releases it.
struct FakeCalls {
  std::mutex mu;
  std::vector<std::vector<std::string>> batches;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> hold{true};
  std::atomic<int> in_flight{0};

  auto sender() {
    return [this](std::span<const sr::CheckItem> items, std::optional<nanoseconds>,
                  sr::detail::Deadline, std::span<absl::StatusOr<Decision>> results) {
      {
        std::lock_guard<std::mutex> lock(mu);
        std::vector<std::string>& keys = batches.emplace_back();
        for (const sr::CheckItem& item : items) keys.emplace_back(item.key);
      }
      ++in_flight;
      if (hold) released.wait();
      for (absl::StatusOr<Decision>& r : results) r = Decision{};
      --in_flight;
    };
  }
};

// Waits (without sleeping) until `ready()` holds; fails the test after 10 s.
template <class Ready>
void spin_until(Ready ready) {
  const auto give_up = std::chrono::steady_clock::now() + seconds(10);
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= give_up) FAIL("gave up waiting");
    std::this_thread::yield();
  }
}

// The time of every client made with timed() options: tests set it, then check (the scripts
// decide at it instead of the server's TIME).
sluice::ManualClock server_time(kT0);
sluice::redis::ClientOptions timed(sluice::redis::ClientOptions options) {
  options.time_source = [] { return server_time.now(); };
  return options;
}

// `items` as the one call concurrent checks of them would share, at `t`.
std::vector<absl::StatusOr<Decision>> coalesced_at(sr::Client& client,
                                                   std::span<const sr::CheckItem> items,
                                                   nanoseconds t) {
  server_time.set(t);
  return client.check_coalesced_for_testing(items);
}

// client.check_all(items) at `t`.
absl::StatusOr<std::vector<Decision>> checked_at(sr::Client& client,
                                                 std::span<const sr::CheckItem> items,
                                                 nanoseconds t) {
  server_time.set(t);
  return client.check_all(items);
}

}  // namespace

// --- budgets under concurrency ----------------------------------------------------------------

TEST_CASE("thirty-two threads on a few keys admit exactly each key's budget at a frozen time") {
  Server s;
  server_time.set(kT0);
  std::shared_ptr<sr::Client> client = make_client(timed(s.options()));
  // Two limits sharing one client, so that one call carries items of both.
  auto hourly = make_limiter({{.requests = 100, .period = seconds(3600)}}, client);
  auto stacked = make_limiter(
      {{.requests = 5, .period = seconds(1)}, {.requests = 20, .period = seconds(60)}}, client);
  const std::vector<std::string> keys = {"a", "b", "c", "d", "e", "f"};  // e, f: stacked
  std::vector<std::atomic<int>> admitted(keys.size());
  std::atomic<int> errors{0};
  on_threads(32, [&](int t) {
    for (int i = 0; i < 40; ++i) {
      const std::size_t k = static_cast<std::size_t>(t * 40 + i) % keys.size();
      absl::StatusOr<Decision> d = k < 4 ? hourly.check(keys[k]) : stacked.check(keys[k]);
      if (!d.ok()) {
        errors.fetch_add(1);
      } else if (d->allowed()) {
        admitted[k].fetch_add(1);
      }
    }
  });
  CHECK(errors.load() == 0);
  for (std::size_t k = 0; k < keys.size(); ++k) {
    INFO(keys[k]);
    CHECK(admitted[k].load() == (k < 4 ? 100 : 5));
  }
  CHECK(client->coalesced_checks() > 0);
}

TEST_CASE("concurrent checks share script calls: fewer EVALSHA calls than checks") {
  Server s;
  std::shared_ptr<sr::Client> client = s.client();
  // A token every 36 s: nothing refills while the test runs, so exactly 100 pass.
  auto limiter = make_limiter({{.requests = 100, .period = seconds(3600)}}, client);
  REQUIRE(limiter.inspect("warm-up").ok());  // the script is loaded, a connection open
  reset_stats(s);
  std::atomic<int> admitted{0}, errors{0};
  on_threads(32, [&](int t) {
    for (int i = 0; i < 25; ++i) {
      absl::StatusOr<Decision> d = limiter.check(t % 2 == 0 ? "even" : "odd");
      if (!d.ok()) {
        errors.fetch_add(1);
      } else if (d->allowed()) {
        admitted.fetch_add(1);
      }
    }
  });
  CHECK(errors.load() == 0);
  CHECK(admitted.load() == 200);  // 100 per key
  const long long calls = calls_of(s, "evalsha");
  INFO("evalsha calls: " << calls << ", coalesced checks: " << client->coalesced_checks());
  CHECK(calls < 32 * 25);
  CHECK(client->coalesced_checks() > 0);
  CHECK(calls_of(s, "time") == calls);  // one TIME per call, however many checks it carries
}

TEST_CASE("a lone check is sent at once as one script call of its own") {
  Server s;
  std::shared_ptr<sr::Client> client = s.client();
  auto limiter = make_limiter({{.requests = 10, .period = seconds(1)}}, client);
  REQUIRE(limiter.inspect("warm-up").ok());
  reset_stats(s);
  for (int i = 0; i < 5; ++i) {
    REQUIRE(limiter.check("k").ok());
  }
  CHECK(calls_of(s, "evalsha") == 5);
  CHECK(calls_of(s, "mget") == 0);  // the lone check's own script path
  CHECK(client->coalesced_checks() == 0);
}

TEST_CASE("with coalescing off every check is a script call of its own") {
  Server s;
  sr::ClientOptions options = s.options();
  options.coalesce = false;
  std::shared_ptr<sr::Client> client = make_client(options);
  auto limiter = make_limiter({{.requests = 1'000'000, .period = seconds(1)}}, client);
  REQUIRE(limiter.inspect("warm-up").ok());
  reset_stats(s);
  std::atomic<int> errors{0};
  on_threads(8, [&](int) {
    for (int i = 0; i < 20; ++i) errors += limiter.check("k").ok() ? 0 : 1;
  });
  CHECK(errors.load() == 0);
  CHECK(calls_of(s, "evalsha") == 8 * 20);
  CHECK(client->coalesced_checks() == 0);
}

TEST_CASE("no call carries more than max_coalesced_checks checks") {
  Server s;
  sr::ClientOptions options = s.options();
  options.max_coalesced_checks = 4;
  std::shared_ptr<sr::Client> client = make_client(options);
  auto limiter = make_limiter({{.requests = 1'000'000, .period = seconds(1)}}, client);
  REQUIRE(limiter.inspect("warm-up").ok());
  reset_stats(s);
  std::atomic<int> errors{0};
  on_threads(16, [&](int t) {
    for (int i = 0; i < 20; ++i) errors += limiter.check("k" + std::to_string(t)).ok() ? 0 : 1;
  });
  CHECK(errors.load() == 0);
  CHECK(calls_of(s, "evalsha") >= 16 * 20 / 4);
}

TEST_CASE("max_coalesced_checks outside 1..1000 is an invalid argument") {
  sr::ClientOptions options;
  options.max_coalesced_checks = 0;
  CHECK(sr::Client::create(options).status().code() == absl::StatusCode::kInvalidArgument);
  options.max_coalesced_checks = 1001;
  CHECK(sr::Client::create(options).status().code() == absl::StatusCode::kInvalidArgument);
}

// --- each check decided on its own --------------------------------------------------------------

// A client that checks one by one, beside a coalescing client of the same server: the same keys,
// in state of their own.
std::shared_ptr<sr::Client> make_apart_client(Server& s) {
  sr::ClientOptions options = timed(s.options());
  options.key_prefix = "apart:";
  options.coalesce = false;
  return make_client(options);
}

// Limits of both algorithms with debts of seconds, so that a key's expiry tells which of its
// checks it was written by.
struct SlowLimits {
  sr::Limit slow = make_limit({{.requests = 4, .period = seconds(40)}});
  sr::Limit stacked = make_limit(
      {{.requests = 2, .period = seconds(20), .burst = 3}, {.requests = 4, .period = seconds(80)}});
  sr::Limit fixed = make_fixed();

  static sr::Limit make_fixed() {
    absl::StatusOr<sr::Limit> limit = sr::Limit::fixed_window(
        {{.limit = 3, .window = seconds(30)}, {.limit = 5, .window = seconds(90)}});
    REQUIRE(limit.ok());
    return *std::move(limit);
  }
};

// A coalescing client and one that checks one by one (make_apart_client), of one server whose
// time is kT0.
struct TwoClients {
  TwoClients() { server_time.set(kT0); }
  Server s;
  std::shared_ptr<sr::Client> together = make_client(timed(s.options()));
  std::shared_ptr<sr::Client> apart = make_apart_client(s);
};

// `item`'s key holds the same value (or none) under both clients, written at one server time
// with the same PX: the expiries differ by the ms between the writes. Returns the key's PTTL.
long long check_same_state(Server& s, sr::Client& together, sr::Client& apart,
                           const sr::CheckItem& item) {
  INFO("key " << item.key);
  const std::string mine = together.redis_key(item.key, *item.limit);
  const std::string theirs = apart.redis_key(item.key, *item.limit);
  sluice_test::Reply a = s.redis.command({"GET", mine});
  sluice_test::Reply b = s.redis.command({"GET", theirs});
  REQUIRE((a && b && a->type == b->type));
  if (a->type == REDIS_REPLY_STRING) {
    CHECK(std::string_view(a->str, a->len) == std::string_view(b->str, b->len));
  }
  sluice_test::Reply ta = s.redis.command({"PTTL", mine});
  sluice_test::Reply tb = s.redis.command({"PTTL", theirs});
  REQUIRE((ta && tb && ta->type == REDIS_REPLY_INTEGER && tb->type == REDIS_REPLY_INTEGER));
  CHECK(std::abs(ta->integer - tb->integer) < 1'000);
  return ta->integer;
}

TEST_CASE("a coalesced call decides each check exactly as separate checks in that order") {
  TwoClients c;
  const sr::Limit three = make_limit({{.requests = 3, .period = seconds(1)}});
  const sr::Limit stacked = make_limit(
      {{.requests = 2, .period = seconds(1), .burst = 3}, {.requests = 4, .period = seconds(60)}});
  // Denials in the middle do not stop later items; a repeated key sees earlier consumption;
  // cost 0 peeks; several limits in one call.
  const std::vector<sr::CheckItem> items = {{.key = "a", .limit = &three},
                                            {.key = "a", .limit = &three, .cost = 2},
                                            {.key = "a", .limit = &three},
                                            {.key = "b", .limit = &three, .cost = 3},
                                            {.key = "a", .limit = &three, .cost = 0},
                                            {.key = "s", .limit = &stacked, .cost = 2},
                                            {.key = "s", .limit = &stacked, .cost = 2},
                                            {.key = "s", .limit = &stacked},
                                            {.key = "b", .limit = &three},
                                            {.key = "c", .limit = &three, .cost = 0}};
  for (const nanoseconds t : {kT0, kT0 + milliseconds(400), kT0 + milliseconds(401)}) {
    const std::vector<absl::StatusOr<Decision>> coalesced = coalesced_at(*c.together, items, t);
    REQUIRE(coalesced.size() == items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      INFO("at +" << (t - kT0).count() << " ns, item " << i);
      absl::StatusOr<std::vector<Decision>> alone =
          checked_at(*c.apart, std::span(&items[i], 1), t);
      REQUIRE(alone.ok());
      REQUIRE(coalesced[i].ok());
      CHECK(*coalesced[i] == (*alone)[0]);
    }
  }
  // At the first instant: a(1) admitted, a(2) admitted, a(1) denied, b(3) admitted.
  const std::vector<absl::StatusOr<Decision>> first =
      coalesced_at(*c.together, items, kT0 + seconds(10));
  CHECK((first[0].ok() && first[0]->allowed()));
  CHECK((first[1].ok() && first[1]->allowed()));
  CHECK((first[2].ok() && !first[2]->allowed()));
  CHECK((first[3].ok() && first[3]->allowed()));
}

TEST_CASE("a coalesced call of both algorithms leaves each key as separate checks would") {
  TwoClients c;
  const SlowLimits limits;
  const sr::Limit* fixed = &limits.fixed;
  // Limits alternate (a fixed window between GCRA items of one limit); keys repeat after a write.
  const std::vector<sr::CheckItem> items = {{.key = "g", .limit = &limits.slow},
                                            {.key = "f", .limit = fixed},
                                            {.key = "g", .limit = &limits.slow, .cost = 2},
                                            {.key = "s", .limit = &limits.stacked},
                                            {.key = "f", .limit = fixed, .cost = 2},
                                            {.key = "g", .limit = &limits.slow, .cost = 2},
                                            {.key = "f", .limit = fixed},
                                            {.key = "s", .limit = &limits.stacked, .cost = 2}};
  const std::vector<absl::StatusOr<Decision>> coalesced = coalesced_at(*c.together, items, kT0);
  REQUIRE(coalesced.size() == items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    INFO("item " << i);
    absl::StatusOr<std::vector<Decision>> alone =
        checked_at(*c.apart, std::span(&items[i], 1), kT0);
    REQUIRE(alone.ok());
    REQUIRE(coalesced[i].ok());
    CHECK(*coalesced[i] == (*alone)[0]);
  }
  for (const sr::CheckItem& item : {items[0], items[1], items[3]}) {
    CHECK(check_same_state(c.s, *c.together, *c.apart, item) > 10'000);
  }
}

// The tag that ended the last script call the server logged since `reset_slowlog` (the slow
// log holds every call once its threshold is 0; a script's own commands are not logged).
void reset_slowlog(Server& s) {
  s.redis.command({"CONFIG", "SET", "slowlog-log-slower-than", "0"});
  s.redis.command({"SLOWLOG", "RESET"});
}
std::string last_script_tag(Server& s) {
  sluice_test::Reply log = s.redis.command({"SLOWLOG", "GET", "100"});
  REQUIRE((log && log->type == REDIS_REPLY_ARRAY));
  for (std::size_t i = 0; i < log->elements; ++i) {  // newest first
    const redisReply* args = log->element[i]->element[3];
    if (args->elements > 0 && std::string_view(args->element[0]->str) == "EVALSHA") {
      const redisReply* tag = args->element[args->elements - 1];
      return std::string(tag->str, tag->len);
    }
  }
  return "";
}

TEST_CASE("a coalesced call of distinct keys decides and writes each as separate checks would") {
  TwoClients c;
  const SlowLimits limits;
  const sr::Limit* fixed = &limits.fixed;
  const sr::Limit once = make_limit({{.requests = 1, .period = seconds(40)}});
  // Admissions of each algorithm, a key admitted once and then denied, a peek (cost 0).
  const std::vector<sr::CheckItem> items = {{.key = "g", .limit = &limits.slow, .cost = 2},
                                            {.key = "f", .limit = fixed, .cost = 2},
                                            {.key = "s", .limit = &limits.stacked, .cost = 2},
                                            {.key = "d", .limit = &once},
                                            {.key = "p", .limit = &limits.slow, .cost = 0}};
  for (const nanoseconds t : {kT0, kT0 + seconds(5), kT0 + seconds(6)}) {
    reset_slowlog(c.s);
    const std::vector<absl::StatusOr<Decision>> coalesced = coalesced_at(*c.together, items, t);
    CHECK(last_script_tag(c.s) == sr::kDistinctIndependentItems);
    REQUIRE(coalesced.size() == items.size());
    CHECK((coalesced[3].ok() && coalesced[3]->allowed() == (t == kT0)));
    for (std::size_t i = 0; i < items.size(); ++i) {
      INFO("at +" << (t - kT0).count() << " ns, item " << i);
      absl::StatusOr<std::vector<Decision>> alone =
          checked_at(*c.apart, std::span(&items[i], 1), t);
      REQUIRE(alone.ok());
      INFO(coalesced[i].status());
      REQUIRE(coalesced[i].ok());
      CHECK(*coalesced[i] == (*alone)[0]);
    }
  }
  for (const sr::CheckItem& item : items) check_same_state(c.s, *c.together, *c.apart, item);
  // The peeking key holds no state.
  CHECK(c.s.redis.command({"EXISTS", c.together->redis_key("g", limits.slow)})->integer == 1);
  CHECK(c.s.redis.command({"EXISTS", c.together->redis_key("p", limits.slow)})->integer == 0);
  // A repeated key takes the mode that tracks the keys it has met.
  reset_slowlog(c.s);
  const std::vector<sr::CheckItem> repeated = {items[0], items[1], items[0]};
  coalesced_at(*c.together, repeated, kT0 + seconds(7));
  CHECK(last_script_tag(c.s) == sr::kIndependentItems);
}

TEST_CASE("a key of the wrong type fails only its own check in a coalesced call") {
  Server s;
  server_time.set(kT0);
  std::shared_ptr<sr::Client> client = make_client(timed(s.options()));
  const sr::Limit limit = make_limit({{.requests = 3, .period = seconds(1)}});
  const std::string bad = client->redis_key("bad", limit);
  s.redis.command({"HSET", bad, "field", "value"});
  const std::vector<sr::CheckItem> items = {{.key = "good", .limit = &limit},
                                            {.key = "bad", .limit = &limit},
                                            {.key = "new", .limit = &limit}};
  const std::vector<absl::StatusOr<Decision>> results = coalesced_at(*client, items, kT0);
  CHECK((results[0].ok() && results[0]->allowed()));
  CHECK(results[1].status().code() == absl::StatusCode::kInternal);  // as a lone check of it
  CHECK((results[2].ok() && results[2]->allowed()));
  absl::StatusOr<std::vector<Decision>> alone = checked_at(*client, std::span(&items[1], 1), kT0);
  CHECK(alone.status().code() == absl::StatusCode::kInternal);
  // First in its call, or peeked at (cost 0: nothing to write), or with the key repeated: the
  // same, and the other type's value is left as it was.
  for (const std::vector<sr::CheckItem>& call :
       {std::vector<sr::CheckItem>{items[1], items[0]},
        std::vector<sr::CheckItem>{items[0], {.key = "bad", .limit = &limit, .cost = 0}},
        std::vector<sr::CheckItem>{items[1], items[0], items[1]}}) {
    const std::vector<absl::StatusOr<Decision>> r = coalesced_at(*client, call, kT0);
    for (std::size_t i = 0; i < call.size(); ++i) {
      INFO("item " << i << " of " << call.size() << ": " << r[i].status());
      CHECK(r[i].ok() == (call[i].key != "bad"));
      if (call[i].key == "bad") CHECK(r[i].status().code() == absl::StatusCode::kInternal);
    }
  }
  sluice_test::Reply type = s.redis.command({"TYPE", bad});
  REQUIRE(type);
  CHECK(std::string_view(type->str, type->len) == "hash");
}

TEST_CASE("a server that refuses writes fails each admitted check of a call, as it would alone") {
  Server s;
  server_time.set(kT0);
  std::shared_ptr<sr::Client> client = make_client(timed(s.options()));
  const sr::Limit three = make_limit({{.requests = 3, .period = seconds(1)}});
  // Every write is refused (NOREPLICAS) while reads still answer.
  s.redis.command({"CONFIG", "SET", "min-replicas-to-write", "1"});
  const std::vector<sr::CheckItem> items = {{.key = "a", .limit = &three},
                                            {.key = "a", .limit = &three, .cost = 0},
                                            {.key = "b", .limit = &three},
                                            {.key = "a", .limit = &three, .cost = 3}};
  const std::vector<absl::StatusOr<Decision>> coalesced = coalesced_at(*client, items, kT0);
  for (std::size_t i = 0; i < items.size(); ++i) {
    INFO("item " << i << ": " << coalesced[i].status());
    absl::StatusOr<std::vector<Decision>> alone = checked_at(*client, std::span(&items[i], 1), kT0);
    REQUIRE(coalesced[i].status().code() == alone.status().code());
    if (alone.ok()) CHECK(*coalesced[i] == (*alone)[0]);
  }
  CHECK(coalesced[0].status().code() == absl::StatusCode::kUnavailable);
  CHECK((coalesced[1].ok() && coalesced[1]->remaining == 3));  // nothing was taken before it
  s.redis.command({"CONFIG", "SET", "min-replicas-to-write", "0"});
  const std::vector<absl::StatusOr<Decision>> after = coalesced_at(*client, items, kT0);
  CHECK((after[0].ok() && after[0]->allowed() && after[0]->remaining == 2));
  CHECK((after[3].ok() && !after[3]->allowed()));  // sees a's earlier consumption
}

// --- deadlines ----------------------------------------------------------------------------------

TEST_CASE("checks queued behind a call to a stopped server return DeadlineExceeded in time") {
  Server s;
  std::shared_ptr<sr::Client> client = s.client(milliseconds(300));
  auto limiter = make_limiter({{.requests = 100, .period = seconds(3600)}}, client);
  REQUIRE(limiter.inspect("k").ok());  // a connection is open and idle
  std::vector<absl::StatusOr<Decision>> results(8, absl::UnknownError("not run"));
  std::vector<milliseconds> elapsed(8);
  {
    s.redis.stop();
    ResumeOnExit resume{s.redis};
    on_threads(8, [&](int t) {
      const auto start = std::chrono::steady_clock::now();
      results[t] = limiter.check("k");
      elapsed[t] =
          std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
    });
  }
  for (int t = 0; t < 8; ++t) {
    INFO("thread " << t << ": " << results[t].status() << " after " << elapsed[t].count() << " ms");
    CHECK(results[t].status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(elapsed[t] < milliseconds(300 + 700));
  }
  absl::StatusOr<Decision> after = limiter.inspect("k");  // the server answers again
  INFO(after.status());
  CHECK(after.ok());
}

TEST_CASE("a queued check whose deadline passes leaves the queue unsent and is DeadlineExceeded") {
  sr::detail::Coalescer coalescer(64);
  const sr::Limit limit = make_limit({{.requests = 3, .period = seconds(1)}});
  FakeCalls calls;
  const auto far = [] { return std::chrono::steady_clock::now() + seconds(10); };
  absl::StatusOr<Decision> first = absl::UnknownError("not run");
  std::thread in_flight([&] {
    first = coalescer.check({.key = "first", .limit = &limit}, std::nullopt, far(), calls.sender());
  });
  spin_until([&] { return calls.in_flight.load() == 1; });
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Decision> late = coalescer.check({.key = "late", .limit = &limit}, std::nullopt,
                                                  start + milliseconds(50), calls.sender());
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(waited >= milliseconds(50));
  CHECK(waited < milliseconds(50 + 700));
  CHECK(calls.in_flight.load() == 1);  // it gave up while the first call was still in flight
  absl::StatusOr<Decision> next = absl::UnknownError("not run");
  std::thread queued([&] {
    next = coalescer.check({.key = "next", .limit = &limit}, std::nullopt, far(), calls.sender());
  });
  spin_until([&] { return coalescer.queued() == 1; });
  calls.release.set_value();
  in_flight.join();
  queued.join();
  CHECK(first.ok());
  CHECK(next.ok());
  const std::vector<std::vector<std::string>> expected = {{"first"}, {"next"}};
  CHECK(calls.batches == expected);  // "late" was never sent
}

TEST_CASE("queued checks go out together, in order, at most max_batch per call, one time each") {
  sr::detail::Coalescer coalescer(4);
  const sr::Limit limit = make_limit({{.requests = 3, .period = seconds(1)}});
  FakeCalls calls;
  const auto far = [] { return std::chrono::steady_clock::now() + seconds(10); };
  absl::StatusOr<Decision> first = absl::UnknownError("not run");
  std::thread in_flight([&] {
    first = coalescer.check({.key = "first", .limit = &limit}, std::nullopt, far(), calls.sender());
  });
  spin_until([&] { return calls.in_flight.load() == 1; });
  // Queued one at a time so that the queue order is known: q0..q9, q1 and q7 at another time.
  std::vector<std::thread> queued;
  const std::vector<std::string> keys = {"q0", "q1", "q2", "q3", "q4",
                                         "q5", "q6", "q7", "q8", "q9"};
  std::vector<absl::StatusOr<Decision>> results(keys.size(), absl::UnknownError("not run"));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::optional<nanoseconds> time =
        i == 1 || i == 7 ? std::optional<nanoseconds>(kT0) : std::nullopt;
    queued.emplace_back([&, i, time] {
      results[i] = coalescer.check({.key = keys[i], .limit = &limit}, time, far(), calls.sender());
    });
    spin_until([&] { return coalescer.queued() == i + 1; });
  }
  calls.hold = false;
  calls.release.set_value();
  in_flight.join();
  for (std::thread& t : queued) t.join();
  CHECK(first.ok());
  for (const absl::StatusOr<Decision>& r : results) CHECK(r.ok());
  const std::vector<std::vector<std::string>> expected = {
      {"first"}, {"q0", "q2", "q3", "q4"}, {"q1", "q7"}, {"q5", "q6", "q8", "q9"}};
  CHECK(calls.batches == expected);
  CHECK(coalescer.coalesced_checks() == 10);
  CHECK(coalescer.calls() == 4);
}

// --- several coalesced calls in flight at once --------------------------------------------------

TEST_CASE("with max_in_flight 2 two calls go out at once and the rest queue for the next") {
  sr::detail::Coalescer coalescer(64, 2);
  const sr::Limit limit = make_limit({{.requests = 3, .period = seconds(1)}});
  // The call led by "one" is held until `release_one`, the one led by "two" until `release_two`;
  // later calls return at once.
  std::promise<void> release_one, release_two;
  std::shared_future<void> one = release_one.get_future().share();
  std::shared_future<void> two = release_two.get_future().share();
  std::mutex mu;
  std::vector<std::vector<std::string>> batches;
  std::atomic<int> in_flight{0};
  const auto sender = [&](std::span<const sr::CheckItem> items, std::optional<nanoseconds>,
                          sr::detail::Deadline, std::span<absl::StatusOr<Decision>> results) {
    {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<std::string>& keys = batches.emplace_back();
      for (const sr::CheckItem& item : items) keys.emplace_back(item.key);
    }
    ++in_flight;
    if (items[0].key == "one") one.wait();
    if (items[0].key == "two") two.wait();
    for (absl::StatusOr<Decision>& r : results) r = Decision{};
    --in_flight;
  };
  const auto far = [] { return std::chrono::steady_clock::now() + seconds(10); };
  const std::vector<std::string> keys = {"one", "two", "q0", "q1", "q2"};
  std::vector<absl::StatusOr<Decision>> results(keys.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = coalescer.check({.key = keys[i], .limit = &limit}, std::nullopt, far(), sender);
    });
    if (i < 2) {
      spin_until([&] { return in_flight.load() == static_cast<int>(i) + 1; });
    } else {
      spin_until([&] { return coalescer.queued() == i - 1; });
    }
  }
  CHECK(in_flight.load() == 2);  // a third call waits for one of them to return
  release_two.set_value();       // "two" returns: its slot goes to the queued checks, together
  spin_until([&] { return coalescer.queued() == 0 && in_flight.load() == 1; });
  release_one.set_value();
  for (std::thread& t : threads) t.join();
  for (const absl::StatusOr<Decision>& r : results) CHECK(r.ok());
  const std::vector<std::vector<std::string>> expected = {{"one"}, {"two"}, {"q0", "q1", "q2"}};
  CHECK(batches == expected);
  CHECK(coalescer.peak_in_flight() == 2);
  CHECK(coalescer.calls() == 3);
}

TEST_CASE("with two coalesced calls in flight each step admits what the in-memory limiter does") {
  Server s;
  server_time.set(kT0);
  sr::ClientOptions options = timed(s.options());
  options.max_coalesced_calls = 2;
  std::shared_ptr<sr::Client> client = make_client(options);
  const std::vector<GcraWindow> windows = {{.requests = 10, .period = seconds(1), .burst = 15},
                                           {.requests = 40, .period = seconds(60)}};
  auto remote = make_limiter(windows, client);
  sluice::ManualClock clock(kT0);
  auto memory = sluice::GcraLimiter<sluice::ManualClock>::create(windows, {}, clock);
  REQUIRE(memory.ok());
  const std::vector<std::string> keys = {"a", "b", "c", "d", "e"};
  // At each frozen instant every key gets a known number of checks from 32 threads at once;
  // with cost 1 at one instant the admitted count does not depend on their order.
  for (const nanoseconds step : {nanoseconds(0), nanoseconds(milliseconds(250)),
                                 nanoseconds(milliseconds(900)), nanoseconds(seconds(7))}) {
    server_time.set(kT0 + step);
    clock.set(kT0 + step);
    std::vector<std::atomic<int>> admitted(keys.size());
    std::atomic<int> errors{0};
    on_threads(32, [&](int t) {
      for (int i = 0; i < 10; ++i) {
        const std::size_t k = static_cast<std::size_t>(t * 10 + i) % keys.size();
        absl::StatusOr<Decision> d = remote.check(keys[k]);
        if (!d.ok()) errors.fetch_add(1);
        if (d.ok() && d->allowed()) admitted[k].fetch_add(1);
      }
    });
    CHECK(errors.load() == 0);
    for (std::size_t k = 0; k < keys.size(); ++k) {
      int expected = 0;
      for (int i = 0; i < 32 * 10 / static_cast<int>(keys.size()); ++i) {
        absl::StatusOr<Decision> d = memory->check(keys[k]);
        REQUIRE(d.ok());
        expected += d->allowed() ? 1 : 0;
      }
      INFO("key " << keys[k] << " at +" << step.count() << " ns");
      CHECK(admitted[k].load() == expected);
    }
  }
  INFO("coalesced checks: " << client->coalesced_checks());
  CHECK(client->peak_coalesced_calls() == 2);
  CHECK(client->coalesced_checks() > 0);
}

TEST_CASE("with two calls in flight to a stopped server every check returns by its deadline") {
  Server s;
  sr::ClientOptions options = s.options(milliseconds(300));
  options.max_coalesced_calls = 2;
  std::shared_ptr<sr::Client> client = make_client(options);
  auto limiter = make_limiter({{.requests = 100, .period = seconds(3600)}}, client);
  REQUIRE(limiter.inspect("k").ok());  // a connection is open and idle
  std::vector<absl::StatusOr<Decision>> results(12, absl::UnknownError("not run"));
  std::vector<milliseconds> elapsed(12);
  {
    s.redis.stop();
    ResumeOnExit resume{s.redis};
    on_threads(12, [&](int t) {
      const auto start = std::chrono::steady_clock::now();
      results[t] = limiter.check("k" + std::to_string(t % 3));
      elapsed[t] =
          std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
    });
  }
  for (int t = 0; t < 12; ++t) {
    INFO("thread " << t << ": " << results[t].status() << " after " << elapsed[t].count() << " ms");
    CHECK(results[t].status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(elapsed[t] < milliseconds(300 + 700));
  }
  CHECK(client->peak_coalesced_calls() == 2);
  absl::StatusOr<Decision> after = limiter.inspect("k0");  // the server answers again
  INFO(after.status());
  CHECK(after.ok());
}

TEST_CASE("max_coalesced_calls outside 1..1000 is an invalid argument") {
  sr::ClientOptions options;
  options.max_coalesced_calls = 0;
  CHECK(sr::Client::create(options).status().code() == absl::StatusCode::kInvalidArgument);
  options.max_coalesced_calls = 1001;
  CHECK(sr::Client::create(options).status().code() == absl::StatusCode::kInvalidArgument);
}
