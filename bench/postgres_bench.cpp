// sluice::postgres against a private PostgreSQL 15, beside its baselines on the same connections:
//   - BM_SelectOne: a prepared `SELECT 1` round trip through the same pool (the round-trip limit
//     at the same concurrency),
//   - BM_PostgresCheck: PostgresGcraLimiter::check, one call of sluice.check_one_v1 (one UPDATE for
//     a key with a row; new keys: lock, read,
//     decide, write, commit),
//   - BM_PostgresBatch4: four keys in one all-or-nothing batch (one round trip),
//   - BM_RedisCheck (where sluice::redis is built): RedisGcraLimiter-equivalent Client::check_all
//     against a private redis-server in the same process, for comparison.
// Each at 1, 8 and 32 callers (threads), each caller on its own pooled connection.
//
// `--interleaved=ROUNDS` runs instead, ROUNDS times, 1-second slices of each subject at 1, 8 and
// 32 callers in a shuffled order per round: the sluice check (sluice.check_one_v1) and the
// reference a user would otherwise write, one prepared `INSERT … ON CONFLICT DO UPDATE …
// RETURNING` GCRA statement per check (same keys as digests, same clock, same durability), the
// path every check took before schema version 5 (sluice.check_v2 for one key), and the one-key
// statement in `numeric` (kCheckOneSql: what `check` sends for a fractional interval; this
// limit's whole 1 ms interval takes the `bigint` one). It prints checks/s, p50 and p99 latency,
// the callers' CPU per check (this process) and the server's (utime + stime of the postmaster
// and its children, from /proc) per slice, with the load average before each round.
//
// The PostgreSQL server runs with its durable defaults (fsync and synchronous_commit on) unless
// SLUICE_BENCH_PG_FAST=1 turns both off. Every check is admitted and writes its row.
//
// `--instruction-inputs=DIR CONNINFO` writes the inputs of scripts/postgres_instructions, which
// counts the server's instructions per check of these statements under callgrind.
//
// Usage: build/bench/bench/postgres_bench [--benchmark_filter=...]
// Starts both servers in temporary directories (unix sockets) and stops them at exit.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
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
  // The same limit through a client over the same pool that sends every check alone.
  std::shared_ptr<sp::Client> uncoalesced_client;
  std::unique_ptr<sp::PostgresGcraLimiter> uncoalesced;
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
  // SLUICE_BENCH_PG_CALLS: ClientOptions::max_coalesced_calls (default: the client's default).
  const char* calls = std::getenv("SLUICE_BENCH_PG_CALLS");
  auto client = sp::Client::create(
      {.connection = {.conninfo = fixture->server->conninfo(),
                      .connect_timeout = std::chrono::seconds(5),
                      .acquire_timeout = std::chrono::seconds(5),
                      .statement_timeout = std::chrono::seconds(5),
                      .reply_grace = std::chrono::seconds(1),
                      .max_connections = kMaxConnections},
       .key_seed = 7,
       .max_coalesced_calls = calls != nullptr ? std::strtoul(calls, nullptr, 10)
                                               : sp::ClientOptions{}.max_coalesced_calls});
  if (!client.ok()) fail(client.status().ToString());
  fixture->client = *client;
  if (auto v = sp::migrate(fixture->client->pool()); !v.ok()) fail(v.status().ToString());
  auto limiter = sp::PostgresGcraLimiter::create(
      {{.requests = 1000, .period = std::chrono::seconds(1), .burst = kBurst}}, fixture->client,
      "bench");
  if (!limiter.ok()) fail(limiter.status().ToString());
  fixture->limiter = std::make_unique<sp::PostgresGcraLimiter>(*std::move(limiter));
  fixture->uncoalesced_client = std::make_shared<sp::Client>(
      fixture->client->shared_pool(), sp::ClientOptions{.key_seed = 7, .coalesce = false});
  auto uncoalesced = sp::PostgresGcraLimiter::create(
      {{.requests = 1000, .period = std::chrono::seconds(1), .burst = kBurst}},
      fixture->uncoalesced_client, "bench");
  if (!uncoalesced.ok()) fail(uncoalesced.status().ToString());
  fixture->uncoalesced = std::make_unique<sp::PostgresGcraLimiter>(*std::move(uncoalesced));
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

// --- the interleaved comparison (--interleaved=ROUNDS) ---------------------------------------

