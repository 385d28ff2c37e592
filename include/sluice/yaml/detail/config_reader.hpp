// Internal to sluice::yaml: reads a YAML document by the schema of sluice::PolicyConfig, one YAML
// key per struct member. Not thread-safe: one reader per load. O(nodes read).
#ifndef SLUICE_YAML_DETAIL_CONFIG_READER_HPP_
#define SLUICE_YAML_DETAIL_CONFIG_READER_HPP_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/policy.hpp"
#include "sluice/yaml/detail/error.hpp"
#include "sluice/yaml/detail/nesting.hpp"
#include "sluice/yaml/detail/node_reader.hpp"
#include "sluice/yaml/detail/one_document.hpp"
#include "yaml-cpp/yaml.h"

namespace sluice::yaml::detail {

// Remembers where every value it read sits, so that relocate() maps validate()'s paths back to a
// line and column.
class ConfigReader final : public NodeReader {
 public:
  PolicyConfig load(const YAML::Node& root) {
    PolicyConfig config;
    for (const Field& f : fields(root, "",
                                 {"policies", "routes", "services", "listeners", "consumers",
                                  "gateway", "engine", "backend", "limits_nothing"})) {
      if (f.key == "policies") {
        config.policies = read_list<Bundle>(f.value, f.path, &ConfigReader::read_bundle);
      } else if (f.key == "routes") {
        config.routes = read_list<Route>(f.value, f.path, &ConfigReader::read_route);
      } else if (f.key == "services") {
        config.services =
            read_list<Service>(f.value, f.path, &ConfigReader::read_attachable<Service>);
      } else if (f.key == "listeners") {
        config.listeners =
            read_list<Listener>(f.value, f.path, &ConfigReader::read_attachable<Listener>);
      } else if (f.key == "consumers") {
        config.consumers = read_list<Consumer>(f.value, f.path, &ConfigReader::read_consumer);
      } else if (f.key == "gateway") {
        config.gateway = read_gateway(f.value, f.path);
      } else if (f.key == "limits_nothing") {
        config.limits_nothing = read_bool(f.value, f.path);
      } else if (f.key == "backend") {
        config.backend = read_backend(f.value, f.path);
      } else {
        config.engine = read_engine(f.value, f.path);
      }
    }
    return config;
  }

 private:
  Selector read_selector(const YAML::Node& node, const std::string& path) {
    return read_enum(node, path, "selector", "ip, credential or route",
                     [](std::string_view s) { return parse_selector(s); });
  }

  RequestsPer read_requests_per(const YAML::Node& node, const std::string& path) {
    RequestsPer requests_per;
    for (const Field& w : fields(node, path, {"s", "minute", "hour"})) {
      const std::uint64_t requests = read_count(w.value, w.path);
      if (w.key == "s") {
        requests_per.s = requests;
      } else if (w.key == "minute") {
        requests_per.minute = requests;
      } else {
        requests_per.hour = requests;
      }
    }
    return requests_per;
  }

  // {ipv4: bits, ipv6: bits}; each defaults as in AddressPrefixes. validate() checks the ranges
  // (a count past any range is kept as the largest int, which validate() then reports).
  AddressPrefixes read_prefixes(const YAML::Node& node, const std::string& path) {
    AddressPrefixes prefixes;
    for (const Field& f : fields(node, path, {"ipv4", "ipv6"})) {
      const auto bits = static_cast<int>(
          std::min<std::uint64_t>(read_count(f.value, f.path), std::numeric_limits<int>::max()));
      (f.key == "ipv4" ? prefixes.ipv4 : prefixes.ipv6) = bits;
    }
    return prefixes;
  }

