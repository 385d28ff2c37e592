// sluice/engine/backend.hpp — the contract between the policy engine and where its state lives.
//
// A backend decides a request's rules: in memory (sluice/engine/in_memory_backend.hpp), on Redis
// (sluice/redis/engine_backend.hpp) or on PostgreSQL (sluice/postgres/engine_backend.hpp). The
// contract is one required concept and one concept per optional power, each with its rules:
//
//   EngineBackend       required: decide rules all-or-nothing or rule by rule; store counters
//   BookingBackend      bookings: record what an admission took, settle it later at another cost
//   BatchSettlingBackend  a request's bookings settled together, by one deadline
//   ResettableBackend   reset: forget one rule's state for one key
//   StandingBackend     a denied all-or-nothing request reports its admitting keys as they
//                       stand (a peek at cost 0) from the same call
//   ClockedBackend      a clock: the engine's time for adaptive controllers and event intervals
//   WindowCarryingBackend  a reload that changes a rule's windows keeps each key's spent share
//   ConfiguredBackend   chosen by the config's `backend` section
//   (sluice/engine/variant_backend.hpp)
//
// The engine checks each power by its concept; a backend without it answers Unimplemented for
// the operation that needs it (settle, reset), and the engine uses the steady clock.
#ifndef SLUICE_ENGINE_BACKEND_HPP_
#define SLUICE_ENGINE_BACKEND_HPP_

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/backend_config.hpp"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/policy.hpp"
#include "sluice/store.hpp"

