// sluice/grpc.hpp — rate-limit the calls of a gRPC C++ server through a sluice engine.
//
// `GrpcRateLimiter::check` evaluates one call and, when the engine denies it, returns the status
// the handler must finish the call with: RESOURCE_EXHAUSTED, with the wait and the rate-limit
// fields in the call's trailing metadata. The service calls it first, before any work:
//
//   auto limiter = sluice::GrpcRateLimiter::create({.credential_metadata = "x-api-key",
//                                                   .credential_prefix = ""});
//   // a synchronous service (grpc::ServerContext):
//   grpc::Status Say(grpc::ServerContext* context, const EchoRequest* request,
//                    EchoReply* reply) override {
//     if (auto denied = limiter_.check(engine_, *context, "/sluice.test.Echo/Say")) return *denied;
//     ...  // the handler's work runs only for admitted calls
//   }
//   // a callback service (grpc::CallbackServerContext):
//   grpc::ServerUnaryReactor* Say(grpc::CallbackServerContext* context, ...) override {
//     grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
//     if (auto denied = limiter_.check(engine_, *context, "/sluice.test.Echo/Say")) {
//       reactor->Finish(*denied);
//       return reactor;
//     }
//     ...
//   }
//
// What the engine sees of a call:
// - path: the full method name ("/pkg.Service/Method"), so a route's `path_prefix` matches
//   methods: "/pkg.Service/" covers a service, "/pkg.Service/Method" one method; the route is the
//   one `engine.match_route(listener, method)` finds (none: unrouted), and exempt paths name
//   methods too (e.g. "/grpc.health.v1.Health/Check").
// - client: the peer address (`grpc_peer_address`: "ipv4:203.0.113.7:5000",
//   "ipv6:[2001:db8::7]:5000"); behind the proxies of the config's `gateway.trusted_proxies` the
//   `forwarded` and `x-forwarded-for` metadata are walked as for HTTP (sluice/client_address.hpp).
//   The proxies are those of the engine generation `check` is given, so they follow reloads. A
//   unix-socket peer has no address: all such callers share the one "invalid" address bucket.
// - credential: the value of the metadata entry `credential_metadata` after
//   `credential_prefix` ("authorization: Bearer <token>" by default), read as the HTTP adapter
//   reads a header: spaces and tabs around the value are dropped, a prefix ending in a space is a
//   scheme followed by one or more spaces, and other whitespace there or inside the token
//   ("Bearer k1 k2") is ambiguous (below). It keys `credential` rules
//   only when it belongs to a consumer: of the config (`engine.consumer_for`), or the one
//   `consumer_of` names (the service's store, sluice/credential_resolver.hpp). A missing prefix
//   counts as no credential (keyed by client address). An entry sent more than once is ambiguous
//   (a handler may read the first as a known key): limited by address and ended with
//   UNAUTHENTICATED, never the anonymous caller's or the unknown consumer's, so that a known key
//   sent twice does not escape its limits. An unknown credential is limited by address and ended
//   with UNAUTHENTICATED ("unknown credential"), or gets the bundles of the config consumer
//   `unknown_consumer`, keyed by address: a client cannot mint a fresh bucket per call. A lookup
//   error, or a consumer the config does not define: limited by address, then UNAVAILABLE.
//
// What the client receives:
// - denied: status RESOURCE_EXHAUSTED ("rate limited; retry after <n> s") and trailing metadata
//   `retry-after` (whole seconds, at least 1), `x-ratelimit-limit`, `x-ratelimit-remaining`,
//   `x-ratelimit-reset`, `ratelimit-policy` and `ratelimit`: the HTTP fields of
//   sluice/http_fields.hpp under lowercase keys (gRPC metadata keys are lowercase).
// - admitted: the same fields except `retry-after` in the trailing metadata, then whatever the
//   handler answers. Exempt methods and calls no rule applies to get no fields.
// - the engine's backend failed and it fails closed: status UNAVAILABLE ("rate limiter
//   unavailable"), without the backend's error text. Failing open admits the call.
//
// Over a reloading holder (sluice/yaml/reloading_engine.hpp), pass the holder instead of an
// engine, to `create` and to `check`:
//
//   auto limiter = sluice::GrpcRateLimiter::create({.unknown_consumer = "unknown"}, **holder);
//   if (auto denied = limiter_.check(*holder_, *context, "/pkg.Service/Method")) return *denied;
//
// `check` evaluates with the generation the holder serves now; `create` registers the limiter's
// `listener` and `unknown_consumer` with the holder (sluice/config_requirement.hpp), which then
// refuses every reload whose config lacks them while the limiter or a copy lives. A limiter
// created with an engine, or without one, registers nothing: a reload can then drop its names
// unnoticed (its calls match no listener and pass its limits, or every unknown credential is
// refused), so over a holder create it with the holder. A gRPC server has no HTTP route for
// /metrics: serve `sluice::prometheus_text(*holder->current())` from the process's metrics listener
// (with cpp-httplib: `sluice::install(metrics_server, *holder)`, sluice/httplib.hpp).
//
// Why a call the service makes, and not an interceptor. In gRPC 1.51 a server interceptor
// (grpc::experimental::Interceptor) cannot end a call with a status of its choosing: `Hijack` is
// for client calls only, so the handler runs whatever the interceptor decides, and `TryCancel`
// ends the call as CANCELLED without metadata. The handler's context does not carry the method
// name either, so the service passes it. The limit: a method whose handler does not call `check`
// is not limited. Streaming methods call it once, at the start: a stream counts as one call.
//
// Thread-safety: `check` is const and may be called concurrently from any number of handlers; it
// writes only to the call's own context. Complexity: one engine evaluation plus O(metadata
// entries) to find the credential. Allocates the metadata it adds. No exceptions.
#ifndef SLUICE_GRPC_HPP_
#define SLUICE_GRPC_HPP_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <array>
#include <cstddef>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/client_address.hpp"
#include "sluice/config_requirement.hpp"
#include "sluice/credential_resolver.hpp"
#include "sluice/detail/adapter_identity.hpp"
#include "sluice/detail/forwarded.hpp"
#include "sluice/detail/text.hpp"
#include "sluice/engine.hpp"
#include "sluice/http_fields.hpp"

