// sluice_gateway — a small HTTP gateway on cpp-httplib that rate-limits every request through a
// sluice::RateLimitEngine compiled from a YAML config (examples/gateway/gateway.yaml).
//
//   sluice_gateway examples/gateway/gateway.yaml [--port 8080] [--listener public]
//                  [--trusted-proxy CIDR]...
//
// It binds 127.0.0.1 only; `--port 0` (the default) picks a free port. The first line on stdout is
// "sluice_gateway: listening on http://127.0.0.1:<port> ...". The limiting is sluice's cpp-httplib
// adapter (sluice/httplib.hpp), a pre-routing handler; per request it resolves:
// - route: the longest `path_prefix` among the listener's routes (engine.match_route);
// - consumer: `Authorization: Bearer <token>` looked up among the consumers' credentials; an
//   unknown token is limited like an anonymous caller, then answered 401;
// - client address: sluice::ClientAddressResolver over the peer address and the Forwarded /
//   X-Forwarded-For headers, trusting only the proxies of `gateway.trusted_proxies` in the config
//   and of --trusted-proxy (repeatable): the client is the rightmost address that is not a trusted
//   proxy, so an entry a client writes itself never picks its bucket. No trusted proxy: the peer.
// Answers: 429 with Retry-After, X-RateLimit-*, RateLimit and RateLimit-Policy when denied;
// otherwise 200 JSON (404 for unrouted paths) with the same fields except Retry-After. Exempt
// paths get no fields: /healthz, /readyz, and /metrics (Prometheus text, per-rule counters).
// Dry-run denials are logged to stderr with the rule's label; credentials are never logged.
// SIGINT or SIGTERM stops the server.
//
// Cheap attacks it bounds (bounded_server.hpp, kLimits below):
// - slow clients: a request's line, headers and body must arrive within 10 s of the first byte
//   being awaited, whatever the pace (a slowloris client is cut off then), idle keep-alive
//   connections are closed after 5 s, and 64 workers serve connections, so that a few slow
//   clients cannot take every worker from the health checks;
// - large requests: a body over 64 KiB is refused with 413 before it is read into memory; at
//   most 64 KiB of request line and headers are read. Memory stays bounded: the end-to-end test
//   (tests/e2e/gateway_e2e.sh) checks that the resident size stays under 64 MiB after large
//   bodies and slow clients.
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bounded_server.hpp"
#include "sluice/client_address.hpp"
#include "sluice/engine.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/httplib.hpp"
#include "sluice/yaml.hpp"

