// sluice/redis/prometheus.hpp — a Redis client's own counters in the Prometheus text exposition
// format 0.0.4 (content type sluice::kPrometheusContentType), written beside an engine's or on
// their own: this header does not include the engine.
//
//   std::string body;
//   sluice::append_prometheus_text(body, *engine);          // the engine's families
//   sluice::redis::append_prometheus_text(body, *client);   // the client's: once per client
//
// Families (no labels):
//   sluice_redis_give_backs_lost_total (counter), Client::give_backs_lost(): in a Redis Cluster,
//     checked items whose cost an admitting slot booked and could not give back when another slot
//     denied or failed (each stays taken until its windows drain; the limit is never exceeded
//     for it). It stays 0 on a single node.
//   sluice_redis_coalesced_checks_total (counter), Client::coalesced_checks(): single-key checks
//     that went out in one script call together with at least one other check.
//   sluice_redis_coalesced_calls_peak (gauge), Client::peak_coalesced_calls(): the most
//     coalescing script calls that were in flight at once since the client was created
//     (≤ ClientOptions::max_coalesced_calls). Both stay 0 in Cluster mode or with coalesce off.
//
// The counts belong to the client, which every engine generation and limiter over it shares, so
// an engine's text (sluice/prometheus.hpp) does not carry them: write them once per Client, from
// the same shared_ptr the engine's options hold.
//
// Thread-safety: reads an atomic and takes the coalescer's queue lock for two reads; call it from
// any thread, at any time. Complexity: O(1).
#ifndef SLUICE_REDIS_PROMETHEUS_HPP_
#define SLUICE_REDIS_PROMETHEUS_HPP_

#include <string>

#include "sluice/detail/prometheus_text.hpp"
#include "sluice/redis/client.hpp"

namespace sluice::redis {

// Appends every counter of `client` to `out`.
inline void append_prometheus_text(std::string& out, const Client& client) {
  static constexpr sluice::detail::PrometheusFamily kGiveBacksLost{
      "sluice_redis_give_backs_lost_total", "counter",
      "Checked items whose cost a Redis Cluster slot booked and could not give back when another "
      "slot denied or failed (each stays taken until its windows drain)."};
  static constexpr sluice::detail::PrometheusFamily kCoalescedChecks{
      "sluice_redis_coalesced_checks_total", "counter",
      "Single-key checks that shared a script call with at least one other check."};
  static constexpr sluice::detail::PrometheusFamily kCoalescedCallsPeak{
      "sluice_redis_coalesced_calls_peak", "gauge",
      "The most coalescing script calls that were in flight at once."};
  sluice::detail::append_prometheus_family(out, kGiveBacksLost, client.give_backs_lost());
  sluice::detail::append_prometheus_family(out, kCoalescedChecks, client.coalesced_checks());
  sluice::detail::append_prometheus_family(out, kCoalescedCallsPeak, client.peak_coalesced_calls());
}

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_PROMETHEUS_HPP_
