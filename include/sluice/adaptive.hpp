// sluice/adaptive.hpp — a limit factor driven by how the upstream behind a limit is doing.
//
// An `AdaptiveController` turns upstream responses (latency, status, Retry-After) into a limit
// factor in [minimum, 1], kept in permille (1000 = the configured limit). Once per `interval` it
// judges the interval that ended: the upstream is overloaded if the interval saw at least
// `min_samples` responses, its troubled ones (errors, 429/503, slower than the target) came from
// at least `min_clients` distinct clients, and either the latency EWMA is above `target_latency`
// or more than `error_ratio_permille` of them were errors; then the factor is multiplied by
// `decrease_permille`/1000 (never below the minimum). A healthy interval adds `recovery_permille`
// (never above 1000). An interval with fewer than `min_samples` responses is healthy only if the
// EWMA is at or under the target: while the upstream was last seen slow, quiet intervals leave
// the factor as it is (a slow upstream admitted at a low rate sees intervals without an answer,
// and those must not count as recovery), while an interval of `min_samples` answers that is not
// overloaded recovers (its troubled answers came from too few clients to count). Once an interval
// has seen `min_samples` 429 or 503 answers from `min_clients` distinct clients, the factor drops
// to the minimum at once and is held there for their longest Retry-After (the interval for one
// without), each capped at `max_retry_after` and `max_hold`: no recovery while the hold lasts. So
// no single client, however many requests it sends, and no single answer moves the factor; clients
// are told apart by a digest the caller passes, up to `kAdaptiveClientSlots` per interval.
//
//   sluice::AdaptivePolicy policy{.target_latency = 200ms};
//   sluice::AdaptiveController controller(policy, clock.now());
//   controller.record(clock.now(), {.latency = 350ms, .status = 200}, client_digest);
//   std::uint32_t permille = controller.factor(clock.now());  // 1000 until an interval ends
//
// The policy engine (sluice/engine.hpp) keeps one controller per route for each rule that has an
// `adaptive` policy and applies its factor to the rule's windows for requests on that route; see
// `adaptive_units` for the rounding.
//
// Arithmetic: integer nanoseconds and permille only; the EWMA moves 1/8 of the way to each sample
// (`ewma += (sample − ewma) / 8`, truncated), a sample being the answer's latency capped at twice
// `target_latency`, so that no single answer, however slow, moves the average by more than a
// quarter of the target. Intervals that ended while no one called are applied lazily, in O(1),
// when the controller is next used. A clock reading earlier than one already seen is clamped to
// it.
//
// Thread-safety: every member function may be called concurrently. `factor` reads two atomics
// unless an interval has ended since the last update; `record` takes a mutex. O(1) per call.
#ifndef SLUICE_ADAPTIVE_HPP_
#define SLUICE_ADAPTIVE_HPP_

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/mutex.hpp"

namespace sluice {

// How many distinct clients an adaptive controller tells apart per interval: `min_clients` is at
// most this.
inline constexpr std::uint32_t kAdaptiveClientSlots = 8;

// How a rule's limit follows its upstream. Durations are nanoseconds; ratios and factors are in
// permille (parts per thousand).
struct AdaptivePolicy {
  std::chrono::nanoseconds target_latency{0};   // the latency EWMA above which the limit shrinks
  std::uint32_t error_ratio_permille = 100;     // errors (5xx, or no answer) above this share
  std::uint32_t minimum_factor_permille = 100;  // the floor of the factor, 1 ... 1000
  std::uint32_t decrease_permille = 500;        // factor × this / 1000 per overloaded interval
  std::uint32_t recovery_permille = 100;        // factor + this per healthy interval
  std::chrono::nanoseconds interval = std::chrono::seconds(1);  // how often the factor moves
  std::chrono::nanoseconds max_hold = std::chrono::minutes(5);  // cap on a 429/503's hold
  // Answers an interval (or, for a 429/503 drop, its 429/503 answers) needs before it may shrink
  // the factor, 1 ... 1000000.
  std::uint32_t min_samples = 5;
  // Distinct clients among an interval's troubled answers (errors, 429/503, slower than the
  // target) needed before it may shrink the factor, 1 ... kAdaptiveClientSlots, ≤ min_samples.
  std::uint32_t min_clients = 3;
  // Cap on an upstream's Retry-After (and so on a 429/503's hold), 0 ... 24 hours.
  std::chrono::nanoseconds max_retry_after = std::chrono::seconds(30);

