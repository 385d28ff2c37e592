// sluice/gcra.hpp — the GCRA (generic cell rate algorithm) limiter, with stacked windows.
//
// A window admits `requests` per `period` with a bucket of `burst` (default: `requests`). A key's
// state is one theoretical arrival time (TAT) per window; a request of cost c is admitted iff,
// in every window, max(TAT, now) + c·T − now ≤ burst·T, where T = period / requests is the
// emission interval. Stacked windows are atomic: the request is admitted only if every window
// admits it, and a denied request changes nothing in any window.
//
//   using namespace std::chrono_literals;
//   auto limiter = sluice::GcraLimiter<>::create({{.requests = 10, .period = 1s, .burst = 20},
//                                                 {.requests = 600, .period = 60s}});
//   if (!limiter.ok()) return limiter.status();  // InvalidArgument naming the bad value
//   absl::StatusOr<sluice::Decision> d = limiter->check(client_ip);      // cost 1
//   absl::StatusOr<sluice::Decision> peek = limiter->check(client_ip, 0);  // no state change
//
// Exactness: TATs are kept as whole nanoseconds plus a fraction in units of 1/requests ns, and
// every comparison is done scaled by `requests` in 128-bit integers, so 3 per second admits at
// exactly ceil(k·10⁹/3) ns forever, with no drift and no floating point. retry_after and
// reset_after are rounded up to the nanosecond: waiting exactly retry_after always suffices.
//
// Supported range (checked by `create`, so that no product can overflow):
//   1 ≤ requests ≤ 2^32, 1 ns ≤ period ≤ 2^55 ns (≈ 417 days), 1 ≤ burst ≤ 2^32,
//   burst·period/requests ≤ 2^60 ns, at most kMaxWindows windows. Clock readings are saturated to
//   ±2^62 ns; a reading earlier than one already seen is clamped to it.
//
// Beyond admit/deny: `reserve` books the earliest instant at which a cost fits (a caller paces
// itself instead of being refused; `cancel` gives the booking back, `wait` sleeps until it);
// `check_estimated` admits on an estimated cost and `settle` charges or refunds the difference
// once the actual cost is known; `inspect` and `reset` serve operators. A key can be in debt (a
// settled charge beyond its bucket, or reservations booked ahead): until it is paid off every
// check, including a peek, is denied with the wait.
//
// Thread-safety: every member function may be called concurrently from any threads; each call
// takes one shard lock (`wait` sleeps without holding it). Complexity: O(windows) per call, O(1)
// expected store work.
#ifndef SLUICE_GCRA_HPP_
#define SLUICE_GCRA_HPP_

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/detail/gcra_booking.hpp"
#include "sluice/detail/gcra_cell.hpp"
#include "sluice/detail/gcra_decide.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/rate_limiter.hpp"
#include "sluice/store.hpp"
#include "sluice/window.hpp"

namespace sluice {

template <Clock ClockT = SteadyClock>
class GcraLimiter {
 public:
  // Validates `options` (sluice::validate) and `windows`, and sorts `windows` shortest period
  // first (stable). InvalidArgument names the first bad value, e.g. "windows[1].period must be
  // > 0".
  static absl::StatusOr<GcraLimiter> create(std::vector<GcraWindow> windows,
                                            StoreOptions options = {}, ClockT clock = {}) {
    if (absl::Status s = detail::check_window_count(windows.size()); !s.ok()) return s;
    if (absl::Status s = sluice::validate(options); !s.ok()) return s;
    std::vector<detail::GcraParams> params;
    for (std::size_t i = 0; i < windows.size(); ++i) {
      auto p = detail::gcra_params(windows[i], absl::StrCat("windows[", i, "]"));
      if (!p.ok()) return p.status();
      params.push_back(*p);
      if (windows[i].burst == 0) windows[i].burst = windows[i].requests;
    }
    std::vector<std::size_t> order(windows.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return params[a].period < params[b].period;
    });
    GcraLimiter limiter(std::move(clock), options, windows.size());
    for (std::size_t i : order) {
      limiter.windows_.push_back(windows[i]);
      limiter.params_.push_back(params[i]);
      limiter.max_cost_ = std::min(limiter.max_cost_, params[i].burst);
    }
    return limiter;
  }

