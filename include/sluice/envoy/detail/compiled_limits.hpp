// Internal to sluice::envoy: a ServiceConfig compiled into lookup tables (one per tree level) and
// the limits' rules for an engine backend. Immutable once compiled: thread-safe to read.
// Matching is O(entries) hash lookups plus the wildcard values of the levels visited.
#ifndef SLUICE_ENVOY_DETAIL_COMPILED_LIMITS_HPP_
#define SLUICE_ENVOY_DETAIL_COMPILED_LIMITS_HPP_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/detail/text.hpp"
#include "sluice/envoy/config.hpp"
#include "sluice/envoy/request.hpp"
#include "sluice/key.hpp"
#include "sluice/policy.hpp"

namespace sluice::envoy::detail {

inline constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

// Debian's Abseil has its own string_view: its hash maps and StrCat take that one.
inline absl::string_view view(std::string_view s) { return {s.data(), s.size()}; }

// One limit as the limiter applies it. Its label, name and `replaces` are UTF-8: a byte of the
// configuration that is not is written as \xNN (sluice::detail::utf8_escaped), since a name goes
// to Envoy in a protobuf string, and Envoy cannot read an answer with such a byte in one.
struct LimitRule {
  std::string label{};  // the descriptor path, "domain.key_value.key", as the reference names it
  std::string name{};   // the configured name, else the label
  bool named = false;   // a configured name (only those can be replaced)
  bool unlimited = false;
  bool shadow = false;
  bool admits_nothing = false;  // a window of 0 requests
  std::vector<std::string> replaces{};
  std::vector<GcraWindow> windows{};  // shortest period first
  Algorithm algorithm = Algorithm::kGcra;
  std::uint64_t max_hits = 0;        // the smallest burst: more hits never fit
  std::size_t backend_rule = kNone;  // index into the backend's rules; kNone: nothing to count
  char key_tag = 'c';                // counters of configured limits and of overrides differ
};

// A limit matched in one level: the next level, the node's rule.
struct Node {
  std::size_t rule = kNone;
  std::size_t level = kNone;
};

struct KeyNodes {
  absl::flat_hash_map<std::string, Node> by_value{};
  std::vector<std::pair<std::string, Node>> by_prefix{};  // value "abc*" as ("abc", node)
  std::optional<Node> any{};                              // the node without a value
};

struct Level {
  absl::flat_hash_map<std::string, KeyNodes> by_key{};
};

// The window a rule is reported by, in the protocol's unit nearest to its period.
inline CurrentLimit report(const LimitRule& rule, std::size_t window) {
  CurrentLimit out{.name = rule.name};
  if (rule.windows.empty()) return out;
  const GcraWindow& w = rule.windows[std::min(window, rule.windows.size() - 1)];
  // Nearest by ratio: u is nearer than best iff period² ≥ best·u (ns, 128-bit).
  const absl::uint128 period(static_cast<std::uint64_t>(w.period.count()));
  auto ns = [](Unit u) {
    return absl::uint128(static_cast<std::uint64_t>(unit_period(u).count()));
  };
  Unit best = Unit::kSecond;
  for (Unit u : {Unit::kMinute, Unit::kHour, Unit::kDay, Unit::kMonth, Unit::kYear}) {
    if (period * period >= ns(best) * ns(u)) best = u;
  }
  out.unit = best;
  if (w.requests == 0) return out;
  const absl::uint128 scaled = (absl::uint128(w.requests) * ns(best) + period / 2) / period;
  out.requests_per_unit = static_cast<std::uint32_t>(
      std::clamp<std::uint64_t>(scaled > absl::uint128(std::numeric_limits<std::uint32_t>::max())
                                    ? std::numeric_limits<std::uint32_t>::max()
                                    : absl::Uint128Low64(scaled),
                                1, std::numeric_limits<std::uint32_t>::max()));
  return out;
}

class CompiledLimits {
 public:
  static absl::StatusOr<CompiledLimits> compile(const ServiceConfig& config) {
    CompiledLimits out;
    for (const DomainConfig& d : config.domains) {
      if (d.domain.empty()) return error(d, "", "a domain must not be empty");
      const std::size_t root = out.levels_.size();
      if (!out.domains_.emplace(d.domain, root).second) {
        return error(d, "", absl::StrCat("duplicate domain ", sluice::detail::quoted(d.domain)));
      }
      out.levels_.emplace_back();
      std::string identity;
      append_key_part(identity, "envoy");
      append_key_part(identity, d.domain);
      const std::size_t first_rule = out.rules_.size();
      if (absl::Status s = out.add_tree(d, {sluice::detail::utf8_escaped(d.domain),
                                            std::move(identity), &d.descriptors, root});
          !s.ok()) {
        return s;
      }
      if (absl::Status s = out.check_replaced_names(d, first_rule); !s.ok()) return s;
      out.enforcing_by_domain_[d.domain] = static_cast<std::size_t>(
          std::count_if(out.rules_.begin() + static_cast<std::ptrdiff_t>(first_rule),
                        out.rules_.end(), can_deny));
    }
    out.make_labels_unique();
    return out;
  }

