// ShouldRateLimit over gRPC on 127.0.0.1, against its ceiling: the same call to a service that
// answers at once, on the same server and channel setup, with the same request. 1, 8 and 32
// concurrent callers share one channel; p50 and p99 are each caller's, averaged over callers.
// `failed` counts calls that failed or that the limiter decided by its failure mode.
//
//   build/bench/bench/envoy_bench --benchmark_min_time=3
//
// Every call is admitted (a limit of 10^9 per second per address, 10 000 addresses), so the
// subject is the decision path, not the denial path.
//
// Over Redis (where hiredis was found): BM_ShouldRateLimitRedis decides each call in a private
// redis-server (started here in a temporary directory, unix socket; one script call per
// ShouldRateLimit), beside BM_RedisGetCall, its ceiling: the empty service whose handler makes
// one Redis GET on the same client's connections (same hiredis, same pool) before answering.
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "sluice/envoy.hpp"
#ifdef SLUICE_BENCH_REDIS
#include <cstdio>
#include <cstdlib>
#include <span>

#include "redis_server.hpp"
#include "sluice/redis.hpp"
#include "sluice/redis/detail/command.hpp"
#include "sluice/redis/engine_backend.hpp"
#endif

namespace {

namespace rls = ::envoy::service::ratelimit::v3;

// The ceiling: answers OK with one status per descriptor, deciding nothing.
class EmptyService final : public rls::RateLimitService::Service {
  grpc::Status ShouldRateLimit(grpc::ServerContext* /*context*/,
                               const rls::RateLimitRequest* request,
                               rls::RateLimitResponse* reply) override {
    reply->set_overall_code(rls::RateLimitResponse::OK);
    for (int i = 0; i < request->descriptors_size(); ++i) {
      reply->add_statuses()->set_code(rls::RateLimitResponse::OK);
    }
    return grpc::Status::OK;
  }
};

sluice::envoy::ServiceConfig config() {
  return {.domains = {{.domain = "edge",
                       .descriptors = {{.key = "remote_address",
                                        .rate_limit = sluice::envoy::Limit{
                                            .windows = {{.requests = 1'000'000'000,
                                                         .period = std::chrono::seconds(1)}}}}}}}};
}

enum class Kind { kEmpty, kMemory, kRedisGet, kRedis };

#ifdef SLUICE_BENCH_REDIS
namespace sr = ::sluice::redis;
using RedisLimiter = sluice::envoy::BasicLimiter<sr::RedisEngineBackend>;

// The private redis-server and one client of it, shared by both Redis subjects.
struct Redis {
  sluice_test::RedisServer server;
  std::shared_ptr<sr::Client> client;

  Redis() {
    if (const std::string error = server.start(); !error.empty()) fail(error);
    sr::ClientOptions options;
    options.connection.unix_socket = server.unix_socket();
    options.connection.max_connections = 32;
    options.connection.connect_timeout = std::chrono::milliseconds(2000);
    options.connection.command_timeout = std::chrono::milliseconds(2000);
    options.key_prefix = "bench:";
    auto created = sr::Client::create(options);
    if (!created.ok()) fail(created.status().ToString());
    client = *std::move(created);
    server.command({"SET", "bench:get", std::string(48, 'x')});
  }
  static void fail(const std::string& why) {
    std::fprintf(stderr, "envoy_bench: %s\n", why.c_str());
    std::exit(1);
  }
};

Redis& redis() {
  static Redis r;
  return r;
}

// The Redis ceiling: one GET on the client's pooled connections, then the empty answer.
class RedisGetService final : public rls::RateLimitService::Service {
  grpc::Status ShouldRateLimit(grpc::ServerContext* /*context*/,
                               const rls::RateLimitRequest* request,
                               rls::RateLimitResponse* reply) override {
    sr::detail::Command get;
    get.add("GET");
    get.add("bench:get");
    auto lease = redis().client->pool_for_testing().acquire();
    if (!lease.ok()) return unavailable(lease.status().ToString());
    auto replies = sr::detail::exchange(*lease, std::span<const sr::detail::Command>(&get, 1));
    if (!replies.ok()) return unavailable(replies.status().ToString());
    if ((*replies)[0]->type != REDIS_REPLY_STRING) return unavailable("GET found no string");
    reply->set_overall_code(rls::RateLimitResponse::OK);
    for (int i = 0; i < request->descriptors_size(); ++i) {
      reply->add_statuses()->set_code(rls::RateLimitResponse::OK);
    }
    return grpc::Status::OK;
  }

  // A failed call, its reason written once (a benchmark with failures measures nothing).
  static grpc::Status unavailable(const std::string& why) {
    static std::atomic<bool> told{false};
    if (!told.exchange(true)) std::fprintf(stderr, "envoy_bench: GET failed: %s\n", why.c_str());
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, why);
  }
};
#endif  // SLUICE_BENCH_REDIS

// One server per subject, built the same way; a stub over one shared channel.
struct Subject {
  std::unique_ptr<sluice::envoy::Limiter> limiter;
#ifdef SLUICE_BENCH_REDIS
  std::unique_ptr<RedisLimiter> redis_limiter;
#endif
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<rls::RateLimitService::Stub> stub;

