// sluice/redis/local_fallback.hpp — a Redis limiter that keeps limiting, in process, while Redis
// is unreachable.
//
// `LocalFallbackLimiter` pairs a `RedisGcraLimiter` (the fleet-wide budget) with an in-memory
// `sluice::GcraLimiter` over the local share of the same windows. While Redis answers, every check
// is Redis's decision. When a check fails (Unavailable, DeadlineExceeded, Internal, ...), the check
// is decided by the local limiter instead and reported degraded; later checks go to the local
// limiter at once, without waiting on Redis, and at most one check per `retry_interval` calls Redis
// again (decided locally too if that fails). The first check Redis answers makes decisions shared
// again. This is the `local` failure mode of the policy engine (sluice/engine.hpp), for one limit.
//
//   auto shared = sluice::redis::RedisGcraLimiter::create(
//       {{.requests = 10, .period = std::chrono::minutes(1)}}, client);
//   if (!shared.ok()) return shared.status();
//   // 4 replicas: each enforces a quarter of the limit alone while Redis is down.
//   auto limiter = sluice::redis::LocalFallbackLimiter<>::create(*std::move(shared),
//                                                                {.share_permille = 250});
//   absl::StatusOr<sluice::redis::FallbackDecision> d = limiter->check(client_ip);
//   if (!d.ok()) return d.status();                   // InvalidArgument: the cost can never pass
//   if (d->degraded) log_once("rate limits are per replica: Redis is unreachable");
//   if (!d->decision.allowed()) respond_429(d->decision.retry_after);
//
// The local share: every window's requests and burst (0: its requests) become
// max(1, floor(n × share_permille / 1000)), periods unchanged; 10 per minute at 500 ‰ is 5 per
// minute. A cost that the shared limit holds but the local bucket cannot takes the whole local
// bucket (admitted only when it is full). The local limiter's state lives as long as this object:
// a second outage starts from what the first left, plus what has refilled since. Redis's state is
// not touched while degraded, so the fleet-wide budget does not see local admissions.
//
// Units: counts and integer nanoseconds; the local limiter and the retry interval run on `ClockT`
// (a sluice::Clock; ManualClock in tests), Redis's decisions on the server's TIME.
// Thread-safety: thread-safe; `check` may run on many threads at once (the Redis client, the
// in-memory limiter and the retry state are each thread-safe; the retry state is one atomic word).
// Complexity: a healthy check is one Redis round trip plus two atomic loads; a degraded one is
// O(windows) in process (one shard lock), with no system call.
#ifndef SLUICE_REDIS_LOCAL_FALLBACK_HPP_
#define SLUICE_REDIS_LOCAL_FALLBACK_HPP_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/detail/local_mode.hpp"
#include "sluice/gcra.hpp"
#include "sluice/redis/limiter.hpp"
#include "sluice/store.hpp"

namespace sluice::redis {

struct LocalFallbackOptions {
  // The permille of every window each replica enforces alone while Redis fails: 1 ... 1000.
  // Required: the right share is about 1000 / replicas, which the limiter cannot know.
  std::uint64_t share_permille = 0;
  // After a failure, at most one check per interval calls Redis (> 0, at most one hour).
  std::chrono::nanoseconds retry_interval = std::chrono::seconds(1);
  StoreOptions store{};  // the local limiter's store (bounded: it evicts by default)
};

// One check's outcome: the decision, and whether the local limiter made it.
struct FallbackDecision {
  Decision decision{};
  bool degraded = false;  // decided in process on the local share, not by Redis
  friend bool operator==(const FallbackDecision&, const FallbackDecision&) = default;
};

template <Clock ClockT = SteadyClock>
class LocalFallbackLimiter {
 public:
  // InvalidArgument for a share outside 1 ... 1000, a retry interval outside (0, 1 h], or
  // store options / scaled windows the in-memory limiter refuses.
  static absl::StatusOr<LocalFallbackLimiter> create(RedisGcraLimiter shared,
                                                     LocalFallbackOptions options,
                                                     ClockT clock = {}) {
    if (options.share_permille == 0 || options.share_permille > sluice::detail::kPermille) {
      return absl::InvalidArgumentError(
          absl::StrCat("share_permille must be in [1, 1000], got ", options.share_permille));
    }
    if (options.retry_interval <= std::chrono::nanoseconds::zero() ||
        options.retry_interval > std::chrono::hours(1)) {
      return absl::InvalidArgumentError(absl::StrCat("retry_interval must be in (0, 1 h], got ",
                                                     options.retry_interval.count(), " ns"));
    }
    const std::vector<GcraWindow> windows =
        sluice::detail::local_share_windows(shared.windows(), options.share_permille);
    auto local = GcraLimiter<ClockT>::create(windows, options.store, clock);
    if (!local.ok()) return local.status();
    std::unique_ptr<State> state(new State{.local = *std::move(local),
                                           .clock = std::move(clock),
                                           .retry_interval = options.retry_interval,
                                           .shared_max = shared.limit().max_cost(),
                                           .local_max = sluice::detail::smallest_bucket(windows)});
    return LocalFallbackLimiter(std::move(shared), std::move(state));
  }

