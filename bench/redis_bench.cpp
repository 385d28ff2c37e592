// sluice::redis against a private redis-server, beside its baselines on the same connections:
//   - a plain GET round trip (the round-trip limit at the same concurrency),
//   - a float-based GCRA script in the style of go-redis/redis_rate (the usual approach),
//   - the floor: a script doing only TIME + GET + SET PX, the Redis calls any GCRA script needs.
// Every benchmark reports `server_us_per_call`: INFO commandstats usec_per_call of the command
// it sends (stats are reset before each run), i.e. the server-side cost per call. The
// BM_ServerCost* benchmarks sample it 200 calls at a time and report the minimum and median
// sample, which a busy machine (preempting redis-server mid-call) inflates far less.
//
// BM_EngineDocumentedExample / BM_TwoLimitersDocumentedExample: the documented two-rule example
// through RedisRateLimitEngine::evaluate (one round trip) and as two limiter checks (two).
//
// BM_SluiceCheckCoalesced / BM_SluiceCheckUncoalesced: single-key checks (Client::check, what
// RedisGcraLimiter::check runs) with ClientOptions::coalesce on and off, on the same keys and
// limit as BM_SluiceCheck. They report `checks_per_call` (checks / EVALSHA calls) and
// `server_us_per_check` (INFO commandstats usec of evalsha / checks), comparable with the
// reference's `server_us_per_call` (one check per call). Their *SharedKeys variants spread all
// threads over 4 keys (a hot per-route or per-tenant limit): a call then writes each key once.
//
// Usage: build/bench/bench/redis_bench [--benchmark_filter=...]
// Starts redis-server from PATH in a temporary directory (unix socket) and kills it at exit.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "redis_interleaved.hpp"
#include "redis_server.hpp"
#include "sluice/engine.hpp"
#include "sluice/redis.hpp"
#include "sluice/redis/engine_backend.hpp"

namespace {

namespace sr = sluice::redis;

// After go-redis/redis_rate: float seconds since 2017, TAT as a float string, GET + SET EX.
constexpr std::string_view kFloatGcraScript = R"lua(
redis.replicate_commands()
local key = KEYS[1]
local burst, rate, period = ARGV[1], ARGV[2], ARGV[3]
local cost = tonumber(ARGV[4])
local interval = period / rate
local increment = interval * cost
local tolerance = interval * burst
local t = redis.call('TIME')
local now = (t[1] - 1483228800) + (t[2] / 1000000)
local tat = redis.call('GET', key)
if not tat then tat = now else tat = tonumber(tat) end
tat = math.max(tat, now)
local new_tat = tat + increment
local diff = now - (new_tat - tolerance)
local remaining = math.floor(diff / interval + 0.5)
if remaining >= 0 then
  local reset_after = new_tat - now
  redis.call('SET', key, new_tat, 'EX', math.ceil(reset_after))
  return {cost, remaining, tostring(-1), tostring(reset_after)}
end
return {0, 0, tostring(-diff), tostring(tat - now)}
)lua";

// The Redis calls every TIME-based GCRA script makes, and nothing else.
constexpr std::string_view kFloorScript = R"lua(
local t = redis.call('TIME')
local s = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], t[1] .. t[2], 'PX', 60000)
return s
)lua";

struct Fixture {
  sluice_test::RedisServer server;
  std::shared_ptr<sr::Client> client;
  std::shared_ptr<sr::Client> uncoalesced;     // the same server, ClientOptions::coalesce off
  sr::detail::ConnectionPool* pool = nullptr;  // the client's own: baselines share its connections
  std::optional<sr::Limit> limit;
  std::string float_sha, floor_sha;
};
Fixture* fixture = nullptr;

constexpr std::size_t kMaxConnections = 32;
// Each thread cycles over its own hot keys, each revisited within a few milliseconds so that its
// state is still there: every script call takes the full read-decide-write path.
constexpr int kKeysPerThread = 16;
constexpr int kPipelineDepth = 16;
// 1000/s with a bucket of 10^9: 1 ms of debt per request, never full within a run, so every
// check is admitted and writes (the expensive path). The float reference gets the same numbers.
constexpr std::uint64_t kBurst = 1'000'000'000;