  // The rules that can deny a request: neither shadow mode nor unlimited.
  std::size_t enforcing_rule_count() const {
    return static_cast<std::size_t>(std::count_if(rules_.begin(), rules_.end(), can_deny));
  }

  // Those of `domain` (0 for a domain it does not have).
  std::size_t enforcing_rule_count(std::string_view domain) const {
    auto it = enforcing_by_domain_.find(view(domain));
    return it == enforcing_by_domain_.end() ? 0 : it->second;
  }

  bool has_domain(std::string_view domain) const { return domains_.contains(view(domain)); }

  // The rule of the most specific node matching `entries` in `domain`, or kNone.
  std::size_t match(std::string_view domain, std::span<const Entry> entries) const {
    auto root = domains_.find(view(domain));
    if (root == domains_.end()) return kNone;
    std::size_t level = root->second;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const Node* node = find(levels_[level], entries[i]);
      if (node == nullptr) return kNone;
      if (i + 1 == entries.size()) return node->rule;
      if (node->level == kNone) return kNone;
      level = node->level;
    }
    return kNone;
  }

  const LimitRule& rule(std::size_t i) const { return rules_[i]; }
  std::size_t rule_count() const { return rules_.size(); }
  // The rules that count hits, in backend order (LimitRule::backend_rule indexes it).
  const std::vector<CompiledRule>& backend_rules() const { return backend_rules_; }

  // The label of override `o` beside these limits: "override.<n>/<unit>", with "#2", "#3", ...
  // appended while a configured limit's path reads the same (domain "override", key
  // "5/second"), so that the two never share a metric series.
  std::string override_label(const LimitOverride& o) const {
    const std::string label = override_rule(o).first.label;
    std::string unique = label;
    for (std::size_t k = 2; labels_.contains(unique); ++k) unique = absl::StrCat(label, "#", k);
    return unique;
  }

  // A rule for a descriptor's limit override, counted apart from every configured limit and
  // every other override: its identity names its rate, so that no state is carried between two
  // overrides (one hit under 1 per second is not a day spent under 1,000 per day). Its label
  // ignores the configured limits (override_label does not).
  static std::pair<LimitRule, CompiledRule> override_rule(const LimitOverride& o) {
    LimitRule r{
        .label = absl::StrCat("override.", o.requests_per_unit, "/", view(to_string(o.unit))),
        .windows = {{.requests = o.requests_per_unit,
                     .period = unit_period(o.unit),
                     .burst = o.requests_per_unit}},
        .key_tag = 'o'};
    r.name = r.label;
    r.admits_nothing = o.requests_per_unit == 0;
    r.max_hits = o.requests_per_unit;
    std::string identity;
    append_key_part(identity, "envoy-override");
    append_key_part(identity, r.label);
    return {r, backend_rule(r, identity)};
  }

 private:
  static bool can_deny(const LimitRule& r) { return !r.shadow && !r.unlimited; }

