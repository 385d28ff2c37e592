// sluice/engine_events.hpp — what a policy engine tells its event hook: dry-run denials, backend
// errors, evictions and reloads.
//
// A `BasicRateLimitEngine` (sluice/engine.hpp) takes an `EngineEventHook` at creation and keeps it
// across reloads. The hook receives one `EngineEvent`, a variant of the four event types. Dry-run
// denials, backend errors and evictions, which a client or a fault can repeat on every request,
// are rate-limited (at most one event per rule or kind per second, with a count of what was held
// back), so a hook may log every event:
//
//   sluice::EngineEventHook hook = [](const sluice::EngineEvent& event) {
//     if (const auto* d = std::get_if<sluice::DryRunDenialEvent>(&event)) {
//       log("dry-run rule ", d->rule_label, " would deny (", d->suppressed, " more held back)");
//     } else if (const auto* b = std::get_if<sluice::BackendErrorEvent>(&event)) {
//       log("limiter backend failed: ", b->status, " (", b->suppressed, " more held back)");
//     } else if (const auto* r = std::get_if<sluice::ReloadEvent>(&event)) {
//       if (!r->status.ok()) log("reload failed: ", r->status.message());
//     }
//   };
//   auto engine = sluice::RateLimitEngine::create(config, {}, {}, hook);
//
// No event carries a key, a client address, a credential or any other text a client chose: the
// only names are rule labels, which come from the config. A status carries the backend's message
// (backends never put keys in messages) or the config loader's.
//
// Thread-safety: the hook runs synchronously on the thread that caused the event (the request
// thread for dry-run denials, backend errors and evictions; the reloading thread for reloads), so
// it may run on many threads at once and must be thread-safe, fast and must not throw. It must
// not call back into the engine or the holder that reported the event (no evaluate, reload,
// poll): copy what it needs and hand it to another thread. Views in an event are valid only
// during the call.
#ifndef SLUICE_ENGINE_EVENTS_HPP_
#define SLUICE_ENGINE_EVENTS_HPP_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <variant>

#include "absl/status/status.h"
#include "sluice/decision.hpp"

namespace sluice {

// A dry-run rule would have denied a request of cost ≥ 1. Rate-limited per rule, since one client
// can repeat it on every request: at most one event per rule per kEngineEventInterval; the
// would-be denials in between raise no event and are counted in the rule's next event
// (`suppressed`). RuleStats::dry_denied counts every one, reported or not. A peek (cost 0) raises
// none, even at a key in debt: its would-be denial is answered in Evaluation::dry_denied and, like
// every peek, counts nowhere.
struct DryRunDenialEvent {
  std::string_view rule_label{};  // the rule's label ("<bundle>/<rule>")
  std::size_t rule = 0;           // index into the engine's rules
  Decision decision{};            // what the rule would have answered (retry_after, limit, ...)
  // Would-be denials of this rule since its previous event that raised no event.
  std::uint64_t suppressed = 0;
};

// Events that a client or a fault can repeat on every request are rate-limited: at most one per
// rule or kind per kEngineEventInterval of the engine's time (the backend's clock when it has
// one, such as the in-memory backend's; else the steady clock), each counting what was held back
// before it.
inline constexpr std::chrono::seconds kEngineEventInterval{1};

// The backend failed to decide a request's rules (Unavailable, DeadlineExceeded, a server
// refused as misconfigured: FailedPrecondition, ...), and the request followed the engine's
// failure mode (fail-open: admitted; fail-closed: denied; local: decided on the local share).
// Rate-limited per status code: at most one event per code per kEngineEventInterval; the
// failures of that code in between raise no event and are counted in the next event of that
// code (`suppressed`). EngineStats::backend_errors counts every failure, reported or not.
// A cost that a rule can never admit is a bad request (InvalidArgument in
// Evaluation::backend_error), not a backend error, and raises no event. Under FailureMode::kLocal
// only calls that were made raise it: requests decided locally without calling the backend
// (within the retry interval after a failure) raise none.
struct BackendErrorEvent {
  absl::Status status{};  // this failure (the held-back ones had the same code)
  // Failures of the same status code since the previous event of that code that raised no event.
  std::uint64_t suppressed = 0;
};

// Live keys of a rule were evicted from its full store: each got a fresh bucket (fail-open).
// At most one event per rule per kEngineEventInterval: the engine looks at the rule's eviction
// counter on a request the rule applies to, at most once an interval, so `evicted` sums every
// eviction since the previous event for this rule (none is dropped, several are reported
// together).
struct EvictionEvent {
  std::string_view rule_label{};
  std::size_t rule = 0;
  std::uint64_t evicted = 0;  // live keys evicted since the previous event for this rule (≥ 1)
};

// A reload finished: `status` OK with the new generation's rule counts, or the reason the previous
// generation is still serving (an invalid or unreadable config).
struct ReloadEvent {
  absl::Status status{};
  std::size_t rules = 0;       // rules of the new generation (0 on failure)
  std::size_t rules_kept = 0;  // of them, rules that kept their state (unchanged fingerprint)
};

using EngineEvent = std::variant<DryRunDenialEvent, BackendErrorEvent, EvictionEvent, ReloadEvent>;

// Receives the events of an engine; empty: no events (and no cost for them on the request path).
using EngineEventHook = std::function<void(const EngineEvent&)>;

}  // namespace sluice

#endif  // SLUICE_ENGINE_EVENTS_HPP_
