// Built by the consumer smoke test: proves that a downstream project can include and use sluice.
#include <sluice/sluice.hpp>

#include <chrono>
#include <cstdio>

int main() {
  sluice::ManualClock clock;
  clock.advance(std::chrono::seconds(1));
  sluice::Decision decision{.reason = sluice::Reason::kAllowed, .limit = 1};
  if (!decision.allowed() || clock.now() != std::chrono::seconds(1)) return 1;
  std::printf("consumer ok: sluice %s\n", sluice::kVersionString);
  return 0;
}