  static const Node* find(const Level& level, const Entry& entry) {
    auto key = level.by_key.find(view(entry.key));
    if (key == level.by_key.end()) return nullptr;
    const KeyNodes& nodes = key->second;
    if (auto v = nodes.by_value.find(view(entry.value)); v != nodes.by_value.end()) {
      return &v->second;
    }
    for (const auto& [prefix, node] : nodes.by_prefix) {
      if (entry.value.starts_with(prefix)) return &node;
    }
    return nodes.any ? &*nodes.any : nullptr;
  }

  // One level of a domain's tree still to compile (breadth first, so no recursion however deep
  // a tree built in code nests).
  struct Pending {
    std::string path;      // "domain.key_value..."
    std::string identity;  // the rules' identity prefix
    const std::vector<DescriptorConfig>* nodes = nullptr;
    std::size_t level = 0;
  };

  absl::Status add_tree(const DomainConfig& d, Pending root) {
    std::vector<Pending> pending{std::move(root)};
    while (!pending.empty()) {
      Pending p = std::move(pending.back());
      pending.pop_back();
      absl::flat_hash_set<std::pair<std::string, std::string>> seen;
      for (const DescriptorConfig& c : *p.nodes) {
        const std::string key = sluice::detail::utf8_escaped(c.key);
        const std::string here =
            c.value.empty()
                ? absl::StrCat(p.path, ".", key)
                : absl::StrCat(p.path, ".", key, "_", sluice::detail::utf8_escaped(c.value));
        if (c.key.empty()) return error(d, here, "a descriptor's key must not be empty");
        if (!seen.emplace(c.key, c.value).second) {
          return error(d, here, "duplicate descriptor (the same key and value twice in one level)");
        }
        std::string id = p.identity;
        append_key_part(id, c.key);
        append_key_part(id, c.value);
        Node node;
        if (c.rate_limit) {
          absl::StatusOr<std::size_t> rule = add_rule(d, here, id, *c.rate_limit, c.shadow_mode);
          if (!rule.ok()) return rule.status();
          node.rule = *rule;
        }
        if (!c.descriptors.empty()) {
          node.level = levels_.size();
          levels_.emplace_back();
          pending.push_back({here, std::move(id), &c.descriptors, node.level});
        }
        place(levels_[p.level].by_key[c.key], c.value, node);
      }
    }
    return absl::OkStatus();
  }

  // Every name in a `replaces` of domain `d` (its rules from `first` on) is the name of one of its
  // limits: replaces acts only among the limits of one call, which are all of one domain, so any
  // other name replaces nothing, and the limit a typo meant would still apply.
  absl::Status check_replaced_names(const DomainConfig& d, std::size_t first) const {
    absl::flat_hash_set<absl::string_view> names;
    for (std::size_t i = first; i < rules_.size(); ++i) {
      if (rules_[i].named) names.insert(rules_[i].name);
    }
    for (std::size_t i = first; i < rules_.size(); ++i) {
      for (const std::string& replaced : rules_[i].replaces) {
        if (names.contains(replaced)) continue;
        return error(d, rules_[i].label,
                     absl::StrCat("replaces ", sluice::detail::quoted(replaced),
                                  ", but no limit of domain ", sluice::detail::quoted(d.domain),
                                  " has that name, so it replaces nothing; set the name of the "
                                  "limit it should replace (rate_limit.name), or drop the entry"));
      }
    }
    return absl::OkStatus();
  }

  // Labels are descriptor paths joined with '_' and '.', so two places can share one ("a" with
  // value "b_c" and "a_b" with value "c"); later ones get "#2", "#3", ... in configuration order,
  // so that metrics name every limit apart and counters kept across reloads stay apart.
  void make_labels_unique() {
    absl::flat_hash_map<std::string, std::size_t> seen;
    for (std::size_t i = 0; i < rules_.size(); ++i) {
      LimitRule& r = rules_[i];
      const std::size_t n = ++seen[r.label];
      if (n == 1) continue;
      std::string label;
      for (std::size_t k = n;; ++k) {
        label = absl::StrCat(r.label, "#", k);
        if (!seen.contains(label)) break;
      }
      seen[label] = 1;
      if (!r.named) r.name = label;
      if (r.backend_rule != kNone) backend_rules_[r.backend_rule].label = label;
      r.label = std::move(label);
    }
    for (const LimitRule& r : rules_) labels_.insert(r.label);
  }

