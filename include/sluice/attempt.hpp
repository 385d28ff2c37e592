// sluice/attempt.hpp — the attempt limiter: login throttling with one active attempt per subject
// and exponential backoff after failures.
//
// A rate limit counts requests; a login form needs something else. A *subject* (a normalized
// user name, an account id, a device) may have one attempt in flight at a time; every failed or
// abandoned attempt doubles how long the next one must wait, from `initial_delay` up to
// `delay_cap`; a success clears the record. `begin` admits an attempt and hands out a receipt;
// the caller verifies the credential, then completes the receipt:
//
//   using namespace std::chrono_literals;
//   auto limiter = sluice::AttemptLimiter<>::create(
//       {.initial_delay = 1s, .delay_cap = 15min, .quiet_period = 24h, .lease = 30s});
//   if (!limiter.ok()) return limiter.status();        // InvalidArgument names the bad value
//   absl::StatusOr<sluice::AttemptDecision> d = limiter->begin(normalized_user_name);
//   if (d.ok() && !d->admitted()) return respond_429(d->retry_after);   // see attempt_fields()
//   bool ok = verify_password(...);                    // may take long: the lease covers it
//   ok ? limiter->succeed(d->receipt) : limiter->fail(d->receipt);
//
// Model (all times integer nanoseconds of the limiter's clock):
// - After f consecutive failures the next `begin` must wait delay(f) = initial_delay·2^(f−1),
//   capped at delay_cap, from the failure. `fail` and `abandon` both count a failure (abandon
//   says the caller gave up without a verdict; an attacker must not be able to skip the backoff
//   by walking away). The count saturates at kMaxAttemptFailures; the delay saturates at the cap
//   and is computed without overflow for every count and every duration.
// - An attempt that is neither succeeded nor failed within `lease` counts as failed at its lease
//   deadline. This is applied lazily, on the next operation on the subject, as of the deadline.
// - A subject whose failures are older than `quiet_period` (measured from the last failure or
//   lease expiry) is forgotten: its state is idle and the store may drop it. State is never idle
//   while a lease is active, however long the lease.
// - A receipt names its subject's digest and a fencing token; it completes only the attempt it
//   was issued for, while that attempt is active. A late completion (after the lease expired, or
//   after a newer attempt began) changes nothing and returns FailedPrecondition.
// - A denied `begin` changes nothing. Its `retry_after` is the wait until the backoff ends, or
//   for a subject with an attempt in flight, until that attempt's lease deadline.
// - Clock readings are saturated to ±2^62 ns, and a reading earlier than one already used is
//   clamped to it: stepping the clock back never shortens a wait. Durations may be as long as
//   std::chrono::nanoseconds::max(); every sum saturates instead of overflowing.
//
// Operators: `inspect(subject)` answers what `begin` would answer now without taking anything;
// `reset(subject)` forgets the subject's failures and ends its attempt in flight, whose receipt is
// then stale (an account unblocked by hand).
//
// Storage: a ShardedStore that never evicts live state (Overflow::kRejectNewKeys is forced: an
// attacker who sprays subjects must not be able to flush an account's failure record). A new
// subject that finds its shard full of live records is denied with AttemptReason::kStoreFull;
// subjects already tracked keep working. Raw subjects are never stored: the store keeps a
// seeded 128-bit digest bound to the policy's fingerprint. Memory: a 64-byte table slot per record
// (tables are kept at most 17/20 full), at most kStoreShards × max_keys_per_shard records.
//
// Thread-safety: every member function may be called concurrently; each operation takes one
// shard lock for O(1) expected work (complexity as for ShardedStore::update). Receipts and
// decisions are plain values.
#ifndef SLUICE_ATTEMPT_HPP_
#define SLUICE_ATTEMPT_HPP_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/clock.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/detail/xxhash.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/key.hpp"
#include "sluice/store.hpp"

