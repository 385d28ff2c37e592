// sluice/concurrency.hpp — at most N requests in flight per key, with RAII permits and leases.
//
// Where a rate limiter caps how many requests start per period, a `ConcurrencyLimiter` caps how
// many run at once: `acquire(key)` takes one of the key's N slots and returns a move-only
// `ConcurrencyPermit`; destroying the permit (or calling `release()`) gives the slot back.
//
//   using namespace std::chrono_literals;
//   auto limiter = sluice::ConcurrencyLimiter<>::create({.max_in_flight = 4, .lease = 30s});
//   if (!limiter.ok()) return limiter.status();  // InvalidArgument naming the bad value
//   sluice::ConcurrencyPermit permit = limiter->acquire(tenant_id);
//   if (!permit) return respond_429(permit.decision().retry_after);
//   call_upstream();  // the slot is given back when `permit` goes out of scope
//
// Leases: a slot taken at time t is held until t + lease at most. A permit that is leaked (its
// owner crashed, hung, or forgot it) stops counting once its lease has passed, so no key is
// wedged for longer than one lease. Choose the lease above the longest legitimate request.
// Fencing: every slot taken gets a fresh serial, unique in its shard for the limiter's life.
// A permit releases its slot only while the slot still carries its serial, so a permit released
// after its lease ran out and the slot was taken again cannot free the new holder's slot.
//
// Decision of an acquire: limit = N; remaining = free slots after this acquire; allowed ⇒
// retry_after 0; denied (all N slots held) ⇒ reason kQuotaExceeded and retry_after = until the
// earliest lease of the key runs out (a hint: a permit given back sooner frees a slot sooner);
// reset_after = until the last lease of the key runs out (every slot free absent new acquires).
// binding_window is 0.
//
// Store: the limiter's keys live in a ShardedStore whose overflow policy is always
// Overflow::kRejectNewKeys (`options.overflow` is ignored): evicting a key would forget permits in
// flight and admit N more. A new key at a full shard is denied with Reason::kStoreFull and
// retry_after = until the earliest lease in the shard runs out. A key whose last permit is given
// back is removed at once, so only keys with permits in flight (or leaked, until their lease)
// take room. Worst case: kStoreShards × max_keys_per_shard keys, each a cell of 16 bytes per slot
// (4, 16 or 64 slots: the smallest that holds N).
//
// Time: integer ns from `Clock`, saturated to ±2^62 and clamped per shard to the latest reading,
// so a clock that steps back never ends a lease early.
//
// Supported range: 1 ≤ max_in_flight ≤ kMaxInFlight (64); 1 ns ≤ lease ≤ 2^60 ns.
// Thread-safety: `acquire`, `stats` and permits' release may run concurrently from any threads;
// each takes one shard lock. A permit is thread-compatible (one owner at a time) and must not
// outlive its limiter. Complexity: O(N) per acquire and release, O(1) expected store work.
#ifndef SLUICE_CONCURRENCY_HPP_
#define SLUICE_CONCURRENCY_HPP_

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string_view>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/key.hpp"
#include "sluice/store.hpp"

namespace sluice {

// Most permits in flight one key may have.
inline constexpr std::uint64_t kMaxInFlight = 64;

// `max_in_flight` permits per key at once; each held at most `lease`.
struct ConcurrencyLimit {
  std::uint64_t max_in_flight = 0;
  std::chrono::nanoseconds lease{0};
};

namespace detail {

// One slot of a key: free when serial is 0 or the lease has run out (lease_end ≤ now).
struct PermitSlot {
  std::int64_t lease_end = 0;  // ns since the clock's epoch
  std::uint64_t serial = 0;    // the holder's fencing serial; 0: never taken or given back
};

template <std::size_t S>
struct ConcurrencyCell {
  std::array<PermitSlot, S> slots;

