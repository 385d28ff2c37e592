// sluice/httplib.hpp — rate limiting for a cpp-httplib server, as a pre-routing handler.
//
// `HttplibLimiter` evaluates every request through a `RateLimitEngine` before the server routes
// it: it resolves the client address (trusted proxies only, sluice/client_address.hpp), the route
// (`match_route` on the request path) and the consumer (`consumer_for` on the request's
// credential), evaluates, writes the rate-limit fields into every response, and answers a denied
// request itself: 429 with Retry-After, the fields and a small JSON body
// (`{"error":"rate limited","retry_after_seconds":12}`). An admitted request goes on to the
// server's own handlers, or to `Options::on_admitted`.
//
//   auto engine = sluice::RateLimitEngine::create(config);
//   if (!engine.ok()) return engine.status();
//   auto shared = std::make_shared<const sluice::RateLimitEngine>(*std::move(engine));
//   httplib::Server server;
//   sluice::HttplibLimiter<>(shared, {.listener = "public"}).install(server);
//   server.Get("/v1/items", [](const httplib::Request&, httplib::Response& res) { ... });
//
// In one call, over a holder that follows its config file (sluice/yaml/reloading_engine.hpp)
// or anything else with `current()`: the limiter as above, evaluating every request with the
// holder's current generation, and a GET route serving that generation's counters in the
// Prometheus text format (sluice/prometheus.hpp) at `metrics_path` ("" for none; the default
// "/metrics" is among the default exempt paths, so scrapes are never limited):
//
//   auto holder = sluice::yaml::ReloadingEngine<sluice::RuntimeRateLimitEngine>::create(
//       "service.yaml", {.poll_interval = std::chrono::seconds(2), .reload_signal = SIGHUP});
//   if (absl::Status s = sluice::install(server, **holder, {.limiter = {.listener = "public"}});
//       !s.ok()) return s;
//
// The server keeps a reference to the holder: the holder must outlive the server's handlers.
//
// The engine source. The limiter asks a callable for the engine generation to use, once per
// request: `std::function<std::shared_ptr<const Engine>()>`; a fixed engine plugs in as a
// `shared_ptr` or a reference (the caller keeps it alive while the server runs). A reloading
// holder (sluice/config_requirement.hpp: EngineHolder, e.g. sluice::yaml::ReloadingEngine) is
// passed itself, `HttplibLimiter<>::create(holder, options)` or `install`: the limiter then asks
// it for `current()`, and the holder refuses any reload whose config lacks the limiter's
// `listener` or `unknown_consumer` while the limiter lives. Only this follows reloads safely: a
// plain function returning `holder.current()` works, but a reload that renames the listener or
// drops the unknown consumer is then served unnoticed, and the limiter's requests match no
// listener (they all pass its limits) or every unknown credential is refused. The request holds the
// generation it got until it has been answered or handed on, so every view a callback sees (route,
// service, consumer: into the engine) stays valid for the whole callback even if another thread
// reloads meanwhile; a callback that keeps a view longer keeps a copy of `LimitedRequest::engine`
// with it. No engine (the source returned null): 503, nothing evaluated.
//
// What a client controls, and what it cannot pick:
// - Client address: the peer address, and `Forwarded` / `X-Forwarded-For` only when the peer is
//   one of the config's `gateway.trusted_proxies` (none by default: headers are ignored). The
//   proxies are those of the generation that evaluates the request, so a reload that changes
//   them applies from the next request on; `Options::proxy_headers` says which header to read.
// - Credential: by default the token of `Authorization: Bearer <token>` (scheme in any case, then
//   one or more spaces; a token with whitespace in it is ambiguous, as below);
//   `header_credential("X-Api-Key")` reads another header. A credential header sent more than
//   once, `Bearer` and a tab, or a value with a control byte (a NUL: cpp-httplib decodes "%00" in
//   header values, and `get_header_value` stops there) is ambiguous: the service may read it as
//   a known key, so it is
//   limited by address and refused with 401, never an anonymous caller's and never the unknown
//   consumer's.
//   Who owns it: the config's consumers[].credentials, or `Options::consumer_of`, the service's own
//   store behind a bounded cache (sluice/credential_resolver.hpp). It keys `credential` rules only
//   when it belongs to a consumer. An unknown credential never gets the anonymous caller's
//   treatment silently: it is limited by address and refused with 401 `{"error":"unknown
//   credential"}`, or, with `Options::unknown_consumer`, gets that consumer's bundles, keyed by
//   address (never by the credential, so random keys do not buy fresh buckets). A lookup error,
//   or a consumer the config does not define: limited by address, then 503
//   `{"error":"credential store unavailable"}`.
// - Route: the longest `path_prefix` that starts the normalized path (in any case for a route
//   with `case_sensitive: false`, for an upstream that ignores case; sluice/request_path.hpp:
//   each character written one way whether sent raw or percent-encoded, dot segments removed,
//   repeated '/' merged), taken from the request target as sent, never from cpp-httplib's decoded
//   `request.path`, in which an encoded '/' is no longer told apart. `LimitedRequest::path` is
//   that path: a proxy forwards exactly it, so the upstream serves the path the request was
//   limited on. A path that cannot be normalized without guessing (it climbs above the root,
//   encodes '/', '\' or NUL, ...) is limited as unrouted (the listener and global rules apply)
//   and then answered 400. A request handed on to the server's own routes (on_admitted absent or
//   Unhandled) whose normalized path decodes to another path than the one cpp-httplib routes on
//   (`/v1/./items`) is answered 400 too: the server's routes would serve a path the request was
//   not limited on.
// - The body is never read here, so a denied or pre-answered request costs no body bytes.
// - Backend errors: with `on_backend_error: fail_open` the request passes (the error is seen by
//   `on_evaluated`); a request the engine denies for an error is answered 503, not 429.
//
// Thread-safety: `operator()` is const and may run on all the server's threads at once when the
// source and the callbacks may. Cost per request: one resolve (O(header bytes)), one path
// normalization (O(path bytes)), one route match (O(routes)), one credential lookup, one
// `evaluate`. No floating point, no exceptions thrown.
#ifndef SLUICE_HTTPLIB_HPP_
#define SLUICE_HTTPLIB_HPP_

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/adaptive.hpp"
#include "sluice/client_address.hpp"
#include "sluice/config_requirement.hpp"
#include "sluice/credential_resolver.hpp"
#include "sluice/detail/adapter_identity.hpp"
#include "sluice/engine.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/prometheus.hpp"
#include "sluice/request_path.hpp"

