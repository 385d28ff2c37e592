// sluice/engine/adaptive_rules.hpp — the policy engine's adaptive rules: one controller per
// adaptive rule and route, and the scaling of a request's cost by its controller's factor.
//
// Internal to BasicRateLimitEngine (sluice/engine.hpp). An adaptive rule's limiter counts in
// thousandths of a request (adaptive_units); a request costs its cost scaled by the factor of
// the rule's controller for the request's route (sluice/adaptive.hpp), and the decision is
// converted back to requests at that factor.
//
// Thread-safety: immutable after creation; controllers are thread-safe.
#ifndef SLUICE_ENGINE_ADAPTIVE_RULES_HPP_
#define SLUICE_ENGINE_ADAPTIVE_RULES_HPP_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "sluice/adaptive.hpp"
#include "sluice/client_address.hpp"
#include "sluice/decision.hpp"
#include "sluice/engine/backend.hpp"
#include "sluice/engine/rule_set.hpp"
#include "sluice/policy.hpp"

namespace sluice::detail {

// Per key of a request: an adaptive rule's factor (‰) when the request was decided, 0 for a
// fixed rule.
using Factors = absl::InlinedVector<std::uint32_t, 16>;

class AdaptiveRules {
 public:
  // The controllers of `rules`' adaptive rules, one per route name in `routes` and one for
  // unrouted requests: the previous generation's for a route it had, if the rule is unchanged
  // (same fingerprint) and has the same adaptive policy, so each route's factor carries over a
  // reload; fresh ones at `now` otherwise.
  static AdaptiveRules create(std::span<const RuleInfo> rules, std::vector<std::string> routes,
                              const AdaptiveRules* previous, std::chrono::nanoseconds now) {
    routes.emplace_back();  // "" for requests without a route
    std::sort(routes.begin(), routes.end());
    AdaptiveRules out;
    for (std::size_t i = 0; i < rules.size(); ++i) {
      const CompiledRule& rule = rules[i].compiled;
      out.max_units_.push_back(rules[i].adaptive_max_units);
      out.client_prefixes_.push_back(client_prefixes(rule.address_prefixes));
      if (!rule.adaptive) {
        out.controllers_.emplace_back();
        continue;
      }
      ++out.adaptive_;
      const RouteControllers* kept = previous != nullptr ? previous->kept(rule) : nullptr;
      auto controllers = std::make_shared<RouteControllers>();
      for (const std::string& route : routes) {
        const std::shared_ptr<AdaptiveController>* old =
            kept != nullptr ? find_route(*kept, route) : nullptr;
        controllers->emplace_back(
            route,
            old != nullptr ? *old : std::make_shared<AdaptiveController>(*rule.adaptive, now));
      }
      out.by_fingerprint_.emplace(rule.fingerprint, controllers);
      out.controllers_.push_back(std::move(controllers));
    }
    return out;
  }

  bool any() const noexcept { return adaptive_ != 0; }

  // Rule `rule`'s controller for requests on `route` (an unknown route counts as unrouted); null
  // for a rule without an adaptive policy. Lock-free.
  AdaptiveController* controller(std::size_t rule, std::optional<std::string_view> route) const {
    const std::shared_ptr<const RouteControllers>& routes = controllers_[rule];
    if (routes == nullptr) return nullptr;
    const std::shared_ptr<AdaptiveController>* c =
        find_route(*routes, route.value_or(std::string_view{}));
    return (c != nullptr ? *c : routes->front().second).get();
  }

  // Who an upstream answer counts for in rule `rule`'s controllers: a digest of `client`'s network
  // under client_prefixes. O(1).
  std::uint64_t client_of(std::size_t rule, const ClientAddress& client) const {
    return absl::HashOf(network_key(client, client_prefixes_[rule]).bytes());
  }

