// sluice/redis/detail/booking_args.hpp — the booking script's arguments, built from exact 128-bit
// integers (layout in sluice/redis/detail/booking_script.hpp), and what a booking keeps to give
// back later. Internal: the client (Cluster compensation) and booking.hpp use them.
//
// Complexity: O(windows). Thread-safety: pure functions and plain values.
#ifndef SLUICE_REDIS_DETAIL_BOOKING_ARGS_HPP_
#define SLUICE_REDIS_DETAIL_BOOKING_ARGS_HPP_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "sluice/redis/detail/exact_double.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/window.hpp"

namespace sluice::redis::detail {

using BookingInts = std::vector<std::uint64_t>;

// Most a reply's amount may be: a window's debt is bounded by 2^52 ns in Redis.
inline constexpr std::uint64_t kMaxAmountNs = std::uint64_t{1} << 52;
// An instant no give-back passes (a refund may come at any time).
inline constexpr std::chrono::nanoseconds kNeverPasses{std::numeric_limits<std::int64_t>::max()};

inline absl::Status malformed_booking_reply() {
  return absl::InternalError("sluice::redis: booking script reply of unexpected shape");
}

// Per window: an amount·T as (ns, frac), then burst·T and requests (the scripts' layout).
inline std::string booking_params(
    const Limit& limit, std::span<const std::pair<std::uint64_t, std::uint64_t>> amounts) {
  std::string p;
  for (std::size_t i = 0; i < amounts.size(); ++i) {
    const GcraWindow& w = limit.windows()[i];
    const absl::uint128 burst =
        absl::uint128(w.burst) * static_cast<std::uint64_t>(w.period.count());
    append_double(p, amounts[i].first);
    append_double(p, amounts[i].second);
    append_double(p, absl::Uint128Low64(burst / w.requests));
    append_double(p, absl::Uint128Low64(burst % w.requests));
    append_double(p, w.requests);
  }
  return p;
}

// `cost`·T per window, saturated at 2^52 ns.
inline std::string booking_params(const Limit& limit, std::uint64_t cost) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> amounts;
  for (const GcraWindow& w : limit.windows()) {
    const absl::uint128 scaled = absl::uint128(cost) * static_cast<std::uint64_t>(w.period.count());
    const bool saturated = scaled / w.requests >= kMaxAmountNs;
    amounts.emplace_back(saturated ? kMaxAmountNs : absl::Uint128Low64(scaled / w.requests),
                         saturated ? 0 : absl::Uint128Low64(scaled % w.requests));
  }
  return booking_params(limit, amounts);
}

// A give-back's extra argument: the reset count the booking saw, the last instant it may give
// back at, and each window's booked TAT (scaled: ns × requests + fraction).
inline std::string give_back_extra(const Limit& limit, std::uint64_t serial,
                                   std::chrono::nanoseconds until,
                                   std::span<const absl::uint128> tats) {
  std::string x;
  append_double(x, serial);
  const auto time = [&](std::uint64_t t) {
    append_double(x, std::min<std::uint64_t>(t / kNanosPerSecond, 10'000'000'000));
    append_double(x, t / kNanosPerSecond > 10'000'000'000 ? 0 : t % kNanosPerSecond);
  };
  time(static_cast<std::uint64_t>(until.count()));
  for (std::size_t i = 0; i < tats.size(); ++i) {
    const std::uint64_t r = limit.windows()[i].requests;
    time(absl::Uint128Low64(tats[i] / r));
    append_double(x, absl::Uint128Low64(tats[i] % r));
  }
  return x;
}

// What an admitted estimated check booked, to settle it later.
struct Receipt {
  std::string key;                  // the Redis key (a digest, never the caller's key)
  std::vector<absl::uint128> tats;  // per window, scaled
  std::uint64_t serial = 0;         // the key's reset count when booked
  std::uint64_t estimate = 0;
};

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_BOOKING_ARGS_HPP_
