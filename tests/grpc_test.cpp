#include "sluice/grpc.hpp"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "echo.grpc.pb.h"
#include "engine_fixture.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"
#ifdef SLUICE_TEST_YAML
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "names_config.hpp"
#include "sluice/yaml/reloading_engine.hpp"
#endif

using namespace std::chrono_literals;
using Engine = sluice::testing::TestEngine;
using sluice::Selector;
using sluice::testing::make_engine;

namespace {

constexpr const char* kSay = "/sluice.test.Echo/Say";
constexpr const char* kShout = "/sluice.test.Echo/Shout";

using Metadata = std::vector<std::pair<std::string, std::string>>;

// The service under test: each method checks first, then counts that its work ran.
template <class EngineT>
class EchoService final : public sluice::test::Echo::Service {
 public:
  EchoService(const EngineT& engine, sluice::GrpcRateLimiter limiter)
      : engine_(engine), limiter_(std::move(limiter)) {}

  grpc::Status Say(grpc::ServerContext* context, const sluice::test::EchoRequest* request,
                   sluice::test::EchoReply* reply) override {
    if (auto denied = limiter_.check(engine_, *context, kSay)) return *denied;
    return work(*context, *request, *reply);
  }
  grpc::Status Shout(grpc::ServerContext* context, const sluice::test::EchoRequest* request,
                     sluice::test::EchoReply* reply) override {
    if (auto denied = limiter_.check(engine_, *context, kShout)) return *denied;
    return work(*context, *request, *reply);
  }

  int handled() const { return handled_.load(); }
  std::string last_peer() const {
    std::lock_guard lock(mutex_);
    return last_peer_;
  }

 private:
  grpc::Status work(grpc::ServerContext& context, const sluice::test::EchoRequest& request,
                    sluice::test::EchoReply& reply) {
    handled_.fetch_add(1);
    {
      std::lock_guard lock(mutex_);
      last_peer_ = context.peer();
    }
    reply.set_text(request.text());
    return grpc::Status::OK;
  }

  const EngineT& engine_;
  const sluice::GrpcRateLimiter limiter_;
  std::atomic<int> handled_{0};
  mutable std::mutex mutex_;
  std::string last_peer_;
};

// The same for a callback service: the denial finishes the reactor. Say only.
template <class EngineT>
class CallbackEchoService final : public sluice::test::Echo::CallbackService {
 public:
  CallbackEchoService(const EngineT& engine, sluice::GrpcRateLimiter limiter)
      : engine_(engine), limiter_(std::move(limiter)) {}

  grpc::ServerUnaryReactor* Say(grpc::CallbackServerContext* context,
                                const sluice::test::EchoRequest* request,
                                sluice::test::EchoReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (auto denied = limiter_.check(engine_, *context, kSay)) {
      reactor->Finish(*denied);
      return reactor;
    }
    handled_.fetch_add(1);
    reply->set_text(request->text());
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  int handled() const { return handled_.load(); }

 private:
  const EngineT& engine_;
  const sluice::GrpcRateLimiter limiter_;
  std::atomic<int> handled_{0};
};

// What the client saw of one call.
struct Reply {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  std::string message{};
  std::string text{};
  std::map<std::string, std::string> trailers{};  // a repeated key's values joined by ", "

  bool has(const std::string& key) const { return trailers.count(key) != 0; }
  std::string at(const std::string& key) const {
    auto it = trailers.find(key);
    return it == trailers.end() ? "<absent>" : it->second;
  }
};

// A real gRPC server on an ephemeral port of `host` and a client channel to it.
template <class EngineT, template <class> class ServiceT = EchoService>
class EchoServer {
 public:
  EchoServer(const EngineT& engine, sluice::GrpcRateLimiter limiter,
             const std::string& host = "127.0.0.1")
      : service_(engine, std::move(limiter)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat(host, ":0"), grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) return;
    const std::string target = host.starts_with('[') ? absl::StrCat("ipv6:", host, ":", port_)
                                                     : absl::StrCat(host, ":", port_);
    stub_ = sluice::test::Echo::NewStub(
        grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  }
  EchoServer(const EchoServer&) = delete;
  EchoServer& operator=(const EchoServer&) = delete;
  ~EchoServer() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + 5s);
  }

  bool started() const { return stub_ != nullptr; }
  const ServiceT<EngineT>& service() const { return service_; }