namespace sluice {

template <class Engine = RateLimitEngine>
class HttplibLimiter {
 public:
  using EngineSource = std::function<std::shared_ptr<const Engine>()>;
  using HandlerResponse = httplib::Server::HandlerResponse;

  // One evaluated request. `route`, `consumer` and the evaluation's rule indices refer to
  // `*engine`; `credential` views the request's header. Valid while the callback runs.
  struct LimitedRequest {
    std::shared_ptr<const Engine> engine{};
    ClientAddress client{};
    std::optional<typename Engine::RouteMatch> route{};
    std::optional<std::string_view> credential{};  // as presented, known or not
    // The credential's consumer, or for an unknown one Options::unknown_consumer (if configured).
    std::optional<std::string_view> consumer{};
    CredentialStatus credential_status = CredentialStatus::kNone;
    std::string_view listener{};  // Options::listener
    // The normalized path routes were matched on, and what a proxy forwards; "" when the path
    // was refused (then route is empty and the request is answered 400 unless denied).
    std::string path{};
    Evaluation evaluation{};
  };

  struct Options {
    // The listener's name for match_route and the rules; "" for none. `create` refuses one the
    // config does not have, whose bundles and routes would never apply; created over a holder, so
    // does every reload of it while the limiter lives.
    std::string listener{};
    // Which forwarding header lists the hops behind the config's trusted proxies (see
    // sluice/client_address.hpp). The trusted proxies themselves come from the config only.
    ProxyHeaders proxy_headers = ProxyHeaders::kEither;
    // The credential a request presents (a view into the request); default: bearer_token.
    std::function<std::optional<std::string_view>(const httplib::Request&)> credential{};
    // Who owns a credential: the service's store, usually through a CredentialResolver (bounded
    // cache), or trust_credential_as(...) for a header the operator trusts. Empty: the config's
    // consumers[].credentials.
    ConsumerLookup consumer_of{};
    // What an unknown credential gets: empty, a 401 (after it has been limited by address); else
    // the config consumer of that name (e.g. "unknown"), whose bundles then apply, keyed by
    // address. A generation without that consumer refuses unknown credentials with 401; `create`
    // refuses a name the config does not have (and over a holder, every reload does).
    std::string unknown_consumer{};
    // Sees every evaluated request (exempt paths excluded) before it is answered: the place to
    // log dry-run denials and backend errors. Runs on the request's thread.
    std::function<void(const httplib::Request&, const LimitedRequest&)> on_evaluated{};
    // Answers an admitted (or exempt) request while its engine generation is held. Returning
    // Unhandled lets the server route it. Default: every request is routed by the server.
    std::function<HandlerResponse(const httplib::Request&, httplib::Response&,
                                  const LimitedRequest&)>
        on_admitted{};
    // Wall clock for X-RateLimit-Reset; default: the engine reads the system clock.
    std::function<WallTime()> wall_clock{};
  };

