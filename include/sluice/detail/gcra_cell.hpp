// Internal: what GcraLimiter (sluice/gcra.hpp) keeps per key and per window — a key's cell of
// theoretical arrival times (TATs) and a window's constants, validated and precomputed once.
#ifndef SLUICE_DETAIL_GCRA_CELL_HPP_
#define SLUICE_DETAIL_GCRA_CELL_HPP_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/detail/divider.hpp"
#include "sluice/detail/window_ranges.hpp"
#include "sluice/window.hpp"

namespace sluice::detail {

// A TAT: `whole` ns plus `fraction`/requests ns, 0 ≤ fraction < requests.
struct GcraTat {
  std::int64_t whole = std::numeric_limits<std::int64_t>::min();  // fresh: long past
  std::uint64_t fraction = 0;
};

// A key's state: one TAT per window, shortest period first. 16·N bytes.
template <std::size_t N>
struct GcraCell {
  std::array<GcraTat, N> tat;

  // Idle iff every TAT ≤ now: the key then behaves exactly like a key never seen.
  bool idle(std::int64_t now) const noexcept {
    for (const GcraTat& t : tat) {
      if (t.whole > now || (t.whole == now && t.fraction != 0)) return false;
    }
    return true;
  }
  std::int64_t time_until_fresh(std::int64_t now) const noexcept {
    std::int64_t longest = 0;
    for (const GcraTat& t : tat) {
      if (t.whole >= now) longest = std::max(longest, t.whole - now + (t.fraction != 0 ? 1 : 0));
    }
    return longest;
  }
};

// A validated window with its constants precomputed for the hot path.
struct GcraParams {
  std::uint64_t requests;
  std::int64_t period;  // ns
  std::uint64_t burst;
  // T = period / requests = interval_whole + interval_fraction/requests ns
  std::int64_t interval_whole;
  std::uint64_t interval_fraction;
  absl::uint128 tolerance;  // burst·T scaled by requests = burst·period
  // burst·T = tolerance_whole + tolerance_fraction/requests ns: a TAT at most this far ahead of
  // now admits, compared without multiplying.
  std::int64_t tolerance_whole;
  std::uint64_t tolerance_fraction;
  Divider by_period;  // divides by period without a hardware division
};

// The window's constants, or InvalidArgument under `path` (kGcraRange).
inline absl::StatusOr<GcraParams> gcra_params(const GcraWindow& w, const std::string& path) {
  if (absl::Status s = check_gcra_window(w, kGcraRange, path); !s.ok()) return s;
  const std::uint64_t burst = w.burst == 0 ? w.requests : w.burst;
  const auto period = static_cast<std::uint64_t>(w.period.count());
  const absl::uint128 tolerance = absl::uint128(burst) * period;
  return GcraParams{
      .requests = w.requests,
      .period = w.period.count(),
      .burst = burst,
      .interval_whole = static_cast<std::int64_t>(period / w.requests),
      .interval_fraction = period % w.requests,
      .tolerance = tolerance,
      .tolerance_whole = static_cast<std::int64_t>(absl::Uint128Low64(tolerance / w.requests)),
      .tolerance_fraction = absl::Uint128Low64(tolerance % w.requests),
      .by_period = Divider(period)};
}

// floor(a / b), by multiplication when `a` fits 64 bits (the common case).
inline std::uint64_t div_floor(absl::uint128 a, const Divider& b) {
  if (absl::Uint128High64(a) == 0) return b.divide(absl::Uint128Low64(a));
  return absl::Uint128Low64(a / b.divisor());
}

// The requests a window has left when its TAT is `ahead` + `fraction`/requests ns after now
// (ahead ≥ 0, within the tolerance): floor((burst·period − scaled distance) / period).
inline std::uint64_t remaining(const GcraParams& p, std::int64_t ahead, std::uint64_t fraction) {
  const absl::uint128 scaled =
      absl::uint128(static_cast<std::uint64_t>(ahead)) * p.requests + fraction;
  return div_floor(p.tolerance - scaled, p.by_period);
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_GCRA_CELL_HPP_
