// Instructions per evaluate, for callgrind: N evaluations of the documented example by one
// thread on a tick clock (1000 clients in turn, 100 µs apart: all admitted), in one of four
// forms, or the same limiters called bare. Built and run by scripts/engine_instructions, which
// subtracts a run of 0 evaluations (the setup) and divides by N.
//
//   engine_instructions MODE N    MODE: e  reused Evaluation, resolved address, fields written
//                                       n  the same without fields (write_fields = false)
//                                       t  reused Evaluation, address as text, fields written
//                                       b  the bare limiter calls of bench/engine_bench.cpp
//                                       r  e on the engine whose backend is chosen at run time
//                                       m  n on it
#include <cstdio>
#include <cstdlib>
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
// As bench/engine_bench.cpp's RuntimeEngine: every backend the script found, memory chosen.
using RuntimeEngine = sluice::BasicRateLimitEngine<
    sluice::RuntimeBackendOf<sluice::InMemoryBackend<bench::TickClock>>>;

RuntimeEngine runtime_engine() {
  RuntimeEngine::BackendOptions options;
  options.backend = sluice::InMemoryBackend<bench::TickClock>::Options{.store = {.seed = 1}};
  auto engine = RuntimeEngine::create(sluice::testing::documented_example(), options);
  if (!engine.ok()) std::abort();
  return *std::move(engine);
}

struct Run {
  Engine engine;
  RuntimeEngine runtime;
  Gcra per_ip, flood;
  std::vector<std::string> ips;
  std::vector<sluice::ClientAddress> addresses;
};

Run setup() {
  auto engine = Engine::create(sluice::testing::documented_example(), {.store = {.seed = 1}});
  auto per_ip =
      Gcra::create({{.requests = 10, .period = 1s, .burst = 20}, {.requests = 600, .period = 1min}},
                   {.seed = 1});
  auto flood = Gcra::create({{.requests = 2000, .period = 1min}}, {.seed = 1});
  if (!engine.ok() || !per_ip.ok() || !flood.ok()) std::abort();
  Run run{*std::move(engine), runtime_engine(), *std::move(per_ip), *std::move(flood), {}, {}};
  for (int i = 0; i < 1000; ++i) {
    run.ips.push_back("10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256));
    run.addresses.push_back(sluice::ClientAddress::parse(run.ips.back()));
  }
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  const char mode = argc > 1 ? argv[1][0] : 'e';
  const long n = argc > 2 ? std::atol(argv[2]) : 100000;
  Run run = setup();
  const sluice::WallTime wall{std::chrono::seconds(1'700'000'000)};
  sluice::Evaluation e;
  std::string key;
  long denied = 0;
  for (long k = 0; k < n; ++k) {
    bench::tick += 100'000;
    const auto i = static_cast<std::size_t>(k) % run.ips.size();
    if (mode == 'b') {
      auto a = run.per_ip.check(run.ips[i]);
      key.assign(run.ips[i]).append("|public");
      if (a->allowed()) denied += run.flood.check(key)->allowed() ? 0 : 1;
      continue;
    }
    sluice::RequestContext request{.route = "public", .path = "/v1/items", .wall_time = wall};
    if (mode == 't') {
      request.client_ip = run.ips[i];
    } else {
      request.client = run.addresses[i];
    }
    request.write_fields = mode != 'n' && mode != 'm';
    if (mode == 'r' || mode == 'm') {
      run.runtime.evaluate(request, e);
    } else {
      run.engine.evaluate(request, e);
    }
    denied += e.allowed ? 0 : 1;
  }
  std::printf("mode %c: %ld evaluations, %ld denied\n", mode, n, denied);
}