  // OK, or InvalidArgument naming the bad field under `prefix` (e.g. "bundles[0].rules[1].").
  absl::Status validate(const std::string& prefix = {}) const {
    auto bad = [&](const char* field, const char* must) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, field, " must be ", must));
    };
    constexpr std::chrono::nanoseconds kMaxDuration = std::chrono::hours(24);
    if (target_latency <= std::chrono::nanoseconds(0) || target_latency > kMaxDuration) {
      return bad("target_latency", "more than 0 and at most 24 hours");
    }
    if (error_ratio_permille > 1000) return bad("error_ratio_permille", "at most 1000");
    if (minimum_factor_permille < 1 || minimum_factor_permille > 1000) {
      return bad("minimum_factor_permille", "1 ... 1000");
    }
    if (decrease_permille < 1 || decrease_permille > 999) {
      return bad("decrease_permille", "1 ... 999");
    }
    if (recovery_permille < 1 || recovery_permille > 1000) {
      return bad("recovery_permille", "1 ... 1000");
    }
    if (interval < std::chrono::milliseconds(1) || interval > kMaxDuration) {
      return bad("interval", "1 ms ... 24 hours");
    }
    if (max_hold < std::chrono::nanoseconds(0) || max_hold > kMaxDuration) {
      return bad("max_hold", "0 ... 24 hours");
    }
    return validate_aggregation(prefix);
  }

  // The fields that keep one client from shrinking the factor alone.
  absl::Status validate_aggregation(const std::string& prefix) const {
    auto bad = [&](const char* field, const std::string& must) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, field, " must be ", must));
    };
    if (min_samples < 1 || min_samples > 1000000) return bad("min_samples", "1 ... 1000000");
    if (min_clients < 1 || min_clients > kAdaptiveClientSlots) {
      return bad("min_clients", absl::StrCat("1 ... ", kAdaptiveClientSlots));
    }
    if (min_clients > min_samples) return bad("min_clients", "at most min_samples");
    if (max_retry_after < std::chrono::nanoseconds(0) || max_retry_after > std::chrono::hours(24)) {
      return bad("max_retry_after", "0 ... 24 hours");
    }
    return absl::OkStatus();
  }

  friend bool operator==(const AdaptivePolicy&, const AdaptivePolicy&) = default;
};

// One answer of the upstream. `status` 0 means no answer (refused, reset or timed out).
struct UpstreamResponse {
  std::chrono::nanoseconds latency{0};
  int status = 200;
  std::chrono::nanoseconds retry_after{0};  // the upstream's Retry-After, 0 if none
};

// A snapshot of a controller, for metrics and tests.
struct AdaptiveState {
  std::uint32_t factor_permille = 1000;
  std::chrono::nanoseconds latency_ewma{0};  // 0 before the first response
  std::uint64_t responses = 0;               // in the current interval
  std::uint64_t errors = 0;                  // in the current interval
  std::chrono::nanoseconds hold_remaining{0};
  std::uint64_t decreases = 0;  // overloaded intervals and 429/503 drops, ever
  friend bool operator==(const AdaptiveState&, const AdaptiveState&) = default;
};

// Units a request of `cost` takes from a window scaled by 1000 (sluice counts adaptive windows in
// thousandths of a request): ⌈cost·10⁶ / factor⌉, so at factor 1000 a request takes exactly 1000
// units and at 500 it takes 2000. Rounding up never admits more than the factor allows.
// Requires 1 ≤ factor_permille ≤ 1000.
inline std::uint64_t adaptive_units(std::uint64_t cost, std::uint32_t factor_permille) {
  const absl::uint128 scaled = absl::uint128(cost) * 1000000u;
  const absl::uint128 units = (scaled + factor_permille - 1) / factor_permille;
  return units > std::numeric_limits<std::uint64_t>::max()
             ? std::numeric_limits<std::uint64_t>::max()
             : static_cast<std::uint64_t>(units);
}

namespace detail {

// The distinct client digests seen in one interval, up to kAdaptiveClientSlots of them: enough to
// tell "several clients" from "one", in a fixed array. O(kAdaptiveClientSlots) per add.
class DistinctClients {
 public:
  void add(std::uint64_t client) {
    for (std::uint32_t i = 0; i < count_; ++i) {
      if (slots_[i] == client) return;
    }
    if (count_ < slots_.size()) slots_[count_++] = client;
  }
  std::uint32_t count() const { return count_; }
  void clear() { count_ = 0; }

 private:
  std::array<std::uint64_t, kAdaptiveClientSlots> slots_{};
  std::uint32_t count_ = 0;
};

}  // namespace detail

