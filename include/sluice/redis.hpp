// sluice/redis.hpp — fleet-wide rate limits with their state in Redis (target sluice::redis).
//
// The umbrella of the Redis rate limiter: what a limiter user needs, and nothing of the policy
// engine, the in-memory limiters or the attempt limiter. It includes, from sluice/redis/:
//   options.hpp         ConnectionOptions, ClientOptions: where to connect, how keys are named
//   limit.hpp           Limit (validated stacked GcraWindows), CheckItem, kMaxRequests, kMaxRefill
//   client.hpp          Client: connection pool, script and key scheme; batched checks
//   limiter.hpp         RedisGcraLimiter: a sluice::RateLimiter whose state lives in Redis
//   script.hpp          kGcraScript: the Lua script every check runs
// Include these on their own where you use them (same target, not in the umbrella):
//   local_fallback.hpp  LocalFallbackLimiter: a RedisGcraLimiter that limits locally while
//                       Redis fails (pulls in sluice/gcra.hpp)
//   attempt_limiter.hpp RedisAttemptLimiter: login throttling (sluice/attempt.hpp) over Redis
//   engine_backend.hpp  RedisEngineBackend, RedisRateLimitEngine: the policy engine over Redis
// Internals are in sluice/redis/detail/ (sluice::redis::detail) and are not for direct use.
//
//   #include "sluice/redis.hpp"
//
//   auto limiter = sluice::redis::RedisGcraLimiter::create(
//       {{.requests = 10, .period = std::chrono::seconds(1)}},
//       {.connection = {.unix_socket = "/run/redis/redis.sock"}, .key_seed = kFleetSecretSeed});
//   absl::StatusOr<sluice::Decision> d = limiter->check(client_ip);  // one round trip
//
// Units: integer nanoseconds, on the Redis server's clock. Errors: absl::Status, never a silent
// allow. Thread-safety: `Client`, `RedisGcraLimiter` and `RedisEngineBackend` are thread-safe;
// share one `Client` between many limiters and engine generations. See docs/redis.md for
// deployment and failure policy.
#ifndef SLUICE_REDIS_HPP_
#define SLUICE_REDIS_HPP_

#include "sluice/redis/client.hpp"   // IWYU pragma: export
#include "sluice/redis/limit.hpp"    // IWYU pragma: export
#include "sluice/redis/limiter.hpp"  // IWYU pragma: export
#include "sluice/redis/options.hpp"  // IWYU pragma: export
#include "sluice/redis/script.hpp"   // IWYU pragma: export

#endif  // SLUICE_REDIS_HPP_
