// The attempt limiter: one login attempt (begin, then succeed) per iteration, beside its baseline
// in the same binary — what services hand-roll: a std::mutex + std::unordered_map<std::string,
// record> with the same rules (one attempt in flight, backoff after failures, a success resets
// the record; records are kept, as the sluice store keeps them until it needs the room).
//
// In memory: one hot subject (in cache), and 1M subjects drawn uniformly (a cache miss per
// operation). BM_*_TickClock read a plain integer clock (the limiter's own cost);
// BM_Attempt_HotSubject_SteadyClock pays for std::chrono::steady_clock twice per iteration.
//
// Over Redis (when built with sluice::redis): begin + succeed through RedisAttemptLimiter, two
// round trips (two EVALSHA) per iteration, each thread on its own subjects, beside two plain GET
// round trips on an identical connection pool (the round-trip floor for two operations).
// Starts redis-server from PATH in a temporary directory (unix socket) and kills it at exit.
//
// Usage: build/bench/bench/attempt_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bench_support.hpp"
#include "sluice/attempt.hpp"
#ifdef SLUICE_BENCH_REDIS
#include "redis_server.hpp"
#include "sluice/redis/attempt_limiter.hpp"
#endif

namespace {

using namespace std::chrono_literals;

constexpr sluice::AttemptPolicy kPolicy{
    .initial_delay = 1s, .delay_cap = 15min, .quiet_period = 24h, .lease = 30s};
constexpr std::uint64_t kSubjects = 1'000'000;

// The hand-rolled reference: one mutex, one map of string subjects to records.
class MutexMapAttempts {
 public:
  struct Receipt {
    std::string subject;
    std::uint64_t token = 0;
  };

  // An admitted attempt's receipt, or a token of 0 when denied.
  Receipt begin(std::string_view subject, std::int64_t now) {
    std::lock_guard lock(mu_);
    Record& r = records_[std::string(subject)];
    if (r.active && now < r.lease_end) return {};
    if (r.active) {  // the lease ran out: a failure
      r.active = false;
      r.retry_at = r.lease_end + kPolicy.delay_after(++r.failures).count();
    }
    if (now < r.retry_at) return {};
    r.active = true;
    r.lease_end = now + kPolicy.lease.count();
    return {std::string(subject), ++r.token};
  }
  void succeed(const Receipt& receipt) {
    std::lock_guard lock(mu_);
    auto it = records_.find(receipt.subject);
    if (it != records_.end() && it->second.active && it->second.token == receipt.token) {
      it->second = Record{.token = it->second.token};
    }
  }

