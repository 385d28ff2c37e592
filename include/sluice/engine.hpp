// sluice/engine.hpp — the policy engine: a gateway config compiled into per-request decisions.
//
// A `RateLimitEngine` is compiled once per config generation from a `PolicyConfig`
// (sluice/policy.hpp) and is then immutable: share it between threads, evaluate every request
// through it, and compile the next generation from it on reload.
//
//   auto engine = sluice::RateLimitEngine::create(config);   // InvalidArgument names the bad path
//   if (!engine.ok()) return engine.status();
//   sluice::Evaluation e = engine->evaluate({.client_ip = "203.0.113.7",
//                                            .route = "public",
//                                            .path = "/v1/items",
//                                            .wall_time = std::chrono::system_clock::now()});
//   if (!e.allowed) respond(429, e.fields);   // Retry-After, X-RateLimit-*, RateLimit(-Policy)
//   if (e.dry_denied) log_would_deny(engine->rule(e.dry_denied->rule).label);
//   auto next = engine->reload(new_config);  // unchanged rules keep their state (see reload)
//   engine->evaluate(request, reused);        // into a kept Evaluation: no allocation
//
// What applies: every bundle attached at a scope the request has — consumer, route, service,
// listener, global — in that precedence order (declaration order inside a scope); a rule attached
// twice applies once. Exempt paths (exact match) get nothing. All live rules are evaluated; the
// request is denied if any denies. Retry-After is the longest wait over denying rules, the
// X-RateLimit-* fields describe the first denying rule in precedence order, or for an admission
// the live window with the least remaining (ties: precedence). Dry-run bundles are evaluated as
// their own group, their buckets advance as if enforcing, and the first would-be denial is
// reported in `dry_denied`; they never deny and never add fields.
//
// Keys: a rule's key is its identity plus its selected attributes in the canonical order ip,
// credential, route. `ip` is the client address's network under the rule's address prefixes
// (IPv4 /32 and IPv6 /64 by default; unparsable addresses share one key). `credential` falls back
// to the client address (tagged, so a credential equal to an address is still a different key)
// until the request carries an authenticated credential (with its consumer); an unrouted request
// has a route component that no route name can produce.
//
// Consumption (EngineOptions::consumption): kAllOrNothing (default) decides all of a request's
// rules under all their locks and commits only if every rule admits, so a denied request consumes
// nothing anywhere; kEveryRule lets each admitting rule consume even when another denies.
//
// Backend failures (EngineOptions::on_backend_error; a bad cost is the request's fault, never a
// backend failure): kFailOpen admits and kFailClosed denies, the error in `backend_error`.
// kLocal decides the request in process instead, on the local share: the same rules with every
// window's requests and burst scaled to max(1, floor(n × local_share_permille / 1000)), same
// periods, in in-memory limiters kept for the engine's life (a reload keeps the local state of a
// rule whose fingerprint and share are unchanged, like the shared state, and carries each key's
// spent share when only its windows or the share changed). Such an evaluation has
// `degraded` set, OK `backend_error`, and fields from the local limiters; it opens no settlement.
// After a failure, requests are decided locally at once, without calling the backend; the first
// request at least `local_retry_interval_ms` after the failure calls it again (one per interval,
// decided locally if it fails too), and once one succeeds decisions are shared again. The clock
// of the local share and of that interval is the backend options' `clock` if they have one, else
// the steady clock. A backend that fails mid-call (a timeout) still costs the requests already in
// flight their wait; only later requests skip it. inspect() and reset() always ask the backend.
//
// Counters and events: stats() per rule and engine_stats() for the engine, kept across reloads
// (sluice/prometheus.hpp writes them for Prometheus); an EngineEventHook passed to create()
// receives dry-run denials, backend errors, evictions and reloads (sluice/engine_events.hpp).
// Neither carries a key. To follow a config file, see sluice/yaml/reloading_engine.hpp.
//
// Thread-safety: every const member function may be called concurrently; `evaluate` takes the
// shard locks of the request's rules (in one global order) for O(rules) work.
#ifndef SLUICE_ENGINE_HPP_
#define SLUICE_ENGINE_HPP_

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/adaptive.hpp"
#include "sluice/client_address.hpp"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/detail/local_mode.hpp"
#include "sluice/detail/text.hpp"
#include "sluice/detail/xxhash.hpp"
#include "sluice/engine_events.hpp"
#include "sluice/gcra.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/key.hpp"
#include "sluice/policy.hpp"
#include "sluice/store.hpp"

namespace sluice {

// One request, as the gateway sees it. Views must outlive `evaluate`. An empty string in any
// optional field means the same as an absent one.
struct RequestContext {
  std::string_view client_ip{};
  // The credential the request presented (e.g. a bearer token). It keys `credential` rules only
  // when `consumer` is set too, i.e. once the gateway has authenticated it; until then those
  // rules key the client address, so a client cannot mint a fresh bucket per request.
  std::optional<std::string_view> credential{};
  std::optional<std::string_view> consumer{};  // the consumer the credential authenticated as
  std::optional<std::string_view> route{};     // none: unrouted (no route matched)
  // None: the route's configured service, if it has one. Naming another service than the route's
  // is an error (InvalidArgument in Evaluation::backend_error, the request denied).
  std::optional<std::string_view> service{};
  std::optional<std::string_view> listener{};
  std::string_view path{};
  std::uint64_t cost = 1;
  // Wall clock now, only for X-RateLimit-Reset. None: the engine reads the system clock, once,
  // and only for a request that gets fields.
  std::optional<WallTime> wall_time{};
};

// One rule's decision: `rule` indexes `RateLimitEngine::rule()`.
struct RuleDecision {
  std::size_t rule = 0;
  Decision decision{};
  friend bool operator==(const RuleDecision&, const RuleDecision&) = default;
};

// What the engine decided for one request.
struct Evaluation {
  bool exempt = false;         // the path is exempt: no rule applied, no fields
  bool allowed = true;         // the live outcome (after the failure mode, on backend error)
  std::size_t live_rules = 0;  // live rules that applied
  // The rule the fields describe: the first denying live rule in precedence order, or for an
  // admission the live window with the least remaining. Empty when no live rule applied.
  std::optional<RuleDecision> binding{};
  std::chrono::nanoseconds retry_after{0};   // longest wait over denying live rules
  HttpFields fields{};                       // to write into the response
  std::optional<RuleDecision> dry_denied{};  // first would-be denial of a dry-run bundle
  absl::Status backend_error{};  // OK unless the backend, the cost or the request was bad
  // Rules of this request were decided in process on the local share, not by the backend
  // (FailureMode::kLocal while the backend fails): the decision is this replica's alone.
  bool degraded = false;
};

// Per-rule counters; no raw keys. For every evaluated request of cost ≥ 1 whose rules the backend
// decided: if the request was admitted, `admitted` of every rule that applied (live or dry-run)
// grows by 1; if it was denied, `denied` of each live rule that denied it grows by 1 (several
// rules may deny one request); a dry-run rule's would-be denial adds 1 to its `dry_denied`. So for
// a live rule, admitted + denied ≤ requests it applied to (the rest were denied by other rules).
// Peeks (cost 0), exempt paths and backend errors change no counter.
struct RuleStats {
  std::string label{};
  bool dry_run = false;
  std::uint64_t admitted = 0;               // requests admitted while the rule applied
  std::uint64_t denied = 0;                 // requests this (live) rule denied
  std::uint64_t dry_denied = 0;             // would-be denials of a dry-run rule
  StoreStats store{};                       // keys, evictions, capacity denials
  std::optional<AdaptiveState> adaptive{};  // its lowest route's, now (adaptive_state)
  // Of the requests above (cost ≥ 1, decided), those this rule decided in process on the local
  // share (FailureMode::kLocal) while the backend failed.
  std::uint64_t degraded = 0;
};

// The counters of RuleStats without the label: reading them allocates nothing.
struct RuleCounts {
  std::uint64_t admitted = 0;
  std::uint64_t denied = 0;
  std::uint64_t dry_denied = 0;
  StoreStats store{};
  std::uint64_t degraded = 0;
};

// Engine-wide counters. Every generation reloaded from an engine shares them with it, so they
// count over the engine's whole life, like the counters of unchanged rules.
struct EngineStats {
  std::uint64_t evaluations = 0;     // evaluate calls on non-exempt paths
  std::uint64_t backend_errors = 0;  // evaluations during which the backend failed (not a bad cost)
  std::uint64_t reloads = 0;         // successful reloads
  std::uint64_t failed_reloads = 0;  // reloads that kept the previous generation
  // Evaluations with Evaluation::degraded: decided (in part) on the local share (kLocal).
  std::uint64_t degraded_evaluations = 0;
  friend bool operator==(const EngineStats&, const EngineStats&) = default;
};

namespace detail {
// A backend's Booking type (what it records to settle a request's cost), or an empty one.
template <class B>
struct BookingOf {
  struct type {};
};
template <class B>
requires requires { typename B::Booking; }
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

// A rule, the key a request selects for it and the cost to take in the rule's limiter windows
// (`limiter_windows`: the request's cost, or for an adaptive rule its `adaptive_units`); `rule`
// indexes the compiled rules.
struct RuleKey {
  std::size_t rule = 0;
  std::string_view key{};
  std::uint64_t cost = 1;
};

// What the engine needs from a limiter backend: decide a request's rules (in `mode`), each key at
// its own cost, writing one decision per key; and per-rule store counters. Constructed per
// generation by `B::create(std::span<const CompiledRule>, const B* previous, const B::Options&)`,
// keeping the state of every rule whose fingerprint `previous` also has. A backend that also
// carries the state of a rule whose windows changed (same CompiledRule::identity) declares
// `static constexpr bool kCarriesWindows = true`; the engine then keys rules by identity.
template <class B>
concept EngineBackend = requires(B& backend, const B& const_backend, std::span<const RuleKey> keys,
                                 ConsumptionMode mode, std::span<Decision> out,
                                 std::span<const CompiledRule> rules,
                                 const typename B::Options& options) {
  { backend.check_rules(keys, mode, out) } -> std::same_as<absl::Status>;
  { const_backend.rule_store_stats(std::size_t{}) } -> std::same_as<StoreStats>;
  { B::create(rules, &const_backend, options) } -> std::same_as<absl::StatusOr<B>>;
};

// The in-memory backend: one GcraLimiter per rule, all-or-nothing commits under every involved
// shard lock taken in ascending address order.
template <Clock ClockT = SteadyClock>
class InMemoryBackend {
 public:
  struct Options {
    StoreOptions store{};  // per rule; overflow must stay kEvict for all-or-nothing commits
    ClockT clock{};
  };