  // Admits a request of `cost` units for `key` if every window has room, reserving it; `cost` 0
  // only reports. InvalidArgument (state untouched) if cost exceeds a window's burst.
  absl::StatusOr<Decision> check(std::string_view key, std::uint64_t cost = 1) {
    // One named result on every path, so that it is constructed in the caller's slot (NRVO) and
    // the decision is written there field by field, never copied. The lambdas are inlined even
    // at -O2, where GCC would otherwise call each of them; detail::visit_store, not std::visit,
    // so that the store's work is inlined here too instead of being called with its captures
    // passed through memory.
    absl::StatusOr<Decision> result(absl::in_place);
    if (cost > max_cost_) {
      result = cost_error(cost);
      return result;
    }
    const std::int64_t at = now();
    Decision& out = *result;
    detail::visit_store(store_, [&](auto& store) ABSL_ATTRIBUTE_ALWAYS_INLINE {
      store.update(
          store.digest(key), at,
          [&](auto& cell, std::int64_t clamped) ABSL_ATTRIBUTE_ALWAYS_INLINE {
            detail::gcra_decide(params_.data(), cell, clamped, cost, true, out);
            return true;
          },
          [&](const StoreFull& full) {
            store_full(full, out);
            return false;
          });
    });
    return result;
  }

  StoreStats stats() const {
    return std::visit([](const auto& s) { return s.stats(); }, store_);
  }

  // --- Operators: inspect and reset one key. Both may be called concurrently with `check`;
  // each takes one shard lock, O(windows).

  // The key's state without consuming anything: exactly what `check(key, 0)` reports (cost 0
  // fits unless the key is in debt, so reason is kAllowed; in debt it is kQuotaExceeded with
  // remaining 0 and retry_after until the debt is paid; remaining = units a request could take now
  // from the window with the least left, i.e. a request of cost c passes iff c ≤ remaining of every
  // window; reset_after = until that window is full again; retry_after 0). A key never seen, or
  // idle, reports every window full. Stores nothing; clamps the shard's clock like any check.
  Decision inspect(std::string_view key) {
    const std::int64_t at = now();
    Decision out;
    std::visit(
        [&](auto& store) {
          store.update(
              store.digest(key), at,
              [&](auto& cell, std::int64_t clamped) {
                detail::gcra_decide(params_.data(), cell, clamped, 0, false, out);
                return false;
              },
              [&](const StoreFull& full) {  // unreachable: an inspected new key stays idle
                store_full(full, out);
                return false;
              });
        },
        store_);
    return out;
  }

  // Forgets the key: its next request sees every window full, as for a key never seen, and its
  // room in the store is free at once. O(1).
  void reset(std::string_view key) {
    const std::int64_t at = now();
    std::visit([&](auto& store) { store.forget(store.digest(key), at); }, store_);
  }

  // --- Reserve and wait: pace a caller instead of refusing it. Each call takes one shard lock,
  // O(windows), 128-bit integer arithmetic; all may run concurrently with `check`.

  // `cost` booked for one key at an instant that may be in the future. Move-only: a booking is
  // given back at most once. Destroying it gives nothing back (the cost stays booked).
  class Reservation {
   public:
    Reservation() = default;

    // From the clock reading the reservation was made at to its instant; 0: proceed now.
    std::chrono::nanoseconds wait() const noexcept { return std::chrono::nanoseconds{wait_}; }
    // When the cost may be used, as a reading of the limiter's clock.
    std::chrono::nanoseconds instant() const noexcept { return std::chrono::nanoseconds{instant_}; }
    std::uint64_t cost() const noexcept { return cost_; }
    // False once cancelled (or moved from, or default-constructed).
    bool cancellable() const noexcept { return open_.is_open(); }

   private:
    friend class GcraLimiter;
    detail::GcraBooking booking_{};
    std::int64_t instant_ = 0;
    std::int64_t wait_ = 0;
    std::uint64_t cost_ = 0;
    std::uint64_t limiter_ = 0;  // the booking limiter's id_
    detail::OpenFlag open_;      // move-only: acted on at most once
  };

  // No limit on a reservation's wait (up to the supported 2^61 ns).
  static constexpr std::chrono::nanoseconds kNoMaxWait = std::chrono::nanoseconds::max();

