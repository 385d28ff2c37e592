// sluice/window.hpp — the windows a limit is made of, shared by every limiter and the policy model.
//
// A `GcraWindow` is a sustained rate with a bucket: `requests` per `period`, at most `burst`
// requests at once. A `FixedWindow` counts `limit` units per anchored `window`. Limiters stack
// one to four windows per key; the policy compiler (sluice/policy.hpp) produces `GcraWindow`s, and
// the Redis limiter (sluice/redis.hpp) takes the same type.
//
//   using namespace std::chrono_literals;
//   std::vector<sluice::GcraWindow> login = {{.requests = 5, .period = 60s, .burst = 5},
//                                            {.requests = 20, .period = 3600s}};
//
// Units: counts of requests (or cost units) and integer nanoseconds. Each limiter states and
// checks its own supported range when it is created. Plain values: thread-compatible.
#ifndef SLUICE_WINDOW_HPP_
#define SLUICE_WINDOW_HPP_

#include <chrono>
#include <cstdint>

namespace sluice {

// `requests` per `period`, with a bucket of `burst` (0 means `requests`).
struct GcraWindow {
  std::uint64_t requests = 0;
  std::chrono::nanoseconds period{0};
  std::uint64_t burst = 0;
  friend bool operator==(const GcraWindow&, const GcraWindow&) = default;
};

// `limit` units per `window`.
struct FixedWindow {
  std::uint64_t limit = 0;
  std::chrono::nanoseconds window{0};
  friend bool operator==(const FixedWindow&, const FixedWindow&) = default;
};

}  // namespace sluice

#endif  // SLUICE_WINDOW_HPP_
