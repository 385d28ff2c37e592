// sluice/policy/compile.hpp — validating a policy config and compiling its bundles.
//
// `validate` names the path of the first bad value of a PolicyConfig (sluice/policy/model.hpp);
// `compile_policies` turns every bundle of a valid config into canonical windows for the engine
// (see sluice/policy.hpp for an example). Internals in `detail`.
//
// Thread-safety: every function is pure.
#ifndef SLUICE_POLICY_COMPILE_HPP_
#define SLUICE_POLICY_COMPILE_HPP_

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "sluice/adaptive.hpp"
#include "sluice/client_address.hpp"
#include "sluice/detail/text.hpp"
#include "sluice/key.hpp"
#include "sluice/policy/model.hpp"
#include "sluice/request_path.hpp"
#include "sluice/window.hpp"

namespace sluice {

// --- implementation details
// -----------------------------------------------------------------------

namespace detail {

constexpr bool is_known(Selector selector) noexcept {
  return selector == Selector::kIp || selector == Selector::kCredential ||
         selector == Selector::kRoute;
}
constexpr bool is_known(ConsumptionMode mode) noexcept {
  return mode == ConsumptionMode::kAllOrNothing || mode == ConsumptionMode::kEveryRule;
}
constexpr bool is_known(FailureMode mode) noexcept {
  return mode == FailureMode::kFailOpen || mode == FailureMode::kFailClosed ||
         mode == FailureMode::kLocal;
}

// InvalidArgument with the concatenation of `parts` (absl::StrCat).
template <class... Parts>
absl::Status invalid(const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// Routes and exempt paths are matched on normalized paths (sluice/request_path.hpp), so a prefix
// or exempt path that normalization would change, or that holds a '?' or '#' (a path ends before
// either), matches no request: OK, or InvalidArgument saying why and, where there is one, what to
// write instead. `kind` names it ("prefix", "path"). A prefix may end inside a segment ("/v1/it"),
// so it is checked with `probe_suffix` "x" after it; an exact path with "".
inline absl::Status check_normalized(std::string_view path, std::string_view kind,
                                     std::string_view probe_suffix) {
  if (path.find_first_of("?#") != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "can match no request: a request's path ends before '?' (the query) and '#' (the "
        "fragment), so a ",
        std::string(kind), " holds neither"));
  }
  const std::string probe = std::string(path) + std::string(probe_suffix);
  const absl::StatusOr<std::string> normalized = normalize_request_path(probe);
  if (!normalized.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("can match no request: ", normalized.status().message()));
  }
  if (*normalized == probe) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "can match no request: request paths are normalized before routes are matched (repeated '/' "
      "merged, dot segments removed, unreserved characters, sub-delims but ';', ':' and '@' "
      "decoded, other bytes percent-encoded in upper case); write ",
      quoted(std::string_view(*normalized).substr(0, normalized->size() - probe_suffix.size()))));
}

inline absl::Status check_normalized_prefix(std::string_view prefix) {
  return check_normalized(prefix, "prefix", "x");
}

// "<path>.<member>[<i>]"
inline std::string element(std::string_view path, std::string_view member, std::size_t i) {
  std::string out(path);
  if (!out.empty()) out.push_back('.');
  out.append(member);
  out.push_back('[');
  out.append(std::to_string(i));
  out.push_back(']');
  return out;
}

inline std::string member(std::string_view path, std::string_view name) {
  std::string out(path);
  out.push_back('.');
  out.append(name);
  return out;
}

inline absl::Status check_name(std::string_view name, const std::string& path, bool required) {
  if (required && name.empty()) return invalid(path, " must not be empty");
  if (name.size() > kMaxNameBytes) {
    return invalid(path, " must be at most ", kMaxNameBytes, " bytes, got ", name.size());
  }
  if (!printable(name)) {
    return invalid(
        path, ": ",
        detail::quoted(name) + " must contain only printable ASCII characters (0x20-0x7E)");
  }
  return absl::OkStatus();
}

// Index of every name in `items` (first occurrence); fails on duplicates and bad names.
template <class T>
absl::Status index_names(const std::vector<T>& items, std::string_view list, std::string_view kind,
                         std::unordered_map<std::string_view, std::size_t>& index) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    std::string path = element("", list, i) + ".name";
    if (absl::Status s = check_name(items[i].name, path, /*required=*/true); !s.ok()) return s;
    auto [it, inserted] = index.emplace(items[i].name, i);
    if (!inserted) {
      return invalid(path, ": duplicate ", std::string(kind),
                     " name " + detail::quoted(items[i].name), " (also ",
                     element("", list, it->second) + ")");
    }
  }
  return absl::OkStatus();
}

