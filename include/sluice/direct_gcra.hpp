// sluice/direct_gcra.hpp — an unkeyed, lock-free GCRA limiter: one limit for everything.
//
// For a global cap or outbound pacing, where every request draws on the same limit, a keyed
// limiter pays for a hash, a shard lock and a probe it does not need. DirectGcraLimiter keeps
// each window's state, its theoretical arrival time (TAT), in one std::atomic<std::int64_t>
// and decides with the same rules and the same Decision as GcraLimiter does for one key:
// stacked windows that admit atomically, cost, peek (cost 0), and clamping of a clock that goes
// backwards.
//
//   using namespace std::chrono_literals;
//   auto upstream = sluice::DirectGcraLimiter<>::create({{.requests = 100, .period = 1s}});
//   if (!upstream.ok()) return upstream.status();  // InvalidArgument naming the bad value
//   absl::StatusOr<sluice::Decision> d = upstream->check();      // cost 1
//   absl::StatusOr<sluice::Decision> peek = upstream->check(0);  // no state change
//
// How the state fits one word. GcraLimiter keeps a TAT as whole nanoseconds plus a fraction in
// units of 1/requests ns (two words). Here a window's TAT is one integer in units of 1/d ns,
// d = requests / gcd(requests, period), counted from an epoch (the clock reading at creation):
// every TAT the window can reach is a whole number of those units, so the arithmetic stays exact
// (3 per second admits at exactly ceil(k·10⁹/3) ns forever). The price is range: one word holds
// the TAT only for a bounded span of clock readings around the epoch, H = (2^63 − 1 −
// burst·period·d/requests) / d ns, at most 2^62. `create` rejects a window for which H is less
// than 2^58 ns (≈ 9 years): with every period a whole number of seconds that allows any
// requests whose part coprime to 10 is at most 31 or so (1, 2, 3, 7, 10, 600, 1000 per second or
// minute all fit, d = 1 for most); use GcraLimiter for the others. Readings further than H from
// the epoch are saturated to it, as GcraLimiter saturates at ±2^62 ns.
//
// Concurrency. One window: a check loads the word, decides, and an admission publishes the new
// TAT with one compare-and-swap, retried on conflict: lock-free, no lost or extra admission. A
// denial or peek writes nothing. Stacked windows: every window must move together or not at all,
// which one CAS over several 64-bit words cannot do; a lock-free multi-word CAS costs several
// CASes and an allocation per check. So stacked windows use a sequence lock: readers (denials,
// peeks, and the decision phase of an admission) read every word optimistically and retry if a
// writer intervened; an admission CASes the version word from even to odd, stores the new TATs
// and releases it. That critical section is N plain stores, but it is a lock: a writer descheduled
// inside it stalls other checks until it runs again (they spin briefly, then yield). A reading
// earlier than the latest reading seen is clamped to it (one more atomic word, raised with CAS
// only when the clock moves forward); a check that races with a later-reading check may decide
// at its own reading, a few nanoseconds earlier than the lock-based limiter would.
//
// Sequentially (or with checks that do not overlap) every Decision equals the one GcraLimiter
// returns for one key with the same windows and clock readings, field by field.
//
// Thread-safety: `check` may be called concurrently from any threads. Moving a limiter is not
// thread-safe (only `create` moves one). Units: integer ns and request units. Complexity:
// O(windows) per check, no allocation, no system call besides the clock.
#ifndef SLUICE_DIRECT_GCRA_HPP_
#define SLUICE_DIRECT_GCRA_HPP_

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
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
#include "sluice/detail/spin_lock.hpp"
#include "sluice/window.hpp"

