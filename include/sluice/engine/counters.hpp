// sluice/engine/counters.hpp — the policy engine's counters and the events it raises from them.
//
// Internal to BasicRateLimitEngine (sluice/engine.hpp), which reads them out as RuleStats and
// EngineStats. Counters live in shared blocks: every generation reloaded from an engine shares
// its engine-wide block, and an unchanged rule's block, so counts run over the engine's life.
// Events (sluice/engine_events.hpp) that could come once per request — dry-run denials, backend
// errors, evictions — are raised at most once per kEngineEventInterval of engine time (per rule,
// per status code), and count what they held back, so neither a client nor a failing backend can
// flood the hook.
//
// Thread-safety: lock-free; relaxed atomics (counts, not synchronization). Memory: 1 KiB of
// striped counters per rule.
#ifndef SLUICE_ENGINE_COUNTERS_HPP_
#define SLUICE_ENGINE_COUNTERS_HPP_

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/engine_events.hpp"

namespace sluice::detail {

// Counters that request threads bump are striped: each thread adds to its own cache line, and a
// reader sums the stripes, so threads counting on one rule do not contend for one line. The first
// kOwnedStripes threads of the process that count each own a stripe and add to it with a plain
// load and store: a locked add per counter, which also waits for every store before it, cost
// more than the rest of the request's counting. Later threads share the other kSharedStripes
// stripes, assigned round-robin, and add atomically.
inline constexpr std::size_t kOwnedStripes = 8;
inline constexpr std::size_t kSharedStripes = 8;
inline constexpr std::size_t kCounterStripes = kOwnedStripes + kSharedStripes;

// The calling thread's stripe, and whether it owns it.
struct CounterStripe {
  std::size_t index = 0;
  bool owned = false;
};
inline CounterStripe counter_stripe() noexcept {
  static std::atomic<std::size_t> next{0};
  thread_local const CounterStripe stripe = [] {
    const std::size_t n = next.fetch_add(1, std::memory_order_relaxed);
    return n < kOwnedStripes ? CounterStripe{.index = n, .owned = true}
                             : CounterStripe{.index = kOwnedStripes + n % kSharedStripes};
  }();
  return stripe;
}

// Adds 1 to `member` of `stripes[stripe.index]`, the calling thread's stripe.
template <class Stripes, class Member>
void add_to_stripe(Stripes& stripes, Member member, CounterStripe stripe) noexcept {
  std::atomic<std::uint64_t>& counter = stripes[stripe.index].*member;
  if (stripe.owned) {
    counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  } else {
    counter.fetch_add(1, std::memory_order_relaxed);
  }
}

// Sums `member` over `stripes`.
template <class Stripes, class Member>
std::uint64_t sum_stripes(const Stripes& stripes, Member member) noexcept {
  std::uint64_t total = 0;
  for (const auto& stripe : stripes) total += (stripe.*member).load(std::memory_order_relaxed);
  return total;
}

// One rule's counters (RuleStats), and when its evictions were last looked at.
struct RuleCounters {
  struct alignas(64) Stripe {
    std::atomic<std::uint64_t> admitted{0};
    std::atomic<std::uint64_t> denied{0};
    std::atomic<std::uint64_t> dry_denied{0};
    std::atomic<std::uint64_t> degraded{0};
  };
  std::array<Stripe, kCounterStripes> stripes{};
  // Eviction events: the engine time (ns) of the next look at the store's eviction counter,
  // and the counter's value at the last event.
  std::atomic<std::int64_t> eviction_check_due{std::numeric_limits<std::int64_t>::min()};
  std::atomic<std::uint64_t> evictions_reported{0};
  // Dry-run denial events: the engine time (ns) from which the next one may be raised, and the
  // would-be denials held back since the last one.
  std::atomic<std::int64_t> dry_denial_due{std::numeric_limits<std::int64_t>::min()};
  std::atomic<std::uint64_t> dry_denials_held{0};