  static bool held(const PermitSlot& slot, std::int64_t now) noexcept {
    return slot.serial != 0 && slot.lease_end > now;
  }
  // Idle iff no slot is held: the key then behaves exactly like a key never seen.
  bool idle(std::int64_t now) const noexcept {
    return std::none_of(slots.begin(), slots.end(),
                        [&](const PermitSlot& s) { return held(s, now); });
  }
  // Until the earliest held lease runs out (0 when idle): the earliest time this cell could go
  // idle, since a permit given back removes the key at once (ShardedStore::update_removing_idle).
  std::int64_t time_until_fresh(std::int64_t now) const noexcept {
    std::int64_t earliest = std::numeric_limits<std::int64_t>::max();
    for (const PermitSlot& s : slots) {
      if (held(s, now)) earliest = std::min(earliest, s.lease_end - now);
    }
    return earliest == std::numeric_limits<std::int64_t>::max() ? 0 : earliest;
  }
};

// Cells for N ≤ 4, ≤ 16, ≤ 64.
using ConcurrencyStore =
    std::variant<ShardedStore<ConcurrencyCell<4>>, ShardedStore<ConcurrencyCell<16>>,
                 ShardedStore<ConcurrencyCell<64>>>;

// Everything permits refer to; heap-allocated so that moving the limiter keeps it in place.
template <class ClockT>
struct ConcurrencyCore {
  struct alignas(64) Serial {
    std::uint64_t last = 0;  // guarded by the shard's lock (taken inside the store's update)
  };

  ConcurrencyCore(ConcurrencyLimit limit_in, const StoreOptions& options, ClockT clock_in)
      : limit(limit_in),
        clock(std::move(clock_in)),
        store(make(limit_in.max_in_flight, options)),
        serials(std::make_unique<Serial[]>(kStoreShards)) {}

  static ConcurrencyStore make(std::uint64_t n, const StoreOptions& options) {
    if (n <= 4) return ConcurrencyStore(std::in_place_index<0>, options);
    if (n <= 16) return ConcurrencyStore(std::in_place_index<1>, options);
    return ConcurrencyStore(std::in_place_index<2>, options);
  }

  std::int64_t now() const { return saturate_time(clock.now().count()); }

  ConcurrencyLimit limit;
  ClockT clock;
  ConcurrencyStore store;
  std::unique_ptr<Serial[]> serials;  // one per shard, padded
};

// What an acquire decided, and which slot it took.
struct Acquired {
  Decision decision;
  std::size_t slot = 0;
  std::uint64_t serial = 0;  // 0: nothing taken
};

}  // namespace detail

template <Clock ClockT>
class ConcurrencyLimiter;

// A held slot (or the denial of one). Move-only; destroying a held permit releases it.
// Thread-compatible; must not outlive the limiter that issued it.
class ConcurrencyPermit {
 public:
  ConcurrencyPermit() = default;  // holds nothing
  ConcurrencyPermit(ConcurrencyPermit&& other) noexcept { *this = std::move(other); }
  ConcurrencyPermit& operator=(ConcurrencyPermit&& other) noexcept {
    if (this != &other) {
      release();
      decision_ = other.decision_;
      digest_ = other.digest_;
      slot_ = other.slot_;
      serial_ = std::exchange(other.serial_, 0);
      release_fn_ = std::exchange(other.release_fn_, nullptr);
      core_ = std::exchange(other.core_, nullptr);
    }
    return *this;
  }
  ConcurrencyPermit(const ConcurrencyPermit&) = delete;
  ConcurrencyPermit& operator=(const ConcurrencyPermit&) = delete;
  ~ConcurrencyPermit() { release(); }

  // True while this permit holds its slot (granted and not yet released; a lease that ran out
  // still counts here until release, which then frees nothing of anyone else's).
  bool held() const noexcept { return serial_ != 0; }
  explicit operator bool() const noexcept { return held(); }

  // The acquire's decision: allowed, or why not and how long to wait.
  const Decision& decision() const noexcept { return decision_; }

  // The fencing serial of the slot taken (0 when nothing is held).
  std::uint64_t serial() const noexcept { return serial_; }

  // Gives the slot back. Idempotent: later calls (and the destructor) do nothing. Returns true iff
  // this call freed a slot whose lease had not run out; false when nothing was held, or when the
  // lease had run out (the slot is then free already, possibly taken by another permit, which
  // this call leaves alone).
  bool release() noexcept {
    if (serial_ == 0) return false;
    const std::uint64_t serial = std::exchange(serial_, 0);
    return release_fn_(core_, digest_, slot_, serial);
  }

 private:
  template <Clock>
  friend class ConcurrencyLimiter;
  using ReleaseFn = bool (*)(void* core, const KeyDigest& digest, std::size_t slot,
                             std::uint64_t serial) noexcept;