constexpr const char* kRefCreate =
    "CREATE TABLE IF NOT EXISTS bench_ref_gcra (key bytea PRIMARY KEY, tat bigint NOT NULL)";
// One GCRA check per statement: emission interval $2 ns, tolerance $3 ns (burst · interval).
constexpr const char* kRefSql =
    "WITH t AS (SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint * 1000 AS now_ns) "
    "INSERT INTO bench_ref_gcra AS r (key, tat) SELECT $1::bytea, t.now_ns + $2::bigint FROM t "
    "ON CONFLICT (key) DO UPDATE SET tat = greatest(r.tat, excluded.tat - $2::bigint) + $2::bigint "
    "WHERE greatest(r.tat, excluded.tat - $2::bigint) - (excluded.tat - $2::bigint) + $2::bigint "
    "<= $3::bigint RETURNING tat";

// CPU ticks (utime + stime) of the postmaster and its children.
long server_ticks() {
  std::ifstream pidfile(fixture->server->socket_dir() + "/data/postmaster.pid");
  long postmaster = 0;
  pidfile >> postmaster;
  long total = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const std::size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    long ppid = 0, skip = 0, utime = 0, stime = 0;
    rest >> state >> ppid;
    for (int i = 0; i < 9; ++i) rest >> skip;
    rest >> utime >> stime;
    const long pid = std::atol(entry.path().filename().c_str());
    if (pid == postmaster || ppid == postmaster) total += utime + stime;
  }
  return total;
}

// The reference statement's parameters for `digest`: 1000 per second, burst · interval, and
// `time` as a fourth where the clock expression is replaced by it (instruction counts).
std::vector<sp::Param> ref_params(const sluice::KeyDigest& digest,
                                  std::optional<std::chrono::nanoseconds> time) {
  std::vector<sp::Param> p(time ? 4 : 3);
  p[0].binary = true;
  sp::detail::append_digest(p[0].value, digest);
  p[1].value = "1000000";
  p[2].value = absl::StrCat(kBurst * 1'000'000);
  if (time) p[3].value = absl::StrCat(time->count());
  return p;
}

// One caller's check of `key` by `subject` (0: sluice, coalescing; 1: the reference; 2: sluice
// with every check sent alone; 3: the numeric one-key statement, kCheckOneSql).
// False on failure.
bool one_check(int subject, const std::string& key, const sluice::KeyDigest& digest) {
  if (subject == 0) {
    absl::StatusOr<sluice::Decision> d = fixture->limiter->check(key);
    return d.ok() && d->allowed();
  }
  if (subject == 3) {  // the numeric one-key statement every such check took before
    auto lease = fixture->client->pool().acquire();
    if (!lease.ok()) return false;
    auto r =
        lease->run(sp::detail::kCheckOneStatement, sp::detail::kCheckOneSql,
                   sp::detail::check_one_params(digest, fixture->limiter->limit(), 1, std::nullopt),
                   sp::detail::Effect::kWrites);
    return r.ok() && PQntuples(r->get()) == 1;
  }
  if (subject == 2) {  // every check sent alone (ClientOptions::coalesce = false)
    absl::StatusOr<sluice::Decision> d = fixture->uncoalesced->check(key);
    return d.ok() && d->allowed();
  }
  auto lease = fixture->client->pool().acquire();
  if (!lease.ok()) return false;
  auto r = lease->run("bench_ref_gcra", kRefSql, ref_params(digest, std::nullopt),
                      sp::detail::Effect::kWrites);
  return r.ok() && PQntuples(r->get()) == 1;
}

// CPU seconds (user + system) of this process: the callers' side of a check.
double client_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct Slice {
  double per_second = 0, p50_us = 0, p99_us = 0, server_us_per_check = 0, client_us_per_check = 0;
  long failures = 0;
};

bool shared_keys() {
  const char* shared = std::getenv("SLUICE_BENCH_PG_SHARED");
  return shared != nullptr && std::string_view(shared) == "1";
}

