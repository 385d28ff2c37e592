// sluice_gateway — a small HTTP gateway on cpp-httplib that rate-limits every request through a
// sluice::RateLimitEngine compiled from a YAML config (examples/gateway/gateway.yaml).
//
//   sluice_gateway examples/gateway/gateway.yaml [--port 8080] [--listener public]
//                  [--trusted-proxy CIDR]... [--reload-poll-ms 1000] [--reload-settle-ms 1000]
//                  [--upstream http://HOST:PORT]
//
// It binds 127.0.0.1 only; `--port 0` (the default) picks a free port. The first line on stdout is
// "sluice_gateway: listening on http://127.0.0.1:<port> ...". The limiting is sluice's cpp-httplib
// adapter (sluice/httplib.hpp), a pre-routing handler; per request it resolves:
// - route: the longest `path_prefix` among the listener's routes (engine.match_route);
// - consumer: `Authorization: Bearer <token>` looked up among the consumers' credentials; an
//   unknown token is limited by its address, then the adapter answers 401;
// - client address: the peer address and the Forwarded / X-Forwarded-For headers, trusting only
//   the proxies of `gateway.trusted_proxies` in the config (of the generation evaluating the
//   request, so a reload that changes them applies at once): the client is the rightmost address
//   that is not a trusted proxy, so an entry a client writes itself never picks its bucket. No
//   trusted proxy: the peer. --trusted-proxy (repeatable) only checks: the gateway refuses to
//   start unless its list is the config's (any order).
// Answers: 429 with Retry-After, X-RateLimit-*, RateLimit and RateLimit-Policy when denied;
// otherwise 200 JSON (404 for unrouted paths) with the same fields except Retry-After. Exempt
// paths get no fields: /healthz, /readyz, and /metrics (sluice/prometheus.hpp: every engine and
// rule counter, and the factor of adaptive rules).
// Dry-run denials are logged to stderr with the rule's label; credentials are never logged.
// Backend failures are logged from the engine's events: at most one line per status code per
// second, with the count of failures since the previous line.
// SIGINT or SIGTERM stops the server.
//
// Reload (sluice::yaml::ReloadingEngine): the config file is polled every --reload-poll-ms
// (default 1000; 0 turns polling off) and reloaded when its content changed and has then stayed
// the same for --reload-settle-ms (default 1000), and reloaded on SIGHUP. Unchanged rules keep
// their state; a broken file, or one that attaches no rule without `limits_nothing: true`, is
// logged and the last good config keeps serving. Replace the file atomically (write a temporary
// file, then rename it over the config). Each request holds the generation it was evaluated with
// until it is answered. The listener is read once, at start, and must be one of the config's;
// a reload whose config no longer has it is refused (logged; the running config keeps serving),
// since the gateway's requests would then match no listener and pass its limits.
//
// Upstream (--upstream http://HOST:PORT): admitted requests on a route are proxied there (GET,
// the normalized path the route was matched on, and the query byte for byte as the client sent
// it; the whole exchange, connecting included, ends within 10 s, however slowly the upstream
// answers, and a connect takes at most 2 s of it) and the upstream's answer is passed back, with
// the rate-limit fields. A path that cannot be normalized without guessing is answered 400
// (sluice/request_path.hpp), and so is a query with a space or a control character (cpp-httplib
// lets a bare CR into the request target), which no upstream would read as sent. Every answer (its
// latency, status and Retry-After; no answer counts as status 0 and is answered 502) is fed to
// the adaptive rules that applied to the request, so a slow or failing upstream shrinks their
// limits (docs/adaptive.md). Without --upstream the gateway answers routed requests itself with
// the route as JSON.
//
// Cheap attacks it bounds (bounded_server.hpp, kLimits below):
// - slow clients: a request's line, headers and body must arrive within 10 s of the first byte
//   being awaited, whatever the pace (a slowloris client is cut off then), idle keep-alive
//   connections are closed after 5 s, and 64 workers serve connections, so that a few slow
//   clients cannot take every worker from the health checks; an exchange with the upstream ends
//   within 10 s as a whole (upstream_client.hpp), so a slow upstream cannot hold them either;
// - large requests: a body over 64 KiB is refused with 413 before it is read into memory; at
//   most 64 KiB of request line and headers are read; an upstream answer whose body passes 1 MiB
//   is answered 502 (`{"error":"upstream answer too large"}`) without reading the rest, and one
//   whose status line and headers pass 64 KiB (or its body with its chunk framing 2 MiB) is
//   answered 502 (`{"error":"upstream unavailable"}`) without reading further. Memory
//   stays bounded: the end-to-end test (tests/e2e/gateway_e2e.sh) checks that the resident size
//   stays under 64 MiB after large bodies and slow clients.
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bounded_server.hpp"
#include "sluice/engine.hpp"
#include "sluice/gcra.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/httplib.hpp"
#include "sluice/prometheus.hpp"
#include "sluice/yaml.hpp"
#include "sluice/yaml/reloading_engine.hpp"
#include "upstream_client.hpp"