  static void place(KeyNodes& nodes, const std::string& value, const Node& node) {
    if (value.empty()) {
      nodes.any = node;
    } else if (value.back() == '*') {
      nodes.by_prefix.emplace_back(value.substr(0, value.size() - 1), node);
    } else {
      nodes.by_value.emplace(value, node);
    }
  }

  absl::StatusOr<std::size_t> add_rule(const DomainConfig& d, const std::string& path,
                                       const std::string& identity, const Limit& limit,
                                       bool shadow) {
    LimitRule r{.label = path,
                .name = limit.name.empty() ? path : sluice::detail::utf8_escaped(limit.name),
                .named = !limit.name.empty(),
                .unlimited = limit.unlimited,
                .shadow = shadow,
                .windows = limit.windows,
                .algorithm = limit.algorithm};
    if (limit.unlimited != limit.windows.empty()) {
      return error(d, path,
                   limit.unlimited
                       ? "an unlimited limit must not have a rate"
                       : "a limit needs a rate (requests_per_unit and unit) or unlimited");
    }
    for (const std::string& replaced : limit.replaces) {
      if (replaced.empty()) return error(d, path, "a replaces entry must name a limit");
      if (replaced == limit.name) return error(d, path, "a limit must not replace itself");
      r.replaces.push_back(sluice::detail::utf8_escaped(replaced));
    }
    std::sort(r.windows.begin(), r.windows.end(),
              [](const GcraWindow& a, const GcraWindow& b) { return a.period < b.period; });
    r.max_hits = std::numeric_limits<std::uint64_t>::max();
    for (GcraWindow& w : r.windows) {
      if (w.requests == 0) r.admits_nothing = true;
      if (r.algorithm == Algorithm::kFixedWindow && w.burst != 0 && w.burst != w.requests) {
        return error(d, path, "a fixed_window limit's burst must equal its requests_per_unit");
      }
      if (w.burst == 0) w.burst = w.requests;
      r.max_hits = std::min(r.max_hits, w.burst);
    }
    if (!r.unlimited && !r.admits_nothing) {
      r.backend_rule = backend_rules_.size();
      backend_rules_.push_back(backend_rule(r, identity));
    }
    rules_.push_back(std::move(r));
    return rules_.size() - 1;
  }

  // The backend's view of a rule: equal fingerprints across reloads keep the counters; equal
  // identities (same place in the tree, other windows) carry each key's spent share. A fixed
  // window's identity differs from a GCRA limit's at the same place.
  static CompiledRule backend_rule(const LimitRule& r, std::string identity) {
    if (r.algorithm == Algorithm::kFixedWindow) append_key_part(identity, "fixed_window");
    std::string fingerprint = identity;
    for (const GcraWindow& w : r.windows) {
      append_key_part(fingerprint, absl::StrCat(w.requests, "/", w.period.count(), "/", w.burst));
    }
    return CompiledRule{.label = r.label,
                        .windows = r.windows,
                        .algorithm = r.algorithm,
                        .fingerprint = fingerprint,
                        .identity = identity};
  }

  // "<source>: <path>: <what>"; the source and the path (built of the file's keys and values)
  // quoted and escaped unless they are printable ASCII, so that no file can forge a log line.
  static absl::Status error(const DomainConfig& d, std::string_view path, std::string_view what) {
    using sluice::detail::plain_or_quoted;
    return absl::InvalidArgumentError(
        absl::StrCat(d.source.empty() ? "" : absl::StrCat(plain_or_quoted(d.source), ": "),
                     plain_or_quoted(path), path.empty() ? "" : ": ", view(what)));
  }

  absl::flat_hash_map<std::string, std::size_t> domains_;              // -> root level
  absl::flat_hash_map<std::string, std::size_t> enforcing_by_domain_;  // -> rules that can deny
  std::vector<Level> levels_;
  std::vector<LimitRule> rules_;
  std::vector<CompiledRule> backend_rules_;
  absl::flat_hash_set<std::string> labels_;  // every rule's, once unique
};

}  // namespace sluice::envoy::detail

#endif  // SLUICE_ENVOY_DETAIL_COMPILED_LIMITS_HPP_