// Name -> index of its first occurrence, for the names that other sections refer to.
using NameIndex = std::unordered_map<std::string_view, std::size_t>;

// The rules one bundle compiles to.
inline std::size_t rule_count(const Bundle& bundle) {
  return bundle.rate_limits.size() + (bundle.rate_limit.has_value() ? 1 : 0);
}

// `path` is the attachment list itself, e.g. "routes[2].policies". Linear in the list's length.
inline absl::Status check_attachments(const std::vector<std::string>& names, std::string_view path,
                                      const NameIndex& bundles,
                                      const std::vector<Bundle>& policies) {
  NameIndex attached;
  std::size_t rules = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::string at = absl::StrCat(std::string(path), "[", i, "]");
    auto bundle = bundles.find(names[i]);
    if (bundle == bundles.end()) {
      return invalid(at, ": unknown bundle ", detail::quoted(names[i]));
    }
    auto [it, inserted] = attached.emplace(names[i], i);
    if (!inserted) {
      return invalid(at, ": bundle ", detail::quoted(names[i]), " is already attached at ",
                     std::string(path), "[", it->second, "]");
    }
    rules += rule_count(policies[bundle->second]);
  }
  if (rules > kMaxAttachedRules) {
    return invalid(std::string(path), " attaches ", rules, " rules; at most ", kMaxAttachedRules,
                   " are supported");
  }
  return absl::OkStatus();
}

// `items.size() <= maximum`, else "<section>: at most <maximum> <what> are supported, got <n>".
template <class T>
absl::Status check_size(const std::vector<T>& items, std::string_view section, std::size_t maximum,
                        std::string_view what) {
  if (items.size() <= maximum) return absl::OkStatus();
  return invalid(std::string(section), ": at most ", maximum, " ", std::string(what),
                 " are supported, got ", items.size());
}

inline absl::Status check_count(std::uint64_t value, const std::string& path,
                                std::uint64_t maximum) {
  if (value == 0) return invalid(path, " must be > 0");
  if (value > maximum) return invalid(path, " must be <= ", maximum);
  return absl::OkStatus();
}

struct WindowSpec {
  std::string_view field;  // "s", "minute", "hour"
  std::uint64_t period_seconds;
  std::optional<std::uint64_t> RequestsPer::*requests;
};
inline constexpr std::array<WindowSpec, 3> kWindowSpecs{{
    {"s", 1, &RequestsPer::s},
    {"minute", 60, &RequestsPer::minute},
    {"hour", 3600, &RequestsPer::hour},
}};

// `path` names the prefixes, e.g. "gateway.address_prefixes".
inline absl::Status check_prefixes(const AddressPrefixes& prefixes, const std::string& path) {
  if (prefixes.ipv4 < 0 || prefixes.ipv4 > 32) {
    return invalid(path, ".ipv4 must be in [0, 32], got ", prefixes.ipv4);
  }
  if (prefixes.ipv6 < 0 || prefixes.ipv6 > 128) {
    return invalid(path, ".ipv6 must be in [0, 128], got ", prefixes.ipv6);
  }
  return absl::OkStatus();
}

// A fixed-window rule has no bucket beyond its count: its burst, if set, equals its shortest
// window's requests (never silently another meaning than with GCRA); it is not adaptive.
inline absl::Status check_algorithm(const Rule& rule, const WindowSpec& shortest,
                                    const std::string& path) {
  if (rule.algorithm != Algorithm::kFixedWindow) return absl::OkStatus();
  const std::uint64_t requests = *(rule.requests_per.*shortest.requests);
  if (rule.burst.has_value() && *rule.burst != requests) {
    return invalid(path, ".burst must equal the requests of the shortest window (", requests,
                   ") in a fixed_window rule, or be absent");
  }
  return rule.adaptive ? invalid(path, ".adaptive needs algorithm gcra") : absl::OkStatus();
}

