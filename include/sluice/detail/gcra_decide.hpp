// Internal: GcraLimiter's decision (sluice/gcra.hpp) — whether a cost fits in every window of a
// key's cell, the Decision it gets, and the cell's advance when it is admitted. The hot path of
// every in-memory GCRA check: whole-ns and fraction parts kept apart so that no product is taken
// unless a window's remaining needs it, and the denial's work kept out of the admission's way.
#ifndef SLUICE_DETAIL_GCRA_DECIDE_HPP_
#define SLUICE_DETAIL_GCRA_DECIDE_HPP_

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/numeric/int128.h"
#include "sluice/decision.hpp"
#include "sluice/detail/gcra_cell.hpp"

namespace sluice::detail {

// TAT + cost·T, exact: whole and fraction parts with carry. A unit cost, the common case, is laid
// out in line: each stacked window would otherwise jump to it and back.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void gcra_advance(std::int64_t& whole, std::uint64_t& fraction,
                                                      const GcraParams& p, std::uint64_t cost) {
  if (ABSL_PREDICT_TRUE(cost == 1)) {
    whole += p.interval_whole;
    fraction += p.interval_fraction;
  } else {
    const absl::uint128 scaled = absl::uint128(cost) * static_cast<std::uint64_t>(p.period);
    whole += static_cast<std::int64_t>(absl::Uint128Low64(scaled / p.requests));
    fraction += absl::Uint128Low64(scaled % p.requests);
  }
  if (fraction >= p.requests) {
    fraction -= p.requests;
    ++whole;
  }
}

// Every window's TAT if a cost is admitted at now, and the first window that denies it. Kept as
// separate arrays of scalars (not TAT pairs) so that compilers keep them in registers instead of
// copying 16-byte pairs through memory.
// Invariant: for every window, TAT − now ≤ burst·T at all times after an admission, so a peek
// (cost 0) is always admitted.
template <std::size_t N>
struct GcraStep {
  std::array<std::int64_t, N> ahead{};      // next TAT − now, whole ns (≥ 0)
  std::array<std::uint64_t, N> fraction{};  // next TAT's fraction, in 1/requests ns
  std::size_t first_denied = N;             // N: every window admits
};

template <std::size_t N>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline GcraStep<N> gcra_step(const GcraParams* params,
                                                          const GcraCell<N>& cell, std::int64_t now,
                                                          std::uint64_t cost) {
  GcraStep<N> s;
  std::uint32_t denied = 0;  // bit i: window i denies
  // The windows' work is independent: unrolled, it runs side by side in registers.
#pragma GCC unroll 4
  for (std::size_t i = 0; i < N; ++i) {
    const GcraParams& p = params[i];
    std::int64_t whole = cell.tat[i].whole;
    std::uint64_t fraction = cell.tat[i].fraction;
    if (whole < now || (whole == now && fraction == 0)) {
      whole = now;
      fraction = 0;
    }
    gcra_advance(whole, fraction, p, cost);
    s.ahead[i] = whole - now;
    s.fraction[i] = fraction;
    // (ahead·requests + fraction ≤ burst·period), both fractions being below requests.
    const bool admits = s.ahead[i] < p.tolerance_whole ||
                        (s.ahead[i] == p.tolerance_whole && fraction <= p.tolerance_fraction);
    denied |= static_cast<std::uint32_t>(!admits) << i;
  }
  if (denied != 0) s.first_denied = static_cast<std::size_t>(std::countr_zero(denied));
  return s;
}

template <std::size_t N>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void gcra_commit(GcraCell<N>& cell, const GcraStep<N>& s,
                                                     std::int64_t now) {
  // The windows' work is independent: unrolled, it runs side by side in registers.
#pragma GCC unroll 4
  for (std::size_t i = 0; i < N; ++i) {
    cell.tat[i].whole = now + s.ahead[i];
    cell.tat[i].fraction = s.fraction[i];
  }
}

// Reserves `cost` iff every window admits it; no decision fields.
template <std::size_t N>
bool gcra_admit(const GcraParams* params, GcraCell<N>& cell, std::int64_t now, std::uint64_t cost) {
  const GcraStep<N> s = gcra_step(params, cell, now, cost);
  if (s.first_denied != N) return false;
  gcra_commit(cell, s, now);
  return true;
}

// The requests window `p` has left after an admission that leaves its TAT `ahead` + `fraction`
// ns ahead of now (within the tolerance): remaining() as burst − ceil(scaled distance / period)
// (burst·period is a multiple of period), by multiplication: the quotient is at most the burst.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline std::uint64_t remaining_after(const GcraParams& p,
                                                                  std::int64_t ahead,
                                                                  std::uint64_t fraction) {
  const absl::uint128 distance =
      absl::uint128(static_cast<std::uint64_t>(ahead)) * p.requests + fraction;
  return p.burst - p.by_period.divide_wide(distance + (p.by_period.divisor() - 1));
}

