// sluice/gcra.hpp — the GCRA (generic cell rate algorithm) limiter, with stacked windows.
//
// A window admits `requests` per `period` with a bucket of `burst` (default: `requests`). A key's
// state is one theoretical arrival time (TAT) per window; a request of cost c is admitted iff,
// in every window, max(TAT, now) + c·T − now ≤ burst·T, where T = period / requests is the
// emission interval. Stacked windows are atomic: the request is admitted only if every window
// admits it, and a denied request changes nothing in any window.
//
//   using namespace std::chrono_literals;
//   auto limiter = sluice::GcraLimiter<>::create({{.requests = 10, .period = 1s, .burst = 20},
//                                                 {.requests = 600, .period = 60s}});
//   if (!limiter.ok()) return limiter.status();  // InvalidArgument naming the bad value
//   absl::StatusOr<sluice::Decision> d = limiter->check(client_ip);      // cost 1
//   absl::StatusOr<sluice::Decision> peek = limiter->check(client_ip, 0);  // no state change
//
// Exactness: TATs are kept as whole nanoseconds plus a fraction in units of 1/requests ns, and
// every comparison is done scaled by `requests` in 128-bit integers, so 3 per second admits at
// exactly ceil(k·10⁹/3) ns forever, with no drift and no floating point. retry_after and
// reset_after are rounded up to the nanosecond: waiting exactly retry_after always suffices.
//
// Supported range (checked by `create`, so that no product can overflow):
//   1 ≤ requests ≤ 2^32, 1 ns ≤ period ≤ 2^55 ns (≈ 417 days), 1 ≤ burst ≤ 2^32,
//   burst·period/requests ≤ 2^60 ns, at most kMaxWindows windows. Clock readings are saturated to
//   ±2^62 ns; a reading earlier than one already seen is clamped to it.
//
// Thread-safety: `check` and `stats` may be called concurrently from any threads; each check
// takes one shard lock. Complexity: O(windows) per check, O(1) expected store work.
#ifndef SLUICE_GCRA_HPP_
#define SLUICE_GCRA_HPP_

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/detail/divider.hpp"
#include "sluice/detail/gcra_math.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/rate_limiter.hpp"
#include "sluice/store.hpp"
#include "sluice/window.hpp"

namespace sluice {

namespace detail {

// A TAT: `whole` ns plus `fraction`/requests ns, 0 ≤ fraction < requests.
struct GcraTat {
  std::int64_t whole = std::numeric_limits<std::int64_t>::min();  // fresh: long past
  std::uint64_t fraction = 0;
};

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
  std::int64_t
      interval_whole;  // T = period / requests = interval_whole + interval_fraction/requests
  std::uint64_t interval_fraction;
  absl::uint128 tolerance;  // burst·T scaled by requests = burst·period
  // burst·T = tolerance_whole + tolerance_fraction/requests ns: a TAT at most this far ahead of
  // now admits, compared without multiplying.
  std::int64_t tolerance_whole;
  std::uint64_t tolerance_fraction;
  Divider by_period;  // divides by period without a hardware division
};

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

}  // namespace detail

