// sluice::redis over a private local Redis Cluster (three primaries, three replicas), beside the
// same calls to one plain redis-server:
//   - BM_OneKey_{Single,Cluster}: one single-key check (RedisGcraLimiter::check) per iteration;
//     the Cluster's extra cost is the slot lookup.
//   - BM_TwoRules_{Single,Cluster}: two keys of two limits in one check_all, both admitted. On one
//     node it is one script call; in the Cluster the two keys (chosen on different primaries) are
//     two booking calls sent to their nodes in parallel.
//   - BM_TwoRulesDenied_Cluster: the same, but the second limit always denies, so the first
//     node's booking is given back (a second round trip to that node).
//
// Usage: build/bench/bench/redis_cluster_bench [--benchmark_filter=...]
// Starts the servers from PATH in temporary directories and kills them at exit.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "redis_cluster.hpp"
#include "redis_server.hpp"
#include "sluice/redis.hpp"
#include "sluice/redis/detail/cluster.hpp"

namespace {

namespace sr = sluice::redis;

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "redis_cluster_bench: %s\n", why.c_str());
  std::exit(1);
}

std::shared_ptr<sr::Client> make_client(int port, bool cluster) {
  sr::ClientOptions o;
  o.connection.host = "127.0.0.1";
  o.connection.port = port;
  o.cluster = cluster;
  o.key_prefix = "bench:";
  o.key_seed = 7;
  auto c = sr::Client::create(o);
  if (!c.ok()) fail(c.status().ToString());
  return *std::move(c);
}

struct Servers {
  sluice_test::RedisServer single;
  std::shared_ptr<sr::Client> single_client;
  std::shared_ptr<sr::Client> cluster_client;
  Servers() {
    if (std::string e = single.start(); !e.empty()) fail(e);
    if (const std::string& e = sluice_test::RedisCluster::shared().error(); !e.empty()) fail(e);
    single_client = make_client(single.port(), false);
    cluster_client = make_client(sluice_test::RedisCluster::shared().seed_port(), true);
  }
};
Servers& servers() {
  static Servers s;
  return s;
}

// Wide enough never to deny within a run; the narrow one denies after its first call.
const sr::Limit& wide() {
  static const sr::Limit l =
      *sr::Limit::create({{.requests = 1'000'000'000, .period = std::chrono::seconds(1)}});
  return l;
}
const sr::Limit& narrow() {
  static const sr::Limit l = *sr::Limit::create({{.requests = 1, .period = std::chrono::hours(1)}});
  return l;
}

// A key of `limit` whose slot's primary differs from that of ("a", wide()).
std::string other_node_key(sr::Client& c, const sr::Limit& limit) {
  sluice_test::RedisCluster& rc = sluice_test::RedisCluster::shared();
  const int first = rc.primary_of(sr::detail::key_slot(c.redis_key("a", wide())));
  for (int i = 0;; ++i) {
    std::string k = "b" + std::to_string(i);
    if (rc.primary_of(sr::detail::key_slot(c.redis_key(k, limit))) != first) return k;
  }
}

void one_key(benchmark::State& state, sr::Client& c) {
  const sr::CheckItem item{.key = "a", .limit = &wide(), .cost = 1};
  for (auto _ : state) {
    auto d = c.check_all(std::span(&item, 1));
    if (!d.ok()) {
      state.SkipWithError(d.status().ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void two_rules(benchmark::State& state, sr::Client& c, const sr::Limit& second, bool admit) {
  const std::string b = other_node_key(c, second);
  const sr::CheckItem items[] = {{.key = "a", .limit = &wide(), .cost = 1},
                                 {.key = b, .limit = &second, .cost = 1}};
  for (auto _ : state) {
    auto d = c.check_all(items);
    if (!d.ok() || (admit && !(*d)[1].allowed())) {
      state.SkipWithError(d.ok() ? "denied" : d.status().ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_OneKey_Single(benchmark::State& state) { one_key(state, *servers().single_client); }
void BM_OneKey_Cluster(benchmark::State& state) { one_key(state, *servers().cluster_client); }
void BM_TwoRules_Single(benchmark::State& state) {
  two_rules(state, *servers().single_client, wide(), true);
}
void BM_TwoRules_Cluster(benchmark::State& state) {
  two_rules(state, *servers().cluster_client, wide(), true);
}
void BM_TwoRulesDenied_Cluster(benchmark::State& state) {
  two_rules(state, *servers().cluster_client, narrow(), false);
}

BENCHMARK(BM_OneKey_Single)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_OneKey_Cluster)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_TwoRules_Single)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_TwoRules_Cluster)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_TwoRulesDenied_Cluster)->UseRealTime()->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