Slice run_slice(int subject, int callers) {
  std::atomic<bool> stop{false};
  std::atomic<long> failures{0};
  std::vector<std::vector<double>> latencies(callers);
  const long ticks_before = server_ticks();
  const double client_before = client_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < callers; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::string> keys;
      std::vector<sluice::KeyDigest> digests;
      for (int i = 0; i < kKeysPerThread; ++i) {
        // SLUICE_BENCH_PG_SHARED=1: every caller cycles over the same 4 keys (a shared limit).
        keys.push_back(shared_keys() ? absl::StrCat("bench:shared:", i % 4)
                                     : absl::StrCat("bench:", t, ":", i));
        digests.push_back(fixture->client->digest(keys.back(), fixture->limiter->limit()));
      }
      for (int i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        const auto at = std::chrono::steady_clock::now();
        if (!one_check(subject, keys[i % kKeysPerThread], digests[i % kKeysPerThread])) ++failures;
        latencies[t].push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - at)
                .count());
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  stop = true;
  for (auto& th : threads) th.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  Slice s;
  s.failures = failures.load();
  if (all.empty()) return s;
  s.per_second = static_cast<double>(all.size()) / seconds;
  s.p50_us = all[all.size() / 2];
  s.p99_us = all[all.size() * 99 / 100];
  s.server_us_per_check = static_cast<double>(server_ticks() - ticks_before) * 1e6 /
                          static_cast<double>(sysconf(_SC_CLK_TCK)) /
                          static_cast<double>(all.size());
  s.client_us_per_check =
      (client_cpu_seconds() - client_before) * 1e6 / static_cast<double>(all.size());
  return s;
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

void interleaved(int rounds) {
  {
    auto lease = fixture->client->pool().acquire();
    if (!lease.ok()) fail(lease.status().ToString());
    if (auto r =
            lease->run_simple(kRefCreate, std::chrono::seconds(5), sp::detail::Effect::kWrites);
        !r.ok()) {
      fail(r.status().ToString());
    }
  }
  const char* names[] = {"sluice check", "reference upsert", "sluice uncoalesced",
                         "numeric check_one"};
  std::mt19937 shuffle(12345);
  std::printf(
      "round,callers,subject,checks_per_s,p50_us,p99_us,server_us_per_check,client_us_per_check,"
      "failures\n");
  for (int round = 1; round <= rounds; ++round) {
    std::printf("# round %d, load average %s\n", round, load_average().c_str());
    std::vector<std::pair<int, int>> order;  // (callers, subject)
    for (int callers : {1, 8, 32}) {
      for (int subject : {0, 1, 2, 3}) order.emplace_back(callers, subject);
    }
    std::shuffle(order.begin(), order.end(), shuffle);
    for (const auto& [callers, subject] : order) {
      const Slice s = run_slice(subject, callers);
      std::printf("%d,%d,%s,%.0f,%.0f,%.0f,%.1f,%.1f,%ld\n", round, callers, names[subject],
                  s.per_second, s.p50_us, s.p99_us, s.server_us_per_check, s.client_us_per_check,
                  s.failures);
      std::fflush(stdout);
    }
  }
}

// --- statements for instruction counts (scripts/postgres_instructions) -------------------------

// `p` as an SQL literal.
std::string literal(const sp::Param& p) {
  if (p.null) return "NULL";
  if (p.binary) return absl::StrCat("'\\x", absl::BytesToHexString(p.value), "'");
  return absl::StrCat("'", p.value, "'");
}

