// sluice_envoy_rls — an Envoy rate limit service (envoy.service.ratelimit.v3.RateLimitService)
// over sluice's limiters, configured by a directory of the reference service's YAML files.
//
//   sluice_envoy_rls --config-dir DIR [--listen 127.0.0.1:8081] [--response-headers]
//                    [--drain-seconds 5] [--reload-poll-ms 1000] [--max-descriptors 64]
//                    [--max-entries 32] [--max-threads 64] [--redis-max-connections 16]
//
// The first line on stdout is "sluice_envoy_rls: listening on <host>:<port>" (`--listen
// 127.0.0.1:0` picks a free port). Limits are kept in memory (one replica), or with
// --redis-socket / --redis-address in Redis, where every replica with the same --redis-key-prefix
// and --redis-key-seed shares them (--redis-cluster: the address names one node of a Redis
// Cluster), each call bounded by --redis-timeout-ms, over at most --redis-max-connections pooled
// connections (per node in a Cluster; a call that finds none free waits for one within its
// timeout). When Redis fails, --redis-failure-mode decides: fail_open (default) answers OK,
// fail_closed OVER_LIMIT, local decides in this process on --local-share-permille of every limit
// (required with local: about 1000 / replicas), trying Redis again once per --local-retry-ms
// until it answers.
// - Metrics: with --metrics-listen HOST:PORT, GET /metrics there answers every limit's counters
//   in the Prometheus text format (sluice/envoy/prometheus.hpp).
// - Health: the standard gRPC health service (grpc.health.v1.Health) answers SERVING for the
//   empty service name while the service runs, NOT_SERVING once it drains.
// - Reload: the directory is read again every --reload-poll-ms (0: only on SIGHUP) and on SIGHUP;
//   a changed configuration is published, keeping every unchanged limit's counters; an invalid one
//   is logged to stderr with its file:line:column and the last good one keeps serving. A reload
//   never waits for the calls in flight: the configuration it replaced is freed by the polling
//   thread, never a call, after the first poll once they have let go (every second with
//   --reload-poll-ms 0).
// - Drain: on SIGTERM or SIGINT the health service turns NOT_SERVING, the server stops accepting
//   calls and waits up to --drain-seconds for the calls in flight, then exits 0.
// - Errors in requests (bounds, empty domain, ...) answer INVALID_ARGUMENT (sluice/envoy.hpp).
// - Threads: gRPC serves each call on a thread of its own, at most --max-threads of them (at
//   least 2, default 64): N - 1 calls are decided at once, and while they all run the last
//   thread answers every further call RESOURCE_EXHAUSTED at once (Envoy's failure_mode_deny then
//   decides). Without a bound, every call waiting on a slow Redis would hold a new thread.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "sluice/envoy.hpp"
#ifdef SLUICE_ENVOY_RLS_REDIS
#include "sluice/redis.hpp"
#include "sluice/redis/engine_backend.hpp"
#endif
#ifdef SLUICE_ENVOY_RLS_METRICS
#include <httplib.h>
#endif