  // A rule whose windows change (same identity) keeps each key's spent share (see create).
  static constexpr bool kCarriesWindows = true;

  // One limiter per rule. With `previous` (a reload): a rule whose fingerprint `previous` has
  // shares its limiter; a rule whose identity it has but with other windows gets a new limiter
  // into which every live key of the previous one is copied at once, each window holding the
  // same spent share of its new bucket (GcraLimiter::carry_from: rounded toward less room, an
  // added window empty, a removed one dropped). That copy is O(keys + store capacity) of the
  // previous limiter, taking its shard locks one at a time; admissions the previous generation
  // makes after its shard was copied are not carried. Any other rule starts empty.
  static absl::StatusOr<InMemoryBackend> create(std::span<const CompiledRule> rules,
                                                const InMemoryBackend* previous,
                                                const Options& options) {
    if (options.store.overflow != Overflow::kEvict) {
      return absl::InvalidArgumentError("the engine's in-memory stores must use Overflow::kEvict");
    }
    InMemoryBackend backend(options.clock);
    for (const CompiledRule& rule : rules) {
      std::shared_ptr<GcraLimiter<ClockT>> limiter =
          previous != nullptr ? previous->find(previous->by_fingerprint_, rule.fingerprint)
                              : nullptr;
      if (limiter == nullptr) {
        auto created = new_limiter(
            rule,
            previous != nullptr ? previous->find(previous->by_identity_, rule.identity) : nullptr,
            options);
        if (!created.ok()) return created.status();
        limiter = *std::move(created);
      }
      backend.by_fingerprint_.emplace(rule.fingerprint, backend.limiters_.size());
      backend.by_identity_.emplace(rule.identity, backend.limiters_.size());
      backend.limiters_.push_back(std::move(limiter));
    }
    return backend;
  }

  absl::Status check_rules(std::span<const RuleKey> keys, ConsumptionMode mode,
                           std::span<Decision> out) {
    for (const RuleKey& k : keys) {
      if (absl::Status s = limiters_[k.rule]->validate_cost(k.cost); !s.ok()) return s;
    }
    if (mode == ConsumptionMode::kEveryRule) {
      for (std::size_t i = 0; i < keys.size(); ++i) {
        out[i] = *limiters_[keys[i].rule]->check(keys[i].key, keys[i].cost);
      }
      return absl::OkStatus();
    }
    absl::InlinedVector<KeyDigest, 8> digests;
    ShardLockSet locks;
    for (const RuleKey& k : keys) {
      digests.push_back(limiters_[k.rule]->digest(k.key));
      limiters_[k.rule]->add_lock(locks, digests.back());
    }
    commit_all(HeldShardLocks(locks), keys, digests, out);
    return absl::OkStatus();
  }

  StoreStats rule_store_stats(std::size_t rule) const { return limiters_[rule]->stats(); }

  // One live rule's admission of a request, kept to settle its cost later
  // (BasicRateLimitEngine::settle). It holds the rule's limiter, so it outlives reloads.
  struct Booking {
    std::shared_ptr<GcraLimiter<ClockT>> limiter{};
    detail::GcraBooking booking{};
    std::uint64_t units = 0;  // the cost taken, in the rule's limiter units
  };

  // `check_rules` that also records each key's booking when every key was admitted (else
  // `bookings` is left empty). Each key's decision and booking are taken under its shard lock.
  absl::Status check_rules_booking(std::span<const RuleKey> keys, ConsumptionMode mode,
                                   std::span<Decision> out, std::vector<Booking>& bookings) {
    bookings.clear();
    for (const RuleKey& k : keys) {
      if (absl::Status s = limiters_[k.rule]->validate_cost(k.cost); !s.ok()) return s;
    }
    absl::InlinedVector<KeyDigest, 8> digests;
    for (const RuleKey& k : keys) digests.push_back(limiters_[k.rule]->digest(k.key));
    const std::int64_t now = detail::saturate_time(clock_.now().count());
    auto record = [&](const HeldShardLocks& held, std::size_t i) {
      Booking b{.limiter = limiters_[keys[i].rule], .units = keys[i].cost};
      b.limiter->record_locked(held, digests[i], now, keys[i].cost, b.booking);
      bookings.push_back(std::move(b));
    };
    bool all = true;
    if (mode == ConsumptionMode::kEveryRule) {
      for (std::size_t i = 0; i < keys.size(); ++i) {
        ShardLockSet locks;
        limiters_[keys[i].rule]->add_lock(locks, digests[i]);
        const HeldShardLocks held(locks);
        limiters_[keys[i].rule]->decide_locked(held, digests[i], now, keys[i].cost, true, out[i]);
        all = all && out[i].allowed();
        if (all) record(held, i);
      }
    } else {
      ShardLockSet locks;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        limiters_[keys[i].rule]->add_lock(locks, digests[i]);
      }
      const HeldShardLocks held(locks);
      commit_all(held, keys, digests, out);
      for (std::size_t i = 0; i < keys.size(); ++i) all = all && out[i].allowed();
      if (all) {
        for (std::size_t i = 0; i < keys.size(); ++i) record(held, i);
      }
    }
    if (!all) bookings.clear();
    return absl::OkStatus();
  }

  // Settles one booking at `units` (charge or refund, as GcraLimiter::settle): the key's state
  // after it.
  static absl::StatusOr<Decision> settle_booking(const Booking& b, std::uint64_t units) {
    return b.limiter->settle_booking(b.booking, b.units, units);
  }

  // Forgets rule `rule`'s state for `key` (BasicRateLimitEngine::reset).
  absl::Status reset_key(std::size_t rule, std::string_view key) {
    limiters_[rule]->reset(key);
    return absl::OkStatus();
  }

  // The backend's clock: the engine's time for rate-limiting eviction events.
  std::chrono::nanoseconds now() const { return clock_.now(); }

 private:
  explicit InMemoryBackend(ClockT clock) : clock_(std::move(clock)) {}

  std::shared_ptr<GcraLimiter<ClockT>> find(
      const absl::flat_hash_map<std::string, std::size_t>& index, const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? nullptr : limiters_[it->second];
  }

  // A new limiter for `rule`. With `carried` (the previous generation's limiter of a rule with
  // the same identity but other windows): under its digest seed, holding each of its keys' spent
  // share (GcraLimiter::carry_from), copied eagerly here, O(carried's keys).
  static absl::StatusOr<std::shared_ptr<GcraLimiter<ClockT>>> new_limiter(
      const CompiledRule& rule, const std::shared_ptr<GcraLimiter<ClockT>>& carried,
      const Options& options) {
    StoreOptions store = options.store;
    if (carried != nullptr) store.seed = carried->seed();
    auto created = GcraLimiter<ClockT>::create(limiter_windows(rule), store, options.clock);
    if (!created.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(rule.label, ": ", created.status().message()));
    }
    auto limiter = std::make_shared<GcraLimiter<ClockT>>(*std::move(created));
    if (carried != nullptr) limiter->carry_from(*carried);
    return limiter;
  }