  // Books `cost` for `key` at the earliest instant at which it fits in every window: now if it
  // fits now, else the first instant that every window's bucket has room for it. Each window
  // then moves as if a request of `cost` had arrived at that instant, so every check and
  // reservation after it queues behind it. The caller proceeds after `wait()`.
  // Errors, with nothing booked: InvalidArgument if `cost` is 0 or exceeds a window's burst (it
  // could never fit); DeadlineExceeded if the instant is more than `max_wait` away (the message
  // gives the wait); ResourceExhausted if the key is new and its shard is full
  // (Overflow::kRejectNewKeys), or if the instant is more than 2^61 ns away.
  absl::StatusOr<Reservation> reserve(std::string_view key, std::uint64_t cost = 1,
                                      std::chrono::nanoseconds max_wait = kNoMaxWait) {
    if (cost == 0) return absl::InvalidArgumentError("a reservation's cost must be at least 1");
    if (cost > max_cost_) return cost_error(cost);
    absl::StatusOr<Reservation> result(absl::in_place);
    Reservation& out = *result;
    const std::int64_t at = now();
    absl::Status status = std::visit(
        [&](auto& store) {
          out.booking_.digest = store.digest(key);
          return store.update(
              out.booking_.digest, at,
              [&](auto& cell, std::int64_t clamped) {
                out.booking_.forgotten = store.forgotten_in_shard(out.booking_.digest);
                out.limiter_ = id_;
                return book_earliest(cell, clamped, cost, max_wait.count(), out);
              },
              [](const StoreFull& full) {
                return absl::ResourceExhaustedError(absl::StrCat(
                    "the key is new and its shard is full; retry in ", full.retry_after_ns, " ns"));
              });
        },
        store_);
    if (!status.ok()) result = std::move(status);
    return result;
  }

  // Gives back what `reservation` booked, unless the clock has moved past its instant (then the
  // cost counts as used). True iff it gave back; the reservation cannot be cancelled again.
  // Exact: in each window it gives back what the reservation added there (its cost and, when its
  // instant was ahead of the window's state, the gap up to that instant), but never more than
  // the part of that booking still ahead of now, and never past a full bucket. A reservation
  // cancelled right after it was made leaves the key exactly as it was; checks and reservations
  // booked behind it move up by what it gave back. If a live key of its shard was reset or
  // evicted since the reservation (possibly this key), it gives nothing back: the booking may be
  // gone, and what the key holds now may be other requests' (1 shard in 64 per such event).
  // A reservation another limiter booked gives nothing back here (false) and stays open.
  bool cancel(Reservation& reservation) {
    if (reservation.limiter_ != id_ || !reservation.open_.take()) return false;
    const std::int64_t at = now();
    return std::visit(
        [&](auto& store) {
          return store.update_removing_idle(
              reservation.booking_.digest, at,
              [&](auto& cell, std::int64_t clamped) {
                if (clamped > reservation.instant_) return false;
                if (store.forgotten_in_shard(reservation.booking_.digest) !=
                    reservation.booking_.forgotten) {
                  return true;  // the booking may be gone: give nothing back
                }
                detail::give_back(params_.data(), cell, clamped, reservation.booking_,
                                  reservation.booking_.added);
                return true;
              },
              [](const StoreFull&) { return false; });
        },
        store_);
  }

  // For callers that can block: books `cost` for `key` if it fits by `deadline` (a reading of
  // this limiter's clock), then sleeps until its instant with `sleep_for(duration)`. OK once
  // the instant has been reached; DeadlineExceeded if the cost cannot fit by the deadline, and
  // then nothing is booked; the other errors of `reserve`. Thread-safe; blocks only in
  // `sleep_for`. With a ManualClock, pass a sleeper that advances it.
  template <class SleepFor = ThreadSleepFor>
  absl::Status wait(std::string_view key, std::uint64_t cost, std::chrono::nanoseconds deadline,
                    SleepFor&& sleep_for = {}) {
    const std::chrono::nanoseconds start{now()};
    if (deadline < start) return absl::DeadlineExceededError("the deadline has passed");
    // Past the supported clock range the deadline cannot bind (and deadline − start could
    // overflow).
    const std::chrono::nanoseconds room =
        deadline.count() > detail::kMaxTime ? kNoMaxWait : deadline - start;
    absl::StatusOr<Reservation> r = reserve(key, cost, room);
    if (!r.ok()) return r.status();
    if (r->wait() > std::chrono::nanoseconds{0}) sleep_for(r->wait());
    return absl::OkStatus();
  }

