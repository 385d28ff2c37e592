// Internal: a GCRA window's TAT as one scaled integer (TAT·requests + fraction, signed 128 bits),
// and carrying a key's state into changed windows (a reload that changes a rule's rates, bursts
// or window lengths): the key keeps the share of its bucket it had spent, never more room. The
// in-memory limiter (sluice/gcra.hpp) and the Redis client (sluice/redis/detail/carry.hpp) carry
// by these rules; neither needs a store for it.
//
//   const GcraTat t = carried_tat(old_tat, old_params, new_params, now);
//
// Thread-safety: pure functions.
#ifndef SLUICE_DETAIL_GCRA_CARRY_HPP_
#define SLUICE_DETAIL_GCRA_CARRY_HPP_

#include <algorithm>
#include <cstdint>

#include "absl/numeric/int128.h"
#include "sluice/detail/gcra_cell.hpp"

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

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_GCRA_CARRY_HPP_