namespace {

constexpr std::string_view kUsage =
    "usage: sluice_envoy_rls --config-dir DIR [--listen HOST:PORT] [--response-headers]\n"
    "                        [--drain-seconds N] [--reload-poll-ms N] [--max-descriptors N]\n"
    "                        [--max-entries N] [--max-threads N]\n"
    "                        [--redis-socket PATH | --redis-address HOST:PORT [--redis-cluster]]\n"
    "                        [--redis-key-prefix P] [--redis-key-seed N]\n"
    "                        [--redis-timeout-ms N] [--redis-max-connections N]\n"
    "                        [--redis-failure-mode fail_open|fail_closed|local]\n"
    "                        [--local-share-permille N] [--local-retry-ms N]\n"
    "                        [--metrics-listen HOST:PORT]\n"
    "--max-threads N (>= 2, default 64): threads that serve calls; N - 1 calls are decided at\n"
    "once and the rest answered RESOURCE_EXHAUSTED until one ends (Envoy's failure_mode_deny\n"
    "then decides)\n"
    "--redis-max-connections N (1..1000, default 16): connections to Redis (to each node of a\n"
    "Cluster) open at once; a call that finds none free waits for one within --redis-timeout-ms\n";

// The most connections --redis-max-connections may ask for: each one is a file descriptor.
constexpr std::uint64_t kMaxRedisConnections = 1000;

struct Options {
  std::string config_dir;
  std::string listen = "127.0.0.1:8081";
  bool response_headers = false;
  std::uint64_t drain_seconds = 5;
  std::uint64_t reload_poll_ms = 1000;
  // Threads serving calls, the last of them only refusing: 4 x the default 16 pooled Redis
  // connections (calls beyond those wait for one), so that a burst queues briefly for a
  // connection, while a stalled Redis holds at most this many threads.
  std::uint64_t max_threads = 64;
  sluice::envoy::RequestBounds bounds{};
  // Redis: empty socket and address keep the limits in memory.
  std::string redis_socket;
  std::string redis_address;  // HOST:PORT
  bool redis_cluster = false;
  std::string redis_key_prefix = "sluice:envoy:";
  std::string metrics_listen;  // HOST:PORT of the Prometheus endpoint; empty: none
  std::uint64_t redis_key_seed = 0;
  sluice::FailureMode on_redis_error = sluice::FailureMode::kFailOpen;
  std::uint64_t redis_timeout_ms = 200;      // per call: connect, write, reply
  std::uint64_t redis_max_connections = 16;  // the pool's bound (per node in a Cluster)
  std::uint64_t local_share_permille = 0;    // required with --redis-failure-mode local
  std::uint64_t local_retry_ms = 1000;
};

bool parse_count(const char* text, std::uint64_t& out) {
  const char* end = text + std::strlen(text);
  const auto [ptr, error] = std::from_chars(text, end, out);
  return error == std::errc() && ptr == end;
}

// The options `argv` asks for; InvalidArgument naming the flag that is unknown, lacks its value
// or has a bad one.
absl::StatusOr<Options> parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--response-headers" || flag == "--redis-cluster") {
      (flag == "--response-headers" ? o.response_headers : o.redis_cluster) = true;
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(argv[i], " needs a value"));
    const char* value = argv[++i];
    std::uint64_t n = 0;
    const bool count = parse_count(value, n);
    if (flag == "--config-dir") {
      o.config_dir = value;
    } else if (flag == "--listen") {
      o.listen = value;
    } else if (flag == "--drain-seconds" && count) {
      o.drain_seconds = n;
    } else if (flag == "--reload-poll-ms" && count) {
      o.reload_poll_ms = n;
    } else if (flag == "--max-descriptors" && count && n > 0) {
      o.bounds.max_descriptors = n;
    } else if (flag == "--max-entries" && count && n > 0) {
      o.bounds.max_entries = n;
    } else if (flag == "--max-threads" && count && n >= 2 && n <= 65536) {
      o.max_threads = n;
    } else if (flag == "--metrics-listen") {
      o.metrics_listen = value;
    } else if (flag == "--redis-socket") {
      o.redis_socket = value;
    } else if (flag == "--redis-address") {
      o.redis_address = value;
    } else if (flag == "--redis-key-prefix") {
      o.redis_key_prefix = value;
    } else if (flag == "--redis-key-seed" && count) {
      o.redis_key_seed = n;
    } else if (flag == "--redis-failure-mode" && sluice::parse_failure_mode(value)) {
      o.on_redis_error = *sluice::parse_failure_mode(value);
    } else if (flag == "--redis-timeout-ms" && count && n > 0) {
      o.redis_timeout_ms = n;
    } else if (flag == "--redis-max-connections") {
      if (!count || n == 0 || n > kMaxRedisConnections) {
        return absl::InvalidArgumentError(
            absl::StrCat("--redis-max-connections takes a number in 1..", kMaxRedisConnections,
                         ", not \"", value, "\""));
      }
      o.redis_max_connections = n;
    } else if (flag == "--local-share-permille" && count) {
      o.local_share_permille = n;
    } else if (flag == "--local-retry-ms" && count && n > 0) {
      o.local_retry_ms = n;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag or bad value: ", argv[i - 1], " \"", value, "\""));
    }
  }
  if (o.config_dir.empty()) return absl::InvalidArgumentError("--config-dir is required");
  return o;
}

void log(std::string_view what) {
  std::fprintf(stderr, "sluice_envoy_rls: %.*s\n", static_cast<int>(what.size()), what.data());
}

// Follows the configuration directory: reload() publishes it when it changed. A change found by
// polling is published only once the next poll reads the same configuration again, so that a
// file caught while it is being written is not loaded; SIGHUP publishes at once.
class ConfigFollower {
 public:
  // The limiter's reload (publishes a configuration, never waits for calls) and collect_replaced
  // (frees the configurations reloads replaced whose calls have let go; how many are still held).
  struct Limiter {
    std::function<absl::Status(const sluice::envoy::ServiceConfig&)> reload;
    std::function<std::size_t()> collect_replaced;
  };
  ConfigFollower(std::string dir, sluice::envoy::ServiceConfig first, Limiter limiter)
      : dir_(std::move(dir)), last_(std::move(first)), limiter_(std::move(limiter)) {}