  // --- Settled cost: admit on an estimate, charge or refund the difference once the actual
  // cost is known (bytes sent, tokens generated).

  // What an admitted estimated check booked. Move-only: it is settled at most once.
  class Receipt {
   public:
    Receipt() = default;

    std::uint64_t estimate() const noexcept { return estimate_; }
    // True until settled; false for a denied check's receipt.
    bool open() const noexcept { return open_.is_open(); }

   private:
    friend class GcraLimiter;
    detail::GcraBooking booking_{};
    std::uint64_t estimate_ = 0;
    std::uint64_t limiter_ = 0;  // the booking limiter's id_
    detail::OpenFlag open_;      // move-only: acted on at most once
  };
  struct Estimated {
    Decision decision;
    Receipt receipt;  // open iff decision.allowed()
  };

  // `check(key, estimate)` that also returns a receipt of what it booked, for `settle`.
  absl::StatusOr<Estimated> check_estimated(std::string_view key, std::uint64_t estimate) {
    if (estimate > max_cost_) return cost_error(estimate);
    absl::StatusOr<Estimated> result(absl::in_place);
    Estimated& out = *result;
    const std::int64_t at = now();
    std::visit(
        [&](auto& store) {
          out.receipt.booking_.digest = store.digest(key);
          store.update(
              out.receipt.booking_.digest, at,
              [&](auto& cell, std::int64_t clamped) {
                detail::gcra_decide(params_.data(), cell, clamped, estimate, true, out.decision);
                if (out.decision.allowed()) {
                  out.receipt.booking_.forgotten =
                      store.forgotten_in_shard(out.receipt.booking_.digest);
                  out.receipt.limiter_ = id_;
                  record_booking(cell, estimate, out.receipt);
                }
                return true;
              },
              [&](const StoreFull& full) {
                store_full(full, out.decision);
                return false;
              });
        },
        store_);
    return result;
  }

  // Settles `receipt` at `actual` units and returns the key's state after it (as `inspect`).
  // actual > estimate: the difference is charged in every window without an admission test, so
  // the key may go into debt: later requests wait until it is paid off (a charge saturates at
  // 2^61 ns ahead of now). actual < estimate: the surplus is refunded in every window, but only
  // the part of the estimate's booking still ahead of now (what time has already refilled is not
  // refunded twice), never past a full bucket, so the key never ends with more room than it
  // would have had if the check had asked for `actual`; nothing is refunded if a live key of its
  // shard was reset or evicted since the check (as for `cancel`). FailedPrecondition if the receipt
  // is not open (denied, or settled already); InvalidArgument if actual > 2^32 or if another
  // limiter booked the receipt (it stays open, nothing changes); ResourceExhausted
  // if a charge falls on a key that was evicted meanwhile and whose shard is full (nothing
  // charged).
  absl::StatusOr<Decision> settle(Receipt& receipt, std::uint64_t actual) {
    if (actual > kMaxSettledCost) {
      return absl::InvalidArgumentError(
          absl::StrCat("an actual cost must be at most 2^32, got ", actual));
    }
    if (receipt.open_.is_open() && receipt.limiter_ != id_) {
      return absl::InvalidArgumentError("the receipt was booked on another limiter");
    }
    if (!receipt.open_.take()) {
      return absl::FailedPreconditionError("the receipt was settled already or never admitted");
    }
    return settle_booking(receipt.booking_, receipt.estimate_, actual);
  }

  // Bytes held by the key tables (grows with keys, bounded by the store cap). Lock-free.
  std::size_t memory_bytes() const {
    return std::visit([](const auto& s) { return s.table_bytes(); }, store_);
  }

  // The windows, shortest period first, bursts defaulted. Decision::binding_window indexes this.
  const std::vector<GcraWindow>& windows() const noexcept { return windows_; }
  const ClockT& clock() const noexcept { return clock_; }

 private:
  // --- Reload, for the policy engine's in-memory backend: a rule whose windows changed gets a
  // new limiter created with the previous one's digest seed, then carried from it.