namespace sluice {

namespace detail {

// `text` with each "%HH" replaced by its byte, written to `buffer`; nullopt when a '%' is not
// followed by two hex digits or the result does not fit.
template <std::size_t N>
std::optional<std::string_view> percent_decode(std::string_view text,
                                               std::array<char, N>& buffer) noexcept {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::size_t size = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (size == N) return std::nullopt;
    char c = text[i];
    if (c == '%') {
      if (text.size() - i < 3) return std::nullopt;
      const int high = hex(text[i + 1]);
      const int low = hex(text[i + 2]);
      if (high < 0 || low < 0) return std::nullopt;
      c = static_cast<char>(high * 16 + low);
      i += 2;
    }
    buffer[size++] = c;
  }
  return std::string_view(buffer.data(), size);
}

}  // namespace detail

// The address in a gRPC peer string, a URI: "ipv4:<dotted quad>:<port>" or
// "ipv6:%5B<address>%5D:<port>" (gRPC 1.51 percent-encodes the brackets and a zone id's '%';
// "ipv6:[<address>]:<port>", as older versions write it, is accepted too; a zone id is dropped).
// Anything else ("unix:/run/app.sock", a string without scheme, a malformed escape) is an
// invalid address. O(peer size); no allocation.
inline ClientAddress grpc_peer_address(std::string_view peer) noexcept {
  constexpr std::string_view kIpv4 = "ipv4:";
  constexpr std::string_view kIpv6 = "ipv6:";  // as long as kIpv4
  const bool v4 = peer.starts_with(kIpv4);
  if (!v4 && !peer.starts_with(kIpv6)) return {};
  std::array<char, 96> buffer{};  // the longest address with zone id and port fits
  const std::optional<std::string_view> rest =
      detail::percent_decode(peer.substr(kIpv4.size()), buffer);
  if (!rest) return {};
  if (v4) {
    const ClientAddress address = ClientAddress::parse(*rest);
    return address.is_ipv4() ? address : ClientAddress{};
  }
  // Only the bracketed form with a port (an IPv4-mapped peer comes out as IPv4).
  if (!rest->starts_with('[') || rest->find("]:") == std::string_view::npos) return {};
  return ClientAddress::parse(*rest);
}

// How a server's calls map onto the engine's request context.
struct GrpcLimiterOptions {
  // The metadata key of the credential: lowercase letters, digits, '-', '_' and '.'; empty: calls
  // carry no credential. gRPC delivers `-bin` entries decoded; their bytes are read as they are
  // (after the prefix), with no whitespace dropped or read as a separator.
  std::string credential_metadata = "authorization";
  // What the entry's value, without spaces or tabs around it, must start with (compared ignoring
  // ASCII case); the rest is the credential. Ending in a space, it is a scheme: one or more
  // spaces follow it, and other whitespace after it or in the credential makes the entry
  // ambiguous. Empty: the whole value. `create` refuses one that starts with a space or a tab,
  // which no value would match (but for a `-bin` entry).
  std::string credential_prefix = "Bearer ";
  // Who owns a credential (e.g. a CredentialResolver); empty: the config's consumers[].credentials.
  ConsumerLookup consumer_of{};
  // The config consumer an unknown credential gets (keyed by address); empty: refused.
  // create(options, engine) refuses one the config does not have; create(options, holder) also
  // makes the holder refuse every reload without it.
  std::string unknown_consumer{};
  // The listener the server's calls arrive on (routes and bundles may name one); empty: none.
  // create(options, engine) refuses one the config does not have; create(options, holder) also
  // makes the holder refuse every reload without it.
  std::string listener{};
  // Which forwarding metadata to read behind the config's trusted proxies: its `headers()`
  // (ProxyHeaders). Which proxies to believe is the config's gateway.trusted_proxies; trusted
  // networks given here must be those (any order), which only create(options, engine) can check:
  // create(options) refuses them.
  ClientAddressResolver client_addresses{};
};