  // Decides every key under `held` (all their shard locks); commits only if all admit.
  void commit_all(const HeldShardLocks& held, std::span<const RuleKey> keys,
                  std::span<const KeyDigest> digests, std::span<Decision> out) {
    const std::int64_t now = detail::saturate_time(clock_.now().count());
    bool all = true;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      limiters_[keys[i].rule]->decide_locked(held, digests[i], now, keys[i].cost, false, out[i]);
      all = all && out[i].allowed();
    }
    if (all) {
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (keys[i].cost == 0) continue;
        limiters_[keys[i].rule]->admit_locked(held, digests[i], now, keys[i].cost);
      }
    }
  }

  ClockT clock_;
  absl::flat_hash_map<std::string, std::size_t> by_fingerprint_;  // -> index into limiters_
  absl::flat_hash_map<std::string, std::size_t> by_identity_;     // -> index into limiters_
  std::vector<std::shared_ptr<GcraLimiter<ClockT>>> limiters_;
};

template <EngineBackend Backend>
class BasicRateLimitEngine {
 public:
  using BackendOptions = typename Backend::Options;
  // Called after every non-exempt evaluation, on the evaluating thread. It sees rule indices
  // and decisions, never keys; it must be thread-safe and fast (it runs on the request path).
  using Observer = std::function<void(const Evaluation&)>;

  // A compiled rule with what the fields need, precomputed.
  struct RuleInfo {
    CompiledRule compiled{};
    std::vector<std::string> window_names{};    // "<label>/s" ...: RateLimit(-Policy) item names
    std::vector<std::string> limit_prefixes{};  // per window: the RateLimit value up to `r=`
    std::string policy_value{};                 // the RateLimit-Policy value for all its windows
    std::string key_prefix{};  // the rule in its keys: a hash of its identity or fingerprint
    // An adaptive rule's bucket in limiter units (its smallest burst × 1000): a request whose
    // scaled cost exceeds it takes the whole bucket instead. 0 for other rules.
    std::uint64_t adaptive_max_units = 0;
  };

  // Validates and compiles `config` (InvalidArgument naming the path of a bad value).
  // `on_event` receives dry-run denials, backend errors, evictions and reloads
  // (sluice/engine_events.hpp); every generation reloaded from this one keeps it.
  static absl::StatusOr<BasicRateLimitEngine> create(const PolicyConfig& config,
                                                     BackendOptions options = {},
                                                     const Observer& observer = {},
                                                     const EngineEventHook& on_event = {}) {
    auto engine = compile(config, std::move(options), nullptr);
    if (engine.ok()) {
      engine->observer_ = observer;
      engine->on_event_ = on_event;
    }
    return engine;
  }

  // The next generation: rules whose fingerprint is unchanged keep their state and counters,
  // so a reload never lets extra traffic through them. A rule whose only change is its windows
  // (rates, bursts, window lengths) keeps each key's spent share of its buckets on a backend with
  // kCarriesWindows (in memory); on other backends, and for any other change, it starts fresh.
  // Counts the reload (EngineStats) and reports a ReloadEvent, success or failure.
  absl::StatusOr<BasicRateLimitEngine> reload(const PolicyConfig& config) const {
    auto engine = compile(config, options_, this);
    if (!engine.ok()) {
      report_failed_reload(engine.status());
      return engine;
    }
    engine->observer_ = observer_;
    engine->on_event_ = on_event_;
    totals_->reloads.fetch_add(1, std::memory_order_relaxed);
    if (on_event_) {
      std::size_t kept = 0;
      for (const RuleInfo& info : engine->rules_) {
        if (by_fingerprint_.contains(info.compiled.fingerprint)) ++kept;
      }
      on_event_(ReloadEvent{.rules = engine->rules_.size(), .rules_kept = kept});
    }
    return engine;
  }

  // Records a reload that failed before it reached `reload` (an unreadable or invalid config
  // file): counts it in EngineStats::failed_reloads and reports a ReloadEvent with `status`.
  void report_failed_reload(const absl::Status& status) const {
    totals_->failed_reloads.fetch_add(1, std::memory_order_relaxed);
    if (on_event_) on_event_(ReloadEvent{.status = status});
  }

  // --- Settled cost: admit a request on an estimated cost (`RequestContext::cost`), then
  // settle every live rule at the actual cost once it is known (GcraLimiter::settle's rules:
  // a charge may put a key in debt, a refund gives back only what is still booked ahead).
  // Backends with bookings: the in-memory one and Redis (RedisEngineBackend); PostgreSQL answers
  // Unimplemented.

  // What a request's live rules booked. Move-only, settled at most once. It holds the rules'
  // state (not the engine), so it stays valid across reloads and settles the rules that the
  // request was evaluated under.
  class Settlement {
   public:
    bool open() const noexcept { return open_.is_open(); }
    std::uint64_t estimate() const noexcept { return estimate_; }

   private:
    friend class BasicRateLimitEngine;
    std::vector<typename detail::BookingOf<Backend>::type> bookings_;
    std::vector<std::uint32_t> factors_;  // per booking: an adaptive rule's factor, else 0
    std::uint64_t estimate_ = 0;
    detail::OpenFlag open_;
  };

  // `evaluate(request, e)` that also fills `settlement`: open iff the request was admitted with
  // a cost ≥ 1, no backend error, and the backend books (else it is decided as by `evaluate`
  // and the settlement stays closed).
  void evaluate(const RequestContext& raw, Evaluation& e, Settlement& settlement) const {
    settlement = Settlement{};
    evaluate_into(raw, e, &settlement);
  }

  // Settles every live rule of the request at `actual` units (≤ 2^32; an adaptive rule at the
  // factor it was evaluated with). FailedPrecondition if the settlement is not open; the first
  // error of a rule otherwise (the other rules are still settled).
  absl::Status settle(Settlement& settlement, std::uint64_t actual) const {
    if constexpr (kBackendBooks) {
      if (actual > (std::uint64_t{1} << 32)) {
        return absl::InvalidArgumentError(
            absl::StrCat("an actual cost must be at most 2^32, got ", actual));
      }
      if (!settlement.open_.take()) {
        return absl::FailedPreconditionError(
            "the settlement was settled already or never admitted");
      }
      absl::Status first;
      for (std::size_t i = 0; i < settlement.bookings_.size(); ++i) {
        const std::uint32_t factor = settlement.factors_[i];
        const std::uint64_t units = factor == 0 ? actual : adaptive_units(actual, factor);
        absl::StatusOr<Decision> d = Backend::settle_booking(settlement.bookings_[i], units);
        if (!d.ok() && first.ok()) first = d.status();
      }
      return first;
    } else {
      (void)settlement;
      (void)actual;
      return absl::UnimplementedError("this engine backend cannot settle costs");
    }
  }

  Evaluation evaluate(const RequestContext& raw) const {
    Evaluation e;
    evaluate(raw, e);
    return e;
  }

  // The same evaluation, written into `e` (whatever it held before is replaced). The field
  // values reuse the strings `e` already holds, so a caller that keeps one Evaluation per thread
  // and evaluates into it allocates nothing once it has held the longest values.
  void evaluate(const RequestContext& raw, Evaluation& e) const { evaluate_into(raw, e, nullptr); }

 private:
  static constexpr bool kBackendBooks = requires { typename Backend::Booking; };
  // The backend carries a rule's keys across a change of its windows (Backend::kCarriesWindows),
  // so its keys name the rule's identity; other backends' keys name the whole fingerprint, so
  // that a changed limit reads no state written under other windows.
  static constexpr bool kKeysByIdentity = requires { requires Backend::kCarriesWindows; };

  // How check_group decided one group of rules.
  struct GroupOutcome {
    bool degraded = false;  // on the local share
    absl::Status failure;   // the backend's failure that sent it there, if the backend was called
  };

