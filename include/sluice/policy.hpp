// sluice/policy.hpp — the gateway policy model: bundles of rate-limit rules and where they attach.
//
// Plain aggregate structs that a program fills in code or that the YAML loader (sluice/yaml.hpp)
// fills from a config file, a `validate` that names the path of the first bad value, and
// `compile_policies`, which turns every bundle into canonical windows for the engine:
//
//   sluice::PolicyConfig config{
//       .policies = {{.name = "public-api-limits",
//                     .rate_limits = {{.name = "per-ip",
//                                      .selector = {sluice::Selector::kIp},
//                                      .requests_per = {.s = 10, .minute = 600},
//                                      .burst = 20}}}},
//       .routes = {{.name = "public", .path_prefix = "/v1", .policies = {"public-api-limits"}}},
//   };
//   absl::Status status = sluice::validate(config);
//   // e.g. "routes[0].policies[0]: unknown bundle \"public-api-limit\""
//   absl::StatusOr<std::vector<sluice::CompiledBundle>> bundles = sluice::compile_policies(config);
//   // per-ip: {10 per 1 s, burst 20}, {600 per 60 s, burst 600}
//
// Model: a Rule limits requests per key, the key built from its selector (ip, credential,
// route); each of `requests_per.s/minute/hour` is one stacked window, all must admit. A Bundle is
// a named list of rules (plus the legacy single-window `rate_limit`). Bundles attach, by name, at
// five scopes: consumer, route, service, listener and global (`gateway.global_policies`).
//
// Supported ranges (validated, so that the limiters' integer arithmetic cannot overflow):
// - requests per window: 1 ... kMaxRequestsPerWindow (2^32);
// - window length: 1 s ... kMaxWindowSeconds (365 days); rule windows are 1 s, 60 s or 3600 s;
// - burst: 1 ... the number of requests the rule's shortest window replenishes in 365 days, so a
//   full bucket refills within a year: every GCRA time offset (burst x period / requests) stays
//   below 2^55 ns, and requests x period (ns) stays below 2^87 (fits absl::uint128).
// - names (bundle, rule, route, service, listener, consumer): printable ASCII (0x20-0x7E), so they
//   print unchanged in error text and in RFC 9651 strings (sluice/http_fields.hpp).
// - engine.local_share_permille: 1 ... 1000; engine.local_retry_interval_ms: 1 ... 3600000.
//
// Units: requests are counts; windows are whole seconds in the model and nanoseconds once compiled.
// Thread-safety: plain values (thread-compatible); every function is pure.
#ifndef SLUICE_POLICY_HPP_
#define SLUICE_POLICY_HPP_

#include "sluice/policy/compile.hpp"  // IWYU pragma: export
#include "sluice/policy/model.hpp"    // IWYU pragma: export

#endif  // SLUICE_POLICY_HPP_
