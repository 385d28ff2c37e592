// The smallest sluice program: a manual clock and a few decisions, printed.
#include <chrono>
#include <cstdio>

#include "sluice/sluice.hpp"

int main() {
  sluice::ManualClock clock;
  for (int i = 0; i < 3; ++i) {
    sluice::Decision d{.reason = sluice::Reason::kAllowed, .limit = 3,
                       .remaining = static_cast<std::uint64_t>(2 - i)};
    std::printf("t=%lldms %s remaining=%llu\n",
                static_cast<long long>(clock.now().count() / 1'000'000),
                std::string(sluice::to_string(d.reason)).c_str(),
                static_cast<unsigned long long>(d.remaining));
    clock.advance(std::chrono::milliseconds(100));
  }
}