inline absl::Status validate_rule(const Rule& rule, const std::string& path) {
  if (absl::Status s = check_name(rule.name, path + ".name", /*required=*/false); !s.ok()) {
    return s;
  }
  if (rule.selector.empty()) return invalid(path, ".selector must not be empty");
  for (std::size_t i = 0; i < rule.selector.size(); ++i) {
    std::string at = element(path, "selector", i);
    if (!is_known(rule.selector[i])) {
      return invalid(
          at, ": unknown selector " + std::to_string(static_cast<long long>(rule.selector[i])));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (rule.selector[j] == rule.selector[i]) {
        return invalid(at, ": duplicate selector \"",
                       std::string(to_string(rule.selector[i])) + "\"");
      }
    }
  }
  const WindowSpec* shortest = nullptr;
  for (const WindowSpec& spec : kWindowSpecs) {
    const std::optional<std::uint64_t>& requests = rule.requests_per.*spec.requests;
    if (!requests.has_value()) continue;
    std::string at = path + ".requests_per." + std::string(spec.field);
    const std::uint64_t most = rule.adaptive ? kMaxAdaptiveCount : kMaxRequestsPerWindow;
    if (absl::Status s = check_count(*requests, at, most); !s.ok()) return s;
    if (shortest == nullptr) shortest = &spec;
  }
  if (shortest == nullptr) {
    return invalid(path, ".requests_per must set at least one of s, minute, hour");
  }
  if (rule.burst.has_value()) {
    if (*rule.burst == 0) return invalid(path, ".burst must be >= 1");
    std::uint64_t limit =
        max_burst(*(rule.requests_per.*shortest->requests), shortest->period_seconds);
    if (*rule.burst > limit) {
      return invalid(path, ".burst must be <= ", limit,
                     limit == kMaxBurst ? " (the largest supported burst)"
                                        : " (a full bucket must refill within 365 days)");
    }
    if (rule.adaptive && *rule.burst > kMaxAdaptiveCount) {
      return invalid(path, ".burst must be <= ", kMaxAdaptiveCount, " in an adaptive rule");
    }
  }
  if (rule.adaptive) {
    if (absl::Status s = rule.adaptive->validate(path + ".adaptive."); !s.ok()) return s;
  }
  if (absl::Status s = check_algorithm(rule, *shortest, path); !s.ok()) return s;
  if (rule.address_prefixes.has_value()) {
    return check_prefixes(*rule.address_prefixes, path + ".address_prefixes");
  }
  return absl::OkStatus();
}

inline absl::Status validate_legacy(const LegacyRateLimit& legacy, const std::string& path) {
  if (absl::Status s = check_count(legacy.requests, path + ".requests", kMaxRequestsPerWindow);
      !s.ok()) {
    return s;
  }
  return check_count(legacy.window_seconds, path + ".window_seconds", kMaxWindowSeconds);
}

// The windows part of a fingerprint: ";windows=" then each as requests/period ns/burst.
inline void append_fingerprint_windows(std::string& f, const std::vector<GcraWindow>& windows) {
  f += ";windows=";
  for (std::size_t i = 0; i < windows.size(); ++i) {
    if (i > 0) f.push_back(',');
    f += std::to_string(windows[i].requests) + "/" + std::to_string(windows[i].period.count()) +
         "ns/" + std::to_string(windows[i].burst);
  }
}

// Assumes `rule_windows` and `selector` are valid; canonicalizes and fingerprints.
inline CompiledRule make_rule(const Bundle& bundle, std::string name, std::size_t index,
                              bool legacy, std::vector<Selector> selector,
                              std::vector<GcraWindow> windows, AddressPrefixes prefixes,
                              std::optional<AdaptivePolicy> adaptive = std::nullopt,
                              Algorithm algorithm = Algorithm::kGcra) {
  std::sort(selector.begin(), selector.end());
  std::sort(windows.begin(), windows.end(),
            [](const GcraWindow& a, const GcraWindow& b) { return a.period < b.period; });
  CompiledRule rule;
  rule.bundle = bundle.name;
  rule.index = index;
  rule.legacy = legacy;
  rule.dry_run = bundle.dry_run;
  rule.label = bundle.name + "/";
  if (legacy) {
    rule.label += "rate_limit";
  } else if (name.empty()) {
    rule.label += "rate_limits[" + std::to_string(index) + "]";
  } else {
    rule.label += name;
  }

  std::string& f = rule.fingerprint;
  f = "sluice.rule.v1;bundle=";
  append_key_part(f, bundle.name);
  if (legacy) {
    f += ";rule=legacy";
  } else if (name.empty()) {
    f += ";rule=index:" + std::to_string(index);
  } else {
    f += ";rule=name:";
    append_key_part(f, name);
  }
  f += ";selector=";
  for (std::size_t i = 0; i < selector.size(); ++i) {
    if (i > 0) f.push_back(',');
    f.append(to_string(selector[i]));
  }
  const std::size_t windows_at = f.size();
  append_fingerprint_windows(f, windows);
  const std::size_t windows_end = f.size();
  // Address prefixes change what a key means: a rule keyed on addresses starts fresh when they
  // change. The default adds nothing, so default fingerprints read as before prefixes existed.
  const bool keys_addresses = selector.front() != Selector::kRoute;  // has ip or credential
  if (keys_addresses && prefixes != AddressPrefixes{}) {
    absl::StrAppend(&f, ";prefixes=", prefixes.ipv4, "/", prefixes.ipv6);
  }
  if (adaptive) f += ";adaptive";
  if (algorithm == Algorithm::kFixedWindow) f += ";algorithm=fixed_window";
  rule.algorithm = algorithm;
  rule.identity = f.substr(0, windows_at) + f.substr(windows_end);
  rule.adaptive = adaptive;

  rule.address_prefixes = prefixes;
  rule.name = std::move(name);
  rule.selector = std::move(selector);
  rule.windows = std::move(windows);
  return rule;
}