 private:
  struct Record {
    std::int64_t lease_end = 0, retry_at = 0;
    std::uint64_t token = 0, failures = 0;
    bool active = false;
  };
  std::mutex mu_;
  std::unordered_map<std::string, Record> records_;
};

template <class Clock>
sluice::AttemptLimiter<Clock> make_limiter() {
  auto limiter = sluice::AttemptLimiter<Clock>::create(
      kPolicy, {.max_keys_per_shard = 2 * kSubjects / sluice::kStoreShards, .seed = 1});
  if (!limiter.ok()) std::abort();
  return *std::move(limiter);
}

void BM_Attempt_HotSubject_TickClock(benchmark::State& state) {
  auto limiter = make_limiter<bench::TickClock>();
  for (auto _ : state) {
    ++bench::tick;
    auto d = limiter.begin("user:alice");
    if (!d.ok() || !d->admitted() || !limiter.succeed(d->receipt).ok()) {
      state.SkipWithError("not admitted");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Attempt_HotSubject_TickClock);

void BM_Attempt_HotSubject_SteadyClock(benchmark::State& state) {
  auto limiter = make_limiter<sluice::SteadyClock>();
  for (auto _ : state) {
    auto d = limiter.begin("user:alice");
    if (!d.ok() || !d->admitted() || !limiter.succeed(d->receipt).ok()) {
      state.SkipWithError("not admitted");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Attempt_HotSubject_SteadyClock);

void BM_MutexUnorderedMap_HotSubject(benchmark::State& state) {
  MutexMapAttempts reference;
  std::int64_t now = 0;
  for (auto _ : state) {
    auto receipt = reference.begin("user:alice", ++now);
    if (receipt.token == 0) {
      state.SkipWithError("not admitted");
      break;
    }
    reference.succeed(receipt);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MutexUnorderedMap_HotSubject);

// Subjects drawn uniformly from 1M: each begin + succeed touches a record not in cache. Successes
// leave records idle, so the store holds at most the 1M subjects (its cap is 2M).
void BM_Attempt_Uniform1M_TickClock(benchmark::State& state) {
  auto limiter = make_limiter<bench::TickClock>();
  bench::KeyMaker key;
  bench::Uniform uniform(42);
  for (auto _ : state) {
    ++bench::tick;
    auto d = limiter.begin(key(uniform(kSubjects)));
    if (!d.ok() || !d->admitted() || !limiter.succeed(d->receipt).ok()) {
      state.SkipWithError("not admitted");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Attempt_Uniform1M_TickClock);

void BM_MutexUnorderedMap_Uniform1M(benchmark::State& state) {
  MutexMapAttempts reference;
  bench::KeyMaker key;
  bench::Uniform uniform(42);
  std::int64_t now = 0;
  for (auto _ : state) {
    auto receipt = reference.begin(key(uniform(kSubjects)), ++now);
    if (receipt.token == 0) {
      state.SkipWithError("not admitted");
      break;
    }
    reference.succeed(receipt);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MutexUnorderedMap_Uniform1M);

#ifdef SLUICE_BENCH_REDIS
namespace sr = sluice::redis;

struct RedisFixture {
  sluice_test::RedisServer server;
  std::unique_ptr<sr::RedisAttemptLimiter> limiter;
  std::unique_ptr<sr::detail::ConnectionPool> pool;  // for the GET baseline
};
RedisFixture* redis = nullptr;
constexpr std::size_t kMaxConnections = 16;

sr::ConnectionOptions connection_options() {
  sr::ConnectionOptions c;
  c.unix_socket = redis->server.unix_socket();
  c.max_connections = kMaxConnections;
  c.connect_timeout = 2000ms;
  c.command_timeout = 2000ms;
  return c;
}

// Server-side cost: INFO commandstats usec_per_call of `command`, reset by thread 0 before the
// timed loop and read by it afterwards (as in redis_bench), reported as `server_us_per_call`.
void reset_server_stats(const benchmark::State& state) {
  if (state.thread_index() == 0) redis->server.command({"CONFIG", "RESETSTAT"});
}
void report_server_cost(benchmark::State& state, std::string_view command) {
  if (state.thread_index() != 0) return;
  sluice_test::Reply info = redis->server.command({"INFO", "commandstats"});
  if (!info || info->type != REDIS_REPLY_STRING) return;
  const std::string text(info->str, info->len);
  const std::size_t at = text.find("cmdstat_" + std::string(command) + ":");
  const std::size_t value = text.find("usec_per_call=", at);
  if (at == std::string::npos || value == std::string::npos) return;
  state.counters["server_us_per_call"] = std::atof(text.c_str() + value + 14);
}

void BM_RedisAttempt_BeginSucceed(benchmark::State& state) {
  reset_server_stats(state);
  const std::string prefix = "user:" + std::to_string(state.thread_index()) + ":";
  std::uint64_t i = 0;
  for (auto _ : state) {
    const std::string subject = prefix + std::to_string(i++ % 16);
    auto d = redis->limiter->begin(subject);
    if (!d.ok() || !d->admitted()) {
      state.SkipWithError(d.ok() ? "not admitted" : d.status().ToString().c_str());
      break;
    }
    if (absl::Status s = redis->limiter->succeed(d->receipt); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  report_server_cost(state, "evalsha");
}
BENCHMARK(BM_RedisAttempt_BeginSucceed)->Threads(1)->Threads(4)->UseRealTime();

void BM_RedisTwoGets(benchmark::State& state) {
  reset_server_stats(state);
  sr::detail::Command get;
  get.add("GET");
  get.add("bench:get");
  for (auto _ : state) {
    for (int k = 0; k < 2; ++k) {
      auto lease = redis->pool->acquire();
      if (!lease.ok()) {
        state.SkipWithError(lease.status().ToString().c_str());
        return;
      }
      auto replies = sr::detail::exchange(*lease, std::span(&get, 1));
      if (!replies.ok()) {
        state.SkipWithError(replies.status().ToString().c_str());
        return;
      }
    }
  }
  state.SetItemsProcessed(state.iterations());
  report_server_cost(state, "get");
}
BENCHMARK(BM_RedisTwoGets)->Threads(1)->Threads(4)->UseRealTime();
#endif

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
#ifdef SLUICE_BENCH_REDIS
  auto owned = std::make_unique<RedisFixture>();
  redis = owned.get();
  if (std::string error = redis->server.start(); !error.empty()) {
    std::fprintf(stderr, "attempt_bench: %s\n", error.c_str());
    return 1;
  }
  sr::ClientOptions options;
  options.connection = connection_options();
  options.key_prefix = "bench:";
  auto limiter = sr::RedisAttemptLimiter::create(kPolicy, options);
  if (!limiter.ok()) {
    std::fprintf(stderr, "attempt_bench: %s\n", limiter.status().ToString().c_str());
    return 1;
  }
  redis->limiter = std::make_unique<sr::RedisAttemptLimiter>(*std::move(limiter));
  redis->pool = std::make_unique<sr::detail::ConnectionPool>(connection_options());
  redis->server.command({"SET", "bench:get", std::string(48, 'x')});
#endif
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
