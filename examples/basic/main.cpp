// The smallest sluice program: a GCRA limiter of 3 requests per second stacked with 100 per
// hour, driven by a manual clock, printing each decision.
#include <chrono>
#include <cstdio>

#include "sluice/sluice.hpp"

int main() {
  using namespace std::chrono_literals;
  sluice::ManualClock clock;
  auto limiter = sluice::GcraLimiter<sluice::ManualClock>::create(
      {{.requests = 3, .period = 1s}, {.requests = 100, .period = 1h}}, {}, clock);
  if (!limiter.ok()) {
    std::fprintf(stderr, "%s\n", limiter.status().ToString().c_str());
    return 1;
  }
  std::printf("%8s  %-14s %9s %14s %14s\n", "t (ms)", "decision", "remaining", "retry_after",
              "reset_after");
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<sluice::Decision> d = limiter->check("203.0.113.7");
    std::printf("%8lld  %-14s %9llu %11lld ns %11lld ns\n",
                static_cast<long long>(clock.now() / 1ms),
                std::string(sluice::to_string(d->reason)).c_str(),
                static_cast<unsigned long long>(d->remaining),
                static_cast<long long>(d->retry_after.count()),
                static_cast<long long>(d->reset_after.count()));
    clock.advance(100ms);
  }
}