  Reply call(const Metadata& metadata = {}, const char* method = kSay) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 20s);
    for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
    sluice::test::EchoRequest request;
    request.set_text("hello");
    sluice::test::EchoReply reply;
    const grpc::Status status = std::string_view(method) == kSay
                                    ? stub_->Say(&context, request, &reply)
                                    : stub_->Shout(&context, request, &reply);
    Reply out{.code = status.error_code(), .message = status.error_message(), .text = reply.text()};
    for (const auto& [key, value] : context.GetServerTrailingMetadata()) {
      auto [it, inserted] = out.trailers.emplace(std::string(key.data(), key.size()),
                                                 std::string(value.data(), value.size()));
      if (!inserted) absl::StrAppend(&it->second, ", ", std::string(value.data(), value.size()));
    }
    return out;
  }

 private:
  ServiceT<EngineT> service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<sluice::test::Echo::Stub> stub_;
};

sluice::GrpcRateLimiter limiter(sluice::GrpcLimiterOptions options = {}) {
  auto created = sluice::GrpcRateLimiter::create(std::move(options));
  REQUIRE(created.ok());
  return *std::move(created);
}

// "per-ip": 1 call per second per client address, bursts of 2, on every method of Echo.
sluice::PolicyConfig per_ip_on_echo() {
  return {
      .policies = {{.name = "echo-limits",
                    .rate_limits = {{.name = "per-ip",
                                     .selector = {Selector::kIp},
                                     .requests_per = {.s = 1},
                                     .burst = 2}}}},
      .routes = {{.name = "echo",
                  .path_prefix = "/sluice.test.Echo/",
                  .policies = {"echo-limits"}}},
  };
}

// "per-key": 1 call per second per credential, no burst, on every call; two consumers.
sluice::PolicyConfig per_credential() {
  return {
      .policies = {{.name = "key-limits",
                    .rate_limits = {{.name = "per-key",
                                     .selector = {Selector::kCredential},
                                     .requests_per = {.s = 1},
                                     .burst = 1}}}},
      .consumers = {{.name = "alice", .credentials = {"alice-token"}},
                    {.name = "bob", .credentials = {"bob-token"}}},
      .gateway = {.global_policies = {"key-limits"}},
  };
}

// A backend whose every call fails, to show the failure modes.
struct FailingBackend {
  struct Options {};
  static absl::StatusOr<FailingBackend> create(std::span<const sluice::CompiledRule>,
                                               const FailingBackend*, const Options&) {
    return FailingBackend{};
  }
  absl::Status check_rules(std::span<const sluice::RuleKey>, sluice::ConsumptionMode,
                           std::span<sluice::Decision>) {
    return absl::UnavailableError("backend at 10.1.2.3:6379 is down");
  }
  sluice::StoreStats rule_store_stats(std::size_t) const { return {}; }
};

std::int64_t unix_seconds_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TEST_CASE("a gRPC peer string gives the peer's address, and nothing else does") {
  CHECK(sluice::grpc_peer_address("ipv4:127.0.0.1:5000").to_string() == "127.0.0.1");
  // gRPC 1.51 writes a URI: brackets and a zone id's '%' percent-encoded.
  CHECK(sluice::grpc_peer_address("ipv6:%5B2001:db8::7%5D:443").to_string() == "2001:db8::7");
  CHECK(sluice::grpc_peer_address("ipv6:%5Bfe80::1%2512%5D:443").to_string() == "fe80::1");
  CHECK(sluice::grpc_peer_address("ipv6:%5b::1%5d:443").to_string() == "::1");
  CHECK(sluice::grpc_peer_address("ipv6:[2001:db8::7]:443").to_string() == "2001:db8::7");
  CHECK(sluice::grpc_peer_address("ipv6:[::ffff:192.0.2.1]:443").to_string() == "192.0.2.1");
  CHECK(sluice::grpc_peer_address("ipv6:[fe80::1%2512]:443").to_string() == "fe80::1");
  CHECK_FALSE(sluice::grpc_peer_address("unix:/run/app.sock").valid());
  CHECK_FALSE(sluice::grpc_peer_address("unix-abstract:app").valid());
  CHECK_FALSE(sluice::grpc_peer_address("127.0.0.1:5000").valid());  // no scheme
  CHECK_FALSE(sluice::grpc_peer_address("").valid());
  // The scheme must match the address: no IPv6 text in an ipv4 peer, no bare IPv6.
  CHECK_FALSE(sluice::grpc_peer_address("ipv4:[::1]:5000").valid());
  CHECK_FALSE(sluice::grpc_peer_address("ipv6:127.0.0.1:5000").valid());
  CHECK_FALSE(sluice::grpc_peer_address("ipv6:::1").valid());
  CHECK_FALSE(sluice::grpc_peer_address("ipv4:010.0.0.1:5000").valid());
  // Malformed escapes and overlong input are invalid, not cut short.
  CHECK_FALSE(sluice::grpc_peer_address("ipv6:%5B::1%5D:44%").valid());
  CHECK_FALSE(sluice::grpc_peer_address("ipv6:%5B::1%5D:4%4").valid());
  CHECK_FALSE(sluice::grpc_peer_address("ipv6:%5B::1%zz:443").valid());
  CHECK_FALSE(sluice::grpc_peer_address("ipv4:%31%32%37.0.0.1:5000%00").valid());
  CHECK_FALSE(
      sluice::grpc_peer_address(absl::StrCat("ipv4:127.0.0.1:", std::string(200, '1'))).valid());
}

