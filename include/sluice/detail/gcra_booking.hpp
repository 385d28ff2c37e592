// Internal: GcraLimiter's exact booking arithmetic (sluice/gcra.hpp) — reservations, estimated
// checks and their settlement, and carrying a key's state into changed windows. Off the hot path,
// so in signed 128-bit integers: a window's TAT scaled by its requests, TAT·requests + fraction.
#ifndef SLUICE_DETAIL_GCRA_BOOKING_HPP_
#define SLUICE_DETAIL_GCRA_BOOKING_HPP_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/numeric/int128.h"
#include "sluice/detail/gcra_cell.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/key.hpp"

namespace sluice::detail {

// A TAT as one scaled integer (|value| < 2^95), and back.
inline absl::int128 scaled_tat(const GcraTat& t, std::uint64_t requests) {
  return absl::int128(t.whole) * absl::int128(requests) + absl::int128(t.fraction);
}
inline absl::int128 floor_div(absl::int128 a, std::uint64_t b) {
  const absl::int128 d(b);
  absl::int128 q = a / d;  // truncates toward zero
  if (q * d > a) --q;
  return q;
}
inline absl::int128 ceil_div(absl::int128 a, std::uint64_t b) { return -floor_div(-a, b); }
inline GcraTat unscaled_tat(absl::int128 scaled, std::uint64_t requests) {
  const absl::int128 whole = floor_div(scaled, requests);
  return {static_cast<std::int64_t>(whole),
          static_cast<std::uint64_t>(scaled - whole * absl::int128(requests))};
}

// The farthest ahead of now a booking may put a key's TAT: 2^61 ns (73 years). Reservations past
// it are refused and charges saturate at it, so no TAT can leave the int64 range.
inline constexpr std::int64_t kMaxBookedAhead = std::int64_t{1} << 61;

// --- Carrying a key's state into changed windows (a reload that changes a rule's rates, bursts
// or window lengths): the key keeps the share of its bucket it had spent, never more room.

// The distance ahead of now (scaled by `to.requests`) that a window of `to` holds for a key whose
// window of `from` holds `ahead` > 0 (scaled by `from.requests`): the same spent share of the
// bucket, ahead/(burst·T) of `from` becomes that share of `to`'s burst·T, rounded up to the
// nanosecond (toward less room) and never past a full bucket; a spent bucket stays spent, and a
// key in debt (beyond a full bucket) keeps a full bucket plus the same debt in nanoseconds. In
// whole nanoseconds so that every product fits in 128 bits (each factor is below 2^62).
inline absl::int128 carried_ahead(absl::int128 ahead, const GcraParams& from,
                                  const GcraParams& to) {
  const absl::int128 full_from(from.tolerance);  // burst·period
  const absl::int128 full_to(to.tolerance);
  if (ahead >= full_from) {
    const absl::int128 debt_ns =
        std::min(ceil_div(ahead - full_from, from.requests), absl::int128(kMaxBookedAhead));
    return full_to + debt_ns * absl::int128(to.requests);
  }
  const absl::int128 ahead_ns = ceil_div(ahead, from.requests);
  const absl::int128 full_from_ns = floor_div(full_from, from.requests);
  if (ahead_ns >= full_from_ns) return full_to;  // spent, up to rounding
  const absl::int128 full_to_ns = ceil_div(full_to, to.requests);
  const absl::int128 carried_ns =
      ceil_div(ahead_ns * full_to_ns, absl::Uint128Low64(absl::uint128(full_from_ns)));
  return std::min(carried_ns * absl::int128(to.requests), full_to);
}

// The TAT of a window of `to` for a key whose window of `from` had TAT `tat` at `now`: a fresh
// TAT if that window had its whole bucket, else the carried distance ahead of now (capped at
// kMaxBookedAhead).
inline GcraTat carried_tat(const GcraTat& tat, const GcraParams& from, const GcraParams& to,
                           std::int64_t now) {
  const absl::int128 ahead =
      scaled_tat(tat, from.requests) - absl::int128(now) * absl::int128(from.requests);
  if (ahead <= 0) return GcraTat{};
  const absl::int128 cap = absl::int128(kMaxBookedAhead) * absl::int128(to.requests);
  const absl::int128 carried = std::min(carried_ahead(ahead, from, to), cap);
  return unscaled_tat(absl::int128(now) * absl::int128(to.requests) + carried, to.requests);
}

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
