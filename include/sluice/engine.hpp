// sluice/engine.hpp — the policy engine: a gateway config compiled into per-request decisions.
//
// A `RateLimitEngine` is compiled once per config generation from a `PolicyConfig`
// (sluice/policy.hpp) and is then immutable: share it between threads, evaluate every request
// through it, and compile the next generation from it on reload.
//
//   auto engine = sluice::RateLimitEngine::create(config);   // InvalidArgument names the bad path
//   if (!engine.ok()) return engine.status();
//   sluice::Evaluation e = engine->evaluate({.client_ip = "203.0.113.7",  // or .client = parsed
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
// their own group, their buckets advance as if enforcing (all or nothing, a request the live rules
// deny is not charged to them), and the first would-be denial is reported in `dry_denied`; they
// never deny and never add fields.
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
// The request path, one file per step, in the order it runs: the request's scopes and rules
// (sluice/engine/rule_set.hpp), their keys (the same), the backend's decision
// (sluice/engine/backend.hpp, sluice/engine/in_memory_backend.hpp; on failure
// sluice/engine/local_share.hpp), the fields (sluice/http_fields.hpp), then counters and events
// (sluice/engine/counters.hpp). Adaptive rules: sluice/engine/adaptive_rules.hpp; settled costs:
// sluice/engine/settlement.hpp.
//
// Thread-safety: every const member function may be called concurrently; `evaluate` takes the
// shard locks of the request's rules (in one global order) for O(rules) work. Allocation:
// evaluating into a kept Evaluation allocates nothing once it has held the longest field values
// (with `RequestContext::write_fields` false, nothing at all).
#ifndef SLUICE_ENGINE_HPP_
#define SLUICE_ENGINE_HPP_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/adaptive.hpp"
#include "sluice/client_address.hpp"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/engine/adaptive_rules.hpp"
#include "sluice/engine/backend.hpp"
#include "sluice/engine/counters.hpp"
#include "sluice/engine/evaluation.hpp"
#include "sluice/engine/in_memory_backend.hpp"
#include "sluice/engine/local_share.hpp"
#include "sluice/engine/rule_set.hpp"
#include "sluice/engine/settlement.hpp"
#include "sluice/engine/workspace.hpp"
#include "sluice/engine_events.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/policy.hpp"

