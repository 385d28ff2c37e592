// sluice/engine/settlement.hpp — what a request's live rules booked, to settle at the actual cost.
//
// A request admitted on an estimated cost (`RequestContext::cost`) opens a settlement
// (BasicRateLimitEngine::evaluate(request, e, settlement)); once the actual cost is known,
// `engine.settle(settlement, actual)` charges or refunds every live rule the difference
// (GcraLimiter::settle's rules: a charge may put a key in debt, a refund gives back only what is
// still booked ahead). Backends with bookings (BookingBackend): in memory and Redis.
//
// Thread-safety: a settlement is settled at most once; `open()` may be read from any thread.
#ifndef SLUICE_ENGINE_SETTLEMENT_HPP_
#define SLUICE_ENGINE_SETTLEMENT_HPP_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/adaptive.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/engine/backend.hpp"

namespace sluice {

template <EngineBackend Backend>
class BasicRateLimitEngine;

// What a request's live rules booked. Move-only, settled at most once. It holds the rules'
// state (not the engine), so it stays valid across reloads and settles the rules that the
// request was evaluated under.
template <EngineBackend Backend>
class BasicSettlement {
 public:
  using Booking = typename detail::BookingOf<Backend>::type;

  bool open() const noexcept { return open_.is_open(); }
  std::uint64_t estimate() const noexcept { return estimate_; }

 private:
  friend class BasicRateLimitEngine<Backend>;

  // Opens the settlement of an admitted request of `cost` once every one of its `live_rules`
  // booked; `factors` are the keys' factors (adaptive rules; empty if none is adaptive).
  void open_for(std::size_t live_rules, std::span<const std::uint32_t> factors,
                std::uint64_t cost) {
    if (cost == 0 || bookings_.size() != live_rules) return;
    estimate_ = cost;
    factors_.assign(factors.begin(), factors.begin() + static_cast<std::ptrdiff_t>(
                                                           factors.empty() ? 0 : live_rules));
    factors_.resize(live_rules, 0);
    open_.open();
  }

  // Settles every booking at `actual` units (an adaptive rule at the factor it was evaluated
  // with). FailedPrecondition if not open; the first error of a rule otherwise (the other rules
  // are still settled).
  absl::Status settle(std::uint64_t actual) requires BookingBackend<Backend> {
    if (actual > (std::uint64_t{1} << 32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("an actual cost must be at most 2^32, got ", actual));
    }
    if (!open_.take()) {
      return absl::FailedPreconditionError("the settlement was settled already or never admitted");
    }
    absl::Status first;
    for (std::size_t i = 0; i < bookings_.size(); ++i) {
      const std::uint32_t factor = factors_[i];
      const std::uint64_t units = factor == 0 ? actual : adaptive_units(actual, factor);
      absl::StatusOr<Decision> d = Backend::settle_booking(bookings_[i], units);
      if (!d.ok() && first.ok()) first = d.status();
    }
    return first;
  }

  std::vector<Booking> bookings_;
  std::vector<std::uint32_t> factors_;  // per booking: an adaptive rule's factor, else 0
  std::uint64_t estimate_ = 0;
  detail::OpenFlag open_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SETTLEMENT_HPP_
