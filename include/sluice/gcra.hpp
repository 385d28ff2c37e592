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
  Divider by_period;        // divides by period without a hardware division
  Divider by_requests;      // divides by requests likewise
};

// The scaled distance (new_tat − now)·requests of a TAT at or after now.
inline absl::uint128 scaled_ahead(const GcraTat& t, std::int64_t now, std::uint64_t requests) {
  return absl::uint128(static_cast<std::uint64_t>(t.whole - now)) * requests + t.fraction;
}

// floor(a / b) and ceil(a / b), by multiplication when `a` fits 64 bits (the common case).
inline std::uint64_t div_floor(absl::uint128 a, const Divider& b) {
  if (absl::Uint128High64(a) == 0) return b.divide(absl::Uint128Low64(a));
  return absl::Uint128Low64(a / b.divisor());
}
inline std::uint64_t div_ceil(absl::uint128 a, const Divider& b) {
  if (absl::Uint128High64(a) == 0) return b.divide_up(absl::Uint128Low64(a));
  return absl::Uint128Low64((a + (b.divisor() - 1)) / b.divisor());
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
    if (cost > max_cost_) return cost_error(cost);
    const std::int64_t at = now();
    return std::visit(
        [&](auto& store) {
          return store.update(
              store.digest(key), at,
              [&](auto& cell, std::int64_t clamped) { return decide(cell, clamped, cost, true); },
              [&](const StoreFull& full) { return store_full(full); });
        },
        store_);
  }

  StoreStats stats() const {
    return std::visit([](const auto& s) { return s.stats(); }, store_);
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
  // The decision for `cost` at `now`; reserves it iff `commit` and admitted.
  Decision decide_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t now,
                         std::uint64_t cost, bool commit) {
    return std::visit(
        [&](auto& store) {
          return store.update_locked(
              held, d, now,
              [&](auto& cell, std::int64_t clamped) { return decide(cell, clamped, cost, commit); },
              [&](const StoreFull& full) { return store_full(full); });
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
    return detail::GcraParams{.requests = w.requests,
                              .period = w.period.count(),
                              .burst = burst,
                              .interval_whole = static_cast<std::int64_t>(period / w.requests),
                              .interval_fraction = period % w.requests,
                              .tolerance = tolerance,
                              .by_period = detail::Divider(period),
                              .by_requests = detail::Divider(w.requests)};
  }

  absl::Status cost_error(std::uint64_t cost) const {
    std::size_t window = 0;
    while (params_[window].burst >= cost) ++window;
    return detail::cost_error(cost, params_[window].burst, window);
  }

  Decision store_full(const StoreFull& full) const {
    Decision d = detail::store_full_decision(full);
    d.limit = params_[0].burst;
    return d;
  }

  // TAT + cost·T, exact: whole and fraction parts with carry.
  static detail::GcraTat advance(detail::GcraTat base, const detail::GcraParams& p,
                                 std::uint64_t cost) {
    if (cost == 1) {
      base.whole += p.interval_whole;
      base.fraction += p.interval_fraction;
    } else {
      const absl::uint128 scaled = absl::uint128(cost) * static_cast<std::uint64_t>(p.period);
      base.whole += static_cast<std::int64_t>(absl::Uint128Low64(scaled / p.requests));
      base.fraction += absl::Uint128Low64(scaled % p.requests);
    }
    if (base.fraction >= p.requests) {
      base.fraction -= p.requests;
      ++base.whole;
    }
    return base;
  }

  // The decision for `cell` at `now`; the cell advances in every window iff all admit.
  // Invariant: for every window, TAT − now ≤ burst·T at all times after an admission, so a peek
  // (cost 0) is always admitted.
  template <std::size_t N>
  struct Step {
    std::array<detail::GcraTat, N> next{};  // every window's TAT if admitted
    std::array<absl::uint128, N> ahead{};   // (next TAT − now)·requests per window
    std::size_t first_denied = N;           // N: every window admits
  };
  template <std::size_t N>
  Step<N> step(const detail::GcraCell<N>& cell, std::int64_t now, std::uint64_t cost) const {
    Step<N> s;
    for (std::size_t i = 0; i < N; ++i) {
      const detail::GcraParams& p = params_[i];
      detail::GcraTat base = cell.tat[i];
      if (base.whole < now || (base.whole == now && base.fraction == 0)) base = {now, 0};
      s.next[i] = advance(base, p, cost);
      s.ahead[i] = detail::scaled_ahead(s.next[i], now, p.requests);
      if (s.ahead[i] > p.tolerance && s.first_denied == N) s.first_denied = i;
    }
    return s;
  }

  // Reserves `cost` iff every window admits it; no decision fields.
  template <std::size_t N>
  bool admit(detail::GcraCell<N>& cell, std::int64_t now, std::uint64_t cost) const {
    Step<N> s = step(cell, now, cost);
    if (s.first_denied != N) return false;
    cell.tat = s.next;
    return true;
  }

  template <std::size_t N>
  Decision decide(detail::GcraCell<N>& cell, std::int64_t now, std::uint64_t cost,
                  bool commit) const {
    const Step<N> s = step(cell, now, cost);
    const auto& next = s.next;
    const auto& ahead = s.ahead;
    const std::size_t first_denied = s.first_denied;

    if (first_denied == N) {
      if (commit && cost != 0) cell.tat = next;
      const auto [binding, least] = detail::least_remaining(N, [&](std::size_t i) {
        return detail::div_floor(params_[i].tolerance - ahead[i], params_[i].by_period);
      });
      return Decision{.reason = Reason::kAllowed,
                      .limit = params_[binding].burst,
                      .remaining = least,
                      .reset_after = std::chrono::nanoseconds{static_cast<std::int64_t>(
                          detail::div_ceil(ahead[binding], params_[binding].by_requests))},
                      .binding_window = binding};
    }

    // Denied: nothing changes. Wait until every denying window admits this cost.
    std::uint64_t wait = 0;
    for (std::size_t i = first_denied; i < N; ++i) {
      if (ahead[i] > params_[i].tolerance) {
        wait = std::max(wait,
                        detail::div_ceil(ahead[i] - params_[i].tolerance, params_[i].by_requests));
      }
    }
    const detail::GcraParams& p = params_[first_denied];
    const absl::uint128 held = detail::scaled_ahead(
        cell.tat[first_denied].whole >= now ? cell.tat[first_denied] : detail::GcraTat{now, 0}, now,
        p.requests);
    return Decision{.reason = Reason::kQuotaExceeded,
                    .limit = p.burst,
                    .remaining = detail::div_floor(p.tolerance - held, p.by_period),
                    .retry_after = std::chrono::nanoseconds{static_cast<std::int64_t>(wait)},
                    .reset_after = std::chrono::nanoseconds{static_cast<std::int64_t>(
                        detail::div_ceil(held, p.by_requests))},
                    .binding_window = first_denied};
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