  // Adds 1 to `member` in the calling thread's stripe (`stripe`: counter_stripe()).
  template <class Member>
  void add(Member member, CounterStripe stripe = counter_stripe()) noexcept {
    add_to_stripe(stripes, member, stripe);
  }
  template <class Member>
  std::uint64_t sum(Member member) const noexcept {
    return sum_stripes(stripes, member);
  }
};

// True for the one caller that may raise an event at `now` (ns of engine time) under the gate
// `due`: `now` has reached it, and this caller moved it one kEngineEventInterval past `now`.
inline bool claim_event(std::atomic<std::int64_t>& due, std::int64_t now) {
  constexpr std::int64_t kInterval = std::chrono::nanoseconds(kEngineEventInterval).count();
  std::int64_t next = due.load(std::memory_order_relaxed);
  return now >= next && due.compare_exchange_strong(next, detail::saturate_time(now) + kInterval,
                                                    std::memory_order_relaxed);
}

// The engine-wide counters (EngineStats) and the backend-error events' gates.
class EngineCounters {
 public:
  // Bumped per request: striped (see RuleCounters).
  struct alignas(64) Stripe {
    std::atomic<std::uint64_t> evaluations{0};
    std::atomic<std::uint64_t> degraded_evaluations{0};
  };
  std::array<Stripe, kCounterStripes> stripes{};
  std::atomic<std::uint64_t> backend_errors{0};
  std::atomic<std::uint64_t> reloads{0};
  std::atomic<std::uint64_t> failed_reloads{0};

  // Adds 1 to `member` in the calling thread's stripe.
  template <class Member>
  void add(Member member) noexcept {
    add_to_stripe(stripes, member, counter_stripe());
  }
  template <class Member>
  std::uint64_t sum(Member member) const noexcept {
    return sum_stripes(stripes, member);
  }

  // Counts a failed backend call and reports it to `hook` (if set), at most once per status
  // code per kEngineEventInterval of engine time `now`: a failure that raises no event is
  // counted in the next event of its code. InvalidArgument (a bad cost) is the request's fault,
  // not the backend's, and is neither counted nor reported.
  void backend_error(const absl::Status& status, const EngineEventHook& hook, std::int64_t now) {
    if (status.code() == absl::StatusCode::kInvalidArgument) return;
    backend_errors.fetch_add(1, std::memory_order_relaxed);
    if (!hook) return;
    const auto code = static_cast<std::size_t>(status.code());
    Gate& gate =
        gates_[code < kStatusCodes ? code : static_cast<std::size_t>(absl::StatusCode::kUnknown)];
    if (!claim_event(gate.due, now)) {
      gate.held.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    hook(BackendErrorEvent{.status = status,
                           .suppressed = gate.held.exchange(0, std::memory_order_relaxed)});
  }

 private:
  // Backend error events of one status code: the engine time (ns) from which the next one may be
  // raised, and how many were held back since the last one.
  struct Gate {
    std::atomic<std::int64_t> due{std::numeric_limits<std::int64_t>::min()};
    std::atomic<std::uint64_t> held{0};
  };
  // absl::StatusCode values are 0 ... 16 (kUnauthenticated); any other shares kUnknown's gate.
  static constexpr std::size_t kStatusCodes = 17;
  std::array<Gate, kStatusCodes> gates_{};
};

// Reports a dry-run rule's would-be denial `decision` to `hook`, at most once per
// kEngineEventInterval of engine time `now` for rule `rule`: one that raises no event is counted
// in the rule's next event.
inline void report_dry_denial(RuleCounters& counters, std::size_t rule, std::string_view label,
                              const Decision& decision, const EngineEventHook& hook,
                              std::int64_t now) {
  if (!claim_event(counters.dry_denial_due, now)) {
    counters.dry_denials_held.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  hook(DryRunDenialEvent{
      .rule_label = label,
      .rule = rule,
      .decision = decision,
      .suppressed = counters.dry_denials_held.exchange(0, std::memory_order_relaxed)});
}

// Reports new evictions of rule `rule` (label `label`) to `hook`, looking at its store's
// eviction count (`evicted()`, called only then) at most once per kEngineEventInterval of
// engine time (one thread wins the look); the count's growth since the last event is the
// event's count, so no eviction goes unreported.
template <class Evicted>
void report_evictions(RuleCounters& counters, std::size_t rule, std::string_view label,
                      const EngineEventHook& hook, std::int64_t now, Evicted&& evicted_count) {
  if (!claim_event(counters.eviction_check_due, now)) return;
  const std::uint64_t evicted = evicted_count();
  std::uint64_t reported = counters.evictions_reported.load(std::memory_order_relaxed);
  while (evicted > reported && !counters.evictions_reported.compare_exchange_weak(
                                   reported, evicted, std::memory_order_relaxed)) {
  }
  if (evicted > reported) {
    hook(EvictionEvent{.rule_label = label, .rule = rule, .evicted = evicted - reported});
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_ENGINE_COUNTERS_HPP_