namespace sluice {

namespace redis {
class RedisAttemptLimiter;
}  // namespace redis

// Consecutive failures are counted up to this value and stay there.
inline constexpr std::uint64_t kMaxAttemptFailures = std::numeric_limits<std::uint32_t>::max();

// The security parameters of an attempt limiter. All four are chosen by the application; there
// are no defaults. Units: nanoseconds (any std::chrono duration converts).
struct AttemptPolicy {
  std::chrono::nanoseconds initial_delay{0};  // wait after the first failure; > 0
  std::chrono::nanoseconds delay_cap{0};      // longest wait; ≥ initial_delay
  std::chrono::nanoseconds quiet_period{0};   // failures are forgotten after this; ≥ delay_cap
  std::chrono::nanoseconds lease{0};          // an unfinished attempt fails after this; > 0

  // OK, or InvalidArgument naming the first bad field.
  absl::Status validate() const {
    const auto positive = [](const char* name, std::chrono::nanoseconds d) {
      return d.count() > 0 ? absl::OkStatus()
                           : absl::InvalidArgumentError(absl::StrCat(
                                 "attempt policy: ", name, " must be > 0, got ", d.count(), "ns"));
    };
    for (auto [name, d] :
         {std::pair{"initial_delay", initial_delay}, std::pair{"delay_cap", delay_cap},
          std::pair{"quiet_period", quiet_period}, std::pair{"lease", lease}}) {
      if (absl::Status s = positive(name, d); !s.ok()) return s;
    }
    if (delay_cap < initial_delay) {
      return absl::InvalidArgumentError("attempt policy: delay_cap must be >= initial_delay");
    }
    if (quiet_period < delay_cap) {
      return absl::InvalidArgumentError("attempt policy: quiet_period must be >= delay_cap");
    }
    return absl::OkStatus();
  }

  // The wait after `failures` consecutive failures: 0 for none, else
  // min(delay_cap, initial_delay·2^(failures−1)), exact and without overflow. O(1).
  std::chrono::nanoseconds delay_after(std::uint64_t failures) const noexcept {
    if (failures == 0) return std::chrono::nanoseconds{0};
    const std::uint64_t doublings = failures - 1;
    const auto initial = static_cast<std::uint64_t>(initial_delay.count());
    const auto cap = static_cast<std::uint64_t>(delay_cap.count());
    // initial·2^k ≤ cap  ⇔  initial ≤ ⌊cap / 2^k⌋
    if (doublings >= 63 || initial > (cap >> doublings)) return delay_cap;
    return std::chrono::nanoseconds{static_cast<std::int64_t>(initial << doublings)};
  }

  // A 64-bit hash of every parameter. State is keyed under it, so limiters with different
  // policies never read each other's records.
  std::uint64_t fingerprint() const {
    std::string bytes;
    append_key_part(bytes, "sluice.attempt.v1");
    for (std::chrono::nanoseconds d : {initial_delay, delay_cap, quiet_period, lease}) {
      append_key_part(bytes, absl::StrCat(d.count()));
    }
    return XXH3_64bits(bytes.data(), bytes.size());
  }

  friend bool operator==(const AttemptPolicy&, const AttemptPolicy&) = default;
};

// Proof of one admitted attempt, to pass back to succeed / fail / abandon. Opaque value type:
// it holds the subject's digest (never the subject) and the fencing token of the attempt.
// A default-constructed receipt is invalid (completing it is InvalidArgument).
class AttemptReceipt {
 public:
  AttemptReceipt() = default;

  bool valid() const noexcept { return !subject_.empty(); }
  // The attempt's number for its subject (1, 2, ...): for logs; it reveals nothing else.
  std::uint64_t token() const noexcept { return token_; }

  friend bool operator==(const AttemptReceipt&, const AttemptReceipt&) = default;

 private:
  template <Clock>
  friend class AttemptLimiter;
  friend class redis::RedisAttemptLimiter;

  AttemptReceipt(KeyDigest subject, std::uint64_t token, std::int64_t started) noexcept
      : subject_(subject), token_(token), started_(started) {}