  // {target_latency_ms, error_ratio_permille, minimum_factor_permille, decrease_permille,
  // recovery_permille, interval_ms, max_hold_seconds, min_samples, min_clients,
  // max_retry_after_seconds}; only target_latency_ms is required.
  // validate() checks the ranges against the struct's member names, so each value is also
  // remembered under its member's path (…adaptive.target_latency) for the error's position.
  AdaptivePolicy read_adaptive(const YAML::Node& node, const std::string& path) {
    AdaptivePolicy adaptive;
    const std::vector<Field> fs =
        fields(node, path,
               {"target_latency_ms", "error_ratio_permille", "minimum_factor_permille",
                "decrease_permille", "recovery_permille", "interval_ms", "max_hold_seconds",
                "min_samples", "min_clients", "max_retry_after_seconds"});
    require(node, path, fs, "target_latency_ms");
    // Past any valid value, kept small enough that converting it to ns cannot overflow.
    constexpr std::uint64_t kTooLongMs = std::uint64_t{1} << 40;
    constexpr std::uint64_t kTooLongSeconds = kTooLongMs / 1000;
    for (const Field& f : fs) {
      const std::uint64_t n = read_count(f.value, f.path);
      const auto permille = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(n, std::numeric_limits<std::uint32_t>::max()));
      const std::chrono::milliseconds ms(std::min(n, kTooLongMs));
      std::string member = f.key;
      if (f.key == "target_latency_ms") {
        adaptive.target_latency = ms;
        member = "target_latency";
      } else if (f.key == "error_ratio_permille") {
        adaptive.error_ratio_permille = permille;
      } else if (f.key == "minimum_factor_permille") {
        adaptive.minimum_factor_permille = permille;
      } else if (f.key == "decrease_permille") {
        adaptive.decrease_permille = permille;
      } else if (f.key == "recovery_permille") {
        adaptive.recovery_permille = permille;
      } else if (f.key == "interval_ms") {
        adaptive.interval = ms;
        member = "interval";
      } else if (f.key == "min_samples") {
        adaptive.min_samples = permille;
      } else if (f.key == "min_clients") {
        adaptive.min_clients = permille;
      } else if (f.key == "max_retry_after_seconds") {
        adaptive.max_retry_after = std::chrono::seconds(std::min(n, kTooLongSeconds));
        member = "max_retry_after";
      } else {
        adaptive.max_hold = std::chrono::seconds(std::min(n, kTooLongSeconds));
        member = "max_hold";
      }
      remember(absl::StrCat(path, ".", member), f.value.Mark());
    }
    return adaptive;
  }

  Rule read_rule(const YAML::Node& node, const std::string& path) {
    Rule rule;
    const std::vector<Field> fs = fields(
        node, path,
        {"name", "selector", "requests_per", "burst", "address_prefixes", "adaptive", "algorithm"});
    require(node, path, fs, "selector");
    require(node, path, fs, "requests_per");
    for (const Field& f : fs) {
      if (f.key == "name") {
        rule.name = read_string(f.value, f.path);
      } else if (f.key == "selector") {
        rule.selector = read_list<Selector>(f.value, f.path, &ConfigReader::read_selector);
      } else if (f.key == "requests_per") {
        rule.requests_per = read_requests_per(f.value, f.path);
      } else if (f.key == "burst") {
        rule.burst = read_count(f.value, f.path);
      } else if (f.key == "adaptive") {
        rule.adaptive = read_adaptive(f.value, f.path);
      } else if (f.key == "algorithm") {
        rule.algorithm = read_enum(f.value, f.path, "algorithm", "gcra or fixed_window",
                                   [](std::string_view s) { return parse_algorithm(s); });
      } else {
        rule.address_prefixes = read_prefixes(f.value, f.path);
      }
    }
    return rule;
  }

  LegacyRateLimit read_legacy(const YAML::Node& node, const std::string& path) {
    LegacyRateLimit legacy;
    const std::vector<Field> fs = fields(node, path, {"requests", "window_seconds"});
    require(node, path, fs, "requests");
    require(node, path, fs, "window_seconds");
    for (const Field& f : fs) {
      (f.key == "requests" ? legacy.requests : legacy.window_seconds) = read_count(f.value, f.path);
    }
    return legacy;
  }

