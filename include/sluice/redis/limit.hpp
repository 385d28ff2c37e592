// sluice/redis/limit.hpp — a validated set of stacked GCRA (or fixed) windows, as the Redis script
// takes it.
//
// A `Limit` is what every Redis check is made against: one to many `sluice::GcraWindow`s, sorted
// shortest period first, each burst filled in, all within the script's exact range. A
// `CheckItem` names one key, one limit and one cost, for `Client::check_all`.
//
//   using namespace std::chrono_literals;
//   absl::StatusOr<sluice::redis::Limit> login = sluice::redis::Limit::create(
//       {{.requests = 5, .period = 60s}, {.requests = 20, .period = 3600s}});
//   if (!login.ok()) return login.status();  // InvalidArgument: empty or out of range
//   const sluice::redis::CheckItem item{.key = user_id, .limit = &*login, .cost = 1};
//
// Units: requests (or cost units) and integer nanoseconds. Thread-safety: immutable values; copy
// freely and share between threads.
#ifndef SLUICE_REDIS_LIMIT_HPP_
#define SLUICE_REDIS_LIMIT_HPP_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/little_endian.hpp"
#include "sluice/detail/window_ranges.hpp"
#include "sluice/detail/xxhash.hpp"
#include "sluice/window.hpp"

namespace sluice::redis {

// The script keeps every value an exact double (below 2^53), which bounds the windows it takes:
inline constexpr std::uint64_t kMaxRequests = sluice::detail::kRedisGcraRange.max_requests;
// ...and the time a window takes to refill completely, burst × period / requests (≈ 52.1 days).
inline constexpr std::chrono::nanoseconds kMaxRefill{
    static_cast<std::int64_t>(sluice::detail::kRedisGcraRange.max_refill)};

class Client;

// Stacked windows: sorted shortest period first (stable), burst filled in. Immutable.
class Limit {
 public:
  // InvalidArgument for no window, requests outside 1..kMaxRequests, a period ≤ 0, or a refill
  // time above kMaxRefill. O(n log n) in the number of windows.
  static absl::StatusOr<Limit> create(std::vector<GcraWindow> windows);
  // Fixed windows: each admits `limit` units per `window`, anchored per key as
  // sluice::FixedWindowLimiter's. Kept as GcraWindows {limit, window, limit}. InvalidArgument
  // for no window, a limit outside 1..kMaxRequests, or a window outside 1 ns..kMaxRefill.
  static absl::StatusOr<Limit> fixed_window(const std::vector<FixedWindow>& windows);

  const std::vector<GcraWindow>& windows() const noexcept { return windows_; }
  Algorithm algorithm() const noexcept { return algorithm_; }
  // The largest cost that can ever pass: the smallest burst.
  std::uint64_t max_cost() const noexcept { return max_cost_; }

 private:
  friend class Client;
  Limit() = default;

  std::vector<GcraWindow> windows_;
  std::uint64_t max_cost_ = 0;
  std::uint64_t fingerprint_ = 0;  // XXH3-64 of the windows: a changed limit uses fresh keys
  Algorithm algorithm_ = Algorithm::kGcra;
};

// Where a key's state may still be held under an earlier limit: the key it had there.
struct CarriedFrom {
  std::string_view key;
  const Limit* limit = nullptr;
};

// One request against one limit, for `Client::check_all`. `limit` must outlive the call.
// `carried_from` (most recent first; the policy engine sets it for a rule whose windows a reload
// changed): when the key holds no state under `limit`, the client first carries the spent share
// of its state under those limits into `limit`, once (sluice/redis/detail/carry.hpp).
struct CheckItem {
  std::string_view key;
  const Limit* limit = nullptr;
  std::uint64_t cost = 1;
  std::span<const CarriedFrom> carried_from{};
};

inline absl::StatusOr<Limit> Limit::create(std::vector<GcraWindow> windows) {
  if (windows.empty()) {
    return absl::InvalidArgumentError("sluice::redis: a limit needs a window");
  }
  std::stable_sort(windows.begin(), windows.end(),
                   [](const GcraWindow& a, const GcraWindow& b) { return a.period < b.period; });
  std::string bytes;  // the windows, little-endian: what the fingerprint hashes
  Limit limit;
  limit.max_cost_ = std::numeric_limits<std::uint64_t>::max();
  for (std::size_t i = 0; i < windows.size(); ++i) {
    GcraWindow& w = windows[i];
    if (w.burst == 0) {
      w.burst = w.requests;
    }
    if (absl::Status status = sluice::detail::check_gcra_window(
            w, sluice::detail::kRedisGcraRange, absl::StrCat("sluice::redis: windows[", i, "]"));
        !status.ok()) {
      return status;
    }
    limit.max_cost_ = std::min(limit.max_cost_, w.burst);
    for (std::uint64_t v : {w.requests, static_cast<std::uint64_t>(w.period.count()), w.burst}) {
      sluice::detail::append_le64(bytes, v);
    }
  }
  limit.fingerprint_ = XXH3_64bits(bytes.data(), bytes.size());
  limit.windows_ = std::move(windows);
  return limit;
}

inline absl::StatusOr<Limit> Limit::fixed_window(const std::vector<FixedWindow>& windows) {
  std::vector<GcraWindow> gcra;
  for (std::size_t i = 0; i < windows.size(); ++i) {
    const FixedWindow& w = windows[i];
    if (absl::Status status = sluice::detail::check_fixed_window(
            w, sluice::detail::kRedisFixedRange, absl::StrCat("sluice::redis: windows[", i, "]"));
        !status.ok()) {
      return status;
    }
    gcra.push_back({.requests = w.limit, .period = w.window, .burst = w.limit});
  }
  absl::StatusOr<Limit> limit = create(std::move(gcra));
  if (!limit.ok()) return limit.status();
  limit->algorithm_ = Algorithm::kFixedWindow;
  std::string bytes;  // another fingerprint than the same GCRA windows': other keys
  sluice::detail::append_le64(bytes, limit->fingerprint_);
  bytes += "fixed_window";
  limit->fingerprint_ = XXH3_64bits(bytes.data(), bytes.size());
  return limit;
}

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_LIMIT_HPP_
