// Internal: what the in-memory limiters share — the window-count dispatch over stores of
// fixed-size cells, time clamping, cost validation and deciding a repeated key in order.
#ifndef SLUICE_DETAIL_LIMITER_COMMON_HPP_
#define SLUICE_DETAIL_LIMITER_COMMON_HPP_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sluice/decision.hpp"
#include "sluice/detail/open_flag.hpp"
#include "sluice/store.hpp"

namespace sluice {

// Most windows one limiter stacks. Each count has its own cell size, so a one-window limiter pays
// for one window only.
inline constexpr std::size_t kMaxWindows = 4;

namespace detail {

// Supported clock range: readings are saturated to [-2^62, 2^62] ns (±146 years).
inline constexpr std::int64_t kMaxTime = std::int64_t{1} << 62;

inline std::int64_t saturate_time(std::int64_t now) noexcept {
  return now > kMaxTime ? kMaxTime : (now < -kMaxTime ? -kMaxTime : now);
}

// A number no other limiter of the process was given (1, 2, ...): the limiter a reservation or
// receipt was booked on records it, so that another limiter, even one under the same digest seed,
// never gives back what it did not book. Thread-safe.
inline std::uint64_t new_limiter_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// A ShardedStore for each supported window count; a limiter holds the one for its count.
template <template <std::size_t> class Cell, class Seq = std::make_index_sequence<kMaxWindows>>
struct StoreVariantOf;
template <template <std::size_t> class Cell, std::size_t... I>
struct StoreVariantOf<Cell, std::index_sequence<I...>> {
  using type = std::variant<ShardedStore<Cell<I + 1>>...>;
};
template <template <std::size_t> class Cell>
using StoreVariant = typename StoreVariantOf<Cell>::type;

// std::visit(fn, stores) as a chain of index tests, inlined whole into the caller. GCC 12 calls
// std::visit's alternatives out of line and SLP-vectorizes their captures into 16-byte loads of
// fields just stored as 8-byte words: a store-forwarding stall on every hot check (three
// stacked windows, frozen clock: 31 -> 26 ns, one window 21 -> 20 ns, -O3).
template <std::size_t I = 0, class Variant, class Fn>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline decltype(auto) visit_store(Variant& stores, Fn&& fn) {
  if constexpr (I + 1 < std::variant_size_v<std::remove_const_t<Variant>>) {
    if (stores.index() != I) return visit_store<I + 1>(stores, fn);
  }
  return fn(*std::get_if<I>(&stores));
}

// A reload's window matching (GcraLimiter::carry_from, FixedWindowLimiter::carry_from): for each
// of `count` new windows, the index of the last of `old_count` old windows that `same(i, j)`
// says has its length, or the only old window when both sides have exactly one; kMaxWindows
// where none matches. O(count · old_count).
template <class Same>
std::array<std::size_t, kMaxWindows> match_windows(std::size_t count, std::size_t old_count,
                                                   Same same) {
  std::array<std::size_t, kMaxWindows> source{};
  for (std::size_t i = 0; i < count; ++i) {
    source[i] = kMaxWindows;
    for (std::size_t j = 0; j < old_count; ++j) {
      if ((count == 1 && old_count == 1) || same(i, j)) source[i] = j;
    }
  }
  return source;
}

// The store for `windows` windows (1 ≤ windows ≤ kMaxWindows).
template <template <std::size_t> class Cell, std::size_t I = 0>
StoreVariant<Cell> make_store(std::size_t windows, const StoreOptions& options) {
  if constexpr (I + 1 < kMaxWindows) {
    if (windows != I + 1) return make_store<Cell, I + 1>(windows, options);
  }
  return StoreVariant<Cell>(std::in_place_index<I>, options);
}

// InvalidArgument unless 1 ≤ count ≤ kMaxWindows.
inline absl::Status check_window_count(std::size_t count) {
  if (count == 0) return absl::InvalidArgumentError("windows must not be empty");
  if (count > kMaxWindows) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", kMaxWindows, " windows are supported, got ", count));
  }
  return absl::OkStatus();
}

inline absl::Status cost_error(std::uint64_t cost, std::uint64_t max_cost, std::size_t window) {
  return absl::InvalidArgumentError(absl::StrCat("cost ", cost, " exceeds the burst ", max_cost,
                                                 " of window ", window,
                                                 " and can never be admitted"));
}

// The binding window of an admission: the index i in [0, n) with the least `remaining(i)`, and
// that value; ties go to the lower index (the shorter period, or the higher precedence). n ≥ 1.
struct LeastRemaining {
  std::size_t index = 0;
  std::uint64_t remaining = 0;
};
template <class Remaining>
LeastRemaining least_remaining(std::size_t n, Remaining&& remaining) {
  LeastRemaining least{0, remaining(std::size_t{0})};
  for (std::size_t i = 1; i < n; ++i) {
    const std::uint64_t r = remaining(i);
    if (r < least.remaining) least = {i, r};
  }
  return least;
}

// Decides `costs[k]` into `*outs[k]` in order at `now`, each after the admitted ones before it
// (a request naming the key more than once), on a copy of the key's cell in `stores` (a fresh
// cell for an absent key, which is not inserted): commits nothing. `decide(cell, now, cost, out)`
// decides one cost on the copy and takes it there when admitted.
template <class Stores, class Decide>
void decide_in_order_locked(Stores& stores, const HeldShardLocks& held, const KeyDigest& d,
                            std::int64_t now, std::span<const std::uint64_t> costs,
                            std::span<Decision* const> outs, Decide&& decide) {
  std::visit(
      [&](auto& store) {
        const auto* cell = store.find_locked(held, d, now);
        auto copy = cell != nullptr ? *cell : std::remove_cvref_t<decltype(*cell)>{};
        for (std::size_t k = 0; k < costs.size(); ++k) decide(copy, now, costs[k], *outs[k]);
      },
      stores);
}

inline Decision store_full_decision(const StoreFull& full) {
  return Decision{.reason = Reason::kStoreFull,
                  .retry_after = std::chrono::nanoseconds{full.retry_after_ns}};
}

}  // namespace detail
}  // namespace sluice

#endif  // SLUICE_DETAIL_LIMITER_COMMON_HPP_
