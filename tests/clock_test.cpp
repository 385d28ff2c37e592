#include "sluice/clock.hpp"

#include <chrono>
#include <thread>
#include <vector>

#include "catch.hpp"

using namespace std::chrono_literals;

TEST_CASE("a manual clock starts where it is told and moves only when told") {
  sluice::ManualClock clock;
  CHECK(clock.now() == 0ns);
  clock.advance(1500ms);
  CHECK(clock.now() == 1'500'000'000ns);
  clock.set(42ns);
  CHECK(clock.now() == 42ns);

  sluice::ManualClock late(std::chrono::hours(24));
  CHECK(late.now() == std::chrono::nanoseconds(86'400'000'000'000));
}

TEST_CASE("copies of a manual clock share one time") {
  sluice::ManualClock clock;
  sluice::ManualClock copy = clock;
  copy.advance(7ns);
  CHECK(clock.now() == 7ns);
  clock.set(3s);
  CHECK(copy.now() == 3s);
}

TEST_CASE("a manual clock can be set backwards, to test clamping") {
  sluice::ManualClock clock(10s);
  clock.set(5s);
  CHECK(clock.now() == 5s);
}

TEST_CASE("concurrent advances of a manual clock are never lost") {
  sluice::ManualClock clock;
  constexpr int kThreads = 4;
  constexpr int kAdvances = 10'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([clock]() mutable {
      for (int i = 0; i < kAdvances; ++i) clock.advance(1ns);
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(clock.now() == std::chrono::nanoseconds(kThreads * kAdvances));
}

TEST_CASE("the steady clock never goes backwards") {
  sluice::SteadyClock clock;
  auto previous = clock.now();
  for (int i = 0; i < 1000; ++i) {
    auto now = clock.now();
    REQUIRE(now >= previous);
    previous = now;
  }
}

TEST_CASE("both clocks model the Clock concept and other types do not") {
  STATIC_REQUIRE(sluice::Clock<sluice::SteadyClock>);
  STATIC_REQUIRE(sluice::Clock<sluice::ManualClock>);
  STATIC_REQUIRE_FALSE(sluice::Clock<int>);
  STATIC_REQUIRE_FALSE(sluice::Clock<std::chrono::steady_clock>);  // now() is a time_point
}