  // Sets each adaptive rule's key cost to its scaled units at the factor of its controller for
  // `route` at `now`, capped at the rule's bucket (a request too big for the reduced bucket
  // needs all of it); appends each key's factor to `factors` (0 for fixed rules).
  void scale_costs(std::span<RuleKey> keys, Factors& factors, std::optional<std::string_view> route,
                   std::chrono::nanoseconds now) const {
    for (RuleKey& k : keys) {
      AdaptiveController* const c = controller(k.rule, route);
      if (c == nullptr) {
        factors.push_back(0);
        continue;
      }
      const std::uint32_t factor = c->factor(now);
      factors.push_back(factor);
      const std::uint64_t bucket = max_units_[k.rule];
      const std::uint64_t full = adaptive_units(k.cost, 1000);  // the cost at factor 1
      k.cost = full > bucket ? full : std::min(adaptive_units(k.cost, factor), bucket);
    }
  }

  // Converts the decisions of adaptive rules (keys from `first` on) from limiter units back to
  // requests at the factor they were decided with: limit and remaining round down.
  static void in_requests(std::span<const std::uint32_t> factors, std::size_t first,
                          std::span<Decision> decisions) {
    for (std::size_t i = 0; i < decisions.size(); ++i) {
      const std::uint32_t factor = factors[first + i];
      if (factor == 0) continue;
      const std::uint64_t per_request = adaptive_units(1, factor);
      decisions[i].limit /= per_request;
      decisions[i].remaining /= per_request;
    }
  }

  // Rule `rule`'s state at `now`: that of its route with the lowest factor (the first such route
  // by name), with `decreases` summed over all its routes; none for a fixed rule. O(routes).
  std::optional<AdaptiveState> state(std::size_t rule, std::chrono::nanoseconds now) const {
    if (controllers_[rule] == nullptr) return std::nullopt;
    std::optional<AdaptiveState> lowest;
    std::uint64_t decreases = 0;
    for (const auto& [route, c] : *controllers_[rule]) {
      AdaptiveState s = c->state(now);
      decreases += s.decreases;
      if (!lowest || s.factor_permille < lowest->factor_permille) lowest = s;
    }
    lowest->decreases = decreases;
    return lowest;
  }

 private:
  // An adaptive rule's controllers by route name, sorted; "" (first) for unrouted requests.
  using RouteControllers = std::vector<std::pair<std::string, std::shared_ptr<AdaptiveController>>>;

  // What one client is to an adaptive rule: its network under the rule's address prefixes (the
  // config's notion of one client), and never less than an IPv4 address or an IPv6 /64 (what one
  // host usually holds), so that neither one client's many /64s in a network the config calls
  // one client, nor one host's many addresses under a rule keyed by single addresses, count as
  // several clients.
  static AddressPrefixes client_prefixes(const AddressPrefixes& rule) {
    const AddressPrefixes host{};
    return {.ipv4 = std::min(rule.ipv4, host.ipv4), .ipv6 = std::min(rule.ipv6, host.ipv6)};
  }

  // The controllers this generation has for `rule`, if it has the rule with the same policy.
  const RouteControllers* kept(const CompiledRule& rule) const {
    auto it = by_fingerprint_.find(rule.fingerprint);
    if (it == by_fingerprint_.end()) return nullptr;
    return it->second->front().second->policy() == *rule.adaptive ? it->second.get() : nullptr;
  }

  // The controller of `route` in `controllers` (sorted by route), or null.
  static const std::shared_ptr<AdaptiveController>* find_route(const RouteControllers& controllers,
                                                               std::string_view route) {
    auto it =
        std::lower_bound(controllers.begin(), controllers.end(), route,
                         [](const auto& entry, std::string_view r) { return entry.first < r; });
    return it != controllers.end() && it->first == route ? &it->second : nullptr;
  }

  std::vector<std::shared_ptr<const RouteControllers>> controllers_;  // per rule; null if fixed
  std::vector<std::uint64_t> max_units_;                              // per rule
  std::vector<AddressPrefixes> client_prefixes_;                      // per rule
  absl::flat_hash_map<std::string, std::shared_ptr<const RouteControllers>> by_fingerprint_;
  std::size_t adaptive_ = 0;
};

}  // namespace sluice::detail

#endif  // SLUICE_ENGINE_ADAPTIVE_RULES_HPP_
