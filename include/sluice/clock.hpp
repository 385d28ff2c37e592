// sluice/clock.hpp — the time sources every limiter is parameterized on.
//
// A clock is any copyable type whose `now()` returns `std::chrono::nanoseconds` since the clock's
// own epoch and never goes backwards. Limiters take their clock as a template parameter and a
// constructor argument, never from a global, so tests drive time deterministically:
//
//   sluice::ManualClock clock;                 // starts at 0 ns
//   auto limiter = sluice::GcraLimiter<sluice::ManualClock>::create(windows, {}, clock);
//   clock.advance(std::chrono::milliseconds(250));  // the limiter sees the same time
//
// Only integer nanoseconds flow through decisions; wall-clock time is never read here.
#ifndef SLUICE_CLOCK_HPP_
#define SLUICE_CLOCK_HPP_

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <thread>

namespace sluice {

// A monotonic source of integer nanoseconds since its own epoch.
template <class C>
concept Clock = std::copy_constructible<C> && requires(const C& clock) {
  { clock.now() } -> std::same_as<std::chrono::nanoseconds>;
};

// The production clock: std::chrono::steady_clock in nanoseconds.
// Thread-safety: stateless; `now()` may be called from any thread.
class SteadyClock {
 public:
  std::chrono::nanoseconds now() const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch());
  }
};

// A test clock that moves only when told to. It is a handle: every copy shares one time, so a
// test keeps a copy while the limiter under test holds another.
// Thread-safety: `now()`, `set()` and `advance()` may be called concurrently from any threads
// (the time is one atomic). `set()` may move time backwards, which is how tests show that a
// limiter clamps a regressing clock; a real clock never does that.
class ManualClock {
 public:
  // Starts at `start` (default: 0 ns).
  explicit ManualClock(std::chrono::nanoseconds start = std::chrono::nanoseconds{0})
      : time_(std::make_shared<std::atomic<std::int64_t>>(start.count())) {}

  std::chrono::nanoseconds now() const noexcept {
    return std::chrono::nanoseconds{time_->load(std::memory_order_acquire)};
  }
  void set(std::chrono::nanoseconds t) noexcept {
    time_->store(t.count(), std::memory_order_release);
  }
  void advance(std::chrono::nanoseconds d) noexcept {
    time_->fetch_add(d.count(), std::memory_order_acq_rel);
  }

 private:
  std::shared_ptr<std::atomic<std::int64_t>> time_;  // ns since this clock's epoch
};

static_assert(Clock<SteadyClock>);
static_assert(Clock<ManualClock>);

// Sleeps the calling thread: the default sleeper of the limiters' `wait`. A test with a
// ManualClock passes a sleeper that advances the clock instead.
struct ThreadSleepFor {
  void operator()(std::chrono::nanoseconds d) const { std::this_thread::sleep_for(d); }
};

}  // namespace sluice

#endif  // SLUICE_CLOCK_HPP_
