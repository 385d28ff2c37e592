// sluice/envoy.hpp — the Envoy part: Envoy's rate limit service protocol
// (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) over sluice's limiters.
//
// - sluice/envoy/config.hpp: domains of descriptor trees with limits (the model);
// - sluice/envoy/load_config.hpp: the reference service's YAML files, plus sluice's extensions;
// - sluice/envoy/request.hpp: a call and its answer as plain values;
// - sluice/envoy/limiter.hpp: the decisions, all-or-nothing over an engine backend;
// - sluice/envoy/service.hpp: the gRPC service for any gRPC C++ server;
// - sluice/envoy/prometheus.hpp: the limits' counters for a metrics endpoint.
//
// Link sluice::envoy (CMake); it needs gRPC C++, protobuf (protoc) and yaml-cpp. The service
// binary examples/envoy_rls and docs/envoy.md show it in use.
#ifndef SLUICE_ENVOY_HPP_
#define SLUICE_ENVOY_HPP_

#include "sluice/envoy/config.hpp"
#include "sluice/envoy/limiter.hpp"
#include "sluice/envoy/load_config.hpp"
#include "sluice/envoy/prometheus.hpp"
#include "sluice/envoy/request.hpp"
#include "sluice/envoy/service.hpp"

#endif  // SLUICE_ENVOY_HPP_
