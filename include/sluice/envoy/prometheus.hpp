// sluice/envoy/prometheus.hpp — an Envoy service limiter's counters in the Prometheus text
// exposition format 0.0.4 (content type sluice::kPrometheusContentType).
//
//   std::string body;
//   sluice::envoy::append_prometheus_text(body, *limiter);
//
// Families (counters): sluice_envoy_hits_total, sluice_envoy_over_limit_total,
// sluice_envoy_near_limit_total, sluice_envoy_within_limit_total and sluice_envoy_shadow_mode_total
// with the label `limit` (the limit's descriptor path, e.g. "edge.remote_address", or
// "override.<n>/<unit>", "#2" appended if a path reads the same; every limit's label is its
// own), their meaning that of sluice::envoy::LimitStats; and
// sluice_envoy_backend_errors_total with the label `failure_mode` (fail_open, fail_closed, local);
// in the local failure mode also sluice_envoy_local_decisions_total (backend calls decided on the
// replica's local share); and, without labels, sluice_envoy_ignored_overrides_total (descriptors
// whose override was decided as if absent) and sluice_envoy_unknown_domain_calls_total (calls
// that limited nothing because no file names their domain). Label values are escaped; no
// descriptor value a client sent is written.
//
// Thread-safety: reads atomics; call it from any thread. Complexity: O(limits).
#ifndef SLUICE_ENVOY_PROMETHEUS_HPP_
#define SLUICE_ENVOY_PROMETHEUS_HPP_

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/detail/prometheus_text.hpp"
#include "sluice/envoy/limiter.hpp"

namespace sluice::envoy {

template <EngineBackend Backend>
void append_prometheus_text(std::string& out, const BasicLimiter<Backend>& limiter) {
  struct Family {
    sluice::detail::PrometheusFamily family;
    std::uint64_t LimitStats::*counter = nullptr;
  };
  static constexpr Family kFamilies[] = {
      {{"sluice_envoy_hits_total", "counter", "Hits that reached the limit."},
       &LimitStats::total_hits},
      {{"sluice_envoy_over_limit_total", "counter", "Hits of requests the limit denied."},
       &LimitStats::over_limit},
      {{"sluice_envoy_near_limit_total", "counter",
        "Admitted hits that left less than a fifth of the burst."},
       &LimitStats::near_limit},
      {{"sluice_envoy_within_limit_total", "counter", "Admitted hits."}, &LimitStats::within_limit},
      {{"sluice_envoy_shadow_mode_total", "counter", "Hits a shadow mode limit would have denied."},
       &LimitStats::shadow_mode},
  };
  static constexpr sluice::detail::PrometheusFamily kBackendErrors{
      "sluice_envoy_backend_errors_total", "counter",
      "Calls whose backend failed, decided by the failure mode."};
  static constexpr sluice::detail::PrometheusFamily kLocalDecisions{
      "sluice_envoy_local_decisions_total", "counter",
      "Backend calls decided on this replica's local share while the backend failed."};
  static constexpr sluice::detail::PrometheusFamily kIgnoredOverrides{
      "sluice_envoy_ignored_overrides_total", "counter",
      "Descriptors whose limit override was decided as if absent (bound reached, refused by the "
      "backend, or an unknown unit)."};
  static constexpr sluice::detail::PrometheusFamily kUnknownDomainCalls{
      "sluice_envoy_unknown_domain_calls_total", "counter",
      "Calls answered OK without a limit because no configuration names their domain."};
  const std::vector<LimitStats> stats = limiter.stats();
  for (const Family& f : kFamilies) {
    sluice::detail::append_prometheus_header(out, f.family);
    for (const LimitStats& s : stats) {
      sluice::detail::append_prometheus_sample(out, f.family.name, "limit", s.label,
                                               s.*(f.counter));
    }
  }
  sluice::detail::append_prometheus_header(out, kBackendErrors);
  sluice::detail::append_prometheus_sample(out, kBackendErrors.name, "failure_mode",
                                           to_string(limiter.failure_mode()),
                                           limiter.backend_errors());
  if (limiter.failure_mode() == FailureMode::kLocal) {
    sluice::detail::append_prometheus_family(out, kLocalDecisions, limiter.local_decisions());
  }
  sluice::detail::append_prometheus_family(out, kIgnoredOverrides, limiter.ignored_overrides());
  sluice::detail::append_prometheus_family(out, kUnknownDomainCalls,
                                           limiter.unknown_domain_calls());
}

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_PROMETHEUS_HPP_
