// sluice/postgres/prometheus.hpp — a PostgreSQL client's own counters in the Prometheus text
// exposition format 0.0.4 (content type sluice::kPrometheusContentType), written beside an
// engine's or on their own: this header does not include the engine.
//
//   std::string body;
//   sluice::append_prometheus_text(body, *engine);             // the engine's families, if any
//   sluice::postgres::append_prometheus_text(body, *client);   // the client's: once per client
//
// Families (no labels):
//   sluice_postgres_coalesced_checks_total (counter), Client::coalesced_checks(): single-key
//     checks that went out in one statement together with at least one other check.
//   sluice_postgres_coalesced_calls_peak (gauge), Client::peak_coalesced_calls(): the most
//     coalescing statements that were in flight at once since the client was created
//     (≤ ClientOptions::max_coalesced_calls). Both stay 0 with coalesce off.
//
// The counts belong to the client, which every engine generation and limiter over it shares, so
// an engine's text does not carry them: write them once per Client.
//
// Thread-safety: takes the coalescer's queue lock for two reads; call it from any thread, at any
// time. Complexity: O(1).
#ifndef SLUICE_POSTGRES_PROMETHEUS_HPP_
#define SLUICE_POSTGRES_PROMETHEUS_HPP_

#include <string>

#include "sluice/detail/prometheus_text.hpp"
#include "sluice/postgres/client.hpp"

namespace sluice::postgres {

// Appends every counter of `client` to `out`.
inline void append_prometheus_text(std::string& out, const Client& client) {
  static constexpr sluice::detail::PrometheusFamily kCoalescedChecks{
      "sluice_postgres_coalesced_checks_total", "counter",
      "Single-key checks that shared a statement with at least one other check."};
  static constexpr sluice::detail::PrometheusFamily kCoalescedCallsPeak{
      "sluice_postgres_coalesced_calls_peak", "gauge",
      "The most coalescing statements that were in flight at once."};
  sluice::detail::append_prometheus_family(out, kCoalescedChecks, client.coalesced_checks());
  sluice::detail::append_prometheus_family(out, kCoalescedCallsPeak, client.peak_coalesced_calls());
}

}  // namespace sluice::postgres

#endif  // SLUICE_POSTGRES_PROMETHEUS_HPP_