  HttplibLimiter(EngineSource source, Options options = {})
      : source_(std::move(source)), options_(std::move(options)) {}
  // A fixed generation, shared.
  HttplibLimiter(std::shared_ptr<const Engine> engine, Options options = {})
      : HttplibLimiter([engine = std::move(engine)] { return engine; }, std::move(options)) {}
  // A fixed engine the caller keeps alive for as long as the server may call the handler.
  HttplibLimiter(const Engine& engine, Options options = {})
      : HttplibLimiter(std::shared_ptr<const Engine>(std::shared_ptr<const Engine>(), &engine),
                       std::move(options)) {}
  // A limiter as the constructor makes it, for a service that also holds trusted proxies of its
  // own (CIDR texts, e.g. from its command line): they must be the gateway.trusted_proxies of the
  // generation `source` serves now, in any order, or none. Otherwise InvalidArgument naming both
  // lists (or the entry that is no network); FailedPrecondition when `source` serves no engine
  // while proxies are given. They are only checked: every request uses its generation's proxies.
  // InvalidArgument too when `options.listener` or `options.unknown_consumer` is none of that
  // generation's listeners or consumers.
  static absl::StatusOr<HttplibLimiter> create(
      EngineSource source, Options options = {},
      const std::vector<std::string>& trusted_proxies = {}) {
    absl::StatusOr<ClientAddressResolver> given = ClientAddressResolver::create(trusted_proxies);
    if (!given.ok()) return given.status();
    const std::shared_ptr<const Engine> engine = source ? source() : nullptr;
    if (absl::Status s = detail::check_trusted_proxies(engine.get(), given->trusted_networks(),
                                                       "the adapter's trusted proxies");
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            detail::check_config_names(engine.get(), options.listener, options.unknown_consumer);
        !s.ok()) {
      return s;
    }
    return HttplibLimiter(std::move(source), std::move(options));
  }
  static absl::StatusOr<HttplibLimiter> create(
      std::shared_ptr<const Engine> engine, Options options = {},
      const std::vector<std::string>& trusted_proxies = {}) {
    return create([engine = std::move(engine)] { return engine; }, std::move(options),
                  trusted_proxies);
  }
  // Over a holder that follows its config's reloads (e.g. sluice::yaml::ReloadingEngine): the
  // limiter `create(source)` makes with `holder.current()` as its source, which also registers
  // `options.listener` and `options.unknown_consumer` with the holder (`holder.require`), so that
  // every reload whose config lacks one is refused while this limiter or a copy of it lives. The
  // holder must outlive the limiter. Errors: create's, or require's. O(config names registered).
  template <EngineHolder Holder>
  static absl::StatusOr<HttplibLimiter> create(
      Holder& holder, Options options = {}, const std::vector<std::string>& trusted_proxies = {}) {
    ConfigRequirement requirement{.listener = options.listener,
                                  .unknown_consumer = options.unknown_consumer};
    const Holder* source = &holder;
    absl::StatusOr<HttplibLimiter> limiter =
        create([source] { return source->current(); }, std::move(options), trusted_proxies);
    if (!limiter.ok()) return limiter;
    if (requirement.listener.empty() && requirement.unknown_consumer.empty()) return limiter;
    absl::StatusOr<RequirementHandle> handle = holder.require(std::move(requirement));
    if (!handle.ok()) return handle.status();
    limiter->requirement_ = *std::move(handle);
    return limiter;
  }