// Evaluates gRPC calls through an engine (see the header comment). Immutable after `create`.
class GrpcRateLimiter {
 public:
  // InvalidArgument when `credential_metadata` is not a legal gRPC metadata key, or
  // `credential_prefix` starts with a space or a tab (no text entry would match it), or when
  // `client_addresses` has trusted networks that contradict `engine`'s gateway.trusted_proxies
  // (the message names both lists), or when `listener` or `unknown_consumer` is none of
  // `engine`'s config's listeners or consumers (its bundles and routes would never apply; every
  // unknown credential would be refused). Every call still uses the proxies of the engine
  // it is checked with.
  template <EngineBackend Backend>
  static absl::StatusOr<GrpcRateLimiter> create(GrpcLimiterOptions options,
                                                const BasicRateLimitEngine<Backend>& engine) {
    return create_checked(std::move(options), &engine);
  }
  // The same against the generation `holder` serves now (e.g. a sluice::yaml::ReloadingEngine),
  // registering `listener` and `unknown_consumer` with it (`holder.require`): every reload whose
  // config lacks one is refused while this limiter or a copy of it lives. Errors: those above, or
  // require's. The holder must outlive the limiter.
  template <EngineHolder Holder>
  static absl::StatusOr<GrpcRateLimiter> create(GrpcLimiterOptions options, Holder& holder) {
    ConfigRequirement requirement{.listener = options.listener,
                                  .unknown_consumer = options.unknown_consumer};
    absl::StatusOr<GrpcRateLimiter> limiter =
        create_checked(std::move(options), holder.current().get());
    if (!limiter.ok()) return limiter;
    if (requirement.listener.empty() && requirement.unknown_consumer.empty()) return limiter;
    absl::StatusOr<RequirementHandle> handle = holder.require(std::move(requirement));
    if (!handle.ok()) return handle.status();
    limiter->requirement_ = *std::move(handle);
    return limiter;
  }
  // The same without an engine to compare with: FailedPrecondition when `client_addresses` has
  // trusted networks (put them in the config's gateway.trusted_proxies, or pass the engine).
  static absl::StatusOr<GrpcRateLimiter> create(GrpcLimiterOptions options = {}) {
    return create_checked(std::move(options), static_cast<const RateLimitEngine*>(nullptr));
  }

  // Evaluates the call `method` ("/pkg.Service/Method") that `context` serves. Denied: adds the
  // fields to the trailing metadata and returns the status to finish the call with. Admitted:
  // adds the fields and returns nullopt; the handler goes on.
  template <EngineBackend Backend>
  std::optional<::grpc::Status> check(const BasicRateLimitEngine<Backend>& engine,
                                      ::grpc::ServerContextBase& context,
                                      std::string_view method) const {
    RequestContext request{.client = client_address(engine, context), .path = method};
    std::optional<std::string> consumer_name;  // a name consumer_of answered, viewed by request
    const detail::CredentialIdentity identity =
        detail::identify_credential(engine, credential_of(context), options_.consumer_of,
                                    options_.unknown_consumer, consumer_name);
    request.credential = identity.credential;
    request.consumer = identity.consumer;
    if (!options_.listener.empty()) request.listener = options_.listener;
    const auto route = engine.match_route(options_.listener, method);
    if (route) request.route = route->route;

    const Evaluation e = engine.evaluate(request);
    for (const HttpField& field : e.fields) {
      context.AddTrailingMetadata(
          absl::AsciiStrToLower(absl::string_view(field.name.data(), field.name.size())),
          field.value);
    }
    if (e.allowed) return refusal(identity, e);
    if (!e.backend_error.ok()) {
      return ::grpc::Status(::grpc::StatusCode::UNAVAILABLE, "rate limiter unavailable");
    }
    return ::grpc::Status(
        ::grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("rate limited; retry after ", retry_after_seconds(e.retry_after), " s"));
  }