  Decision decision_{};
  KeyDigest digest_{};
  std::size_t slot_ = 0;
  std::uint64_t serial_ = 0;
  ReleaseFn release_fn_ = nullptr;
  void* core_ = nullptr;
};

template <Clock ClockT = SteadyClock>
class ConcurrencyLimiter {
 public:
  // InvalidArgument unless 1 ≤ max_in_flight ≤ kMaxInFlight, 1 ns ≤ lease ≤ 2^60 ns and the
  // store options are valid (sluice::validate). The overflow policy is always kRejectNewKeys.
  static absl::StatusOr<ConcurrencyLimiter> create(ConcurrencyLimit limit,
                                                   StoreOptions options = {}, ClockT clock = {}) {
    if (limit.max_in_flight < 1 || limit.max_in_flight > kMaxInFlight) {
      return absl::InvalidArgumentError(absl::StrCat("max_in_flight must be in [1, ", kMaxInFlight,
                                                     "], got ", limit.max_in_flight));
    }
    if (limit.lease.count() <= 0 || limit.lease.count() > kMaxLease) {
      return absl::InvalidArgumentError(
          absl::StrCat("lease must be in [1ns, 2^60 ns], got ", limit.lease.count(), "ns"));
    }
    if (absl::Status s = sluice::validate(options); !s.ok()) return s;
    options.overflow = Overflow::kRejectNewKeys;
    return ConcurrencyLimiter(limit, options, std::move(clock));
  }

  // Takes one of the key's slots if fewer than max_in_flight are held; otherwise (or when the key
  // is new and its shard is full) returns a permit that holds nothing, whose decision says why
  // and how long to wait.
  ConcurrencyPermit acquire(std::string_view key) {
    Core& core = *core_;
    const std::int64_t at = core.now();
    ConcurrencyPermit permit;
    const detail::Acquired got = std::visit(
        [&](auto& store) {
          permit.digest_ = store.digest(key);
          std::uint64_t& last = core.serials[store.shard_index(permit.digest_)].last;
          return store.update(
              permit.digest_, at,
              [&](auto& cell, std::int64_t now) { return take(cell, now, last); },
              [&](const StoreFull& full) {
                detail::Acquired denied{.decision = detail::store_full_decision(full)};
                denied.decision.limit = core.limit.max_in_flight;
                return denied;
              });
        },
        core.store);
    permit.decision_ = got.decision;
    if (got.serial != 0) {
      permit.slot_ = got.slot;
      permit.serial_ = got.serial;
      permit.core_ = &core;
      permit.release_fn_ = &ConcurrencyLimiter::release_slot;
    }
    return permit;
  }

  // --- Operators: inspect and reset one key. Both may run concurrently with `acquire` and
  // releases; each takes one shard lock, O(N).

  // The key's state without taking a slot: limit = N; remaining = free slots now; allowed iff one
  // is free, else kQuotaExceeded with retry_after until the earliest lease runs out; reset_after
  // = until the last lease runs out (0 when no permit is held). A key never seen, or whose permits
  // were all given back, reports N free. Stores nothing.
  Decision inspect(std::string_view key) {
    Core& core = *core_;
    const std::int64_t at = core.now();
    return std::visit(
        [&](auto& store) {
          return store.update(
              store.digest(key), at,
              [&](const auto& cell, std::int64_t now) { return untaken(survey(cell, now), now); },
              [](const StoreFull& full) {  // unreachable: an inspected new key stays idle
                return detail::store_full_decision(full);
              });
        },
        core.store);
  }

  // Frees every slot of the key at once, as if each of its permits had been given back: its next
  // acquire sees N free slots, and its room in the store is free. Permits taken before the reset
  // stay objects their owners hold, but release nothing when destroyed (the fencing serial of a
  // slot taken after the reset differs), so they cannot free a later holder's slot. Resetting a
  // key that holds nothing does nothing. O(1) plus a probe.
  void reset(std::string_view key) {
    Core& core = *core_;
    const std::int64_t at = core.now();
    std::visit([&](auto& store) { store.forget(store.digest(key), at); }, core.store);
  }

