// sluice/policy/model.hpp — the gateway policy model's types, ranges and compiled form.
//
// The aggregate structs of sluice/policy.hpp (which documents them with an example), the
// supported ranges every validated config keeps, and the canonical compiled rule the engine
// runs. Validation and compilation: sluice/policy/compile.hpp.
//
// Thread-safety: plain values (thread-compatible); every function is pure.
#ifndef SLUICE_POLICY_MODEL_HPP_
#define SLUICE_POLICY_MODEL_HPP_

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/adaptive.hpp"
#include "sluice/backend_config.hpp"
#include "sluice/client_address.hpp"
#include "sluice/detail/text.hpp"
#include "sluice/key.hpp"
#include "sluice/window.hpp"

namespace sluice {

// --- the model
// ------------------------------------------------------------------------------------

// One component of a rule's key. The components of a rule join into ONE key, so [ip, route] limits
// each (client ip, route) pair on its own. Order in the config does not matter.
enum class Selector {
  kIp,          // the client's IP address
  kCredential,  // the request's credential; the client ip until the request carries one
  kRoute,       // the matched route; unrouted traffic has its own route component
};

constexpr std::string_view to_string(Selector selector) noexcept {
  switch (selector) {
    case Selector::kIp:
      return "ip";
    case Selector::kCredential:
      return "credential";
    case Selector::kRoute:
      return "route";
  }
  return "unknown";
}

// "ip", "credential" or "route"; nullopt for anything else.
constexpr std::optional<Selector> parse_selector(std::string_view text) noexcept {
  if (text == "ip") return Selector::kIp;
  if (text == "credential") return Selector::kCredential;
  if (text == "route") return Selector::kRoute;
  return std::nullopt;
}

// Sustained rates; each set field is one stacked window. At least one must be set, each > 0.
struct RequestsPer {
  std::optional<std::uint64_t> s{};       // requests per second
  std::optional<std::uint64_t> minute{};  // requests per 60 s
  std::optional<std::uint64_t> hour{};    // requests per 3600 s

  friend bool operator==(const RequestsPer&, const RequestsPer&) = default;
};

// One rate-limit rule of a bundle (`policies[].rate_limits[]`).
struct Rule {
  std::string name{};                    // optional label; identifies the rule across reloads
  std::vector<Selector> selector{};      // non-empty, no duplicates
  RequestsPer requests_per{};            // at least one window
  std::optional<std::uint64_t> burst{};  // bucket of the shortest window; default: its requests
  // How much of the client address keys `ip` (and the address fallback of `credential`); default:
  // the gateway's address_prefixes.
  std::optional<AddressPrefixes> address_prefixes{};
  // Scales the rule's limit with its upstream's health (sluice/adaptive.hpp); the engine feeds it
  // through `record_upstream`. Requests per window and burst are then at most kMaxAdaptiveCount.
  std::optional<AdaptivePolicy> adaptive{};
  // kFixedWindow: each window admits its requests per period; `burst` must then be absent or
  // equal the shortest window's requests (a fixed window has no bucket beyond its count), and the
  // rule must not be adaptive.
  Algorithm algorithm = Algorithm::kGcra;

  friend bool operator==(const Rule&, const Rule&) = default;
};

// The legacy single-window form (`policies[].rate_limit`): compiles to one rule with selector
// [route], `requests` per `window_seconds`, burst = requests.
struct LegacyRateLimit {
  std::uint64_t requests = 0;        // 1 ... kMaxRequestsPerWindow
  std::uint64_t window_seconds = 0;  // 1 ... kMaxWindowSeconds

  friend bool operator==(const LegacyRateLimit&, const LegacyRateLimit&) = default;
};

// A named set of rules (`policies[]`). Needs `rate_limits`, `rate_limit` or both (both apply).
struct Bundle {
  std::string name{};                           // non-empty, unique among bundles
  std::vector<Rule> rate_limits{};              // all rules AND together
  std::optional<LegacyRateLimit> rate_limit{};  // legacy; applies in addition to rate_limits
  bool dry_run = false;  // evaluate and report would-be denials, never enforce

