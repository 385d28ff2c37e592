// sluice/fixed_window.hpp — the fixed-window counter limiter, with stacked windows.
//
// A window admits `limit` units per `window`. Windows are anchored per key: the first admitted
// request of an idle key opens a window, and the next window opens with the first admitted
// request after the full duration has elapsed. Stacked windows are atomic as in GcraLimiter: a
// request is admitted only if every window has room, and a denied request consumes nothing.
//
//   using namespace std::chrono_literals;
//   auto limiter = sluice::FixedWindowLimiter<>::create({{.limit = 100, .window = 60s},
//                                                        {.limit = 1000, .window = 24h}});
//   absl::StatusOr<sluice::Decision> d = limiter->check(account_id);
//
// Decision: limit = the binding window's limit; remaining after this request; retry_after = the
// wait until every denying window reopens; reset_after = until the binding window's end (0 for a
// window with nothing counted).
//
// Supported range: 1 ≤ limit ≤ 2^62, 1 ns ≤ window ≤ 2^60 ns, at most kMaxWindows windows.
// Clock readings are saturated to ±2^62 ns and clamped to the latest reading seen.
//
// Operators: `inspect(key)` reports a key's state without consuming (as a cost-0 peek);
// `reset(key)` forgets it.
//
// Thread-safety: `check`, `inspect`, `reset` and `stats` may be called concurrently from any
// threads; each takes one shard lock. Complexity: O(windows) per call, O(1) expected store work.
#ifndef SLUICE_FIXED_WINDOW_HPP_
#define SLUICE_FIXED_WINDOW_HPP_

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/detail/window_ranges.hpp"
#include "sluice/rate_limiter.hpp"
#include "sluice/store.hpp"
#include "sluice/window.hpp"

namespace sluice {

namespace detail {

struct WindowCount {
  std::int64_t end = std::numeric_limits<std::int64_t>::min();  // ns; the window is open before it
  std::uint64_t count = 0;                                      // units admitted in the window
};

template <std::size_t N>
struct FixedWindowCell {
  std::array<WindowCount, N> windows;

  bool idle(std::int64_t now) const noexcept {
    for (const WindowCount& w : windows) {
      if (w.end > now) return false;
    }
    return true;
  }
  // Windows that ended (a fresh one ends at INT64_MIN, as does a window a reload added to a
  // carried key) count 0: their end - now could overflow.
  std::int64_t time_until_fresh(std::int64_t now) const noexcept {
    std::int64_t longest = 0;
    for (const WindowCount& w : windows) {
      if (w.end > now) longest = std::max(longest, w.end - now);
    }
    return longest;
  }
};

}  // namespace detail

template <Clock ClockT = SteadyClock>
class FixedWindowLimiter {
 public:
  // Validates `options` (sluice::validate) and `windows`, and sorts `windows` shortest first
  // (stable). InvalidArgument names the bad value.
  static absl::StatusOr<FixedWindowLimiter> create(std::vector<FixedWindow> windows,
                                                   StoreOptions options = {}, ClockT clock = {}) {
    if (absl::Status s = detail::check_window_count(windows.size()); !s.ok()) return s;
    if (absl::Status s = sluice::validate(options); !s.ok()) return s;
    for (std::size_t i = 0; i < windows.size(); ++i) {
      const std::string path = absl::StrCat("windows[", i, "]");
      if (absl::Status s = detail::check_fixed_window(windows[i], detail::kFixedRange, path);
          !s.ok()) {
        return s;
      }
    }
    std::stable_sort(
        windows.begin(), windows.end(),
        [](const FixedWindow& a, const FixedWindow& b) { return a.window < b.window; });
    FixedWindowLimiter limiter(std::move(clock), options, std::move(windows));
    return limiter;
  }

  // Admits `cost` units for `key` if every window has room; `cost` 0 only reports.
  // InvalidArgument (state untouched) if cost exceeds a window's limit.
  absl::StatusOr<Decision> check(std::string_view key, std::uint64_t cost = 1) {
    if (absl::Status s = validate_cost(cost); !s.ok()) return s;
    const KeyDigest digest = std::visit([&](auto& s) { return s.digest(key); }, store_);
    const std::int64_t now = detail::saturate_time(clock_.now().count());
    return std::visit(
        [&](auto& store) {
          return store.update(
              digest, now,
              [&](auto& cell, std::int64_t clamped) { return decide(cell, clamped, cost); },
              [&](const StoreFull& full) {
                Decision d = detail::store_full_decision(full);
                d.limit = windows_[0].limit;
                return d;
              });
        },
        store_);
  }