// Whether window `p`, its TAT `ahead` + `fraction` ns ahead of now after an admission, has at
// least `least` requests left: its scaled distance ahead·requests + fraction is at most
// (burst − least)·period. Exact. The binding-window choice asks it of every window but the first,
// and computes remaining_after only for a window that has fewer left, so it is decided in whole
// nanoseconds against (burst − least)·interval_whole, with one 64-bit product (at most
// burst·T ≤ 2^60 ns); only a distance beyond that by a whole ns, when T is not a whole number of
// ns, takes the 128-bit products.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool has_at_least(const GcraParams& p, std::int64_t ahead,
                                                      std::uint64_t fraction, std::uint64_t least) {
  if (least > p.burst) return false;
  const std::uint64_t spare = p.burst - least;
  const auto spare_whole =
      static_cast<std::int64_t>(spare * static_cast<std::uint64_t>(p.interval_whole));
  // Below spare_whole, distance < spare_whole·requests ≤ spare·period; at it, only the fractions
  // are left to compare (spare ≤ 2^32, interval_fraction < 2^32: the product fits 64 bits).
  if (ahead < spare_whole) return true;
  if (ahead == spare_whole) return fraction <= spare * p.interval_fraction;
  if (p.interval_fraction == 0) return false;
  const absl::uint128 distance =
      absl::uint128(static_cast<std::uint64_t>(ahead)) * p.requests + fraction;
  return distance <= absl::uint128(spare) * static_cast<std::uint64_t>(p.period);
}

// The denial: nothing changes; `cell` is the key's state as it stands. Writes its decision into
// `out`. Out of line, so that the admitted path below stays short.
template <std::size_t N>
ABSL_ATTRIBUTE_NOINLINE void gcra_deny(const GcraParams* params, const GcraCell<N>& cell,
                                       std::int64_t now, std::uint64_t cost, Decision& out) {
  const GcraStep<N> s = gcra_step(params, cell, now, cost);
  // Wait until every denying window admits this cost: for window i,
  // ceil((scaled distance − tolerance) / requests).
  std::int64_t wait = 0;
  for (std::size_t i = s.first_denied; i < N; ++i) {
    const GcraParams& p = params[i];
    const std::int64_t over = s.ahead[i] - p.tolerance_whole;
    if (over > 0 || (over == 0 && s.fraction[i] > p.tolerance_fraction)) {
      wait = std::max(wait, over + (s.fraction[i] > p.tolerance_fraction ? 1 : 0));
    }
  }
  // The binding window's state as it stands: its TAT's distance ahead of now (0 if past).
  const std::size_t b = s.first_denied;
  const GcraParams& p = params[b];
  const GcraTat& tat = cell.tat[b];
  const bool ahead_of_now = tat.whole >= now;
  const std::int64_t held = ahead_of_now ? tat.whole - now : 0;
  const std::uint64_t held_fraction = ahead_of_now ? tat.fraction : 0;
  out.reason = Reason::kQuotaExceeded;
  out.limit = p.burst;
  // A key in debt (a settled charge or a reservation ahead of now) has nothing left.
  const bool in_debt = held > p.tolerance_whole ||
                       (held == p.tolerance_whole && held_fraction > p.tolerance_fraction);
  out.remaining = in_debt ? 0 : remaining(p, held, held_fraction);
  out.retry_after = std::chrono::nanoseconds{wait};
  out.reset_after = std::chrono::nanoseconds{held + (held_fraction != 0 ? 1 : 0)};
  out.binding_window = b;
}

// A TAT rounded up to the nanosecond.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline std::int64_t gcra_tat_ceil(const GcraTat& t) {
  return t.whole + (t.fraction != 0 ? 1 : 0);
}

// Whether every window of `cell` starts afresh at now (its TAT not ahead of now): the state that
// steady traffic below every window's rate finds on each check. Stops at the first window ahead
// of now, so that a key under load, whose shortest window is ahead, pays for one window here.
// Two comparisons, not the rounded-up TAT against now: that is a comparison fewer but made one
// window's check 0.5 ns slower on the bench host.
template <std::size_t N>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool gcra_all_fresh(const GcraCell<N>& cell, std::int64_t now) {
#pragma GCC unroll 4
  for (std::size_t i = 0; i < N; ++i) {
    const GcraTat& t = cell.tat[i];
    if (t.whole > now || (t.whole == now && t.fraction != 0)) return false;
  }
  return true;
}

