// The sharded store against the S14 references, in one binary:
//   Store_*           sluice::ShardedStore with a one-window GCRA-sized cell (16 bytes)
//   MutexUnorderedMap std::mutex + std::unordered_map<std::string, …> (what services hand-roll)
//   MutexFlatHashMap  one std::mutex + absl::flat_hash_map<std::string, …>
//   PointerChase      one dependent random memory access over as many bytes as the store's tables
// Every subject does the same GCRA step per operation on a key the caller built in cache.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <limits>
#include <memory>

#include "bench_support.hpp"
#include "sluice/store.hpp"

namespace {

constexpr std::uint64_t kKeys = 1'000'000;
constexpr std::int64_t kInterval = 1'000;       // 1 µs per request
constexpr std::int64_t kTolerance = 1'000'000;  // bucket of 1000

// A one-window GCRA cell: the same 16 bytes a GcraLimiter with one window keeps per key.
struct Cell {
  std::int64_t tat = std::numeric_limits<std::int64_t>::min();
  std::uint64_t fraction = 0;
  bool idle(std::int64_t now) const noexcept { return tat <= now; }
  std::int64_t time_until_fresh(std::int64_t now) const noexcept {
    return tat > now ? tat - now : 0;
  }
};
using Store = sluice::ShardedStore<Cell>;

bool store_check(Store& store, std::string_view key, std::int64_t now) {
  return store.update(
      store.digest(key), now,
      [](Cell& cell, std::int64_t at) {
        bench::GcraState s{cell.tat};
        bool ok = bench::gcra_step(s, at, kInterval, kTolerance);
        cell.tat = s.tat;
        return ok;
      },
      [](sluice::StoreFull) { return false; });
}

// Populated once, shared by the 1M-key benchmarks; records bytes per key as measured by RSS.
struct Populated {
  Store store{sluice::StoreOptions{.seed = 1}};
  bench::MutexUnorderedMapLimiter unordered{kInterval, kTolerance};
  bench::MutexFlatHashMapLimiter flat{kInterval, kTolerance};
  double store_rss_per_key = 0, unordered_rss_per_key = 0, flat_rss_per_key = 0;
  std::unique_ptr<bench::PointerChase> chase;

  Populated() {
    bench::KeyMaker key;
    std::size_t before = bench::resident_bytes();
    for (std::uint64_t i = 0; i < kKeys; ++i) store_check(store, key(i), 0);
    std::size_t after = bench::resident_bytes();
    store_rss_per_key = static_cast<double>(after - before) / kKeys;
    before = after;
    for (std::uint64_t i = 0; i < kKeys; ++i) unordered.check(key(i), 0);
    after = bench::resident_bytes();
    unordered_rss_per_key = static_cast<double>(after - before) / kKeys;
    before = after;
    for (std::uint64_t i = 0; i < kKeys; ++i) flat.check(key(i), 0);
    after = bench::resident_bytes();
    flat_rss_per_key = static_cast<double>(after - before) / kKeys;
    chase = std::make_unique<bench::PointerChase>(store.table_bytes());
  }
  static Populated& get() {
    static Populated instance;
    return instance;
  }
};

std::vector<std::uint32_t>& zipf() {
  static std::vector<std::uint32_t> sequence = bench::zipf_sequence(kKeys, 1.1, 1 << 22);
  return sequence;
}

// --- hot key ----------------------------------------------------------------------------------

void BM_Store_HotKey(benchmark::State& state) {
  static Store store(sluice::StoreOptions{.seed = 1});
  bench::KeyMaker key;
  std::int64_t now = 0;
  for (auto _ : state) benchmark::DoNotOptimize(store_check(store, key(42), now += kInterval));
}
BENCHMARK(BM_Store_HotKey)->Threads(1)->Threads(2)->UseRealTime();

void BM_MutexUnorderedMap_HotKey(benchmark::State& state) {
  static bench::MutexUnorderedMapLimiter limiter(kInterval, kTolerance);
  bench::KeyMaker key;
  std::int64_t now = 0;
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(key(42), now += kInterval));
}
BENCHMARK(BM_MutexUnorderedMap_HotKey)->Threads(1)->Threads(2)->UseRealTime();

void BM_MutexFlatHashMap_HotKey(benchmark::State& state) {
  static bench::MutexFlatHashMapLimiter limiter(kInterval, kTolerance);
  bench::KeyMaker key;
  std::int64_t now = 0;
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(key(42), now += kInterval));
}
BENCHMARK(BM_MutexFlatHashMap_HotKey)->Threads(1)->Threads(2)->UseRealTime();

// --- 1M keys, uniform -------------------------------------------------------------------------

