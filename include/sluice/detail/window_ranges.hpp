// Internal: the ranges of windows each backend decides exactly, and the one check of a window
// against a range. The in-memory limiters (sluice/gcra.hpp, sluice/direct_gcra.hpp,
// sluice/fixed_window.hpp), PostgreSQL (sluice/postgres/limit.hpp) and Redis
// (sluice/redis/limit.hpp) all validate here, so a range and its error text exist once.
//
//   absl::Status s = check_gcra_window(w, kGcraRange, "windows[1]");
//   // InvalidArgument "windows[1].period must be > 0, got 0ns", or OK
//
// Thread-safety: pure functions.
#ifndef SLUICE_DETAIL_WINDOW_RANGES_HPP_
#define SLUICE_DETAIL_WINDOW_RANGES_HPP_

#include <bit>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/window.hpp"

namespace sluice::detail {

// The GCRA windows a backend takes: 1 ≤ requests ≤ max_requests, 1 ns ≤ period ≤ max_period,
// 1 ≤ burst ≤ max_burst (0 means requests), and a refill time burst·period/requests (the time
// a drained window takes to fill again) of at most max_refill, compared exactly.
struct GcraRange {
  std::uint64_t max_requests;
  std::uint64_t max_period;  // ns
  std::uint64_t max_burst;
  std::uint64_t max_refill;  // ns
};

// The fixed windows a backend takes: 1 ≤ limit ≤ max_limit, 1 ns ≤ window ≤ max_window.
struct FixedRange {
  std::uint64_t max_limit;
  std::uint64_t max_window;  // ns
};

inline constexpr std::uint64_t kNoBound = std::numeric_limits<std::uint64_t>::max();

// In memory and in PostgreSQL: no product of the GCRA arithmetic overflows 128 bits, no
// fixed-window count overflows 64.
inline constexpr GcraRange kGcraRange{.max_requests = std::uint64_t{1} << 32,
                                      .max_period = std::uint64_t{1} << 55,
                                      .max_burst = std::uint64_t{1} << 32,
                                      .max_refill = std::uint64_t{1} << 60};
inline constexpr FixedRange kFixedRange{.max_limit = std::uint64_t{1} << 62,
                                        .max_window = std::uint64_t{1} << 60};

// In Redis: every value the scripts handle stays an exact double (below 2^53).
inline constexpr GcraRange kRedisGcraRange{.max_requests = (std::uint64_t{1} << 52) - 1,
                                           .max_period = kNoBound,
                                           .max_burst = kNoBound,
                                           .max_refill = std::uint64_t{1} << 52};
inline constexpr FixedRange kRedisFixedRange{.max_limit = (std::uint64_t{1} << 52) - 1,
                                             .max_window = std::uint64_t{1} << 52};

// `bound` as a message writes it: "2^32", "2^52 - 1", or its digits.
inline std::string bound_text(std::uint64_t bound) {
  if (std::has_single_bit(bound)) return absl::StrCat("2^", std::countr_zero(bound));
  if (std::has_single_bit(bound + 1)) {
    return absl::StrCat("2^", std::countr_zero(bound + 1), " - 1");
  }
  return absl::StrCat(bound);
}

// OK iff `count` (of a window's `field`, e.g. "requests") is in [1, max]; else InvalidArgument
// naming it under `path`.
inline absl::Status check_amount(std::uint64_t count, std::uint64_t max, absl::string_view path,
                                 absl::string_view field) {
  if (count >= 1 && count <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(path, ".", field, " must be in [1, ", bound_text(max), "], got ", count));
}

// OK iff the duration `ns` (a window's `field`, e.g. "period") is in [1 ns, max]; else
// InvalidArgument naming it under `path`.
inline absl::Status check_duration(std::int64_t ns, std::uint64_t max, absl::string_view path,
                                   absl::string_view field) {
  if (ns <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ".", field, " must be > 0, got ", ns, "ns"));
  }
  if (static_cast<std::uint64_t>(ns) > max) {
    return absl::InvalidArgumentError(absl::StrCat(path, ".", field, " must be at most ",
                                                   bound_text(max), " ns, got ", ns, "ns"));
  }
  return absl::OkStatus();
}

// OK iff `w` is in `range`; else InvalidArgument naming the first bad value under `path` (e.g.
// "windows[1].period must be > 0, got 0ns"). The refill check is exact:
// burst·period/requests ≤ max_refill  ⇔  burst·period ≤ max_refill·requests, in 128 bits.
inline absl::Status check_gcra_window(const GcraWindow& w, const GcraRange& range,
                                      absl::string_view path) {
  if (absl::Status s = check_amount(w.requests, range.max_requests, path, "requests"); !s.ok()) {
    return s;
  }
  if (absl::Status s = check_duration(w.period.count(), range.max_period, path, "period");
      !s.ok()) {
    return s;
  }
  const std::uint64_t burst = w.burst == 0 ? w.requests : w.burst;
  if (absl::Status s = check_amount(burst, range.max_burst, path, "burst"); !s.ok()) return s;
  const absl::uint128 refill_scaled =
      absl::uint128(burst) * static_cast<std::uint64_t>(w.period.count());
  if (refill_scaled > absl::uint128(range.max_refill) * w.requests) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ".burst × period / requests must be at most ", bound_text(range.max_refill), " ns"));
  }
  return absl::OkStatus();
}

// OK iff `w` is in `range`; else InvalidArgument naming the first bad value under `path`.
inline absl::Status check_fixed_window(const FixedWindow& w, const FixedRange& range,
                                       absl::string_view path) {
  if (absl::Status s = check_amount(w.limit, range.max_limit, path, "limit"); !s.ok()) return s;
  return check_duration(w.window.count(), range.max_window, path, "window");
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_WINDOW_RANGES_HPP_