  // Makes a copy of this limiter the server's pre-routing handler (replacing any other).
  void install(httplib::Server& server) const {
    server.set_pre_routing_handler(
        [limiter = *this](const httplib::Request& request, httplib::Response& response) {
          return limiter(request, response);
        });
  }

  // The pre-routing handler: Handled when it answered (429, 503, or on_admitted did).
  HandlerResponse operator()(const httplib::Request& request, httplib::Response& response) const {
    LimitedRequest limited{.engine = source_ ? source_() : nullptr};
    if (!limited.engine) {
      respond_json(response, 503, R"({"error":"rate limiter unavailable"})");
      return HandlerResponse::Handled;
    }
    std::optional<std::string> consumer_name;  // a consumer name consumer_of answered
    evaluate(request, limited, consumer_name);
    for (const HttpField& field : limited.evaluation.fields) {
      response.set_header(std::string(field.name), field.value);
    }
    if (!limited.evaluation.exempt && options_.on_evaluated) {
      options_.on_evaluated(request, limited);
    }
    if (!limited.evaluation.allowed) {
      deny(limited.evaluation, response);
      return HandlerResponse::Handled;
    }
    if (refuse_credential(limited, response)) return HandlerResponse::Handled;
    if (limited.path.empty()) {
      respond_json(response, 400, R"({"error":"ambiguous request path"})");
      return HandlerResponse::Handled;
    }
    const HandlerResponse handled = options_.on_admitted
                                        ? options_.on_admitted(request, response, limited)
                                        : HandlerResponse::Unhandled;
    if (handled == HandlerResponse::Unhandled && !routed_as_limited(request, limited.path)) {
      respond_json(response, 400, R"({"error":"ambiguous request path"})");
      return HandlerResponse::Handled;
    }
    return handled;
  }

  // The token of `Authorization: Bearer <token>` (scheme case-insensitive, then one or more
  // spaces, RFC 6750), a view into `request`; none when the header is absent, has another
  // scheme or an empty token. Sent more than once, `Bearer` followed by other whitespace than
  // spaces (a tab), or a token with whitespace in it ("Bearer k1 k2"): ambiguous, refused as an
  // unknown credential (see the file comment), never read as none.
  static std::optional<std::string_view> bearer_token(const httplib::Request& request) {
    const std::size_t count = request.get_header_value_count("Authorization");
    if (count == 0) return std::nullopt;
    if (count > 1) return detail::kAmbiguousCredential;
    return detail::credential_in(request.headers.find("Authorization")->second, "Bearer ");
  }

  // Reads the credential from header `name` (e.g. "X-Api-Key"), a view into the request, without
  // the spaces or tabs around it; none when the header is absent or empty. Sent more than once:
  // ambiguous, refused as an unknown credential, never read as none. For Options::credential.
  static std::function<std::optional<std::string_view>(const httplib::Request&)> header_credential(
      std::string name) {
    return [name = std::move(name)](
               const httplib::Request& request) -> std::optional<std::string_view> {
      const std::size_t count = request.get_header_value_count(name);
      if (count == 0) return std::nullopt;
      if (count > 1) return detail::kAmbiguousCredential;
      return detail::credential_in(request.headers.find(name)->second, "");
    };
  }

  // Feeds an upstream's answer to a request this limiter admitted to every adaptive rule that
  // applied to it (sluice/adaptive.hpp): the rule's limit shrinks while the upstream is slow or
  // failing and recovers after. Call it once per answer, from `on_admitted` or later while
  // `limited.engine` is held; a request that never reached the upstream feeds nothing. The
  // request is the one `limited` was evaluated from (same path, address, credential).
  static absl::Status record_upstream([[maybe_unused]] const httplib::Request& request,
                                      const LimitedRequest& limited,
                                      const UpstreamResponse& upstream) {
    if (!limited.engine || limited.evaluation.exempt) return absl::OkStatus();
    return limited.engine->record_upstream(context_for(limited), upstream);
  }