  // Calls the limiter decided by its failure mode (fail open): such calls measure nothing.
  std::uint64_t backend_errors() const {
#ifdef SLUICE_BENCH_REDIS
    if (redis_limiter != nullptr) return redis_limiter->backend_errors();
#endif
    return limiter != nullptr ? limiter->backend_errors() : 0;
  }

  explicit Subject(Kind kind) {
    if (kind == Kind::kMemory) {
      limiter = *sluice::envoy::Limiter::create(config());
      service = std::make_unique<sluice::envoy::RateLimitService>(*limiter);
    } else if (kind == Kind::kEmpty) {
      service = std::make_unique<EmptyService>();
    }
#ifdef SLUICE_BENCH_REDIS
    if (kind == Kind::kRedisGet) service = std::make_unique<RedisGetService>();
    if (kind == Kind::kRedis) {
      auto created = RedisLimiter::create(config(), {.backend = {.client = redis().client}});
      if (!created.ok()) Redis::fail(created.status().ToString());
      redis_limiter = *std::move(created);
      service = std::make_unique<sluice::envoy::BasicRateLimitService<sr::RedisEngineBackend>>(
          *redis_limiter);
    }
#endif
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
    stub = rls::RateLimitService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
};

// Every server exists for every run, so each subject runs beside the same idle ones.
Subject& subject(Kind kind) {
#ifdef SLUICE_BENCH_REDIS
  static Subject all[4] = {Subject(Kind::kEmpty), Subject(Kind::kMemory), Subject(Kind::kRedisGet),
                           Subject(Kind::kRedis)};
#else
  static Subject all[2] = {Subject(Kind::kEmpty), Subject(Kind::kMemory)};
#endif
  return all[static_cast<int>(kind)];
}

std::atomic<std::uint64_t> next_address{0};

void run(benchmark::State& state, Kind kind) {
  Subject& s = subject(kind);
  rls::RateLimitRequest request;
  request.set_domain("edge");
  auto* entry = request.add_descriptors()->add_entries();
  entry->set_key("remote_address");
  std::vector<std::int64_t> latencies;
  latencies.reserve(1 << 16);
  std::uint64_t failed = 0;
  const std::uint64_t errors_before = s.backend_errors();
  for (auto _ : state) {
    entry->set_value(absl::StrCat("10.0.", next_address.fetch_add(1) % 10'000));
    rls::RateLimitResponse response;
    grpc::ClientContext context;
    const auto start = std::chrono::steady_clock::now();
    const grpc::Status status = s.stub->ShouldRateLimit(&context, request, &response);
    latencies.push_back((std::chrono::steady_clock::now() - start).count());
    if (!status.ok() || response.overall_code() != rls::RateLimitResponse::OK) ++failed;
  }
  std::sort(latencies.begin(), latencies.end());
  const auto at = [&](std::size_t permille) {
    return latencies.empty()
               ? 0.0
               : static_cast<double>(latencies[latencies.size() * permille / 1000]) / 1e3;
  };
  state.counters["p50_us"] = benchmark::Counter(at(500), benchmark::Counter::kAvgThreads);
  state.counters["p99_us"] = benchmark::Counter(at(990), benchmark::Counter::kAvgThreads);
  if (state.thread_index() == 0) failed += s.backend_errors() - errors_before;
  state.counters["failed"] = benchmark::Counter(static_cast<double>(failed));
  state.counters["calls_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// The decision alone, without gRPC: what the service adds to each call.
void BM_LimiterOnly(benchmark::State& state) {
  static const std::unique_ptr<sluice::envoy::Limiter> limiter =
      *sluice::envoy::Limiter::create(config());
  std::string value;
  sluice::envoy::Entry entry{.key = "remote_address"};
  const sluice::envoy::Descriptor descriptor{.entries = {&entry, 1}};
  sluice::envoy::Response response;
  for (auto _ : state) {
    value = absl::StrCat("10.0.", next_address.fetch_add(1) % 10'000);
    entry.value = value;
    benchmark::DoNotOptimize(
        limiter->should_rate_limit({.domain = "edge", .descriptors = {&descriptor, 1}}, response));
  }
}
BENCHMARK(BM_LimiterOnly)->Threads(1)->Threads(8)->UseRealTime();

void BM_EmptyCall(benchmark::State& state) { run(state, Kind::kEmpty); }
void BM_ShouldRateLimitInMemory(benchmark::State& state) { run(state, Kind::kMemory); }

void concurrency(benchmark::internal::Benchmark* b) {
  b->Threads(1)->Threads(8)->Threads(32)->UseRealTime()->MinTime(2.0);
}
BENCHMARK(BM_EmptyCall)->Apply(concurrency);
BENCHMARK(BM_ShouldRateLimitInMemory)->Apply(concurrency);

#ifdef SLUICE_BENCH_REDIS
void BM_RedisGetCall(benchmark::State& state) { run(state, Kind::kRedisGet); }
void BM_ShouldRateLimitRedis(benchmark::State& state) { run(state, Kind::kRedis); }
BENCHMARK(BM_RedisGetCall)->Apply(concurrency);
BENCHMARK(BM_ShouldRateLimitRedis)->Apply(concurrency);
#endif

}  // namespace

int main(int argc, char** argv) {
  // The servers (and the redis-server, which dies with the thread that started it) start here,
  // on the main thread, not in a benchmark's worker thread.
  subject(Kind::kEmpty);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
