// sluice_login — a login endpoint on cpp-httplib throttled by two limiters: a per-address rate
// limit (the engine, through sluice::HttplibLimiter, N per minute per client address) and
// sluice::AttemptLimiter per user (one attempt in flight, each wrong password doubles the wait
// before the next, success resets). A response carries the fields of the limiter that decided
// it: an attempt denial replaces the per-address rule's X-RateLimit-* fields with its own
// Retry-After (sluice::replace_rate_limit_fields), so a client never reads one limiter's wait
// beside the other's remaining count.
//
//   sluice_login [--port N] [--initial-delay-ms 1000] [--delay-cap-ms 900000]
//                [--quiet-period-ms 86400000] [--lease-ms 30000] [--per-ip-per-minute 30]
//                [--redis-socket PATH]
//
// With --redis-socket (built where sluice::redis is available) the records live in that Redis
// (sluice::redis::RedisAttemptLimiter), shared by every replica; a Redis error answers 503 (logins
// fail closed). Otherwise they live in this process (sluice::AttemptLimiter).
// It binds 127.0.0.1 only; `--port 0` (the default) picks a free port. The first line on stdout is
// "sluice_login: listening on http://127.0.0.1:<port>". One endpoint:
//
//   POST /login   form fields `user` and `password`
//     200 {"ok":true}                                  right password: the user's failures reset
//     401 {"error":"wrong user name or password"}      one more failure
//     429 {"error":"too many attempts","reason":"backoff","retry_after_ms":N,"failures":F}
//         with Retry-After (seconds, rounded up) and no X-RateLimit-* field: the wait has not
//         elapsed (or, with reason "attempt_active", another attempt of the user is still being
//         verified)
//     429 {"error":"rate limited","retry_after_seconds":N} with Retry-After and X-RateLimit-*:
//         the client address sent more than --per-ip-per-minute requests
//     400 when a field is missing
// Every response the per-address rule admitted carries its X-RateLimit-* and RateLimit fields.
//
// The subject is the user name normalized (surrounding spaces trimmed, ASCII lower-cased), so
// "Alice " and "alice" share one record; the password never reaches the limiter. Users: "alice"
// with password "correct horse" (a demo table: a real service verifies a salted password hash).
// SIGINT or SIGTERM stops the server.
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "sluice/attempt.hpp"
#include "sluice/engine.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/httplib.hpp"
#include "sluice/policy.hpp"
#ifdef SLUICE_LOGIN_REDIS
#include "sluice/redis/attempt_limiter.hpp"
#endif

namespace {

using std::chrono::milliseconds;

struct Options {
  int port = 0;
  std::string redis_socket;  // empty: in memory
  std::uint64_t per_ip_per_minute = 30;
  sluice::AttemptPolicy policy{.initial_delay = std::chrono::seconds(1),
                               .delay_cap = std::chrono::minutes(15),
                               .quiet_period = std::chrono::hours(24),
                               .lease = std::chrono::seconds(30)};
};

constexpr std::string_view kUsage =
    "usage: sluice_login [--port N] [--initial-delay-ms MS] [--delay-cap-ms MS] "
    "[--quiet-period-ms MS] [--lease-ms MS] [--per-ip-per-minute N] [--redis-socket PATH]\n";

std::optional<std::int64_t> parse_integer(std::string_view text) {
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

std::optional<Options> parse_args(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--redis-socket") {
      options.redis_socket = argv[i + 1];
      continue;
    }
    const std::optional<std::int64_t> value = parse_integer(argv[i + 1]);
    if (!value) return std::nullopt;
    if (flag == "--port" && *value <= 65535) {
      options.port = static_cast<int>(*value);
    } else if (flag == "--initial-delay-ms") {
      options.policy.initial_delay = milliseconds(*value);
    } else if (flag == "--delay-cap-ms") {
      options.policy.delay_cap = milliseconds(*value);
    } else if (flag == "--quiet-period-ms") {
      options.policy.quiet_period = milliseconds(*value);
    } else if (flag == "--lease-ms") {
      options.policy.lease = milliseconds(*value);
    } else if (flag == "--per-ip-per-minute" && *value > 0) {
      options.per_ip_per_minute = static_cast<std::uint64_t>(*value);
    } else {
      return std::nullopt;
    }
  }
  if (argc % 2 == 0) return std::nullopt;  // a flag without its value
  return options;
}

// The subject for a user name: trimmed and ASCII lower-cased. Applications with non-ASCII names
// should apply Unicode normalization (NFKC) and case folding instead.
std::string subject_for(const std::string& user) {
  return absl::StrCat("user:", absl::AsciiStrToLower(absl::StripAsciiWhitespace(user)));
}

bool password_matches(const std::string& subject, const std::string& password) {
  return subject == "user:alice" && password == "correct horse";
}

