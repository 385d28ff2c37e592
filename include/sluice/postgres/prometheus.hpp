// sluice/postgres/prometheus.hpp — a PostgreSQL client's own counters, and the counter of a
// PostgresEngineBackend, in the Prometheus text exposition format 0.0.4 (content type
// sluice::kPrometheusContentType), written beside an engine's or on their own: this header does
// not include the engine.
//
//   std::string body;
//   sluice::append_prometheus_text(body, *engine);             // the engine's families, if any
//   sluice::postgres::append_prometheus_text(body, *client);   // the client's: once per client
//   sluice::postgres::append_prometheus_text(body, backend);   // a PostgresEngineBackend's
//
// Families of a Client (no labels):
//   sluice_postgres_coalesced_checks_total (counter), Client::coalesced_checks(): single-key
//     checks that went out in one statement together with at least one other check.
//   sluice_postgres_coalesced_calls_peak (gauge), Client::peak_coalesced_calls(): the most
//     coalescing statements that were in flight at once since the client was created
//     (≤ ClientOptions::max_coalesced_calls). Both stay 0 with coalesce off.
//
// The counts belong to the client, which every engine generation and limiter over it shares, so
// an engine's text does not carry them: write them once per Client.
//
// Family of a PostgresEngineBackend (no label):
//   sluice_postgres_standing_failures_total (counter), PostgresEngineBackend::standing_failures():
//     denied requests whose second statement, reading the admitting keys' room as it stands,
//     failed (each stayed denied). Every generation of the backend (create's `previous`) shares
//     it: write it once, from any one of them.
//
// Thread-safety: a client's takes the coalescer's queue lock for two reads, a backend's reads an
// atomic; call them from any thread, at any time. Complexity: O(1).
#ifndef SLUICE_POSTGRES_PROMETHEUS_HPP_
#define SLUICE_POSTGRES_PROMETHEUS_HPP_

#include <concepts>
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

// Declared, not included: sluice/postgres/engine_backend.hpp includes the engine. The template
// is instantiated where the caller has the backend, and so its definition.
class PostgresEngineBackend;

// Appends the counter of `backend` (every generation's) to `out`.
template <std::same_as<PostgresEngineBackend> Backend>
void append_prometheus_text(std::string& out, const Backend& backend) {
  static constexpr sluice::detail::PrometheusFamily kStandingFailures{
      "sluice_postgres_standing_failures_total", "counter",
      "Denied requests whose second statement, reading the room as it stands, failed."};
  sluice::detail::append_prometheus_family(out, kStandingFailures, backend.standing_failures());
}

}  // namespace sluice::postgres

#endif  // SLUICE_POSTGRES_PROMETHEUS_HPP_