  friend bool operator==(const Bundle&, const Bundle&) = default;
};

// An authenticated caller (`consumers[]`).
struct Consumer {
  std::string name{};                      // non-empty, unique among consumers
  std::vector<std::string> credentials{};  // e.g. bearer tokens; each non-empty, one owner
  std::vector<std::string> policies{};     // attached bundle names

  friend bool operator==(const Consumer&, const Consumer&) = default;
};

// A route (`routes[]`). A request matches the route with the longest `path_prefix` that starts
// its path, among routes whose `listener` is empty or is the request's listener; a request that
// matches none is unrouted (listener and global bundles still apply).
struct Route {
  std::string name{};         // non-empty, unique among routes
  std::string service{};      // optional; names a service in `services` when set
  std::string listener{};     // optional; names a listener in `listeners` when set
  std::string path_prefix{};  // optional; starts with '/' when set ("" never matches)
  // false: `path_prefix` matches with ASCII letters in either case, and with the letters outside
  // ASCII that fold to one (dotless i, long s, ...) as that letter, for an upstream that routes
  // without regard to case (where /LOGIN is served as /login); requires a path_prefix.
  bool case_sensitive = true;
  std::vector<std::string> policies{};  // attached bundle names

  friend bool operator==(const Route&, const Route&) = default;
};

// An upstream service that routes forward to (`services[]`).
struct Service {
  std::string name{};                   // non-empty, unique among services
  std::vector<std::string> policies{};  // attached bundle names

  friend bool operator==(const Service&, const Service&) = default;
};

// A listening endpoint of the gateway (`listeners[]`).
struct Listener {
  std::string name{};                   // non-empty, unique among listeners
  std::vector<std::string> policies{};  // attached bundle names

  friend bool operator==(const Listener&, const Listener&) = default;
};

// Gateway-wide settings (`gateway`).
struct Gateway {
  std::vector<std::string> global_policies{};  // bundles applied to every non-exempt request
  // Request paths (exact match) that no rule applies to and that get no rate-limit fields.
  std::vector<std::string> exempt_paths = {"/healthz", "/readyz", "/metrics"};
  // The default network prefix that identifies a client: an IPv4 address by /32, an IPv6 client
  // by its /64 (one host usually holds a whole /64). Rules may override it.
  AddressPrefixes address_prefixes{};
  // Proxies (CIDR, e.g. "10.0.0.0/8") whose Forwarded / X-Forwarded-For headers the gateway
  // believes; empty: every client is its peer. Used by the gateway's ClientAddressResolver.
  std::vector<std::string> trusted_proxies{};
  // IPv6 prefixes of stateless translators (SIIT, NAT46; e.g. "2001:db8:46::/96", lengths 32,
  // 40, 48, 56, 64 or 96) that present IPv4 clients to an IPv6-only gateway: such a client is
  // the IPv4 address its address embeds, keyed under the IPv4 prefix. Without it every IPv4
  // client of the translator shares one IPv6 /64. 64:ff9b::/96 needs no listing.
  std::vector<std::string> ipv4_translation_prefixes{};