namespace {

struct Options {
  std::string config_path;
  int port = 0;
  std::optional<std::string> listener;
  std::vector<std::string> trusted_proxies;       // CIDRs that must be the config's
  std::chrono::milliseconds reload_poll{1000};    // 0: reload on SIGHUP only
  std::chrono::milliseconds reload_settle{1000};  // a change must stay this long to be loaded
  std::optional<gateway::UpstreamAddress> upstream;
};

constexpr std::string_view kUsage =
    "usage: sluice_gateway CONFIG.yaml [--port N] [--listener NAME] [--trusted-proxy CIDR]...\n"
    "                      [--reload-poll-ms N] [--reload-settle-ms N] [--upstream "
    "http://HOST:PORT]\n";

// What one connection may cost (see the top comment and bounded_server.hpp).
constexpr gateway::ServerLimits kLimits{.workers = 64,
                                        .request_read_timeout = std::chrono::seconds(10),
                                        .max_header_bytes = 64 * 1024,
                                        .max_body_bytes = 64 * 1024};

// The most of an upstream answer's body the gateway holds: a larger answer is answered 502.
constexpr std::size_t kMaxUpstreamBodyBytes = 1024 * 1024;
// The most of an upstream answer read: its status line and headers, then its body with its chunk
// framing. More is answered 502.
constexpr gateway::ReadBudget kUpstreamReadBudget{.head = 64 * 1024,
                                                  .body = 2 * kMaxUpstreamBodyBytes};
// The longest an exchange with the upstream takes (connect, request, whole answer): 502 after.
constexpr std::chrono::seconds kUpstreamTimeout{10};

// A whole number in [0, max], and nothing else.
std::optional<int> parse_int(std::string_view text, int max) {
  int value = 0;
  const char* const end = text.data() + text.size();
  const auto [parsed_to, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || parsed_to != end || value < 0 || value > max) return std::nullopt;
  return value;
}

std::optional<Options> parse_args(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--port" && i + 1 < argc) {
      std::optional<int> port = parse_int(argv[++i], 65535);
      if (!port) return std::nullopt;
      options.port = *port;
    } else if (arg == "--reload-poll-ms" && i + 1 < argc) {
      std::optional<int> ms = parse_int(argv[++i], 24 * 3600 * 1000);
      if (!ms) return std::nullopt;
      options.reload_poll = std::chrono::milliseconds(*ms);
    } else if (arg == "--reload-settle-ms" && i + 1 < argc) {
      std::optional<int> ms = parse_int(argv[++i], 24 * 3600 * 1000);
      if (!ms) return std::nullopt;
      options.reload_settle = std::chrono::milliseconds(*ms);
    } else if (arg == "--upstream" && i + 1 < argc) {
      options.upstream = gateway::parse_upstream(argv[++i]);
      if (!options.upstream) return std::nullopt;
    } else if (arg == "--listener" && i + 1 < argc) {
      options.listener = argv[++i];
    } else if (arg == "--trusted-proxy" && i + 1 < argc) {
      options.trusted_proxies.emplace_back(argv[++i]);
    } else if (!arg.starts_with("-") && options.config_path.empty()) {
      options.config_path = arg;
    } else {
      return std::nullopt;
    }
  }
  if (options.config_path.empty()) return std::nullopt;
  return options;
}

// Text for a log line: at most `limit` bytes, C-escaped (absl::CHexEscape), so that a request
// cannot forge log lines. Request text gets 200 bytes; a refused reload's message (the operator's
// own config, naming the fix at its end) gets 2,000.
std::string loggable(std::string_view text, std::size_t limit = 200) {
  return absl::CHexEscape(absl::string_view(text.data(), std::min(text.size(), limit)));
}

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

