// Internal: the two rules of the `local` failure mode, shared by the policy engine
// (sluice/engine.hpp) and sluice::redis::LocalFallbackLimiter (sluice/redis/local_fallback.hpp):
// the share of a limit that one replica enforces in process while its shared backend fails, and
// when a failing backend is tried again.
#ifndef SLUICE_DETAIL_LOCAL_MODE_HPP_
#define SLUICE_DETAIL_LOCAL_MODE_HPP_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

#include "sluice/window.hpp"

namespace sluice::detail {

// A share is given in permille of the configured limit: 1 ... kPermille.
inline constexpr std::uint64_t kPermille = 1000;

// floor(count × permille / 1000), at least 1: exact for every count (no product can overflow).
// Requires permille ≤ kPermille.
constexpr std::uint64_t local_share(std::uint64_t count, std::uint64_t permille) noexcept {
  const std::uint64_t scaled =
      count / kPermille * permille + count % kPermille * permille / kPermille;
  return scaled == 0 ? 1 : scaled;
}

// `windows` with each window's requests and explicit burst scaled by local_share (a burst of 0
// stays 0: it means the window's scaled requests); periods are unchanged.
inline std::vector<GcraWindow> local_share_windows(std::vector<GcraWindow> windows,
                                                   std::uint64_t permille) {
  for (GcraWindow& w : windows) {
    w.requests = local_share(w.requests, permille);
    if (w.burst != 0) w.burst = local_share(w.burst, permille);
  }
  return windows;
}

// The smallest bucket of `windows` (a burst of 0 means the window's requests): the largest cost
// they can ever admit.
inline std::uint64_t smallest_bucket(const std::vector<GcraWindow>& windows) noexcept {
  std::uint64_t out = std::numeric_limits<std::uint64_t>::max();
  for (const GcraWindow& w : windows) {
    const std::uint64_t bucket = w.burst == 0 ? w.requests : w.burst;
    out = bucket < out ? bucket : out;
  }
  return out;
}

// When to call a backend that may be failing. Healthy (the start): every call goes to the
// backend. After a failure ending at t, calls before t + interval do not call it (the caller
// decides locally at once instead of waiting for a timeout); the first call at or after that
// instant claims the probe — the next probe moves an interval on in the same atomic step, so at
// most one caller per interval waits on a backend that still fails — and calls the backend. A
// success makes it healthy again; a failure restarts the interval.
// Thread-safety: lock-free, one atomic word; times are ns on one clock.
class BackendProbe {
 public:
  // Whether the caller at `now` calls the backend (true) or decides locally (false).
  bool should_call(std::int64_t now, std::chrono::nanoseconds interval) noexcept {
    std::int64_t retry_at = retry_at_.load(std::memory_order_acquire);
    while (true) {
      if (retry_at == kHealthy) return true;
      if (now < retry_at) return false;
      if (retry_at_.compare_exchange_weak(retry_at, after(now, interval),
                                          std::memory_order_acq_rel)) {
        return true;
      }
    }
  }
  void record_success() noexcept {
    // A load first: the healthy hot path only reads the shared word.
    if (retry_at_.load(std::memory_order_relaxed) != kHealthy) {
      retry_at_.store(kHealthy, std::memory_order_release);
    }
  }
  void record_failure(std::int64_t now, std::chrono::nanoseconds interval) noexcept {
    retry_at_.store(after(now, interval), std::memory_order_release);
  }
  // True from a failure until the next success.
  bool failing() const noexcept { return retry_at_.load(std::memory_order_acquire) != kHealthy; }

 private:
  // No clock reading equals it: readings are saturated to ±2^62 before they get here.
  static constexpr std::int64_t kHealthy = std::numeric_limits<std::int64_t>::min();

  static std::int64_t after(std::int64_t now, std::chrono::nanoseconds interval) noexcept {
    const std::int64_t d = interval.count() > 0 ? interval.count() : 0;
    return now > std::numeric_limits<std::int64_t>::max() - d
               ? std::numeric_limits<std::int64_t>::max()
               : now + d;
  }

  std::atomic<std::int64_t> retry_at_{kHealthy};  // ns; kHealthy while the backend answers
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_LOCAL_MODE_HPP_