// now + cost·T for a window that starts afresh at now: its fraction starts at 0, so no carry.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline GcraTat gcra_fresh_tat(const GcraParams& p, std::int64_t now,
                                                           std::uint64_t cost) {
  if (cost == 1) return GcraTat{now + p.interval_whole, p.interval_fraction};
  const absl::uint128 scaled = absl::uint128(cost) * static_cast<std::uint64_t>(p.period);
  return GcraTat{now + static_cast<std::int64_t>(absl::Uint128Low64(scaled / p.requests)),
                 absl::Uint128Low64(scaled % p.requests)};
}

// gcra_decide for a cell whose windows all start afresh, when `cost` fits the smallest burst: every
// window admits and then has exactly burst − cost left (its distance is cost·T), so the binding
// window is the one with the smallest burst (ties to the shorter period) and no product is taken.
// Returns false, writing nothing, when `cost` exceeds that burst.
template <std::size_t N>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool gcra_decide_fresh(const GcraParams* params,
                                                           GcraCell<N>& cell, std::int64_t now,
                                                           std::uint64_t cost, bool commit_admitted,
                                                           Decision& out) {
  std::size_t binding = 0;
#pragma GCC unroll 4
  for (std::size_t i = 1; i < N; ++i) {
    if (params[i].burst < params[binding].burst) binding = i;
  }
  const GcraParams& p = params[binding];
  if (cost > p.burst) return false;
  const GcraTat next = gcra_fresh_tat(p, now, cost);
  if (commit_admitted && cost != 0) {
#pragma GCC unroll 4
    for (std::size_t i = 0; i < N; ++i) cell.tat[i] = gcra_fresh_tat(params[i], now, cost);
  }
  out.reason = Reason::kAllowed;
  out.limit = p.burst;
  out.remaining = p.burst - cost;
  out.retry_after = std::chrono::nanoseconds{0};
  out.reset_after = std::chrono::nanoseconds{gcra_tat_ceil(next) - now};
  out.binding_window = binding;
  return true;
}

// Writes the decision for `cell` at `now` into `out`, field by field (no Decision temporary is
// copied); the cell advances in every window iff all admit and `commit_admitted`. The binding
// window of an admission is the one with the least remaining (ties to the shorter period); only
// it gets a reset_after.
// One pass over the windows, each window's new TAT written straight into the cell (which the
// shard lock holds exclusively) and put back from a copy when the request is denied or only
// reported: no per-window arrays to keep in registers or on the stack.
template <std::size_t N>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void gcra_decide(const GcraParams* params, GcraCell<N>& cell,
                                                     std::int64_t now, std::uint64_t cost,
                                                     bool commit_admitted, Decision& out) {
  if (gcra_all_fresh(cell, now) &&
      gcra_decide_fresh(params, cell, now, cost, commit_admitted, out)) {
    return;
  }
  const GcraCell<N> before = cell;
  std::uint32_t denied = 0;  // bit i: window i denies
  std::size_t binding = 0;
  std::uint64_t least = 0;
  std::int64_t reset_after = 0;
  // The windows' work is independent: unrolled, it runs side by side in registers.
#pragma GCC unroll 4
  for (std::size_t i = 0; i < N; ++i) {
    const GcraParams& p = params[i];
    std::int64_t whole = before.tat[i].whole;
    std::uint64_t fraction = before.tat[i].fraction;
    if (whole < now || (whole == now && fraction == 0)) {
      whole = now;
      fraction = 0;
    }
    gcra_advance(whole, fraction, p, cost);
    cell.tat[i] = GcraTat{whole, fraction};
    const std::int64_t ahead = whole - now;
    // (ahead·requests + fraction ≤ burst·period), both fractions being below requests.
    if (ahead < p.tolerance_whole ||
        (ahead == p.tolerance_whole && fraction <= p.tolerance_fraction)) {
      // Only a window with fewer left than the least so far needs its remaining computed.
      if (i == 0 || !has_at_least(p, ahead, fraction, least)) {
        least = remaining_after(p, ahead, fraction);
        binding = i;
        // ceil(scaled distance / requests): the fraction is below one request's share.
        reset_after = ahead + (fraction != 0 ? 1 : 0);
      }
    } else {
      denied |= std::uint32_t{1} << i;
    }
  }
  if (denied != 0 || !commit_admitted || cost == 0) cell = before;
  if (denied != 0) {
    gcra_deny(params, before, now, cost, out);
    return;
  }
  out.reason = Reason::kAllowed;
  out.limit = params[binding].burst;
  out.remaining = least;
  out.retry_after = std::chrono::nanoseconds{0};
  out.reset_after = std::chrono::nanoseconds{reset_after};
  out.binding_window = binding;
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_GCRA_DECIDE_HPP_
