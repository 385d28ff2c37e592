// ConcurrencyLimiter acquire + release (one permit taken and given back) against the baseline most
// services hand-roll: a std::mutex over an absl::flat_hash_map<std::string, count>, in one binary.
// TickClock (a plain integer): the limiter's own cost without a clock read.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "bench_support.hpp"
#include "sluice/concurrency.hpp"

namespace {

using namespace std::chrono_literals;
using Limiter = sluice::ConcurrencyLimiter<bench::TickClock>;
constexpr std::uint64_t kKeys = 100'000;
constexpr std::int64_t kStep = 1'000;  // ns between acquires of one thread

Limiter& limiter() {
  static Limiter instance = [] {
    auto created = Limiter::create({.max_in_flight = 64, .lease = 1h}, {.seed = 1});
    if (!created.ok()) std::abort();
    return *std::move(created);
  }();
  return instance;
}

// The baseline: in-flight counts per key under one mutex; a key leaves the map at count 0.
// (Debian's absl::string_view is not std::string_view: keys are converted for the lookups.)
class MutexFlatMapCounter {
 public:
  bool acquire(std::string_view key, std::uint32_t max) {
    std::lock_guard<std::mutex> hold(mutex_);
    std::uint32_t& count = counts_[absl::string_view(key.data(), key.size())];
    if (count >= max) return false;
    ++count;
    return true;
  }
  void release(std::string_view key) {
    std::lock_guard<std::mutex> hold(mutex_);
    auto it = counts_.find(absl::string_view(key.data(), key.size()));
    if (it != counts_.end() && --it->second == 0) counts_.erase(it);
  }

 private:
  std::mutex mutex_;
  absl::flat_hash_map<std::string, std::uint32_t> counts_;
};

MutexFlatMapCounter& baseline() {
  static MutexFlatMapCounter instance;
  return instance;
}

void BM_Concurrency_AcquireRelease_HotKey(benchmark::State& state) {
  bench::KeyMaker key;
  const std::string_view k = key(42);  // every thread on the same key
  for (auto _ : state) {
    bench::tick += kStep;
    sluice::ConcurrencyPermit permit = limiter().acquire(k);
    benchmark::DoNotOptimize(permit.held());
  }
}
BENCHMARK(BM_Concurrency_AcquireRelease_HotKey)->Threads(1)->Threads(2)->UseRealTime();

void BM_MutexFlatMap_AcquireRelease_HotKey(benchmark::State& state) {
  bench::KeyMaker key;
  const std::string_view k = key(42);
  for (auto _ : state) {
    const bool held = baseline().acquire(k, 64);
    benchmark::DoNotOptimize(held);
    if (held) baseline().release(k);
  }
}
BENCHMARK(BM_MutexFlatMap_AcquireRelease_HotKey)->Threads(1)->Threads(2)->UseRealTime();

// Uniform keys: each acquire inserts its key and each release removes it again.
void BM_Concurrency_AcquireRelease_UniformKeys(benchmark::State& state) {
  bench::KeyMaker key;
  bench::Uniform pick(static_cast<std::uint64_t>(state.thread_index()) + 1);
  for (auto _ : state) {
    bench::tick += kStep;
    sluice::ConcurrencyPermit permit = limiter().acquire(key(pick(kKeys)));
    benchmark::DoNotOptimize(permit.held());
  }
}
BENCHMARK(BM_Concurrency_AcquireRelease_UniformKeys)->Threads(1)->Threads(2)->UseRealTime();

void BM_MutexFlatMap_AcquireRelease_UniformKeys(benchmark::State& state) {
  bench::KeyMaker key;
  bench::Uniform pick(static_cast<std::uint64_t>(state.thread_index()) + 1);
  for (auto _ : state) {
    const std::string_view k = key(pick(kKeys));
    const bool held = baseline().acquire(k, 64);
    benchmark::DoNotOptimize(held);
    if (held) baseline().release(k);
  }
}
BENCHMARK(BM_MutexFlatMap_AcquireRelease_UniformKeys)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
