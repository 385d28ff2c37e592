// sluice/redis/detail/fixed_reply.hpp — a fixed-window item's decision from the script's reply,
// recomputed. Internal.
//
// The state of a fixed-window key (layout in sluice/redis/script.hpp) holds, per window, the ns
// its window had left when the key was written and its count. This side drains the elapsed
// time, adds the item's cost and decides exactly as sluice::FixedWindowLimiter would; any value
// out of range is a malformed reply (Internal), never a decision.
//
// Complexity: O(windows). Thread-safety: pure functions.
#ifndef SLUICE_REDIS_DETAIL_FIXED_REPLY_HPP_
#define SLUICE_REDIS_DETAIL_FIXED_REPLY_HPP_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/numeric/int128.h"
#include "sluice/decision.hpp"
#include "sluice/redis/detail/exact_double.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/window.hpp"

namespace sluice::redis::detail {

// One fixed window of one item at the decision: the ns its window has left (0: closed, the
// item opens a new one), its count before and after the item's cost, and its limit.
struct FixedCount {
  std::uint64_t left = 0;
  std::uint64_t before = 0;
  std::uint64_t after = 0;
  std::uint64_t limit = 0;
  std::uint64_t length = 0;  // the window's full length, ns
  // The time until this window ends once it counts `used`: 0 for a window that counts nothing.
  std::uint64_t ends_in(std::uint64_t used) const {
    if (used == 0) return 0;
    return left == 0 ? length : left;
  }
};

// Each window's state as stored (when `present`), drained by `elapsed` ns, with `cost` added.
inline std::optional<std::vector<FixedCount>> read_fixed_windows(std::string_view in,
                                                                 std::size_t& pos,
                                                                 const CheckItem& item,
                                                                 bool present,
                                                                 absl::uint128 elapsed) {
  const std::vector<GcraWindow>& windows = item.limit->windows();
  std::vector<FixedCount> counts(windows.size());
  for (std::size_t i = 0; i < windows.size(); ++i) {
    FixedCount& c = counts[i];
    c.limit = windows[i].requests;
    c.length = static_cast<std::uint64_t>(windows[i].period.count());
    if (present) {
      // A window never has more time left than its length (the script opens each at its full
      // length and only drains it).
      const auto left = read_double(in, pos, c.length);
      const auto count = read_double(in, pos, c.limit);
      if (!left || !count) return std::nullopt;
      if (absl::uint128(*left) > elapsed) {
        c.left = *left - absl::Uint128Low64(elapsed);
        c.before = *count;
      }
    }
    c.after = c.before + item.cost;
  }
  return counts;
}

inline bool fixed_admits(std::span<const FixedCount> counts) {
  return std::all_of(counts.begin(), counts.end(),
                     [](const FixedCount& c) { return c.after <= c.limit; });
}

// Admitted: binding the least remaining after it (ties: the shorter window), reset_after until
// its end. Denied: binding the first denying window, retry_after until every denying one ends.
inline Decision fixed_decision(std::span<const FixedCount> counts) {
  Decision d;
  if (fixed_admits(counts)) {
    std::optional<std::uint64_t> least;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const std::uint64_t remaining = counts[i].limit - counts[i].after;
      if (!least || remaining < *least) {
        least = remaining;
        d.binding_window = i;
      }
    }
    const FixedCount& b = counts[d.binding_window];
    d.reason = Reason::kAllowed;
    d.limit = b.limit;
    d.remaining = *least;
    d.reset_after = std::chrono::nanoseconds(b.ends_in(b.after));
    return d;
  }
  std::optional<std::size_t> binding;
  std::uint64_t wait = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (counts[i].after <= counts[i].limit) continue;
    if (!binding) binding = i;
    wait = std::max(wait, counts[i].left == 0 ? counts[i].length : counts[i].left);
  }
  const FixedCount& b = counts[*binding];
  d.reason = Reason::kQuotaExceeded;
  d.binding_window = *binding;
  d.limit = b.limit;
  d.remaining = b.limit - b.before;
  d.retry_after = std::chrono::nanoseconds(wait);
  d.reset_after = std::chrono::nanoseconds(b.ends_in(b.before));
  return d;
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_FIXED_REPLY_HPP_