  // An upstream answer as the adaptive controllers read it: `status` (0: no answer: refused,
  // reset or timed out), the latency the caller measured, and Retry-After when it is
  // delay-seconds (digits only, capped at one day); an HTTP-date or anything else counts as none.
  static UpstreamResponse upstream_response(int status, const httplib::Headers& headers,
                                            std::chrono::nanoseconds latency) {
    UpstreamResponse out{.latency = latency, .status = status};
    const auto it = headers.find("Retry-After");
    if (it == headers.end()) return out;
    const std::string& text = it->second;
    if (text.empty() || !std::all_of(text.begin(), text.end(), absl::ascii_isdigit)) return out;
    constexpr std::int64_t kMaxSeconds = std::int64_t{24} * 60 * 60;
    std::int64_t seconds = 0;
    const std::from_chars_result parsed =
        std::from_chars(text.data(), text.data() + text.size(), seconds);
    // Every byte is a digit, so the only error is overflow.
    if (parsed.ec != std::errc() || seconds > kMaxSeconds) seconds = kMaxSeconds;
    out.retry_after = std::chrono::seconds(seconds);
    return out;
  }

 private:
  void evaluate(const httplib::Request& request, LimitedRequest& limited,
                std::optional<std::string>& consumer_name) const {
    const Engine& engine = *limited.engine;
    limited.client = ClientAddress::parse(request.remote_addr);
    if (engine.client_addresses().trusted(limited.client)) {  // else the headers are not read
      limited.client =
          detail::resolve_client(engine, limited.client, joined(request, "Forwarded"),
                                 joined(request, "X-Forwarded-For"), options_.proxy_headers);
    } else {
      limited.client = engine.client_addresses().translated(limited.client);
    }
    limited.listener = options_.listener;
    absl::StatusOr<std::string> path = normalize_request_path(raw_path(request));
    if (path.ok()) {
      limited.path = *std::move(path);
      limited.route = engine.match_route(options_.listener, limited.path);
    }
    limited.credential = options_.credential ? options_.credential(request) : bearer_token(request);
    const detail::CredentialIdentity identity = detail::identify_credential(
        engine, limited.credential, options_.consumer_of, options_.unknown_consumer, consumer_name);
    limited.consumer = identity.consumer;
    limited.credential_status = identity.status;

    RequestContext context = context_for(limited);
    if (options_.wall_clock) context.wall_time = options_.wall_clock();
    limited.evaluation = engine.evaluate(context);
  }

  // The path as the client sent it, still percent-encoded: the request target before '?' (a
  // request built by hand, without a target: its path).
  static std::string_view raw_path(const httplib::Request& request) {
    if (request.target.empty()) return request.path;
    const std::string_view target = request.target;
    return target.substr(0, target.find('?'));
  }

  // Whether cpp-httplib's own routing, which matches `request.path` (the target's path with every
  // percent-encoding decoded), reads the path the request was limited on.
  static bool routed_as_limited(const httplib::Request& request, std::string_view path) {
    std::string decoded;
    decoded.reserve(path.size());
    for (std::size_t i = 0; i < path.size(); ++i) {
      int byte = 0;  // a normalized path's percent-encodings are well formed
      if (path[i] == '%' && i + 2 < path.size() &&
          std::from_chars(path.data() + i + 1, path.data() + i + 3, byte, 16).ptr ==
              path.data() + i + 3) {
        decoded.push_back(static_cast<char>(byte));
        i += 2;
      } else {
        decoded.push_back(path[i]);
      }
    }
    return decoded == request.path;
  }

  // The engine's view of the request, with the address as it was resolved.
  static RequestContext context_for(const LimitedRequest& limited) {
    RequestContext context{.client = limited.client, .path = limited.path};
    context.consumer = limited.consumer;
    const bool known = limited.credential_status == CredentialStatus::kKnown;
    if (known) context.credential = limited.credential;  // an unknown one keys nothing
    if (limited.route) {
      context.route = limited.route->route;
      context.service = limited.route->service;
    }
    if (!limited.listener.empty()) context.listener = limited.listener;
    return context;
  }

