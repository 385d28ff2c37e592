// Prometheus metrics for a policy engine: evaluate a few requests, then print what a /metrics
// endpoint would serve (sluice/prometheus.hpp).
#include <cstdio>
#include <string>

#include "sluice/engine.hpp"
#include "sluice/prometheus.hpp"

int main() {
  const sluice::PolicyConfig config{
      .policies = {{.name = "api",
                    .rate_limits = {{.name = "per-ip",
                                     .selector = {sluice::Selector::kIp},
                                     .requests_per = {.s = 2}}}}},
      .gateway = {.global_policies = {"api"}}};
  auto engine = sluice::RateLimitEngine::create(config);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  for (int i = 0; i < 3; ++i) engine->evaluate({.client_ip = "203.0.113.7", .path = "/v1/items"});

  std::string body;  // serve with Content-Type sluice::kPrometheusContentType
  sluice::append_prometheus_text(body, *engine);
  std::fputs(body.c_str(), stdout);
  // The third request was denied.
  return body.find("sluice_rule_denied_total{rule=\"api/per-ip\",dry_run=\"false\"} 1\n") ==
                 std::string::npos
             ? 1
             : 0;
}
