// sluice/envoy/config.hpp — the limits an Envoy rate limit service enforces: per domain, a tree of
// descriptor entries with a limit at some of its nodes.
//
// This is the model the YAML loader (sluice/envoy/load_config.hpp) produces and the limiter
// (sluice/envoy/limiter.hpp) compiles; a program may also build it in code:
//
//   using namespace std::chrono_literals;
//   sluice::envoy::ServiceConfig config{.domains = {{
//       .domain = "edge",
//       .descriptors = {{.key = "remote_address",
//                        .rate_limit = sluice::envoy::Limit{
//                            .windows = {{.requests = 10, .period = 1s, .burst = 20}}}}}}}};
//
// A request's descriptor is a list of (key, value) entries. Its limit is found by walking the
// domain's tree one entry at a time: at each level a node whose key and value equal the entry's
// wins, then a node whose value ends in `*` and is a prefix of the entry's value (in
// configuration order), then a node with the entry's key and no value. The limit applies only
// if the walk reaches a node with a limit at the descriptor's last entry (the most specific
// match); a descriptor longer or shorter than the matching branch has no limit. A node without a
// value matches any value, and each value still gets its own counter: counters are keyed by the
// request's domain and entries, not by the node.
//
// Units and ranges: periods are integer nanoseconds (1 ns ... 2^55 ns, the limiters' range), a
// limit's requests and burst at most 2^32. Plain values: thread-compatible.
#ifndef SLUICE_ENVOY_CONFIG_HPP_
#define SLUICE_ENVOY_CONFIG_HPP_

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/window.hpp"

namespace sluice::envoy {

// The units of time of Envoy's protocol, with their values on the wire.
enum class Unit : int {
  kUnknown = 0,
  kSecond = 1,
  kMinute = 2,
  kHour = 3,
  kDay = 4,
  kMonth = 5,  // 30 days
  kYear = 6,   // 365 days
};

// The period of `unit`; 0 for kUnknown.
constexpr std::chrono::nanoseconds unit_period(Unit unit) noexcept {
  using std::chrono::hours;
  switch (unit) {
    case Unit::kSecond:
      return std::chrono::seconds(1);
    case Unit::kMinute:
      return std::chrono::minutes(1);
    case Unit::kHour:
      return hours(1);
    case Unit::kDay:
      return hours(24);
    case Unit::kMonth:
      return hours(24 * 30);
    case Unit::kYear:
      return hours(24 * 365);
    case Unit::kUnknown:
      break;
  }
  return std::chrono::nanoseconds(0);
}

constexpr std::string_view to_string(Unit unit) noexcept {
  switch (unit) {
    case Unit::kSecond:
      return "second";
    case Unit::kMinute:
      return "minute";
    case Unit::kHour:
      return "hour";
    case Unit::kDay:
      return "day";
    case Unit::kMonth:
      return "month";
    case Unit::kYear:
      return "year";
    case Unit::kUnknown:
      break;
  }
  return "unknown";
}

// "second", "MINUTE", ... (any case, as the reference service reads them); none for anything else,
// including "unknown".
inline std::optional<Unit> parse_unit(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (Unit u :
       {Unit::kSecond, Unit::kMinute, Unit::kHour, Unit::kDay, Unit::kMonth, Unit::kYear}) {
    if (lower == to_string(u)) return u;
  }
  return std::nullopt;
}

// A configured limit. `windows` are stacked: a hit is admitted only if every window admits it.
// A window with `requests` 0 admits nothing (the reference's `requests_per_unit: 0`).
struct Limit {
  std::string name{};  // reported in DescriptorStatus.current_limit.name; `replaces` refers to it
  bool unlimited = false;             // matches, never limits; `windows` is then empty
  std::vector<GcraWindow> windows{};  // at least one unless unlimited; burst 0 means requests
  // Names of limits this one replaces in the same request; each must be the name of a limit of
  // the same domain (the limiter refuses a configuration where one is not: it would replace
  // nothing).
  std::vector<std::string> replaces{};
  // kFixedWindow: every window is a fixed window of `requests` per `period` (sluice::Algorithm);
  // each window's burst must then be 0 or equal its requests.
  Algorithm algorithm = Algorithm::kGcra;
  friend bool operator==(const Limit&, const Limit&) = default;
};

// One node of a domain's tree.
struct DescriptorConfig {
  std::string key{};
  // Empty: any value (each value counted apart). Ending in `*`: any value starting with the rest.
  std::string value{};
  std::optional<Limit> rate_limit{};
  // The limit counts hits but never denies: its status is always OK.
  bool shadow_mode = false;
  std::vector<DescriptorConfig> descriptors{};
  friend bool operator==(const DescriptorConfig&, const DescriptorConfig&) = default;
};

struct DomainConfig {
  std::string domain{};
  std::vector<DescriptorConfig> descriptors{};
  std::string source{};  // where it was loaded from, for messages ("" when built in code)
  // A sluice extension: the configuration may have no limit that can deny on purpose (a reload
  // to one that has none, while the running one has, is refused without it in some domain).
  bool limits_nothing = false;
  friend bool operator==(const DomainConfig&, const DomainConfig&) = default;
};

// Every domain the service knows; a request for another domain is never limited.
struct ServiceConfig {
  std::vector<DomainConfig> domains{};
  friend bool operator==(const ServiceConfig&, const ServiceConfig&) = default;
};

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_CONFIG_HPP_
