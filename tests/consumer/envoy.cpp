// Built by the consumer smoke test where sluice's envoy component is installed: proves that a
// downstream project can link sluice::envoy (its protocol compiled in the consumer's build) and
// decide a ShouldRateLimit request through the service.
#include <grpcpp/grpcpp.h>

#include <cstdio>

#include "sluice/envoy.hpp"

int main() {
  namespace rls = ::envoy::service::ratelimit::v3;
  auto config = sluice::envoy::load_domain_config(
      "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
      "d.yaml");
  if (!config.ok()) return 1;
  auto limiter = sluice::envoy::Limiter::create({.domains = {*config}});
  if (!limiter.ok()) return 2;
  sluice::envoy::RateLimitService service(**limiter);
  rls::RateLimitRequest request;
  request.set_domain("d");
  auto* entry = request.add_descriptors()->add_entries();
  entry->set_key("k");
  entry->set_value("v");
  rls::RateLimitResponse first;
  rls::RateLimitResponse second;
  grpc::ServerContext context;
  if (!service.ShouldRateLimit(&context, &request, &first).ok()) return 3;
  if (!service.ShouldRateLimit(&context, &request, &second).ok()) return 4;
  if (first.overall_code() != rls::RateLimitResponse::OK ||
      second.overall_code() != rls::RateLimitResponse::OVER_LIMIT) {
    return 5;
  }
  std::printf("consumer envoy ok\n");
  return 0;
}
