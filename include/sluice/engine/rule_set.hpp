// sluice/engine/rule_set.hpp — one config generation's rules: which of them a request meets, and
// the key it meets each one under.
//
// A `RuleSet` is compiled once per config generation (BasicRateLimitEngine::create and reload)
// and is immutable afterwards. It resolves a request's scopes (consumer, route, service,
// listener, global) to the rules that apply, in precedence order, split into live and dry-run
// rules; for a request without a consumer those lists are precomputed per (route or service,
// listener), so selecting them is two hash lookups. It writes each rule's key for a request
// from the rule's precomputed prefix and the request's attributes, without building a string.
//
// Thread-safety: every const member function may be called concurrently.
#ifndef SLUICE_ENGINE_RULE_SET_HPP_
#define SLUICE_ENGINE_RULE_SET_HPP_

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/adaptive.hpp"
#include "sluice/client_address.hpp"
#include "sluice/detail/short_copy.hpp"
#include "sluice/detail/text.hpp"
#include "sluice/detail/xxhash.hpp"
#include "sluice/engine/backend.hpp"
#include "sluice/engine/evaluation.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/key.hpp"
#include "sluice/policy.hpp"
#include "sluice/request_path.hpp"

namespace sluice {

// A compiled rule with what its keys and fields need, precomputed.
struct RuleInfo {
  CompiledRule compiled{};
  std::vector<std::string> window_names{};    // "<label>/s" ...: RateLimit(-Policy) item names
  std::vector<std::string> limit_prefixes{};  // per window: its RateLimit item up to `r=`
  std::string policy_value{};                 // the RateLimit-Policy value for all its windows
  std::string key_prefix{};  // the rule in its keys (a hash of its fingerprint), or empty
  // An adaptive rule's bucket in limiter units (its smallest burst × 1000): a request whose
  // scaled cost exceeds it takes the whole bucket instead. 0 for other rules.
  std::uint64_t adaptive_max_units = 0;
};

// The start of every key of a rule on a remote backend, whose rules share one keyspace: a hash of
// the rule's fingerprint as one composite-key part. Remote backends also use it to name the keys a
// rule had under an earlier fingerprint (sluice/engine/carried_rules.hpp).
inline constexpr std::size_t kRuleKeyPrefixSize = 12;  // a part of 8 bytes
inline std::string rule_key_prefix(std::string_view named) {
  const std::uint64_t id = XXH3_64bits(named.data(), named.size());
  std::string prefix;
  append_key_part(prefix, std::string_view(reinterpret_cast<const char*>(&id), sizeof(id)));
  assert(prefix.size() == kRuleKeyPrefixSize);
  return prefix;
}

// Rule indices, in precedence order.
using RuleGroup = absl::InlinedVector<std::uint32_t, 16>;

// A request as a rule set resolved it: empty names made absent, the route's service filled in,
// the client's address parsed once, and the rules that apply (live and dry-run, each in
// precedence order). The spans view the rule set or `RuleSet::Scratch`.
struct ScopedRequest {
  // RuleSet::scope sets every other member: the constructor leaves the optionals' payloads
  // alone, as zeroing the whole struct on every request first (a block clear) is measurable.
  explicit ScopedRequest(const RequestContext& request) noexcept : raw(&request) {}

  const RequestContext* raw;
  ClientAddress client;
  std::optional<std::string_view> credential, consumer, route, service, listener;
  std::span<const std::uint32_t> live, dry;
};

class RuleSet {
 public:
  // Where the rules of a request with a consumer are merged.
  struct Scratch {
    RuleGroup live, dry;
  };

