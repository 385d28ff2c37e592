// The limiters against the S14 references and a naive floating-point token bucket, in one binary.
// Gcra_*/FixedWindow_* use TickClock (a plain integer, the limiter's own cost) unless the name
// says SteadyClock (what a service pays end to end on this VM: ~26 ns per clock read).
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "bench_support.hpp"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/direct_gcra.hpp"
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
  bench::MutexFlatHashMapLimiter flat{kStep, 1'000'000'000};
  bench::FloatTokenBucketLimiter floating{1e-3, 1e6};
  std::unique_ptr<bench::PointerChase> chase;
  Populated() {
    bench::KeyMaker key;
    for (std::uint64_t i = 0; i < kKeys; ++i) {
      (void)gcra.check(key(i));
      unordered.check(key(i), 0);
      flat.check(key(i), 0);
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

// --- one hot key under every thread (a flood on one key) -------------------------------------
// Every thread checks the same key and every check is admitted (a window that never binds), so
// every check writes the key's state. Subjects in the same run: GcraLimiter, one window, and the
// mutex + absl::flat_hash_map GCRA a service would write. "Frozen": one shared ManualClock that
// never moves (both subjects read it). "Moving": each thread's FloodClock moves 1 ns per read
// (both subjects read it once per check).
// Threads 1, 2 and 4 (4 = twice this machine's cores: a waiter must not take its holder's time).
// Counter per_thread_ns: wall time of one thread over its own checks (the time shown by the
// library is the aggregate, wall time over every thread's checks).

constexpr std::uint64_t kNeverBinds = std::uint64_t{1} << 32;  // burst: 2^32 checks before any
                                                               // denial, at 1 check per ns

using GcraFrozen = sluice::GcraLimiter<sluice::ManualClock>;

template <class Check>
void run_timed(benchmark::State& state, Check&& check) {
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) benchmark::DoNotOptimize(check());
  const auto elapsed = std::chrono::steady_clock::now() - start;
  state.counters["per_thread_ns"] = benchmark::Counter(
      static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count()) /
          static_cast<double>(state.iterations()),
      benchmark::Counter::kAvgThreads);
}

void BM_Gcra_HotKeyFlood_Frozen(benchmark::State& state) {
  static GcraFrozen limiter =
      must(GcraFrozen::create({{.requests = 1'000'000'000, .period = 1s, .burst = kNeverBinds}},
                              {.seed = 1}, sluice::ManualClock()));
  bench::KeyMaker key;
  const std::string_view k = key(42);
  run_timed(state, [&] { return limiter.check(k); });
}
BENCHMARK(BM_Gcra_HotKeyFlood_Frozen)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

void BM_MutexFlatHashMap_HotKeyFlood_Frozen(benchmark::State& state) {
  static bench::MutexFlatHashMapLimiter limiter(1, std::int64_t{1} << 62);
  static const sluice::ManualClock clock;
  bench::KeyMaker key;
  const std::string_view k = key(42);
  run_timed(state, [&] { return limiter.check(k, clock.now().count()); });
}
BENCHMARK(BM_MutexFlatHashMap_HotKeyFlood_Frozen)
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->UseRealTime();

// The moving clock of the flood rows, read by both subjects: each read moves the reading thread's
// own time 1 ns (a thread-local, so no cache line is shared). A type of its own, used by no other
// benchmark, so that GcraLimiter<FloodClock>::check is compiled into this loop as the frozen
// rows' GcraLimiter<ManualClock>::check is into theirs; the rows above that share TickClock with
// every other benchmark measure the check as an out-of-line call.
inline thread_local std::int64_t flood_tick = 0;
struct FloodClock {
  std::chrono::nanoseconds now() const noexcept { return std::chrono::nanoseconds{++flood_tick}; }
};
using GcraMoving = sluice::GcraLimiter<FloodClock>;

void BM_Gcra_HotKeyFlood_Moving(benchmark::State& state) {
  static GcraMoving limiter =
      must(GcraMoving::create({{.requests = 1'000'000'000, .period = 1s, .burst = kNeverBinds}},
                              {.seed = 1}, FloodClock()));
  bench::KeyMaker key;
  const std::string_view k = key(42);
  run_timed(state, [&] { return limiter.check(k); });
}
BENCHMARK(BM_Gcra_HotKeyFlood_Moving)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

void BM_MutexFlatHashMap_HotKeyFlood_Moving(benchmark::State& state) {
  static bench::MutexFlatHashMapLimiter limiter(1, std::int64_t{1} << 62);
  const FloodClock clock;
  bench::KeyMaker key;
  const std::string_view k = key(42);
  run_timed(state, [&] { return limiter.check(k, clock.now().count()); });
}
BENCHMARK(BM_MutexFlatHashMap_HotKeyFlood_Moving)
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->UseRealTime();

// --- reserve and cancel, hot key (tick clock: every reservation fits now, so it waits 0) ----
// Beside BM_Gcra_OneWindow_HotKey (a check) and BM_MutexFlatHashMap_HotKey in the same run.

void BM_Gcra_Reserve_HotKey(benchmark::State& state) {
  Gcra& limiter = one_window();
  bench::KeyMaker key;
  const std::string_view k = key(7);
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(limiter.reserve(k));
  }
}
BENCHMARK(BM_Gcra_Reserve_HotKey)->UseRealTime();

void BM_Gcra_ReserveThenCancel_HotKey(benchmark::State& state) {
  Gcra& limiter = one_window();
  bench::KeyMaker key;
  const std::string_view k = key(8);
  for (auto _ : state) {
    bench::tick += kStep;
    absl::StatusOr<Gcra::Reservation> r = limiter.reserve(k);
    benchmark::DoNotOptimize(limiter.cancel(*r));
  }
}
BENCHMARK(BM_Gcra_ReserveThenCancel_HotKey)->UseRealTime();

void BM_Gcra_EstimateThenSettle_HotKey(benchmark::State& state) {
  Gcra& limiter = one_window();
  bench::KeyMaker key;
  const std::string_view k = key(9);
  for (auto _ : state) {
    bench::tick += 4 * kStep;
    absl::StatusOr<Gcra::Estimated> e = limiter.check_estimated(k, 4);
    benchmark::DoNotOptimize(limiter.settle(e->receipt, 3));
  }
}
BENCHMARK(BM_Gcra_EstimateThenSettle_HotKey)->UseRealTime();

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

void BM_MutexFlatHashMap_Uniform1M(benchmark::State& state) {
  Populated& p = Populated::get();
  bench::KeyMaker key;
  bench::Uniform pick(1);
  std::int64_t now = 0;
  for (auto _ : state) benchmark::DoNotOptimize(p.flat.check(key(pick(kKeys)), now += kStep));
}
BENCHMARK(BM_MutexFlatHashMap_Uniform1M)->UseRealTime();

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

// --- unkeyed: DirectGcraLimiter beside the CAS loop a user would write ------------------------
// "Frozen" uses a ManualClock that never moves (what the comparable Rust direct-limiter numbers
// use): the limiter's own cost plus one atomic load for the clock. With a frozen clock the burst
// drains and every later check is a denial (…_Deny), unless the burst is 2^32 so that every
// check is an admission, one CAS each (…_Admit). "Tick" advances the thread's TickClock 1 µs per
// check at 10^6 per second: every check admits.

using DirectFrozen = sluice::DirectGcraLimiter<sluice::ManualClock>;
using DirectTick = sluice::DirectGcraLimiter<bench::TickClock>;

// The baseline: governor-style single-atomic GCRA, one window, whole-ns interval, bool answer.
class AtomicGcra {
 public:
  AtomicGcra(std::int64_t interval, std::int64_t tolerance)
      : interval_(interval), tolerance_(tolerance) {}
  bool check(std::int64_t now) {
    std::int64_t tat = tat_.load(std::memory_order_acquire);
    for (;;) {
      const std::int64_t next = std::max(tat, now) + interval_;
      if (next - now > tolerance_) return false;
      if (tat_.compare_exchange_weak(tat, next, std::memory_order_acq_rel)) return true;
    }
  }
  // The same check returning a sluice::Decision (48 bytes, through memory) with the plainest
  // fields: what returning a Decision costs beside returning a bool.
  sluice::Decision check_decision(std::int64_t now) {
    std::int64_t tat = tat_.load(std::memory_order_acquire);
    for (;;) {
      const std::int64_t next = std::max(tat, now) + interval_;
      if (next - now > tolerance_) return {.reason = sluice::Reason::kQuotaExceeded};
      if (tat_.compare_exchange_weak(tat, next, std::memory_order_acq_rel)) {
        return {.remaining = static_cast<std::uint64_t>(tolerance_ - (next - now)),
                .reset_after = std::chrono::nanoseconds(next - now)};
      }
    }
  }

 private:
  std::atomic<std::int64_t> tat_{0};
  std::int64_t interval_, tolerance_;
};

constexpr std::uint64_t kHugeBurst = std::uint64_t{1} << 32;

void BM_Direct_OneWindow_Frozen_Deny(benchmark::State& state) {
  static DirectFrozen limiter =
      must(DirectFrozen::create({{.requests = 1000, .period = 1s}}, sluice::ManualClock()));
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check());
}
BENCHMARK(BM_Direct_OneWindow_Frozen_Deny)->UseRealTime();

void BM_Direct_OneWindow_Frozen_Admit(benchmark::State& state) {
  static DirectFrozen limiter = must(DirectFrozen::create(
      {{.requests = kHugeBurst, .period = std::chrono::nanoseconds(kHugeBurst)}},
      sluice::ManualClock()));
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check());
}
BENCHMARK(BM_Direct_OneWindow_Frozen_Admit)->UseRealTime();

// check_one: the cost-1 check without a StatusOr, the same Decision.
void BM_Direct_OneWindow_Frozen_Admit_CheckOne(benchmark::State& state) {
  static DirectFrozen limiter = must(DirectFrozen::create(
      {{.requests = kHugeBurst, .period = std::chrono::nanoseconds(kHugeBurst)}},
      sluice::ManualClock()));
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check_one());
}
BENCHMARK(BM_Direct_OneWindow_Frozen_Admit_CheckOne)->UseRealTime();

void BM_Direct_OneWindow_Frozen_Deny_CheckOne(benchmark::State& state) {
  static DirectFrozen limiter =
      must(DirectFrozen::create({{.requests = 1000, .period = 1s}}, sluice::ManualClock()));
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check_one());
}
BENCHMARK(BM_Direct_OneWindow_Frozen_Deny_CheckOne)->UseRealTime();