// See the file comment.
class AdaptiveController {
 public:
  // `policy` must be valid (AdaptivePolicy::validate); the first interval starts at `start`.
  AdaptiveController(const AdaptivePolicy& policy, std::chrono::nanoseconds start)
      : policy_(policy),
        latest_(start.count()),
        interval_end_(saturating_add(start.count(), policy.interval.count())),
        hold_until_(start.count()),
        next_boundary_(interval_end_) {}

  AdaptiveController(const AdaptiveController&) = delete;
  AdaptiveController& operator=(const AdaptiveController&) = delete;

  const AdaptivePolicy& policy() const noexcept { return policy_; }

  // The factor in permille at `now`, after applying every interval that has ended by then.
  std::uint32_t factor(std::chrono::nanoseconds now) {
    if (now.count() < next_boundary_.load(std::memory_order_acquire)) {
      return factor_.load(std::memory_order_relaxed);
    }
    detail::MutexLock lock(mutex_);
    advance(now.count());
    return factor_.load(std::memory_order_relaxed);
  }

  // Feeds one upstream response observed at `now`, answered to the client whose digest is
  // `client` (any stable 64-bit digest of who sent the request: its address, its consumer).
  void record(std::chrono::nanoseconds now, const UpstreamResponse& response,
              std::uint64_t client) {
    detail::MutexLock lock(mutex_);
    const std::int64_t at = advance(now.count());
    const std::int64_t latency = std::clamp<std::int64_t>(response.latency.count(), 0, kMaxLatency);
    // One answer, however slow, pulls the average at most as far as kSampleCap targets: it
    // counts as slow, but cannot outweigh many answers of other clients (a client can hold its
    // own request open for as long as the server lets it).
    const std::int64_t sample = std::min(latency, kSampleCap * policy_.target_latency.count());
    ewma_ = have_ewma_ ? ewma_ + (sample - ewma_) / 8 : sample;
    have_ewma_ = true;
    ++responses_;
    const bool error = response.status == 0 || response.status >= 500;
    const bool throttled = response.status == 429 || response.status == 503;
    if (error) ++errors_;
    if (error || throttled || latency > policy_.target_latency.count()) troubled_.add(client);
    if (throttled) throttle(at, response.retry_after.count(), client);
  }

  AdaptiveState state(std::chrono::nanoseconds now) {
    detail::MutexLock lock(mutex_);
    const std::int64_t at = advance(now.count());
    return {.factor_permille = factor_.load(std::memory_order_relaxed),
            .latency_ewma = std::chrono::nanoseconds(ewma_),
            .responses = responses_,
            .errors = errors_,
            .hold_remaining = std::chrono::nanoseconds(std::max<std::int64_t>(hold_until_ - at, 0)),
            .decreases = decreases_};
  }

 private:
  static constexpr std::int64_t kMaxLatency = std::int64_t{1} << 50;  // ≈ 13 days
  // The most one answer counts in the latency average, in targets (≤ 48 hours: no overflow).
  static constexpr std::int64_t kSampleCap = 2;
  static constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

