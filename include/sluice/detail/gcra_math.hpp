// Internal: the GCRA rules every in-process GCRA limiter shares — which windows are supported.
// GcraLimiter (sluice/gcra.hpp) and DirectGcraLimiter (sluice/direct_gcra.hpp) both validate
// their windows here, so the supported range and its error text exist once.
#ifndef SLUICE_DETAIL_GCRA_MATH_HPP_
#define SLUICE_DETAIL_GCRA_MATH_HPP_

#include <cstdint>
#include <string>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sluice/window.hpp"

namespace sluice::detail {

// OK iff `w` is in the supported range, so that no product of the GCRA arithmetic overflows:
//   1 ≤ requests ≤ 2^32, 1 ns ≤ period ≤ 2^55 ns, 1 ≤ burst ≤ 2^32 (0 means requests),
//   burst·period/requests ≤ 2^60 ns.
// InvalidArgument names the bad value under `path` (e.g. "windows[1].period must be > 0").
inline absl::Status check_gcra_window(const GcraWindow& w, const std::string& path) {
  constexpr std::uint64_t kMaxRequests = std::uint64_t{1} << 32;
  constexpr std::int64_t kMaxPeriod = std::int64_t{1} << 55;
  constexpr std::uint64_t kMaxBurst = std::uint64_t{1} << 32;
  constexpr std::uint64_t kMaxTolerance = std::uint64_t{1} << 60;
  if (w.requests < 1 || w.requests > kMaxRequests) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ".requests must be in [1, 2^32], got ", w.requests));
  }
  if (w.period.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ".period must be > 0, got ", w.period.count(), "ns"));
  }
  if (w.period.count() > kMaxPeriod) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ".period must be at most 2^55 ns, got ", w.period.count(), "ns"));
  }
  const std::uint64_t burst = w.burst == 0 ? w.requests : w.burst;
  if (burst > kMaxBurst) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ".burst must be in [1, 2^32], got ", burst));
  }
  const absl::uint128 tolerance =
      absl::uint128(burst) * static_cast<std::uint64_t>(w.period.count());
  if (tolerance / w.requests > kMaxTolerance) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ".burst × period / requests must be at most 2^60 ns"));
  }
  return absl::OkStatus();
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_GCRA_MATH_HPP_