  // The same with the generation a holder serves now (`holder.current()`, e.g. a
  // sluice::yaml::ReloadingEngine), held for the whole check: the one call a handler makes to
  // follow config reloads. UNAVAILABLE when the holder serves no engine.
  template <class Holder>
  requires requires(const Holder& holder) { holder.current(); }
  std::optional<::grpc::Status> check(const Holder& holder, ::grpc::ServerContextBase& context,
                                      std::string_view method) const {
    const auto engine = holder.current();
    if (!engine) return ::grpc::Status(::grpc::StatusCode::UNAVAILABLE, "rate limiter unavailable");
    return check(*engine, context, method);
  }

  const GrpcLimiterOptions& options() const noexcept { return options_; }

 private:
  // An admitted call whose credential no one owns (and no unknown consumer took), or whose lookup
  // failed, ends here.
  static std::optional<::grpc::Status> refusal(const detail::CredentialIdentity& identity,
                                               const Evaluation& e) {
    if (e.exempt) return std::nullopt;
    if (identity.status == CredentialStatus::kLookupFailed) {
      return ::grpc::Status(::grpc::StatusCode::UNAVAILABLE, "credential store unavailable");
    }
    if (identity.status == CredentialStatus::kUnknown && !identity.consumer) {
      return ::grpc::Status(::grpc::StatusCode::UNAUTHENTICATED, "unknown credential");
    }
    return std::nullopt;
  }

  explicit GrpcRateLimiter(GrpcLimiterOptions options) : options_(std::move(options)) {}

  // create's checks; `engine` null: there is none to compare trusted networks with.
  template <class Engine>
  static absl::StatusOr<GrpcRateLimiter> create_checked(GrpcLimiterOptions options,
                                                        const Engine* engine) {
    const std::string& key = options.credential_metadata;
    for (const char c : key) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.')) {
        return absl::InvalidArgumentError(absl::StrCat(
            "credential_metadata ", detail::quoted(key),
            ": a gRPC metadata key has only lowercase letters, digits, '-', '_' and '.'"));
      }
    }
    if (key.starts_with("grpc-")) {
      return absl::InvalidArgumentError(
          absl::StrCat("credential_metadata ", detail::quoted(key), ": grpc- keys are gRPC's own"));
    }
    const std::string& prefix = options.credential_prefix;
    if (!key.ends_with("-bin") && !prefix.empty() && detail::optional_whitespace(prefix.front())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "credential_prefix ", detail::quoted(prefix),
          ": the spaces and tabs before a value are dropped before the prefix is compared, so a "
          "prefix that starts with one matches no call and every credential would count as none; "
          "write it without them"));
    }
    if (absl::Status s =
            detail::check_trusted_proxies(engine, options.client_addresses.trusted_networks(),
                                          "GrpcLimiterOptions::client_addresses' trusted proxies");
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            detail::check_config_names(engine, options.listener, options.unknown_consumer);
        !s.ok()) {
      return s;
    }
    return GrpcRateLimiter(std::move(options));
  }

  static std::string_view view(const ::grpc::string_ref& text) noexcept {
    return std::string_view(text.data(), text.size());
  }

  // Every value of metadata entry `key`, joined with ", " as if it were one header line.
  static std::string joined(const ::grpc::ServerContextBase& context, const std::string& key) {
    std::string out;
    const auto [first, last] = context.client_metadata().equal_range(key);
    for (auto it = first; it != last; ++it) {
      if (!out.empty()) out.append(", ");
      out.append(view(it->second));
    }
    return out;
  }

  // The caller behind the trusted proxies of `engine`'s config; the metadata is read (and
  // copied) only when the peer is one of them.
  template <class Engine>
  ClientAddress client_address(const Engine& engine,
                               const ::grpc::ServerContextBase& context) const {
    const ClientAddress peer = grpc_peer_address(context.peer());
    if (!engine.client_addresses().trusted(peer)) return engine.client_addresses().translated(peer);
    return detail::resolve_client(engine, peer, joined(context, "forwarded"),
                                  joined(context, "x-forwarded-for"),
                                  options_.client_addresses.headers());
  }

  // The credential of the call: the one entry `credential_metadata` after the prefix, if any,
  // read as the HTTP adapter reads a header (detail::credential_in).
  std::optional<std::string_view> credential_of(const ::grpc::ServerContextBase& context) const {
    if (options_.credential_metadata.empty()) return std::nullopt;
    const auto [first, last] = context.client_metadata().equal_range(options_.credential_metadata);
    if (first == last) return std::nullopt;
    if (std::next(first) != last) return detail::kAmbiguousCredential;  // repeated
    const std::string_view value = view(first->second);
    if (options_.credential_metadata.ends_with("-bin")) {  // bytes, not text: nothing to trim
      return detail::after_prefix(value, options_.credential_prefix);
    }
    return detail::credential_in(value, options_.credential_prefix);
  }

  GrpcLimiterOptions options_;
  RequirementHandle requirement_{};  // keeps the names registered with a holder (create(holder))
};

}  // namespace sluice

#endif  // SLUICE_GRPC_HPP_
