// sluice_envoy_rls — an Envoy rate limit service (envoy.service.ratelimit.v3.RateLimitService)
// over sluice's limiters, configured by a directory of the reference service's YAML files.
//
//   sluice_envoy_rls --config-dir DIR [--listen 127.0.0.1:8081] [--response-headers]
//                    [--drain-seconds 5] [--reload-poll-ms 1000] [--max-descriptors 64]
//                    [--max-entries 32] [--max-value-bytes 4096]
//
// The first line on stdout is "sluice_envoy_rls: listening on <host>:<port>" (`--listen
// 127.0.0.1:0` picks a free port). Limits are kept in memory: run one replica.
// - Health: the standard gRPC health service (grpc.health.v1.Health) answers SERVING for the
//   empty service name while the service runs, NOT_SERVING once it drains.
// - Reload: the directory is read again every --reload-poll-ms (0: only on SIGHUP) and on SIGHUP;
//   a changed configuration is published, keeping every unchanged limit's counters; an invalid one
//   is logged to stderr with its file:line:column and the last good one keeps serving.
// - Drain: on SIGTERM or SIGINT the health service turns NOT_SERVING, the server stops accepting
//   calls and waits up to --drain-seconds for the calls in flight, then exits 0.
// - Errors in requests (bounds, empty domain, ...) answer INVALID_ARGUMENT (sluice/envoy.hpp).
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "sluice/envoy.hpp"

namespace {

constexpr std::string_view kUsage =
    "usage: sluice_envoy_rls --config-dir DIR [--listen HOST:PORT] [--response-headers]\n"
    "                        [--drain-seconds N] [--reload-poll-ms N] [--max-descriptors N]\n"
    "                        [--max-entries N] [--max-value-bytes N]\n";

struct Options {
  std::string config_dir;
  std::string listen = "127.0.0.1:8081";
  bool response_headers = false;
  std::uint64_t drain_seconds = 5;
  std::uint64_t reload_poll_ms = 1000;
  sluice::envoy::RequestBounds bounds{};
};

bool parse_count(const char* text, std::uint64_t& out) {
  const char* end = text + std::strlen(text);
  const auto [ptr, error] = std::from_chars(text, end, out);
  return error == std::errc() && ptr == end;
}

std::optional<Options> parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--response-headers") {
      o.response_headers = true;
      continue;
    }
    if (i + 1 >= argc) return std::nullopt;
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
    } else if (flag == "--max-value-bytes" && count && n > 0) {
      o.bounds.max_value_bytes = n;
    } else {
      return std::nullopt;
    }
  }
  if (o.config_dir.empty()) return std::nullopt;
  return o;
}

void log(std::string_view what) {
  std::fprintf(stderr, "sluice_envoy_rls: %.*s\n", static_cast<int>(what.size()), what.data());
}

// Follows the configuration directory: reload() publishes it when it changed.
class ConfigFollower {
 public:
  ConfigFollower(std::string dir, sluice::envoy::ServiceConfig first,
                 sluice::envoy::Limiter& limiter)
      : dir_(std::move(dir)), last_(std::move(first)), limiter_(limiter) {}

  void reload() {
    std::lock_guard lock(mutex_);
    absl::StatusOr<sluice::envoy::ServiceConfig> next = sluice::envoy::load_config_directory(dir_);
    if (!next.ok()) {
      if (next.status() != last_error_)
        log(absl::StrCat("reload refused: ", next.status().message()));
      last_error_ = next.status();
      return;
    }
    last_error_ = absl::OkStatus();
    if (*next == last_) return;
    if (absl::Status s = limiter_.reload(*next); !s.ok()) {
      log(absl::StrCat("reload refused: ", s.message()));
      return;
    }
    last_ = *std::move(next);
    log("configuration reloaded");
  }

 private:
  const std::string dir_;
  std::mutex mutex_;
  sluice::envoy::ServiceConfig last_;
  absl::Status last_error_;
  sluice::envoy::Limiter& limiter_;
};

// Polls the directory every `interval` until `stop` is set.
void poll(ConfigFollower& follower, std::chrono::milliseconds interval,
          const std::atomic<bool>& stop, std::mutex& mutex, std::condition_variable& wake) {
  std::unique_lock lock(mutex);
  while (!stop.load()) {
    wake.wait_for(lock, interval, [&] { return stop.load(); });
    if (stop.load()) break;
    lock.unlock();
    follower.reload();
    lock.lock();
  }
}

// Until SIGTERM or SIGINT (SIGHUP reloads); then NOT_SERVING and a drain of the calls in flight.
void serve_until_signal(grpc::Server& server, ConfigFollower& follower, const Options& options,
                        const sigset_t& signals) {
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::condition_variable wake;
  std::thread poller;
  if (options.reload_poll_ms > 0) {
    poller =
        std::thread(poll, std::ref(follower), std::chrono::milliseconds(options.reload_poll_ms),
                    std::cref(stop), std::ref(mutex), std::ref(wake));
  }
  int signal = 0;
  while (sigwait(&signals, &signal) == 0 && signal == SIGHUP) follower.reload();
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

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Options> options = parse_args(argc, argv);
  if (!options) {
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
  auto limiter = sluice::envoy::Limiter::create(
      *config, {.bounds = options->bounds, .response_headers = options->response_headers});
  if (!limiter.ok()) {
    log(limiter.status().ToString());
    return 2;
  }
  sluice::envoy::RateLimitService service(**limiter);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options->listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    log(absl::StrCat("cannot listen on ", options->listen));
    return 1;
  }
  const std::string host = options->listen.substr(0, options->listen.rfind(':'));
  std::printf("sluice_envoy_rls: listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
  ConfigFollower follower(options->config_dir, *std::move(config), **limiter);
  serve_until_signal(*server, follower, *options, signals);
  server->Wait();
  log("stopped");
  return 0;
}
