// sluice::postgres against a private PostgreSQL 15, beside its baselines on the same connections:
//   - BM_SelectOne: a prepared `SELECT 1` round trip through the same pool (the round-trip limit
//     at the same concurrency),
//   - BM_PostgresCheck: PostgresGcraLimiter::check, one call of sluice.check_v1 (lock, read,
//     decide, write, commit),
//   - BM_PostgresBatch4: four keys in one all-or-nothing batch (one round trip),
//   - BM_RedisCheck (where sluice::redis is built): RedisGcraLimiter-equivalent Client::check_all
//     against a private redis-server in the same process, for comparison.
// Each at 1, 8 and 32 callers (threads), each caller on its own pooled connection.
//
// The PostgreSQL server runs with its durable defaults (fsync and synchronous_commit on) unless
// SLUICE_BENCH_PG_FAST=1 turns both off. Every check is admitted and writes its row.
//
// Usage: build/bench/bench/postgres_bench [--benchmark_filter=...]
// Starts both servers in temporary directories (unix sockets) and stops them at exit.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "postgres_server.hpp"
#include "sluice/postgres.hpp"
#ifdef SLUICE_BENCH_WITH_REDIS
#include "redis_server.hpp"
#include "sluice/redis.hpp"
#endif

namespace {

namespace sp = sluice::postgres;

constexpr std::size_t kMaxConnections = 32;
constexpr int kKeysPerThread = 16;
// A bucket of 10^9 at 1000/s: never full within a run, so every check is admitted and writes.
constexpr std::uint64_t kBurst = 1'000'000'000;

void fail(const std::string& why) {
  std::fprintf(stderr, "postgres_bench: %s\n", why.c_str());
  std::exit(1);
}

struct Fixture {
  std::unique_ptr<sluice_test::PostgresServer> server;
  std::shared_ptr<sp::Client> client;
  std::unique_ptr<sp::PostgresGcraLimiter> limiter;
#ifdef SLUICE_BENCH_WITH_REDIS
  sluice_test::RedisServer redis;
  std::shared_ptr<sluice::redis::Client> redis_client;
  std::unique_ptr<sluice::redis::Limit> redis_limit;
#endif
};
Fixture* fixture = nullptr;

void start() {
  fixture = new Fixture();
  const char* fast = std::getenv("SLUICE_BENCH_PG_FAST");
  fixture->server = std::make_unique<sluice_test::PostgresServer>(
      /*durable=*/fast == nullptr || std::string(fast) != "1");
  if (std::string e = fixture->server->start(); !e.empty()) fail(e);
  auto client = sp::Client::create({.connection = {.conninfo = fixture->server->conninfo(),
                                                   .connect_timeout = std::chrono::seconds(5),
                                                   .acquire_timeout = std::chrono::seconds(5),
                                                   .statement_timeout = std::chrono::seconds(5),
                                                   .reply_grace = std::chrono::seconds(1),
                                                   .max_connections = kMaxConnections},
                                    .key_seed = 7});
  if (!client.ok()) fail(client.status().ToString());
  fixture->client = *client;
  if (auto v = sp::migrate(fixture->client->pool()); !v.ok()) fail(v.status().ToString());
  auto limiter = sp::PostgresGcraLimiter::create(
      {{.requests = 1000, .period = std::chrono::seconds(1), .burst = kBurst}}, fixture->client,
      "bench");
  if (!limiter.ok()) fail(limiter.status().ToString());
  fixture->limiter = std::make_unique<sp::PostgresGcraLimiter>(*std::move(limiter));
#ifdef SLUICE_BENCH_WITH_REDIS
  if (std::string e = fixture->redis.start(); !e.empty()) fail(e);
  sluice::redis::ClientOptions ro;
  ro.connection.unix_socket = fixture->redis.unix_socket();
  ro.connection.max_connections = kMaxConnections;
  ro.connection.connect_timeout = std::chrono::milliseconds(2000);
  ro.connection.command_timeout = std::chrono::milliseconds(2000);
  auto rc = sluice::redis::Client::create(std::move(ro));
  if (!rc.ok()) fail(rc.status().ToString());
  fixture->redis_client = *rc;
  auto rl = sluice::redis::Limit::create(
      {{.requests = 1000, .period = std::chrono::seconds(1), .burst = kBurst}});
  if (!rl.ok()) fail(rl.status().ToString());
  fixture->redis_limit = std::make_unique<sluice::redis::Limit>(*std::move(rl));
#endif
}

std::vector<std::string> thread_keys(const benchmark::State& state) {
  std::vector<std::string> keys;
  for (int i = 0; i < kKeysPerThread; ++i) {
    keys.push_back("bench:" + std::to_string(state.thread_index()) + ":" + std::to_string(i));
  }
  return keys;
}

void BM_SelectOne(benchmark::State& state) {
  const sp::Param* none = nullptr;
  for (auto _ : state) {
    auto lease = fixture->client->pool().acquire();
    if (!lease.ok()) {
      state.SkipWithError(lease.status().ToString().c_str());
      break;
    }
    auto r = lease->run("sluice_bench_select_one", "SELECT 1", std::span(none, 0),
                        sp::detail::Effect::kReadOnly);
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_PostgresCheck(benchmark::State& state) {
  const std::vector<std::string> keys = thread_keys(state);
  int i = 0;
  for (auto _ : state) {
    absl::StatusOr<sluice::Decision> d = fixture->limiter->check(keys[i++ % kKeysPerThread]);
    if (!d.ok() || !d->allowed()) {
      state.SkipWithError(d.ok() ? "denied" : d.status().ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_PostgresBatch4(benchmark::State& state) {
  const std::vector<std::string> keys = thread_keys(state);
  int i = 0;
  for (auto _ : state) {
    const std::string_view batch[] = {keys[i % kKeysPerThread], keys[(i + 1) % kKeysPerThread],
                                      keys[(i + 2) % kKeysPerThread],
                                      keys[(i + 3) % kKeysPerThread]};
    i += 4;
    auto d = fixture->limiter->check_batch(batch);
    if (!d.ok() || !(*d)[0].allowed()) {
      state.SkipWithError(d.ok() ? "denied" : d.status().ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

#ifdef SLUICE_BENCH_WITH_REDIS
void BM_RedisCheck(benchmark::State& state) {
  const std::vector<std::string> keys = thread_keys(state);
  int i = 0;
  for (auto _ : state) {
    const sluice::redis::CheckItem item{.key = keys[i++ % kKeysPerThread],
                                        .limit = fixture->redis_limit.get()};
    auto d = fixture->redis_client->check_all(std::span(&item, 1));
    if (!d.ok() || !(*d)[0].allowed()) {
      state.SkipWithError(d.ok() ? "denied" : d.status().ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
#endif

void callers(benchmark::internal::Benchmark* b) {
  b->Threads(1)->Threads(8)->Threads(32)->UseRealTime()->MinTime(2.0);
}

BENCHMARK(BM_SelectOne)->Apply(callers);
BENCHMARK(BM_PostgresCheck)->Apply(callers);
BENCHMARK(BM_PostgresBatch4)->Apply(callers);
#ifdef SLUICE_BENCH_WITH_REDIS
BENCHMARK(BM_RedisCheck)->Apply(callers);
#endif

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  start();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  delete fixture;
  return 0;
}
