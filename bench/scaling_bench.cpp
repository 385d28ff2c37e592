// How a keyed check's cost grows with the number of tracked keys, from 1K to 16M, beside the
// physical limit over the same bytes: one dependent random access per check (PointerChase over
// as many bytes as the limiter's tables). One-window GCRA, TickClock, keys drawn uniformly.
//
// Second subject, thread scaling: ns per check as threads go from 1 to twice the machine's cores,
// on one key (a flood: every thread writes the same cell) and on disjoint keys (each thread its
// own key), sluice beside one mutex + absl::flat_hash_map GCRA, all in the same run. Every check
// is admitted (a window that never binds) under one frozen ManualClock that both read. Rows:
// BM_{Gcra,MutexFlatHashMap}_Threads_{OneKey,DisjointKeys}/threads:T; counter per_thread_ns is
// one thread's wall time over its own checks, items_per_second the aggregate rate.
// scripts/plot_threads.py turns their JSON into docs/thread-scaling.svg.
//
// Every size gets its own limiter (store capacity raised so that nothing is evicted), filled
// once before its first timed iteration; the pointer chase is built over the limiter's
// memory_bytes(). Rows: BM_Gcra_Keys/N and BM_PointerChase_Keys/N, N the number of keys.
// scripts/plot_scaling.py turns this binary's --benchmark_format=json output into a chart.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "bench_support.hpp"
#include "sluice/gcra.hpp"
#include "sluice/store.hpp"

namespace {

using namespace std::chrono_literals;
using Gcra = sluice::GcraLimiter<bench::TickClock>;
constexpr std::int64_t kStep = 1'000;  // ns between checks: 1 µs, so every check admits

// A limiter holding `keys` keys, and a pointer chase over as many bytes as its tables.
struct Filled {
  std::unique_ptr<Gcra> gcra;
  std::unique_ptr<bench::PointerChase> chase;
  double bytes_per_key = 0;

  explicit Filled(std::uint64_t keys) {
    // Room for every key with slack: shards fill unevenly, and nothing may be evicted.
    const std::size_t per_shard = static_cast<std::size_t>(keys / sluice::kStoreShards) * 2 + 64;
    sluice::StoreOptions options;
    options.max_keys_per_shard = per_shard;
    options.seed = 1;
    auto made = Gcra::create({{.requests = 1'000'000, .period = 1s}}, options);
    if (!made.ok()) std::abort();
    gcra = std::make_unique<Gcra>(*std::move(made));
    bench::KeyMaker key;
    for (std::uint64_t i = 0; i < keys; ++i) {
      bench::tick += kStep;
      (void)gcra->check(key(i));
    }
    if (gcra->stats().live_evicted != 0) std::abort();
    chase = std::make_unique<bench::PointerChase>(gcra->memory_bytes());
    bytes_per_key = static_cast<double>(gcra->memory_bytes()) / static_cast<double>(keys);
  }

  // One size at a time: the previous size is freed before the next is filled, so a 16M-key
  // table never shares the machine's memory (or its caches) with another.
  static Filled& get(std::uint64_t keys) {
    static std::map<std::uint64_t, std::unique_ptr<Filled>> sizes;
    auto it = sizes.find(keys);
    if (it == sizes.end()) {
      sizes.clear();
      it = sizes.emplace(keys, std::make_unique<Filled>(keys)).first;
    }
    return *it->second;
  }
};

void BM_Gcra_Keys(benchmark::State& state) {
  const auto keys = static_cast<std::uint64_t>(state.range(0));
  Filled& filled = Filled::get(keys);
  bench::KeyMaker key;
  bench::Uniform pick(1);
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(filled.gcra->check(key(pick(keys))));
  }
  state.counters["bytes_per_key"] = filled.bytes_per_key;
}

void BM_PointerChase_Keys(benchmark::State& state) {
  Filled& filled = Filled::get(static_cast<std::uint64_t>(state.range(0)));
  std::uint32_t at = 0;
  for (auto _ : state) {
    at = filled.chase->step(at);
    benchmark::DoNotOptimize(at);
  }
}

// --- thread scaling ----------------------------------------------------------------------------

constexpr std::uint64_t kNeverBinds = std::uint64_t{1} << 32;  // the largest burst: 2^32 checks

using GcraFrozen = sluice::GcraLimiter<sluice::ManualClock>;

const sluice::ManualClock& frozen_clock() {
  static const sluice::ManualClock clock;
  return clock;
}

GcraFrozen& flood_limiter() {
  static GcraFrozen limiter = [] {
    auto made =
        GcraFrozen::create({{.requests = 1'000'000'000, .period = 1s, .burst = kNeverBinds}},
                           {.seed = 1}, frozen_clock());
    if (!made.ok()) std::abort();
    return *std::move(made);
  }();
  return limiter;
}

bench::MutexFlatHashMapLimiter& flood_baseline() {
  static bench::MutexFlatHashMapLimiter limiter(1, std::int64_t{1} << 62);
  return limiter;
}

// Runs `check` until the state stops; records per_thread_ns and items_per_second.
template <class Check>
void run_threads(benchmark::State& state, Check&& check) {
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) benchmark::DoNotOptimize(check());
  const auto elapsed = std::chrono::steady_clock::now() - start;
  state.counters["per_thread_ns"] = benchmark::Counter(
      static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count()) /
          static_cast<double>(state.iterations()),
      benchmark::Counter::kAvgThreads);
  state.SetItemsProcessed(state.iterations());
}

// The key of thread `t`: one key for all, or its own.
std::string_view thread_key(bench::KeyMaker& key, const benchmark::State& state, bool disjoint) {
  return key(disjoint ? 1000 + static_cast<std::uint64_t>(state.thread_index()) : 42);
}

void BM_Gcra_Threads(benchmark::State& state, bool disjoint) {
  bench::KeyMaker key;
  const std::string_view k = thread_key(key, state, disjoint);
  run_threads(state, [&] { return flood_limiter().check(k); });
}

void BM_MutexFlatHashMap_Threads(benchmark::State& state, bool disjoint) {
  bench::KeyMaker key;
  const std::string_view k = thread_key(key, state, disjoint);
  run_threads(state, [&] { return flood_baseline().check(k, frozen_clock().now().count()); });
}

}  // namespace

// Registered per size (1K, 4K, ..., 16M) so that subject and limit of one size run one after
// the other over the same filled limiter.
int main(int argc, char** argv) {
  for (std::int64_t keys = 1 << 10; keys <= (1 << 24); keys *= 4) {
    benchmark::RegisterBenchmark("BM_Gcra_Keys", BM_Gcra_Keys)->Arg(keys)->UseRealTime();
    benchmark::RegisterBenchmark("BM_PointerChase_Keys", BM_PointerChase_Keys)
        ->Arg(keys)
        ->UseRealTime();
  }
  const int threads = 2 * static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  // Every thread count up to 8, powers of two beyond (and twice the cores).
  auto thread_counts = [threads](benchmark::internal::Benchmark* b) {
    if (threads <= 8) {
      b->DenseThreadRange(1, threads);
    } else {
      b->ThreadRange(1, threads);
    }
    b->UseRealTime();
  };
  for (bool disjoint : {false, true}) {
    const std::string keys = disjoint ? "DisjointKeys" : "OneKey";
    thread_counts(benchmark::RegisterBenchmark(("BM_Gcra_Threads_" + keys).c_str(), BM_Gcra_Threads,
                                               disjoint));
    thread_counts(benchmark::RegisterBenchmark(("BM_MutexFlatHashMap_Threads_" + keys).c_str(),
                                               BM_MutexFlatHashMap_Threads, disjoint));
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