// On the server at `conninfo`: installs the schema, stores one caller's 16 keys under each
// subject (one check each), and writes `dir`/<subject>_<n>.sql for n = 200 and 1,200: `PREPARE
// p AS <statement>`, then n `EXECUTE p(...)` over the 16 keys, one command per line, for
// `postgres --single`, and <subject>_args_<n>.sql, the same lines executing `SELECT 1`. Subjects:
// the reference upsert, the numeric one-key statement, the bigint one (this limit's interval is a
// whole 1 ms), and batch<k> for k = 1, 4, 8, 16: one call of sluice.check_v2 deciding the first
// k keys each on its own (BatchMode::kEachItem), the call a coalescer of concurrent checks would
// make with the server's one function for several keys.
int instruction_inputs(const std::string& dir, const std::string& conninfo) {
  auto client = sp::Client::create({.connection = {.conninfo = conninfo}, .key_seed = 7});
  if (!client.ok()) fail(client.status().ToString());
  if (auto v = sp::migrate((*client)->pool()); !v.ok()) fail(v.status().ToString());
  auto limit = sp::Limit::gcra(
      {{.requests = 1000, .period = std::chrono::seconds(1), .burst = kBurst}}, "bench");
  if (!limit.ok()) fail(limit.status().ToString());
  // Every check at one time, given as a parameter (the reference's clock expression replaced by
  // it too): the database clock would make the count depend on how fast callgrind runs, through
  // how often a key's idle_hint changes (an update that is not in place).
  const std::chrono::nanoseconds at = std::chrono::system_clock::now().time_since_epoch();
  std::string ref_sql_at = kRefSql;
  const std::string clock = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint * 1000";
  ref_sql_at.replace(ref_sql_at.find(clock), clock.size(), "$4::bigint");
  struct Subject {
    std::string name;
    std::string sql;
    std::function<std::vector<sp::Param>(const sluice::KeyDigest&)> params;
  };
  std::vector<sluice::KeyDigest> digests;
  for (int i = 0; i < kKeysPerThread; ++i) {
    digests.push_back((*client)->digest(absl::StrCat("bench:0:", i), *limit));
  }
  const std::vector<const sp::Limit*> limits(digests.size(), &*limit);
  const std::vector<std::uint64_t> costs(digests.size(), 1);
  std::vector<Subject> subjects = {
      {"reference", ref_sql_at, [&](const sluice::KeyDigest& d) { return ref_params(d, at); }},
      {"numeric", sp::detail::kCheckOneSql,
       [&](const sluice::KeyDigest& d) { return sp::detail::check_one_params(d, *limit, 1, at); }},
      {"bigint", sp::detail::kCheckIntervalSql,
       [&](const sluice::KeyDigest& d) {
         std::optional<std::vector<sp::Param>> p =
             sp::detail::check_interval_params(d, *limit, 1, at);
         if (!p) fail("the bench limit's interval is not whole");
         return *std::move(p);
       }},
  };
  for (const std::size_t k : {1, 4, 8, 16}) {
    subjects.push_back(
        {absl::StrCat("batch", k), sp::detail::kCheckSql, [&, k](const sluice::KeyDigest&) {
           return sp::detail::check_params(sp::Algorithm::kGcra, std::span(digests).first(k),
                                           std::span(limits).first(k), std::span(costs).first(k),
                                           /*all_or_nothing=*/false, at);
         }});
  }
  for (const std::size_t k : {1, 4, 8, 16}) {
    subjects.push_back(
        {absl::StrCat("set", k), sp::detail::kCheckSetSql, [&, k](const sluice::KeyDigest&) {
           return *sp::detail::check_set_params(std::span(digests).first(k), *limit, 1, at);
         }});
  }
  auto lease = (*client)->pool().acquire();
  if (!lease.ok()) fail(lease.status().ToString());
  if (auto r = lease->run_simple(kRefCreate, std::chrono::seconds(5), sp::detail::Effect::kWrites);
      !r.ok()) {
    fail(r.status().ToString());
  }
  for (const Subject& subject : subjects) {
    for (const sluice::KeyDigest& d : digests) {  // every key has its row before counting
      auto r = lease->run(subject.name.c_str(), subject.sql.c_str(), subject.params(d),
                          sp::detail::Effect::kWrites);
      if (!r.ok()) fail(r.status().ToString());
    }
    // The same EXECUTE lines of `SELECT 1` (<subject>_args_<n>.sql): what parsing them costs.
    std::string types;
    for (const sp::Param& p : subject.params(digests[0])) {
      absl::StrAppend(&types, types.empty() ? "" : ", ", p.binary ? "bytea" : "bigint");
    }
    for (int n : {200, 1200}) {
      for (const bool args_only : {false, true}) {
        const std::string file =
            absl::StrCat(dir, "/", subject.name, args_only ? "_args_" : "_", n, ".sql");
        std::ofstream out(file);
        out << "SET plan_cache_mode = force_generic_plan\n";  // as the pool's connections
        if (args_only) {
          out << "PREPARE p(" << types << ") AS SELECT 1\n";
        } else {
          out << "PREPARE p AS " << subject.sql << "\n";
        }
        for (int i = 0; i < n; ++i) {
          std::string args;
          for (const sp::Param& p : subject.params(digests[i % digests.size()])) {
            absl::StrAppend(&args, args.empty() ? "" : ", ", literal(p));
          }
          out << "EXECUTE p(" << args << ")\n";
        }
        if (!out) fail("cannot write " + file);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]).starts_with("--instruction-inputs=")) {
    return instruction_inputs(argv[1] + std::strlen("--instruction-inputs="), argv[2]);
  }
  if (argc == 2 && std::string_view(argv[1]).starts_with("--interleaved=")) {
    start();
    interleaved(std::atoi(argv[1] + std::strlen("--interleaved=")));
    delete fixture;
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  start();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  delete fixture;
  return 0;
}