  static std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
    std::int64_t sum = 0;
    return __builtin_add_overflow(a, b, &sum) ? kNever : sum;
  }

  // A 429 or 503 at `at`: once the interval has seen min_samples of them from min_clients distinct
  // clients, the factor drops to the minimum, held for the longest Retry-After among them (the
  // interval for an answer without one), each capped at max_retry_after and max_hold.
  void throttle(std::int64_t at, std::int64_t retry_after, std::uint64_t client)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    ++throttles_;
    throttled_.add(client);
    const std::int64_t wait = retry_after > 0 ? retry_after : policy_.interval.count();
    throttle_wait_ =
        std::max(throttle_wait_,
                 std::min({wait, policy_.max_retry_after.count(), policy_.max_hold.count()}));
    if (throttles_ < policy_.min_samples || throttled_.count() < policy_.min_clients) return;
    hold_until_ = std::max(hold_until_, saturating_add(at, throttle_wait_));
    if (factor_.load(std::memory_order_relaxed) != policy_.minimum_factor_permille) {
      ++decreases_;
    }
    factor_.store(policy_.minimum_factor_permille, std::memory_order_relaxed);
  }

  // Whether the interval that ended was overloaded: enough answers from enough distinct troubled
  // clients, and the latency average above the target or too many errors.
  bool overloaded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (responses_ < policy_.min_samples || troubled_.count() < policy_.min_clients) return false;
    return ewma_ > policy_.target_latency.count() ||
           absl::uint128(errors_) * 1000 > absl::uint128(policy_.error_ratio_permille) * responses_;
  }

  // Clamps `now` to the latest reading, applies every interval that ended by then, and returns
  // the clamped reading.
  std::int64_t advance(std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    latest_ = std::max(latest_, now);
    // An interval that would end past the clock's range never ends.
    if (latest_ < interval_end_ || interval_end_ == kNever) return latest_;
    std::uint32_t factor = factor_.load(std::memory_order_relaxed);
    const bool was_overloaded = overloaded();
    if (was_overloaded) {
      factor = std::max(
          policy_.minimum_factor_permille,
          static_cast<std::uint32_t>(std::uint64_t{factor} * policy_.decrease_permille / 1000));
      ++decreases_;
    }
    // Intervals ending at interval_end_ + j·interval for j = 0 ... later; the first was judged
    // above, every later one saw no response: healthy unless the EWMA is above the target. Each
    // healthy one recovers if it ended at or after hold_until_.
    const std::int64_t period = policy_.interval.count();
    const std::uint64_t later =
        static_cast<std::uint64_t>(latest_ - interval_end_) / static_cast<std::uint64_t>(period);
    std::uint64_t first_free = 0;  // the first j whose end is not under a hold
    if (hold_until_ > interval_end_) {
      const std::uint64_t held = static_cast<std::uint64_t>(hold_until_ - interval_end_);
      first_free =
          (held + static_cast<std::uint64_t>(period) - 1) / static_cast<std::uint64_t>(period);
    }
    // Last seen slow: an interval with fewer than min_samples answers (none, for the later ones)
    // holds the factor. One with min_samples answers and still not overloaded had its troubled
    // answers from fewer than min_clients clients: healthy, however slow their answers were, so
    // that one client cannot keep the average above the target and the factor down.
    const bool slow = have_ewma_ && ewma_ > policy_.target_latency.count();
    const bool judged_healthy = !was_overloaded && (!slow || responses_ >= policy_.min_samples);
    std::uint64_t recoveries = first_free == 0 && judged_healthy ? 1 : 0;
    if (!slow && later >= 1) {
      const std::uint64_t from = std::max<std::uint64_t>(first_free, 1);
      if (from <= later) recoveries += later - from + 1;
    }
    if (recoveries != 0) {
      const std::uint64_t gain =
          std::min<std::uint64_t>(recoveries, 1000) * policy_.recovery_permille;
      factor = static_cast<std::uint32_t>(std::min<std::uint64_t>(1000, factor + gain));
    }
    factor_.store(factor, std::memory_order_relaxed);
    interval_end_ = saturating_add(
        interval_end_, static_cast<std::int64_t>(std::min<absl::uint128>(
                           absl::uint128(later + 1) * static_cast<std::uint64_t>(period),
                           static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))));
    responses_ = 0;
    errors_ = 0;
    throttles_ = 0;
    throttle_wait_ = 0;
    troubled_.clear();
    throttled_.clear();
    next_boundary_.store(interval_end_, std::memory_order_release);
    return latest_;
  }

  const AdaptivePolicy policy_;
  detail::Mutex mutex_;
  std::int64_t latest_ ABSL_GUARDED_BY(mutex_);        // ns, the latest clock reading seen
  std::int64_t interval_end_ ABSL_GUARDED_BY(mutex_);  // ns, when the current interval ends
  std::int64_t hold_until_ ABSL_GUARDED_BY(mutex_);    // ns, no recovery before this
  std::int64_t ewma_ ABSL_GUARDED_BY(mutex_) = 0;      // ns
  bool have_ewma_ ABSL_GUARDED_BY(mutex_) = false;
  std::uint64_t responses_ ABSL_GUARDED_BY(mutex_) = 0;
  std::uint64_t errors_ ABSL_GUARDED_BY(mutex_) = 0;
  std::uint64_t decreases_ ABSL_GUARDED_BY(mutex_) = 0;
  std::uint64_t throttles_ ABSL_GUARDED_BY(mutex_) = 0;        // 429/503 answers, this interval
  std::int64_t throttle_wait_ ABSL_GUARDED_BY(mutex_) = 0;     // ns, their longest capped wait
  detail::DistinctClients troubled_ ABSL_GUARDED_BY(mutex_);   // behind troubled answers
  detail::DistinctClients throttled_ ABSL_GUARDED_BY(mutex_);  // behind 429/503 answers
  std::atomic<std::uint32_t> factor_{1000};  // written under mutex_, read without it
  std::atomic<std::int64_t> next_boundary_;  // a copy of interval_end_ for the lock-free read
};

}  // namespace sluice

#endif  // SLUICE_ADAPTIVE_HPP_
