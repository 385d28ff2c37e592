// sluice/runtime_engine.hpp — the policy engine whose backend the config chooses.
//
// `RuntimeRateLimitEngine` is a BasicRateLimitEngine over `RuntimeBackend`, the VariantBackend
// (sluice/engine/variant_backend.hpp) of every backend this build includes: memory always, Redis
// and Redis Cluster where the target links sluice::redis, PostgreSQL where it links
// sluice::postgres (those targets define SLUICE_WITH_REDIS and SLUICE_WITH_POSTGRES). The
// config's `backend` section (sluice/backend_config.hpp) picks one when the engine is created,
// so moving a service to Redis is a config change:
//
//   backend: { type: redis, unix_socket: /run/redis.sock, key_prefix: "rl:api:" }
//   engine: { on_backend_error: fail_closed }
//
//   auto engine = sluice::RuntimeRateLimitEngine::create(config);  // opens the Redis client
//   auto holder = sluice::yaml::ReloadingEngine<sluice::RuntimeRateLimitEngine>::create(path);
//
// Or in code, with the config's section left out:
//
//   sluice::RuntimeBackend::Options options{.backend = sluice::redis::RedisEngineBackend::Options{
//                                               .client = *client}};
//   auto engine = sluice::RuntimeRateLimitEngine::create(config, options);
//
// Errors at creation: InvalidArgument "backend.type: redis is not in this build of sluice (link
// sluice::redis, ...)" for a backend not compiled in, and the backend client's own (a Redis
// server without bounded memory, ...). A reload that changes the section is refused and counted
// as a failed reload; the running generation keeps serving. The static engines
// (sluice::RateLimitEngine, redis::RedisRateLimitEngine, postgres::PostgresRateLimitEngine) stay
// for code that wants the backend in the type; they refuse a config with a `backend` section.
//
// Cost: one branch on the held backend per backend call (see bench/engine_bench.cpp).
// Thread-safety: as BasicRateLimitEngine.
#ifndef SLUICE_RUNTIME_ENGINE_HPP_
#define SLUICE_RUNTIME_ENGINE_HPP_

#include "sluice/engine.hpp"
#include "sluice/engine/in_memory_backend.hpp"
#include "sluice/engine/variant_backend.hpp"
#ifdef SLUICE_WITH_REDIS
#include "sluice/redis/engine_backend.hpp"
#endif
#ifdef SLUICE_WITH_POSTGRES
#include "sluice/postgres/engine_backend.hpp"
#endif

namespace sluice {

namespace detail {

// A list of backend types, extended one optional part at a time.
template <class... Backends>
struct BackendList {
  template <class B>
  using with = BackendList<Backends..., B>;
  template <template <class...> class T>
  using apply = T<Backends...>;
};

// `Memory`, then every optional backend this build includes.
template <class Memory>
struct BuiltBackends {
  using with_memory = BackendList<Memory>;
#ifdef SLUICE_WITH_REDIS
  using with_redis = typename with_memory::template with<redis::RedisEngineBackend>;
#else
  using with_redis = with_memory;
#endif
#ifdef SLUICE_WITH_POSTGRES
  using all = typename with_redis::template with<postgres::PostgresEngineBackend>;
#else
  using all = with_redis;
#endif
};

}  // namespace detail

// Every backend of this build, chosen at run time, with `Memory` as the in-memory one (a test's
// or benchmark's clock in place of the steady clock).
template <class Memory = InMemoryBackend<SteadyClock>>
using RuntimeBackendOf =
    typename detail::BuiltBackends<Memory>::all::template apply<VariantBackend>;

using RuntimeBackend = RuntimeBackendOf<>;
static_assert(BatchSettlingBackend<RuntimeBackend>);

// The engine over it.
using RuntimeRateLimitEngine = BasicRateLimitEngine<RuntimeBackend>;

}  // namespace sluice

#endif  // SLUICE_RUNTIME_ENGINE_HPP_