  Bundle read_bundle(const YAML::Node& node, const std::string& path) {
    Bundle bundle;
    const std::vector<Field> fs =
        fields(node, path, {"name", "rate_limits", "rate_limit", "dry_run"});
    require(node, path, fs, "name");
    for (const Field& f : fs) {
      if (f.key == "name") {
        bundle.name = read_string(f.value, f.path);
      } else if (f.key == "rate_limits") {
        bundle.rate_limits = read_list<Rule>(f.value, f.path, &ConfigReader::read_rule);
      } else if (f.key == "rate_limit") {
        bundle.rate_limit = read_legacy(f.value, f.path);
      } else {
        bundle.dry_run = read_bool(f.value, f.path);
      }
    }
    return bundle;
  }

  // `match: {path: {type: prefix, value: /v1}}`, the long form of `path_prefix: /v1`.
  std::string read_match(const YAML::Node& node, const std::string& path,
                         const std::string& prefix_path) {
    const std::vector<Field> fs = fields(node, path, {"path"});
    require(node, path, fs, "path");
    const Field& p = fs.front();
    const std::vector<Field> ps = fields(p.value, p.path, {"type", "value"});
    require(p.value, p.path, ps, "type");
    require(p.value, p.path, ps, "value");
    std::string prefix;
    for (const Field& f : ps) {
      if (f.key == "type") {
        read_enum(f.value, f.path, "match type", "prefix", [](std::string_view s) {
          return s == "prefix" ? std::optional(0) : std::nullopt;
        });
      } else {
        prefix = read_string(f.value, f.path);
        remember(prefix_path, f.value.Mark());  // validate() calls it path_prefix
        if (prefix.empty()) fail(f.value.Mark(), f.path, kEmptyPrefix);
      }
    }
    return prefix;
  }

  // An explicit empty prefix would match no request an adapter routes by path.
  static constexpr const char* kEmptyPrefix =
      "must not be empty (it would match no request); omit it for a route the application names "
      "itself";

  Route read_route(const YAML::Node& node, const std::string& path) {
    Route route;
    const std::vector<Field> fs = fields(
        node, path,
        {"name", "service", "listener", "path_prefix", "match", "case_sensitive", "policies"});
    require(node, path, fs, "name");
    const Field* prefix = nullptr;
    const Field* match = nullptr;
    for (const Field& f : fs) {
      if (f.key == "name") {
        route.name = read_string(f.value, f.path);
      } else if (f.key == "service") {
        route.service = read_string(f.value, f.path);
      } else if (f.key == "listener") {
        route.listener = read_string(f.value, f.path);
      } else if (f.key == "path_prefix") {
        prefix = &f;
        route.path_prefix = read_string(f.value, f.path);
        if (route.path_prefix.empty()) fail(f.value.Mark(), f.path, kEmptyPrefix);
      } else if (f.key == "match") {
        match = &f;
        route.path_prefix = read_match(f.value, f.path, member(path, "path_prefix"));
      } else if (f.key == "case_sensitive") {
        route.case_sensitive = read_bool(f.value, f.path);
      } else {
        route.policies = read_strings(f.value, f.path);
      }
    }
    if (prefix != nullptr && match != nullptr) {
      const Field* later = prefix->value.Mark().pos > match->value.Mark().pos ? prefix : match;
      fail(later->value.Mark(), later->path, "path_prefix and match both set the route's path");
    }
    return route;
  }

  // A Service or a Listener: a name and the bundles attached to it.
  template <class Attachable>
  Attachable read_attachable(const YAML::Node& node, const std::string& path) {
    Attachable attachable;
    const std::vector<Field> fs = fields(node, path, {"name", "policies"});
    require(node, path, fs, "name");
    for (const Field& f : fs) {
      if (f.key == "name") {
        attachable.name = read_string(f.value, f.path);
      } else {
        attachable.policies = read_strings(f.value, f.path);
      }
    }
    return attachable;
  }

  Consumer read_consumer(const YAML::Node& node, const std::string& path) {
    Consumer consumer;
    const std::vector<Field> fs = fields(node, path, {"name", "credentials", "policies"});
    require(node, path, fs, "name");
    for (const Field& f : fs) {
      if (f.key == "name") {
        consumer.name = read_string(f.value, f.path);
      } else if (f.key == "credentials") {
        consumer.credentials = read_strings(f.value, f.path);
      } else {
        consumer.policies = read_strings(f.value, f.path);
      }
    }
    return consumer;
  }

