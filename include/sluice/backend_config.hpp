// sluice/backend_config.hpp — where a config says its rules' state lives: the `backend` section.
//
// Plain data, read from YAML (`backend:`, docs/configuration.md) or written in code, and honoured
// by the engine whose backend is chosen at run time (sluice/runtime_engine.hpp):
//
//   backend:
//     type: redis                     # memory (default), redis, redis_cluster or postgres
//     unix_socket: /run/redis.sock    # or address: 10.0.0.5:6379
//     key_prefix: "rl:api:"
//     key_seed: 1234567890            # the same on every replica; keep the file private
//   engine:
//     on_backend_error: local         # what a request gets while the backend fails
//     local_share_permille: 250
//
// A config without the section (no `type`) runs on the engine type's own backend. An engine whose
// backend is fixed at compile time refuses a config that names one, and the run-time engine
// refuses a type that this build does not include, so a config never runs on another backend
// than the one it names. The section is read when an engine is created; a reload that changes it
// is refused (the backend's connections outlive generations), so moving is a restart.
//
// Units: milliseconds. Thread-safety: plain values (thread-compatible); every function is pure.
#ifndef SLUICE_BACKEND_CONFIG_HPP_
#define SLUICE_BACKEND_CONFIG_HPP_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sluice {

enum class BackendKind {
  kMemory,        // this process (per replica)
  kRedis,         // one Redis server (or a primary behind a proxy)
  kRedisCluster,  // a Redis Cluster; `address` names one node to learn the slot map from
  kPostgres,      // a PostgreSQL database with the sluice schema installed
};

constexpr std::string_view to_string(BackendKind kind) noexcept {
  switch (kind) {
    case BackendKind::kMemory:
      return "memory";
    case BackendKind::kRedis:
      return "redis";
    case BackendKind::kRedisCluster:
      return "redis_cluster";
    case BackendKind::kPostgres:
      return "postgres";
  }
  return "unknown";
}
constexpr std::optional<BackendKind> parse_backend_kind(std::string_view text) noexcept {
  for (BackendKind k : {BackendKind::kMemory, BackendKind::kRedis, BackendKind::kRedisCluster,
                        BackendKind::kPostgres}) {
    if (text == to_string(k)) return k;
  }
  return std::nullopt;
}

// The `backend` section. Which members a type reads: redis: `address` or `unix_socket`;
// redis_cluster: `address`; both: `key_prefix`; postgres: `conninfo`; remote types: `key_seed`,
// `connect_timeout_ms`, `command_timeout_ms`, `max_connections`. A member another type reads is
// refused, so a half-edited section cannot pass.
struct BackendConfig {
  std::optional<BackendKind> type{};  // none: the engine type's own backend
  std::string address{};  // "host:port": a host name (resolved within the connect timeout) or IP
  std::string unix_socket{};
  std::optional<std::string> key_prefix{};  // Redis key namespace; default "sluice:"
  std::string conninfo{};                   // libpq connection string or URI
  std::uint64_t key_seed = 0;               // seeds the key digests; the same on every replica
  std::optional<std::uint64_t> connect_timeout_ms{};  // default: the client's (Redis 200, PG 1000)
  std::optional<std::uint64_t> command_timeout_ms{};  // Redis: per check; PostgreSQL: statement
  std::optional<std::uint64_t> max_connections{};     // default 16

  friend bool operator==(const BackendConfig&, const BackendConfig&) = default;
};

// `address` as host and port: "10.0.0.5:6379", "[2001:db8::5]:6379"; none when it is not of
// that form (no port, a port outside 1..65535).
struct HostPort {
  std::string host;
  int port = 0;
};
inline std::optional<HostPort> split_host_port(std::string_view address) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  std::string_view host = address.substr(0, colon);
  const std::string_view port_text = address.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return std::nullopt;
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return std::nullopt;  // an IPv6 address needs its brackets
  }
  int port = 0;
  if (port_text.empty() || port_text.size() > 5) return std::nullopt;
  for (const char c : port_text) {
    if (c < '0' || c > '9') return std::nullopt;
    port = port * 10 + (c - '0');
  }
  if (port < 1 || port > 65535) return std::nullopt;
  return HostPort{.host = std::string(host), .port = port};
}

inline constexpr std::uint64_t kMaxBackendTimeoutMs = 60'000;
inline constexpr std::uint64_t kMaxBackendConnections = 1024;

// Checks the section on its own: InvalidArgument naming the member (`backend.address: ...`).
inline absl::Status validate_backend(const BackendConfig& b) {
  auto invalid = [](std::string_view member, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("backend.", std::string(member), ": ", what));
  };
  const bool remote = b.type && *b.type != BackendKind::kMemory;
  const bool redis = b.type == BackendKind::kRedis || b.type == BackendKind::kRedisCluster;
  if (!b.type && !(b == BackendConfig{})) return invalid("type", "is required with other members");
  if (b.type == BackendKind::kRedis && b.address.empty() == b.unix_socket.empty()) {
    return invalid("address", "redis needs exactly one of address and unix_socket");
  }
  if (b.type == BackendKind::kRedisCluster && b.address.empty()) {
    return invalid("address", "redis_cluster needs the address of one node");
  }
  if (redis && !b.address.empty() && !split_host_port(b.address)) {
    return invalid("address", "must be host:port (an IPv6 address in brackets: [::1]:6379)");
  }
  if (b.type == BackendKind::kPostgres && b.conninfo.empty()) {
    return invalid("conninfo", "postgres needs a conninfo (e.g. \"dbname=app host=/run/pg\")");
  }
  const struct {
    std::string_view member;
    bool set;
    bool read;
  } members[] = {
      {"address", !b.address.empty(), redis},
      {"unix_socket", !b.unix_socket.empty(), b.type == BackendKind::kRedis},
      {"key_prefix", b.key_prefix.has_value(), redis},
      {"conninfo", !b.conninfo.empty(), b.type == BackendKind::kPostgres},
      {"key_seed", b.key_seed != 0, remote},
      {"connect_timeout_ms", b.connect_timeout_ms.has_value(), remote},
      {"command_timeout_ms", b.command_timeout_ms.has_value(), remote},
      {"max_connections", b.max_connections.has_value(), remote},
  };
  for (const auto& m : members) {
    if (m.set && !m.read) {
      return invalid(m.member, absl::StrCat("is not read by type ",
                                            std::string(b.type ? to_string(*b.type) : "(none)"),
                                            "; remove it"));
    }
  }
  for (const auto& [member, ms] : {std::pair{"connect_timeout_ms", b.connect_timeout_ms},
                                   std::pair{"command_timeout_ms", b.command_timeout_ms}}) {
    if (ms && (*ms == 0 || *ms > kMaxBackendTimeoutMs)) {
      return invalid(member, absl::StrCat("must be in [1, ", kMaxBackendTimeoutMs, "]"));
    }
  }
  if (b.max_connections &&
      (*b.max_connections == 0 || *b.max_connections > kMaxBackendConnections)) {
    return invalid("max_connections", absl::StrCat("must be in [1, ", kMaxBackendConnections, "]"));
  }
  return absl::OkStatus();
}

}  // namespace sluice

#endif  // SLUICE_BACKEND_CONFIG_HPP_