  // Redis's decision, or while Redis fails the local share's (see the file comment). cost 0
  // peeks. InvalidArgument, with nothing changed, for a cost above the shared limit's smallest
  // burst; every other error of Redis is decided around, so the result is otherwise a decision.
  absl::StatusOr<FallbackDecision> check(std::string_view key, std::uint64_t cost = 1) {
    State& s = *state_;
    if (cost > s.shared_max) {
      return absl::InvalidArgumentError(
          "sluice::redis: cost exceeds the smallest burst of the limit and can never pass");
    }
    if (s.probe.should_call(now(), s.retry_interval)) {
      absl::StatusOr<Decision> d = shared_.check(key, cost);
      if (d.ok()) {
        s.probe.record_success();
        return FallbackDecision{.decision = *d};
      }
      if (d.status().code() == absl::StatusCode::kInvalidArgument) return d.status();
      s.probe.record_failure(now(), s.retry_interval);
      s.backend_errors.fetch_add(1, std::memory_order_relaxed);
    }
    absl::StatusOr<Decision> d = s.local.check(key, std::min(cost, s.local_max));
    if (!d.ok()) return d.status();
    s.degraded.fetch_add(1, std::memory_order_relaxed);
    return FallbackDecision{.decision = *d, .degraded = true};
  }

  // The key's state without consuming anything: check(key, 0) — Redis's state, or while Redis
  // fails the local share's (then `degraded`, and counted as a degraded decision).
  absl::StatusOr<FallbackDecision> inspect(std::string_view key) { return check(key, 0); }

  // Forgets the key in the local share (always, at once) and in Redis (one round trip, whose
  // error — Unavailable, DeadlineExceeded — is returned: the shared state is then unchanged).
  absl::Status reset(std::string_view key) {
    state_->local.reset(key);
    return shared_.reset(key);
  }

  // Checks decided on the local share (peeks included), over this limiter's life.
  std::uint64_t degraded_decisions() const noexcept {
    return state_->degraded.load(std::memory_order_relaxed);
  }
  // Calls to Redis that failed (each made the following checks local for a retry interval).
  std::uint64_t backend_errors() const noexcept {
    return state_->backend_errors.load(std::memory_order_relaxed);
  }
  // True from a failed call until Redis answers again.
  bool degraded() const noexcept { return state_->probe.failing(); }

  RedisGcraLimiter& shared() noexcept { return shared_; }
  // The local share's limiter: its windows are the scaled ones; stats() counts its keys.
  GcraLimiter<ClockT>& local() noexcept { return state_->local; }

 private:
  struct State {
    GcraLimiter<ClockT> local;
    ClockT clock;
    std::chrono::nanoseconds retry_interval{0};
    std::uint64_t shared_max = 0;  // the shared limit's smallest burst
    std::uint64_t local_max = 0;   // the local share's smallest burst
    sluice::detail::BackendProbe probe{};
    std::atomic<std::uint64_t> degraded{0};
    std::atomic<std::uint64_t> backend_errors{0};
  };

  LocalFallbackLimiter(RedisGcraLimiter shared, std::unique_ptr<State> state)
      : shared_(std::move(shared)), state_(std::move(state)) {}

  std::int64_t now() const { return sluice::detail::saturate_time(state_->clock.now().count()); }

  RedisGcraLimiter shared_;
  std::unique_ptr<State> state_;  // stable address for the atomics; the limiter moves
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_LOCAL_FALLBACK_HPP_