namespace {

struct Options {
  std::string config_path;
  int port = 0;
  std::optional<std::string> listener;
  std::vector<std::string> trusted_proxies;  // CIDRs, besides the config's
};

constexpr std::string_view kUsage =
    "usage: sluice_gateway CONFIG.yaml [--port N] [--listener NAME] [--trusted-proxy CIDR]...\n";

// What one connection may cost (see the top comment and bounded_server.hpp).
constexpr gateway::ServerLimits kLimits{.workers = 64,
                                        .request_read_timeout = std::chrono::seconds(10),
                                        .max_header_bytes = 64 * 1024,
                                        .max_body_bytes = 64 * 1024};

// A port number, 0 ... 65535, and nothing else.
std::optional<int> parse_port(std::string_view text) {
  int port = 0;
  const char* const end = text.data() + text.size();
  const auto [parsed_to, error] = std::from_chars(text.data(), end, port);
  if (error != std::errc() || parsed_to != end || port < 0 || port > 65535) return std::nullopt;
  return port;
}

std::optional<Options> parse_args(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--port" && i + 1 < argc) {
      std::optional<int> port = parse_port(argv[++i]);
      if (!port) return std::nullopt;
      options.port = *port;
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

// Request text for a log line: at most 200 bytes, C-escaped (absl::CHexEscape), so that a
// request cannot forge log lines.
std::string loggable(std::string_view text) {
  return absl::CHexEscape(absl::string_view(text.data(), std::min<std::size_t>(text.size(), 200)));
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

// A Prometheus label value: backslash, double quote and newline escaped.
std::string label_value(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Per-rule counters in the Prometheus text exposition format.
std::string metrics_text(const sluice::RateLimitEngine& engine) {
  struct Metric {
    const char* name;
    const char* type;
    const char* help;
    std::uint64_t (*value)(const sluice::RuleStats&);
  };
  static constexpr Metric kMetrics[] = {
      {"sluice_rule_allowed_total", "counter", "Admitted requests the rule applied to.",
       [](const sluice::RuleStats& s) { return s.admitted; }},
      {"sluice_rule_denied_total", "counter", "Requests the rule denied (live rules).",
       [](const sluice::RuleStats& s) { return s.denied; }},
      {"sluice_rule_dry_denied_total", "counter",
       "Requests the rule would have denied (dry-run rules).",
       [](const sluice::RuleStats& s) { return s.dry_denied; }},
      {"sluice_rule_evictions_total", "counter",
       "Live keys evicted from a full store (each got a fresh bucket).",
       [](const sluice::RuleStats& s) { return s.store.live_evicted; }},
      {"sluice_rule_idle_reclaimed_total", "counter", "Idle keys dropped from a full store.",
       [](const sluice::RuleStats& s) { return s.store.idle_reclaimed; }},
      {"sluice_rule_capacity_denials_total", "counter", "Requests denied because a store was full.",
       [](const sluice::RuleStats& s) { return s.store.capacity_denials; }},
      {"sluice_rule_keys", "gauge", "Keys the rule's store holds.",
       [](const sluice::RuleStats& s) { return s.store.size; }},
  };
  const std::vector<sluice::RuleStats> stats = engine.stats();
  std::string out;
  for (const Metric& metric : kMetrics) {
    absl::StrAppend(&out, "# HELP ", metric.name, " ", metric.help, "\n");
    absl::StrAppend(&out, "# TYPE ", metric.name, " ", metric.type, "\n");
    for (const sluice::RuleStats& rule : stats) {
      absl::StrAppend(&out, metric.name, "{rule=\"", label_value(rule.label), "\",dry_run=\"",
                      rule.dry_run ? "true" : "false", "\"} ", metric.value(rule), "\n");
    }
  }
  return out;
}

void respond_json(httplib::Response& response, int status, std::string_view body) {
  response.status = status;
  response.set_content(absl::StrCat(absl::string_view(body.data(), body.size()), "\n"),
                       "application/json");
}

using Limiter = sluice::HttplibLimiter<sluice::RateLimitEngine>;
using LimitedRequest = Limiter::LimitedRequest;

// What the gateway adds to the adapter: the log lines, and the answers to admitted requests.
class Gateway {
 public:
  // Logs a dry-run rule's would-be denial (with the rule's label, never a credential) and a
  // limiter error.
  static void log(const httplib::Request& request, const LimitedRequest& limited) {
    const sluice::Evaluation& e = limited.evaluation;
    if (e.dry_denied) {
      const std::string& label = limited.engine->rule(e.dry_denied->rule).compiled.label;
      std::fprintf(
          stderr,
          "sluice_gateway: dry-run denial: rule \"%s\" would deny %s %s from %s "
          "(retry after %lld s)\n",
          label.c_str(), loggable(request.method).c_str(), loggable(request.path).c_str(),
          loggable(limited.client.to_string()).c_str(),
          static_cast<long long>(sluice::retry_after_seconds(e.dry_denied->decision.retry_after)));
    }
    if (!e.backend_error.ok()) {
      std::fprintf(stderr, "sluice_gateway: limiter error: %s\n",
                   std::string(e.backend_error.message()).c_str());
    }
  }

  // The answer to an admitted request: 401, 404, or the route as JSON. Exempt paths go on to
  // the server's handlers (/healthz, /readyz, /metrics).
  static Limiter::HandlerResponse answer(const httplib::Request& request,
                                         httplib::Response& response,
                                         const LimitedRequest& limited) {
    if (limited.evaluation.exempt) return Limiter::HandlerResponse::Unhandled;
    if (limited.credential && !limited.consumer) {
      respond_json(response, 401, "{\"error\":\"unknown bearer token\"}");
    } else if (!limited.route) {
      respond_json(response, 404,
                   absl::StrCat("{\"error\":\"no route\",\"path\":",
                                json_string(loggable(request.path)), "}"));
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
};

// The engine and the client address resolver for the config at `options.config_path`; the first
// listener of the config becomes `options.listener` when none was given. An error is printed to
// stderr.
struct Loaded {
  sluice::RateLimitEngine engine;
  sluice::ClientAddressResolver resolver;
};
std::optional<Loaded> load(Options& options) {
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "sluice_gateway: %s\n", std::string(status.message()).c_str());
    return std::nullopt;
  };
  absl::StatusOr<sluice::PolicyConfig> config = sluice::yaml::load_config_file(options.config_path);
  if (!config.ok()) return fail(config.status());
  if (!options.listener && !config->listeners.empty()) {
    options.listener = config->listeners.front().name;
  }
  absl::StatusOr<sluice::RateLimitEngine> engine = sluice::RateLimitEngine::create(*config);
  if (!engine.ok()) return fail(engine.status());
  std::vector<std::string> trusted = config->gateway.trusted_proxies;
  trusted.insert(trusted.end(), options.trusted_proxies.begin(), options.trusted_proxies.end());
  absl::StatusOr<sluice::ClientAddressResolver> resolver =
      sluice::ClientAddressResolver::create(trusted);
  if (!resolver.ok()) return fail(resolver.status());
  return Loaded{*std::move(engine), *std::move(resolver)};
}

// Binds 127.0.0.1 on `port` (0: any free port); the bound port, or -1.
int bind_loopback(httplib::Server& server, int port) {
  if (port == 0) return server.bind_to_any_port("127.0.0.1");
  return server.bind_to_port("127.0.0.1", port) ? port : -1;
}

// Serves until SIGINT or SIGTERM. `signals` are blocked in every thread and taken by one waiter,
// which stops the server. Returns the exit code.
int serve(httplib::Server& server, const sigset_t& signals) {
  std::thread waiter([&] {
    int signal = 0;
    sigwait(&signals, &signal);
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
  std::optional<Loaded> loaded = load(*options);
  if (!loaded) return 2;

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::size_t rules = loaded->engine.rule_count();
  const auto engine = std::make_shared<const sluice::RateLimitEngine>(std::move(loaded->engine));
  gateway::BoundedServer server(kLimits);
  server.set_keep_alive_timeout(5);
  server.set_read_timeout(5);
  server.set_write_timeout(5);
  Limiter(engine, {.listener = options->listener.value_or(""),
                   .resolver = std::move(loaded->resolver),
                   .on_evaluated = &Gateway::log,
                   .on_admitted = &Gateway::answer})
      .install(server);
  const auto ok = [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  };
  server.Get("/healthz", ok);
  server.Get("/readyz", ok);
  server.Get("/metrics", [&engine](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics_text(*engine), "text/plain; version=0.0.4");
  });
  const int port = bind_loopback(server, options->port);
  if (port < 0) {
    std::fprintf(stderr, "sluice_gateway: cannot bind 127.0.0.1:%d\n", options->port);
    return 1;
  }
  std::printf("sluice_gateway: listening on http://127.0.0.1:%d (listener \"%s\", %zu rules)\n",
              port, options->listener.value_or("").c_str(), rules);
  std::fflush(stdout);
  return serve(server, signals);
}