  friend bool operator==(const Gateway&, const Gateway&) = default;
};

// What a request denied by one rule costs in the rules that admitted it.
enum class ConsumptionMode {
  kAllOrNothing,  // nothing: a denied request consumes in no rule (default)
  kEveryRule,     // every admitting rule consumes even when another denies
};

// What the engine decides when a limiter backend fails (e.g. Redis unreachable).
enum class FailureMode {
  kFailOpen,    // admit the request (default)
  kFailClosed,  // deny the request
  // Decide the request in process on a share of every limit (EngineOptions::local_share_permille)
  // and report it degraded; try the backend again after EngineOptions::local_retry_interval_ms.
  kLocal,
};

constexpr std::string_view to_string(ConsumptionMode mode) noexcept {
  switch (mode) {
    case ConsumptionMode::kAllOrNothing:
      return "all_or_nothing";
    case ConsumptionMode::kEveryRule:
      return "every_rule";
  }
  return "unknown";
}
constexpr std::optional<ConsumptionMode> parse_consumption_mode(std::string_view text) noexcept {
  if (text == "all_or_nothing") return ConsumptionMode::kAllOrNothing;
  if (text == "every_rule") return ConsumptionMode::kEveryRule;
  return std::nullopt;
}
constexpr std::string_view to_string(FailureMode mode) noexcept {
  switch (mode) {
    case FailureMode::kFailOpen:
      return "fail_open";
    case FailureMode::kFailClosed:
      return "fail_closed";
    case FailureMode::kLocal:
      return "local";
  }
  return "unknown";
}
constexpr std::optional<FailureMode> parse_failure_mode(std::string_view text) noexcept {
  if (text == "fail_open") return FailureMode::kFailOpen;
  if (text == "fail_closed") return FailureMode::kFailClosed;
  if (text == "local") return FailureMode::kLocal;
  return std::nullopt;
}

// Engine options (`engine`).
struct EngineOptions {
  ConsumptionMode consumption = ConsumptionMode::kAllOrNothing;
  FailureMode on_backend_error = FailureMode::kFailOpen;
  // kLocal: the share of every limit that each replica enforces in process while the backend
  // fails, in permille (1 ... 1000): every window's requests and burst become
  // max(1, floor(n × permille / 1000)), periods unchanged. Required when on_backend_error is
  // kLocal (the right share depends on the replica count, e.g. 1000 / replicas, which the
  // library cannot know); ignored otherwise.
  std::optional<std::uint64_t> local_share_permille{};
  // kLocal: after a backend failure, requests are decided locally at once, and the backend is
  // tried again by at most one request per this interval (1 ... kMaxLocalRetryIntervalMs).
  std::uint64_t local_retry_interval_ms = 1000;

  friend bool operator==(const EngineOptions&, const EngineOptions&) = default;
};

// One config generation: every bundle and every scope that attaches them.
struct PolicyConfig {
  std::vector<Bundle> policies{};
  std::vector<Route> routes{};
  std::vector<Service> services{};
  std::vector<Listener> listeners{};
  std::vector<Consumer> consumers{};
  Gateway gateway{};
  EngineOptions engine{};
  BackendConfig backend{};  // where the state lives (sluice/backend_config.hpp); read at creation
  // Says that this config attaches no rule on purpose. A reloading holder refuses a config that
  // attaches no rule (a file read while still being written looks like that) unless it is set;
  // validate() refuses it on a config that attaches a rule, so that it cannot linger at the top
  // of a file whose truncated copy would then be applied.
  bool limits_nothing = false;