  Gateway read_gateway(const YAML::Node& node, const std::string& path) {
    Gateway gateway;
    for (const Field& f : fields(node, path,
                                 {"global_policies", "exempt_paths", "address_prefixes",
                                  "trusted_proxies", "ipv4_translation_prefixes"})) {
      if (f.key == "address_prefixes") {
        gateway.address_prefixes = read_prefixes(f.value, f.path);
      } else {
        (f.key == "global_policies"   ? gateway.global_policies
         : f.key == "exempt_paths"    ? gateway.exempt_paths
         : f.key == "trusted_proxies" ? gateway.trusted_proxies
                                      : gateway.ipv4_translation_prefixes) =
            read_strings(f.value, f.path);
      }
    }
    return gateway;
  }

  EngineOptions read_engine(const YAML::Node& node, const std::string& path) {
    EngineOptions engine;
    for (const Field& f : fields(node, path,
                                 {"consumption", "on_backend_error", "local_share_permille",
                                  "local_retry_interval_ms"})) {
      if (f.key == "consumption") {
        engine.consumption =
            read_enum(f.value, f.path, "consumption mode", "all_or_nothing or every_rule",
                      [](std::string_view s) { return parse_consumption_mode(s); });
      } else if (f.key == "on_backend_error") {
        engine.on_backend_error =
            read_enum(f.value, f.path, "failure mode", "fail_open, fail_closed or local",
                      [](std::string_view s) { return parse_failure_mode(s); });
      } else if (f.key == "local_share_permille") {
        engine.local_share_permille = read_count(f.value, f.path);
      } else {
        engine.local_retry_interval_ms = read_count(f.value, f.path);
      }
    }
    return engine;
  }

  // {type, address, unix_socket, key_prefix, conninfo, key_seed, connect_timeout_ms,
  // command_timeout_ms, max_connections}; validate() checks which members the type reads.
  BackendConfig read_backend(const YAML::Node& node, const std::string& path) {
    BackendConfig backend;
    for (const Field& f :
         fields(node, path,
                {"type", "address", "unix_socket", "key_prefix", "conninfo", "key_seed",
                 "connect_timeout_ms", "command_timeout_ms", "max_connections"})) {
      if (f.key == "type") {
        backend.type =
            read_enum(f.value, f.path, "backend type", "memory, redis, redis_cluster or postgres",
                      [](std::string_view s) { return parse_backend_kind(s); });
      } else if (f.key == "address" || f.key == "unix_socket" || f.key == "conninfo") {
        (f.key == "address"       ? backend.address
         : f.key == "unix_socket" ? backend.unix_socket
                                  : backend.conninfo) = read_string(f.value, f.path);
      } else if (f.key == "key_prefix") {
        backend.key_prefix = read_string(f.value, f.path);
      } else if (f.key == "key_seed") {
        backend.key_seed = read_count(f.value, f.path);
      } else {
        const std::uint64_t n = read_count(f.value, f.path);
        (f.key == "connect_timeout_ms"   ? backend.connect_timeout_ms
         : f.key == "command_timeout_ms" ? backend.command_timeout_ms
                                         : backend.max_connections) = n;
      }
    }
    return backend;
  }
};

// `text` as one YAML document read into a PolicyConfig that passed sluice::validate; a validate()
// error comes back as InvalidArgument "<line>:<column>: <path>: <what>". Throws LoadError for a
// document that does not fit the schema and YAML::Exception for a syntax error.
inline absl::StatusOr<PolicyConfig> read_and_validate(const std::string& text) {
  check_nesting(text);
  expect_one_document(text);
  ConfigReader reader;
  PolicyConfig config = reader.load(YAML::Load(text));
  if (absl::Status s = validate(config); !s.ok()) {
    return absl::InvalidArgumentError(reader.relocate(s.message()));
  }
  return config;
}

}  // namespace sluice::yaml::detail

#endif  // SLUICE_YAML_DETAIL_CONFIG_READER_HPP_
