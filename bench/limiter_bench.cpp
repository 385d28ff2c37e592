// The limiters against the S14 references and a naive floating-point token bucket, in one binary.
// Gcra_*/FixedWindow_* use TickClock (a plain integer, the limiter's own cost) unless the name
// says SteadyClock (what a service pays end to end on this VM: ~26 ns per clock read).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <memory>

#include "bench_support.hpp"
#include "sluice/fixed_window.hpp"
#include "sluice/gcra.hpp"

namespace {

using namespace std::chrono_literals;
constexpr std::uint64_t kKeys = 1'000'000;
constexpr std::int64_t kStep = 1'000;  // ns between checks of one thread: 1 µs

template <class Limiter>
Limiter must(absl::StatusOr<Limiter> limiter) {
  if (!limiter.ok()) std::abort();
  return *std::move(limiter);
}

using Gcra = sluice::GcraLimiter<bench::TickClock>;
using Fixed = sluice::FixedWindowLimiter<bench::TickClock>;

// One window admits every check at 1 µs steps (10^6 per second); three stacked windows likewise.
Gcra& one_window() {
  static Gcra limiter = must(Gcra::create({{.requests = 1'000'000, .period = 1s}}, {.seed = 1}));
  return limiter;
}
Gcra& three_windows() {
  static Gcra limiter = must(Gcra::create({{.requests = 1'000'000, .period = 1s},
                                           {.requests = 60'000'000, .period = 1min},
                                           {.requests = 3'600'000'000, .period = 1h}},
                                          {.seed = 1}));
  return limiter;
}

struct Populated {
  Gcra gcra = must(Gcra::create({{.requests = 1'000'000, .period = 1s}}, {.seed = 1}));
  bench::MutexUnorderedMapLimiter unordered{kStep, 1'000'000'000};
  bench::FloatTokenBucketLimiter floating{1e-3, 1e6};
  std::unique_ptr<bench::PointerChase> chase;
  Populated() {
    bench::KeyMaker key;
    for (std::uint64_t i = 0; i < kKeys; ++i) {
      (void)gcra.check(key(i));
      unordered.check(key(i), 0);
      floating.check(key(i), 0);
    }
    chase = std::make_unique<bench::PointerChase>(gcra.memory_bytes());
  }
  static Populated& get() {
    static Populated instance;
    return instance;
  }
};

// --- hot key ----------------------------------------------------------------------------------

void BM_Gcra_OneWindow_HotKey(benchmark::State& state) {
  Gcra& limiter = one_window();
  bench::KeyMaker key;
  std::string_view k = key(42);  // every thread on the same key
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(limiter.check(k));
  }
}
BENCHMARK(BM_Gcra_OneWindow_HotKey)->Threads(1)->Threads(2)->UseRealTime();

void BM_Gcra_OneWindow_HotKey_SteadyClock(benchmark::State& state) {
  static auto limiter =
      must(sluice::GcraLimiter<>::create({{.requests = 1'000'000'000, .period = 1s}}, {.seed = 1}));
  bench::KeyMaker key;
  std::string_view k = key(42);
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(k));
}
BENCHMARK(BM_Gcra_OneWindow_HotKey_SteadyClock)->UseRealTime();

void BM_Gcra_ThreeWindows_HotKey(benchmark::State& state) {
  Gcra& limiter = three_windows();
  bench::KeyMaker key;
  std::string_view k = key(42);
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(limiter.check(k));
  }
}
BENCHMARK(BM_Gcra_ThreeWindows_HotKey)->UseRealTime();

// A frozen clock (the time never moves): every check admits, against buckets of 2^32, so one and
// three stacked windows are compared on the same admitted path without replenishment.
void BM_Gcra_OneWindow_HotKey_FrozenClock(benchmark::State& state) {
  static Gcra limiter =
      must(Gcra::create({{.requests = 1'000'000, .period = 1s, .burst = 1ULL << 32}}, {.seed = 1}));
  bench::KeyMaker key;
  std::string_view k = key(42);
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(k));
}
BENCHMARK(BM_Gcra_OneWindow_HotKey_FrozenClock)->UseRealTime();

void BM_Gcra_ThreeWindows_HotKey_FrozenClock(benchmark::State& state) {
  static Gcra limiter =
      must(Gcra::create({{.requests = 1'000'000, .period = 1s, .burst = 1ULL << 32},
                         {.requests = 60'000'000, .period = 1min, .burst = 1ULL << 32},
                         {.requests = 3'600'000'000, .period = 1h, .burst = 1ULL << 32}},
                        {.seed = 1}));
  bench::KeyMaker key;
  std::string_view k = key(42);
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(k));
}
BENCHMARK(BM_Gcra_ThreeWindows_HotKey_FrozenClock)->UseRealTime();

void BM_FixedWindow_OneWindow_HotKey(benchmark::State& state) {
  static Fixed limiter = must(Fixed::create({{.limit = 1'000'000, .window = 1s}}, {.seed = 1}));
  bench::KeyMaker key;
  std::string_view k = key(42);
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(limiter.check(k));
  }
}
BENCHMARK(BM_FixedWindow_OneWindow_HotKey)->UseRealTime();

void BM_MutexUnorderedMap_HotKey(benchmark::State& state) {
  static bench::MutexUnorderedMapLimiter limiter(kStep, 1'000'000'000);
  bench::KeyMaker key;
  std::int64_t now = 0;
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(key(42), now += kStep));
}
BENCHMARK(BM_MutexUnorderedMap_HotKey)->Threads(1)->Threads(2)->UseRealTime();

void BM_MutexFlatHashMap_HotKey(benchmark::State& state) {
  static bench::MutexFlatHashMapLimiter limiter(kStep, 1'000'000'000);
  bench::KeyMaker key;
  std::int64_t now = 0;
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(key(42), now += kStep));
}
BENCHMARK(BM_MutexFlatHashMap_HotKey)->UseRealTime();

void BM_FloatTokenBucket_HotKey(benchmark::State& state) {
  static bench::FloatTokenBucketLimiter limiter(1e-3, 1e6);
  bench::KeyMaker key;
  std::int64_t now = 0;
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(key(42), now += kStep));
}
BENCHMARK(BM_FloatTokenBucket_HotKey)->UseRealTime();

// --- 2 threads, distinct keys (each thread its own hot key)
// ---------------------------------------

void BM_Gcra_OneWindow_DistinctKeys(benchmark::State& state) {
  Gcra& limiter = one_window();
  bench::KeyMaker key;
  std::string_view k = key(1000 + static_cast<std::uint64_t>(state.thread_index()));
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(limiter.check(k));
  }
}
BENCHMARK(BM_Gcra_OneWindow_DistinctKeys)->Threads(2)->UseRealTime();

void BM_MutexUnorderedMap_DistinctKeys(benchmark::State& state) {
  static bench::MutexUnorderedMapLimiter limiter(kStep, 1'000'000'000);
  bench::KeyMaker key;
  std::string_view k = key(1000 + static_cast<std::uint64_t>(state.thread_index()));
  std::int64_t now = 0;
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(k, now += kStep));
}
BENCHMARK(BM_MutexUnorderedMap_DistinctKeys)->Threads(2)->UseRealTime();

// --- 1M keys, uniform -------------------------------------------------------------------------

void BM_Gcra_Uniform1M(benchmark::State& state) {
  Populated& p = Populated::get();
  bench::KeyMaker key;
  bench::Uniform pick(static_cast<std::uint64_t>(state.thread_index()) + 1);
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(p.gcra.check(key(pick(kKeys))));
  }
  state.counters["evicted"] = static_cast<double>(p.gcra.stats().live_evicted);
}
BENCHMARK(BM_Gcra_Uniform1M)->Threads(1)->Threads(2)->UseRealTime();

void BM_MutexUnorderedMap_Uniform1M(benchmark::State& state) {
  Populated& p = Populated::get();
  bench::KeyMaker key;
  bench::Uniform pick(static_cast<std::uint64_t>(state.thread_index()) + 1);
  std::int64_t now = 0;
  for (auto _ : state) benchmark::DoNotOptimize(p.unordered.check(key(pick(kKeys)), now += kStep));
}
BENCHMARK(BM_MutexUnorderedMap_Uniform1M)->Threads(1)->Threads(2)->UseRealTime();

void BM_FloatTokenBucket_Uniform1M(benchmark::State& state) {
  Populated& p = Populated::get();
  bench::KeyMaker key;
  bench::Uniform pick(1);
  std::int64_t now = 0;
  for (auto _ : state) benchmark::DoNotOptimize(p.floating.check(key(pick(kKeys)), now += kStep));
}
BENCHMARK(BM_FloatTokenBucket_Uniform1M)->UseRealTime();

void BM_PointerChase_StoreTables1M(benchmark::State& state) {
  Populated& p = Populated::get();
  std::uint32_t at = 0;
  for (auto _ : state) {
    at = p.chase->step(at);
    benchmark::DoNotOptimize(at);
  }
}
BENCHMARK(BM_PointerChase_StoreTables1M)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
