// sluice/redis/prometheus.hpp — a Redis client's own counters in the Prometheus text exposition
// format 0.0.4 (content type sluice::kPrometheusContentType), written beside an engine's.
//
//   std::string body;
//   sluice::append_prometheus_text(body, *engine);          // the engine's families
//   sluice::redis::append_prometheus_text(body, *client);   // the client's: once per client
//
// Families (counters, no labels): sluice_redis_give_backs_lost_total, Client::give_backs_lost():
// in a Redis Cluster, checked items whose cost an admitting slot booked and could not give back
// when another slot denied or failed (each stays taken until its windows drain; the limit is never
// exceeded for it). It stays 0 on a single node.
//
// The counts belong to the client, which every engine generation and limiter over it shares, so
// an engine's text (sluice/prometheus.hpp) does not carry them: write them once per Client, from
// the same shared_ptr the engine's options hold.
//
// Thread-safety: reads atomics; call it from any thread, at any time. Complexity: O(1).
#ifndef SLUICE_REDIS_PROMETHEUS_HPP_
#define SLUICE_REDIS_PROMETHEUS_HPP_

#include <string>

#include "absl/strings/str_cat.h"
#include "sluice/prometheus.hpp"
#include "sluice/redis/client.hpp"

namespace sluice::redis {

// Appends every counter of `client` to `out`.
inline void append_prometheus_text(std::string& out, const Client& client) {
  static constexpr sluice::detail::PrometheusFamily kGiveBacksLost{
      "sluice_redis_give_backs_lost_total", "counter",
      "Checked items whose cost a Redis Cluster slot booked and could not give back when another "
      "slot denied or failed (each stays taken until its windows drain)."};
  sluice::detail::append_prometheus_header(out, kGiveBacksLost);
  out.append(kGiveBacksLost.name);
  absl::StrAppend(&out, " ", client.give_backs_lost(), "\n");
}

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_PROMETHEUS_HPP_