  // Compiles `config` (validated by compile_policies: InvalidArgument naming the bad path).
  // `per_rule_state`: the backend keeps each rule's state apart (the in-memory backend's store
  // per rule, which also carries a rule's changed windows), so a key names only the request's
  // attributes; else every key starts with the rule's fingerprint prefix (rule_key_prefix), as
  // the rules of a remote backend share one keyspace.
  static absl::StatusOr<RuleSet> compile(const PolicyConfig& config, bool per_rule_state) {
    auto bundles = compile_policies(config);
    if (!bundles.ok()) return bundles.status();
    RuleSet set;
    absl::flat_hash_map<std::string, RuleList> bundle_rules;
    for (const CompiledBundle& bundle : *bundles) {
      RuleList& list = bundle_rules[bundle.name];
      for (const CompiledRule& rule : bundle.rules) {
        list.push_back(static_cast<std::uint32_t>(set.compiled_.size()));
        set.by_fingerprint_.emplace(rule.fingerprint, set.compiled_.size());
        set.compiled_.push_back(rule);
        set.rules_.push_back(describe(rule, per_rule_state));
        set.max_selectors_ = std::max(set.max_selectors_, rule.selector.size());
      }
    }
    set.prefix_size_ = per_rule_state ? 0 : kRuleKeyPrefixSize;
    set.attach_scopes(config, bundle_rules);
    set.build_plans(config);
    // validate() has parsed every entry already, so this does not fail on a validated config.
    absl::StatusOr<ClientAddressResolver> proxies =
        ClientAddressResolver::create(config.gateway.trusted_proxies, ProxyHeaders::kEither,
                                      config.gateway.ipv4_translation_prefixes);
    if (!proxies.ok()) return proxies.status();
    set.client_addresses_ = *std::move(proxies);
    return set;
  }

  std::span<const RuleInfo> rules() const noexcept { return rules_; }
  std::span<const CompiledRule> compiled() const noexcept { return compiled_; }
  std::optional<std::size_t> find_fingerprint(const std::string& fingerprint) const {
    auto it = by_fingerprint_.find(fingerprint);
    return it == by_fingerprint_.end() ? std::nullopt : std::optional(it->second);
  }
  std::optional<std::size_t> find_label(std::string_view label) const {
    for (std::size_t r = 0; r < rules_.size(); ++r) {
      if (rules_[r].compiled.label == label) return r;
    }
    return std::nullopt;
  }

  // Taken by reference: a caller's request was usually written just before, and a copy read
  // back as one 16-byte value stalls the store forwarding; the size alone usually decides.
  bool exempt(const std::string_view& path) const {
    if ((exempt_lengths_ >> std::min<std::size_t>(path.size(), 63) & 1U) == 0) return false;
    return std::find(exempt_paths_.begin(), exempt_paths_.end(), path) != exempt_paths_.end();
  }

  // Resolves `raw` into `out` (rules in `scratch` where a consumer's rules are merged in).
  // InvalidArgument if the request names another service than its route's. O(rules that apply).
  absl::Status scope(const RequestContext& raw, ScopedRequest& out, Scratch& scratch) const {
    out.raw = &raw;
    out.client = raw.client ? *raw.client : ClientAddress::parse(raw.client_ip);
    set_present(out.credential, raw.credential);
    set_present(out.consumer, raw.consumer);
    set_present(out.route, raw.route);
    set_present(out.service, raw.service);
    set_present(out.listener, raw.listener);
    const RouteScope* route = out.route ? find_route(*out.route) : nullptr;
    // A route name the config lacks is unrouted traffic, keyed as such: its text is not a key
    // part, so a caller that passes names a client chose cannot give it a bucket per name.
    if (route == nullptr) out.route.reset();
    if (route != nullptr && !route->service.empty()) {
      if (!out.service) {
        out.service = route->service;
      } else if (*out.service != route->service) {
        // The service is the caller's: escaped, and no longer than a config's names can be.
        return absl::InvalidArgumentError(absl::StrCat(
            "the request names service ", detail::quoted_prefix(*out.service, kMaxNameBytes),
            " but route ", detail::quoted(*out.route), " belongs to service ",
            detail::quoted(route->service)));
      }
    }
    const RuleList* consumer = out.consumer ? find(consumer_rules_, *out.consumer) : nullptr;
    const bool planned = (consumer == nullptr || consumer->empty()) &&
                         (route == nullptr || !route->service.empty() || !out.service);
    if (planned) {
      const Plan& plan = plans_[plan_index(route, out.service, out.listener)];
      out.live = plan.live;
      out.dry = plan.dry;
      return absl::OkStatus();
    }
    scratch.live.clear();
    scratch.dry.clear();
    for (const RuleList* rules :
         {consumer, out.route ? find(route_rules_, *out.route) : nullptr,
          out.service ? find(service_rules_, *out.service) : nullptr,
          out.listener ? find(listener_rules_, *out.listener) : nullptr, &global_rules_}) {
      add_rules(rules, scratch.live, scratch.dry);
    }
    out.live = scratch.live;
    out.dry = scratch.dry;
    return absl::OkStatus();
  }