  enum class When { kSettled, kNow };

  void reload(When when) {
    std::lock_guard lock(mutex_);
    absl::StatusOr<sluice::envoy::ServiceConfig> next = sluice::envoy::load_config_directory(dir_);
    if (!next.ok()) {
      if (next.status() != last_error_) {
        log(absl::StrCat("reload refused: ", next.status().message()));
      }
      last_error_ = next.status();
      settling_.reset();
      return;
    }
    last_error_ = absl::OkStatus();
    if (*next == last_) {
      settling_.reset();
      return;
    }
    if (when == When::kSettled && settling_ != *next) {
      settling_ = *std::move(next);  // published if the next poll reads it again
      return;
    }
    settling_.reset();
    if (absl::Status s = limiter_.reload(*next); !s.ok()) {
      if (s != last_refusal_) log(absl::StrCat("reload refused: ", s.message()));
      last_refusal_ = s;
      return;
    }
    last_refusal_ = absl::OkStatus();
    last_ = *std::move(next);
    log("configuration reloaded");
  }

  // Frees the replaced configurations that calls have let go of, on this (the polling) thread
  // rather than a call's.
  void collect_replaced() { (void)limiter_.collect_replaced(); }

 private:
  const std::string dir_;
  std::mutex mutex_;
  sluice::envoy::ServiceConfig last_;
  std::optional<sluice::envoy::ServiceConfig> settling_;  // read once by a poll, not yet again
  absl::Status last_error_;
  absl::Status last_refusal_;
  const Limiter limiter_;
};

// Without polling, how often the poller wakes only to free replaced configurations.
constexpr std::chrono::milliseconds kCollectInterval{1000};

// Until `stop` is set: polls the directory every `interval` (0: never), and after every poll frees
// the replaced configurations (a SIGHUP reload's too) that calls have let go of; without polling,
// it does that every kCollectInterval.
void poll(ConfigFollower& follower, std::chrono::milliseconds interval,
          const std::atomic<bool>& stop, std::mutex& mutex, std::condition_variable& wake) {
  const bool polling = interval.count() > 0;
  std::unique_lock lock(mutex);
  while (!stop.load()) {
    wake.wait_for(lock, polling ? interval : kCollectInterval, [&] { return stop.load(); });
    if (stop.load()) break;
    lock.unlock();
    if (polling) follower.reload(ConfigFollower::When::kSettled);
    follower.collect_replaced();
    lock.lock();
  }
}

// Until SIGTERM or SIGINT (SIGHUP reloads); then NOT_SERVING and a drain of the calls in flight.
void serve_until_signal(grpc::Server& server, ConfigFollower& follower, const Options& options,
                        const sigset_t& signals) {
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::condition_variable wake;
  std::thread poller(poll, std::ref(follower), std::chrono::milliseconds(options.reload_poll_ms),
                     std::cref(stop), std::ref(mutex), std::ref(wake));
  int signal = 0;
  while (sigwait(&signals, &signal) == 0 && signal == SIGHUP) {
    follower.reload(ConfigFollower::When::kNow);
  }
  log("draining");
  if (grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  server.Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(options.drain_seconds));
  {
    std::lock_guard lock(mutex);
    stop.store(true);
  }
  wake.notify_all();
  if (poller.joinable()) poller.join();
}

// The server of `service` and the health service on --listen (its port in `port`), serving
// calls on at most --max-threads threads; nullptr if it cannot listen.
std::unique_ptr<grpc::Server> start_server(const Options& options, grpc::Service& service,
                                           int& port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // The synchronous server takes a thread per call from this quota; when none is left, the
  // thread that found the call answers it RESOURCE_EXHAUSTED.
  grpc::ResourceQuota quota("sluice_envoy_rls");
  quota.SetMaxThreads(static_cast<int>(options.max_threads));
  builder.SetResourceQuota(quota);
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  return builder.BuildAndStart();
}

