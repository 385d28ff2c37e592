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
//   sluice::Decision one = upstream->check_one();  // cost 1, which cannot fail: no StatusOr
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
// Beyond check: `inspect` and `reset`, and `reserve`, `cancel` and `wait` with GcraLimiter's
// exact rules (sluice/gcra.hpp). These writers take the sequence lock even for one window (a
// one-window check never does; a writer publishes its word with a CAS and retries if a check
// moved it), so a check never waits for them except as it waits for stacked admissions.
//
// Thread-safety: every member function may be called concurrently from any threads (`wait`
// sleeps without holding anything). Moving a limiter is not thread-safe (only `create` moves
// one). Units: integer ns and request units. Complexity: O(windows) per call, no allocation, no
// system call besides the clock.
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

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/detail/divider.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/detail/spin_lock.hpp"
#include "sluice/detail/window_ranges.hpp"
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
  if (absl::Status s = check_gcra_window(w, kGcraRange, path); !s.ok()) return s;
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
        latest_allowed_(other.latest_allowed_),
        id_(other.id_) {
    for (std::size_t i = 0; i < kMaxWindows; ++i) {
      state_.tat[i].store(other.state_.tat[i].load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
    }
    state_.latest.store(other.state_.latest.load(std::memory_order_relaxed),
                        std::memory_order_relaxed);
    state_.resets.store(other.state_.resets.load(std::memory_order_relaxed),
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
    if (count_ == 1) return check_word(now, cost);
    return check_stacked(now, cost);
  }

  // check(1) without the StatusOr, for the common case: a cost of 1 fits every window (a burst is
  // at least 1), so this check cannot fail. Returns exactly the Decision check(1) returns, and is
  // as thread-safe; lock-free for one window.
  Decision check_one() {
    const std::int64_t now = relative(clock_.now().count());
    if (ABSL_PREDICT_TRUE(count_ == 1)) return check_word(now, 1);
    return check_stacked(now, 1);
  }

  // The state without consuming anything: what `check(0)` reports. Lock-free.
  Decision inspect() { return *check(0); }

  // Forgets every booking: the next check sees every window full. Reservations made before it
  // give nothing back when cancelled. Lock-free for one window; stacked windows take the
  // writers' sequence lock.
  void reset() {
    transact(
        relative(clock_.now().count()),
        [&](Words& tat, std::int64_t) {
          for (std::size_t i = 0; i < count_; ++i) tat[i] = kFresh;
          return true;
        },
        /*resets=*/true);
  }

  // --- Reserve and wait, as GcraLimiter's (sluice/gcra.hpp): the same instants and give-backs.

  class Reservation {
   public:
    Reservation() = default;

    // From the clock reading the reservation was made at to its instant; 0: proceed now.
    std::chrono::nanoseconds wait() const noexcept { return std::chrono::nanoseconds{wait_}; }
    // When the cost may be used, as a reading of the limiter's clock.
    std::chrono::nanoseconds instant() const noexcept { return std::chrono::nanoseconds{instant_}; }
    std::uint64_t cost() const noexcept { return cost_; }
    bool cancellable() const noexcept { return open_.is_open(); }

   private:
    friend class DirectGcraLimiter;
    std::array<std::int64_t, kMaxWindows> booked_{};  // each word right after, in units
    std::array<std::int64_t, kMaxWindows> added_{};   // what it added to each word
    std::uint64_t resets_ = 0;
    std::int64_t instant_ = 0;
    std::int64_t wait_ = 0;
    std::uint64_t cost_ = 0;
    std::uint64_t limiter_ = 0;  // the booking limiter's id_
    detail::OpenFlag open_;      // move-only: acted on at most once
  };

  static constexpr std::chrono::nanoseconds kNoMaxWait = std::chrono::nanoseconds::max();

  // Books `cost` at the earliest instant at which it fits in every window (see
  // GcraLimiter::reserve). Errors, with nothing booked: InvalidArgument if `cost` is 0 or exceeds
  // a window's burst; DeadlineExceeded if the instant is more than `max_wait` away;
  // ResourceExhausted if the booking would reach past the span one word holds, or further than
  // its horizon ahead of now (see the top of this file). Lock-free for one window.
  absl::StatusOr<Reservation> reserve(std::uint64_t cost = 1,
                                      std::chrono::nanoseconds max_wait = kNoMaxWait) {
    if (cost == 0) return absl::InvalidArgumentError("a reservation's cost must be at least 1");
    if (cost > max_cost_) return cost_error(cost);
    absl::StatusOr<Reservation> result(absl::in_place);
    Reservation& out = *result;
    absl::Status status;
    transact(relative(clock_.now().count()), [&](Words& tat, std::int64_t now) {
      status = book_earliest(tat, now, cost, max_wait.count(), out);
      return status.ok();
    });
    if (!status.ok()) result = std::move(status);
    return result;
  }

  // Gives back what `reservation` booked unless the clock has moved past its instant; true iff
  // it did (or a reset has already given everything back). Exactly GcraLimiter::cancel's rule:
  // a reservation another limiter booked gives nothing back here (false) and stays open.
  bool cancel(Reservation& reservation) {
    if (reservation.limiter_ != id_ || !reservation.open_.take()) return false;
    bool cancelled = false;
    transact(relative(clock_.now().count()), [&](Words& tat, std::int64_t now) {
      cancelled = now + epoch_ <= reservation.instant_;
      if (!cancelled || state_.resets.load(std::memory_order_acquire) != reservation.resets_) {
        return false;
      }
      for (std::size_t i = 0; i < count_; ++i) {
        const std::int64_t at = now * params_[i].units;
        const std::int64_t ahead = reservation.booked_[i] - at;
        if (tat[i] <= at || ahead <= 0) continue;
        tat[i] = std::max(tat[i] - std::min(reservation.added_[i], ahead), at);
      }
      return true;
    });
    return cancelled;
  }

  // Books `cost` if it fits by `deadline` (a reading of this limiter's clock) and sleeps until
  // its instant with `sleep_for`; DeadlineExceeded, with nothing booked, if it cannot fit by
  // then. As GcraLimiter::wait.
  template <class SleepFor = ThreadSleepFor>
  absl::Status wait(std::uint64_t cost, std::chrono::nanoseconds deadline,
                    SleepFor&& sleep_for = {}) {
    const std::chrono::nanoseconds start = clock_.now();
    if (deadline < start) return absl::DeadlineExceededError("the deadline has passed");
    const std::chrono::nanoseconds room =
        deadline.count() > detail::kMaxTime || start.count() < -detail::kMaxTime ? kNoMaxWait
                                                                                 : deadline - start;
    absl::StatusOr<Reservation> r = reserve(cost, room);
    if (!r.ok()) return r.status();
    if (r->wait() > std::chrono::nanoseconds{0}) sleep_for(r->wait());
    return absl::OkStatus();
  }

  // The windows, shortest period first, bursts defaulted. Decision::binding_window indexes this.
  const std::vector<GcraWindow>& windows() const noexcept { return windows_; }
  const ClockT& clock() const noexcept { return clock_; }

 private:
  using Words = std::array<std::int64_t, kMaxWindows>;

  // Runs `fn(tat, now)` on a copy of every word at the clamped `now_ns` (ns since the epoch)
  // and, if it returns true, publishes the words it left, atomically with respect to every check.
  // Writers (reserve, cancel, reset, and stacked admissions) are serialized by the sequence lock;
  // a one-window check does not take it, so a one-window writer publishes with a CAS and runs
  // `fn` again if a check moved the word meanwhile. With `resets`, the reset count is raised
  // with the publication.
  template <class Fn>
  void transact(std::int64_t now_ns, Fn&& fn, bool resets = false) {
    const std::uint64_t version = lock_writers();
    for (;;) {
      Words tat{};
      for (std::size_t i = 0; i < count_; ++i) {
        tat[i] = state_.tat[i].load(std::memory_order_acquire);
      }
      std::int64_t first = tat[0];
      if (!fn(tat, clamp(now_ns))) break;
      if (count_ == 1) {
        if (!state_.tat[0].compare_exchange_strong(first, tat[0], std::memory_order_acq_rel,
                                                   std::memory_order_acquire)) {
          continue;  // a check admitted meanwhile
        }
      } else {
        for (std::size_t i = 0; i < count_; ++i) {
          state_.tat[i].store(tat[i], std::memory_order_release);
        }
      }
      if (resets) state_.resets.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    state_.version.store(version + 2, std::memory_order_release);
  }

  // Takes the writers' sequence lock: returns the even version it found, leaving version + 1.
  std::uint64_t lock_writers() {
    for (;;) {
      std::uint64_t version = stable_version();
      if (state_.version.compare_exchange_weak(version, version + 1, std::memory_order_acquire)) {
        return version;
      }
    }
  }

  // reserve's step: the earliest instant (ns since the epoch) at which `cost` fits in every
  // window, then every word moves to max(TAT, instant) + cost·step. 128-bit intermediates: a
  // word may be near the top of its range.
  absl::Status book_earliest(Words& tat, std::int64_t now, std::uint64_t cost,
                             std::int64_t max_wait, Reservation& out) const {
    absl::int128 instant = now;
    for (std::size_t i = 0; i < count_; ++i) {
      const detail::DirectGcraParams& p = params_[i];
      const absl::int128 at = absl::int128(now) * p.units;
      const absl::int128 fits =
          std::max(absl::int128(tat[i]), at) + absl::int128(cost) * p.step - p.tolerance;
      if (fits > at) instant = std::max(instant, now + (fits - at + p.units - 1) / p.units);
    }
    const absl::int128 wait = instant - now;
    if (wait > max_wait) {
      return absl::DeadlineExceededError(
          absl::StrCat("the cost fits in ", static_cast<std::int64_t>(wait), " ns, more than the ",
                       max_wait, " ns allowed"));
    }
    Words next{};
    for (std::size_t i = 0; i < count_; ++i) {
      const detail::DirectGcraParams& p = params_[i];
      const absl::int128 at = absl::int128(now) * p.units;
      const absl::int128 start = std::max(absl::int128(tat[i]), instant * p.units);
      const absl::int128 booked = start + absl::int128(cost) * p.step;
      // Within the span one word holds, and at most `horizon` ahead of now, so that a word's
      // distance ahead of any later reading (and that plus a cost) fits 63 bits.
      const absl::int128 limit =
          std::min(absl::int128(latest_allowed_ - epoch_) * p.units + p.tolerance,
                   at + absl::int128(p.horizon) * p.units);
      if (booked > limit) {
        return absl::ResourceExhaustedError(
            "the reservation would reach past the span of clock one word holds");
      }
      next[i] = static_cast<std::int64_t>(booked);
      out.booked_[i] = next[i];
      out.added_[i] = static_cast<std::int64_t>(booked - std::max(absl::int128(tat[i]), at));
    }
    tat = next;
    out.resets_ = state_.resets.load(std::memory_order_acquire);
    out.limiter_ = id_;
    out.instant_ = static_cast<std::int64_t>(instant) + epoch_;
    out.wait_ = static_cast<std::int64_t>(wait);
    out.cost_ = cost;
    out.open_.open();
    return absl::OkStatus();
  }
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

  // Every word is at most (latest_allowed_ − epoch_)·units + tolerance and at most
  // horizon·units ahead of the latest reading (an admission leaves at most now + tolerance, a
  // reservation is refused past either), so no sum below overflows, even for readings before the
  // epoch.
  // A check leaves tat − now ≤ tolerance; only reservations leave more (the word is then in
  // debt: every check, peeks included, is denied until now catches up).

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
  // As `remaining`, 0 for a word in debt (reservations booked ahead past the bucket).
  static std::uint64_t remaining_held(const detail::DirectGcraParams& p, std::int64_t held) {
    return held >= p.tolerance ? 0 : remaining(p, held);
  }
  // A denial bound by window `i`, whose TAT is `held` units ahead of now; `wait` in ns.
  Decision denied(std::size_t i, std::int64_t held, std::uint64_t wait) const {
    const detail::DirectGcraParams& p = params_[i];
    return Decision{.reason = Reason::kQuotaExceeded,
                    .limit = p.burst,
                    .remaining = remaining_held(p, held),
                    .retry_after = std::chrono::nanoseconds{static_cast<std::int64_t>(wait)},
                    .reset_after = std::chrono::nanoseconds{static_cast<std::int64_t>(
                        p.by_units.divide_up(static_cast<std::uint64_t>(held)))},
                    .binding_window = i};
  }

  // One window: a CAS loop on its word.
  ABSL_ATTRIBUTE_ALWAYS_INLINE Decision check_word(std::int64_t now_ns, std::uint64_t cost) {
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
    std::atomic<std::uint64_t> resets{0};      // reset() calls: invalidate older reservations
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
  std::uint64_t id_ = detail::new_limiter_id();  // names it in its reservations
  State state_;
};

}  // namespace sluice

#endif  // SLUICE_DIRECT_GCRA_HPP_