  // An upper bound of the size of rule `r`'s key for `request` (write_key). O(1).
  std::size_t key_size(std::uint32_t r, const ScopedRequest& request) const {
    return prefix_size_ + rules_[r].compiled.selector.size() * part_bound(request);
  }
  // An upper bound of the size of all the keys of `request`'s rules, live and dry-run. O(1).
  std::size_t keys_size(const ScopedRequest& request) const {
    return (request.live.size() + request.dry.size()) *
           (prefix_size_ + max_selectors_ * part_bound(request));
  }

  // Writes rule `r`'s key for `request` at `out` (room for key_size bytes); returns the byte
  // after it. The key is the rule's prefix (none for a backend with per-rule state), then its
  // selected attributes in canonical order, each one tagged part (write_key_part): an address as
  // its network under the rule's prefixes (every unparsable address shares one "invalid" key, so
  // no text a client writes becomes a key of its own); a credential only once authenticated
  // (with a consumer), else the address; the route, or a tag no route name produces for an
  // unrouted request.
  char* write_key(char* out, std::uint32_t r, const ScopedRequest& request) const {
    const CompiledRule& rule = rules_[r].compiled;
    if (prefix_size_ != 0) {
      std::memcpy(out, rules_[r].key_prefix.data(), kRuleKeyPrefixSize);  // a constant size
      out += kRuleKeyPrefixSize;
    }
    for (Selector selector : rule.selector) {
      const bool address = selector == Selector::kIp ||
                           (selector == Selector::kCredential && !authenticated(request));
      if (address) {
        char* const header = out;
        char* const end =
            write_network_key(header + key_part_size(0), request.client, rule.address_prefixes);
        write_key_part_header(header, 'i',
                              static_cast<std::size_t>(end - header) - key_part_size(0));
        out = end;
      } else if (selector == Selector::kCredential) {
        out = write_key_part(out, 'c', *request.credential);
      } else {
        out =
            request.route ? write_key_part(out, 'r', *request.route) : write_key_part(out, 'u', {});
      }
    }
    return out;
  }

  // A thread's keys of one request: their bytes, and the RuleKeys that view them.
  struct KeyBuffer {
    std::string bytes;
    std::vector<RuleKey> keys;
  };
  // Every rule's key for `request` (live rules first, then dry-run ones) at the request's cost,
  // written into `buffer`, whose storage is reused: no allocation once it has held the most.
  std::span<RuleKey> keys(const ScopedRequest& request, KeyBuffer& buffer) const {
    const std::size_t count = request.live.size() + request.dry.size();
    const std::size_t size = keys_size(request);
    if (buffer.bytes.size() < size) buffer.bytes.resize(size);
    if (buffer.keys.size() < count) buffer.keys.resize(count);
    char* at = buffer.bytes.data();
    RuleKey* key = buffer.keys.data();
    const std::uint64_t cost = request.raw->cost;
    auto write = [&](std::span<const std::uint32_t> group) {
      for (std::uint32_t r : group) {
        char* const end = write_key(at, r, request);
        key->rule = r;
        key->key = std::string_view(at, static_cast<std::size_t>(end - at));
        key->cost = cost;
        ++key;
        at = end;
      }
    };
    write(request.live);
    if (!request.dry.empty()) write(request.dry);
    return std::span(buffer.keys).first(count);
  }

  // A rule's index and the key a request selects for it (inspect and reset).
  struct RuleKeyFor {
    std::size_t rule = 0;
    std::string key;
  };
  // The rule labelled `label` and its key for `raw` (whether or not the rule applies to `raw`):
  // NotFound for an unknown label, or for a route the config lacks if the rule keys routes;
  // InvalidArgument for no client address if it keys the address; scope's error for a request
  // it refuses.
  absl::StatusOr<RuleKeyFor> key_for(std::string_view label, const RequestContext& raw) const {
    const std::optional<std::size_t> r = find_label(label);
    if (!r) {
      // The label comes from an operator's request: escaped, and no longer than a real one.
      return absl::NotFoundError(absl::StrCat("no rule is labelled ",
                                              detail::quoted_prefix(label, 2 * kMaxNameBytes + 1)));
    }
    Scratch scratch;
    ScopedRequest request(raw);
    if (absl::Status s = scope(raw, request, scratch); !s.ok()) return s;
    if (absl::Status s = shared_by_mistake(*r, raw, request); !s.ok()) return s;
    return RuleKeyFor{.rule = *r, .key = key(static_cast<std::uint32_t>(*r), request)};
  }

