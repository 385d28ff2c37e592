// sluice/postgres/limit.hpp — a validated limit (GCRA or fixed windows) as the database checks it.
//
// A `Limit` is what a key is checked against: stacked GCRA windows (the semantics of
// sluice::GcraLimiter) or stacked fixed windows (sluice::FixedWindowLimiter), sorted shortest
// first, with a name. The name and the windows are part of every stored key digest: limiters with
// the same name and windows share state (that is how replicas share a budget); a changed limit
// starts from fresh rows, and the old ones become idle and are cleaned up.
//
//   auto login = sluice::postgres::Limit::gcra({{.requests = 5, .period = 60s}}, "login");
//   auto daily = sluice::postgres::Limit::fixed_window({{.limit = 1000, .window = 24h}}, "daily");
//
// Supported ranges are those of the in-memory limiters: GCRA 1 ≤ requests ≤ 2^32,
// 1 ns ≤ period ≤ 2^55 ns, 1 ≤ burst ≤ 2^32, burst·period/requests ≤ 2^60 ns; fixed window
// 1 ≤ limit ≤ 2^62, 1 ns ≤ window ≤ 2^60 ns; 1 to 4 windows. Immutable value; copy freely.
#ifndef SLUICE_POSTGRES_LIMIT_HPP_
#define SLUICE_POSTGRES_LIMIT_HPP_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/little_endian.hpp"
#include "sluice/detail/window_ranges.hpp"
#include "sluice/key.hpp"
#include "sluice/window.hpp"

namespace sluice::postgres {

// The algorithm of a limit; its value is what the database function takes.
enum class Algorithm { kGcra = 1, kFixedWindow = 2 };

class Limit {
 public:
  static absl::StatusOr<Limit> gcra(std::vector<GcraWindow> windows, std::string_view name = {}) {
    if (absl::Status s = check_count(windows.size()); !s.ok()) return s;
    std::stable_sort(windows.begin(), windows.end(),
                     [](const GcraWindow& a, const GcraWindow& b) { return a.period < b.period; });
    Limit limit(Algorithm::kGcra, name);
    for (std::size_t i = 0; i < windows.size(); ++i) {
      GcraWindow& w = windows[i];
      if (w.burst == 0) w.burst = w.requests;
      const std::string path = absl::StrCat("sluice::postgres: windows[", i, "]");
      if (absl::Status s = sluice::detail::check_gcra_window(w, sluice::detail::kGcraRange, path);
          !s.ok()) {
        return s;
      }
      limit.add({static_cast<std::int64_t>(w.requests), w.period.count(),
                 static_cast<std::int64_t>(w.burst)},
                w.burst);
    }
    limit.gcra_windows_ = std::move(windows);
    return limit;
  }

  static absl::StatusOr<Limit> fixed_window(std::vector<FixedWindow> windows,
                                            std::string_view name = {}) {
    if (absl::Status s = check_count(windows.size()); !s.ok()) return s;
    std::stable_sort(
        windows.begin(), windows.end(),
        [](const FixedWindow& a, const FixedWindow& b) { return a.window < b.window; });
    Limit limit(Algorithm::kFixedWindow, name);
    for (std::size_t i = 0; i < windows.size(); ++i) {
      const FixedWindow& w = windows[i];
      const std::string path = absl::StrCat("sluice::postgres: windows[", i, "]");
      if (absl::Status s = sluice::detail::check_fixed_window(w, sluice::detail::kFixedRange, path);
          !s.ok()) {
        return s;
      }
      limit.add({static_cast<std::int64_t>(w.limit), w.window.count(), 0}, w.limit);
    }
    limit.fixed_windows_ = std::move(windows);
    return limit;
  }

  Algorithm algorithm() const noexcept { return algorithm_; }
  // Per window, shortest first: GCRA (requests, period ns, burst) or fixed (limit, window ns, 0).
  const std::vector<std::array<std::int64_t, 3>>& parameters() const noexcept { return params_; }
  // The windows as given (sorted, bursts filled in); empty for the other algorithm.
  const std::vector<GcraWindow>& gcra_windows() const noexcept { return gcra_windows_; }
  const std::vector<FixedWindow>& fixed_windows() const noexcept { return fixed_windows_; }
  // The largest cost that can ever pass: the smallest burst (or fixed-window limit).
  std::uint64_t max_cost() const noexcept { return max_cost_; }
  // The bytes that prefix every key of this limit before hashing: name, algorithm, windows.
  const std::string& identity() const noexcept { return identity_; }

 private:
  Limit(Algorithm algorithm, std::string_view name) : algorithm_(algorithm) {
    append_key_part(identity_, name);
    identity_.push_back(static_cast<char>(algorithm));
  }

  static absl::Status check_count(std::size_t count) {
    if (count < 1 || count > 4) {
      return absl::InvalidArgumentError("sluice::postgres: a limit has 1 to 4 windows");
    }
    return absl::OkStatus();
  }

  void add(const std::array<std::int64_t, 3>& p, std::uint64_t capacity) {
    params_.push_back(p);
    max_cost_ = std::min(max_cost_, capacity);
    for (std::int64_t v : p) sluice::detail::append_le64(identity_, static_cast<std::uint64_t>(v));
  }

  Algorithm algorithm_;
  std::vector<std::array<std::int64_t, 3>> params_;
  std::vector<GcraWindow> gcra_windows_;
  std::vector<FixedWindow> fixed_windows_;
  std::uint64_t max_cost_ = std::numeric_limits<std::uint64_t>::max();
  std::string identity_;
};

}  // namespace sluice::postgres

#endif  // SLUICE_POSTGRES_LIMIT_HPP_