void respond_json(httplib::Response& response, int status, std::string_view body) {
  response.status = status;
  response.set_content(absl::StrCat(absl::string_view(body.data(), body.size()), "\n"),
                       "application/json");
}

using Limiter = sluice::HttplibLimiter<sluice::RateLimitEngine>;
using LimitedRequest = Limiter::LimitedRequest;
using Holder = sluice::yaml::ReloadingEngine<sluice::RateLimitEngine>;

// What the gateway adds to the adapter: the log lines, and the answers to admitted requests.
class Gateway {
 public:
  explicit Gateway(std::optional<gateway::UpstreamAddress> upstream)
      : upstream_(std::move(upstream)) {}

  // Logs a dry-run rule's would-be denial (with the rule's label, never a credential), at most
  // one line per rule a second, and a request that the limiter refused as invalid. Backend
  // failures, which repeat on every request while they last, are logged from the engine's
  // rate-limited events instead (on_event).
  static void log(const httplib::Request& request, const LimitedRequest& limited) {
    const sluice::Evaluation& e = limited.evaluation;
    const std::string* label =
        e.dry_denied ? &limited.engine->rule(e.dry_denied->rule).compiled.label : nullptr;
    if (label != nullptr && dry_run_line_allowed(*label)) {
      std::fprintf(
          stderr,
          "sluice_gateway: dry-run denial: rule \"%s\" would deny %s %s from %s "
          "(retry after %lld s)\n",
          label->c_str(), loggable(request.method).c_str(), loggable(request.path).c_str(),
          loggable(limited.client.to_string()).c_str(),
          static_cast<long long>(sluice::retry_after_seconds(e.dry_denied->decision.retry_after)));
    }
    if (e.backend_error.code() == absl::StatusCode::kInvalidArgument) {
      std::fprintf(stderr, "sluice_gateway: request refused by the limiter: %s\n",
                   loggable(std::string(e.backend_error.message())).c_str());
    }
  }

  // Whether a dry-run line of rule `label` may be written now: one per rule a second, so that a
  // client that repeats would-be denials cannot set the log's volume (every one is counted in
  // /metrics, sluice_rule_dry_denied_total). The labels come from the config: bounded.
  static bool dry_run_line_allowed(const std::string& label) {
    static sluice::GcraLimiter<> lines =
        *sluice::GcraLimiter<>::create({{.requests = 1, .period = std::chrono::seconds(1)}});
    const absl::StatusOr<sluice::Decision> d = lines.check(label);
    return d.ok() && d->allowed();
  }

  // Logs a reload's outcome and backend failures (the engine's event hook: at most one backend
  // event per status code per second, counting those held back); dry-run denials are logged by
  // `log`.
  static void on_event(const sluice::EngineEvent& event) {
    if (const auto* failed = std::get_if<sluice::BackendErrorEvent>(&event)) {
      std::fprintf(stderr,
                   "sluice_gateway: limiter backend failed, requests follow on_backend_error: %s "
                   "(%llu more since the last report)\n",
                   loggable(failed->status.ToString()).c_str(),
                   static_cast<unsigned long long>(failed->suppressed));
      return;
    }
    const auto* reload = std::get_if<sluice::ReloadEvent>(&event);
    if (reload == nullptr) return;
    if (reload->status.ok()) {
      std::fprintf(stderr, "sluice_gateway: config reloaded: %zu rules, %zu kept their state\n",
                   reload->rules, reload->rules_kept);
    } else {
      std::fprintf(stderr, "sluice_gateway: reload failed, the previous config keeps serving: %s\n",
                   loggable(std::string(reload->status.message()), 2000).c_str());
    }
  }

  // The answer to an admitted request: 404, the upstream's answer, or the route as JSON (the
  // adapter answers an unknown bearer token 401 itself).
  // Exempt paths go on to the server's handlers (/healthz, /readyz, /metrics).
  Limiter::HandlerResponse answer(const httplib::Request& request, httplib::Response& response,
                                  const LimitedRequest& limited) const {
    if (limited.evaluation.exempt) return Limiter::HandlerResponse::Unhandled;
    if (!limited.route) {
      respond_json(response, 404,
                   absl::StrCat("{\"error\":\"no route\",\"path\":",
                                json_string(loggable(request.path)), "}"));
    } else if (upstream_) {
      proxy(request, response, limited);
    } else {
      std::string body = absl::StrCat("{\"route\":", json_string(limited.route->route));
      if (limited.route->service) {
        absl::StrAppend(&body, ",\"service\":", json_string(*limited.route->service));
      }
      if (limited.consumer) {
        absl::StrAppend(&body, ",\"consumer\":", json_string(*limited.consumer));
      }
      respond_json(response, 200, absl::StrCat(body, "}"));
    }
    return Limiter::HandlerResponse::Handled;
  }

