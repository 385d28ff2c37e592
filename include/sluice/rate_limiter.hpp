// sluice/rate_limiter.hpp — the RateLimiter concept shared by every limiter.
//
// Anything with `check(std::string_view key, std::uint64_t cost) -> absl::StatusOr<Decision>`
// models it: the in-memory `GcraLimiter` and `FixedWindowLimiter`, and `redis::RedisGcraLimiter`.
// Generic code (the policy engine, a middleware) is written once against the concept:
//
//   template <sluice::RateLimiter L>
//   bool admit(L& limiter, std::string_view key) {
//     auto d = limiter.check(key, 1);
//     return !d.ok() /* fail-open */ || d->allowed();
//   }
//
// Errors are `absl::Status`: InvalidArgument for a bad cost, Unavailable or DeadlineExceeded from
// a remote backend. No limiter retries on its own.
#ifndef SLUICE_RATE_LIMITER_HPP_
#define SLUICE_RATE_LIMITER_HPP_

#include <concepts>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "sluice/decision.hpp"

namespace sluice {

template <class L>
concept RateLimiter = requires(L& l, std::string_view key, std::uint64_t cost) {
  { l.check(key, cost) } -> std::same_as<absl::StatusOr<sluice::Decision>>;
};

}  // namespace sluice

#endif  // SLUICE_RATE_LIMITER_HPP_
