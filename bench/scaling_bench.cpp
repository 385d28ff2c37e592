// How a keyed check's cost grows with the number of tracked keys, from 1K to 16M, beside the
// physical limit over the same bytes: one dependent random access per check (PointerChase over
// as many bytes as the limiter's tables). One-window GCRA, TickClock, keys drawn uniformly.
//
// Every size gets its own limiter (store capacity raised so that nothing is evicted), filled
// once before its first timed iteration; the pointer chase is built over the limiter's
// memory_bytes(). Rows: BM_Gcra_Keys/N and BM_PointerChase_Keys/N, N the number of keys.
// scripts/plot_scaling.py turns this binary's --benchmark_format=json output into a chart.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>

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
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