  friend bool operator==(const PolicyConfig&, const PolicyConfig&) = default;
};

// --- supported ranges
// -----------------------------------------------------------------------------

inline constexpr std::uint64_t kMaxRequestsPerWindow = std::uint64_t{1} << 32;
inline constexpr std::uint64_t kMaxWindowSeconds = std::uint64_t{365} * 24 * 3600;  // 31536000
inline constexpr std::uint64_t kMaxBurst = std::uint64_t{1} << 32;
inline constexpr std::uint64_t kMaxLocalRetryIntervalMs = 3'600'000;  // one hour
// An adaptive rule's limiter counts thousandths of a request, so its counts stay 1000 times
// below the limiters' range.
inline constexpr std::uint64_t kMaxAdaptiveCount = kMaxRequestsPerWindow / 1000;  // 4294967

// The largest burst for a window of `requests` per `period_seconds`: what it replenishes in
// kMaxWindowSeconds, and at most kMaxBurst. Requires 1 <= requests <= kMaxRequestsPerWindow and
// period_seconds >= 1 (the product is then below 2^57).
constexpr std::uint64_t max_burst(std::uint64_t requests, std::uint64_t period_seconds) noexcept {
  const std::uint64_t refills = requests * kMaxWindowSeconds / period_seconds;
  return refills < kMaxBurst ? refills : kMaxBurst;
}

// Size caps, checked by validate(): whatever a config file says, a config compiles in bounded
// memory (each rule owns a sharded store of about 25 KiB before it holds keys) and one request
// is evaluated against at most 5 × kMaxAttachedRules rules (one attachment list per scope).
inline constexpr std::size_t kMaxBundles = 1024;
inline constexpr std::size_t kMaxRulesPerBundle = 64;
inline constexpr std::size_t kMaxRules = 1024;        // over all bundles, legacy rules included
inline constexpr std::size_t kMaxAttachedRules = 32;  // rules attached by one attachment list
inline constexpr std::size_t kMaxRoutes = 4096;
inline constexpr std::size_t kMaxServices = 4096;
inline constexpr std::size_t kMaxListeners = 256;
inline constexpr std::size_t kMaxConsumers = 65536;
inline constexpr std::size_t kMaxCredentialsPerConsumer = 64;
inline constexpr std::size_t kMaxExemptPaths = 64;
inline constexpr std::size_t kMaxNameBytes = 256;         // any name
inline constexpr std::size_t kMaxPathBytes = 1024;        // path_prefix, exempt paths
inline constexpr std::size_t kMaxCredentialBytes = 4096;  // one credential

// --- compiled form
// --------------------------------------------------------------------------------

// One rule in canonical form.
struct CompiledRule {
  std::string bundle{};   // the owning bundle's name
  std::string name{};     // the rule's label ("" if unnamed or legacy)
  std::size_t index = 0;  // position in the bundle's rate_limits; rate_limits.size() for legacy
  bool legacy = false;    // compiled from `rate_limit`
  bool dry_run = false;   // the bundle's dry_run
  // For logs, metrics and header policy names: "<bundle>/<name>", "<bundle>/rate_limits[<index>]"
  // when unnamed, "<bundle>/rate_limit" for the legacy rule.
  std::string label{};
  std::vector<Selector> selector{};    // canonical order ip, credential, route; no duplicates
  AddressPrefixes address_prefixes{};  // the rule's, or else the gateway's
  std::vector<GcraWindow> windows{};   // shortest first, burst explicit; only windows[0] has the
                                       // rule's burst, every other window its requests
  std::optional<AdaptivePolicy> adaptive{};  // see Rule::adaptive
  // kFixedWindow: each window is a fixed window of `requests` per `period` (burst = requests).
  Algorithm algorithm = Algorithm::kGcra;
  // Identity for reload: equal fingerprints mean the engine may keep the rule's state. Covers the
  // bundle name, the rule's name (its position when unnamed; "legacy" for rate_limit), the
  // selector, every window with its burst, whether the rule is adaptive (its limiter counts in
  // thousandths of a request then) and its algorithm, not the adaptive parameters; not dry_run (a
  // rule moved from dry-run to enforcing keeps the buckets it has been filling). Names are encoded
  // with append_key_part (sluice/key.hpp), so it is unambiguous for any names.
  std::string fingerprint{};
  // The fingerprint without the windows: what decides which keys the rule has (bundle, rule
  // name or position, selector, address prefixes, adaptive, algorithm). A reload that changes only
  // a rule's windows (rates, bursts, window lengths) keeps its identity, and the engine carries
  // each key's spent share of the old windows into the new ones instead of starting it fresh.
  std::string identity{};

  friend bool operator==(const CompiledRule&, const CompiledRule&) = default;
};

// One bundle's rules in canonical form: rate_limits in declaration order, then the legacy rule.
struct CompiledBundle {
  std::string name{};
  bool dry_run = false;
  std::vector<CompiledRule> rules{};

  friend bool operator==(const CompiledBundle&, const CompiledBundle&) = default;
};

}  // namespace sluice

#endif  // SLUICE_POLICY_MODEL_HPP_