// Serves `config` over `Backend` until a signal stops it; the exit code.
template <class Backend>
int serve(const Options& options, sluice::envoy::ServiceConfig config,
          typename sluice::envoy::BasicLimiter<Backend>::Options limiter_options,
          const sigset_t& signals) {
  auto limiter = sluice::envoy::BasicLimiter<Backend>::create(config, std::move(limiter_options));
  if (!limiter.ok()) {
    log(limiter.status().ToString());
    return 2;
  }
  sluice::envoy::BasicRateLimitService<Backend> service(**limiter);
  int port = 0;
  std::unique_ptr<grpc::Server> server = start_server(options, service, port);
  if (server == nullptr || port == 0) {
    log(absl::StrCat("cannot listen on ", options.listen));
    return 1;
  }
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  std::printf("sluice_envoy_rls: listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
#ifdef SLUICE_ENVOY_RLS_METRICS
  httplib::Server metrics;
  std::thread metrics_thread;
  if (!options.metrics_listen.empty()) {
    metrics.Get("/metrics", [&](const httplib::Request&, httplib::Response& response) {
      std::string body;
      sluice::envoy::append_prometheus_text(body, **limiter);
      response.set_content(body, std::string(sluice::kPrometheusContentType));
    });
    const std::size_t colon = options.metrics_listen.rfind(':');
    std::uint64_t metrics_port = 0;
    if (colon == std::string::npos ||
        !parse_count(options.metrics_listen.c_str() + colon + 1, metrics_port) ||
        metrics_port > 65535 ||
        !metrics.bind_to_port(options.metrics_listen.substr(0, colon),
                              static_cast<int>(metrics_port))) {
      log(absl::StrCat("cannot serve metrics on ", options.metrics_listen));
      return 1;
    }
    metrics_thread = std::thread([&] { metrics.listen_after_bind(); });
  }
#endif
  ConfigFollower follower(
      options.config_dir, std::move(config),
      {.reload = [&](const sluice::envoy::ServiceConfig& next) { return (*limiter)->reload(next); },
       .collect_replaced = [&] { return (*limiter)->collect_replaced(); }});
  serve_until_signal(*server, follower, options, signals);
  server->Wait();
#ifdef SLUICE_ENVOY_RLS_METRICS
  metrics.stop();
  if (metrics_thread.joinable()) metrics_thread.join();
#endif
  log("stopped");
  return 0;
}

#ifdef SLUICE_ENVOY_RLS_REDIS
// The Redis client of --redis-socket or --redis-address.
absl::StatusOr<std::shared_ptr<sluice::redis::Client>> redis_client(const Options& o) {
  sluice::redis::ClientOptions c;
  c.key_prefix = o.redis_key_prefix;
  c.key_seed = o.redis_key_seed;
  c.cluster = o.redis_cluster;
  c.connection.connect_timeout = std::chrono::milliseconds(o.redis_timeout_ms);
  c.connection.command_timeout = std::chrono::milliseconds(o.redis_timeout_ms);
  c.connection.max_connections = o.redis_max_connections;
  if (!o.redis_socket.empty()) {
    c.connection.unix_socket = o.redis_socket;
  } else {
    const std::size_t colon = o.redis_address.rfind(':');
    std::uint64_t port = 0;
    if (colon == std::string::npos || !parse_count(o.redis_address.c_str() + colon + 1, port) ||
        port == 0 || port > 65535) {
      return absl::InvalidArgumentError("--redis-address takes HOST:PORT");
    }
    c.connection.host = o.redis_address.substr(0, colon);
    c.connection.port = static_cast<int>(port);
  }
  return sluice::redis::Client::create(std::move(c));
}
#endif  // SLUICE_ENVOY_RLS_REDIS

}  // namespace

int main(int argc, char** argv) {
  const absl::StatusOr<Options> options = parse_args(argc, argv);
  if (!options.ok()) {
    log(std::string(options.status().message()));
    std::fputs(kUsage.data(), stderr);
    return 2;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before any thread starts: all inherit it

  absl::StatusOr<sluice::envoy::ServiceConfig> config =
      sluice::envoy::load_config_directory(options->config_dir);
  if (!config.ok()) {
    log(config.status().ToString());
    return 2;
  }
  if (options->redis_socket.empty() && options->redis_address.empty()) {
    return serve<sluice::InMemoryBackend<>>(
        *options, *std::move(config),
        {.bounds = options->bounds, .response_headers = options->response_headers}, signals);
  }
#ifndef SLUICE_ENVOY_RLS_REDIS
  log("built without the Redis part (hiredis): --redis-* flags are not available");
  return 2;
#else
  absl::StatusOr<std::shared_ptr<sluice::redis::Client>> client = redis_client(*options);
  if (!client.ok()) {
    log(client.status().ToString());
    return 2;
  }
  return serve<sluice::redis::RedisEngineBackend>(
      *options, *std::move(config),
      {.bounds = options->bounds,
       .on_backend_error = options->on_redis_error,
       .local_share_permille = options->local_share_permille,
       .local_retry_interval = std::chrono::milliseconds(options->local_retry_ms),
       .response_headers = options->response_headers,
       .backend = {.client = *std::move(client)}},
      signals);
#endif
}
