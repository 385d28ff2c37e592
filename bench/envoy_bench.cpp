// ShouldRateLimit over gRPC on 127.0.0.1, against its ceiling: the same call to a service that
// answers at once, on the same server and channel setup, with the same request. 1, 8 and 32
// concurrent callers share one channel; p50 and p99 are each caller's, averaged over callers.
//
//   build/bench/bench/envoy_bench --benchmark_min_time=3
//
// Every call is admitted (a limit of 10^9 per second per address, 10 000 addresses), so the
// subject is the decision path, not the denial path.
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

// One server per subject, built the same way; a stub over one shared channel.
struct Subject {
  std::unique_ptr<sluice::envoy::Limiter> limiter;
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<rls::RateLimitService::Stub> stub;

  explicit Subject(bool sluice) {
    if (sluice) {
      limiter = *sluice::envoy::Limiter::create(config());
      service = std::make_unique<sluice::envoy::RateLimitService>(*limiter);
    } else {
      service = std::make_unique<EmptyService>();
    }
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
    stub = rls::RateLimitService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
};

// Both servers exist for every run, so each subject runs beside the same idle one.
Subject& subject(bool sluice) {
  static Subject both[2] = {Subject(false), Subject(true)};
  return both[sluice ? 1 : 0];
}

std::atomic<std::uint64_t> next_address{0};

void run(benchmark::State& state, bool sluice) {
  Subject& s = subject(sluice);
  rls::RateLimitRequest request;
  request.set_domain("edge");
  auto* entry = request.add_descriptors()->add_entries();
  entry->set_key("remote_address");
  std::vector<std::int64_t> latencies;
  latencies.reserve(1 << 16);
  std::uint64_t failed = 0;
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

void BM_EmptyCall(benchmark::State& state) { run(state, false); }
void BM_ShouldRateLimitInMemory(benchmark::State& state) { run(state, true); }

void concurrency(benchmark::internal::Benchmark* b) {
  b->Threads(1)->Threads(8)->Threads(32)->UseRealTime()->MinTime(2.0);
}
BENCHMARK(BM_EmptyCall)->Apply(concurrency);
BENCHMARK(BM_ShouldRateLimitInMemory)->Apply(concurrency);

}  // namespace

BENCHMARK_MAIN();
