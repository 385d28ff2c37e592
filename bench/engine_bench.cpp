// RateLimitEngine::evaluate beside the bare limiter calls a hand-written gateway would make for
// the same keys, in one binary. Both use TickClock (see bench_support.hpp); 1000 client ips take
// turns, each arriving every 100 ms of tick time, so the working set is in cache and most
// requests are admitted (the example allows 10/s per ip). The engine gets each client's address
// already parsed (`RequestContext::client`), as the adapters pass it; the bare calls get the
// address text already formatted. The `TextAddress` row parses the text per request instead.
// The `RuntimeEngine` rows run the same engine with its backend chosen at run time.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "example_config.hpp"
#include "sluice/engine.hpp"
#include "sluice/gcra.hpp"
#include "sluice/runtime_engine.hpp"

namespace {

using namespace std::chrono_literals;
using Engine = sluice::BasicRateLimitEngine<sluice::InMemoryBackend<bench::TickClock>>;
using Gcra = sluice::GcraLimiter<bench::TickClock>;
// The engine whose backend is chosen at run time (sluice/runtime_engine.hpp), with every backend
// this build has, on the tick clock: the same in-memory backend behind one branch.
using RuntimeEngine = sluice::BasicRateLimitEngine<
    sluice::RuntimeBackendOf<sluice::InMemoryBackend<bench::TickClock>>>;
using sluice::Selector;
using sluice::testing::documented_example;
using sluice::testing::rule;

constexpr int kClients = 1000;
constexpr std::int64_t kStep = 100'000;  // 100 µs of tick time per request
const sluice::WallTime kWall{std::chrono::seconds(1'700'000'000)};

std::vector<std::string>& client_ips() {
  static std::vector<std::string> ips = [] {
    std::vector<std::string> out;
    for (int i = 0; i < kClients; ++i) {
      out.push_back("10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256));
    }
    return out;
  }();
  return ips;
}

// The same clients' addresses, parsed once (as an adapter's resolver hands them over).
std::vector<sluice::ClientAddress>& client_addresses() {
  static std::vector<sluice::ClientAddress> addresses = [] {
    std::vector<sluice::ClientAddress> out;
    for (const std::string& ip : client_ips()) out.push_back(sluice::ClientAddress::parse(ip));
    return out;
  }();
  return addresses;
}

Engine must(absl::StatusOr<Engine> engine) {
  if (!engine.ok()) std::abort();
  return *std::move(engine);
}
RuntimeEngine must(absl::StatusOr<RuntimeEngine> engine) {
  if (!engine.ok()) std::abort();
  return *std::move(engine);
}
RuntimeEngine::BackendOptions in_memory() {
  RuntimeEngine::BackendOptions options;
  options.backend = sluice::InMemoryBackend<bench::TickClock>::Options{.store = {.seed = 1}};
  return options;
}
Gcra must(absl::StatusOr<Gcra> limiter) {
  if (!limiter.ok()) std::abort();
  return *std::move(limiter);
}

template <class MakeRequest>
void run_engine(benchmark::State& state, const Engine& engine, MakeRequest make) {
  const auto& ips = client_ips();
  const auto& addresses = client_addresses();
  std::size_t i = 0;
  std::uint64_t denied = 0;
  for (auto _ : state) {
    bench::tick += kStep;
    sluice::Evaluation e = engine.evaluate(make(ips[i], addresses[i]));
    denied += !e.allowed;
    benchmark::DoNotOptimize(e);
    if (++i == ips.size()) i = 0;
  }
  state.counters["denied_fraction"] =
      static_cast<double>(denied) / static_cast<double>(state.iterations());
}

// The same loop evaluating into one reused Evaluation: the form that allocates nothing.
template <class AnyEngine, class MakeRequest>
void run_engine_reused(benchmark::State& state, const AnyEngine& engine, MakeRequest make) {
  const auto& ips = client_ips();
  const auto& addresses = client_addresses();
  std::size_t i = 0;
  std::uint64_t denied = 0;
  sluice::Evaluation e;
  for (auto _ : state) {
    bench::tick += kStep;
    engine.evaluate(make(ips[i], addresses[i]), e);
    denied += !e.allowed;
    benchmark::DoNotOptimize(e);
    if (++i == ips.size()) i = 0;
  }
  state.counters["denied_fraction"] =
      static_cast<double>(denied) / static_cast<double>(state.iterations());
}

// --- one rule
// -------------------------------------------------------------------------------------

void BM_Engine_OneRule(benchmark::State& state) {
  static Engine engine = must(Engine::create(
      {.policies = {{.name = "g", .rate_limits = {rule("per-ip", {Selector::kIp}, {.s = 10}, 20)}}},
       .gateway = {.global_policies = {"g"}}},
      {.store = {.seed = 1}}));
  run_engine(state, engine, [](const std::string&, const sluice::ClientAddress& client) {
    return sluice::RequestContext{.client = client, .path = "/v1/items", .wall_time = kWall};
  });
}
BENCHMARK(BM_Engine_OneRule);

void BM_BareLimiter_OneRule(benchmark::State& state) {
  static Gcra limiter =
      must(Gcra::create({{.requests = 10, .period = 1s, .burst = 20}}, {.seed = 1}));
  const auto& ips = client_ips();
  std::size_t i = 0;
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(limiter.check(ips[i]));
    if (++i == ips.size()) i = 0;
  }
}
BENCHMARK(BM_BareLimiter_OneRule);

// --- the documented example: 2 rules, 3 windows ------------------------------------------------

sluice::RequestContext documented_request(const sluice::ClientAddress& client) {
  return sluice::RequestContext{
      .client = client, .route = "public", .path = "/v1/items", .wall_time = kWall};
}

void BM_Engine_DocumentedExample(benchmark::State& state) {
  static Engine engine = must(Engine::create(documented_example(), {.store = {.seed = 1}}));
  run_engine(state, engine, [](const std::string&, const sluice::ClientAddress& client) {
    return documented_request(client);
  });
}
BENCHMARK(BM_Engine_DocumentedExample);

// Into one reused Evaluation, every field value written: allocation-free.
void BM_Engine_DocumentedExample_ReusedEvaluation(benchmark::State& state) {
  static Engine engine = must(Engine::create(documented_example(), {.store = {.seed = 1}}));
  run_engine_reused(state, engine, [](const std::string&, const sluice::ClientAddress& client) {
    return documented_request(client);
  });
}
BENCHMARK(BM_Engine_DocumentedExample_ReusedEvaluation);

// The same without fields (`write_fields = false`): the decision only.
void BM_Engine_DocumentedExample_NoFields(benchmark::State& state) {
  static Engine engine = must(Engine::create(documented_example(), {.store = {.seed = 1}}));
  run_engine_reused(state, engine, [](const std::string&, const sluice::ClientAddress& client) {
    sluice::RequestContext request = documented_request(client);
    request.write_fields = false;
    return request;
  });
}
BENCHMARK(BM_Engine_DocumentedExample_NoFields);

// The two rows above with one RequestContext the caller keeps and gives each request's client
// address, as the bare calls keep their key strings: the engine's cost without the caller's
// building of a request. (GCC 12 builds `RequestContext{.client = …, .wall_time = …}` by clearing
// 176 bytes with `rep stos` first, 4-5 ns on the hosts measured; the rows above include that.)
void run_engine_one_request(benchmark::State& state, const Engine& engine,
                            sluice::RequestContext request) {
  run_engine_reused(
      state, engine,
      [&request](const std::string&,
                 const sluice::ClientAddress& client) -> const sluice::RequestContext& {
        request.client = client;
        return request;
      });
}

void BM_Engine_DocumentedExample_OneRequest(benchmark::State& state) {
  static Engine engine = must(Engine::create(documented_example(), {.store = {.seed = 1}}));
  run_engine_one_request(state, engine, documented_request(client_addresses()[0]));
}
BENCHMARK(BM_Engine_DocumentedExample_OneRequest);

void BM_Engine_DocumentedExample_OneRequest_NoFields(benchmark::State& state) {
  static Engine engine = must(Engine::create(documented_example(), {.store = {.seed = 1}}));
  sluice::RequestContext request = documented_request(client_addresses()[0]);
  request.write_fields = false;
  run_engine_one_request(state, engine, request);
}
BENCHMARK(BM_Engine_DocumentedExample_OneRequest_NoFields);

// A request admitted on an estimate (2 units) and settled at 3 or 1 (a charge, a refund), into
// one reused Evaluation and Settlement; beside it, the same requests without a settlement.
void BM_Engine_DocumentedExample_EstimateThenSettle(benchmark::State& state) {
  static Engine engine = must(Engine::create(documented_example(), {.store = {.seed = 1}}));
  const auto& addresses = client_addresses();
  std::size_t i = 0;
  std::uint64_t settled = 0;
  sluice::Evaluation e;
  Engine::Settlement settlement;
  sluice::RequestContext request = documented_request(addresses[0]);
  request.cost = 2;
  for (auto _ : state) {
    bench::tick += kStep;
    request.client = addresses[i];
    engine.evaluate(request, e, settlement);
    if (settlement.open()) {
      benchmark::DoNotOptimize(engine.settle(settlement, (i & 1) != 0 ? 3 : 1));
      ++settled;
    }
    if (++i == addresses.size()) i = 0;
  }
  state.counters["settled_fraction"] =
      static_cast<double>(settled) / static_cast<double>(state.iterations());
}
BENCHMARK(BM_Engine_DocumentedExample_EstimateThenSettle);

void BM_Engine_DocumentedExample_Estimate(benchmark::State& state) {
  static Engine engine = must(Engine::create(documented_example(), {.store = {.seed = 1}}));
  sluice::RequestContext request = documented_request(client_addresses()[0]);
  request.cost = 2;
  run_engine_one_request(state, engine, request);
}
BENCHMARK(BM_Engine_DocumentedExample_Estimate);

// The two rows above with the backend chosen at run time (in memory): the cost of the choice.
void BM_RuntimeEngine_DocumentedExample_ReusedEvaluation(benchmark::State& state) {
  static RuntimeEngine engine = must(RuntimeEngine::create(documented_example(), in_memory()));
  run_engine_reused(state, engine, [](const std::string&, const sluice::ClientAddress& client) {
    return documented_request(client);
  });
}
BENCHMARK(BM_RuntimeEngine_DocumentedExample_ReusedEvaluation);

void BM_RuntimeEngine_DocumentedExample_NoFields(benchmark::State& state) {
  static RuntimeEngine engine = must(RuntimeEngine::create(documented_example(), in_memory()));
  run_engine_reused(state, engine, [](const std::string&, const sluice::ClientAddress& client) {
    sluice::RequestContext request = documented_request(client);
    request.write_fields = false;
    return request;
  });
}
BENCHMARK(BM_RuntimeEngine_DocumentedExample_NoFields);

// Reused, with fields, the address given as text: parsed on every request.
void BM_Engine_DocumentedExample_TextAddress(benchmark::State& state) {
  static Engine engine = must(Engine::create(documented_example(), {.store = {.seed = 1}}));
  run_engine_reused(state, engine, [](const std::string& ip, const sluice::ClientAddress&) {
    return sluice::RequestContext{
        .client_ip = ip, .route = "public", .path = "/v1/items", .wall_time = kWall};
  });
}
BENCHMARK(BM_Engine_DocumentedExample_TextAddress);

// The same two limiters called directly: per-ip keyed by the ip, per-route-flood by ip + route,
// denial of the first skipping the second (a hand-written gateway's shortcut).
void BM_BareLimiters_DocumentedExample(benchmark::State& state) {
  static Gcra per_ip = must(
      Gcra::create({{.requests = 10, .period = 1s, .burst = 20}, {.requests = 600, .period = 1min}},
                   {.seed = 1}));
  static Gcra flood = must(Gcra::create({{.requests = 2000, .period = 1min}}, {.seed = 1}));
  const auto& ips = client_ips();
  std::string key;
  std::size_t i = 0;
  for (auto _ : state) {
    bench::tick += kStep;
    auto a = per_ip.check(ips[i]);
    key.assign(ips[i]).append("|public");
    if (a->allowed()) benchmark::DoNotOptimize(flood.check(key));
    benchmark::DoNotOptimize(a);
    if (++i == ips.size()) i = 0;
  }
}
BENCHMARK(BM_BareLimiters_DocumentedExample);

// --- five rules across all scopes --------------------------------------------------------------

void BM_Engine_FiveRulesAllScopes(benchmark::State& state) {
  static Engine engine = must(Engine::create(
      {.policies =
           {{.name = "consumer", .rate_limits = {rule("c", {Selector::kCredential}, {.s = 100})}},
            {.name = "route",
             .rate_limits = {rule("r", {Selector::kIp, Selector::kRoute}, {.s = 20})}},
            {.name = "service", .rate_limits = {rule("s", {Selector::kIp}, {.minute = 6000})}},
            {.name = "listener", .rate_limits = {rule("l", {Selector::kIp}, {.hour = 360000})}},
            {.name = "global", .rate_limits = {rule("g", {Selector::kRoute}, {.s = 100000})}}},
       .routes = {{.name = "api", .service = "svc", .policies = {"route"}}},
       .services = {{.name = "svc", .policies = {"service"}}},
       .listeners = {{.name = "public", .policies = {"listener"}}},
       .consumers = {{.name = "acme", .credentials = {"tok"}, .policies = {"consumer"}}},
       .gateway = {.global_policies = {"global"}}},
      {.store = {.seed = 1}}));
  run_engine(state, engine, [](const std::string& ip, const sluice::ClientAddress& client) {
    return sluice::RequestContext{.client = client,
                                  .credential = ip,
                                  .consumer = "acme",
                                  .route = "api",
                                  .service = "svc",
                                  .listener = "public",
                                  .path = "/v1/items",
                                  .wall_time = kWall};
  });
}
BENCHMARK(BM_Engine_FiveRulesAllScopes);

void BM_BareLimiters_FiveRules(benchmark::State& state) {
  static std::vector<Gcra> limiters = [] {
    std::vector<Gcra> out;
    out.push_back(must(Gcra::create({{.requests = 100, .period = 1s}}, {.seed = 1})));
    out.push_back(must(Gcra::create({{.requests = 20, .period = 1s}}, {.seed = 1})));
    out.push_back(must(Gcra::create({{.requests = 6000, .period = 1min}}, {.seed = 1})));
    out.push_back(must(Gcra::create({{.requests = 360000, .period = 1h}}, {.seed = 1})));
    out.push_back(must(Gcra::create({{.requests = 100000, .period = 1s}}, {.seed = 1})));
    return out;
  }();
  const auto& ips = client_ips();
  std::string key;
  std::size_t i = 0;
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(limiters[0].check(ips[i]));
    key.assign(ips[i]).append("|api");
    benchmark::DoNotOptimize(limiters[1].check(key));
    benchmark::DoNotOptimize(limiters[2].check(ips[i]));
    benchmark::DoNotOptimize(limiters[3].check(ips[i]));
    benchmark::DoNotOptimize(limiters[4].check("api"));
    if (++i == ips.size()) i = 0;
  }
}
BENCHMARK(BM_BareLimiters_FiveRules);

}  // namespace

BENCHMARK_MAIN();