sr::ConnectionOptions connection_options() {
  sr::ConnectionOptions c;
  c.unix_socket = fixture->server.unix_socket();
  c.max_connections = kMaxConnections;
  c.connect_timeout = std::chrono::milliseconds(2000);
  c.command_timeout = std::chrono::milliseconds(2000);
  return c;
}

void fail(const std::string& why) {
  std::fprintf(stderr, "redis_bench: %s\n", why.c_str());
  std::exit(1);
}

// Sends the commands pipelined on one pooled connection; aborts the benchmark on any error.
void run(benchmark::State& state, std::span<const sr::detail::Command> commands) {
  auto lease = fixture->pool->acquire();
  if (!lease.ok()) {
    state.SkipWithError(lease.status().ToString().c_str());
    return;
  }
  auto replies = sr::detail::exchange(*lease, commands);
  if (!replies.ok()) {
    state.SkipWithError(replies.status().ToString().c_str());
    return;
  }
  for (const auto& reply : *replies) {
    if (reply->type == REDIS_REPLY_ERROR) {
      state.SkipWithError(reply->str);
    }
  }
}

sr::detail::Command command(std::initializer_list<std::string_view> args) {
  sr::detail::Command c;
  for (std::string_view a : args) {
    c.add(a);
  }
  return c;
}

// Resets the server's command stats (thread 0, before the timed loop).
void reset_stats(benchmark::State& state) {
  if (state.thread_index() != 0) {
    return;
  }
  const sr::detail::Command reset = command({"CONFIG", "RESETSTAT"});
  run(state, std::span(&reset, 1));
}

// INFO commandstats `field` (calls, usec, usec_per_call) of `cmdstat` since the last CONFIG
// RESETSTAT; -1 if absent.
double server_stat(std::string_view cmdstat, std::string_view field) {
  sluice_test::Reply info = fixture->server.command({"INFO", "commandstats"});
  if (!info || info->type != REDIS_REPLY_STRING) {
    return -1;
  }
  const std::string_view text(info->str, info->len);
  const std::size_t at = text.find("cmdstat_" + std::string(cmdstat) + ":");
  const std::string tag = std::string(field) + "=";
  std::size_t value = at;
  while (value != std::string_view::npos) {  // `tag` after the colon or a comma
    value = text.find(tag, value + 1);
    if (value != std::string_view::npos && (text[value - 1] == ':' || text[value - 1] == ',')) {
      break;
    }
  }
  if (at == std::string_view::npos || value == std::string_view::npos) {
    return -1;
  }
  double number = -1;
  const std::string_view rest = text.substr(value + tag.size());
  if (std::from_chars(rest.data(), rest.data() + rest.size(), number).ec != std::errc()) {
    return -1;
  }
  return number;
}

// INFO commandstats usec_per_call of `cmdstat` since the last CONFIG RESETSTAT; -1 if absent.
double server_usec_per_call(std::string_view cmdstat) {
  return server_stat(cmdstat, "usec_per_call");
}

// Reports usec_per_call of `cmdstat` (thread 0, after the timed loop: all threads are done).
void report_server_cost(benchmark::State& state, std::string_view cmdstat) {
  if (state.thread_index() != 0) {
    return;
  }
  if (const double usec = server_usec_per_call(cmdstat); usec >= 0) {
    state.counters["server_us_per_call"] = usec;
  }
}

std::string thread_key(const benchmark::State& state, int i) {
  return "bench:" + std::to_string(state.thread_index()) + ":" + std::to_string(i % kKeysPerThread);
}

// --- one request per round trip, N concurrent callers ------------------------------------------