void BM_Direct_OneWindow_Tick(benchmark::State& state) {
  static DirectTick limiter = must(DirectTick::create({{.requests = 1'000'000, .period = 1s}}));
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(limiter.check());
  }
}
BENCHMARK(BM_Direct_OneWindow_Tick)->Threads(1)->Threads(2)->UseRealTime();

void BM_Direct_OneWindow_Reserve_Tick(benchmark::State& state) {
  static DirectTick limiter = must(DirectTick::create({{.requests = 1'000'000, .period = 1s}}));
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(limiter.reserve());
  }
}
BENCHMARK(BM_Direct_OneWindow_Reserve_Tick)->UseRealTime();

void BM_Direct_ThreeWindows_Frozen_Deny(benchmark::State& state) {
  static DirectFrozen limiter = must(DirectFrozen::create({{.requests = 1000, .period = 1s},
                                                           {.requests = 60'000, .period = 1min},
                                                           {.requests = 3'600'000, .period = 1h}},
                                                          sluice::ManualClock()));
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check());
}
BENCHMARK(BM_Direct_ThreeWindows_Frozen_Deny)->UseRealTime();

void BM_Direct_ThreeWindows_Frozen_Admit(benchmark::State& state) {
  static DirectFrozen limiter = must(DirectFrozen::create(
      {{.requests = kHugeBurst, .period = std::chrono::nanoseconds(kHugeBurst)},
       {.requests = kHugeBurst, .period = std::chrono::nanoseconds(2 * kHugeBurst)},
       {.requests = kHugeBurst, .period = std::chrono::nanoseconds(4 * kHugeBurst)}},
      sluice::ManualClock()));
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check());
}
BENCHMARK(BM_Direct_ThreeWindows_Frozen_Admit)->UseRealTime();