  KeyDigest subject_{};
  std::uint64_t token_ = 0;   // per-subject attempt counter
  std::int64_t started_ = 0;  // ns: when the attempt began (fences tokens across dropped state)
};

// Why `begin` answered as it did.
enum class AttemptReason {
  kAdmitted,       // the attempt may proceed; complete its receipt
  kAttemptActive,  // another attempt of the subject is in flight
  kBackoff,        // the wait after the subject's last failure has not elapsed
  kStoreFull,      // new subject, and its store shard is full of live records
};

constexpr std::string_view to_string(AttemptReason reason) noexcept {
  switch (reason) {
    case AttemptReason::kAdmitted:
      return "admitted";
    case AttemptReason::kAttemptActive:
      return "attempt_active";
    case AttemptReason::kBackoff:
      return "backoff";
    case AttemptReason::kStoreFull:
      return "store_full";
  }
  return "unknown";
}
inline std::ostream& operator<<(std::ostream& os, AttemptReason reason) {
  return os << to_string(reason);
}

// The answer of `begin`, and of `inspect` (what begin would answer). Value type.
struct AttemptDecision {
  AttemptReason reason = AttemptReason::kAdmitted;
  AttemptReceipt receipt{};                 // valid iff admitted() by begin (never by inspect)
  std::chrono::nanoseconds retry_after{0};  // 0 iff admitted; else the wait (≥ 1 ns)
  std::uint64_t failures = 0;               // consecutive failures on record (0 for kStoreFull)

  bool admitted() const noexcept { return reason == AttemptReason::kAdmitted; }
  friend bool operator==(const AttemptDecision&, const AttemptDecision&) = default;
};

inline std::ostream& operator<<(std::ostream& os, const AttemptDecision& d) {
  return os << "AttemptDecision{" << d.reason << ", token=" << d.receipt.token()
            << ", retry_after=" << d.retry_after.count() << "ns, failures=" << d.failures << "}";
}

// The HTTP fields for an attempt decision: for a denial, `Retry-After` (whole seconds, rounded up,
// at least 1); for an admission, none. Pure.
inline HttpFields attempt_fields(const AttemptDecision& decision) {
  HttpFields out;
  if (!decision.admitted()) out.push_back(retry_after_field(decision.retry_after));
  return out;
}

namespace detail {

// What completing a receipt whose attempt is no longer active answers (every attempt limiter).
inline absl::Status stale_attempt_receipt() {
  return absl::FailedPreconditionError(
      "stale attempt receipt: its attempt already ended (completed, or its lease expired) or a "
      "newer attempt began");
}

// t + d for d ≥ 0, saturated at the largest int64.
constexpr std::int64_t add_saturating(std::int64_t t, std::int64_t d) noexcept {
  return t > std::numeric_limits<std::int64_t>::max() - d ? std::numeric_limits<std::int64_t>::max()
                                                          : t + d;
}
// max(0, t − now), saturated; now ≥ −2^62 (the supported clock range).
constexpr std::int64_t time_until(std::int64_t t, std::int64_t now) noexcept {
  if (t <= now) return 0;
  if (now < 0 && t > std::numeric_limits<std::int64_t>::max() + now) {
    return std::numeric_limits<std::int64_t>::max();
  }
  return t - now;
}

// One subject's record. The default value is a subject never seen.
// While `active`, `retry_at` and `quiet_end` hold what the lease's expiry would set, so the cell
// can tell whether it is idle without knowing the policy.
struct AttemptCell {
  std::int64_t started = std::numeric_limits<std::int64_t>::min();    // latest begin (ns)
  std::int64_t lease_end = std::numeric_limits<std::int64_t>::min();  // deadline if active
  std::int64_t retry_at = std::numeric_limits<std::int64_t>::min();   // earliest next begin
  std::int64_t quiet_end = std::numeric_limits<std::int64_t>::min();  // failures forgotten then
  std::uint64_t token = 0;                                            // attempts begun
  std::uint32_t failures = 0;                                         // consecutive, saturating
  bool active = false;

  // Applies what time alone does: a lease past its deadline becomes a failure (as of the
  // deadline), and failures past their quiet period are forgotten.
  void settle(std::int64_t now) noexcept {
    if (active && now >= lease_end) {
      active = false;
      if (failures < kMaxAttemptFailures) ++failures;
    }
    if (!active && now >= quiet_end) {
      failures = 0;
      retry_at = std::numeric_limits<std::int64_t>::min();
    }
  }