// Assumes `bundle` passed validate_bundle.
inline CompiledBundle compile_valid_bundle(const Bundle& bundle, const AddressPrefixes& defaults) {
  CompiledBundle out{.name = bundle.name, .dry_run = bundle.dry_run, .rules = {}};
  out.rules.reserve(bundle.rate_limits.size() + (bundle.rate_limit.has_value() ? 1 : 0));
  for (std::size_t i = 0; i < bundle.rate_limits.size(); ++i) {
    const Rule& rule = bundle.rate_limits[i];
    std::vector<GcraWindow> windows;
    for (const WindowSpec& spec : kWindowSpecs) {
      const std::optional<std::uint64_t>& requests = rule.requests_per.*spec.requests;
      if (!requests.has_value()) continue;
      windows.push_back(GcraWindow{.requests = *requests,
                                   .period = std::chrono::seconds(spec.period_seconds),
                                   .burst = *requests});
    }
    // kWindowSpecs is shortest first, so windows[0] is the shortest: it alone takes the burst.
    if (rule.burst.has_value()) windows.front().burst = *rule.burst;
    out.rules.push_back(make_rule(bundle, rule.name, i, /*legacy=*/false, rule.selector,
                                  std::move(windows), rule.address_prefixes.value_or(defaults),
                                  rule.adaptive, rule.algorithm));
  }
  if (bundle.rate_limit.has_value()) {
    const LegacyRateLimit& legacy = *bundle.rate_limit;
    std::vector<GcraWindow> windows{
        GcraWindow{.requests = legacy.requests,
                   .period = std::chrono::seconds(legacy.window_seconds),
                   .burst = legacy.requests}};
    out.rules.push_back(make_rule(bundle, "", bundle.rate_limits.size(), /*legacy=*/true,
                                  {Selector::kRoute}, std::move(windows), defaults));
  }
  return out;
}

}  // namespace detail

// --- validation and compilation
// -------------------------------------------------------------------

// Checks one bundle on its own; `path` prefixes every message (validate() passes "policies[i]").
// Does not check that the bundle's name is unique (only a whole config can).
inline absl::Status validate_bundle(const Bundle& bundle, std::string_view path = "bundle") {
  std::string base(path);
  if (absl::Status s = detail::check_name(bundle.name, base + ".name", /*required=*/true);
      !s.ok()) {
    return s;
  }
  if (bundle.rate_limits.empty() && !bundle.rate_limit.has_value()) {
    return detail::invalid(base, " must set rate_limits or rate_limit");
  }
  if (absl::Status s = detail::check_size(bundle.rate_limits, absl::StrCat(base, ".rate_limits"),
                                          kMaxRulesPerBundle, "rules per bundle");
      !s.ok()) {
    return s;
  }
  // Label (the part after "<bundle>/") -> path of the rule that has it. Rule names hold no '/', so
  // "<bundle>/<label>" splits at its last '/' and no two rules of a config print one label.
  std::unordered_map<std::string, std::string> labels;
  if (bundle.rate_limit.has_value()) labels.emplace("rate_limit", base + ".rate_limit");
  std::unordered_map<std::string_view, std::size_t> rule_names;
  for (std::size_t i = 0; i < bundle.rate_limits.size(); ++i) {
    const Rule& rule = bundle.rate_limits[i];
    std::string at = detail::element(base, "rate_limits", i);
    if (absl::Status s = detail::validate_rule(rule, at); !s.ok()) return s;
    if (rule.name.find('/') != std::string::npos) {
      return detail::invalid(at, ".name: ", detail::quoted(rule.name), " must not contain '/'");
    }
    if (!rule.name.empty()) {
      auto [it, inserted] = rule_names.emplace(rule.name, i);
      if (!inserted) {
        return detail::invalid(at, ".name: duplicate rule name ", detail::quoted(rule.name),
                               " (also ", detail::element(base, "rate_limits", it->second), ")");
      }
    }
    std::string label = rule.name.empty() ? absl::StrCat("rate_limits[", i, "]") : rule.name;
    auto [it, inserted] = labels.emplace(std::move(label), at);
    if (!inserted) {
      return detail::invalid(at, ": label ", detail::quoted(bundle.name + "/" + it->first),
                             " is also the label of ", it->second);
    }
  }
  if (bundle.rate_limit.has_value()) {
    return detail::validate_legacy(*bundle.rate_limit, base + ".rate_limit");
  }
  return absl::OkStatus();
}