namespace sluice {

namespace detail {

// A window in the one-word representation: times in units of 1/units ns.
struct DirectGcraParams {
  std::int64_t step = 0;       // one emission interval: period·units/requests, a whole number
  std::int64_t tolerance = 0;  // burst·step: how far ahead of now a TAT may be
  std::uint64_t burst = 0;
  std::int64_t units = 1;    // d = requests / gcd(requests, period): units per ns
  std::int64_t horizon = 0;  // ns either side of the epoch that one word represents, < 2^62
  Divider by_step;
  Divider by_units;
};

// The window's parameters, or InvalidArgument under `path` if it is out of the supported range.
inline absl::StatusOr<DirectGcraParams> direct_gcra_params(const GcraWindow& w,
                                                           const std::string& path) {
  constexpr std::int64_t kMinHorizon = std::int64_t{1} << 58;
  constexpr std::int64_t kMaxHorizon = (std::int64_t{1} << 62) - 1;  // epoch + horizon fits
  if (absl::Status s = check_gcra_window(w, path); !s.ok()) return s;
  const auto period = static_cast<std::uint64_t>(w.period.count());
  const std::uint64_t burst = w.burst == 0 ? w.requests : w.burst;
  const std::uint64_t units = w.requests / std::gcd(w.requests, period);
  const std::uint64_t step = period / (w.requests / units);  // exact: period·units/requests
  const absl::uint128 tolerance = absl::uint128(burst) * step;
  const absl::uint128 word = std::numeric_limits<std::int64_t>::max();
  const absl::uint128 horizon = tolerance >= word ? 0 : (word - tolerance) / units;
  if (horizon < kMinHorizon) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": period / requests needs 1/", units,
        " ns precision, which one 64-bit word holds for less than 2^58 ns (9 years) of clock; "
        "use GcraLimiter, or a period that requests divides"));
  }
  const auto tolerance64 = static_cast<std::int64_t>(absl::Uint128Low64(tolerance));
  return DirectGcraParams{.step = static_cast<std::int64_t>(step),
                          .tolerance = tolerance64,
                          .burst = burst,
                          .units = static_cast<std::int64_t>(units),
                          .horizon = static_cast<std::int64_t>(std::min<absl::uint128>(
                              horizon, static_cast<std::uint64_t>(kMaxHorizon))),
                          .by_step = Divider(step),
                          .by_units = Divider(units)};
}

}  // namespace detail