  // Idle: no live lease, nothing to remember, and `now` is past the latest begin — a record
  // dropped then cannot be recreated with the same (begin time, token) pair, so a receipt of
  // the dropped record can never match a later attempt.
  bool idle(std::int64_t now) const noexcept {
    if (active && now < lease_end) return false;
    return now >= quiet_end && now > started;
  }
  // Ends any attempt and forgets the failures as of `now` (a success, or a reset). Keeps the
  // fencing pair (token, started), so a receipt issued before cannot complete a later attempt.
  void clear(std::int64_t now) noexcept {
    active = false;
    failures = 0;
    retry_at = std::numeric_limits<std::int64_t>::min();
    quiet_end = now;
  }

  // Saturated below 2^62 ns, so that the store's `now + time_until_fresh` cannot overflow.
  std::int64_t time_until_fresh(std::int64_t now) const noexcept {
    if (idle(now)) return 0;
    const std::int64_t until =
        std::max(time_until(quiet_end, now), time_until(add_saturating(started, 1), now));
    return std::min(until, kMaxTime - 1);
  }
};

static_assert(StoreCell<AttemptCell>);

}  // namespace detail

// Attempt limiting in memory. See the file comment for the model.
template <Clock ClockT = SteadyClock>
class AttemptLimiter {
 public:
  // InvalidArgument for an invalid policy. `options.overflow` is ignored: the store never evicts
  // (Overflow::kRejectNewKeys). A fixed `options.seed` is mixed with the policy's fingerprint.
  static absl::StatusOr<AttemptLimiter> create(AttemptPolicy policy, StoreOptions options = {},
                                               ClockT clock = {}) {
    if (absl::Status s = policy.validate(); !s.ok()) return s;
    options.overflow = Overflow::kRejectNewKeys;
    const std::uint64_t fingerprint = policy.fingerprint();
    options.seed = XXH3_64bits_withSeed(&fingerprint, sizeof fingerprint,
                                        options.seed ? *options.seed : random_seed());
    return AttemptLimiter(policy, options, std::move(clock));
  }

  // Admits an attempt for `subject` unless one is in flight or its backoff has not elapsed.
  // Never an error in memory (the StatusOr matches the Redis limiter).
  absl::StatusOr<AttemptDecision> begin(std::string_view subject) {
    const KeyDigest digest = store_.digest(subject);
    return store_.update(
        digest, now(),
        [&](detail::AttemptCell& cell, std::int64_t now) { return admit(cell, digest, now); },
        [](const StoreFull& full) {
          return AttemptDecision{.reason = AttemptReason::kStoreFull,
                                 .retry_after = std::chrono::nanoseconds{full.retry_after_ns}};
        });
  }

  // Ends the receipt's attempt as a success: the subject's failures are cleared.
  // FailedPrecondition if the attempt is no longer active (stale receipt; nothing changes),
  // InvalidArgument for an invalid receipt.
  absl::Status succeed(const AttemptReceipt& receipt) { return complete(receipt, true); }
  // Ends the receipt's attempt as a failure: the next begin waits delay_after(failures).
  // Errors as for succeed.
  absl::Status fail(const AttemptReceipt& receipt) { return complete(receipt, false); }
  // Ends the receipt's attempt without a verdict; counts as a failure. Errors as for succeed.
  absl::Status abandon(const AttemptReceipt& receipt) { return complete(receipt, false); }

  // --- Operators: inspect and reset one subject. Both may be called concurrently with every
  // other member; each takes one shard lock for O(1) expected work, like `begin`.

  // What `begin(subject)` would answer now, without taking anything: reason, retry_after (ns)
  // and failures as `begin` reports them, and an invalid receipt. A subject that would be
  // admitted reports kAdmitted with retry_after 0. Changes no record: no attempt begins, no lease
  // is taken, a lapsed lease counts in the answer but is not written, and an untracked subject is
  // not stored (so it reports kAdmitted with 0 failures even when its shard is full, where `begin`
  // would answer kStoreFull). Clamps the shard's clock like any operation. Never an error in
  // memory (the StatusOr matches the Redis limiter).
  absl::StatusOr<AttemptDecision> inspect(std::string_view subject) {
    return store_.update(
        store_.digest(subject), now(),
        [](const detail::AttemptCell& stored, std::int64_t now) {
          detail::AttemptCell cell = stored;
          cell.settle(now);
          return refusal(cell, now).value_or(AttemptDecision{.failures = cell.failures});
        },
        [](const StoreFull&) {  // unreachable: an inspected new subject stays idle
          return AttemptDecision{};
        });
  }

