// sluice/redis/options.hpp — where the Redis client connects and how it names its keys.
//
// Plain values, validated by `Client::create` (sluice/redis/client.hpp). A host name is resolved
// when a connection opens, within that connect's deadline; each of its addresses is tried in turn.
//
//   sluice::redis::ClientOptions options{
//       .connection = {.host = "10.0.0.5", .port = 6379,
//                      .command_timeout = std::chrono::milliseconds(50)},
//       .key_prefix = "rl:api:",
//       .key_seed = kFleetSecretSeed};  // the same secret on every replica
//
// Units: timeouts in milliseconds. Thread-safety: plain values (thread-compatible).
#ifndef SLUICE_REDIS_OPTIONS_HPP_
#define SLUICE_REDIS_OPTIONS_HPP_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace sluice::redis {

// What the server check (at creation, and on every new connection) requires of the server's
// memory settings (read with CONFIG GET). Every limited identity is a key until its windows
// refill; a spray of identities grows the key set without bound unless the server has
// `maxmemory`, and only `volatile-ttl` evicts the keys closest to fresh first (a spent budget's
// key is among the last to go). The other evicting policies can evict a spent budget's key (the
// next check then admits again, unnoticed); `noeviction` fails every write once the bound is
// reached. A refused server fails creation (Client::create, the limiters' and the engine's
// create) with FailedPrecondition naming the setting, the CONFIG SET that fixes it and the
// opt-out; a server first reached after creation fails every check with it instead.
enum class MemoryCheck {
  kRequireBounded,  // maxmemory > 0 and maxmemory-policy volatile-ttl (the default)
  // Also accepts maxmemory 0 (memory grows with the identities seen) and noeviction (writes fail
  // with OOM: errors, never a silent allow). Still refuses policies that evict other keys.
  kAllowUnbounded,
  // Sends no INFO or CONFIG GET and checks nothing (not the version or Cluster mode either): for
  // servers where those commands are renamed or denied by an ACL. The operator vouches for the
  // settings.
  kSkip,
};

// Where and how to connect.
struct ConnectionOptions {
  std::string host = "127.0.0.1";  // an IP address, or a name resolved as a connection opens
  int port = 6379;
  std::string unix_socket{};  // non-empty: connect here, not to host:port
  // Caps each new connection's name lookup, and its connect to each address.
  std::chrono::milliseconds connect_timeout{200};
  // One deadline per check, from its start: the wait for a free connection, a connect, the write
  // and every read all end by it, however slowly a peer trickles bytes.
  std::chrono::milliseconds command_timeout{200};
  std::size_t max_connections = 16;                         // open at once, idle or in use
  MemoryCheck memory_check = MemoryCheck::kRequireBounded;  // at creation, each new connection
};

struct ClientOptions {
  ConnectionOptions connection;
  std::string key_prefix = "sluice:";  // namespaces the Redis keys; may name the service
  // Seeds the key digest. Every replica sharing limits must use the same seed; keep it secret so
  // clients cannot aim their keys at one Cluster slot.
  std::uint64_t key_seed = 0;
  // Redis Cluster: `connection` names one node (host and port, not a unix socket) to learn the
  // slot map from; each key then goes to the node serving its slot, every node with a pool of
  // `connection`'s options. See Client for what is atomic across nodes.
  bool cluster = false;
  // Single-key checks (RedisGcraLimiter::check and inspect) that start while
  // max_coalesced_calls calls are in flight queue and go out together as one script call: one
  // TIME, up to max_coalesced_checks keys, each check decided on its own exactly as separate
  // checks in that order would be. A lone check is sent at once. Each keeps its own
  // command_timeout. Not in Cluster mode (one script's keys must share a slot). check_all and the
  // bookings are never coalesced.
  bool coalesce = true;
  std::size_t max_coalesced_checks = 64;  // 1..1000: bounds one call's arguments and reply
  // 1..1000: coalesced calls in flight at once (each on a pooled connection of its own, so at
  // most connection.max_connections). A check that finds fewer in flight is sent at once; the
  // others queue and go out together when a call returns. More calls in flight mean smaller
  // calls: more server and client CPU per check, which pays only where the CPU is idle and the
  // round trip long. The default 2 was chosen by measurement (docs/benchmarks.md, "Coalesced
  // single-key checks"): on an idle 2-vCPU host running the callers and Redis, 2 in flight did
  // 1.3x the uncoalesced rate at 8 callers and 2.1x at 32 (4 in flight: 1.2x and 1.9-2.0x), and
  // the same rate at 1 and 4.
  std::size_t max_coalesced_calls = 2;
  // Where the scripts take their time, in ns since the Unix epoch. Empty (the default): the
  // Redis server's TIME, one clock for the whole fleet. Set it to decide at chosen times (tests
  // driving a sluice::ManualClock, replays), as the in-memory limiters take a clock; it is called
  // once per script call, from any thread. Keys still expire on the server's own clock.
  std::function<std::chrono::nanoseconds()> time_source{};
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_OPTIONS_HPP_