template <Clock ClockT = SteadyClock>
class DirectGcraLimiter {
 public:
  // Validates `windows` as GcraLimiter does, plus the one-word range (see the top of this file),
  // and sorts them shortest period first (stable). The clock's reading now becomes the epoch.
  static absl::StatusOr<DirectGcraLimiter> create(std::vector<GcraWindow> windows,
                                                  ClockT clock = {}) {
    if (absl::Status s = detail::check_window_count(windows.size()); !s.ok()) return s;
    std::vector<detail::DirectGcraParams> params;
    for (std::size_t i = 0; i < windows.size(); ++i) {
      auto p = detail::direct_gcra_params(windows[i], absl::StrCat("windows[", i, "]"));
      if (!p.ok()) return p.status();
      params.push_back(*p);
      if (windows[i].burst == 0) windows[i].burst = windows[i].requests;
    }
    std::vector<std::size_t> order(windows.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return windows[a].period < windows[b].period;
    });
    DirectGcraLimiter limiter(std::move(clock));
    std::int64_t horizon = std::numeric_limits<std::int64_t>::max();
    for (std::size_t i : order) {
      limiter.windows_.push_back(windows[i]);
      limiter.params_[limiter.count_++] = params[i];
      limiter.max_cost_ = std::min(limiter.max_cost_, params[i].burst);
      horizon = std::min(horizon, params[i].horizon);
    }
    limiter.epoch_ = detail::saturate_time(limiter.clock_.now().count());
    // epoch ± horizon, kept inside the saturated clock range [-2^62, 2^62].
    limiter.earliest_ = std::max(limiter.epoch_ - horizon, -detail::kMaxTime);
    limiter.latest_allowed_ = std::min(limiter.epoch_ + horizon, detail::kMaxTime);
    return limiter;
  }

  DirectGcraLimiter(DirectGcraLimiter&& other) noexcept
      : clock_(std::move(other.clock_)),
        windows_(std::move(other.windows_)),
        params_(other.params_),
        count_(other.count_),
        max_cost_(other.max_cost_),
        epoch_(other.epoch_),
        earliest_(other.earliest_),
        latest_allowed_(other.latest_allowed_) {
    for (std::size_t i = 0; i < kMaxWindows; ++i) {
      state_.tat[i].store(other.state_.tat[i].load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
    }
    state_.latest.store(other.state_.latest.load(std::memory_order_relaxed),
                        std::memory_order_relaxed);
  }
  DirectGcraLimiter& operator=(DirectGcraLimiter&&) = delete;
  DirectGcraLimiter(const DirectGcraLimiter&) = delete;
  DirectGcraLimiter& operator=(const DirectGcraLimiter&) = delete;

  // Admits a request of `cost` units if every window has room, reserving it; `cost` 0 only
  // reports. InvalidArgument (state untouched) if cost exceeds a window's burst.
  absl::StatusOr<Decision> check(std::uint64_t cost = 1) {
    if (cost > max_cost_) return cost_error(cost);
    const std::int64_t now = relative(clock_.now().count());
    if (count_ == 1) return check_one(now, cost);
    return check_stacked(now, cost);
  }

  // The windows, shortest period first, bursts defaulted. Decision::binding_window indexes this.
  const std::vector<GcraWindow>& windows() const noexcept { return windows_; }
  const ClockT& clock() const noexcept { return clock_; }

 private:
  static constexpr std::int64_t kFresh = std::numeric_limits<std::int64_t>::min();

  explicit DirectGcraLimiter(ClockT clock) : clock_(std::move(clock)) {}

  // A reading as ns since the epoch, saturated to the representable span.
  std::int64_t relative(std::int64_t reading) const noexcept {
    return std::clamp(reading, earliest_, latest_allowed_) - epoch_;
  }

  // max(now, every reading used before): raises the latest reading seen, returns the clamped now.
  std::int64_t clamp(std::int64_t now) noexcept {
    std::int64_t latest = state_.latest.load(std::memory_order_relaxed);
    while (now > latest) {
      if (state_.latest.compare_exchange_weak(latest, now, std::memory_order_relaxed)) return now;
    }
    return latest;
  }

  absl::Status cost_error(std::uint64_t cost) const {
    std::size_t window = 0;
    while (params_[window].burst >= cost) ++window;
    return detail::cost_error(cost, params_[window].burst, window);
  }

  // Invariant of every word: tat − now ≤ tolerance (an admission never leaves more, and the
  // clamped now never decreases), so a peek is always admitted and no subtraction overflows.

  // The decision of window `i` for a TAT `tat` (units) at `now` (units) when it admits:
  // `ahead` = new TAT − now.
  Decision admitted(std::size_t i, std::int64_t ahead) const {
    const detail::DirectGcraParams& p = params_[i];
    return Decision{.reason = Reason::kAllowed,
                    .limit = p.burst,
                    .remaining = remaining(p, ahead),
                    .reset_after = std::chrono::nanoseconds{static_cast<std::int64_t>(
                        p.by_units.divide_up(static_cast<std::uint64_t>(ahead)))}};
  }
  static std::uint64_t remaining(const detail::DirectGcraParams& p, std::int64_t ahead) {
    return p.by_step.divide(static_cast<std::uint64_t>(p.tolerance - ahead));
  }
  // A denial bound by window `i`, whose TAT is `held` units ahead of now; `wait` in ns.
  Decision denied(std::size_t i, std::int64_t held, std::uint64_t wait) const {
    const detail::DirectGcraParams& p = params_[i];
    return Decision{.reason = Reason::kQuotaExceeded,
                    .limit = p.burst,
                    .remaining = remaining(p, held),
                    .retry_after = std::chrono::nanoseconds{static_cast<std::int64_t>(wait)},
                    .reset_after = std::chrono::nanoseconds{static_cast<std::int64_t>(
                        p.by_units.divide_up(static_cast<std::uint64_t>(held)))},
                    .binding_window = i};
  }

  // One window: a CAS loop on its word.
  Decision check_one(std::int64_t now_ns, std::uint64_t cost) {
    const detail::DirectGcraParams& p = params_[0];
    std::atomic<std::int64_t>& word = state_.tat[0];
    std::int64_t tat = word.load(std::memory_order_acquire);
    std::int64_t now = clamp(now_ns) * p.units;
    const std::int64_t charge = static_cast<std::int64_t>(cost) * p.step;
    for (;;) {
      const std::int64_t held = std::max(tat, now) - now;
      const std::int64_t ahead = held + charge;
      if (ahead > p.tolerance) {
        return denied(0, held,
                      p.by_units.divide_up(static_cast<std::uint64_t>(ahead - p.tolerance)));
      }
      if (cost == 0) return admitted(0, ahead);
      if (word.compare_exchange_weak(tat, now + ahead, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
        return admitted(0, ahead);
      }
      // Another check moved the TAT first; its reading may be later than ours.
      now = std::max(now, state_.latest.load(std::memory_order_relaxed) * p.units);
    }
  }

  // Stacked windows: a sequence lock over every word (see the top of this file).
  Decision check_stacked(std::int64_t now_ns, std::uint64_t cost) {
    for (;;) {
      const std::uint64_t version = stable_version();
      std::array<std::int64_t, kMaxWindows> tat{};
      // Acquire loads: the version check below cannot move before them, and a TAT stored by a
      // writer carries that writer's odd version with it.
      for (std::size_t i = 0; i < count_; ++i) {
        tat[i] = state_.tat[i].load(std::memory_order_acquire);
      }
      if (state_.version.load(std::memory_order_relaxed) != version) continue;
      const std::int64_t now = clamp(now_ns);

      std::array<std::int64_t, kMaxWindows> ahead{};
      std::size_t first_denied = count_;
      for (std::size_t i = 0; i < count_; ++i) {
        const detail::DirectGcraParams& p = params_[i];
        const std::int64_t at = now * p.units;
        ahead[i] = std::max(tat[i], at) - at + static_cast<std::int64_t>(cost) * p.step;
        if (ahead[i] > p.tolerance && first_denied == count_) first_denied = i;
      }
      if (first_denied != count_) return denied_stacked(tat, ahead, now, first_denied);
      if (cost != 0) {
        std::uint64_t expected = version;
        if (!state_.version.compare_exchange_strong(expected, version + 1,
                                                    std::memory_order_acquire)) {
          continue;
        }
        for (std::size_t i = 0; i < count_; ++i) {
          state_.tat[i].store(now * params_[i].units + ahead[i], std::memory_order_release);
        }
        state_.version.store(version + 2, std::memory_order_release);
      }
      const auto [binding, least] = detail::least_remaining(
          count_, [&](std::size_t i) { return remaining(params_[i], ahead[i]); });
      Decision d = admitted(binding, ahead[binding]);
      d.binding_window = binding;
      return d;
    }
  }

  // The version when no writer holds it (even); spins briefly, then yields, while one does.
  std::uint64_t stable_version() const {
    for (int spins = 0;; ++spins) {
      const std::uint64_t version = state_.version.load(std::memory_order_acquire);
      if ((version & 1) == 0) return version;
      if (spins < 64) {
        detail::cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
  }

  // Denied: nothing changes. The wait lets every denying window admit this cost.
  Decision denied_stacked(const std::array<std::int64_t, kMaxWindows>& tat,
                          const std::array<std::int64_t, kMaxWindows>& ahead, std::int64_t now,
                          std::size_t first_denied) const {
    std::uint64_t wait = 0;
    for (std::size_t i = first_denied; i < count_; ++i) {
      const detail::DirectGcraParams& p = params_[i];
      if (ahead[i] > p.tolerance) {
        wait = std::max(wait,
                        p.by_units.divide_up(static_cast<std::uint64_t>(ahead[i] - p.tolerance)));
      }
    }
    const std::int64_t at = now * params_[first_denied].units;
    return denied(first_denied, std::max(tat[first_denied], at) - at, wait);
  }

  // The mutable state, on its own cache line so that writes do not evict the parameters.
  struct alignas(64) State {
    std::array<std::atomic<std::int64_t>, kMaxWindows> tat{};  // units since the epoch
    std::atomic<std::int64_t> latest{kFresh};  // latest reading used, ns since the epoch
    std::atomic<std::uint64_t> version{0};     // stacked windows: odd while a writer holds it
    State() {
      for (auto& t : tat) t.store(kFresh, std::memory_order_relaxed);
    }
  };

  ClockT clock_;
  std::vector<GcraWindow> windows_;
  std::array<detail::DirectGcraParams, kMaxWindows> params_{};
  std::size_t count_ = 0;
  std::uint64_t max_cost_ = std::numeric_limits<std::uint64_t>::max();
  std::int64_t epoch_ = 0;           // ns: the clock reading at creation
  std::int64_t earliest_ = 0;        // ns: readings are saturated to [earliest_, latest_allowed_]
  std::int64_t latest_allowed_ = 0;  // ns
  State state_;
};

}  // namespace sluice

#endif  // SLUICE_DIRECT_GCRA_HPP_