  StoreStats stats() const {
    return std::visit([](const auto& s) { return s.stats(); }, core_->store);
  }
  // Bytes held by the key tables (grows with keys, bounded by the store cap). Lock-free.
  std::size_t memory_bytes() const {
    return std::visit([](const auto& s) { return s.table_bytes(); }, core_->store);
  }
  const ConcurrencyLimit& limit() const noexcept { return core_->limit; }
  const ClockT& clock() const noexcept { return core_->clock; }

 private:
  using Core = detail::ConcurrencyCore<ClockT>;
  static constexpr std::int64_t kMaxLease = std::int64_t{1} << 60;

  ConcurrencyLimiter(ConcurrencyLimit limit, const StoreOptions& options, ClockT clock)
      : core_(std::make_unique<Core>(limit, options, std::move(clock))) {}

  // The key's first N slots at `now`: how many are held, the first free one (N if none), and
  // the earliest and latest lease ends among the held ones.
  struct Survey {
    std::size_t free = 0;
    std::uint64_t in_flight = 0;
    std::int64_t earliest = std::numeric_limits<std::int64_t>::max();
    std::int64_t latest = 0;
  };
  template <std::size_t S>
  Survey survey(const detail::ConcurrencyCell<S>& cell, std::int64_t now) const noexcept {
    const auto n = static_cast<std::size_t>(core_->limit.max_in_flight);
    Survey out{.free = n, .latest = now};
    for (std::size_t i = 0; i < n; ++i) {
      const detail::PermitSlot& s = cell.slots[i];
      if (detail::ConcurrencyCell<S>::held(s, now)) {
        ++out.in_flight;
        out.earliest = std::min(out.earliest, s.lease_end);
        out.latest = std::max(out.latest, s.lease_end);
      } else if (out.free == n) {
        out.free = i;
      }
    }
    return out;
  }

  // The decision of an acquire that found the key as `seen` and took nothing: allowed with
  // remaining = free slots, or (all N held) denied until the earliest lease runs out.
  Decision untaken(const Survey& seen, std::int64_t now) const noexcept {
    const std::uint64_t n = core_->limit.max_in_flight;
    Decision d{.reason = Reason::kAllowed,
               .limit = n,
               .remaining = n - seen.in_flight,
               .reset_after = std::chrono::nanoseconds{seen.latest - now}};
    if (seen.in_flight == n) {
      d.reason = Reason::kQuotaExceeded;
      d.retry_after = std::chrono::nanoseconds{seen.earliest - now};
    }
    return d;
  }

  // Takes the first free of the key's first N slots, under the shard lock.
  template <std::size_t S>
  detail::Acquired take(detail::ConcurrencyCell<S>& cell, std::int64_t now,
                        std::uint64_t& last_serial) const {
    const Survey seen = survey(cell, now);
    detail::Acquired got{.decision = untaken(seen, now)};
    if (!got.decision.allowed()) return got;
    // lease_end ≤ 2^62 + 2^60: no overflow.
    const std::int64_t lease_end = now + core_->limit.lease.count();
    cell.slots[seen.free] = {.lease_end = lease_end, .serial = ++last_serial};
    got.slot = seen.free;
    got.serial = last_serial;
    got.decision.remaining -= 1;
    got.decision.reset_after = std::chrono::nanoseconds{std::max(seen.latest, lease_end) - now};
    return got;
  }

  // Frees `slot` of the key iff it still carries `serial`; true iff its lease had not run out.
  // Removes the key when no slot stays held.
  static bool release_slot(void* core_ptr, const KeyDigest& digest, std::size_t slot,
                           std::uint64_t serial) noexcept {
    Core& core = *static_cast<Core*>(core_ptr);
    const std::int64_t at = core.now();
    return std::visit(
        [&](auto& store) {
          return store.update_removing_idle(
              digest, at,
              [&](auto& cell, std::int64_t now) {
                detail::PermitSlot& s = cell.slots[slot];
                if (s.serial != serial) return false;
                const bool live = s.lease_end > now;
                s = {};
                return live;
              },
              [](const StoreFull&) { return false; });  // unreachable: a fresh cell stays idle
        },
        core.store);
  }

  std::unique_ptr<Core> core_;
};

static_assert(Clock<ManualClock>);

}  // namespace sluice

#endif  // SLUICE_CONCURRENCY_HPP_