  // The request path, in the order it runs: identity, rule selection, keys, the backend's
  // decisions (live rules, then dry-run ones), then the counters, events and observer.
  void evaluate_into(const RequestContext& raw, Evaluation& e, Settlement* settlement) const {
    HttpFields recycled = std::move(e.fields);
    e = Evaluation{};
    if (exempt(raw.path)) {
      e.exempt = true;
      return;
    }
    totals_->evaluations.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<RequestContext> request = normalize(raw);
    if (!request.ok()) {
      e.allowed = false;
      e.backend_error = std::move(request).status();
      if (observer_) observer_(e);
      return;
    }
    RuleGroup live, dry;
    select_rules(*request, live, dry);
    thread_local std::string buffer;  // the keys' bytes; RequestKeys views into it
    const RequestKeys keys = request_keys(*request, live, dry, buffer);
    absl::InlinedVector<Decision, 16> decisions(keys.keys.size());
    GroupOutcome live_outcome, dry_outcome;  // whether each group was decided on the local share
    e.live_rules = live.size();
    if (!live.empty()) {
      decide_live_group(e, *request, live, keys, decisions, settlement, recycled, live_outcome);
    }
    const bool dry_decided =
        !dry.empty() && decide_dry_group(e, live, dry, keys, decisions, live_outcome, dry_outcome);
    count_degraded(e, live, live_outcome.degraded && e.backend_error.ok(), dry,
                   dry_outcome.degraded && dry_decided, request->cost);
    if (settlement != nullptr && !live_outcome.degraded) {
      open_settlement(*settlement, e, live, keys.factors, request->cost);
    }
    if (e.allowed && e.backend_error.ok() && request->cost != 0) {
      for (std::uint32_t r : live) counters_[r]->admitted.fetch_add(1, std::memory_order_relaxed);
      if (dry_decided) {
        for (std::uint32_t r : dry) counters_[r]->admitted.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (on_event_) {
      report_evictions(live);
      report_evictions(dry);
    }
    if (observer_) observer_(e);
  }

  // Every selected rule's key, live rules first, with its cost; and, where adaptive rules exist,
  // each key's factor (0 for a fixed rule), since adaptive rules take their cost in thousandths of
  // a request scaled by the factor.
  struct RequestKeys {
    absl::InlinedVector<RuleKey, 16> keys;
    absl::InlinedVector<std::uint32_t, 16> factors;
  };
  RequestKeys request_keys(const RequestContext& request, std::span<const std::uint32_t> live,
                           std::span<const std::uint32_t> dry, std::string& buffer) const {
    // Keys for both groups in one buffer; views are taken once it stops growing.
    buffer.clear();
    absl::InlinedVector<std::pair<std::size_t, std::size_t>, 16> spans;
    const ClientAddress address = ClientAddress::parse(request.client_ip);
    for (std::uint32_t r : live) spans.push_back(append_key(buffer, r, request, address));
    for (std::uint32_t r : dry) spans.push_back(append_key(buffer, r, request, address));
    RequestKeys out;
    for (std::size_t i = 0; i < spans.size(); ++i) {
      out.keys.push_back({.rule = i < live.size() ? live[i] : dry[i - live.size()],
                          .key = std::string_view(buffer).substr(spans[i].first, spans[i].second),
                          .cost = request.cost});
    }
    if (adaptive_rules_ != 0) apply_factors(out.keys, out.factors, request.route);
    return out;
  }

  // The live rules decide the request: all of them admit it, or it is denied and none consumes.
  void decide_live_group(Evaluation& e, const RequestContext& request,
                         std::span<const std::uint32_t> live, const RequestKeys& keys,
                         std::span<Decision> decisions, Settlement* settlement,
                         HttpFields& recycled, GroupOutcome& outcome) const {
    const std::span<Decision> out = decisions.first(live.size());
    absl::Status status =
        check_group(std::span(keys.keys).first(live.size()), out, settlement, outcome);
    if (!outcome.failure.ok()) report_backend_error(outcome.failure);
    if (status.ok() && !keys.factors.empty()) in_requests(keys.factors, 0, out);
    if (!status.ok()) {
      report_backend_error(status);
      e.backend_error = std::move(status);
      e.allowed = e.backend_error.code() != absl::StatusCode::kInvalidArgument &&
                  on_backend_error_ == FailureMode::kFailOpen;
      return;
    }
    decide_live(e, live, std::span<const Decision>(out), request, recycled);
  }

  // The dry-run rules, after the live ones; true if they were decided. A backend failure is
  // reported once per evaluation: here only if the live rules reported none.
  bool decide_dry_group(Evaluation& e, std::span<const std::uint32_t> live,
                        std::span<const std::uint32_t> dry, const RequestKeys& keys,
                        std::span<Decision> decisions, const GroupOutcome& live_outcome,
                        GroupOutcome& outcome) const {
    const absl::Status status =
        evaluate_dry(e, dry, std::span(keys.keys).subspan(live.size(), dry.size()), keys.factors,
                     decisions.subspan(live.size(), dry.size()), outcome);
    const bool decided = status.ok();
    const absl::Status& failed = decided ? outcome.failure : status;
    if (!failed.ok() && e.backend_error.ok() && live_outcome.failure.ok()) {
      report_backend_error(failed);
    }
    return decided;
  }

  // An admitted request's settlement: opened once every live rule booked its cost, with each
  // rule's factor so that settle charges at the factor the request was evaluated at.
  static void open_settlement(Settlement& settlement, const Evaluation& e,
                              std::span<const std::uint32_t> live,
                              std::span<const std::uint32_t> factors, std::uint64_t cost) {
    if (!e.allowed || !e.backend_error.ok() || cost == 0 ||
        settlement.bookings_.size() != live.size()) {
      return;
    }
    settlement.estimate_ = cost;
    settlement.factors_.assign(
        factors.begin(),
        factors.begin() + static_cast<std::ptrdiff_t>(factors.empty() ? 0 : live.size()));
    settlement.factors_.resize(live.size(), 0);
    settlement.open_.open();
  }

 public:
  // Feeds one upstream response to the controller of every adaptive rule that applies to
  // `request` (as `evaluate` selects them: live and dry-run). InvalidArgument, and nothing fed, if
  // the request names another service than its route's. Call it once per upstream answer
  // (latency, status, Retry-After); a request that never reached the upstream feeds nothing. The
  // answer feeds the rule's controller for the request's route (each adaptive rule has one per
  // route, and one for unrouted requests) and counts as one to the request's client (its address
  // and consumer): a controller shrinks only on answers to several distinct clients
  // (AdaptivePolicy::min_clients).
  absl::Status record_upstream(const RequestContext& raw, const UpstreamResponse& response) const {
    if (adaptive_rules_ == 0 || exempt(raw.path)) return absl::OkStatus();
    absl::StatusOr<RequestContext> request = normalize(raw);
    if (!request.ok()) return request.status();
    RuleGroup live, dry;
    select_rules(*request, live, dry);
    const std::chrono::nanoseconds at = now();
    const std::uint64_t client = client_digest(*request);
    for (const RuleGroup* group : {&live, &dry}) {
      for (std::uint32_t r : *group) {
        if (AdaptiveController* c = controller(r, request->route)) c->record(at, response, client);
      }
    }
    return absl::OkStatus();
  }

 private:
  // Who sent a request, for telling an upstream's answers to distinct clients apart: its address
  // as the adapter resolved it, and its consumer if it authenticated as one.
  static std::uint64_t client_digest(const RequestContext& request) {
    return absl::HashOf(request.client_ip, request.consumer.value_or(std::string_view{}));
  }

 public:
  // --- Operators: one rule's state for the key a request would use, by the rule's label
  // ("bundle/rule") and the request's attributes (address, credential and consumer, route, ...:
  // whatever the rule's selector reads). The rule need not apply to the request: the attributes
  // only choose the key. NotFound for an unknown label; InvalidArgument for a request the engine
  // would refuse (e.g. a service other than its route's).

  // The rule's Decision for that key without consuming anything (a peek: see
  // GcraLimiter::inspect); an adaptive rule's limit and remaining are in requests at its current
  // factor. One backend call; errors as the backend's.
  absl::StatusOr<Decision> inspect(std::string_view rule_label, const RequestContext& raw) const {
    absl::StatusOr<RuleKeyFor> k = key_for(rule_label, raw);
    if (!k.ok()) return k.status();
    RuleKey key{.rule = k->rule, .key = k->key, .cost = 0};
    absl::InlinedVector<std::uint32_t, 16> factors;
    if (adaptive_rules_ != 0) apply_factors(std::span(&key, 1), factors, raw.route);
    Decision d;
    if (absl::Status s = backend_->check_rules(std::span<const RuleKey>(&key, 1),
                                               ConsumptionMode::kAllOrNothing, std::span(&d, 1));
        !s.ok()) {
      return s;
    }
    if (!factors.empty()) in_requests(factors, 0, std::span(&d, 1));
    return d;
  }

  // Forgets the rule's state for that key: its next request is decided as a new client's.
  // Unimplemented for a backend without `reset_key`.
  absl::Status reset(std::string_view rule_label, const RequestContext& raw) const {
    if constexpr (requires(Backend & b) { b.reset_key(std::size_t{}, std::string_view{}); }) {
      absl::StatusOr<RuleKeyFor> k = key_for(rule_label, raw);
      if (!k.ok()) return k.status();
      return backend_->reset_key(k->rule, k->key);
    } else {
      (void)rule_label;
      (void)raw;
      return absl::UnimplementedError("this engine backend cannot reset a key");
    }
  }

  // Request routing helpers for gateways that resolve routes and consumers from the config.
  struct RouteMatch {
    std::string_view route{};
    std::optional<std::string_view> service{};
  };
  // The route with the longest path_prefix that starts `path`, among routes on `listener` (or
  // on every listener). `path` must be normalized (sluice/request_path.hpp), and the request
  // must be served on that same path: a raw path climbs out of a prefix with dot segments.
  std::optional<RouteMatch> match_route(std::string_view listener, std::string_view path) const {
    for (const auto& route : routes_) {  // sorted longest prefix first
      if (!route.listener.empty() && route.listener != listener) continue;
      if (route.path_prefix.empty() || !path.starts_with(route.path_prefix)) continue;
      RouteMatch match{.route = route.name};
      if (!route.service.empty()) match.service = route.service;
      return match;
    }
    return std::nullopt;
  }
  // The consumer that owns `credential`.
  std::optional<std::string_view> consumer_for(std::string_view credential) const {
    auto it = credentials_.find(absl::string_view(credential.data(), credential.size()));
    if (it == credentials_.end()) return std::nullopt;
    return std::string_view(it->second);
  }
  // The client-address resolver of this generation's gateway.trusted_proxies (header choice
  // ProxyHeaders::kForwardedFirst; an adapter passes its own to `resolve`). Adapters resolve every
  // request with the generation that evaluates it, so a reload that changes the proxies applies
  // from the next request on.
  const ClientAddressResolver& client_addresses() const noexcept { return client_addresses_; }

  std::size_t rule_count() const noexcept { return rules_.size(); }
  const RuleInfo& rule(std::size_t index) const { return rules_[index]; }
  std::vector<RuleStats> stats() const {
    std::vector<RuleStats> out;
    for (std::size_t i = 0; i < rules_.size(); ++i) {
      const RuleCounts counts = rule_counts(i);
      out.push_back({.label = rules_[i].compiled.label,
                     .dry_run = rules_[i].compiled.dry_run,
                     .admitted = counts.admitted,
                     .denied = counts.denied,
                     .dry_denied = counts.dry_denied,
                     .store = counts.store,
                     .adaptive = adaptive_state(i),
                     .degraded = counts.degraded});
    }
    return out;
  }
  // Rule `index`'s counters (as in stats()), without copying its label. Lock-free.
  RuleCounts rule_counts(std::size_t index) const {
    return {.admitted = counters_[index]->admitted.load(std::memory_order_relaxed),
            .denied = counters_[index]->denied.load(std::memory_order_relaxed),
            .dry_denied = counters_[index]->dry_denied.load(std::memory_order_relaxed),
            .store = backend_->rule_store_stats(index),
            .degraded = counters_[index]->degraded.load(std::memory_order_relaxed)};
  }
  // Rule `index`'s adaptive state now: that of its route with the lowest factor (the first such
  // route by name; unrouted requests count as the route ""), with `decreases` summed over all its
  // routes; none for a rule without an adaptive policy. Takes each route controller's mutex:
  // O(routes).
  std::optional<AdaptiveState> adaptive_state(std::size_t index) const {
    if (controllers_[index] == nullptr) return std::nullopt;
    std::optional<AdaptiveState> lowest;
    std::uint64_t decreases = 0;
    const std::chrono::nanoseconds at = now();
    for (const auto& [route, c] : *controllers_[index]) {
      AdaptiveState state = c->state(at);
      decreases += state.decreases;
      if (!lowest || state.factor_permille < lowest->factor_permille) lowest = state;
    }
    lowest->decreases = decreases;
    return lowest;
  }
  EngineStats engine_stats() const {
    return {.evaluations = totals_->evaluations.load(std::memory_order_relaxed),
            .backend_errors = totals_->backend_errors.load(std::memory_order_relaxed),
            .reloads = totals_->reloads.load(std::memory_order_relaxed),
            .failed_reloads = totals_->failed_reloads.load(std::memory_order_relaxed),
            .degraded_evaluations = totals_->degraded_evaluations.load(std::memory_order_relaxed)};
  }
  // This generation's EngineOptions::on_backend_error.
  FailureMode failure_mode() const noexcept { return on_backend_error_; }
  // True from a backend failure until the backend answers again (kLocal only: the other modes
  // call the backend for every request and keep no such state).
  bool backend_failing() const noexcept { return probe_ != nullptr && probe_->failing(); }

 private:
  struct RuleCounters {
    std::atomic<std::uint64_t> admitted{0};
    std::atomic<std::uint64_t> denied{0};
    std::atomic<std::uint64_t> dry_denied{0};
    std::atomic<std::uint64_t> degraded{0};
    // Eviction events: the engine time (ns) of the next look at the store's eviction counter,
    // and the counter's value at the last event.
    std::atomic<std::int64_t> eviction_check_due{std::numeric_limits<std::int64_t>::min()};
    std::atomic<std::uint64_t> evictions_reported{0};
  };
  // Backend error events of one status code: the engine time (ns) from which the next one may be
  // raised, and how many were held back since the last one.
  struct BackendErrorGate {
    std::atomic<std::int64_t> due{std::numeric_limits<std::int64_t>::min()};
    std::atomic<std::uint64_t> held{0};
  };
  // absl::StatusCode values are 0 ... 16 (kUnauthenticated); any other shares kUnknown's gate.
  static constexpr std::size_t kStatusCodes = 17;
  struct EngineCounters {
    std::atomic<std::uint64_t> evaluations{0};
    std::atomic<std::uint64_t> backend_errors{0};
    std::atomic<std::uint64_t> reloads{0};
    std::atomic<std::uint64_t> failed_reloads{0};
    std::atomic<std::uint64_t> degraded_evaluations{0};
    std::array<BackendErrorGate, kStatusCodes> backend_error_gates{};  // by status code
  };
  using RuleList = std::vector<std::uint32_t>;
  using ScopeMap = absl::flat_hash_map<std::string, RuleList>;
  using LocalClock = typename detail::LocalClockOf<BackendOptions>::type;

  // The local failure mode's in-process half: every rule with its windows scaled to the local
  // share, on an in-memory backend, and per rule the largest cost (in limiter units) that the
  // shared limit and the local share can hold.
  struct LocalShare {
    std::unique_ptr<InMemoryBackend<LocalClock>> backend;
    std::vector<std::uint64_t> shared_max;
    std::vector<std::uint64_t> local_max;
  };

  BasicRateLimitEngine() = default;
  // Constructs options_ in place (not default-constructed, then assigned: GCC 12 at -O2 with
  // ThreadSanitizer then warns that a backend option's shared_ptr "may be used uninitialized").
  explicit BasicRateLimitEngine(BackendOptions options) : options_(std::move(options)) {}

  static absl::StatusOr<BasicRateLimitEngine> compile(const PolicyConfig& config,
                                                      BackendOptions options,
                                                      const BasicRateLimitEngine* previous) {
    auto bundles = compile_policies(config);
    if (!bundles.ok()) return bundles.status();
    BasicRateLimitEngine engine(std::move(options));
    engine.totals_ = previous ? previous->totals_ : std::make_shared<EngineCounters>();
    engine.options_mode_ = config.engine.consumption;
    engine.on_backend_error_ = config.engine.on_backend_error;

    absl::flat_hash_map<std::string, RuleList> bundle_rules;
    std::vector<CompiledRule> compiled;
    for (const CompiledBundle& bundle : *bundles) {
      RuleList& list = bundle_rules[bundle.name];
      for (const CompiledRule& rule : bundle.rules) {
        list.push_back(static_cast<std::uint32_t>(compiled.size()));
        compiled.push_back(rule);
        engine.rules_.push_back(describe(rule));
      }
    }
    if (absl::Status s = engine.start_backend(compiled, config.engine, previous); !s.ok()) return s;
    engine.keep_rule_state(compiled, config, previous);
    if (absl::Status s = engine.attach_scopes(config, bundle_rules); !s.ok()) return s;
    return engine;
  }

  // The backend over `compiled`, taking over `previous`'s state, its health, and the local share
  // where the local failure mode is configured.
  absl::Status start_backend(const std::vector<CompiledRule>& compiled,
                             const EngineOptions& engine_options,
                             const BasicRateLimitEngine* previous) {
    auto backend =
        Backend::create(compiled, previous ? previous->backend_.get() : nullptr, options_);
    if (!backend.ok()) return backend.status();
    backend_ = std::make_unique<Backend>(*std::move(backend));
    // The backend's health outlives a generation: a reload during an outage stays local.
    probe_ = previous ? previous->probe_ : std::make_shared<detail::BackendProbe>();
    local_clock_ = detail::LocalClockOf<BackendOptions>::get(options_);
    local_retry_interval_ = std::chrono::milliseconds(engine_options.local_retry_interval_ms);
    if (engine_options.on_backend_error == FailureMode::kLocal) {
      auto local =
          make_local_share(compiled, *engine_options.local_share_permille, local_clock_, previous);
      if (!local.ok()) return local.status();
      local_ = *std::move(local);
    }
    return absl::OkStatus();
  }

  // Per rule: its counters and adaptive controller, kept from `previous` for an unchanged rule.
  void keep_rule_state(const std::vector<CompiledRule>& compiled, const PolicyConfig& config,
                       const BasicRateLimitEngine* previous) {
    std::vector<std::string> route_names{""};  // "" for requests without a route
    for (const Route& r : config.routes) route_names.push_back(r.name);
    std::sort(route_names.begin(), route_names.end());
    for (std::size_t i = 0; i < compiled.size(); ++i) {
      std::shared_ptr<RuleCounters> counters =
          previous ? previous->counters_for(compiled[i].fingerprint) : nullptr;
      counters_.push_back(counters ? counters : std::make_shared<RuleCounters>());
      controllers_.push_back(controllers_for(compiled[i], route_names, previous));
      if (compiled[i].adaptive) ++adaptive_rules_;
      by_fingerprint_.emplace(compiled[i].fingerprint, i);
    }
  }

  // What the engine reads of a request besides the rules: the rules each consumer, route,
  // service, listener and the gateway attach, credentials, exempt paths, routes in match order,
  // and the trusted proxies.
  absl::Status attach_scopes(const PolicyConfig& config,
                             absl::flat_hash_map<std::string, RuleList>& bundle_rules) {
    auto attach = [&](const std::vector<std::string>& names) {
      RuleList out;
      for (const std::string& name : names) {
        for (std::uint32_t r : bundle_rules[name]) out.push_back(r);
      }
      return out;
    };
    for (const Consumer& c : config.consumers) {
      consumer_rules_[c.name] = attach(c.policies);
      for (const std::string& credential : c.credentials) credentials_[credential] = c.name;
    }
    for (const Route& r : config.routes) {
      route_rules_[r.name] = attach(r.policies);
      route_services_[r.name] = r.service;
    }
    for (const Service& s : config.services) service_rules_[s.name] = attach(s.policies);
    for (const Listener& l : config.listeners) listener_rules_[l.name] = attach(l.policies);
    global_rules_ = attach(config.gateway.global_policies);
    exempt_paths_ = config.gateway.exempt_paths;
    routes_ = config.routes;
    // Precedence for match_route: the longest prefix first; on equal prefixes a route bound to a
    // listener before one on every listener.
    std::stable_sort(routes_.begin(), routes_.end(), [](const Route& a, const Route& b) {
      if (a.path_prefix.size() != b.path_prefix.size()) {
        return a.path_prefix.size() > b.path_prefix.size();
      }
      return !a.listener.empty() && b.listener.empty();
    });
    // validate() has parsed every entry already, so this does not fail on a validated config.
    absl::StatusOr<ClientAddressResolver> proxies =
        ClientAddressResolver::create(config.gateway.trusted_proxies);
    if (!proxies.ok()) return proxies.status();
    client_addresses_ = *std::move(proxies);
    return absl::OkStatus();
  }

  static RuleInfo describe(const CompiledRule& rule) {
    RuleInfo info{.compiled = rule};
    std::vector<QuotaPolicy> policies;
    for (const GcraWindow& w : info.compiled.windows) {
      info.window_names.push_back(absl::StrCat(info.compiled.label, "/", window_suffix(w.period)));
    }
    for (std::size_t i = 0; i < info.compiled.windows.size(); ++i) {
      policies.push_back({.name = info.window_names[i],
                          .quota = info.compiled.windows[i].requests,
                          .window = info.compiled.windows[i].period});
    }
    info.policy_value = ratelimit_policy_value(policies);
    for (const std::string& name : info.window_names) {
      std::string prefix;
      append_structured_string(prefix, name);
      prefix.append(";r=");
      info.limit_prefixes.push_back(std::move(prefix));
    }
    if (info.compiled.adaptive) {
      info.adaptive_max_units = std::numeric_limits<std::uint64_t>::max();
      for (const GcraWindow& w : limiter_windows(info.compiled)) {
        info.adaptive_max_units = std::min(info.adaptive_max_units, w.burst);
      }
    }
    const std::string& named = kKeysByIdentity ? info.compiled.identity : info.compiled.fingerprint;
    const std::uint64_t id = XXH3_64bits(named.data(), named.size());
    append_key_part(info.key_prefix,
                    std::string_view(reinterpret_cast<const char*>(&id), sizeof(id)));
    return info;
  }

  static std::string window_suffix(std::chrono::nanoseconds period) {
    if (period == std::chrono::seconds(1)) return "s";
    if (period == std::chrono::minutes(1)) return "minute";
    if (period == std::chrono::hours(1)) return "hour";
    return absl::StrCat(std::chrono::duration_cast<std::chrono::seconds>(period).count(), "s");
  }

  // The engine's time for adaptive controllers and event rate limits: the backend's clock if it
  // has one (the in-memory backend's), else the steady clock.
  std::chrono::nanoseconds now() const {
    if constexpr (requires(const Backend& b) {
                    { b.now() } -> std::same_as<std::chrono::nanoseconds>;
                  }) {
      return backend_->now();
    } else {
      return SteadyClock{}.now();
    }
  }

  // An adaptive rule's controllers by route name, sorted; "" (first) for unrouted requests.
  using RouteControllers = std::vector<std::pair<std::string, std::shared_ptr<AdaptiveController>>>;

  // An adaptive rule's controllers, one per route name in `routes` (sorted; "" for unrouted
  // requests): the previous generation's for a route it had, if the rule is unchanged and has the
  // same adaptive policy (so each route's factor carries over a reload); fresh ones otherwise.
  std::shared_ptr<const RouteControllers> controllers_for(
      const CompiledRule& rule, const std::vector<std::string>& routes,
      const BasicRateLimitEngine* previous) const {
    if (!rule.adaptive) return nullptr;
    const RouteControllers* kept = nullptr;
    if (previous != nullptr) {
      auto it = previous->by_fingerprint_.find(rule.fingerprint);
      if (it != previous->by_fingerprint_.end()) {
        const std::shared_ptr<const RouteControllers>& old = previous->controllers_[it->second];
        if (old != nullptr && old->front().second->policy() == *rule.adaptive) kept = old.get();
      }
    }
    auto out = std::make_shared<RouteControllers>();
    for (const std::string& route : routes) {
      const std::shared_ptr<AdaptiveController>* old =
          kept != nullptr ? find_route(*kept, route) : nullptr;
      out->emplace_back(route, old != nullptr
                                   ? *old
                                   : std::make_shared<AdaptiveController>(*rule.adaptive, now()));
    }
    return out;
  }

  // The controller of `route` in `controllers` (sorted by route), or null.
  static const std::shared_ptr<AdaptiveController>* find_route(const RouteControllers& controllers,
                                                               std::string_view route) {
    auto it =
        std::lower_bound(controllers.begin(), controllers.end(), route,
                         [](const auto& entry, std::string_view r) { return entry.first < r; });
    return it != controllers.end() && it->first == route ? &it->second : nullptr;
  }

  // Rule `rule`'s controller for requests on `route` (an unknown route counts as unrouted); null
  // for a rule without an adaptive policy. Lock-free: the table never changes after creation.
  AdaptiveController* controller(std::size_t rule, std::optional<std::string_view> route) const {
    const std::shared_ptr<const RouteControllers>& routes = controllers_[rule];
    if (routes == nullptr) return nullptr;
    const std::shared_ptr<AdaptiveController>* c =
        find_route(*routes, route.value_or(std::string_view{}));
    return (c != nullptr ? *c : routes->front().second).get();
  }

  // Sets each adaptive rule's key cost to its scaled units at the rule's current factor on
  // `route`, capped
  // at the rule's bucket (a request too big for the reduced bucket needs all of it); records the
  // factors (0 for fixed rules) for `in_requests`.
  // The live rules' check when a settlement is wanted: the backend's check_rules_booking.
  absl::Status check_live_booking(std::span<const RuleKey> keys, std::span<Decision> out,
                                  Settlement& settlement) const {
    if constexpr (kBackendBooks) {
      return backend_->check_rules_booking(keys, options_mode_, out, settlement.bookings_);
    } else {
      (void)settlement;  // stays closed: `settle` answers Unimplemented
      return backend_->check_rules(keys, options_mode_, out);
    }
  }

  void apply_factors(std::span<RuleKey> keys, absl::InlinedVector<std::uint32_t, 16>& factors,
                     std::optional<std::string_view> route) const {
    const std::chrono::nanoseconds at = now();
    for (RuleKey& k : keys) {
      AdaptiveController* const controller = this->controller(k.rule, route);
      if (controller == nullptr) {
        factors.push_back(0);
        continue;
      }
      const std::uint32_t factor = controller->factor(at);
      factors.push_back(factor);
      const std::uint64_t bucket = rules_[k.rule].adaptive_max_units;
      const std::uint64_t full = adaptive_units(k.cost, 1000);  // the cost at factor 1
      k.cost = full > bucket ? full : std::min(adaptive_units(k.cost, factor), bucket);
    }
  }

  // Converts the decisions of adaptive rules (keys from `first` on) from limiter units back to
  // requests at the factor they were decided with: limit and remaining round down.
  static void in_requests(std::span<const std::uint32_t> factors, std::size_t first,
                          std::span<Decision> decisions) {
    for (std::size_t i = 0; i < decisions.size(); ++i) {
      const std::uint32_t factor = factors[first + i];
      if (factor == 0) continue;
      const std::uint64_t per_request = adaptive_units(1, factor);
      decisions[i].limit /= per_request;
      decisions[i].remaining /= per_request;
    }
  }

  std::shared_ptr<RuleCounters> counters_for(const std::string& fingerprint) const {
    auto it = by_fingerprint_.find(fingerprint);
    return it == by_fingerprint_.end() ? nullptr : counters_[it->second];
  }

  static const RuleList* lookup(const ScopeMap& map, std::optional<std::string_view> name) {
    if (!name) return nullptr;
    auto it = map.find(absl::string_view(name->data(), name->size()));
    return it == map.end() ? nullptr : &it->second;
  }

  bool exempt(std::string_view path) const {
    return std::find(exempt_paths_.begin(), exempt_paths_.end(), path) != exempt_paths_.end();
  }

  // A rule's index and the key a request selects for it (for inspect and reset).
  struct RuleKeyFor {
    std::size_t rule = 0;
    std::string key;
  };
  absl::StatusOr<RuleKeyFor> key_for(std::string_view label, const RequestContext& raw) const {
    std::size_t r = 0;
    while (r < rules_.size() && rules_[r].compiled.label != label) ++r;
    if (r == rules_.size()) {
      return absl::NotFoundError(absl::StrCat("no rule is labelled \"",
                                              absl::string_view(label.data(), label.size()), "\""));
    }
    absl::StatusOr<RequestContext> request = normalize(raw);
    if (!request.ok()) return request.status();
    RuleKeyFor out;
    out.rule = r;
    append_key(out.key, static_cast<std::uint32_t>(r), *request,
               ClientAddress::parse(request->client_ip));
    return out;
  }

  // Appends rule `r`'s key for `request`; returns its (offset, size) in `out`.
  // An address is keyed by its network under the rule's prefixes; every unparsable address
  // shares one "invalid" key, so no text a client writes becomes a key of its own.
  std::pair<std::size_t, std::size_t> append_key(std::string& out, std::uint32_t r,
                                                 const RequestContext& request,
                                                 const ClientAddress& address) const {
    const std::size_t start = out.size();
    const CompiledRule& rule = rules_[r].compiled;
    out.append(rules_[r].key_prefix);
    for (Selector selector : rule.selector) {
      switch (selector) {
        case Selector::kIp:
          append_key_part(out, 'i', network_key(address, rule.address_prefixes).bytes());
          break;
        case Selector::kCredential:
          if (request.credential && request.consumer) {  // authenticated
            append_key_part(out, 'c', *request.credential);
          } else {
            append_key_part(out, 'i', network_key(address, rule.address_prefixes).bytes());
          }
          break;
        case Selector::kRoute:
          if (request.route) {
            append_key_part(out, 'r', *request.route);
          } else {
            append_key_part(out, 'u', {});  // unrouted: no route name encodes to this
          }
          break;
      }
    }
    return {start, out.size() - start};
  }

  using RuleGroup = absl::InlinedVector<std::uint32_t, 16>;

  // The rules that apply to `request`, in precedence order (consumer, route, service, listener,
  // global), each once, split into live and dry-run rules.
  void select_rules(const RequestContext& request, RuleGroup& live, RuleGroup& dry) const {
    auto add = [&](const RuleList* rules) {
      if (rules == nullptr) return;
      for (std::uint32_t r : *rules) {
        RuleGroup& group = rules_[r].compiled.dry_run ? dry : live;
        if (std::find(group.begin(), group.end(), r) == group.end()) group.push_back(r);
      }
    };
    add(lookup(consumer_rules_, request.consumer));
    add(lookup(route_rules_, request.route));
    add(lookup(service_rules_, request.service));
    add(lookup(listener_rules_, request.listener));
    add(&global_rules_);
  }

  // Dry-run rules: decided (and consuming) as their own group; never deny, never add fields.
  // The backend's error if it failed (nothing is counted then).
  absl::Status evaluate_dry(Evaluation& e, std::span<const std::uint32_t> dry,
                            std::span<const RuleKey> keys, std::span<const std::uint32_t> factors,
                            std::span<Decision> out, GroupOutcome& outcome) const {
    if (absl::Status s = check_group(keys, out, nullptr, outcome); !s.ok()) return s;
    if (!factors.empty()) in_requests(factors, factors.size() - keys.size(), out);
    for (std::size_t i = 0; i < dry.size(); ++i) {
      if (out[i].allowed()) continue;
      counters_[dry[i]]->dry_denied.fetch_add(1, std::memory_order_relaxed);
      if (!e.dry_denied) e.dry_denied = RuleDecision{dry[i], out[i]};
      if (on_event_) {
        on_event_(DryRunDenialEvent{
            .rule_label = rules_[dry[i]].compiled.label, .rule = dry[i], .decision = out[i]});
      }
    }
    return absl::OkStatus();
  }

  // Decides one group of rules (live or dry-run) into `out`: on the backend, or in local mode on
  // the local share when the probe says the backend is failing or when the call fails (`outcome`
  // says which, with the failure). A bad cost is InvalidArgument from either; in the other modes
  // the backend's error is returned as it is.
  absl::Status check_group(std::span<const RuleKey> keys, std::span<Decision> out,
                           Settlement* settlement, GroupOutcome& outcome) const {
    if (local_ != nullptr && !probe_->should_call(local_now(), local_retry_interval_)) {
      outcome.degraded = true;
      return check_local(keys, out);
    }
    absl::Status status = settlement != nullptr ? check_live_booking(keys, out, *settlement)
                                                : backend_->check_rules(keys, options_mode_, out);
    if (local_ == nullptr || status.code() == absl::StatusCode::kInvalidArgument) return status;
    if (status.ok()) {
      probe_->record_success();
      return status;
    }
    probe_->record_failure(local_now(), local_retry_interval_);
    if (settlement != nullptr) settlement->bookings_.clear();
    outcome.failure = std::move(status);
    outcome.degraded = true;
    return check_local(keys, out);
  }

  // Decides `keys` on the local share. A cost the shared limit holds but the local bucket cannot
  // takes the whole local bucket (admitted only when it is full); a cost the shared limit can
  // never admit is InvalidArgument, as the backend answers it.
  absl::Status check_local(std::span<const RuleKey> keys, std::span<Decision> out) const {
    absl::InlinedVector<RuleKey, 16> local(keys.begin(), keys.end());
    for (RuleKey& k : local) {
      if (k.cost > local_->shared_max[k.rule]) {
        return absl::InvalidArgumentError(absl::StrCat(
            rules_[k.rule].compiled.label, ": cost exceeds the smallest burst and can never pass"));
      }
      k.cost = std::min(k.cost, local_->local_max[k.rule]);
    }
    return local_->backend->check_rules(local, options_mode_, out);
  }

  // The local clock's reading, saturated like every limiter's.
  std::int64_t local_now() const { return detail::saturate_time(local_clock_.now().count()); }

  // The local share of `rules` at `permille`; a rule whose fingerprint and share are unchanged
  // keeps the local state `previous` had for it, one whose windows or share changed its keys'
  // spent share.
  static absl::StatusOr<std::unique_ptr<LocalShare>> make_local_share(
      std::span<const CompiledRule> rules, std::uint64_t permille, const LocalClock& clock,
      const BasicRateLimitEngine* previous) {
    auto local = std::make_unique<LocalShare>();
    std::vector<CompiledRule> scaled(rules.begin(), rules.end());
    for (CompiledRule& rule : scaled) {
      local->shared_max.push_back(detail::smallest_bucket(limiter_windows(rule)));
      rule.windows = detail::local_share_windows(std::move(rule.windows), permille);
      append_key_part(rule.fingerprint, absl::StrCat("local share ", permille));
      local->local_max.push_back(detail::smallest_bucket(limiter_windows(rule)));
    }
    const InMemoryBackend<LocalClock>* kept = previous != nullptr && previous->local_ != nullptr
                                                  ? previous->local_->backend.get()
                                                  : nullptr;
    auto backend = InMemoryBackend<LocalClock>::create(
        scaled, kept, typename InMemoryBackend<LocalClock>::Options{.clock = clock});
    if (!backend.ok()) return backend.status();
    local->backend = std::make_unique<InMemoryBackend<LocalClock>>(*std::move(backend));
    return local;
  }

  // Counts an evaluation decided on the local share, and for a request of cost ≥ 1 each rule of
  // the groups decided there.
  void count_degraded(Evaluation& e, std::span<const std::uint32_t> live, bool live_degraded,
                      std::span<const std::uint32_t> dry, bool dry_degraded,
                      std::uint64_t cost) const {
    e.degraded = live_degraded || dry_degraded;
    if (!e.degraded) return;
    totals_->degraded_evaluations.fetch_add(1, std::memory_order_relaxed);
    if (cost == 0) return;
    if (live_degraded) {
      for (std::uint32_t r : live) counters_[r]->degraded.fetch_add(1, std::memory_order_relaxed);
    }
    if (dry_degraded) {
      for (std::uint32_t r : dry) counters_[r]->degraded.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Counts a failed backend call and reports it, at most once per status code per
  // kEngineEventInterval of engine time: a failure that raises no event is counted in the next
  // event of its code. InvalidArgument (a bad cost) is the request's fault, not the backend's.
  void report_backend_error(const absl::Status& status) const {
    if (status.code() == absl::StatusCode::kInvalidArgument) return;
    totals_->backend_errors.fetch_add(1, std::memory_order_relaxed);
    if (!on_event_) return;
    const auto code = static_cast<std::size_t>(status.code());
    BackendErrorGate& gate =
        totals_->backend_error_gates[code < kStatusCodes
                                         ? code
                                         : static_cast<std::size_t>(absl::StatusCode::kUnknown)];
    if (!claim_event(gate.due, event_time())) {
      gate.held.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    on_event_(BackendErrorEvent{.status = status,
                                .suppressed = gate.held.exchange(0, std::memory_order_relaxed)});
  }

  std::int64_t event_time() const { return now().count(); }

  // True for the one caller that may raise an event at `now` (ns of engine time) under the gate
  // `due`: `now` has reached it, and this caller moved it one kEngineEventInterval past `now`.
  static bool claim_event(std::atomic<std::int64_t>& due, std::int64_t now) {
    constexpr std::int64_t kInterval = std::chrono::nanoseconds(kEngineEventInterval).count();
    std::int64_t next = due.load(std::memory_order_relaxed);
    return now >= next && due.compare_exchange_strong(next, detail::saturate_time(now) + kInterval,
                                                      std::memory_order_relaxed);
  }

  // Reports new evictions of `rules`, looking at each rule's store at most once per
  // kEngineEventInterval of engine time (one thread wins the look); the counter's growth since
  // the last event is the event's count, so no eviction goes unreported.
  void report_evictions(std::span<const std::uint32_t> rules) const {
    if (rules.empty()) return;
    const std::int64_t now = event_time();
    for (std::uint32_t r : rules) {
      RuleCounters& c = *counters_[r];
      if (!claim_event(c.eviction_check_due, now)) continue;
      const std::uint64_t evicted = backend_->rule_store_stats(r).live_evicted;
      std::uint64_t reported = c.evictions_reported.load(std::memory_order_relaxed);
      while (evicted > reported && !c.evictions_reported.compare_exchange_weak(
                                       reported, evicted, std::memory_order_relaxed)) {
      }
      if (evicted > reported) {
        on_event_(EvictionEvent{
            .rule_label = rules_[r].compiled.label, .rule = r, .evicted = evicted - reported});
      }
    }
  }

  // `raw` with empty strings made absent, and the route's service filled in; InvalidArgument if
  // the request names another service than its route's.
  absl::StatusOr<RequestContext> normalize(const RequestContext& raw) const {
    RequestContext r = raw;
    for (std::optional<std::string_view>* field :
         {&r.credential, &r.consumer, &r.route, &r.service, &r.listener}) {
      if (*field && (*field)->empty()) field->reset();
    }
    if (!r.route) return r;
    auto it = route_services_.find(absl::string_view(r.route->data(), r.route->size()));
    if (it == route_services_.end() || it->second.empty()) return r;
    const std::string_view routed(it->second);
    if (!r.service) {
      r.service = routed;
    } else if (*r.service != routed) {
      return absl::InvalidArgumentError(
          absl::StrCat("the request names service ", detail::quoted(*r.service), " but route ",
                       detail::quoted(*r.route), " belongs to service ", detail::quoted(routed)));
    }
    return r;
  }

  // The string of `from` with the largest capacity (moved out), or an empty one.
  static std::string take_largest(HttpFields& from) {
    HttpField* largest = nullptr;
    for (HttpField& f : from) {
      if (largest == nullptr || f.value.capacity() > largest->value.capacity()) largest = &f;
    }
    std::string out = largest != nullptr ? std::move(largest->value) : std::string();
    out.clear();
    return out;
  }

  // Writes the live outcome and its fields; the two long field values (RateLimit-Policy, then
  // RateLimit) are written into the largest strings of `recycled`.
  void decide_live(Evaluation& e, std::span<const std::uint32_t> live,
                   std::span<const Decision> decisions, const RequestContext& request,
                   HttpFields& recycled) const {
    std::optional<std::size_t> binding;  // index into live
    for (std::size_t i = 0; i < live.size(); ++i) {
      if (decisions[i].allowed()) continue;
      counters_[live[i]]->denied.fetch_add(1, std::memory_order_relaxed);
      e.allowed = false;
      e.retry_after = std::max(e.retry_after, decisions[i].retry_after);
      if (!binding) binding = i;
    }
    if (!binding) {
      binding = detail::least_remaining(live.size(), [&](std::size_t i) {
                  return decisions[i].remaining;
                }).index;
    }
    const std::uint32_t rule = live[*binding];
    Decision d = decisions[*binding];
    if (!e.allowed) d.retry_after = e.retry_after;
    e.binding = RuleDecision{rule, d};

    if (!d.allowed()) e.fields.push_back(retry_after_field(d.retry_after));
    append_x_ratelimit_fields(e.fields, d,
                              request.wall_time
                                  ? *request.wall_time
                                  : std::chrono::time_point_cast<std::chrono::nanoseconds>(
                                        std::chrono::system_clock::now()));
    const RuleInfo& info = rules_[rule];
    HttpField& policy =
        e.fields.emplace_back(HttpField{kRateLimitPolicyField, take_largest(recycled)});
    policy.value.append(info.policy_value);
    // RateLimit: the precomputed `"<name>";r=` and the two numbers, as ratelimit_field writes it.
    const ServiceLimit limit = service_limit({}, d);
    HttpField& field = e.fields.emplace_back(HttpField{kRateLimitField, take_largest(recycled)});
    const std::string& prefix = info.limit_prefixes[d.binding_window];
    field.value.reserve(prefix.size() +
                        std::size_t{2 * 15 + 3});  // two sf-integers and ";t=": one allocation
    field.value.append(prefix);
    append_structured_integer(field.value, limit.available);
    field.value.append(";t=");
    append_structured_integer(field.value,
                              static_cast<std::uint64_t>(ceil_seconds(limit.effective_window)));
  }

  BackendOptions options_{};
  Observer observer_{};
  EngineEventHook on_event_{};
  std::shared_ptr<EngineCounters> totals_;  // shared with every generation reloaded from this one
  ConsumptionMode options_mode_ = ConsumptionMode::kAllOrNothing;
  FailureMode on_backend_error_ = FailureMode::kFailOpen;
  std::unique_ptr<LocalShare> local_;            // set iff on_backend_error_ is kLocal
  std::shared_ptr<detail::BackendProbe> probe_;  // shared with every generation reloaded from this
  LocalClock local_clock_{};
  std::chrono::nanoseconds local_retry_interval_{std::chrono::seconds(1)};
  std::vector<RuleInfo> rules_;
  std::vector<std::shared_ptr<RuleCounters>> counters_;
  std::vector<std::shared_ptr<const RouteControllers>>
      controllers_;  // per rule; null unless adaptive
  std::size_t adaptive_rules_ = 0;
  std::unique_ptr<Backend> backend_;
  ScopeMap consumer_rules_, route_rules_, service_rules_, listener_rules_;
  RuleList global_rules_;
  std::vector<std::string> exempt_paths_;
  std::vector<Route> routes_;  // in match_route's precedence order
  absl::flat_hash_map<std::string, std::string> route_services_;  // route -> its service or ""
  absl::flat_hash_map<std::string, std::size_t> by_fingerprint_;  // -> index into rules_
  absl::flat_hash_map<std::string, std::string> credentials_;
  ClientAddressResolver client_addresses_;  // gateway.trusted_proxies
};

// The engine over in-memory GCRA limiters (per process).
using RateLimitEngine = BasicRateLimitEngine<InMemoryBackend<SteadyClock>>;

}  // namespace sluice

#endif  // SLUICE_ENGINE_HPP_