namespace detail {

// The `policies` of each element of `items` (services, listeners): every name a known bundle.
template <class Item>
absl::Status check_each_attachments(const std::vector<Item>& items, std::string_view section,
                                    const NameIndex& bundles, const std::vector<Bundle>& policies) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string at = absl::StrCat(detail::element("", section, i), ".policies");
    if (absl::Status s = detail::check_attachments(items[i].policies, at, bundles, policies);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// The size caps of the whole config (kMaxBundles, kMaxRules, ...), before anything else.
inline absl::Status check_sizes(const PolicyConfig& config) {
  absl::Status s = check_size(config.policies, "policies", kMaxBundles, "bundles");
  std::size_t rules = 0;
  for (std::size_t i = 0; s.ok() && i < config.policies.size(); ++i) {
    s = check_size(config.policies[i].rate_limits,
                   absl::StrCat(element("", "policies", i), ".rate_limits"), kMaxRulesPerBundle,
                   "rules per bundle");
    rules += rule_count(config.policies[i]);
  }
  if (s.ok() && rules > kMaxRules) {
    s = invalid("policies: at most ", kMaxRules, " rules in all are supported, got ", rules);
  }
  if (s.ok()) s = check_size(config.routes, "routes", kMaxRoutes, "routes");
  if (s.ok()) s = check_size(config.services, "services", kMaxServices, "services");
  if (s.ok()) s = check_size(config.listeners, "listeners", kMaxListeners, "listeners");
  if (s.ok()) s = check_size(config.consumers, "consumers", kMaxConsumers, "consumers");
  for (std::size_t i = 0; s.ok() && i < config.consumers.size(); ++i) {
    s = check_size(config.consumers[i].credentials,
                   absl::StrCat(element("", "consumers", i), ".credentials"),
                   kMaxCredentialsPerConsumer, "credentials per consumer");
  }
  if (s.ok()) {
    s = check_size(config.gateway.exempt_paths, "gateway.exempt_paths", kMaxExemptPaths,
                   "exempt paths");
  }
  return s;
}

// The path prefixes of the routes validated so far, per listener, to find a route whose paths
// an earlier route on its listener matches already. Listener names are printable ASCII, so '\0'
// separates a key's two parts unambiguously.
struct RoutePrefixes {
  struct Folded {
    std::size_t first = 0;                     // the first route with this prefix in any case
    std::optional<std::size_t> insensitive{};  // the first of those that is not case_sensitive
  };
  std::unordered_map<std::string, std::size_t> exact;  // listener '\0' path_prefix -> route
  std::unordered_map<std::string, Folded> folded;      // listener '\0' lower-case path_prefix
};

inline absl::Status check_path_prefix(const Route& route, std::size_t i, const std::string& base,
                                      RoutePrefixes& prefixes);

inline absl::Status validate_route(const Route& route, std::size_t i, const NameIndex& services,
                                   const NameIndex& listeners, const NameIndex& bundles,
                                   const std::vector<Bundle>& policies, RoutePrefixes& prefixes) {
  const std::string base = detail::element("", "routes", i);
  if (!route.service.empty() && !services.contains(route.service)) {
    return detail::invalid(base, ".service: unknown service ", detail::quoted(route.service));
  }
  if (!route.listener.empty() && !listeners.contains(route.listener)) {
    return detail::invalid(base, ".listener: unknown listener ", detail::quoted(route.listener));
  }
  if (!route.path_prefix.empty()) {
    if (absl::Status s = check_path_prefix(route, i, base, prefixes); !s.ok()) return s;
  } else if (!route.case_sensitive) {
    return detail::invalid(base,
                           ".case_sensitive: is false, but the route has no path_prefix to "
                           "match; remove case_sensitive or set a path_prefix");
  }
  return detail::check_attachments(route.policies, absl::StrCat(base, ".policies"), bundles,
                                   policies);
}

// Route `i`'s path_prefix: within bounds, normalized, and matching paths that no earlier route on
// its listener matches at the same length: not the same prefix, nor one that differs only in case
// when either route is not case_sensitive (the two would match the same paths).
inline absl::Status check_path_prefix(const Route& route, std::size_t i, const std::string& base,
                                      RoutePrefixes& prefixes) {
  const std::string& prefix = route.path_prefix;
  if (prefix.size() > kMaxPathBytes) {
    return detail::invalid(base, ".path_prefix must be at most ", kMaxPathBytes, " bytes, got ",
                           prefix.size());
  }
  if (prefix.front() != '/' || !detail::printable(prefix)) {
    return detail::invalid(base, ".path_prefix: ", detail::quoted(prefix),
                           " must start with '/' and contain only printable ASCII characters");
  }
  if (absl::Status s = detail::check_normalized_prefix(prefix); !s.ok()) {
    return detail::invalid(base, ".path_prefix: ", detail::quoted(prefix), " ", s.message());
  }
  const std::string listener = absl::StrCat(route.listener, std::string(1, '\0'));
  if (auto [it, inserted] = prefixes.exact.emplace(listener + prefix, i); !inserted) {
    return detail::invalid(base, ".path_prefix: ", detail::quoted(prefix),
                           " is already matched by ", detail::element("", "routes", it->second),
                           " on the same listener");
  }
  auto [it, inserted] = prefixes.folded.try_emplace(listener + absl::AsciiStrToLower(prefix),
                                                    RoutePrefixes::Folded{.first = i});
  const std::optional<std::size_t> earlier =
      inserted ? std::nullopt
               : (route.case_sensitive ? it->second.insensitive : std::optional(it->second.first));
  if (earlier) {
    return detail::invalid(base, ".path_prefix: ", detail::quoted(prefix),
                           " is already matched by ", detail::element("", "routes", *earlier),
                           " on the same listener (the prefixes differ only in case, and ",
                           detail::element("", "routes", route.case_sensitive ? *earlier : i),
                           " sets case_sensitive: false)");
  }
  if (!route.case_sensitive) it->second.insensitive = i;
  return absl::OkStatus();
}

inline absl::Status validate_routes(const PolicyConfig& config, const NameIndex& services,
                                    const NameIndex& listeners, const NameIndex& bundles) {
  NameIndex routes;
  if (absl::Status s = detail::index_names(config.routes, "routes", "route", routes); !s.ok()) {
    return s;
  }
  RoutePrefixes prefixes;
  for (std::size_t i = 0; i < config.routes.size(); ++i) {
    if (absl::Status s = validate_route(config.routes[i], i, services, listeners, bundles,
                                        config.policies, prefixes);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

inline absl::Status validate_consumers(const PolicyConfig& config, const NameIndex& bundles) {
  NameIndex consumers;
  if (absl::Status s = detail::index_names(config.consumers, "consumers", "consumer", consumers);
      !s.ok()) {
    return s;
  }
  // Credential -> path of its first occurrence. Messages never echo a credential: it is a secret.
  std::unordered_map<std::string_view, std::string> credentials;
  for (std::size_t i = 0; i < config.consumers.size(); ++i) {
    const Consumer& consumer = config.consumers[i];
    const std::string base = detail::element("", "consumers", i);
    for (std::size_t j = 0; j < consumer.credentials.size(); ++j) {
      std::string at = detail::element(base, "credentials", j);
      if (consumer.credentials[j].empty()) {
        return detail::invalid(at, " must not be empty");
      }
      if (consumer.credentials[j].size() > kMaxCredentialBytes) {
        return detail::invalid(at, " must be at most ", kMaxCredentialBytes, " bytes, got ",
                               consumer.credentials[j].size());
      }
      auto [it, inserted] = credentials.emplace(consumer.credentials[j], at);
      if (!inserted) {
        return detail::invalid(at, ": duplicate credential (also ", it->second, ")");
      }
    }
    if (absl::Status s = detail::check_attachments(
            consumer.policies, absl::StrCat(base, ".policies"), bundles, config.policies);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

inline absl::Status validate_gateway(const Gateway& gateway, const NameIndex& bundles,
                                     const std::vector<Bundle>& policies) {
  if (absl::Status s = detail::check_attachments(gateway.global_policies, "gateway.global_policies",
                                                 bundles, policies);
      !s.ok()) {
    return s;
  }
  for (std::size_t i = 0; i < gateway.exempt_paths.size(); ++i) {
    const std::string& exempt = gateway.exempt_paths[i];
    const std::string at = detail::element("gateway", "exempt_paths", i);
    if (exempt.size() > kMaxPathBytes) {
      return detail::invalid(at, " must be at most ", kMaxPathBytes, " bytes, got ", exempt.size());
    }
    if (exempt.empty() || exempt.front() != '/') {
      return detail::invalid(at, ": ", detail::quoted(exempt), " must start with '/'");
    }
    if (!detail::printable(exempt)) {
      return detail::invalid(at, ": ", detail::quoted(exempt),
                             " must contain only printable ASCII characters (0x20-0x7E)");
    }
    if (absl::Status s = detail::check_normalized(exempt, "path", ""); !s.ok()) {
      return detail::invalid(at, ": ", detail::quoted(exempt), " ", s.message());
    }
  }
  if (absl::Status s = check_prefixes(gateway.address_prefixes, "gateway.address_prefixes");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = check_size(gateway.trusted_proxies, "gateway.trusted_proxies",
                                  ClientAddressResolver::kMaxTrustedNetworks, "trusted proxies");
      !s.ok()) {
    return s;
  }
  std::vector<Cidr> proxies;
  for (std::size_t i = 0; i < gateway.trusted_proxies.size(); ++i) {
    absl::StatusOr<Cidr> cidr = Cidr::parse(gateway.trusted_proxies[i]);
    if (!cidr.ok()) {
      return detail::invalid(detail::element("gateway", "trusted_proxies", i), ": ",
                             cidr.status().message());
    }
    proxies.push_back(*cidr);
  }
  if (absl::Status s =
          check_size(gateway.ipv4_translation_prefixes, "gateway.ipv4_translation_prefixes",
                     ClientAddressResolver::kMaxTranslationPrefixes, "translation prefixes");
      !s.ok()) {
    return s;
  }
  for (std::size_t i = 0; i < gateway.ipv4_translation_prefixes.size(); ++i) {
    if (absl::StatusOr<Cidr> prefix =
            parse_ipv4_translation_prefix(gateway.ipv4_translation_prefixes[i]);
        !prefix.ok()) {
      return detail::invalid(detail::element("gateway", "ipv4_translation_prefixes", i), ": ",
                             prefix.status().message());
    }
  }
  return detail::check_some_address_untrusted(proxies, "gateway.trusted_proxies");
}

inline absl::Status validate_engine(const EngineOptions& engine) {
  if (!detail::is_known(engine.consumption)) {
    return detail::invalid("engine.consumption: unknown mode ",
                           static_cast<long long>(engine.consumption));
  }
  if (!detail::is_known(engine.on_backend_error)) {
    return detail::invalid("engine.on_backend_error: unknown mode ",
                           static_cast<long long>(engine.on_backend_error));
  }
  if (const std::optional<std::uint64_t>& share = engine.local_share_permille; share.has_value()) {
    if (*share == 0 || *share > 1000) {
      return detail::invalid("engine.local_share_permille must be in [1, 1000], got ", *share);
    }
  } else if (engine.on_backend_error == FailureMode::kLocal) {
    return detail::invalid(
        "engine.local_share_permille must be set when engine.on_backend_error is local (the "
        "permille of every limit each replica enforces alone, e.g. 1000 / replicas)");
  }
  if (engine.local_retry_interval_ms == 0 ||
      engine.local_retry_interval_ms > kMaxLocalRetryIntervalMs) {
    return detail::invalid("engine.local_retry_interval_ms must be in [1, ",
                           kMaxLocalRetryIntervalMs, "], got ", engine.local_retry_interval_ms);
  }
  return absl::OkStatus();
}

}  // namespace detail

namespace detail {

// The rules of every bundle attached at some scope (consumer, route, service, listener, global),
// each bundle once; dry-run bundles only if `dry_run_too`. Linear in the config's size.
inline std::size_t attached_rules(const PolicyConfig& config, bool dry_run_too) {
  std::unordered_set<std::string_view> attached;
  auto attach = [&](const std::vector<std::string>& names) {
    attached.insert(names.begin(), names.end());
  };
  for (const Consumer& c : config.consumers) attach(c.policies);
  for (const Route& r : config.routes) attach(r.policies);
  for (const Service& s : config.services) attach(s.policies);
  for (const Listener& l : config.listeners) attach(l.policies);
  attach(config.gateway.global_policies);
  std::size_t rules = 0;
  for (const Bundle& bundle : config.policies) {
    if (attached.contains(bundle.name) && (dry_run_too || !bundle.dry_run)) {
      rules += rule_count(bundle);
    }
  }
  return rules;
}

}  // namespace detail

// The rules that can apply to a request: those of every bundle attached at some scope (consumer,
// route, service, listener, global), each bundle once, dry-run bundles included. Linear in the
// config's size.
inline std::size_t attached_rule_count(const PolicyConfig& config) {
  return detail::attached_rules(config, true);
}

// The attached rules that are enforced: attached_rule_count without dry-run bundles, which only
// report. A config with none limits nothing. Linear in the config's size.
inline std::size_t enforced_rule_count(const PolicyConfig& config) {
  return detail::attached_rules(config, false);
}

namespace detail {

inline absl::Status validate_limits_nothing(const PolicyConfig& config) {
  if (!config.limits_nothing) return absl::OkStatus();
  const std::size_t rules = enforced_rule_count(config);
  if (rules == 0) return absl::OkStatus();
  return invalid("limits_nothing: is true, but the config enforces ", rules,
                 rules == 1 ? " rule" : " rules",
                 "; remove limits_nothing (it lets a config without rules replace a running one)");
}

}  // namespace detail

// Checks a whole config and returns the first problem as InvalidArgument naming its path, e.g.
// "policies[0].rate_limits[1].requests_per.s must be > 0" or
// "routes[2].policies[0]: unknown bundle \"x\"". Order: policies, services, listeners, routes,
// consumers, gateway, engine, backend, limits_nothing; within each, declaration order.
inline absl::Status validate(const PolicyConfig& config) {
  detail::NameIndex bundles, services, listeners;
  absl::Status s = detail::check_sizes(config);
  if (s.ok()) s = detail::index_names(config.policies, "policies", "bundle", bundles);
  for (std::size_t i = 0; s.ok() && i < config.policies.size(); ++i) {
    s = validate_bundle(config.policies[i], detail::element("", "policies", i));
  }
  if (s.ok()) s = detail::index_names(config.services, "services", "service", services);
  if (s.ok()) {
    s = detail::check_each_attachments(config.services, "services", bundles, config.policies);
  }
  if (s.ok()) s = detail::index_names(config.listeners, "listeners", "listener", listeners);
  if (s.ok()) {
    s = detail::check_each_attachments(config.listeners, "listeners", bundles, config.policies);
  }
  if (s.ok()) s = detail::validate_routes(config, services, listeners, bundles);
  if (s.ok()) s = detail::validate_consumers(config, bundles);
  if (s.ok()) s = detail::validate_gateway(config.gateway, bundles, config.policies);
  if (s.ok()) s = detail::validate_engine(config.engine);
  if (s.ok()) s = validate_backend(config.backend);
  if (s.ok()) s = detail::validate_limits_nothing(config);
  return s;
}

// Compiles one bundle after validate_bundle(bundle, path): each rule (rate_limits in order, then
// the legacy rate_limit) becomes windows sorted shortest period first, where windows[0].burst is
// the rule's burst (default: its requests) and every longer window's burst is its own requests.
inline absl::StatusOr<CompiledBundle> compile_bundle(const Bundle& bundle,
                                                     std::string_view path = "bundle") {
  if (absl::Status s = validate_bundle(bundle, path); !s.ok()) return s;
  return detail::compile_valid_bundle(bundle, AddressPrefixes{});
}

// Validates the whole config, then compiles every bundle, in declaration order.
inline absl::StatusOr<std::vector<CompiledBundle>> compile_policies(const PolicyConfig& config) {
  if (absl::Status s = validate(config); !s.ok()) return s;
  std::vector<CompiledBundle> out;
  out.reserve(config.policies.size());
  for (const Bundle& bundle : config.policies) {
    out.push_back(detail::compile_valid_bundle(bundle, config.gateway.address_prefixes));
  }
  return out;
}

// The windows a limiter keeps for `rule`: its own, or for an adaptive rule the same windows
// counted in thousandths of a request (requests and burst × 1000), so that the engine can take
// `adaptive_units(cost, factor)` per request and change the factor without touching any state.
inline std::vector<GcraWindow> limiter_windows(const CompiledRule& rule) {
  std::vector<GcraWindow> windows = rule.windows;
  if (rule.adaptive) {
    for (GcraWindow& w : windows) {
      w.burst = (w.burst == 0 ? w.requests : w.burst) * 1000;
      w.requests *= 1000;
    }
  }
  return windows;
}

}  // namespace sluice

#endif  // SLUICE_POLICY_COMPILE_HPP_
