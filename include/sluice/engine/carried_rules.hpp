// sluice/engine/carried_rules.hpp — what a remote backend (Redis, PostgreSQL) remembers of a
// rule's earlier windows, so that a reload changing only a rule's windows carries each key's
// spent share instead of starting it fresh.
//
// Remote backends keep naming a rule's keys by its whole fingerprint (deployed state of unchanged
// rules keeps its keys), so a rule whose windows change reads other keys. Each generation keeps,
// per rule, the window sets the same rule identity had in earlier generations (most recent
// first, at most kMaxCarriedWindowSets), each with the key prefix its keys had; a key the new
// generation has no state for is carried from those keys once, on its first check (the backend's
// client converts and writes it only while the new key is still absent).
//
//   std::vector<CarrySource<Limit>> from = carry_sources<Limit>(rule, previous_rules);
//   std::string old_key = carried_key(from[0], key, rule_key_prefix(rule.fingerprint).size());
//
// Chains: a rule changed again before its keys were carried (A → B → C, a key untouched under B)
// is carried from B's state or, where B has none, A's, up to kMaxCarriedWindowSets window sets
// back; older ones are forgotten. A reload back to a window set the rule had (A → B → A) reads
// A's keys as they are. A replica started with the new config (no previous generation) has
// nothing to carry from. Thread-safety: plain values, built once per generation.
#ifndef SLUICE_ENGINE_CARRIED_RULES_HPP_
#define SLUICE_ENGINE_CARRIED_RULES_HPP_

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/engine/rule_set.hpp"
#include "sluice/policy.hpp"

namespace sluice::detail {

// Window sets of one rule remembered across reloads, most recent first.
inline constexpr std::size_t kMaxCarriedWindowSets = 4;

// One earlier window set of a rule: its limit, the fingerprint it had and its keys' prefix.
template <class Limit>
struct CarrySource {
  std::shared_ptr<const Limit> limit;
  std::string fingerprint;
  std::string key_prefix;  // rule_key_prefix(fingerprint)
};

// What a generation of a remote backend remembers of one rule for the next generation.
template <class Limit>
struct CarriedRule {
  std::string identity;     // CompiledRule::identity
  std::string fingerprint;  // CompiledRule::fingerprint
  std::shared_ptr<const Limit> limit;
  std::vector<CarrySource<Limit>> sources;  // earlier window sets, most recent first
};

// The earlier window sets `rule` carries from, given the previous generation's rules: none for a
// rule whose identity is new; the previous rule's own sources if its fingerprint is unchanged;
// else the previous rule's windows, then its sources. Never the rule's own fingerprint (its keys
// are the current ones); at most kMaxCarriedWindowSets. O(previous rules + sources).
template <class Limit>
std::vector<CarrySource<Limit>> carry_sources(const CompiledRule& rule,
                                              std::span<const CarriedRule<Limit>> previous) {
  const auto same =
      std::find_if(previous.begin(), previous.end(),
                   [&](const CarriedRule<Limit>& p) { return p.identity == rule.identity; });
  if (same == previous.end()) return {};
  if (same->fingerprint == rule.fingerprint) return same->sources;
  std::vector<CarrySource<Limit>> sources;
  sources.push_back({same->limit, same->fingerprint, rule_key_prefix(same->fingerprint)});
  for (const CarrySource<Limit>& s : same->sources) {
    if (sources.size() == kMaxCarriedWindowSets) break;
    if (s.fingerprint != rule.fingerprint) sources.push_back(s);
  }
  return sources;
}

// The engine key that `key` (a key of a rule whose own prefix has `prefix_size` bytes) had under
// the earlier window set `source`.
template <class Limit>
std::string carried_key(const CarrySource<Limit>& source, std::string_view key,
                        std::size_t prefix_size) {
  std::string out = source.key_prefix;
  out.append(key.substr(std::min(prefix_size, key.size())));
  return out;
}

}  // namespace sluice::detail

#endif  // SLUICE_ENGINE_CARRIED_RULES_HPP_