namespace sluice {

// A rule, the key a request selects for it and the cost to take in the rule's limiter windows
// (`limiter_windows`: the request's cost, or for an adaptive rule its `adaptive_units`); `rule`
// indexes the compiled rules.
struct RuleKey {
  std::size_t rule = 0;
  std::string_view key{};
  std::uint64_t cost = 1;
};

// Required. `check_rules(keys, mode, out)` decides every key at its own cost into `out` (one
// Decision per key, same order): in ConsumptionMode::kAllOrNothing every key is decided and
// either all admitting keys consume or, if any key denies, none does; in kEveryRule each
// admitting key consumes. Keys are decided in order at one time, as if each were checked alone
// after the ones before it: a (rule, key) that `keys` names twice is decided the second time
// after the first occurrence's consumption (the policy engine never repeats one; a custom
// caller may). In kAllOrNothing that consumption is undone with the rest if any key denies:
// `out` holds the in-order decisions, and a denied request consumed nothing. The same holds for
// check_rules_booking and check_rules_as_they_stand below (there every admitting occurrence of a
// denied request reports its key as it stood before the request). The in-memory, Redis and
// PostgreSQL backends all decide so. A cost no window can ever admit is InvalidArgument (the
// request's fault); any other error is the backend's failure, and `out` is then unspecified.
// `rule_store_stats(rule)` reads one rule's store counters. `B::create(rules, previous,
// options)` builds one generation: with `previous` (a reload), every rule whose fingerprint
// `previous` has keeps its state. Thread-safety: check_rules and rule_store_stats may be called
// concurrently.
template <class B>
concept EngineBackend = requires(B& backend, const B& const_backend, std::span<const RuleKey> keys,
                                 ConsumptionMode mode, std::span<Decision> out,
                                 std::span<const CompiledRule> rules,
                                 const typename B::Options& options) {
  { backend.check_rules(keys, mode, out) } -> std::same_as<absl::Status>;
  { const_backend.rule_store_stats(std::size_t{}) } -> std::same_as<StoreStats>;
  { B::create(rules, &const_backend, options) } -> std::same_as<absl::StatusOr<B>>;
};

// Bookings. `check_rules_booking(keys, mode, out, bookings)` is check_rules that, when every key
// admitted, leaves one `B::Booking` per key in `bookings` (else leaves it empty). A Booking holds
// the rule's state, not the generation, so it stays valid across reloads.
// `B::settle_booking(booking, units)` then charges or refunds the difference between `units` and
// what was booked (a refund gives back only what is still booked ahead): the key's state after.
template <class B>
concept BookingBackend = EngineBackend<B> &&
    requires(B& backend, std::span<const RuleKey> keys, ConsumptionMode mode,
             std::span<Decision> out, std::vector<typename B::Booking>& bookings,
             const typename B::Booking& booking) {
  { backend.check_rules_booking(keys, mode, out, bookings) } -> std::same_as<absl::Status>;
  { B::settle_booking(booking, std::uint64_t{}) } -> std::same_as<absl::StatusOr<Decision>>;
};

// Settling a request's bookings together. `B::settle_bookings(bookings, units)` settles
// *bookings[i] at units[i] as settle_booking does, all of them by one deadline (a remote backend
// sends them together instead of one round trip, and one timeout, after another): each result,
// in order.
template <class B>
concept BatchSettlingBackend = BookingBackend<B> &&
    requires(std::span<const typename B::Booking* const> bookings,
             std::span<const std::uint64_t> units) {
  { B::settle_bookings(bookings, units) } -> std::same_as<std::vector<absl::StatusOr<Decision>>>;
};

// Reset. `reset_key(rule, key)` forgets rule `rule`'s state for `key`: its next request is
// decided as a new client's.
template <class B>
concept ResettableBackend = EngineBackend<B> && requires(B& backend, std::string_view key) {
  { backend.reset_key(std::size_t{}, key) } -> std::same_as<absl::Status>;
};

// Standing reports. `check_rules_as_they_stand(keys, out)` is check_rules(keys,
// ConsumptionMode::kAllOrNothing, out), except that when any key denies (so that none consumes),
// each admitting key's Decision is the one a cost-0 check of it would answer at the same time
// from the same state: its limit as it stands, not reduced by this request. A denying key's
// Decision is check_rules'. A caller that reports a denied request's limits as they stand (the
// Envoy service, sluice/envoy/limiter.hpp) then needs no second call to peek at them; without
// this power it peeks with check_rules at cost 0. In memory the peeks are taken under the shard
// locks that decided the request, over Redis they are recomputed from the state the script's
// reply carries (no extra work on the server); PostgreSQL peeks in a second statement and keeps
// the verdict if that one fails (sluice/postgres/engine_backend.hpp). Errors and thread-safety
// as check_rules.
template <class B>
concept StandingBackend = EngineBackend<B> &&
    requires(B& backend, std::span<const RuleKey> keys, std::span<Decision> out) {
  { backend.check_rules_as_they_stand(keys, out) } -> std::same_as<absl::Status>;
};

// A clock. `now()` is the backend's time (ns), the one its limiters decide on; the engine uses it
// for adaptive controllers and for rate-limiting its events, so a test's ManualClock drives both.
template <class B>
concept ClockedBackend = EngineBackend<B> && requires(const B& backend) {
  { backend.now() } -> std::same_as<std::chrono::nanoseconds>;
};

// Carried windows. `B::kCarriesWindows` is true: the backend keeps each rule's state apart (a
// store per rule index), and a reload that changes only a rule's windows (same
// CompiledRule::identity) keeps each key's spent share of its buckets. Its keys therefore name
// only the request's attributes. Other backends' rules share one keyspace, so each key starts
// with the rule's whole fingerprint and a changed limit reads no state written under other
// windows; the Redis and PostgreSQL backends carry a changed rule's state themselves, key by key
// (sluice/engine/carried_rules.hpp).
template <class B>
concept WindowCarryingBackend = EngineBackend<B> && requires {
  requires B::kCarriesWindows;
};

// Configured. `B::configure(section, options, reload)` turns the config's `backend` section
// (sluice/backend_config.hpp) and the code's options into the options a generation is created
// with: at creation it may choose and open a backend; on a reload it refuses a changed section.
// `B::carries_windows(options)` says whether the chosen backend carries windows (as
// WindowCarryingBackend). A backend without this power refuses any `backend` section.
template <class B>
concept ConfiguredBackend = EngineBackend<B> &&
    requires(const BackendConfig& section, const typename B::Options& options) {
  { B::configure(section, options, bool{}) } -> std::same_as<absl::StatusOr<typename B::Options>>;
  { B::carries_windows(options) } -> std::same_as<bool>;
};

namespace detail {

// The options a generation of an engine over B is created with, and whether its rules carry
// windows: the section configures a ConfiguredBackend; any other backend is fixed by its type.
template <class B>
absl::StatusOr<typename B::Options> configure_backend(const BackendConfig& section,
                                                      typename B::Options options, bool reload) {
  if constexpr (ConfiguredBackend<B>) {
    return B::configure(section, std::move(options), reload);
  } else {
    if (!section.type) return options;
    return absl::InvalidArgumentError(absl::StrCat(
        "backend.type: ", std::string(to_string(*section.type)),
        ": this engine's backend is fixed by its C++ type; to choose the backend in the config, "
        "use sluice::RuntimeRateLimitEngine (sluice/runtime_engine.hpp), or remove the section"));
  }
}
template <class B>
bool carries_windows(const typename B::Options& options) {
  if constexpr (ConfiguredBackend<B>) {
    return B::carries_windows(options);
  } else {
    return WindowCarryingBackend<B>;
  }
}

// A backend's Booking type, or an empty one for a backend without bookings.
template <class B>
struct BookingOf {
  struct type {};
};
template <BookingBackend B>
struct BookingOf<B> {
  using type = typename B::Booking;
};

// The clock of the local failure mode: backend options' `clock` member if it is a Clock (the
// in-memory backend's), else the steady clock.
template <class Options>
struct LocalClockOf {
  using type = SteadyClock;
  static type get(const Options& /*options*/) { return {}; }
};
template <class Options>
requires Clock<std::remove_cvref_t<decltype(std::declval<const Options&>().clock)>>
struct LocalClockOf<Options> {
  using type = std::remove_cvref_t<decltype(std::declval<const Options&>().clock)>;
  static type get(const Options& options) { return options.clock; }
};

}  // namespace detail
}  // namespace sluice

#endif  // SLUICE_ENGINE_BACKEND_HPP_
