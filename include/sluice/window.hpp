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
#include <optional>
#include <string_view>

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

// How a policy rule (or an Envoy limit) counts its windows. Part of a rule's identity: a reload
// that changes it starts the rule fresh.
enum class Algorithm {
  // The generic cell rate algorithm (a token bucket without a refill thread): smooth, with a burst
  // on the shortest window. The default.
  kGcra,
  // A fixed window per key (sluice/fixed_window.hpp): `requests` per period, counted from the
  // first admitted request of an idle key until the period has elapsed; its burst is its
  // requests. A client may pass up to twice a window's requests across one window edge.
  kFixedWindow,
};

constexpr std::string_view to_string(Algorithm algorithm) noexcept {
  return algorithm == Algorithm::kFixedWindow ? "fixed_window" : "gcra";
}
// "gcra" or "fixed_window"; nullopt for anything else.
constexpr std::optional<Algorithm> parse_algorithm(std::string_view text) noexcept {
  if (text == "gcra") return Algorithm::kGcra;
  if (text == "fixed_window") return Algorithm::kFixedWindow;
  return std::nullopt;
}

}  // namespace sluice

#endif  // SLUICE_WINDOW_HPP_