  // An admitted request whose credential no one owns (and no unknown consumer took), or whose
  // lookup failed, is answered here: 401 or 503. True when it answered.
  static bool refuse_credential(const LimitedRequest& limited, httplib::Response& response) {
    if (limited.evaluation.exempt) return false;
    if (limited.credential_status == CredentialStatus::kLookupFailed) {
      respond_json(response, 503, R"({"error":"credential store unavailable"})");
      return true;
    }
    if (limited.credential_status == CredentialStatus::kUnknown && !limited.consumer) {
      respond_json(response, 401, R"({"error":"unknown credential"})");
      return true;
    }
    return false;
  }

  // A rule denied: 429 (its fields are written already). The engine denied for an error: 503.
  static void deny(const Evaluation& e, httplib::Response& response) {
    if (!e.binding || e.binding->decision.allowed()) {
      respond_json(response, 503, R"({"error":"rate limiter unavailable"})");
      return;
    }
    respond_json(response, 429,
                 absl::StrCat(R"({"error":"rate limited","retry_after_seconds":)",
                              retry_after_seconds(e.retry_after), "}"));
  }

  static void respond_json(httplib::Response& response, int status, std::string_view body) {
    response.status = status;
    response.set_content(absl::StrCat(absl::string_view(body.data(), body.size()), "\n"),
                         "application/json");
  }

  // Every line of header `name`, joined by ", " as if it were one (an empty string if absent).
  static std::string joined(const httplib::Request& request, const char* name) {
    std::string out;
    const auto [first, last] = request.headers.equal_range(name);
    for (auto it = first; it != last; ++it) {
      absl::StrAppend(&out, it == first ? "" : ", ", it->second);
    }
    return out;
  }

  EngineSource source_;
  Options options_;
  RequirementHandle requirement_{};  // keeps the names registered with a holder (create(holder))
};

// What `install(server, holder, ...)` sets up besides the limiter's own options.
template <class Engine = RateLimitEngine>
struct HttplibInstallOptions {
  typename HttplibLimiter<Engine>::Options limiter{};
  std::string metrics_path = "/metrics";  // a GET route with the Prometheus text; "": none
};

// The engine type a holder's `current()` hands out.
template <class Holder>
using HeldEngine = typename std::remove_cvref_t<decltype(*std::declval<const Holder&>().current())>;

// Makes `server` limit every request with `holder.current()` (the pre-routing handler of
// HttplibLimiter: 429 with Retry-After and the rate-limit fields, 503 when no engine) and, unless
// `options.metrics_path` is empty, serve the current generation's counters there. `holder` is
// kept by reference and must outlive the server's handlers. The limiter is made by
// `HttplibLimiter::create`: over an EngineHolder it registers its listener and unknown consumer,
// so that the holder refuses every reload lacking them for as long as the server keeps the
// handler. Its error, if any, is returned and nothing is installed.
template <class Holder, class Engine = HeldEngine<Holder>>
[[nodiscard]] absl::Status install(httplib::Server& server, Holder& holder,
                                   HttplibInstallOptions<Engine> options = {}) {
  const Holder* source = &holder;
  absl::StatusOr<HttplibLimiter<Engine>> limiter = [&] {
    if constexpr (EngineHolder<Holder>) {
      return HttplibLimiter<Engine>::create(holder, std::move(options.limiter));
    } else {
      return HttplibLimiter<Engine>::create([source] { return source->current(); },
                                            std::move(options.limiter));
    }
  }();
  if (!limiter.ok()) return limiter.status();
  limiter->install(server);
  if (options.metrics_path.empty()) return absl::OkStatus();
  server.Get(options.metrics_path,
             [source](const httplib::Request& /*request*/, httplib::Response& response) {
               const std::shared_ptr<const Engine> engine = source->current();
               if (!engine) {
                 response.status = 503;
                 return;
               }
               response.set_content(prometheus_text(*engine), std::string(kPrometheusContentType));
             });
  return absl::OkStatus();
}

}  // namespace sluice

#endif  // SLUICE_HTTPLIB_HPP_
