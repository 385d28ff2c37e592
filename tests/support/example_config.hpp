// The policy configs and rule helpers shared by the engine's tests and benchmarks.
#ifndef SLUICE_TESTS_SUPPORT_EXAMPLE_CONFIG_HPP_
#define SLUICE_TESTS_SUPPORT_EXAMPLE_CONFIG_HPP_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/engine.hpp"
#include "sluice/policy.hpp"

namespace sluice::testing {

// A rule in one line: `rule("per-ip", {Selector::kIp}, {.s = 10}, 20)`.
inline Rule rule(std::string name, std::vector<Selector> selector, RequestsPer per,
                 std::optional<std::uint64_t> burst = std::nullopt) {
  return {.name = std::move(name),
          .selector = std::move(selector),
          .requests_per = per,
          .burst = burst};
}

// The example of docs/policies.md: bundle public-api-limits (10/s burst 20 and 600/min per ip;
// 2000/min per ip and route) on route `public` (path prefix /v1).
inline PolicyConfig documented_example() {
  return {
      .policies = {{.name = "public-api-limits",
                    .rate_limits = {rule("per-ip", {Selector::kIp}, {.s = 10, .minute = 600}, 20),
                                    rule("per-route-flood", {Selector::kIp, Selector::kRoute},
                                         {.minute = 2000})}}},
      .routes = {{.name = "public", .path_prefix = "/v1", .policies = {"public-api-limits"}}}};
}

// A fixed wall clock for X-RateLimit-Reset: 2023-11-14T22:13:20Z.
inline const WallTime kWall{std::chrono::seconds(1'700'000'000)};

// A request from `ip` on `route`, at kWall.
inline RequestContext on_route(std::string_view ip, std::string_view route) {
  return {.client_ip = ip, .route = route, .path = "/v1/items", .wall_time = kWall};
}

// The value of field `name` in `e`, or "<absent>".
inline std::string field(const Evaluation& e, std::string_view name) {
  for (const auto& f : e.fields) {
    if (f.name == name) return f.value;
  }
  return "<absent>";
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_SUPPORT_EXAMPLE_CONFIG_HPP_