void BM_Store_Uniform1M(benchmark::State& state) {
  Populated& p = Populated::get();
  bench::KeyMaker key;
  bench::Uniform pick(state.thread_index() + 1);
  std::int64_t now = 1;
  for (auto _ : state) benchmark::DoNotOptimize(store_check(p.store, key(pick(kKeys)), now));
  state.counters["table_bytes_per_key"] =
      static_cast<double>(p.store.table_bytes()) / static_cast<double>(p.store.stats().size);
  state.counters["rss_bytes_per_key"] = p.store_rss_per_key;
  state.counters["evicted"] = static_cast<double>(p.store.stats().live_evicted);
}
BENCHMARK(BM_Store_Uniform1M)->Threads(1)->Threads(2)->UseRealTime();

void BM_MutexUnorderedMap_Uniform1M(benchmark::State& state) {
  Populated& p = Populated::get();
  bench::KeyMaker key;
  bench::Uniform pick(state.thread_index() + 1);
  for (auto _ : state) benchmark::DoNotOptimize(p.unordered.check(key(pick(kKeys)), 1));
  state.counters["rss_bytes_per_key"] = p.unordered_rss_per_key;
}
BENCHMARK(BM_MutexUnorderedMap_Uniform1M)->Threads(1)->Threads(2)->UseRealTime();

void BM_MutexFlatHashMap_Uniform1M(benchmark::State& state) {
  Populated& p = Populated::get();
  bench::KeyMaker key;
  bench::Uniform pick(state.thread_index() + 1);
  for (auto _ : state) benchmark::DoNotOptimize(p.flat.check(key(pick(kKeys)), 1));
  state.counters["rss_bytes_per_key"] = p.flat_rss_per_key;
}
BENCHMARK(BM_MutexFlatHashMap_Uniform1M)->Threads(1)->UseRealTime();

// --- 1M keys, Zipf(1.1) -----------------------------------------------------------------------

void BM_Store_Zipf1M(benchmark::State& state) {
  Populated& p = Populated::get();
  const auto& seq = zipf();
  bench::KeyMaker key;
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(store_check(p.store, key(seq[i++ & (seq.size() - 1)]), 1));
  }
}
BENCHMARK(BM_Store_Zipf1M)->UseRealTime();

void BM_MutexUnorderedMap_Zipf1M(benchmark::State& state) {
  Populated& p = Populated::get();
  const auto& seq = zipf();
  bench::KeyMaker key;
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(p.unordered.check(key(seq[i++ & (seq.size() - 1)]), 1));
  }
}
BENCHMARK(BM_MutexUnorderedMap_Zipf1M)->UseRealTime();

// --- key spray: every key new, constant eviction --------------------------------------------

void BM_Store_Spray(benchmark::State& state) {
  // Default cap (16384 per shard, ~1M keys); filled to steady state before timing.
  static Store store(sluice::StoreOptions{.seed = 1});
  static std::uint64_t next = 0;
  bench::KeyMaker key;
  if (next == 0) {
    for (; next < 3 * kKeys; ++next) store_check(store, key(next), 0);
  }
  const sluice::StoreStats before = store.stats();
  const std::uint64_t sweep_before = store.sweep_work();
  for (auto _ : state) benchmark::DoNotOptimize(store_check(store, key(next++), 0));
  const sluice::StoreStats after = store.stats();
  state.counters["evicted_per_op"] = static_cast<double>(after.live_evicted - before.live_evicted) /
                                     static_cast<double>(state.iterations());
  state.counters["slots_swept_per_op"] = static_cast<double>(store.sweep_work() - sweep_before) /
                                         static_cast<double>(state.iterations());
  state.counters["keys"] = static_cast<double>(after.size);
}
BENCHMARK(BM_Store_Spray)->UseRealTime();

// The hand-rolled map has no bound: under a spray it grows until memory runs out. Timed over the
// same number of new keys for the ratio only.
void BM_MutexUnorderedMap_Spray(benchmark::State& state) {
  static bench::MutexUnorderedMapLimiter limiter(kInterval, kTolerance);
  static std::uint64_t next = 10 * kKeys;
  bench::KeyMaker key;
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(key(next++), 0));
  state.counters["keys"] = static_cast<double>(limiter.size());
}
BENCHMARK(BM_MutexUnorderedMap_Spray)->UseRealTime()->Iterations(2'000'000);

// --- the physical limit -----------------------------------------------------------------------

void BM_PointerChase_StoreTables1M(benchmark::State& state) {
  Populated& p = Populated::get();
  std::uint32_t at = 0;
  for (auto _ : state) {
    at = p.chase->step(at);
    benchmark::DoNotOptimize(at);
  }
  state.counters["bytes"] = static_cast<double>(p.store.table_bytes());
}
BENCHMARK(BM_PointerChase_StoreTables1M)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