  std::uint64_t seed() const {
    return std::visit([](const auto& s) { return s.seed(); }, store_);
  }

  // Carries every live key of `from` into this limiter, which nobody else uses yet. Each window
  // here takes the key's state of `from`'s window with the same period (or, when both limiters
  // have exactly one window, of that window, whatever its period) as detail::carried_tat: the
  // same spent share of the new bucket; any other window starts with its whole bucket, and
  // `from`'s windows without a match are dropped. Needs this store's seed to be `from`'s. Takes
  // `from`'s shard locks one at a time; O(keys + capacity of `from`'s store). Admissions `from`
  // makes after it released a shard's lock are not carried.
  void carry_from(const GcraLimiter& from) {
    constexpr std::size_t kNone = kMaxWindows;
    const auto source = detail::match_windows(
        params_.size(), from.params_.size(),
        [&](std::size_t i, std::size_t j) { return from.params_[j].period == params_[i].period; });
    const std::int64_t at = std::max(now(), from.now());
    std::visit(
        [&](const auto& old_store) {
          std::visit(
              [&](auto& new_store) {
                old_store.for_each_live(at, [&](const KeyDigest& d, const auto& old_cell) {
                  new_store.update(
                      d, at,
                      [&](auto& cell, std::int64_t clamped) {
                        for (std::size_t i = 0; i < params_.size(); ++i) {
                          if (source[i] == kNone) continue;
                          cell.tat[i] =
                              detail::carried_tat(old_cell.tat[source[i]], from.params_[source[i]],
                                                  params_[i], clamped);
                        }
                        return true;
                      },
                      [](const StoreFull&) { return false; });
                });
              },
              store_);
        },
        from.store_);
  }

  // --- Multi-key transactions, for the policy engine's in-memory backend: it adds every key's
  // shard to one ShardLockSet, holds them with HeldShardLocks, decides every key without
  // committing, and admits them all only if every key was admitted.
  template <Clock>
  friend class InMemoryBackend;

