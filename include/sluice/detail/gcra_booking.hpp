// Internal: GcraLimiter's exact booking arithmetic (sluice/gcra.hpp) — reservations, estimated
// checks and their settlement. Off the hot path, so in signed 128-bit integers: a window's TAT
// scaled by its requests, TAT·requests + fraction (sluice/detail/gcra_carry.hpp).
#ifndef SLUICE_DETAIL_GCRA_BOOKING_HPP_
#define SLUICE_DETAIL_GCRA_BOOKING_HPP_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/numeric/int128.h"
#include "sluice/detail/gcra_carry.hpp"
#include "sluice/detail/gcra_cell.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/key.hpp"

namespace sluice::detail {

// What a reservation or an estimated check added to each window of one key, kept to give it back
// exactly: the window's TAT right after the booking, and the amount the booking added (both
// scaled by the window's requests).
struct GcraBooking {
  KeyDigest digest{};
  std::uint64_t forgotten = 0;  // the shard's forgotten count when booked (see give_back)
  std::array<absl::int128, kMaxWindows> booked{};
  std::array<absl::int128, kMaxWindows> added{};
};

// cost·T scaled by requests: cost·period.
inline absl::int128 cost_scaled(const GcraParams& p, std::uint64_t cost) {
  return absl::int128(cost) * absl::int128(static_cast<std::uint64_t>(p.period));
}

// Gives back up to `amount[i]` in each window, only out of the part of `booking`'s TAT still
// ahead of now, and never past a full bucket (a TAT of now).
template <std::size_t N>
void give_back(const GcraParams* params, GcraCell<N>& cell, std::int64_t now,
               const GcraBooking& booking, const std::array<absl::int128, kMaxWindows>& amount) {
  for (std::size_t i = 0; i < N; ++i) {
    const std::uint64_t r = params[i].requests;
    const absl::int128 now_scaled = absl::int128(now) * absl::int128(r);
    const absl::int128 current = scaled_tat(cell.tat[i], r);
    const absl::int128 ahead = booking.booked[i] - now_scaled;
    if (current <= now_scaled || ahead <= 0) continue;
    const absl::int128 back = std::min(amount[i], ahead);
    cell.tat[i] = unscaled_tat(std::max(current - back, now_scaled), r);
  }
}

// Charges `extra` units in every window without an admission test, saturating at
// kMaxBookedAhead ahead of now.
template <std::size_t N>
void charge(const GcraParams* params, GcraCell<N>& cell, std::int64_t now, std::uint64_t extra) {
  for (std::size_t i = 0; i < N; ++i) {
    const GcraParams& p = params[i];
    const absl::int128 r(p.requests);
    const absl::int128 from = std::max(scaled_tat(cell.tat[i], p.requests), absl::int128(now) * r);
    const absl::int128 limit = (absl::int128(now) + kMaxBookedAhead) * r;
    cell.tat[i] = unscaled_tat(std::min(from + cost_scaled(p, extra), limit), p.requests);
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_GCRA_BOOKING_HPP_