TEST_CASE("a credential metadata key that gRPC would not carry is refused") {
  CHECK(sluice::GrpcRateLimiter::create({.credential_metadata = "Authorization"}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(sluice::GrpcRateLimiter::create({.credential_metadata = "x api key"}).status().message() ==
        "credential_metadata \"x api key\": a gRPC metadata key has only lowercase letters, "
        "digits, '-', '_' and '.'");
  CHECK(sluice::GrpcRateLimiter::create({.credential_metadata = "grpc-timeout"}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(sluice::GrpcRateLimiter::create({.credential_metadata = "x-api-key"}).ok());
  CHECK(sluice::GrpcRateLimiter::create({.credential_metadata = ""}).ok());  // no credential
}

TEST_CASE("a credential prefix that starts with whitespace is refused, since no value matches it") {
  CHECK(sluice::GrpcRateLimiter::create({.credential_prefix = " Bearer "}).status().message() ==
        "credential_prefix \" Bearer \": the spaces and tabs before a value are dropped before the "
        "prefix is compared, so a prefix that starts with one matches no call and every "
        "credential would count as none; write it without them");
  // A binary entry's bytes are compared as they are.
  CHECK(sluice::GrpcRateLimiter::create(
            {.credential_metadata = "x-key-bin", .credential_prefix = " "})
            .ok());
}

TEST_CASE("admitted gRPC calls reach the handler with the rate-limit fields in trailing metadata") {
  sluice::ManualClock clock;
  const Engine engine = make_engine(per_ip_on_echo(), clock);
  EchoServer server(engine, limiter());
  REQUIRE(server.started());

  const Reply first = server.call();
  CHECK(first.code == grpc::StatusCode::OK);
  CHECK(first.text == "hello");
  CHECK(first.at("x-ratelimit-limit") == "2");
  CHECK(first.at("x-ratelimit-remaining") == "1");
  CHECK(first.at("ratelimit-policy") == "\"echo-limits/per-ip/s\";q=1;w=1");
  CHECK(first.at("ratelimit") == "\"echo-limits/per-ip/s\";r=1;t=1");
  CHECK_FALSE(first.has("retry-after"));
  const Reply second = server.call({}, kShout);  // the route covers every method of Echo
  CHECK(second.code == grpc::StatusCode::OK);
  CHECK(second.at("x-ratelimit-remaining") == "0");
  CHECK(server.service().handled() == 2);
  CHECK(sluice::grpc_peer_address(server.service().last_peer()).to_string() == "127.0.0.1");
}

TEST_CASE("a denied gRPC call ends with RESOURCE_EXHAUSTED and the wait before its handler runs") {
  sluice::ManualClock clock;
  const Engine engine = make_engine(per_ip_on_echo(), clock);
  EchoServer server(engine, limiter());
  REQUIRE(server.started());
  REQUIRE(server.call().code == grpc::StatusCode::OK);
  REQUIRE(server.call().code == grpc::StatusCode::OK);

  const std::int64_t before = unix_seconds_now();
  const Reply denied = server.call();
  const std::int64_t after = unix_seconds_now();
  CHECK(denied.code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(denied.message == "rate limited; retry after 1 s");
  CHECK(denied.text.empty());
  CHECK(denied.at("retry-after") == "1");
  CHECK(denied.at("x-ratelimit-limit") == "2");
  CHECK(denied.at("x-ratelimit-remaining") == "0");
  const std::int64_t reset = std::stoll(denied.at("x-ratelimit-reset"));
  CHECK(reset >= before + 2);  // the bucket of 2 is full again 2 s after the denial, rounded up
  CHECK(reset <= after + 3);
  CHECK(denied.at("ratelimit-policy") == "\"echo-limits/per-ip/s\";q=1;w=1");
  CHECK(denied.at("ratelimit") == "\"echo-limits/per-ip/s\";r=0;t=1");
  CHECK(server.service().handled() == 2);  // the denied call's work never ran

  clock.advance(1s);  // one call's worth of the bucket is back
  CHECK(server.call().code == grpc::StatusCode::OK);
  CHECK(server.call().code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(server.service().handled() == 3);
}

TEST_CASE("the credential metadata entry keys the bucket of an authenticated caller") {
  sluice::ManualClock clock;
  const Engine engine = make_engine(per_credential(), clock);
  EchoServer server(engine, limiter({.credential_metadata = "x-api-key", .credential_prefix = ""}));
  REQUIRE(server.started());
  const Metadata alice{{"x-api-key", "alice-token"}};
  const Metadata bob{{"x-api-key", "bob-token"}};

  CHECK(server.call(alice).code == grpc::StatusCode::OK);
  CHECK(server.call(alice).code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Same client address, another credential: its own bucket.
  CHECK(server.call(bob).code == grpc::StatusCode::OK);
  // No credential: keyed by the client address, which neither token's bucket used.
  CHECK(server.call().code == grpc::StatusCode::OK);
  CHECK(server.call().code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(server.service().handled() == 3);
}

TEST_CASE("a made-up, unprefixed or repeated credential is keyed by the client address") {
  sluice::ManualClock clock;
  const Engine engine = make_engine(per_credential(), clock);
  EchoServer server(engine, limiter());  // authorization: Bearer <token>
  REQUIRE(server.started());
  REQUIRE(server.call().code == grpc::StatusCode::OK);  // the address's one call this second

  // Each attempt at a fresh bucket lands in the address's, which is empty.
  CHECK(server.call({{"authorization", "Bearer forged-1"}}).code ==
        grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(server.call({{"authorization", "Bearer forged-2"}}).code ==
        grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(server.call({{"authorization", "alice-token"}}).code ==  // no "Bearer " prefix
        grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(
      server.call({{"authorization", "Bearer alice-token"}, {"authorization", "Bearer x"}}).code ==
      grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(server.call({{"x-api-key", "alice-token"}}).code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  // The real credential, with the scheme in any case, has its own bucket.
  CHECK(server.call({{"authorization", "bearer alice-token"}}).code == grpc::StatusCode::OK);
  CHECK(server.service().handled() == 2);
}

TEST_CASE("every spelling of a known bearer token is that token's call or refused", "[attack]") {
  sluice::ManualClock clock;
  const Engine engine = make_engine(per_credential(), clock);  // 1 per second per key or address
  EchoServer server(engine, limiter());                        // authorization: Bearer <token>
  REQUIRE(server.started());
  CHECK(server.call({{"authorization", "Bearer alice-token"}}).code == grpc::StatusCode::OK);
  // Whitespace around a value is no part of it (HTTP drops it), and RFC 6750 allows several
  // spaces after the scheme: a handler that reads either as alice's token serves alice, so each
  // is alice's call, denied for this second.
  for (const char* spelling :
       {" Bearer alice-token", "Bearer alice-token ", "Bearer  alice-token"}) {
    CAPTURE(spelling);
    CHECK(server.call({{"authorization", spelling}}).code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  // A handler that splits on whitespace may read alice's token here too: ambiguous, so limited
  // by the address (not spent by the calls above) and refused.
  CHECK(server.call({{"authorization", "Bearer alice-token bob-token"}}).code ==
        grpc::StatusCode::UNAUTHENTICATED);
  // A handler that strips "Bearer " only where it is present reads alice's token from a bare
  // one: refused as well, never an anonymous call by address.
  clock.advance(1s);
  CHECK(server.call({{"authorization", "alice-token"}}).code == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(server.service().handled() == 1);
}

TEST_CASE("a binary credential entry is read byte for byte") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = per_credential();  // 1 per second per key or address
  const std::string key(" \x01key\t", 6);          // bytes, whitespace at its edges included
  config.consumers[0].credentials = {key};
  const Engine engine = make_engine(config, clock);
  EchoServer server(engine, limiter({.credential_metadata = "x-key-bin", .credential_prefix = ""}));
  REQUIRE(server.started());
  CHECK(server.call({{"x-key-bin", key}}).code == grpc::StatusCode::OK);
  CHECK(server.call({{"x-key-bin", key}}).code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Without its edge bytes it is another key, which no one owns.
  CHECK(server.call({{"x-key-bin", std::string("\x01key", 4)}}).code ==
        grpc::StatusCode::UNAUTHENTICATED);
}

TEST_CASE("x-forwarded-for metadata picks the client only behind a trusted proxy") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = per_credential();  // anonymous calls: 1 per address
  const Metadata first{{"x-forwarded-for", "203.0.113.7"}};
  const Metadata second{{"x-forwarded-for", "203.0.113.8"}};

  SECTION("untrusted peer: the header is the client's own text and is ignored") {
    config.gateway.trusted_proxies = {"10.0.0.0/8"};  // not 127.0.0.1, where the calls come from
    const Engine engine = make_engine(config, clock);
    EchoServer server(engine, limiter());
    REQUIRE(server.started());
    CHECK(server.call(first).code == grpc::StatusCode::OK);
    CHECK(server.call(second).code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  SECTION("trusted peer: each forwarded client has its own bucket") {
    config.gateway.trusted_proxies = {"127.0.0.0/8"};
    const Engine engine = make_engine(config, clock);
    auto resolver = sluice::ClientAddressResolver::create({"127.0.0.0/8"});  // the same, in code
    REQUIRE(resolver.ok());
    auto created = sluice::GrpcRateLimiter::create({.client_addresses = *resolver}, engine);
    REQUIRE(created.ok());
    EchoServer server(engine, *std::move(created));
    REQUIRE(server.started());
    CHECK(server.call(first).code == grpc::StatusCode::OK);
    CHECK(server.call(second).code == grpc::StatusCode::OK);
    CHECK(server.call(first).code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
}

TEST_CASE(
    "creating a gRPC limiter with trusted proxies that contradict the config's "
    "gateway.trusted_proxies fails, naming both lists") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = per_credential();
  config.gateway.trusted_proxies = {"127.0.0.0/8"};
  const Engine engine = make_engine(config, clock);
  auto load_balancers = sluice::ClientAddressResolver::create({"10.0.0.0/8"});
  REQUIRE(load_balancers.ok());

  const auto contradicting =
      sluice::GrpcRateLimiter::create({.client_addresses = *load_balancers}, engine);
  CHECK(contradicting.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(contradicting.status().message() ==
        "GrpcLimiterOptions::client_addresses' trusted proxies [10.0.0.0/8] contradict the "
        "config's gateway.trusted_proxies [127.0.0.0/8]: the adapter takes its trusted proxies "
        "from the config and follows its reloads; set them in gateway.trusted_proxies and give "
        "the adapter none");
  // Without an engine nothing can be compared: trusted networks in code are refused.
  CHECK(sluice::GrpcRateLimiter::create({.client_addresses = *load_balancers}).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(sluice::GrpcRateLimiter::create({}, engine).ok());
}

TEST_CASE("creating a gRPC limiter for a listener the config lacks fails, naming the fix") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = per_ip_on_echo();
  config.listeners = {{.name = "grpc"}};
  const Engine engine = make_engine(config, clock);

  const auto typo = sluice::GrpcRateLimiter::create({.listener = "gprc"}, engine);
  CHECK(typo.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(typo.status().message() ==
        "the adapter's listener \"gprc\" is none of the config's listeners, so no listener's "
        "bundles and no route on a listener would apply to its requests; name one of the config's "
        "listeners (listeners[].name), or none");
  CHECK(sluice::GrpcRateLimiter::create({.listener = "grpc"}, engine).ok());
}

TEST_CASE("creating a gRPC limiter whose unknown consumer the config lacks fails, naming the fix") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = per_credential();
  config.consumers.push_back({.name = "unknown"});
  const Engine engine = make_engine(config, clock);

  const auto typo = sluice::GrpcRateLimiter::create({.unknown_consumer = "unknwon"}, engine);
  CHECK(typo.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(typo.status().message() ==
        "the adapter's unknown consumer \"unknwon\" is none of the config's consumers, so every "
        "unknown credential would be refused instead of limited as that consumer's; name one of "
        "the config's consumers (consumers[].name), or none to refuse unknown credentials");
  CHECK(sluice::GrpcRateLimiter::create({.unknown_consumer = "unknown"}, engine).ok());
}

TEST_CASE(
    "behind a proxy trusted only by the config's gateway.trusted_proxies, each forwarded caller "
    "has its own bucket") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = per_credential();  // anonymous calls: 1 per address
  config.gateway.trusted_proxies = {"127.0.0.1/32"};
  const Engine engine = make_engine(config, clock);
  EchoServer server(engine, limiter());  // no trusted proxy in code
  REQUIRE(server.started());
  CHECK(server.call({{"x-forwarded-for", "203.0.113.7"}}).code == grpc::StatusCode::OK);
  CHECK(server.call({{"x-forwarded-for", "203.0.113.7"}}).code ==
        grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Another caller behind the same proxy: its first call is admitted.
  CHECK(server.call({{"forwarded", "for=203.0.113.8"}}).code == grpc::StatusCode::OK);
}

TEST_CASE("a route's path prefix selects methods by their full name") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = per_ip_on_echo();
  config.routes[0].path_prefix = kSay;  // Say only; Shout is unrouted and no rule applies to it
  const Engine engine = make_engine(config, clock);
  EchoServer server(engine, limiter());
  REQUIRE(server.started());
  REQUIRE(server.call().code == grpc::StatusCode::OK);
  REQUIRE(server.call().code == grpc::StatusCode::OK);
  CHECK(server.call().code == grpc::StatusCode::RESOURCE_EXHAUSTED);

  const Reply shout = server.call({}, kShout);
  CHECK(shout.code == grpc::StatusCode::OK);
  CHECK_FALSE(shout.has("x-ratelimit-limit"));
  CHECK(server.service().handled() == 3);
}

TEST_CASE("a gRPC call over IPv6 loopback is keyed by the peer's IPv6 address") {
  sluice::ManualClock clock;
  const Engine engine = make_engine(per_ip_on_echo(), clock);
  EchoServer server(engine, limiter(), "[::1]");
  if (!server.started()) {
    WARN("no IPv6 loopback on this machine: nothing to check");
    return;
  }
  CHECK(server.call().code == grpc::StatusCode::OK);
  INFO(server.service().last_peer());  // "ipv6:%5B::1%5D:<port>" from gRPC 1.51
  CHECK(sluice::grpc_peer_address(server.service().last_peer()).to_string() == "::1");
}

TEST_CASE("an exempt method gets no rule and no fields") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = per_credential();  // a global rule: every call
  config.gateway.exempt_paths = {kShout};
  const Engine engine = make_engine(config, clock);
  EchoServer server(engine, limiter());
  REQUIRE(server.started());
  REQUIRE(server.call().code == grpc::StatusCode::OK);
  REQUIRE(server.call().code == grpc::StatusCode::RESOURCE_EXHAUSTED);

  const Reply shout = server.call({}, kShout);
  CHECK(shout.code == grpc::StatusCode::OK);
  CHECK(shout.trailers.empty());
}

TEST_CASE("a failing backend ends the call with UNAVAILABLE when the engine fails closed") {
  using FailingEngine = sluice::BasicRateLimitEngine<FailingBackend>;
  sluice::PolicyConfig config = per_ip_on_echo();

  SECTION("fail closed: UNAVAILABLE, without the backend's error text; the handler does not run") {
    config.engine.on_backend_error = sluice::FailureMode::kFailClosed;
    auto engine = FailingEngine::create(config);
    REQUIRE(engine.ok());
    EchoServer server(*engine, limiter());
    REQUIRE(server.started());
    const Reply reply = server.call();
    CHECK(reply.code == grpc::StatusCode::UNAVAILABLE);
    CHECK(reply.message == "rate limiter unavailable");
    CHECK(reply.trailers.empty());
    CHECK(server.service().handled() == 0);
  }
  SECTION("fail open: the call is admitted") {
    auto engine = FailingEngine::create(config);
    REQUIRE(engine.ok());
    EchoServer server(*engine, limiter());
    REQUIRE(server.started());
    CHECK(server.call().code == grpc::StatusCode::OK);
    CHECK(server.service().handled() == 1);
  }
}

TEST_CASE("a callback service finishes a denied call with RESOURCE_EXHAUSTED and the fields") {
  sluice::ManualClock clock;
  const Engine engine = make_engine(per_ip_on_echo(), clock);
  EchoServer<Engine, CallbackEchoService> server(engine, limiter());
  REQUIRE(server.started());
  REQUIRE(server.call().code == grpc::StatusCode::OK);
  REQUIRE(server.call().code == grpc::StatusCode::OK);

  const Reply denied = server.call();
  CHECK(denied.code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(denied.at("retry-after") == "1");
  CHECK(denied.at("x-ratelimit-remaining") == "0");
  CHECK(denied.at("ratelimit") == "\"echo-limits/per-ip/s\";r=0;t=1");
  CHECK(server.service().handled() == 2);
}

TEST_CASE("an unknown credential is keyed by the client address, then ended UNAUTHENTICATED") {
  sluice::ManualClock clock;
  const Engine engine = make_engine(per_credential(), clock);  // anonymous calls: 1 per address
  EchoServer server(engine, limiter());
  REQUIRE(server.started());
  const Reply refused = server.call({{"authorization", "Bearer forged-1"}});
  CHECK(refused.code == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(refused.message == "unknown credential");
  // It spent the address's call: a second forged token, and the anonymous caller, are limited.
  CHECK(server.call({{"authorization", "Bearer forged-2"}}).code ==
        grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(server.call().code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(server.service().handled() == 0);
}

TEST_CASE("keys from the service's store get their own bucket, unknown ones their class's") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = per_credential();  // global: 1 per second per key (or address)
  config.policies.push_back({.name = "unknown-limits",
                             .rate_limits = {{.name = "unknown",
                                              .selector = {Selector::kCredential},
                                              .requests_per = {.s = 1},
                                              .burst = 1}}});
  config.consumers.push_back({.name = "unknown", .policies = {"unknown-limits"}});
  const Engine engine = make_engine(config, clock);
  sluice::GrpcLimiterOptions options{.credential_metadata = "x-api-key", .credential_prefix = ""};
  options.consumer_of = [](std::string_view key) -> absl::StatusOr<std::optional<std::string>> {
    if (key.starts_with("key-")) return std::optional<std::string>("alice");
    return std::optional<std::string>();
  };
  options.unknown_consumer = "unknown";
  EchoServer server(engine, limiter(std::move(options)));
  REQUIRE(server.started());
  CHECK(server.call({{"x-api-key", "key-1"}}).code == grpc::StatusCode::OK);
  CHECK(server.call({{"x-api-key", "key-2"}}).code == grpc::StatusCode::OK);  // its own bucket
  const Reply unknown = server.call({{"x-api-key", "random-1"}});
  CHECK(unknown.code == grpc::StatusCode::OK);
  CHECK(unknown.at("ratelimit-policy") == "\"unknown-limits/unknown/s\";q=1;w=1");
  // Another made-up key: the class's one bucket for this address, not a fresh one.
  CHECK(server.call({{"x-api-key", "random-2"}}).code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(server.service().handled() == 3);
}

TEST_CASE("a known key sent twice cannot pass its own limit as the unknown consumer's call",
          "[attack]") {
  sluice::ManualClock clock;
  sluice::PolicyConfig config = per_credential();   // global: 1 per second per key (or address)
  config.consumers.push_back({.name = "unknown"});  // unknown keys: the global rule by address
  const Engine engine = make_engine(config, clock);
  sluice::GrpcLimiterOptions options{.credential_metadata = "x-api-key", .credential_prefix = ""};
  options.consumer_of = [](std::string_view key) -> absl::StatusOr<std::optional<std::string>> {
    if (key.starts_with("key-")) return std::optional<std::string>("alice");
    return std::optional<std::string>();
  };
  options.unknown_consumer = "unknown";
  EchoServer server(engine, limiter(std::move(options)));
  REQUIRE(server.started());
  CHECK(server.call({{"x-api-key", "key-1"}}).code == grpc::StatusCode::OK);
  CHECK(server.call({{"x-api-key", "key-1"}}).code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  // A handler reading client_metadata().find("x-api-key") gets key-1 again: the unknown
  // consumer's bucket by address must not serve it past the key's limit.
  const Reply twice = server.call({{"x-api-key", "key-1"}, {"x-api-key", "key-1"}});
  CHECK(twice.code == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(twice.message == "unknown credential");
  CHECK(server.service().handled() == 1);
}

namespace {

// A holder as sluice::yaml::ReloadingEngine is one: the generation it serves now, or none.
struct FixedHolder {
  std::shared_ptr<const Engine> engine;
  std::shared_ptr<const Engine> current() const { return engine; }
};

}  // namespace

TEST_CASE("a service checking with a holder evaluates with the generation it serves now") {
  sluice::ManualClock clock;
  FixedHolder holder{std::make_shared<const Engine>(make_engine(per_ip_on_echo(), clock))};
  EchoServer<FixedHolder> server(holder, limiter());
  REQUIRE(server.started());
  CHECK(server.call().code == grpc::StatusCode::OK);
  CHECK(server.call().code == grpc::StatusCode::OK);
  const Reply denied = server.call();
  CHECK(denied.code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(denied.at("retry-after") == "1");

  holder.engine = std::make_shared<const Engine>(make_engine(per_ip_on_echo(), clock));
  CHECK(server.call().code == grpc::StatusCode::OK);  // a fresh generation: a fresh bucket
  holder.engine = nullptr;
  CHECK(server.call().code == grpc::StatusCode::UNAVAILABLE);
}

#ifdef SLUICE_TEST_YAML
namespace {

using Holder = sluice::yaml::ReloadingEngine<Engine>;

// A fresh directory under the system's temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "sluice_grpc_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

std::unique_ptr<Holder> make_holder(const std::string& path, sluice::ManualClock clock) {
  auto holder = Holder::create(path, {.backend = {.store = {.seed = 1}, .clock = clock}});
  REQUIRE(holder.ok());
  return *std::move(holder);
}

}  // namespace

TEST_CASE(
    "a reload that renames the listener of a gRPC limiter created over the holder is refused, "
    "and its calls stay limited") {
  sluice::ManualClock clock;
  const TempDir dir;
  const std::string path = dir.file("service.yaml");
  write_names_yaml(path, "grpc", "unknown");
  const std::unique_ptr<Holder> holder = make_holder(path, clock);
  auto created = sluice::GrpcRateLimiter::create({.listener = "grpc"}, *holder);
  REQUIRE(created.ok());
  EchoServer<Holder> server(*holder, *std::move(created));
  REQUIRE(server.started());
  CHECK(server.call().code == grpc::StatusCode::OK);

  write_names_yaml(path, "public", "unknown");  // the limiter's calls would match no listener
  const absl::Status refused = holder->reload();
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(refused.message(), "the config has no listener \"grpc\""));
  CHECK(server.call().code == grpc::StatusCode::OK);
  CHECK(server.call().code == grpc::StatusCode::RESOURCE_EXHAUSTED);

  write_names_yaml(path, "grpc", "unknown");  // keeps the names, adds a consumer
  std::ofstream(path, std::ios::app) << "  - { name: partner }\n";
  REQUIRE(holder->reload().ok());
  CHECK(server.call().code == grpc::StatusCode::RESOURCE_EXHAUSTED);  // still spent
  CHECK(server.service().handled() == 2);
}

TEST_CASE(
    "a reload that drops the unknown consumer of a gRPC limiter created over the holder is "
    "refused, and unknown keys stay limited, not refused") {
  sluice::ManualClock clock;
  const TempDir dir;
  const std::string path = dir.file("service.yaml");
  write_names_yaml(path, "grpc", "unknown");
  const std::unique_ptr<Holder> holder = make_holder(path, clock);
  auto created = sluice::GrpcRateLimiter::create(
      {.credential_metadata = "x-api-key", .credential_prefix = "", .unknown_consumer = "unknown"},
      *holder);
  REQUIRE(created.ok());
  EchoServer<Holder> server(*holder, *std::move(created));
  REQUIRE(server.started());

  write_names_yaml(path, "grpc", "anonymous");
  const absl::Status refused = holder->reload();
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(refused.message(), "the config has no consumer \"unknown\""));
  CHECK(holder->current()->engine_stats().failed_reloads == 1);
  CHECK(server.call({{"x-api-key", "random-1"}}).code == grpc::StatusCode::OK);
  CHECK(server.call({{"x-api-key", "random-2"}}).code == grpc::StatusCode::OK);
  CHECK(server.call({{"x-api-key", "random-3"}}).code == grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_CASE("creating a gRPC limiter over a holder refuses a name its current config lacks") {
  sluice::ManualClock clock;
  const TempDir dir;
  const std::string path = dir.file("service.yaml");
  write_names_yaml(path, "grpc", "unknown");
  const std::unique_ptr<Holder> holder = make_holder(path, clock);
  CHECK(sluice::GrpcRateLimiter::create({.listener = "gprc"}, *holder).status().code() ==
        absl::StatusCode::kInvalidArgument);

  write_names_yaml(path, "public", "anonymous");  // nothing was registered
  CHECK(holder->reload().ok());
}
#endif