  absl::Status validate_cost(std::uint64_t cost) const {
    return cost > max_cost_ ? cost_error(cost) : absl::OkStatus();
  }
  KeyDigest digest(std::string_view key) const {
    return std::visit([&](const auto& s) { return s.digest(key); }, store_);
  }
  void add_lock(ShardLockSet& locks, const KeyDigest& d) const {
    std::visit([&](const auto& s) { locks.add(s, d); }, store_);
  }
  // digest(key), its shard added to `locks`: one dispatch on the store.
  KeyDigest digest_and_lock(std::string_view key, ShardLockSet& locks) const {
    return std::visit(
        [&](const auto& s) {
          const KeyDigest d = s.digest(key);
          locks.add(s, d);
          return d;
        },
        store_);
  }
  // The clock's reading, saturated to the supported range.
  std::int64_t now() const { return detail::saturate_time(clock_.now().count()); }
  // Reserves `cost` iff every window admits it (the cheap second phase).
  bool admit_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t now,
                    std::uint64_t cost) {
    return std::visit(
        [&](auto& store) {
          return store.update_locked(
              held, d, now,
              [&](auto& cell, std::int64_t clamped) {
                return detail::gcra_admit(params_.data(), cell, clamped, cost);
              },
              [](const StoreFull&) { return false; });
        },
        store_);
  }
  // A tracked key's cell as it was before decide_tracked_locked advanced it. Plain words, left
  // uninitialized until used: an engine request keeps eight of these on its stack. `tat` points
  // into the store, so it is valid only until a key is inserted into or removed from this
  // limiter's store (an insert may move cells: ShardedStore::find_locked).
  struct Undo {
    detail::GcraTat* tat;
    std::size_t windows;
    std::array<std::int64_t, kMaxWindows> whole;
    std::array<std::uint64_t, kMaxWindows> fraction;
    void restore() const {
      for (std::size_t i = 0; i < windows; ++i) tat[i] = detail::GcraTat{whole[i], fraction[i]};
    }
  };
  // Writes the decision for `cost` at `now` into `out`. A tracked key that is admitted is
  // reserved at once (true; `undo` puts it back); an absent key is only decided (false: nothing
  // is inserted, so nothing is evicted for a request that may still be denied).
  bool decide_tracked_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t now,
                             std::uint64_t cost, Decision& out, Undo& undo) {
    return std::visit(
        [&](auto& store) {
          auto* cell = store.find_locked(held, d, now);
          if (cell == nullptr) {
            std::remove_pointer_t<decltype(cell)> fresh{};
            detail::gcra_decide(params_.data(), fresh, now, cost, false, out);
            return false;
          }
          undo.tat = cell->tat.data();
          undo.windows = cell->tat.size();
          for (std::size_t i = 0; i < cell->tat.size(); ++i) {
            undo.whole[i] = cell->tat[i].whole;
            undo.fraction[i] = cell->tat[i].fraction;
          }
          detail::gcra_decide(params_.data(), *cell, now, cost, true, out);
          return out.allowed();
        },
        store_);
  }
  // Writes the decision for `cost` at `now` into `out`; reserves it iff `commit` and admitted.
  void decide_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t now,
                     std::uint64_t cost, bool commit, Decision& out) {
    std::visit(
        [&](auto& store) {
          store.update_locked(
              held, d, now,
              [&](auto& cell, std::int64_t clamped) {
                detail::gcra_decide(params_.data(), cell, clamped, cost, commit, out);
                return true;
              },
              [&](const StoreFull& full) {
                store_full(full, out);
                return false;
              });
        },
        store_);
  }

  // Decides `costs[k]` into `*outs[k]` in order at `now`, each after the admitted ones before it,
  // on a copy of the key's cell (detail::decide_in_order_locked): commits nothing.
  void decide_in_order_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t now,
                              std::span<const std::uint64_t> costs,
                              std::span<Decision* const> outs) {
    detail::decide_in_order_locked(
        store_, held, d, now, costs, outs,
        [&](auto& cell, std::int64_t at, std::uint64_t cost, Decision& out) {
          detail::gcra_decide(params_.data(), cell, at, cost, true, out);
        });
  }

  GcraLimiter(ClockT clock, const StoreOptions& options, std::size_t windows)
      : clock_(std::move(clock)), store_(detail::make_store<detail::GcraCell>(windows, options)) {}

  absl::Status cost_error(std::uint64_t cost) const {
    std::size_t window = 0;
    while (params_[window].burst >= cost) ++window;
    return detail::cost_error(cost, params_[window].burst, window);
  }

  void store_full(const StoreFull& full, Decision& out) const {
    out = detail::store_full_decision(full);
    out.limit = params_[0].burst;
  }

  static constexpr std::uint64_t kMaxSettledCost = std::uint64_t{1} << 32;

  // settle's step for a booking of `estimate` (a receipt's, or the engine's), `actual` ≤ 2^32.
  absl::StatusOr<Decision> settle_booking(const detail::GcraBooking& booking,
                                          std::uint64_t estimate, std::uint64_t actual) {
    absl::StatusOr<Decision> result(absl::in_place);
    Decision& out = *result;
    const std::int64_t at = now();
    const bool charged = std::visit(
        [&](auto& store) {
          return store.update_removing_idle(
              booking.digest, at,
              [&](auto& cell, std::int64_t clamped) {
                if (actual > estimate) {
                  detail::charge(params_.data(), cell, clamped, actual - estimate);
                } else if (actual < estimate &&
                           store.forgotten_in_shard(booking.digest) == booking.forgotten) {
                  std::array<absl::int128, kMaxWindows> refund{};
                  for (std::size_t i = 0; i < params_.size(); ++i) {
                    refund[i] = detail::cost_scaled(params_[i], estimate - actual);
                  }
                  detail::give_back(params_.data(), cell, clamped, booking, refund);
                }
                detail::gcra_decide(params_.data(), cell, clamped, 0, false, out);
                return true;
              },
              [](const StoreFull&) { return false; });
        },
        store_);
    if (!charged) {
      result = absl::ResourceExhaustedError(
          "the key is no longer tracked and its shard is full: nothing was charged");
    }
    return result;
  }

  // After an admission of `cost` under `held`, and of `later` more units admitted after it for
  // the same key (a request that repeats the key): what the admission of `cost` left the key's
  // cell holding, as a booking (the engine's settlements). Exact: once an admission of a cost of
  // at least 1 put a TAT ahead of now, each later one adds exactly its cost·T to it.
  void record_locked(const HeldShardLocks& held, const KeyDigest& d, std::int64_t now,
                     std::uint64_t cost, std::uint64_t later, detail::GcraBooking& out) {
    std::visit(
        [&](auto& store) {
          out.digest = d;
          out.forgotten = store.forgotten_in_shard(d);
          store.update_locked(
              held, d, now,
              [&](auto& cell, std::int64_t) {
                for (std::size_t i = 0; i < params_.size(); ++i) {
                  out.booked[i] = detail::scaled_tat(cell.tat[i], params_[i].requests) -
                                  detail::cost_scaled(params_[i], later);
                  out.added[i] = detail::cost_scaled(params_[i], cost);
                }
                return true;
              },
              [](const StoreFull&) { return false; });
        },
        store_);
  }

  // reserve's step under the shard lock: the earliest instant at which `cost` fits in every
  // window (for each window: its TAT + cost·T − burst·T, rounded up to whole ns, or now), then
  // every window's TAT moves to max(TAT, instant) + cost·T.
  template <std::size_t N>
  absl::Status book_earliest(detail::GcraCell<N>& cell, std::int64_t now, std::uint64_t cost,
                             std::int64_t max_wait, Reservation& out) const {
    std::array<absl::int128, N> from{};  // each window's state as of now, scaled
    absl::int128 instant = now;
    for (std::size_t i = 0; i < N; ++i) {
      const detail::GcraParams& p = params_[i];
      from[i] = std::max(detail::scaled_tat(cell.tat[i], p.requests),
                         absl::int128(now) * absl::int128(p.requests));
      const absl::int128 fits = from[i] + detail::cost_scaled(p, cost) - absl::int128(p.tolerance);
      instant = std::max(instant, detail::ceil_div(fits, p.requests));
    }
    const absl::int128 wait = instant - now;
    const bool beyond = wait > detail::kMaxBookedAhead;
    if (wait > max_wait) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the cost fits in ",
          beyond ? std::string("more than 2^61") : absl::StrCat(static_cast<std::int64_t>(wait)),
          " ns, more than the ", max_wait, " ns allowed"));
    }
    if (beyond) {
      return absl::ResourceExhaustedError(
          "the cost fits only in more than 2^61 ns, beyond the supported range");
    }
    for (std::size_t i = 0; i < N; ++i) {
      const detail::GcraParams& p = params_[i];
      const absl::int128 start =
          std::max(detail::scaled_tat(cell.tat[i], p.requests), instant * absl::int128(p.requests));
      out.booking_.booked[i] = start + detail::cost_scaled(p, cost);
      out.booking_.added[i] = out.booking_.booked[i] - from[i];
      cell.tat[i] = detail::unscaled_tat(out.booking_.booked[i], p.requests);
    }
    out.instant_ = static_cast<std::int64_t>(instant);
    out.wait_ = static_cast<std::int64_t>(wait);
    out.cost_ = cost;
    out.open_.open();
    return absl::OkStatus();
  }

  // After an admitted estimated check: what it booked in each window (it admitted at now, so it
  // added estimate·T to max(TAT, now)).
  template <std::size_t N>
  void record_booking(const detail::GcraCell<N>& cell, std::uint64_t estimate, Receipt& out) const {
    for (std::size_t i = 0; i < N; ++i) {
      out.booking_.booked[i] = detail::scaled_tat(cell.tat[i], params_[i].requests);
      out.booking_.added[i] = detail::cost_scaled(params_[i], estimate);
    }
    out.estimate_ = estimate;
    out.open_.open();
  }

  ClockT clock_;
  std::vector<GcraWindow> windows_;
  std::vector<detail::GcraParams> params_;
  std::uint64_t max_cost_ = std::numeric_limits<std::uint64_t>::max();
  detail::StoreVariant<detail::GcraCell> store_;
  std::uint64_t id_ = detail::new_limiter_id();  // names it in its reservations and receipts
};

static_assert(RateLimiter<GcraLimiter<SteadyClock>>);
static_assert(RateLimiter<GcraLimiter<ManualClock>>);

}  // namespace sluice

#endif  // SLUICE_GCRA_HPP_