void BM_SluiceCheck(benchmark::State& state) {
  reset_stats(state);
  std::vector<std::string> keys;
  keys.reserve(kKeysPerThread);
  for (int i = 0; i < kKeysPerThread; ++i) {
    keys.push_back(thread_key(state, i));
  }
  int i = 0;
  for (auto _ : state) {
    const sr::CheckItem item{.key = keys[i++ % kKeysPerThread], .limit = &*fixture->limit};
    auto d = fixture->client->check_all(std::span(&item, 1));
    if (!d.ok() || !(*d)[0].allowed()) {
      state.SkipWithError(d.ok() ? "denied" : d.status().ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  report_server_cost(state, "evalsha");
}

// --- single-key checks, coalesced or not: checks per call and server-side cost per check --------

std::atomic<std::int64_t> checks_done{0};  // by every thread of the running benchmark

constexpr int kSharedKeys = 4;  // the *SharedKeys rows: every thread cycles over the same 4 keys

void single_key_checks(benchmark::State& state, sr::Client& client, bool shared_keys) {
  if (state.thread_index() == 0) {
    checks_done = 0;
  }
  reset_stats(state);
  std::vector<std::string> keys;
  keys.reserve(kKeysPerThread);
  for (int i = 0; i < kKeysPerThread; ++i) {
    keys.push_back(shared_keys
                       ? "bench:shared:" + std::to_string((state.thread_index() + i) % kSharedKeys)
                       : thread_key(state, i));
  }
  int i = 0;
  for (auto _ : state) {
    absl::StatusOr<sluice::Decision> d =
        client.check({.key = keys[i++ % kKeysPerThread], .limit = &*fixture->limit});
    if (!d.ok() || !d->allowed()) {
      state.SkipWithError(d.ok() ? "denied" : d.status().ToString().c_str());
      break;
    }
    checks_done.fetch_add(1, std::memory_order_relaxed);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() != 0) {
    return;
  }
  // Thread 0, after the timed loop: every thread's checks are counted.
  const double calls = server_stat("evalsha", "calls");
  const double usec = server_stat("evalsha", "usec");
  const auto checks = static_cast<double>(checks_done.load());
  if (calls > 0 && usec >= 0 && checks > 0) {
    state.counters["server_us_per_call"] = usec / calls;
    state.counters["checks_per_call"] = checks / calls;
    state.counters["server_us_per_check"] = usec / checks;
  }
}

void BM_SluiceCheckCoalesced(benchmark::State& state) {
  single_key_checks(state, *fixture->client, false);
}
void BM_SluiceCheckUncoalesced(benchmark::State& state) {
  single_key_checks(state, *fixture->uncoalesced, false);
}
void BM_SluiceCheckCoalescedSharedKeys(benchmark::State& state) {
  single_key_checks(state, *fixture->client, true);
}
void BM_SluiceCheckUncoalescedSharedKeys(benchmark::State& state) {
  single_key_checks(state, *fixture->uncoalesced, true);
}

void BM_FloatGcraReference(benchmark::State& state) {
  reset_stats(state);
  std::vector<std::string> keys;
  keys.reserve(kKeysPerThread);
  for (int i = 0; i < kKeysPerThread; ++i) {
    keys.push_back("ref:" + thread_key(state, i));
  }
  int i = 0;
  for (auto _ : state) {
    const sr::detail::Command c =
        command({"EVALSHA", fixture->float_sha, "1", keys[i++ % kKeysPerThread], "1000000000",
                 "1000", "1", "1"});
    run(state, std::span(&c, 1));
  }
  state.SetItemsProcessed(state.iterations());
  report_server_cost(state, "evalsha");
}

void BM_FloorScript(benchmark::State& state) {
  reset_stats(state);
  std::vector<std::string> keys;
  keys.reserve(kKeysPerThread);
  for (int i = 0; i < kKeysPerThread; ++i) {
    keys.push_back("floor:" + thread_key(state, i));
  }
  int i = 0;
  for (auto _ : state) {
    const sr::detail::Command c =
        command({"EVALSHA", fixture->floor_sha, "1", keys[i++ % kKeysPerThread]});
    run(state, std::span(&c, 1));
  }
  state.SetItemsProcessed(state.iterations());
  report_server_cost(state, "evalsha");
}

void BM_PlainGet(benchmark::State& state) {
  reset_stats(state);
  const sr::detail::Command c = command({"GET", "bench:get"});
  for (auto _ : state) {
    run(state, std::span(&c, 1));
  }
  state.SetItemsProcessed(state.iterations());
  report_server_cost(state, "get");
}

// --- pipelined: kPipelineDepth requests per write ----------------------------------------------

void BM_SluiceCheckPipelined(benchmark::State& state) {
  reset_stats(state);
  std::vector<std::string> keys;
  keys.reserve(kKeysPerThread);
  for (int i = 0; i < kKeysPerThread; ++i) {
    keys.push_back(thread_key(state, i));
  }
  std::vector<sr::CheckItem> items(kPipelineDepth);
  int i = 0;
  for (auto _ : state) {
    for (auto& item : items) {
      item = {.key = keys[i++ % kKeysPerThread], .limit = &*fixture->limit};
    }
    auto results = fixture->client->check_pipelined(items);
    if (!results[0].ok()) {
      state.SkipWithError(results[0].status().ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * kPipelineDepth);
  report_server_cost(state, "evalsha");
}

void BM_PlainGetPipelined(benchmark::State& state) {
  reset_stats(state);
  const std::vector<sr::detail::Command> commands(kPipelineDepth, command({"GET", "bench:get"}));
  for (auto _ : state) {
    run(state, commands);
  }
  state.SetItemsProcessed(state.iterations() * kPipelineDepth);
  report_server_cost(state, "get");
}

void BM_FloatGcraReferencePipelined(benchmark::State& state) {
  reset_stats(state);
  std::vector<std::string> keys;
  keys.reserve(kKeysPerThread);
  for (int i = 0; i < kKeysPerThread; ++i) {
    keys.push_back("ref:" + thread_key(state, i));
  }
  std::vector<sr::detail::Command> commands(kPipelineDepth);
  int i = 0;
  for (auto _ : state) {
    for (auto& c : commands) {
      c = command({"EVALSHA", fixture->float_sha, "1", keys[i++ % kKeysPerThread], "1000000000",
                   "1000", "1", "1"});
    }
    run(state, commands);
  }
  state.SetItemsProcessed(state.iterations() * kPipelineDepth);
  report_server_cost(state, "evalsha");
}

// --- the two-rule example (per IP and per route, one round trip), with never-full buckets ------

void BM_SluiceTwoRulesOneRoundTrip(benchmark::State& state) {
  static const sr::Limit per_ip =
      *sr::Limit::create({{.requests = 1000, .period = std::chrono::seconds(1), .burst = kBurst}});
  static const sr::Limit per_route = *sr::Limit::create(
      {{.requests = 60'000, .period = std::chrono::seconds(60), .burst = kBurst}});
  reset_stats(state);
  std::vector<std::string> ips;
  ips.reserve(kKeysPerThread);
  for (int i = 0; i < kKeysPerThread; ++i) {
    ips.push_back("ip:" + thread_key(state, i));
  }
  const std::string route = "route:/login";
  int i = 0;
  for (auto _ : state) {
    const sr::CheckItem items[] = {{.key = ips[i++ % kKeysPerThread], .limit = &per_ip},
                                   {.key = route, .limit = &per_route}};
    auto d = fixture->client->check_all(items);
    if (!d.ok()) {
      state.SkipWithError(d.status().ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  report_server_cost(state, "evalsha");
}

// --- the documented example through the engine: one evaluate = one round trip -----------------
// public-api-limits on route `public` (per-ip {10/s, 600/min} burst 20, per-route-flood
// {2000/min}), each thread cycling over kExampleIps client IPs so that every IP is revisited
// while its state is live yet stays under 10/s: the admitted, writing path. Beside it, the same
// two rules as two RedisGcraLimiter::check calls (two round trips, not atomic together).

constexpr int kExampleIps = 4096;

sluice::PolicyConfig documented_example() {
  return {
      .policies = {{.name = "public-api-limits",
                    .rate_limits = {{.name = "per-ip",
                                     .selector = {sluice::Selector::kIp},
                                     .requests_per = {.s = 10, .minute = 600},
                                     .burst = 20},
                                    {.name = "per-route-flood",
                                     .selector = {sluice::Selector::kIp, sluice::Selector::kRoute},
                                     .requests_per = {.minute = 2000}}}}},
      .routes = {{.name = "public", .path_prefix = "/v1", .policies = {"public-api-limits"}}}};
}

std::vector<std::string> example_ips(const benchmark::State& state) {
  std::vector<std::string> ips;
  ips.reserve(kExampleIps);
  for (int i = 0; i < kExampleIps; ++i) {
    ips.push_back("10." + std::to_string(state.thread_index()) + "." + std::to_string(i / 256) +
                  "." + std::to_string(i % 256));
  }
  return ips;
}

void BM_EngineDocumentedExample(benchmark::State& state) {
  static const sr::RedisRateLimitEngine engine = [] {
    auto e = sr::RedisRateLimitEngine::create(documented_example(), {.client = fixture->client});
    if (!e.ok()) fail(e.status().ToString());
    return *std::move(e);
  }();
  reset_stats(state);
  const std::vector<std::string> ips = example_ips(state);
  std::int64_t denied = 0;
  int i = 0;
  for (auto _ : state) {
    const sluice::Evaluation e = engine.evaluate({.client_ip = ips[i++ % kExampleIps],
                                                  .route = "public",
                                                  .path = "/v1/items",
                                                  .wall_time = sluice::WallTime{}});
    if (!e.backend_error.ok()) {
      state.SkipWithError(e.backend_error.ToString().c_str());
      break;
    }
    denied += e.allowed ? 0 : 1;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["denied"] = static_cast<double>(denied);
  report_server_cost(state, "evalsha");
}

void BM_TwoLimitersDocumentedExample(benchmark::State& state) {
  static sr::RedisGcraLimiter per_ip = [] {
    auto l = sr::RedisGcraLimiter::create(
        {{.requests = 10, .period = std::chrono::seconds(1), .burst = 20},
         {.requests = 600, .period = std::chrono::minutes(1)}},
        fixture->client);
    if (!l.ok()) fail(l.status().ToString());
    return *std::move(l);
  }();
  static sr::RedisGcraLimiter per_route_flood = [] {
    auto l = sr::RedisGcraLimiter::create({{.requests = 2000, .period = std::chrono::minutes(1)}},
                                          fixture->client);
    if (!l.ok()) fail(l.status().ToString());
    return *std::move(l);
  }();
  reset_stats(state);
  const std::vector<std::string> ips = example_ips(state);
  std::vector<std::string> ip_routes;
  for (const std::string& ip : ips) ip_routes.push_back(ip + "|public");
  std::int64_t denied = 0;
  int i = 0;
  for (auto _ : state) {
    const int k = i++ % kExampleIps;
    absl::StatusOr<sluice::Decision> a = per_ip.check(ips[k]);
    absl::StatusOr<sluice::Decision> b = per_route_flood.check(ip_routes[k]);
    if (!a.ok() || !b.ok()) {
      state.SkipWithError((a.ok() ? b.status() : a.status()).ToString().c_str());
      break;
    }
    denied += a->allowed() && b->allowed() ? 0 : 1;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["denied"] = static_cast<double>(denied);
  report_server_cost(state, "evalsha");
}

BENCHMARK(BM_EngineDocumentedExample)->Threads(1)->Threads(8)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_TwoLimitersDocumentedExample)->Threads(1)->Threads(8)->UseRealTime()->MinTime(2.0);

// --- server-side cost, robust to a busy machine ------------------------------------------------
// One iteration = reset stats, 200 calls from one thread, read usec_per_call. A sample in which
// redis-server was preempted is inflated; the minimum over all samples is the script's own cost.

template <class Call>
void server_cost(benchmark::State& state, std::string_view cmdstat, Call call) {
  std::vector<double> samples;
  int i = 0;
  for (auto _ : state) {
    fixture->server.command({"CONFIG", "RESETSTAT"});
    for (int k = 0; k < 200; ++k) {
      call(state, i++);
    }
    samples.push_back(server_usec_per_call(cmdstat));
  }
  std::sort(samples.begin(), samples.end());
  if (samples.empty()) {
    return;
  }
  state.counters["min_server_us"] = samples.front();
  state.counters["median_server_us"] = samples[samples.size() / 2];
}

void BM_ServerCostSluice(benchmark::State& state) {
  server_cost(state, "evalsha", [](benchmark::State& st, int i) {
    const std::string key = "cost:" + std::to_string(i % kKeysPerThread);
    const sr::CheckItem item{.key = key, .limit = &*fixture->limit};
    auto d = fixture->client->check_all(std::span(&item, 1));
    if (!d.ok() || !(*d)[0].allowed()) {
      st.SkipWithError("check failed");
    }
  });
}
void BM_ServerCostFloatReference(benchmark::State& state) {
  server_cost(state, "evalsha", [](benchmark::State& st, int i) {
    const std::string key = "cost:ref:" + std::to_string(i % kKeysPerThread);
    const sr::detail::Command c =
        command({"EVALSHA", fixture->float_sha, "1", key, "1000000000", "1000", "1", "1"});
    run(st, std::span(&c, 1));
  });
}
void BM_ServerCostFloor(benchmark::State& state) {
  server_cost(state, "evalsha", [](benchmark::State& st, int i) {
    const std::string key = "cost:floor:" + std::to_string(i % kKeysPerThread);
    const sr::detail::Command c = command({"EVALSHA", fixture->floor_sha, "1", key});
    run(st, std::span(&c, 1));
  });
}
BENCHMARK(BM_ServerCostSluice)->MinTime(3.0)->UseRealTime();
BENCHMARK(BM_ServerCostFloatReference)->MinTime(3.0)->UseRealTime();
BENCHMARK(BM_ServerCostFloor)->MinTime(3.0)->UseRealTime();

// What the coalescer adds to one lone check, with no server: its path around a `send` that
// answers at once. A lone caller's every check takes this path (beside BM_SluiceCheck*, whose
// round trip is ~40 µs).
void BM_CoalescerLoneCheck(benchmark::State& state) {
  sr::detail::Coalescer coalescer(64, 2);
  const sr::CheckItem item{.key = "bench:lone", .limit = &*fixture->limit};
  const auto send = [](std::span<const sr::CheckItem> items,
                       std::optional<std::chrono::nanoseconds> /*at*/,
                       sr::detail::Coalescer::Deadline /*by*/,
                       std::span<absl::StatusOr<sluice::Decision>> results) {
    for (std::size_t i = 0; i < items.size(); ++i) results[i] = sluice::Decision{};
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  for (auto _ : state) {
    absl::StatusOr<sluice::Decision> d = coalescer.check(item, std::nullopt, deadline, send);
    benchmark::DoNotOptimize(d);
  }
}
BENCHMARK(BM_CoalescerLoneCheck);

void concurrency(benchmark::internal::Benchmark* b) {
  b->Threads(1)->Threads(8)->Threads(32)->UseRealTime()->MinTime(2.0);
}
BENCHMARK(BM_SluiceCheck)->Apply(concurrency);
BENCHMARK(BM_SluiceCheckCoalesced)->Apply(concurrency);
BENCHMARK(BM_SluiceCheckUncoalesced)->Apply(concurrency);
BENCHMARK(BM_SluiceCheckCoalescedSharedKeys)->Threads(32)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_SluiceCheckUncoalescedSharedKeys)->Threads(32)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_PlainGet)->Apply(concurrency);
BENCHMARK(BM_FloatGcraReference)->Apply(concurrency);
BENCHMARK(BM_FloorScript)->Apply(concurrency);
BENCHMARK(BM_SluiceCheckPipelined)->Threads(1)->Threads(8)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_PlainGetPipelined)->Threads(1)->Threads(8)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_FloatGcraReferencePipelined)->Threads(1)->Threads(8)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_SluiceTwoRulesOneRoundTrip)->Threads(1)->Threads(8)->UseRealTime()->MinTime(2.0);

std::string load_script(std::string_view body) {
  sluice_test::Reply sha = fixture->server.command({"SCRIPT", "LOAD", body});
  if (!sha || sha->type != REDIS_REPLY_STRING) {
    fail("SCRIPT LOAD failed");
  }
  return std::string(sha->str, sha->len);
}

}  // namespace

// --server-cost: the server's whole CPU per check (INFO cpu: network, parsing and script) with
// one caller and one call at a time, so that nothing but the call's size differs: the reference's
// EVALSHA per check beside coalesced calls of k own keys (k = 1 ... 32, the "each" script that
// concurrent single-key checks share). Subjects alternate within each of `rounds` rounds; the
// medians say what a call costs the server and what each key adds to it.
int server_cost_by_batch(int rounds) {
  constexpr int kChecks = 20'000;
  const std::vector<std::size_t> sizes = {1, 2, 4, 8, 16, 32};
  std::map<std::size_t, std::vector<double>> per_check;  // 0: the reference
  std::vector<std::string> keys;
  for (int i = 0; i < 32; ++i) keys.push_back("cost:batch:" + std::to_string(i));
  auto measure = [&](std::size_t k) {
    const double cpu0 = interleaved::server_cpu_s(fixture->server);
    if (k == 0) {
      const interleaved::Env env{.server = &fixture->server,
                                 .pool = fixture->pool,
                                 .limit = &*fixture->limit,
                                 .reference_sha = fixture->float_sha};
      for (int i = 0; i < kChecks; ++i) {
        if (!interleaved::check_once(env, {.name = "reference", .client = nullptr}, keys[i % 32]))
          fail("reference");
      }
    } else {
      std::vector<sr::CheckItem> items;
      for (std::size_t i = 0; i < k; ++i)
        items.push_back({.key = keys[i], .limit = &*fixture->limit});
      for (int done = 0; done < kChecks; done += static_cast<int>(k)) {
        for (const auto& d : fixture->client->check_coalesced_for_testing(items)) {
          if (!d.ok() || !d->allowed()) fail("coalesced call");
        }
      }
    }
    per_check[k].push_back((interleaved::server_cpu_s(fixture->server) - cpu0) * 1e6 / kChecks);
  };
  for (int round = 0; round < rounds; ++round) {
    measure(0);
    for (std::size_t k : sizes) measure(k);
  }
  std::printf(
      "| call | server CPU µs per check (median of %d) | ÷ reference |\n| --- | ---: | ---: |\n",
      rounds);
  const double reference = interleaved::median(per_check[0]);
  std::printf("| reference, 1 check per call | %.2f | 1.00 |\n", reference);
  for (std::size_t k : sizes) {
    const double x = interleaved::median(per_check[k]);
    std::printf("| coalesced, %zu checks per call | %.2f | %.2f |\n", k, x, x / reference);
  }
  return 0;
}

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  auto owned = std::make_unique<Fixture>();
  fixture = owned.get();
  if (std::string error = fixture->server.start(); !error.empty()) {
    fail(error);
  }

  sr::ClientOptions options;
  options.connection = connection_options();
  auto client = sr::Client::create(options);
  if (!client.ok()) {
    fail(client.status().ToString());
  }
  fixture->client = *client;
  options.coalesce = false;
  auto uncoalesced = sr::Client::create(options);
  if (!uncoalesced.ok()) {
    fail(uncoalesced.status().ToString());
  }
  fixture->uncoalesced = *uncoalesced;
  fixture->pool = &fixture->client->pool_for_testing();
  // Never denies: every check reserves and writes, the expensive path.
  auto limit =
      sr::Limit::create({{.requests = 1000, .period = std::chrono::seconds(1), .burst = kBurst}});
  if (!limit.ok()) {
    fail(limit.status().ToString());
  }
  fixture->limit = *limit;
  fixture->float_sha = load_script(kFloatGcraScript);
  fixture->floor_sha = load_script(kFloorScript);
  fixture->server.command({"SET", "bench:get", std::string(48, 'x')});

  if (argc > 1 && std::string_view(argv[1]).starts_with("--server-cost")) {
    const std::string_view arg(argv[1]);
    const int rounds = arg.size() > 14 ? std::atoi(argv[1] + 14) : 5;  // --server-cost=N
    const int code = server_cost_by_batch(rounds);
    fixture = nullptr;
    return code;
  }
  if (argc > 1 && std::string_view(argv[1]) == "--interleaved") {
    sr::ClientOptions base;
    base.connection = connection_options();
    const int code = interleaved::run(argc, argv,
                                      {.server = &fixture->server,
                                       .pool = fixture->pool,
                                       .limit = &*fixture->limit,
                                       .reference_sha = fixture->float_sha},
                                      base);
    fixture = nullptr;
    return code;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  fixture = nullptr;
  return 0;
}