// `Limiter`: sluice::AttemptLimiter<> or sluice::redis::RedisAttemptLimiter (same interface).
template <class Limiter>
void handle_login(Limiter& limiter, const httplib::Request& request, httplib::Response& response) {
  if (!request.has_param("user") || !request.has_param("password")) {
    response.status = 400;
    response.set_content(R"({"error":"user and password are required"})", "application/json");
    return;
  }
  const std::string subject = subject_for(request.get_param_value("user"));
  absl::StatusOr<sluice::AttemptDecision> d = limiter.begin(subject);
  if (!d.ok()) {  // only over Redis: fail closed
    std::fprintf(stderr, "sluice_login: %s\n", std::string(d.status().message()).c_str());
    response.status = 503;
    response.set_content(R"({"error":"try again later"})", "application/json");
    return;
  }
  if (!d->admitted()) {
    // The attempt limiter decided: its fields replace the per-address rule's.
    sluice::replace_rate_limit_fields(
        sluice::attempt_fields(*d),
        [&](std::string_view name) { response.headers.erase(std::string(name)); },
        [&](std::string_view name, const std::string& value) {
          response.set_header(std::string(name), value);
        });
    response.status = 429;
    response.set_content(
        absl::StrCat(R"({"error":"too many attempts","reason":")",
                     std::string(sluice::to_string(d->reason)), R"(","retry_after_ms":)",
                     std::chrono::ceil<milliseconds>(d->retry_after).count(), R"(,"failures":)",
                     d->failures, "}"),
        "application/json");
    return;
  }
  if (password_matches(subject, request.get_param_value("password"))) {
    (void)limiter.succeed(d->receipt);  // FailedPrecondition only if the lease ran out
    response.set_content(R"({"ok":true})", "application/json");
  } else {
    (void)limiter.fail(d->receipt);
    response.status = 401;
    response.set_content(R"({"error":"wrong user name or password"})", "application/json");
  }
}

// The per-address rule on /login: `per_minute` requests per minute per client address.
sluice::PolicyConfig per_ip_config(std::uint64_t per_minute) {
  return {.policies = {{.name = "login-per-ip",
                        .rate_limits = {{.name = "login-per-ip",
                                         .selector = {sluice::Selector::kIp},
                                         .requests_per = {.minute = per_minute}}}}},
          .routes = {{.name = "login", .path_prefix = "/login", .policies = {"login-per-ip"}}}};
}

// Serves POST /login until SIGINT or SIGTERM. Returns the exit code.
template <class Limiter>
int serve(Limiter& limiter, const Options& options) {
  absl::StatusOr<sluice::RateLimitEngine> engine =
      sluice::RateLimitEngine::create(per_ip_config(options.per_ip_per_minute));
  if (!engine.ok()) {
    std::fprintf(stderr, "sluice_login: %s\n", std::string(engine.status().message()).c_str());
    return 2;
  }

  // SIGINT/SIGTERM are blocked in every thread and taken by one waiter, which stops the server.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  httplib::Server server;
  sluice::HttplibLimiter<>(std::make_shared<const sluice::RateLimitEngine>(*std::move(engine)))
      .install(server);
  server.Post("/login", [&](const httplib::Request& request, httplib::Response& response) {
    handle_login(limiter, request, response);
  });
  int port = options.port;
  if (port == 0) {
    port = server.bind_to_any_port("127.0.0.1");
  } else if (!server.bind_to_port("127.0.0.1", port)) {
    port = -1;
  }
  if (port < 0) {
    std::fprintf(stderr, "sluice_login: cannot bind 127.0.0.1:%d\n", options.port);
    return 1;
  }
  std::printf("sluice_login: listening on http://127.0.0.1:%d\n", port);
  std::fflush(stdout);

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

template <class Limiter>
int create_and_serve(absl::StatusOr<Limiter> limiter, const Options& options) {
  if (!limiter.ok()) {
    std::fprintf(stderr, "sluice_login: %s\n", std::string(limiter.status().message()).c_str());
    return 2;
  }
  return serve(*limiter, options);
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Options> options = parse_args(argc, argv);
  if (!options) {
    std::fputs(kUsage.data(), stderr);
    return 2;
  }
  if (!options->redis_socket.empty()) {
#ifdef SLUICE_LOGIN_REDIS
    sluice::redis::ClientOptions redis;
    redis.connection.unix_socket = options->redis_socket;
    redis.key_prefix = "login:";
    return create_and_serve(sluice::redis::RedisAttemptLimiter::create(options->policy, redis),
                            *options);
#else
    std::fputs("sluice_login: built without sluice::redis\n", stderr);
    return 2;
#endif
  }
  return create_and_serve(sluice::AttemptLimiter<>::create(options->policy), *options);
}
