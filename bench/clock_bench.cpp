// The cost of reading each clock: a limiter reads its clock once per check.
#include <benchmark/benchmark.h>

#include <chrono>

#include "sluice/clock.hpp"

static void BM_SteadyClockNow(benchmark::State& state) {
  sluice::SteadyClock clock;
  for (auto _ : state) benchmark::DoNotOptimize(clock.now());
}
BENCHMARK(BM_SteadyClockNow);

static void BM_ManualClockNow(benchmark::State& state) {
  sluice::ManualClock clock;
  for (auto _ : state) benchmark::DoNotOptimize(clock.now());
}
BENCHMARK(BM_ManualClockNow);

// Baseline: the raw std::chrono call.
static void BM_StdSteadyClockNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_StdSteadyClockNow);

BENCHMARK_MAIN();