namespace sluice {

template <EngineBackend Backend>
class BasicRateLimitEngine {
 public:
  using BackendOptions = typename Backend::Options;
  // Called after every non-exempt evaluation, on the evaluating thread. It sees rule indices
  // and decisions, never keys; it must be thread-safe and fast (it runs on the request path).
  using Observer = std::function<void(const Evaluation&)>;
  using RuleInfo = sluice::RuleInfo;
  using Settlement = BasicSettlement<Backend>;
  using Booking = typename Settlement::Booking;

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
  // (rates, bursts, window lengths) keeps each key's spent share: eagerly in memory, on each
  // key's first check over Redis and PostgreSQL (engine/carried_rules.hpp); else it starts fresh.
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
      for (const RuleInfo& info : engine->rules_.rules()) {
        if (rules_.find_fingerprint(info.compiled.fingerprint)) ++kept;
      }
      on_event_(ReloadEvent{.rules = engine->rule_count(), .rules_kept = kept});
    }
    return engine;
  }

  // Records a reload that failed before it reached `reload` (an unreadable or invalid config
  // file): counts it in EngineStats::failed_reloads and reports a ReloadEvent with `status`.
  void report_failed_reload(const absl::Status& status) const {
    totals_->failed_reloads.fetch_add(1, std::memory_order_relaxed);
    if (on_event_) on_event_(ReloadEvent{.status = status});
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

  // `evaluate(request, e)` that also fills `settlement` (sluice/engine/settlement.hpp): open iff
  // the request was admitted with a cost ≥ 1, no backend error, and the backend books (else it
  // is decided as by `evaluate` and the settlement stays closed).
  void evaluate(const RequestContext& raw, Evaluation& e, Settlement& settlement) const {
    settlement.clear();  // its storage is reused: a steady state allocates nothing
    evaluate_into(raw, e, &settlement);
  }

  // Writes `e.fields` for its binding decision at wall time `now` (nothing if no live rule
  // applied): for an evaluation made with `RequestContext::write_fields` false, by this same
  // generation. The strings `e.fields` holds are reused.
  void write_fields(Evaluation& e, WallTime now) const {
    if (!e.binding) {
      e.fields.clear();
      return;
    }
    const RuleInfo& info = rules_.rules()[e.binding->rule];
    const Decision& d = e.binding->decision;
    write_decision_fields(e.fields, d, now, info.policy_value,
                          info.limit_prefixes[d.binding_window]);
  }

  // Settles every live rule of the request (and each dry-run rule that admitted it) at `actual`
  // units (≤ 2^32; an adaptive rule at the factor it was evaluated with). FailedPrecondition if the
  // settlement is not open; the first error of a rule otherwise (the other rules are still
  // settled). Unimplemented for a backend without bookings.
  absl::Status settle(Settlement& settlement, std::uint64_t actual) const {
    if constexpr (BookingBackend<Backend>) {
      return settlement.settle(actual);
    } else {
      (void)settlement;
      (void)actual;
      return absl::UnimplementedError("this engine backend cannot settle costs");
    }
  }

 private:
  using RequestKeys = detail::RequestKeys;
  using Workspace = detail::RequestWorkspace;
  // How check_group decided one group of rules.
  struct GroupOutcome {
    bool degraded = false;  // on the local share
    absl::Status failure;   // the backend's failure that sent it there, if the backend was called
  };

  // The request path, in the order it runs: the request's scopes and rules, their keys, the
  // backend's decisions (live rules, then dry-run ones), the fields, then the counters, events
  // and observer.
  void evaluate_into(const RequestContext& raw, Evaluation& e, Settlement* settlement) const {
    detail::reset_keeping_fields(e);
    if (rules_.exempt(raw.path)) {
      e.exempt = true;
      e.fields.clear();
      return;
    }
    totals_->add(&detail::EngineCounters::Stripe::evaluations);
    thread_local Workspace work;
    ScopedRequest request(raw);
    if (absl::Status s = rules_.scope(raw, request, work.scratch); !s.ok()) {
      e.allowed = false;
      e.backend_error = std::move(s);
      e.fields.clear();
      if (observer_) observer_(e);
      return;
    }
    const RequestKeys keys = request_keys(request, work);
    const std::span<Decision> decisions = work.decisions_for(keys.keys.size());
    e.live_rules = request.live.size();
    if (local_ == nullptr && settlement == nullptr && request.dry.empty() && e.live_rules != 0) {
      decide_live_only(e, request, keys, decisions);
    } else {
      decide_groups(e, request, keys, decisions, settlement);
    }
    if ((!e.binding || !raw.write_fields) && !e.fields.empty()) e.fields.clear();
    if (on_event_) report_evictions(request);
    if (observer_) observer_(e);
  }

  // A request of live rules only, without settlement, on an engine without the local share (the
  // usual request): one backend call decides it, then its counters.
  void decide_live_only(Evaluation& e, const ScopedRequest& request, const RequestKeys& keys,
                        std::span<Decision> out) const {
    if (absl::Status status = backend_->check_rules(keys.keys, mode_, out); !status.ok()) {
      fail_live(e, std::move(status));
      return;
    }
    if (!keys.factors.empty()) detail::AdaptiveRules::in_requests(keys.factors, 0, out);
    decide_live(e, request, out);
    if (request.raw->cost == 0 || !e.allowed) return;
    const detail::CounterStripe stripe = detail::counter_stripe();
    for (std::uint32_t r : request.live) {
      counters_[r]->add(&detail::RuleCounters::Stripe::admitted, stripe);
    }
  }

  // Any request: its live rules and its dry-run rules as two groups, each on the backend or the
  // local share; its counters; its settlement.
  void decide_groups(Evaluation& e, const ScopedRequest& request, const RequestKeys& keys,
                     std::span<Decision> decisions, Settlement* settlement) const {
    GroupOutcome live_outcome, dry_outcome;
    if (!request.live.empty()) {
      decide_live_group(e, request, keys, decisions, settlement, live_outcome);
    }
    // All or nothing, a request the live rules deny would consume nothing in a dry-run rule
    // enforced beside them; in either mode, nor would a request they refused undecided (a cost
    // beyond a burst, fail_closed). It is not charged to the dry-run rules either, so the dry run
    // measures what enforcing would do and a flood of denied requests cannot drain its buckets.
    // A backend that failed the live rules is not asked again for the dry-run ones (fail_open
    // too): against a stalled backend that would be a second timeout for a request whose answer
    // the failure has already decided.
    const bool live_denied = !e.allowed && mode_ == ConsumptionMode::kAllOrNothing;
    const bool dry_decided =
        !request.dry.empty() && !live_denied && e.backend_error.ok() &&
        decide_dry_group(e, request, keys, decisions, settlement, live_outcome, dry_outcome);
    count(e, request, live_outcome, dry_outcome, dry_decided);
    if (settlement != nullptr && !live_outcome.degraded && e.allowed && e.backend_error.ok()) {
      settlement->open_for(request.live.size(), request.dry.size(), keys.factors,
                           request.raw->cost);
    }
  }

  // Every selected rule's key, live rules first, at the request's cost, its bytes in the
  // workspace; where adaptive rules exist each key's factor, since adaptive rules take their cost
  // in thousandths of a request scaled by the factor.
  RequestKeys request_keys(const ScopedRequest& request, Workspace& work) const {
    const std::span<RuleKey> keys = rules_.keys(request, work.keys);
    if (!adaptive_.any()) return {keys, {}};
    work.factors.clear();
    adaptive_.scale_costs(keys, work.factors, request.route, now());
    return {keys, work.factors};
  }

  // The live rules decide the request: all of them admit it, or it is denied and none consumes.
  // A backend error decides it by the failure mode (a bad cost always denies).
  void decide_live_group(Evaluation& e, const ScopedRequest& request, const RequestKeys& keys,
                         std::span<Decision> decisions, Settlement* settlement,
                         GroupOutcome& outcome) const {
    const std::span<Decision> out = decisions.first(request.live.size());
    absl::Status status =
        check_group(std::span(keys.keys).first(request.live.size()), out,
                    settlement != nullptr ? &settlement->bookings_ : nullptr, outcome);
    if (!outcome.failure.ok()) report_backend_error(outcome.failure);
    if (!status.ok()) {
      fail_live(e, std::move(status));
      return;
    }
    if (!keys.factors.empty()) detail::AdaptiveRules::in_requests(keys.factors, 0, out);
    decide_live(e, request, out);
  }

  // The live rules' backend call failed with `status`: reported, and the request decided by the
  // failure mode (a bad cost always denies).
  void fail_live(Evaluation& e, absl::Status status) const {
    report_backend_error(status);
    e.backend_error = std::move(status);
    e.allowed = e.backend_error.code() != absl::StatusCode::kInvalidArgument &&
                on_backend_error_ == FailureMode::kFailOpen;
  }

  // Decides one group of rules (live or dry-run) into `out`: on the backend, or in local mode on
  // the local share when the probe says the backend is failing or when the call fails (`outcome`
  // says which, with the failure). A bad cost is InvalidArgument from either; in the other modes
  // the backend's error is returned as it is. With `bookings` (a settlement wanted), the backend
  // records the group's bookings there if it admits it.
  absl::Status check_group(std::span<const RuleKey> keys, std::span<Decision> out,
                           std::vector<Booking>* bookings, GroupOutcome& outcome) const {
    if (local_ != nullptr && !local_->should_call()) {
      outcome.degraded = true;
      return check_local(keys, out);
    }
    absl::Status status = bookings != nullptr ? check_booking(keys, out, *bookings)
                                              : backend_->check_rules(keys, mode_, out);
    if (local_ == nullptr || status.code() == absl::StatusCode::kInvalidArgument) return status;
    if (status.ok()) {
      local_->record_success();
      return status;
    }
    local_->record_failure();
    if (bookings != nullptr) bookings->clear();
    outcome.failure = std::move(status);
    outcome.degraded = true;
    return check_local(keys, out);
  }

  // A group's check when a settlement is wanted: the backend's bookings, if it books.
  absl::Status check_booking(std::span<const RuleKey> keys, std::span<Decision> out,
                             std::vector<Booking>& bookings) const {
    if constexpr (BookingBackend<Backend>) {
      return backend_->check_rules_booking(keys, mode_, out, bookings);
    } else {
      (void)bookings;  // stays closed: `settle` answers Unimplemented
      return backend_->check_rules(keys, mode_, out);
    }
  }

  absl::Status check_local(std::span<const RuleKey> keys, std::span<Decision> out) const {
    return local_->check(keys, mode_, out,
                         [&](std::size_t r) { return std::string_view(rule(r).compiled.label); });
  }

  // The live outcome: denied if any rule denied (Retry-After the longest wait); the binding
  // rule (the first denying one, else the window with the least remaining) and its fields.
  void decide_live(Evaluation& e, const ScopedRequest& request,
                   std::span<const Decision> decisions) const {
    const std::span<const std::uint32_t> live = request.live;
    const bool peek = request.raw->cost == 0;  // reports, and counts as no request
    std::optional<std::size_t> binding;        // index into live
    for (std::size_t i = 0; i < live.size(); ++i) {
      if (decisions[i].allowed()) continue;
      if (!peek) counters_[live[i]]->add(&detail::RuleCounters::Stripe::denied);
      e.allowed = false;
      e.retry_after = std::max(e.retry_after, decisions[i].retry_after);
      if (!binding) binding = i;
    }
    if (!binding) {
      binding = detail::least_remaining(live.size(), [&](std::size_t i) {
                  return decisions[i].remaining;
                }).index;
    }
    RuleDecision& chosen = e.binding.emplace(RuleDecision{live[*binding], decisions[*binding]});
    if (!e.allowed) chosen.decision.retry_after = e.retry_after;
    if (request.raw->write_fields) {
      write_fields(e, request.raw->wall_time
                          ? *request.raw->wall_time
                          : std::chrono::time_point_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now()));
    }
  }

  // The dry-run rules, after the live ones (unless those denied all or nothing): decided (and
  // consuming) as their own group; they never deny and never add fields. True if they were decided.
  // A would-be denial is answered in `e.dry_denied`; it is counted and raises a DryRunDenialEvent
  // (at most one per rule a second) only for a request of cost ≥ 1 (a peek at a key in debt is
  // denied, yet is no request).
  // A backend failure is reported once per evaluation: here only if the live rules reported none.
  bool decide_dry_group(Evaluation& e, const ScopedRequest& request, const RequestKeys& keys,
                        std::span<Decision> decisions, Settlement* settlement,
                        const GroupOutcome& live_outcome, GroupOutcome& outcome) const {
    const std::size_t first = request.live.size();
    const std::span<Decision> out = decisions.subspan(first, request.dry.size());
    const absl::Status status =
        check_group(std::span(keys.keys).subspan(first, request.dry.size()), out,
                    settlement != nullptr ? &settlement->dry_bookings_ : nullptr, outcome);
    const absl::Status& failed = status.ok() ? outcome.failure : status;
    if (!failed.ok() && e.backend_error.ok() && live_outcome.failure.ok()) {
      report_backend_error(failed);
    }
    if (!status.ok()) return false;
    if (!keys.factors.empty()) detail::AdaptiveRules::in_requests(keys.factors, first, out);
    const bool peek = request.raw->cost == 0;
    for (std::size_t i = 0; i < request.dry.size(); ++i) {
      if (out[i].allowed()) continue;
      const std::uint32_t r = request.dry[i];
      if (!e.dry_denied) e.dry_denied = RuleDecision{r, out[i]};
      if (peek) continue;
      counters_[r]->add(&detail::RuleCounters::Stripe::dry_denied);
      if (on_event_) {
        detail::report_dry_denial(*counters_[r], r, rule(r).compiled.label, out[i], on_event_,
                                  now().count());
      }
    }
    return true;
  }

  // The counters of a decided request of cost ≥ 1: admitted by every rule that applied, and
  // what was decided on the local share.
  void count(Evaluation& e, const ScopedRequest& request, const GroupOutcome& live,
             const GroupOutcome& dry, bool dry_decided) const {
    const std::uint64_t cost = request.raw->cost;
    const bool live_local = live.degraded && e.backend_error.ok();
    const bool dry_local = dry.degraded && dry_decided;
    e.degraded = live_local || dry_local;
    if (e.degraded) totals_->add(&detail::EngineCounters::Stripe::degraded_evaluations);
    if (cost == 0) return;
    const detail::CounterStripe stripe = detail::counter_stripe();
    auto add = [&](std::span<const std::uint32_t> rules, auto member) {
      for (std::uint32_t r : rules) counters_[r]->add(member, stripe);
    };
    if (live_local) add(request.live, &detail::RuleCounters::Stripe::degraded);
    if (dry_local) add(request.dry, &detail::RuleCounters::Stripe::degraded);
    if (e.allowed && e.backend_error.ok()) {
      add(request.live, &detail::RuleCounters::Stripe::admitted);
      if (dry_decided) add(request.dry, &detail::RuleCounters::Stripe::admitted);
    }
  }

  void report_backend_error(const absl::Status& status) const {
    totals_->backend_error(status, on_event_, now().count());
  }

  void report_evictions(const ScopedRequest& request) const {
    const std::int64_t at = now().count();
    for (std::span<const std::uint32_t> group : {request.live, request.dry}) {
      for (std::uint32_t r : group) {
        detail::report_evictions(*counters_[r], r, rule(r).compiled.label, on_event_, at,
                                 [&] { return backend_->rule_store_stats(r).live_evicted; });
      }
    }
  }

  // The engine's time for adaptive controllers and event rate limits: the backend's clock if it
  // has one (the in-memory backend's), else the steady clock.
  std::chrono::nanoseconds now() const {
    if constexpr (ClockedBackend<Backend>) {
      return backend_->now();
    } else {
      return SteadyClock{}.now();
    }
  }

 public:
  // Feeds one upstream response to the controller of every adaptive rule that applies to
  // `request` (as `evaluate` selects them: live and dry-run). InvalidArgument, and nothing fed, if
  // the request names another service than its route's. Call it once per upstream answer
  // (latency, status, Retry-After); a request that never reached the upstream feeds nothing. The
  // answer feeds the rule's controller for the request's route (each adaptive rule has one per
  // route, and one for unrouted requests) and counts as one to the request's client, its address's
  // network under the rule's address prefixes (the config's notion of one client), never finer
  // than an IPv4 address or an IPv6 /64 (what one host usually holds); never its credential or
  // consumer, which it can vary: a controller shrinks only on answers to several distinct
  // clients (AdaptivePolicy::min_clients).
  absl::Status record_upstream(const RequestContext& raw, const UpstreamResponse& response) const {
    if (!adaptive_.any() || rules_.exempt(raw.path)) return absl::OkStatus();
    RuleSet::Scratch scratch;
    ScopedRequest request(raw);
    if (absl::Status s = rules_.scope(raw, request, scratch); !s.ok()) return s;
    const std::chrono::nanoseconds at = now();
    for (std::span<const std::uint32_t> group : {request.live, request.dry}) {
      for (std::uint32_t r : group) {
        if (AdaptiveController* c = adaptive_.controller(r, request.route)) {
          c->record(at, response, adaptive_.client_of(r, request.client));
        }
      }
    }
    return absl::OkStatus();
  }

  // --- Operators: one rule's state for the key a request would use, by the rule's label
  // ("bundle/rule") and the request's attributes (address, credential and consumer, route, ...:
  // whatever the rule's selector reads). The rule need not apply to the request: the attributes
  // only choose the key. NotFound for an unknown label, and for a route the config lacks when
  // the rule's selector reads the route (name none for the key unrouted requests share);
  // InvalidArgument for a request the engine would refuse (e.g. a service other than its
  // route's), and for one with no client address when the rule keys the address (name an
  // unparsable one, e.g. "invalid", for the key every unparsable address shares).

  // The rule's Decision for that key without consuming anything (a peek: see
  // GcraLimiter::inspect); an adaptive rule's limit and remaining are in requests at its current
  // factor. One backend call; errors as the backend's.
  absl::StatusOr<Decision> inspect(std::string_view rule_label, const RequestContext& raw) const {
    absl::StatusOr<RuleSet::RuleKeyFor> k = rules_.key_for(rule_label, raw);
    if (!k.ok()) return k.status();
    RuleKey key{.rule = k->rule, .key = k->key, .cost = 0};
    detail::Factors factors;
    if (adaptive_.any()) adaptive_.scale_costs(std::span(&key, 1), factors, raw.route, now());
    Decision d;
    const absl::Status s = backend_->check_rules(std::span<const RuleKey>(&key, 1),
                                                 ConsumptionMode::kAllOrNothing, std::span(&d, 1));
    if (!s.ok()) return s;
    if (!factors.empty()) detail::AdaptiveRules::in_requests(factors, 0, std::span(&d, 1));
    return d;
  }

  // Forgets the rule's state for that key; Unimplemented without ResettableBackend.
  absl::Status reset(std::string_view rule_label, const RequestContext& raw) const {
    if constexpr (ResettableBackend<Backend>) {
      absl::StatusOr<RuleSet::RuleKeyFor> k = rules_.key_for(rule_label, raw);
      if (!k.ok()) return k.status();
      return backend_->reset_key(k->rule, k->key);
    } else {
      (void)rule_label, (void)raw;
      return absl::UnimplementedError("this engine backend cannot reset a key");
    }
  }

  // Request routing helpers for gateways that resolve routes and consumers from the config.
  struct RouteMatch {
    std::string_view route{};
    std::optional<std::string_view> service{};
  };
  // The route with the longest path_prefix that starts `path`, among routes on `listener` (or
  // on every listener); in any case for a route that is not case_sensitive (ASCII letters, and
  // the letters outside ASCII that fold to one: path_starts_with_ignoring_case). `path` must be
  // normalized (sluice/request_path.hpp), and the request must be served on that same path: a
  // raw path climbs out of a prefix with dot segments.
  std::optional<RouteMatch> match_route(std::string_view listener, std::string_view path) const {
    const Route* route = rules_.match_route(listener, path);
    if (route == nullptr) return std::nullopt;
    RouteMatch match{.route = route->name};
    if (!route->service.empty()) match.service = route->service;
    return match;
  }
  // The consumer that owns `credential`; the config's consumer called `name`, if any. O(1).
  std::optional<std::string_view> consumer_for(std::string_view credential) const {
    return rules_.consumer_for(credential);
  }
  std::optional<std::string_view> consumer_named(std::string_view name) const {
    return rules_.consumer_named(name);
  }
  // Whether the config has a listener called `name` (adapters check the one they serve). O(1).
  bool has_listener(std::string_view name) const { return rules_.has_listener(name); }
  // The client-address resolver of this generation's gateway.trusted_proxies (headers kEither;
  // an adapter passes its own to `resolve`): adapters resolve every request with
  // the generation that evaluates it, so a reload's proxies apply from the next request on.
  const ClientAddressResolver& client_addresses() const noexcept {
    return rules_.client_addresses();
  }

  std::size_t rule_count() const noexcept { return rules_.rules().size(); }
  const RuleInfo& rule(std::size_t index) const { return rules_.rules()[index]; }
  std::vector<RuleStats> stats() const {
    std::vector<RuleStats> out;
    for (std::size_t i = 0; i < rule_count(); ++i) {
      const RuleCounts counts = rule_counts(i);
      out.push_back({.label = rule(i).compiled.label,
                     .dry_run = rule(i).compiled.dry_run,
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
    const detail::RuleCounters& c = *counters_[index];
    using Stripe = detail::RuleCounters::Stripe;
    return {.admitted = c.sum(&Stripe::admitted),
            .denied = c.sum(&Stripe::denied),
            .dry_denied = c.sum(&Stripe::dry_denied),
            .store = backend_->rule_store_stats(index),
            .degraded = c.sum(&Stripe::degraded)};
  }
  // Rule `index`'s adaptive state now: that of its route with the lowest factor (the first such
  // route by name; unrouted requests count as the route ""), with `decreases` summed over all its
  // routes; none for a rule without an adaptive policy. O(routes).
  std::optional<AdaptiveState> adaptive_state(std::size_t index) const {
    return adaptive_.state(index, now());
  }
  EngineStats engine_stats() const {
    const detail::EngineCounters& t = *totals_;
    using Stripe = detail::EngineCounters::Stripe;
    return {.evaluations = t.sum(&Stripe::evaluations),
            .backend_errors = t.backend_errors.load(std::memory_order_relaxed),
            .reloads = t.reloads.load(std::memory_order_relaxed),
            .failed_reloads = t.failed_reloads.load(std::memory_order_relaxed),
            .degraded_evaluations = t.sum(&Stripe::degraded_evaluations)};
  }
  // This generation's EngineOptions::on_backend_error.
  FailureMode failure_mode() const noexcept { return on_backend_error_; }
  // True from a backend failure until the backend answers again (kLocal only: the other modes
  // call the backend for every request and keep no such state).
  bool backend_failing() const noexcept { return local_ != nullptr && local_->failing(); }

 private:
  using LocalClock = typename detail::LocalClockOf<BackendOptions>::type;

  BasicRateLimitEngine() = default;
  // Constructs options_ in place (not default-constructed, then assigned: GCC 12 at -O2 with
  // ThreadSanitizer then warns that a backend option's shared_ptr "may be used uninitialized").
  explicit BasicRateLimitEngine(BackendOptions options) : options_(std::move(options)) {}

  static absl::StatusOr<BasicRateLimitEngine> compile(const PolicyConfig& config,
                                                      BackendOptions options,
                                                      const BasicRateLimitEngine* previous) {
    auto configured =
        detail::configure_backend<Backend>(config.backend, std::move(options), previous != nullptr);
    if (!configured.ok()) return configured.status();
    auto rules = RuleSet::compile(config, detail::carries_windows<Backend>(*configured));
    if (!rules.ok()) return rules.status();
    BasicRateLimitEngine engine(*std::move(configured));
    engine.rules_ = *std::move(rules);
    engine.totals_ = previous ? previous->totals_ : std::make_shared<detail::EngineCounters>();
    engine.mode_ = config.engine.consumption;
    engine.on_backend_error_ = config.engine.on_backend_error;
    if (absl::Status s = engine.start_backend(config.engine, previous); !s.ok()) return s;
    engine.keep_rule_state(config, previous);
    return engine;
  }

  // The backend over the rules, taking over `previous`'s state, and the local share (with the
  // backend's health) where the local failure mode is configured.
  absl::Status start_backend(const EngineOptions& engine_options,
                             const BasicRateLimitEngine* previous) {
    auto backend =
        Backend::create(rules_.compiled(), previous ? previous->backend_.get() : nullptr, options_);
    if (!backend.ok()) return backend.status();
    backend_ = std::make_unique<Backend>(*std::move(backend));
    if (engine_options.on_backend_error != FailureMode::kLocal) return absl::OkStatus();
    auto local = detail::LocalShare<LocalClock>::create(
        rules_.compiled(), *engine_options.local_share_permille,
        detail::LocalClockOf<BackendOptions>::get(options_),
        std::chrono::milliseconds(engine_options.local_retry_interval_ms),
        previous != nullptr ? previous->local_.get() : nullptr);
    if (!local.ok()) return local.status();
    local_ = *std::move(local);
    return absl::OkStatus();
  }

  // Per rule: its counters, kept from `previous` for an unchanged rule; the adaptive rules'
  // controllers, likewise.
  void keep_rule_state(const PolicyConfig& config, const BasicRateLimitEngine* previous) {
    for (const RuleInfo& info : rules_.rules()) {
      std::optional<std::size_t> kept =
          previous ? previous->rules_.find_fingerprint(info.compiled.fingerprint) : std::nullopt;
      counters_.push_back(kept ? previous->counters_[*kept]
                               : std::make_shared<detail::RuleCounters>());
    }
    std::vector<std::string> routes;
    for (const Route& r : config.routes) routes.push_back(r.name);
    adaptive_ = detail::AdaptiveRules::create(rules_.rules(), std::move(routes),
                                              previous ? &previous->adaptive_ : nullptr, now());
  }

  BackendOptions options_{};
  Observer observer_{};
  EngineEventHook on_event_{};
  std::shared_ptr<detail::EngineCounters> totals_;  // shared with every generation reloaded
  ConsumptionMode mode_ = ConsumptionMode::kAllOrNothing;
  FailureMode on_backend_error_ = FailureMode::kFailOpen;
  RuleSet rules_;
  std::vector<std::shared_ptr<detail::RuleCounters>> counters_;  // per rule; kept by reloads
  detail::AdaptiveRules adaptive_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<detail::LocalShare<LocalClock>> local_;  // set iff on_backend_error_ is kLocal
};

// The engine over in-memory GCRA limiters (per process).
using RateLimitEngine = BasicRateLimitEngine<InMemoryBackend<SteadyClock>>;

}  // namespace sluice

#endif  // SLUICE_ENGINE_HPP_
