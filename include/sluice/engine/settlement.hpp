// sluice/engine/settlement.hpp — what a request's rules booked, to settle at the actual cost.
//
// A request admitted on an estimated cost (`RequestContext::cost`) opens a settlement
// (BasicRateLimitEngine::evaluate(request, e, settlement)); once the actual cost is known,
// `engine.settle(settlement, actual)` charges or refunds every live rule the difference, and
// every dry-run rule that admitted the request, as if it were enforcing (GcraLimiter::settle's
// rules: a charge may put a key in debt, a refund gives back only what is still booked ahead).
// Backends with bookings (BookingBackend): in memory and Redis.
//
// Memory: evaluating into a settlement reuses its storage, so a caller that keeps one per thread
// allocates nothing for an estimate and its settlement on an in-memory engine.
// Thread-safety: a settlement is settled at most once; `open()` may be read from any thread.
#ifndef SLUICE_ENGINE_SETTLEMENT_HPP_
#define SLUICE_ENGINE_SETTLEMENT_HPP_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
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
  // booked; `factors` are the keys' factors, live rules then `dry_rules` dry-run ones (adaptive
  // rules; empty if none is adaptive). The dry-run rules' bookings, there if their group admitted
  // the request, are settled with the live ones: a dry run is charged as the rule enforced is.
  void open_for(std::size_t live_rules, std::size_t dry_rules,
                std::span<const std::uint32_t> factors, std::uint64_t cost) {
    if (cost == 0 || bookings_.size() != live_rules) return;
    if (dry_bookings_.size() != dry_rules) dry_bookings_.clear();
    estimate_ = cost;
    factors_of(factors, 0, live_rules, factors_);
    factors_of(factors, live_rules, dry_bookings_.size(), dry_factors_);
    open_.open();
  }

  // `count` factors of `factors` from `first` into `out` (0s if no rule is adaptive).
  static void factors_of(std::span<const std::uint32_t> factors, std::size_t first,
                         std::size_t count, std::vector<std::uint32_t>& out) {
    out.assign(count, 0);
    if (!factors.empty()) {
      std::copy_n(factors.begin() + static_cast<std::ptrdiff_t>(first), count, out.begin());
    }
  }

  // Settles every booking at `actual` units (an adaptive rule at the factor it was evaluated
  // with), together where the backend settles a request's bookings by one deadline
  // (BatchSettlingBackend). FailedPrecondition if not open; the first error of a rule otherwise
  // (the other rules are still settled).
  absl::Status settle(std::uint64_t actual) requires BookingBackend<Backend> {
    if (actual > (std::uint64_t{1} << 32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("an actual cost must be at most 2^32, got ", actual));
    }
    if (!open_.take()) {
      return absl::FailedPreconditionError("the settlement was settled already or never admitted");
    }
    if constexpr (BatchSettlingBackend<Backend>) {
      return settle_together(actual);
    } else {
      absl::Status first;  // the first live rule's error
      for (std::size_t i = 0; i < bookings_.size(); ++i) {
        absl::StatusOr<Decision> d =
            Backend::settle_booking(bookings_[i], units_of(factors_[i], actual));
        if (!d.ok() && first.ok()) first = d.status();
      }
      for (std::size_t i = 0; i < dry_bookings_.size(); ++i) {  // a dry run fails nothing
        (void)Backend::settle_booking(dry_bookings_[i], units_of(dry_factors_[i], actual));
      }
      return first;
    }
  }

  // settle's body for a backend that settles a request's bookings together.
  absl::Status settle_together(std::uint64_t actual) {
    // Live bookings, then dry-run ones, each with the units its rule is settled at.
    std::vector<const Booking*> all;
    std::vector<std::uint64_t> units;
    for (std::size_t i = 0; i < bookings_.size(); ++i) {
      all.push_back(&bookings_[i]);
      units.push_back(units_of(factors_[i], actual));
    }
    for (std::size_t i = 0; i < dry_bookings_.size(); ++i) {
      all.push_back(&dry_bookings_[i]);
      units.push_back(units_of(dry_factors_[i], actual));
    }
    const std::vector<absl::StatusOr<Decision>> settled = Backend::settle_bookings(all, units);
    for (std::size_t i = 0; i < bookings_.size(); ++i) {  // a dry run fails nothing
      if (!settled[i].ok()) return settled[i].status();
    }
    return absl::OkStatus();
  }

  // Closes it and forgets its bookings, keeping their storage for the next request.
  void clear() noexcept {
    open_.take();
    bookings_.clear();
    factors_.clear();
    dry_bookings_.clear();
    dry_factors_.clear();
    estimate_ = 0;
  }

  static std::uint64_t units_of(std::uint32_t factor, std::uint64_t actual) {
    return factor == 0 ? actual : adaptive_units(actual, factor);
  }

  std::vector<Booking> bookings_;       // the live rules'
  std::vector<std::uint32_t> factors_;  // per booking: an adaptive rule's factor, else 0
  std::vector<Booking> dry_bookings_;   // the dry-run rules', if their group admitted the request
  std::vector<std::uint32_t> dry_factors_;
  std::uint64_t estimate_ = 0;
  detail::OpenFlag open_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_SETTLEMENT_HPP_
