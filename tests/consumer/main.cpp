// Built by the consumer smoke test: proves that a downstream project can include and use sluice.
#include <sluice/sluice.hpp>

#include <chrono>
#include <cstdio>

int main() {
  using namespace std::chrono_literals;
  sluice::ManualClock clock;
  auto limiter =
      sluice::GcraLimiter<sluice::ManualClock>::create({{.requests = 2, .period = 1s}}, {}, clock);
  if (!limiter.ok()) return 1;
  const bool first = limiter->check("k")->allowed();
  const bool second = limiter->check("k")->allowed();
  const bool third = limiter->check("k")->allowed();
  if (!first || !second || third) return 2;
  std::printf("consumer ok: sluice %s\n", sluice::kVersionString);
  return 0;
}
