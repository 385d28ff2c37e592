// sluice/engine/evaluation.hpp — what the policy engine reads of a request and what it answers.
//
// `RequestContext` is one request as a gateway sees it; `Evaluation` is the engine's answer
// (sluice/engine.hpp); `RuleStats`, `RuleCounts` and `EngineStats` are its counters.
//
//   sluice::RequestContext request{.client = resolved_address,   // parsed once by the adapter
//                                  .route = "public",
//                                  .path = "/v1/items"};
//   sluice::Evaluation e;                    // kept per thread: evaluating into it allocates
//   nothing engine.evaluate(request, e); if (!e.allowed) respond(429, e.fields);
//
// Thread-safety: value types, thread-compatible.
#ifndef SLUICE_ENGINE_EVALUATION_HPP_
#define SLUICE_ENGINE_EVALUATION_HPP_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "sluice/adaptive.hpp"
#include "sluice/client_address.hpp"
#include "sluice/decision.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/store.hpp"

namespace sluice {

// One request, as the gateway sees it. Views must outlive `evaluate`. An empty string in any
// optional field means the same as an absent one.
struct RequestContext {
  // The client's address as text; read only when `client` is unset.
  std::string_view client_ip{};
  // The client's address as an adapter resolved it (ClientAddressResolver): when set, it keys the
  // request and `client_ip` is not parsed. Adapters pass it, so nothing on the request path
  // formats an address to text to parse it again.
  std::optional<ClientAddress> client{};
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
  // False: `Evaluation::fields` is left empty, and the engine spends nothing on it; a caller that
  // needs them after all writes them with `engine.write_fields(e, now)`.
  bool write_fields = true;
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
  HttpFields fields{};                       // to write into the response (see write_fields)
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
// Peeks (cost 0; one at a key in debt is denied), exempt paths and backend errors change no
// counter.
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
// Resets `e` to a fresh evaluation, keeping the strings of its fields for reuse.
inline void reset_keeping_fields(Evaluation& e) {
  e.exempt = false;
  e.allowed = true;
  e.live_rules = 0;
  e.binding.reset();
  e.retry_after = std::chrono::nanoseconds{0};
  e.dry_denied.reset();
  e.backend_error = absl::OkStatus();
  e.degraded = false;
}
}  // namespace detail

}  // namespace sluice

#endif  // SLUICE_ENGINE_EVALUATION_HPP_
