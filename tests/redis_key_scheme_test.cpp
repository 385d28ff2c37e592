// The names sluice gives its Redis keys, pinned to exact bytes: a deployed fleet finds its state
// (rate limits, attempt records) under these names, so a change to the key scheme that moves
// them is a migration, never a refactor. No server is needed: clients and limiters are created
// against a socket that does not exist, and naming a key opens no connection.
#include <chrono>
#include <string>

#include "catch.hpp"
#include "sluice/redis/attempt_limiter.hpp"
#include "sluice/redis/client.hpp"
#include "sluice/redis/limit.hpp"

namespace {

using namespace std::chrono_literals;

constexpr std::uint64_t kSeed = 42;

sluice::redis::ClientOptions options(std::string prefix) {
  return {.connection = {.unix_socket = "/nonexistent/sluice-key-scheme.sock"},
          .key_prefix = std::move(prefix),
          .key_seed = kSeed};
}

std::shared_ptr<sluice::redis::Client> client() {
  auto c = sluice::redis::Client::create(options("rl:"));
  REQUIRE(c.ok());
  return *c;
}

sluice::redis::Limit limit(absl::StatusOr<sluice::redis::Limit> l) {
  REQUIRE(l.ok());
  return *std::move(l);
}

sluice::redis::RedisAttemptLimiter attempt_limiter() {
  auto a = sluice::redis::RedisAttemptLimiter::create(
      {.initial_delay = 1s, .delay_cap = 8s, .quiet_period = 1min, .lease = 5s}, options("login:"));
  REQUIRE(a.ok());
  return *std::move(a);
}

}  // namespace

TEST_CASE("a rate limit key is the prefix and its digest's 32 hex digits in a hash tag") {
  const auto c = client();
  CHECK(c->redis_key("alice",
                     limit(sluice::redis::Limit::create({{.requests = 10, .period = 1s}}))) ==
        "rl:{26fc869685215a0cf15452d9fd00945e}");
  CHECK(c->redis_key("", limit(sluice::redis::Limit::create({{.requests = 10, .period = 1s}}))) ==
        "rl:{e6c20aee7fb92a02bd90ca816b63a61a}");
}

TEST_CASE("a rate limit key moves with the limit's windows and algorithm") {
  const auto c = client();
  const auto stacked = limit(sluice::redis::Limit::create(
      {{.requests = 5, .period = 60s}, {.requests = 100, .period = 3600s, .burst = 20}}));
  const auto fixed = limit(sluice::redis::Limit::fixed_window({{.limit = 10, .window = 1s}}));
  CHECK(c->redis_key("alice", stacked) == "rl:{3654fd1e5efca539d749f13895a28678}");
  CHECK(c->redis_key("alice", fixed) == "rl:{936e72785ad89a37ab14bfca92a535dd}");
}

TEST_CASE("an attempt record, its legacy key and its index keep their names") {
  const auto a = attempt_limiter();
  CHECK(a.redis_key("alice") == "login:{attempts}:5ef9212e477b2f2dff01237e9c089c8c");
  CHECK(a.legacy_redis_key("alice") == "login:{5ef9212e477b2f2dff01237e9c089c8c}");
  CHECK(a.redis_key("") == "login:{attempts}:a7fce921aad7a4601988ef6a640a6b8c");
  CHECK(a.index_key() == "login:{attempts}:index");
}