  StoreStats stats() const {
    return std::visit([](const auto& s) { return s.stats(); }, store_);
  }

  // --- Operators: inspect and reset one key.

  // The key's state without consuming anything: exactly what `check(key, 0)` reports (cost 0
  // always fits, so reason is kAllowed; remaining = units left in the window with the least left;
  // reset_after = until that window ends, 0 if it has counted nothing; retry_after 0). Stores
  // nothing; clamps the shard's clock like any check.
  Decision inspect(std::string_view key) {
    const std::int64_t now = detail::saturate_time(clock_.now().count());
    return std::visit(
        [&](auto& store) {
          return store.update(
              store.digest(key), now,
              [&](auto& cell, std::int64_t clamped) { return decide(cell, clamped, 0); },
              [&](const StoreFull& full) { return detail::store_full_decision(full); });
        },
        store_);
  }

  // Forgets the key: its next admitted request opens new windows, as for a key never seen, and
  // its room in the store is free at once. O(1).
  void reset(std::string_view key) {
    const std::int64_t now = detail::saturate_time(clock_.now().count());
    std::visit(
        [&](auto& store) {
          store.update_removing_idle(
              store.digest(key), now,
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

  // The windows, shortest first. Decision::binding_window indexes this.
  const std::vector<FixedWindow>& windows() const noexcept { return windows_; }

  // The store's digest seed (a reload's new limiter takes it to carry keys).
  std::uint64_t seed() const {
    return std::visit([](const auto& s) { return s.seed(); }, store_);
  }

  // Carries every live key of `from` into this limiter, which nobody else uses yet. Each window
  // here takes the key's window of `from` with the same length (or, when both have one window,
  // the only one): its count, at most the new limit, and its end, brought forward to at most one
  // new window from now.
  // A key then has no more room than before in any carried window; an added window starts
  // empty. O(from's keys + its store capacity); takes `from`'s shard locks one at a time.
  void carry_from(const FixedWindowLimiter& from) {
    constexpr std::size_t kNone = kMaxWindows;
    const auto source = detail::match_windows(
        windows_.size(), from.windows_.size(), [&](std::size_t i, std::size_t j) {
          return from.windows_[j].window == windows_[i].window;
        });
    const std::int64_t at = std::max(now(), from.now());
    auto carry = [&](auto& cell, const auto& old_cell, std::int64_t clamped) {
      for (std::size_t i = 0; i < windows_.size(); ++i) {
        if (source[i] == kNone || old_cell.windows[source[i]].end <= clamped) continue;
        const detail::WindowCount& old = old_cell.windows[source[i]];
        // At most the new limit: a count above it would leave limit - count negative.
        cell.windows[i] = {std::min(old.end, clamped + windows_[i].window.count()),
                           std::min(old.count, windows_[i].limit)};
      }
      return true;
    };
    std::visit(
        [&](const auto& old_store) {
          std::visit(
              [&](auto& new_store) {
                old_store.for_each_live(at, [&](const KeyDigest& d, const auto& old_cell) {
                  new_store.update(
                      d, at,
                      [&](auto& cell, std::int64_t clamped) {
                        return carry(cell, old_cell, clamped);
                      },
                      [](const StoreFull&) { return false; });
                });
              },
              store_);
        },
        from.store_);
  }

 private:
  // --- Multi-key transactions, for the policy engine's in-memory backend (as GcraLimiter's):
  // every key's shard in one ShardLockSet, held by HeldShardLocks; decide every key without
  // committing, then admit them all only if every key was admitted.
  template <Clock>
  friend class InMemoryBackend;

  absl::Status validate_cost(std::uint64_t cost) const {
    if (cost <= max_cost_) return absl::OkStatus();
    std::size_t window = 0;
    while (windows_[window].limit >= cost) ++window;
    return detail::cost_error(cost, windows_[window].limit, window);
  }
  KeyDigest digest(std::string_view key) const {
    return std::visit([&](const auto& s) { return s.digest(key); }, store_);
  }
  void add_lock(ShardLockSet& locks, const KeyDigest& d) const {
    std::visit([&](const auto& s) { locks.add(s, d); }, store_);
  }
  std::int64_t now() const { return detail::saturate_time(clock_.now().count()); }
  // Takes `cost` iff every window admits it.
  bool admit_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t now,
                    std::uint64_t cost) {
    return std::visit(
        [&](auto& store) {
          return store.update_locked(
              held, d, now,
              [&](auto& cell, std::int64_t clamped) {
                return decide(cell, clamped, cost).allowed();
              },
              [](const StoreFull&) { return false; });
        },
        store_);
  }
  // Writes the decision for `cost` at `now` into `out`; takes it iff `commit` and admitted.
  // Without `commit` an absent key is decided as a fresh one and not inserted.
  void decide_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t now,
                     std::uint64_t cost, bool commit, Decision& out) {
    if (!commit) {
      Decision* const outs[] = {&out};
      decide_in_order_locked(held, d, now, std::span(&cost, 1), outs);
      return;
    }
    std::visit(
        [&](auto& store) {
          out = store.update_locked(
              held, d, now,
              [&](auto& cell, std::int64_t clamped) { return decide(cell, clamped, cost); },
              [&](const StoreFull& full) {
                Decision decision = detail::store_full_decision(full);
                decision.limit = windows_[0].limit;
                return decision;
              });
        },
        store_);
  }

  // Decides `costs[k]` into `*outs[k]` in order at `now`, each after the admitted ones before it,
  // on a copy of the key's cell (detail::decide_in_order_locked): commits nothing.
  void decide_in_order_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t now,
                              std::span<const std::uint64_t> costs,
                              std::span<Decision* const> outs) {
    detail::decide_in_order_locked(store_, held, d, now, costs, outs,
                                   [&](auto& cell, std::int64_t at, std::uint64_t cost,
                                       Decision& out) { out = decide(cell, at, cost); });
  }

  FixedWindowLimiter(ClockT clock, const StoreOptions& options, std::vector<FixedWindow> windows)
      : clock_(std::move(clock)),
        windows_(std::move(windows)),
        store_(detail::make_store<detail::FixedWindowCell>(windows_.size(), options)) {
    for (const FixedWindow& w : windows_) max_cost_ = std::min(max_cost_, w.limit);
  }

  template <std::size_t N>
  Decision decide(detail::FixedWindowCell<N>& cell, std::int64_t now, std::uint64_t cost) const {
    std::array<detail::WindowCount, N> current;  // each window as it stands at `now`
    std::size_t first_denied = N;
    for (std::size_t i = 0; i < N; ++i) {
      current[i] = cell.windows[i];
      if (current[i].end <= now) current[i] = {now + windows_[i].window.count(), 0};
      if (current[i].count + cost > windows_[i].limit && first_denied == N) first_denied = i;
    }
    auto reset_after = [&](std::size_t i, std::uint64_t used) {
      return std::chrono::nanoseconds{used == 0 ? 0 : current[i].end - now};
    };

    if (first_denied == N) {
      for (std::size_t i = 0; i < N; ++i) current[i].count += cost;
      const auto [binding, least] = detail::least_remaining(
          N, [&](std::size_t i) { return windows_[i].limit - current[i].count; });
      if (cost != 0) cell.windows = current;
      return Decision{.reason = Reason::kAllowed,
                      .limit = windows_[binding].limit,
                      .remaining = least,
                      .reset_after = reset_after(binding, current[binding].count),
                      .binding_window = binding};
    }

    std::int64_t wait = 0;
    for (std::size_t i = first_denied; i < N; ++i) {
      if (current[i].count + cost > windows_[i].limit) wait = std::max(wait, current[i].end - now);
    }
    const std::size_t b = first_denied;
    return Decision{.reason = Reason::kQuotaExceeded,
                    .limit = windows_[b].limit,
                    .remaining = windows_[b].limit - current[b].count,
                    .retry_after = std::chrono::nanoseconds{wait},
                    .reset_after = reset_after(b, current[b].count),
                    .binding_window = b};
  }

  ClockT clock_;
  std::vector<FixedWindow> windows_;
  std::uint64_t max_cost_ = std::numeric_limits<std::uint64_t>::max();
  detail::StoreVariant<detail::FixedWindowCell> store_;
};

static_assert(RateLimiter<FixedWindowLimiter<SteadyClock>>);
static_assert(RateLimiter<FixedWindowLimiter<ManualClock>>);

}  // namespace sluice

#endif  // SLUICE_FIXED_WINDOW_HPP_