void BM_Direct_ThreeWindows_Tick(benchmark::State& state) {
  static DirectTick limiter = must(DirectTick::create({{.requests = 1'000'000, .period = 1s},
                                                       {.requests = 60'000'000, .period = 1min},
                                                       {.requests = 3'600'000'000, .period = 1h}}));
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(limiter.check());
  }
}
BENCHMARK(BM_Direct_ThreeWindows_Tick)->Threads(1)->Threads(2)->UseRealTime();

void BM_AtomicGcraBaseline_Frozen_Deny(benchmark::State& state) {
  static AtomicGcra limiter(1'000'000, 1'000'000'000);  // 1000 per second, burst 1000
  const sluice::ManualClock clock;
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(clock.now().count()));
}
BENCHMARK(BM_AtomicGcraBaseline_Frozen_Deny)->UseRealTime();

void BM_AtomicGcraBaseline_Frozen_Admit(benchmark::State& state) {
  static AtomicGcra limiter(1, std::int64_t{1} << 32);  // burst 2^32
  const sluice::ManualClock clock;
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check(clock.now().count()));
}
BENCHMARK(BM_AtomicGcraBaseline_Frozen_Admit)->UseRealTime();

void BM_AtomicGcraBaseline_Frozen_Admit_Decision(benchmark::State& state) {
  static AtomicGcra limiter(1, std::int64_t{1} << 32);  // burst 2^32
  const sluice::ManualClock clock;
  for (auto _ : state) benchmark::DoNotOptimize(limiter.check_decision(clock.now().count()));
}
BENCHMARK(BM_AtomicGcraBaseline_Frozen_Admit_Decision)->UseRealTime();

// The floor of any admission: one locked read-modify-write of one word (`lock xadd`), nothing
// else. Every admission must change the limiter's state atomically, so no admitting check can
// take less than this on the host it runs on.
void BM_AtomicFetchAddFloor(benchmark::State& state) {
  static std::atomic<std::int64_t> word{0};
  for (auto _ : state) benchmark::DoNotOptimize(word.fetch_add(1, std::memory_order_relaxed));
}
BENCHMARK(BM_AtomicFetchAddFloor)->UseRealTime();

void BM_AtomicGcraBaseline_Tick(benchmark::State& state) {
  static AtomicGcra limiter(kStep, 1'000'000'000);
  for (auto _ : state) {
    bench::tick += kStep;
    benchmark::DoNotOptimize(limiter.check(bench::tick));
  }
}
BENCHMARK(BM_AtomicGcraBaseline_Tick)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