  // Forgets the subject: its next `begin` is decided as for a subject never seen (no failures,
  // no wait), and its attempt in flight, if any, ends: completing that receipt later is
  // FailedPrecondition and changes nothing, as for any stale receipt. The record's room in the
  // store is free at once (or one nanosecond later, when the reset falls in the nanosecond of
  // the subject's latest begin). OK for an untracked subject, which stays untracked. Never an
  // error in memory (the Status matches the Redis limiter).
  absl::Status reset(std::string_view subject) {
    return store_.update_removing_idle(
        store_.digest(subject), now(),
        [](detail::AttemptCell& cell, std::int64_t now) {
          cell.clear(now);
          return absl::OkStatus();
        },
        [](const StoreFull&) {  // unreachable: a cleared new cell is idle
          return absl::OkStatus();
        });
  }

  const AttemptPolicy& policy() const noexcept { return policy_; }
  // Records tracked, idle records reclaimed, capacity denials (live_evicted stays 0). Lock-free.
  StoreStats stats() const noexcept { return store_.stats(); }

 private:
  AttemptLimiter(const AttemptPolicy& policy, const StoreOptions& options, ClockT clock)
      : policy_(policy), clock_(std::move(clock)), store_(options) {}

  std::int64_t now() const { return detail::saturate_time(clock_.now().count()); }

  // The denial `begin` answers for a settled cell at `now`, if it answers one.
  static std::optional<AttemptDecision> refusal(const detail::AttemptCell& cell, std::int64_t now) {
    if (cell.active) {
      return AttemptDecision{
          .reason = AttemptReason::kAttemptActive,
          .retry_after = std::chrono::nanoseconds{detail::time_until(cell.lease_end, now)},
          .failures = cell.failures};
    }
    if (now < cell.retry_at) {
      return AttemptDecision{
          .reason = AttemptReason::kBackoff,
          .retry_after = std::chrono::nanoseconds{detail::time_until(cell.retry_at, now)},
          .failures = cell.failures};
    }
    return std::nullopt;
  }

  AttemptDecision admit(detail::AttemptCell& cell, const KeyDigest& digest,
                        std::int64_t now) const {
    cell.settle(now);
    if (std::optional<AttemptDecision> denied = refusal(cell, now)) return *denied;
    const std::uint64_t failures = cell.failures;
    cell.token += 1;
    cell.started = now;
    cell.active = true;
    cell.lease_end = detail::add_saturating(now, policy_.lease.count());
    // What the lease's expiry will set: one more failure as of the deadline.
    cell.retry_at =
        detail::add_saturating(cell.lease_end, policy_.delay_after(failures + 1).count());
    cell.quiet_end = detail::add_saturating(cell.lease_end, policy_.quiet_period.count());
    return {.reason = AttemptReason::kAdmitted,
            .receipt = AttemptReceipt(digest, cell.token, now),
            .failures = failures};
  }

  absl::Status complete(const AttemptReceipt& receipt, bool success) {
    if (!receipt.valid()) return absl::InvalidArgumentError("attempt receipt is not valid");
    return store_.update(
        receipt.subject_, now(),
        [&](detail::AttemptCell& cell, std::int64_t now) {
          cell.settle(now);
          if (!cell.active || cell.token != receipt.token_ || cell.started != receipt.started_) {
            return detail::stale_attempt_receipt();
          }
          if (success) {
            cell.clear(now);
          } else {
            cell.active = false;
            if (cell.failures < kMaxAttemptFailures) ++cell.failures;
            cell.retry_at = detail::add_saturating(now, policy_.delay_after(cell.failures).count());
            cell.quiet_end = detail::add_saturating(now, policy_.quiet_period.count());
          }
          return absl::OkStatus();
        },
        [](const StoreFull&) {
          return detail::stale_attempt_receipt();
        });  // a completion never inserts
  }

  AttemptPolicy policy_;
  ClockT clock_;
  ShardedStore<detail::AttemptCell> store_;
};

}  // namespace sluice

#endif  // SLUICE_ATTEMPT_HPP_