 private:
  // Passes the request to the upstream and its answer back; feeds the answer to the adaptive
  // rules of the request.
  void proxy(const httplib::Request& request, httplib::Response& response,
             const LimitedRequest& limited) const {
    const std::optional<std::string_view> query = raw_query(request);
    if (!query) {
      respond_json(response, 400, "{\"error\":\"malformed query\"}");
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    // The path the request was limited on, never the raw one (see sluice/httplib.hpp), and the
    // query as sent: cpp-httplib's decoded `request.params`, written back, would carry a decoded
    // CR LF into the request line and let a client add requests the limiter never saw.
    const UpstreamAnswer answer = fetch(limited.path + std::string(*query));
    const std::chrono::nanoseconds latency = std::chrono::steady_clock::now() - start;
    sluice::UpstreamResponse fed{.latency = latency, .status = 0};
    const httplib::Response& got = answer.response;
    if (answer.whole || answer.too_large) {
      fed = Limiter::upstream_response(got.status, got.headers, latency);
    }
    if (answer.too_large) {
      respond_json(response, 502, "{\"error\":\"upstream answer too large\"}");
    } else if (answer.whole) {
      response.status = got.status;
      const std::string type = got.get_header_value("Content-Type");
      response.set_content(got.body, type.empty() ? "application/octet-stream" : type.c_str());
      if (got.has_header("Retry-After") && !response.has_header("Retry-After")) {
        response.set_header("Retry-After", got.get_header_value("Retry-After"));
      }
    } else {
      respond_json(response, 502, "{\"error\":\"upstream unavailable\"}");
    }
    if (absl::Status fed_status = Limiter::record_upstream(request, limited, fed);
        !fed_status.ok()) {
      std::fprintf(stderr, "sluice_gateway: cannot record the upstream's answer: %s\n",
                   loggable(std::string(fed_status.message())).c_str());
    }
  }

  // An upstream's answer to GET `target`: its status, headers and at most kMaxUpstreamBodyBytes
  // of body, so that a large (or endless) answer cannot take the gateway's memory with it, all
  // within kUpstreamTimeout, so that a slow one cannot hold the worker.
  struct UpstreamAnswer {
    httplib::Response response;  // status and headers once they came; the body if `whole`
    bool whole = false;          // the whole answer came, its body within the bound
    bool too_large = false;      // its body passed the bound and was not read further
  };
  UpstreamAnswer fetch(const std::string& target) const {
    gateway::UpstreamClient client(
        *upstream_, gateway::UpstreamClient::Clock::now() + kUpstreamTimeout, kUpstreamReadBudget);
    client.set_url_encode(false);  // the normalized path and the query go out byte for byte
    UpstreamAnswer out;
    const httplib::Result result = client.get(
        target,
        [&out](const httplib::Response& head) {
          out.response.status = head.status;
          out.response.headers = head.headers;
          return true;
        },
        [&out](const char* data, std::size_t size) {
          if (size > kMaxUpstreamBodyBytes - out.response.body.size()) {
            out.too_large = true;
            return false;  // cancels the request
          }
          out.response.body.append(data, size);
          return true;
        });
    out.whole = static_cast<bool>(result);
    return out;
  }

  // The query of `request` with its '?', as the request target carried it ("" when there is
  // none); nullopt when it holds a space or a control character.
  static std::optional<std::string_view> raw_query(const httplib::Request& request) {
    const std::string_view target = request.target;
    const std::size_t mark = target.find('?');
    if (mark == std::string_view::npos) return std::string_view();
    const std::string_view query = target.substr(mark);
    const bool plain = std::none_of(query.begin(), query.end(), [](char c) {
      const auto byte = static_cast<unsigned char>(c);
      return byte <= 0x20 || byte == 0x7f;
    });
    if (!plain) return std::nullopt;
    return query;
  }

  std::optional<gateway::UpstreamAddress> upstream_;
};

// Prints `status` as the gateway's error.
void print_error(const absl::Status& status) {
  std::fprintf(stderr, "sluice_gateway: %s\n", std::string(status.message()).c_str());
}

// The reloading engine for the config at `options.config_path`; the first listener of the config
// becomes `options.listener` when none was given. An error is printed to stderr.
std::unique_ptr<Holder> load(Options& options) {
  // The listener comes from the file as it is at start.
  absl::StatusOr<sluice::PolicyConfig> config = sluice::yaml::load_config_file(options.config_path);
  if (!config.ok()) {
    print_error(config.status());
    return nullptr;
  }
  if (!options.listener && !config->listeners.empty()) {
    options.listener = config->listeners.front().name;
  }
  absl::StatusOr<std::unique_ptr<Holder>> holder = Holder::create(
      options.config_path, {.on_event = &Gateway::on_event, .settle = options.reload_settle});
  if (!holder.ok()) {
    print_error(holder.status());
    return nullptr;
  }
  return *std::move(holder);
}

// Binds 127.0.0.1 on `port` (0: any free port); the bound port, or -1.
int bind_loopback(httplib::Server& server, int port) {
  if (port == 0) return server.bind_to_any_port("127.0.0.1");
  return server.bind_to_port("127.0.0.1", port) ? port : -1;
}

// Polls the config file every `period` until stopped (a period of 0: never).
class Poller {
 public:
  Poller(Holder& holder, std::chrono::milliseconds period) {
    if (period.count() == 0) return;
    thread_ = std::thread([this, &holder, period] {
      std::unique_lock lock(mutex_);
      while (!cv_.wait_for(lock, period, [this] { return stopped_; })) {
        lock.unlock();
        (void)holder.poll();  // the outcome is logged by the event hook
        lock.lock();
      }
    });
  }
  ~Poller() {
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::thread thread_;
};

// Serves until SIGINT or SIGTERM; SIGHUP reloads the config. `signals` are blocked in every
// thread and taken by one waiter, which reloads on SIGHUP and stops the server on the others.
// Returns the exit code.
int serve(httplib::Server& server, Holder& holder, const sigset_t& signals) {
  std::thread waiter([&] {
    int signal = 0;
    while (sigwait(&signals, &signal) == 0 && signal == SIGHUP) {
      (void)holder.reload();  // the outcome is logged by the event hook
    }
    server.stop();
  });
  const bool ok = server.listen_after_bind();
  if (waiter.joinable()) {
    pthread_kill(waiter.native_handle(), SIGTERM);  // wake the waiter if the server ended first
    waiter.join();
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Options> options = parse_args(argc, argv);
  if (!options) {
    std::fputs(kUsage.data(), stderr);
    return 2;
  }
  const std::unique_ptr<Holder> loaded = load(*options);
  if (!loaded) return 2;
  Holder& holder = *loaded;

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const auto gateway = std::make_shared<const Gateway>(options->upstream);
  gateway::BoundedServer server(kLimits);
  server.set_keep_alive_timeout(5);
  server.set_read_timeout(5);
  server.set_write_timeout(5);
  absl::StatusOr<Limiter> limiter =
      Limiter::create(holder,
                      {.listener = options->listener.value_or(""),
                       .on_evaluated = &Gateway::log,
                       .on_admitted =
                           [gateway](const httplib::Request& request, httplib::Response& response,
                                     const LimitedRequest& limited) {
                             return gateway->answer(request, response, limited);
                           }},
                      options->trusted_proxies);
  if (!limiter.ok()) {
    print_error(limiter.status());
    return 2;
  }
  limiter->install(server);
  const auto ok = [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  };
  server.Get("/healthz", ok);
  server.Get("/readyz", ok);
  server.Get("/metrics", [&holder](const httplib::Request&, httplib::Response& response) {
    std::string body;
    sluice::append_prometheus_text(body, *holder.current());
    response.set_content(body, std::string(sluice::kPrometheusContentType).c_str());
  });
  const int port = bind_loopback(server, options->port);
  if (port < 0) {
    std::fprintf(stderr, "sluice_gateway: cannot bind 127.0.0.1:%d\n", options->port);
    return 1;
  }
  std::printf("sluice_gateway: listening on http://127.0.0.1:%d (listener \"%s\", %zu rules)\n",
              port, options->listener.value_or("").c_str(), holder.current()->rule_count());
  std::fflush(stdout);
  const Poller poller(holder, options->reload_poll);
  return serve(server, holder, signals);
}
