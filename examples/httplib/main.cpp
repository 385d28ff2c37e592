// A cpp-httplib service limited by sluice (sluice/httplib.hpp): 2 requests per second per client
// address on /v1 (/healthz, /readyz and /metrics are exempt by default). It serves on a free
// loopback port, sends itself four requests (bound and listening, so they queue until it accepts)
// with httplib::Client and prints each status, then stops.
//   sluice_example_httplib
#include <httplib.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "sluice/engine.hpp"
#include "sluice/httplib.hpp"
#include "sluice/prometheus.hpp"

int main() {
  const sluice::PolicyConfig config{
      .policies = {{.name = "api",
                    .rate_limits = {{.name = "per-ip",
                                     .selector = {sluice::Selector::kIp},
                                     .requests_per = {.s = 2}}}}},
      .routes = {{.name = "v1", .path_prefix = "/v1", .policies = {"api"}}}};  // /metrics exempt
  auto created = sluice::RateLimitEngine::create(config);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  auto engine = std::make_shared<const sluice::RateLimitEngine>(*std::move(created));

  httplib::Server server;
  // Runs before routing: 429 with Retry-After for a denied request, the RateLimit fields on every
  // answer. Behind a load balancer, list its networks in the config's gateway.trusted_proxies
  // ({"10.0.0.0/8"}); without, Forwarded and X-Forwarded-For are ignored.
  sluice::HttplibLimiter<>(engine).install(server);
  server.Get("/v1/items", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("[]", "application/json");
  });
  server.Get("/metrics", [&engine](const httplib::Request&, httplib::Response& res) {
    std::string body;
    sluice::append_prometheus_text(body, *engine);
    res.set_content(body, std::string(sluice::kPrometheusContentType));
  });

  const int port = server.bind_to_any_port("127.0.0.1");
  if (port < 0) return 1;
  std::thread serving([&server] { server.listen_after_bind(); });

  httplib::Client client("127.0.0.1", port);
  int denied = 0;
  for (int i = 1; i <= 3; ++i) {
    httplib::Result res = client.Get("/v1/items");
    if (!res) break;
    std::printf("GET /v1/items #%d: %d RateLimit: %s Retry-After: %s\n", i, res->status,
                res->get_header_value("RateLimit").c_str(),
                res->get_header_value("Retry-After").c_str());
    if (res->status == 429) ++denied;
  }
  httplib::Result metrics = client.Get("/metrics");  // exempt: never limited
  std::printf("GET /metrics: %d\n", metrics ? metrics->status : 0);

  server.stop();
  serving.join();
  return denied == 1 && metrics && metrics->status == 200 ? 0 : 1;  // the third one
}
