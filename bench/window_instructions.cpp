// Instructions per check of GcraLimiter on one hot key, one window against three stacked windows,
// for callgrind: N checks by one thread, every one admitted, on a frozen clock (buckets of 2^32:
// the TATs run ahead, and the binding window is chosen among windows with room left) or a moving
// one (1 µs per check against 10^6 per second: every window starts afresh). The windows are those
// of bench/limiter_bench.cpp's hot-key rows. Built and run by scripts/window_instructions, which
// subtracts a run of 0 checks (the setup) and divides by N.
//
//   window_instructions MODE N    MODE: 1f  one window, frozen clock
//                                       3f  three stacked windows, frozen clock
//                                       1m  one window, moving clock
//                                       3m  three stacked windows, moving clock
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench_support.hpp"
#include "sluice/gcra.hpp"

namespace {

using namespace std::chrono_literals;
using Gcra = sluice::GcraLimiter<bench::TickClock>;

Gcra limiter(bool three, bool frozen) {
  // Frozen, the buckets hold 2^32 so that no window binds; moving, each window admits 10^6 per
  // second, exactly the checks' pace.
  const std::uint64_t burst = frozen ? 1ULL << 32 : 0;
  std::vector<sluice::GcraWindow> windows{{.requests = 1'000'000, .period = 1s, .burst = burst}};
  if (three) {
    windows.push_back({.requests = 60'000'000, .period = 1min, .burst = burst});
    windows.push_back({.requests = 3'600'000'000, .period = 1h, .burst = burst});
  }
  auto created = Gcra::create(std::move(windows), {.seed = 1});
  if (!created.ok()) std::abort();
  return *std::move(created);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "3f";
  const long n = argc > 2 ? std::atol(argv[2]) : 100000;
  const bool frozen = mode[1] == 'f';
  Gcra gcra = limiter(mode[0] == '3', frozen);
  bench::KeyMaker key;
  const std::string_view k = key(42);
  long denied = 0;
  for (long i = 0; i < n; ++i) {
    if (!frozen) bench::tick += 1'000;
    denied += gcra.check(k)->allowed() ? 0 : 1;
  }
  std::printf("mode %s: %ld checks, %ld denied\n", mode.c_str(), n, denied);
  return denied == 0 ? 0 : 1;
}