template <Clock ClockT = SteadyClock>
class GcraLimiter {
 public:
  // Validates `options` (sluice::validate) and `windows`, and sorts `windows` shortest period
  // first (stable). InvalidArgument names the first bad value, e.g. "windows[1].period must be
  // > 0".
  static absl::StatusOr<GcraLimiter> create(std::vector<GcraWindow> windows,
                                            StoreOptions options = {}, ClockT clock = {}) {
    if (absl::Status s = detail::check_window_count(windows.size()); !s.ok()) return s;
    if (absl::Status s = sluice::validate(options); !s.ok()) return s;
    std::vector<detail::GcraParams> params;
    for (std::size_t i = 0; i < windows.size(); ++i) {
      auto p = validate(windows[i], absl::StrCat("windows[", i, "]"));
      if (!p.ok()) return p.status();
      params.push_back(*p);
      if (windows[i].burst == 0) windows[i].burst = windows[i].requests;
    }
    std::vector<std::size_t> order(windows.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return params[a].period < params[b].period;
    });
    GcraLimiter limiter(std::move(clock), options, windows.size());
    for (std::size_t i : order) {
      limiter.windows_.push_back(windows[i]);
      limiter.params_.push_back(params[i]);
      limiter.max_cost_ = std::min(limiter.max_cost_, params[i].burst);
    }
    return limiter;
  }

  // Admits a request of `cost` units for `key` if every window has room, reserving it; `cost` 0
  // only reports. InvalidArgument (state untouched) if cost exceeds a window's burst.
  absl::StatusOr<Decision> check(std::string_view key, std::uint64_t cost = 1) {
    // One named result on every path, so that it is constructed in the caller's slot (NRVO) and
    // the decision is written there field by field, never copied.
    absl::StatusOr<Decision> result(absl::in_place);
    if (cost > max_cost_) {
      result = cost_error(cost);
      return result;
    }
    const std::int64_t at = now();
    Decision& out = *result;
    std::visit(
        [&](auto& store) {
          store.update(
              store.digest(key), at,
              [&](auto& cell, std::int64_t clamped) {
                decide(cell, clamped, cost, true, out);
                return true;
              },
              [&](const StoreFull& full) {
                store_full(full, out);
                return false;
              });
        },
        store_);
    return result;
  }

  StoreStats stats() const {
    return std::visit([](const auto& s) { return s.stats(); }, store_);
  }

  // --- Operators: inspect and reset one key. Both may be called concurrently with `check`;
  // each takes one shard lock, O(windows).

  // The key's state without consuming anything: exactly what `check(key, 0)` reports (cost 0
  // always fits, so reason is kAllowed; remaining = units a request could take now from the
  // window with the least left, i.e. a request of cost c passes iff c ≤ remaining of every
  // window; reset_after = until that window is full again; retry_after 0). A key never seen, or
  // idle, reports every window full. Stores nothing; clamps the shard's clock like any check.
  Decision inspect(std::string_view key) {
    const std::int64_t at = now();
    Decision out;
    std::visit(
        [&](auto& store) {
          store.update(
              store.digest(key), at,
              [&](auto& cell, std::int64_t clamped) {
                decide(cell, clamped, 0, false, out);
                return false;
              },
              [&](const StoreFull& full) {  // unreachable: an inspected new key stays idle
                store_full(full, out);
                return false;
              });
        },
        store_);
    return out;
  }

  // Forgets the key: its next request sees every window full, as for a key never seen, and its
  // room in the store is free at once. O(1).
  void reset(std::string_view key) {
    const std::int64_t at = now();
    std::visit(
        [&](auto& store) {
          store.update_removing_idle(
              store.digest(key), at,
              [](auto& cell, std::int64_t) {
                cell = {};
                return true;
              },
              [](const StoreFull&) { return false; });
        },
        store_);
  }

  // Bytes held by the key tables (grows with keys, bounded by the store cap). Lock-free.
  std::size_t memory_bytes() const {
    return std::visit([](const auto& s) { return s.table_bytes(); }, store_);
  }

  // The windows, shortest period first, bursts defaulted. Decision::binding_window indexes this.
  const std::vector<GcraWindow>& windows() const noexcept { return windows_; }
  const ClockT& clock() const noexcept { return clock_; }

 private:
  // --- Multi-key transactions, for the policy engine's in-memory backend: it adds every key's
  // shard to one ShardLockSet, holds them with HeldShardLocks, decides every key without
  // committing, and admits them all only if every key was admitted.
  template <Clock>
  friend class InMemoryBackend;

  absl::Status validate_cost(std::uint64_t cost) const {
    return cost > max_cost_ ? cost_error(cost) : absl::OkStatus();
  }
  KeyDigest digest(std::string_view key) const {
    return std::visit([&](const auto& s) { return s.digest(key); }, store_);
  }
  void add_lock(ShardLockSet& locks, const KeyDigest& d) const {
    std::visit([&](const auto& s) { locks.add(s, d); }, store_);
  }
  // The clock's reading, saturated to the supported range.
  std::int64_t now() const { return detail::saturate_time(clock_.now().count()); }
  // Reserves `cost` iff every window admits it (the cheap second phase).
  bool admit_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t now,
                    std::uint64_t cost) {
    return std::visit(
        [&](auto& store) {
          return store.update_locked(
              held, d, now,
              [&](auto& cell, std::int64_t clamped) { return admit(cell, clamped, cost); },
              [](const StoreFull&) { return false; });
        },
        store_);
  }
  // Writes the decision for `cost` at `now` into `out`; reserves it iff `commit` and admitted.
  void decide_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t now,
                     std::uint64_t cost, bool commit, Decision& out) {
    std::visit(
        [&](auto& store) {
          store.update_locked(
              held, d, now,
              [&](auto& cell, std::int64_t clamped) {
                decide(cell, clamped, cost, commit, out);
                return true;
              },
              [&](const StoreFull& full) {
                store_full(full, out);
                return false;
              });
        },
        store_);
  }

  GcraLimiter(ClockT clock, const StoreOptions& options, std::size_t windows)
      : clock_(std::move(clock)), store_(detail::make_store<detail::GcraCell>(windows, options)) {}

  static absl::StatusOr<detail::GcraParams> validate(const GcraWindow& w, const std::string& path) {
    if (absl::Status s = detail::check_gcra_window(w, path); !s.ok()) return s;
    const std::uint64_t burst = w.burst == 0 ? w.requests : w.burst;
    const auto period = static_cast<std::uint64_t>(w.period.count());
    const absl::uint128 tolerance = absl::uint128(burst) * period;
    return detail::GcraParams{
        .requests = w.requests,
        .period = w.period.count(),
        .burst = burst,
        .interval_whole = static_cast<std::int64_t>(period / w.requests),
        .interval_fraction = period % w.requests,
        .tolerance = tolerance,
        .tolerance_whole = static_cast<std::int64_t>(absl::Uint128Low64(tolerance / w.requests)),
        .tolerance_fraction = absl::Uint128Low64(tolerance % w.requests),
        .by_period = detail::Divider(period)};
  }

  absl::Status cost_error(std::uint64_t cost) const {
    std::size_t window = 0;
    while (params_[window].burst >= cost) ++window;
    return detail::cost_error(cost, params_[window].burst, window);
  }

  void store_full(const StoreFull& full, Decision& out) const {
    out = detail::store_full_decision(full);
    out.limit = params_[0].burst;
  }

  // TAT + cost·T, exact: whole and fraction parts with carry.
  static void advance(std::int64_t& whole, std::uint64_t& fraction, const detail::GcraParams& p,
                      std::uint64_t cost) {
    if (cost == 1) {
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

  // Every window's TAT if `cost` is admitted at `now`, and the first window that denies it.
  // Kept as separate arrays of scalars (not TAT pairs) so that compilers keep them in registers
  // instead of copying 16-byte pairs through memory.
  // Invariant: for every window, TAT − now ≤ burst·T at all times after an admission, so a peek
  // (cost 0) is always admitted.
  template <std::size_t N>
  struct Step {
    std::array<std::int64_t, N> ahead{};      // next TAT − now, whole ns (≥ 0)
    std::array<std::uint64_t, N> fraction{};  // next TAT's fraction, in 1/requests ns
    std::size_t first_denied = N;             // N: every window admits
  };
  template <std::size_t N>
  Step<N> step(const detail::GcraCell<N>& cell, std::int64_t now, std::uint64_t cost) const {
    Step<N> s;
    for (std::size_t i = 0; i < N; ++i) {
      const detail::GcraParams& p = params_[i];
      std::int64_t whole = cell.tat[i].whole;
      std::uint64_t fraction = cell.tat[i].fraction;
      if (whole < now || (whole == now && fraction == 0)) {
        whole = now;
        fraction = 0;
      }
      advance(whole, fraction, p, cost);
      s.ahead[i] = whole - now;
      s.fraction[i] = fraction;
      // (ahead·requests + fraction ≤ burst·period), both fractions being below requests.
      const bool admits = s.ahead[i] < p.tolerance_whole ||
                          (s.ahead[i] == p.tolerance_whole && fraction <= p.tolerance_fraction);
      if (!admits && s.first_denied == N) s.first_denied = i;
    }
    return s;
  }

  template <std::size_t N>
  static void commit(detail::GcraCell<N>& cell, const Step<N>& s, std::int64_t now) {
    for (std::size_t i = 0; i < N; ++i) {
      cell.tat[i].whole = now + s.ahead[i];
      cell.tat[i].fraction = s.fraction[i];
    }
  }

  // Reserves `cost` iff every window admits it; no decision fields.
  template <std::size_t N>
  bool admit(detail::GcraCell<N>& cell, std::int64_t now, std::uint64_t cost) const {
    const Step<N> s = step(cell, now, cost);
    if (s.first_denied != N) return false;
    commit(cell, s, now);
    return true;
  }

  // Writes the decision for `cell` at `now` into `out`, field by field (no Decision temporary is
  // copied); the cell advances in every window iff all admit and `commit_admitted`.
  template <std::size_t N>
  void decide(detail::GcraCell<N>& cell, std::int64_t now, std::uint64_t cost, bool commit_admitted,
              Decision& out) const {
    const Step<N> s = step(cell, now, cost);
    if (s.first_denied == N) {
      if (commit_admitted && cost != 0) commit(cell, s, now);
      const auto [binding, least] = detail::least_remaining(N, [&](std::size_t i) {
        return detail::remaining(params_[i], s.ahead[i], s.fraction[i]);
      });
      out.reason = Reason::kAllowed;
      out.limit = params_[binding].burst;
      out.remaining = least;
      out.retry_after = std::chrono::nanoseconds{0};
      // ceil(scaled distance / requests): the fraction is below one request's share.
      out.reset_after =
          std::chrono::nanoseconds{s.ahead[binding] + (s.fraction[binding] != 0 ? 1 : 0)};
      out.binding_window = binding;
      return;
    }

    // Denied: nothing changes. Wait until every denying window admits this cost: for window i,
    // ceil((scaled distance − tolerance) / requests).
    std::int64_t wait = 0;
    for (std::size_t i = s.first_denied; i < N; ++i) {
      const detail::GcraParams& p = params_[i];
      const std::int64_t over = s.ahead[i] - p.tolerance_whole;
      if (over > 0 || (over == 0 && s.fraction[i] > p.tolerance_fraction)) {
        wait = std::max(wait, over + (s.fraction[i] > p.tolerance_fraction ? 1 : 0));
      }
    }
    // The binding window's state as it stands: its TAT's distance ahead of now (0 if past).
    const std::size_t b = s.first_denied;
    const detail::GcraTat& tat = cell.tat[b];
    const bool ahead_of_now = tat.whole >= now;
    const std::int64_t held = ahead_of_now ? tat.whole - now : 0;
    const std::uint64_t held_fraction = ahead_of_now ? tat.fraction : 0;
    out.reason = Reason::kQuotaExceeded;
    out.limit = params_[b].burst;
    out.remaining = detail::remaining(params_[b], held, held_fraction);
    out.retry_after = std::chrono::nanoseconds{wait};
    out.reset_after = std::chrono::nanoseconds{held + (held_fraction != 0 ? 1 : 0)};
    out.binding_window = b;
  }

  ClockT clock_;
  std::vector<GcraWindow> windows_;
  std::vector<detail::GcraParams> params_;
  std::uint64_t max_cost_ = std::numeric_limits<std::uint64_t>::max();
  detail::StoreVariant<detail::GcraCell> store_;
};

static_assert(RateLimiter<GcraLimiter<SteadyClock>>);
static_assert(RateLimiter<GcraLimiter<ManualClock>>);

}  // namespace sluice

#endif  // SLUICE_GCRA_HPP_