  // An error when an operator's `raw` would name, by omission or by a typo, a key that many
  // clients share: a route the config lacks (NotFound) for a rule that keys routes (requests key
  // it as unrouted), or no client address (InvalidArgument) for a rule that keys the address
  // (every unparsable address shares that key). Naming those keys on purpose stays possible: no
  // route for the unrouted key, an unparsable address (e.g. "invalid") for the invalid one.
  absl::Status shared_by_mistake(std::size_t r, const RequestContext& raw,
                                 const ScopedRequest& request) const {
    const std::vector<Selector>& selector = rules_[r].compiled.selector;
    const auto keys = [&](Selector s) {
      return std::find(selector.begin(), selector.end(), s) != selector.end();
    };
    if (raw.route && !raw.route->empty() && !request.route && keys(Selector::kRoute)) {
      return absl::NotFoundError(
          absl::StrCat("no route is named ", detail::quoted_prefix(*raw.route, kMaxNameBytes),
                       "; name no route for the key unrouted requests share"));
    }
    const bool keys_address =
        keys(Selector::kIp) || (keys(Selector::kCredential) && !authenticated(request));
    if (!raw.client && raw.client_ip.empty() && keys_address) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rule ", detail::quoted(rules_[r].compiled.label),
          " keys the client address and the request names none; name an address (an "
          "unparsable one, e.g. \"invalid\", for the key every unparsable address shares)"));
    }
    return absl::OkStatus();
  }

  // Rule `r`'s key for `request` as a string (inspect and reset).
  std::string key(std::uint32_t r, const ScopedRequest& request) const {
    std::string out(key_size(r, request), '\0');
    out.resize(static_cast<std::size_t>(write_key(out.data(), r, request) - out.data()));
    return out;
  }

  // The route with the longest path_prefix that starts `path` (normalized), among routes on
  // `listener` or on every listener; see BasicRateLimitEngine::match_route.
  const Route* match_route(std::string_view listener, std::string_view path) const {
    for (const Route& route : routes_) {  // sorted longest prefix first
      if (!route.listener.empty() && route.listener != listener) continue;
      if (route.path_prefix.empty() || !prefix_starts(route, path)) continue;
      return &route;
    }
    return nullptr;
  }
  // Whether `route`'s path_prefix starts `path`: byte for byte, or as an upstream that ignores
  // case reads them when the route is not case_sensitive (path_starts_with_ignoring_case: ASCII
  // letters in either case, and the letters outside ASCII that fold to one as that letter). In
  // place: no allocation.
  static bool prefix_starts(const Route& route, std::string_view path) {
    if (route.case_sensitive) return path.starts_with(route.path_prefix);
    return path_starts_with_ignoring_case(path, route.path_prefix);
  }
  // The consumer that owns `credential`.
  std::optional<std::string_view> consumer_for(std::string_view credential) const {
    const std::string* consumer = find(credentials_, credential);
    return consumer == nullptr ? std::nullopt : std::optional<std::string_view>(*consumer);
  }
  // The consumer called `name` (a view into this rule set), if the config has one.
  std::optional<std::string_view> consumer_named(std::string_view name) const {
    const auto it = consumer_rules_.find(absl::string_view(name.data(), name.size()));
    if (it == consumer_rules_.end()) return std::nullopt;
    return std::string_view(it->first);
  }
  // Whether the config has a listener called `name`.
  bool has_listener(std::string_view name) const { return find(listener_index_, name) != nullptr; }
  const ClientAddressResolver& client_addresses() const noexcept { return client_addresses_; }

 private:
  using RuleList = std::vector<std::uint32_t>;
  struct RouteScope {
    std::uint32_t index = 0;  // into routes in declaration order
    std::string service;      // "" if the route names none
  };
  struct Plan {
    RuleList live, dry;
  };

  // `out` = `name` unless it is absent or empty. In place: an optional returned by value and
  // copied stalls the store of its flag byte into the wider load of the copy.
  static void set_present(std::optional<std::string_view>& out,
                          const std::optional<std::string_view>& name) {
    if (name && !name->empty()) {
      out.emplace(*name);
    } else {
      out.reset();
    }
  }
  // An upper bound of the encoded size of one attribute of `request` (a tagged key part).
  static std::size_t part_bound(const ScopedRequest& request) {
    std::size_t part = kMaxNetworkKeySize;
    if (request.credential) part = std::max(part, request.credential->size());
    if (request.route) part = std::max(part, request.route->size());
    return key_part_size(part);
  }
  static bool authenticated(const ScopedRequest& request) {
    return request.credential && request.consumer;
  }

  // The scope of the route called `name`. Most configs have a few routes: comparing their names
  // (length first) costs less than hashing the name.
  const RouteScope* find_route(std::string_view name) const {
    if (route_scopes_.size() > kFewRoutes) return find(route_scopes_, name);
    for (const auto& [route, scope] : few_routes_) {
      if (route.size() == name.size() &&
          detail::equal_short(route.data(), name.data(), name.size())) {
        return &scope;
      }
    }
    return nullptr;
  }

  template <class Map>
  static const typename Map::mapped_type* find(const Map& map, std::string_view name) {
    auto it = map.find(absl::string_view(name.data(), name.size()));
    return it == map.end() ? nullptr : &it->second;
  }

  // Adds `rules` not added yet to `live` or `dry`, in order.
  void add_rules(const RuleList* rules, RuleGroup& live, RuleGroup& dry) const {
    if (rules == nullptr) return;
    for (std::uint32_t r : *rules) {
      RuleGroup& group = compiled_[r].dry_run ? dry : live;
      if (std::find(group.begin(), group.end(), r) == group.end()) group.push_back(r);
    }
  }

  static RuleInfo describe(const CompiledRule& rule, bool per_rule_state) {
    RuleInfo info{.compiled = rule};
    std::vector<QuotaPolicy> policies;
    for (const GcraWindow& w : info.compiled.windows) {
      info.window_names.push_back(absl::StrCat(info.compiled.label, "/", window_suffix(w.period)));
    }
    for (std::size_t i = 0; i < info.compiled.windows.size(); ++i) {
      policies.push_back({.name = info.window_names[i],
                          .quota = info.compiled.windows[i].requests,
                          .window = info.compiled.windows[i].period});
      append_ratelimit_item_prefix(info.limit_prefixes.emplace_back(), info.window_names[i]);
    }
    info.policy_value = ratelimit_policy_value(policies);
    if (info.compiled.adaptive) {
      info.adaptive_max_units = std::numeric_limits<std::uint64_t>::max();
      for (const GcraWindow& w : limiter_windows(info.compiled)) {
        info.adaptive_max_units = std::min(info.adaptive_max_units, w.burst);
      }
    }
    if (!per_rule_state) info.key_prefix = rule_key_prefix(info.compiled.fingerprint);
    return info;
  }

  static std::string window_suffix(std::chrono::nanoseconds period) {
    if (period == std::chrono::seconds(1)) return "s";
    if (period == std::chrono::minutes(1)) return "minute";
    if (period == std::chrono::hours(1)) return "hour";
    return absl::StrCat(std::chrono::duration_cast<std::chrono::seconds>(period).count(), "s");
  }

  // The rules each consumer, route, service, listener and the gateway attach; credentials,
  // exempt paths, and routes in match order.
  void attach_scopes(const PolicyConfig& config,
                     absl::flat_hash_map<std::string, RuleList>& bundle_rules) {
    auto attach = [&](const std::vector<std::string>& names) {
      RuleList out;
      for (const std::string& name : names) {
        for (std::uint32_t r : bundle_rules[name]) out.push_back(r);
      }
      return out;
    };
    for (const Consumer& c : config.consumers) {
      consumer_rules_[c.name] = attach(c.policies);
      for (const std::string& credential : c.credentials) credentials_[credential] = c.name;
    }
    for (std::size_t i = 0; i < config.routes.size(); ++i) {
      const Route& r = config.routes[i];
      route_rules_[r.name] = attach(r.policies);
      route_scopes_[r.name] = {.index = static_cast<std::uint32_t>(i), .service = r.service};
    }
    if (route_scopes_.size() <= kFewRoutes) {
      few_routes_.assign(route_scopes_.begin(), route_scopes_.end());
    }
    for (const Service& s : config.services) service_rules_[s.name] = attach(s.policies);
    for (const Listener& l : config.listeners) listener_rules_[l.name] = attach(l.policies);
    global_rules_ = attach(config.gateway.global_policies);
    exempt_paths_ = config.gateway.exempt_paths;
    for (const std::string& path : exempt_paths_) {
      exempt_lengths_ |= std::uint64_t{1} << std::min<std::size_t>(path.size(), 63);
    }
    routes_ = config.routes;
    // Precedence for match_route: the longest prefix first; on equal prefixes a route bound to a
    // listener before one on every listener.
    std::stable_sort(routes_.begin(), routes_.end(), [](const Route& a, const Route& b) {
      if (a.path_prefix.size() != b.path_prefix.size()) {
        return a.path_prefix.size() > b.path_prefix.size();
      }
      return !a.listener.empty() && b.listener.empty();
    });
  }

  // The plans of requests without a consumer's rules: one per (route, listener) and per
  // (service of an unrouted request, listener), "none" included for each.
  void build_plans(const PolicyConfig& config) {
    for (std::size_t i = 0; i < config.services.size(); ++i) {
      service_index_[config.services[i].name] = static_cast<std::uint32_t>(i);
    }
    for (std::size_t i = 0; i < config.listeners.size(); ++i) {
      listener_index_[config.listeners[i].name] = static_cast<std::uint32_t>(i);
    }
    listeners_ = config.listeners.size() + 1;
    plans_.resize((config.routes.size() + config.services.size() + 1) * listeners_);
    auto plan = [&](const RuleList* route, const RuleList* service, std::size_t scope) {
      for (std::size_t l = 0; l < listeners_; ++l) {
        RuleGroup live, dry;
        for (const RuleList* rules : std::initializer_list<const RuleList*>{
                 route, service,
                 l < config.listeners.size() ? &listener_rules_[config.listeners[l].name] : nullptr,
                 &global_rules_}) {
          add_rules(rules, live, dry);
        }
        plans_[scope * listeners_ + l] = {RuleList(live.begin(), live.end()),
                                          RuleList(dry.begin(), dry.end())};
      }
    };
    for (std::size_t i = 0; i < config.routes.size(); ++i) {
      const Route& r = config.routes[i];
      plan(&route_rules_[r.name], r.service.empty() ? nullptr : &service_rules_[r.service], i);
    }
    for (std::size_t s = 0; s <= config.services.size(); ++s) {
      plan(nullptr, s < config.services.size() ? &service_rules_[config.services[s].name] : nullptr,
           config.routes.size() + s);
    }
  }

  // The plan of a request on `route` (null: none or unknown) or else `service`, on `listener`.
  std::size_t plan_index(const RouteScope* route, std::optional<std::string_view> service,
                         std::optional<std::string_view> listener) const {
    std::size_t scope = 0;
    if (route != nullptr) {
      scope = route->index;
    } else {
      const std::uint32_t* s = service ? find(service_index_, *service) : nullptr;
      scope = route_scopes_.size() + (s != nullptr ? *s : service_index_.size());
    }
    const std::uint32_t* l = listener ? find(listener_index_, *listener) : nullptr;
    return scope * listeners_ + (l != nullptr ? *l : listeners_ - 1);
  }

  std::vector<CompiledRule> compiled_;
  std::vector<RuleInfo> rules_;
  absl::flat_hash_map<std::string, std::size_t> by_fingerprint_;  // -> index into rules_
  absl::flat_hash_map<std::string, RuleList> consumer_rules_, route_rules_, service_rules_,
      listener_rules_;
  RuleList global_rules_;
  absl::flat_hash_map<std::string, RouteScope> route_scopes_;
  static constexpr std::size_t kFewRoutes = 8;
  std::vector<std::pair<std::string, RouteScope>> few_routes_;  // route_scopes_, if that few
  absl::flat_hash_map<std::string, std::uint32_t> service_index_, listener_index_;
  std::size_t listeners_ = 1;  // config listeners + 1 (none or unknown)
  std::vector<Plan> plans_;    // [scope × listeners_ + listener]
  std::vector<std::string> exempt_paths_;
  std::uint64_t exempt_lengths_ = 0;  // bit min(n, 63): some exempt path is n bytes long
  std::size_t max_selectors_ = 0;     // the most attributes a rule selects
  std::size_t prefix_size_ = 0;       // of every key: kRuleKeyPrefixSize, or 0 (per-rule state)
  std::vector<Route> routes_;         // in match_route's precedence order
  absl::flat_hash_map<std::string, std::string> credentials_;  // -> consumer
  ClientAddressResolver client_addresses_;  // gateway.trusted_proxies, ipv4_translation_prefixes
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_RULE_SET_HPP_
