// sluice/engine/workspace.hpp — what one request needs besides its Evaluation, kept per thread.
//
// Internal to BasicRateLimitEngine (sluice/engine.hpp): each evaluating thread keeps one
// RequestWorkspace, so that evaluating neither allocates nor clears one once it has held the
// largest request's keys, merged rule lists, factors and decisions. RequestKeys views it.
//
// Thread-safety: thread-compatible; one per thread.
#ifndef SLUICE_ENGINE_WORKSPACE_HPP_
#define SLUICE_ENGINE_WORKSPACE_HPP_

#include <cstdint>
#include <span>
#include <vector>

#include "sluice/decision.hpp"
#include "sluice/engine/adaptive_rules.hpp"
#include "sluice/engine/backend.hpp"
#include "sluice/engine/rule_set.hpp"

namespace sluice::detail {

// A request's keys (live rules first) and, where adaptive rules exist, each key's factor
// (AdaptiveRules::scale_costs).
struct RequestKeys {
  std::span<const RuleKey> keys;
  std::span<const std::uint32_t> factors;
};

struct RequestWorkspace {
  RuleSet::KeyBuffer keys;
  RuleSet::Scratch scratch;
  Factors factors;
  std::vector<Decision> decisions;

  // `n` decision slots, each written by the backend before it is read.
  std::span<Decision> decisions_for(std::size_t n) {
    if (decisions.size() < n) decisions.resize(n);
    return std::span(decisions).first(n);
  }
};

}  // namespace sluice::detail

#endif  // SLUICE_ENGINE_WORKSPACE_HPP_
