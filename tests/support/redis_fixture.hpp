// The per-test-case setup of the Redis tests: a private redis-server and clients for it.
//
// Constructing a RedisFixture starts the server (tests/support/redis_server.hpp) or fails the
// running test case with the reason; `options()` and `client()` point at its unix socket with
// the key prefix "test:" and seed 42 every Redis test uses.
//
//   TEST_CASE("...") {
//     sluice_test::RedisFixture s;
//     auto limiter = sluice::redis::RedisGcraLimiter::create(windows, s.options());
//     std::shared_ptr<sluice::redis::Client> client = s.client(std::chrono::milliseconds(300));
//     s.redis.kill();  // fault injection through the server itself
//   }
//
// Thread-safety: use from the test's thread.
#ifndef SLUICE_TESTS_SUPPORT_REDIS_FIXTURE_HPP_
#define SLUICE_TESTS_SUPPORT_REDIS_FIXTURE_HPP_

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "catch.hpp"
#include "redis_server.hpp"
#include "sluice/redis/client.hpp"
#include "sluice/redis/options.hpp"

namespace sluice_test {

struct RedisFixture {
  RedisServer redis;

  RedisFixture() {
    const std::string error = redis.start();
    INFO(error);
    REQUIRE(error.empty());
  }

  // Client options for this server; `timeout` bounds both connecting and every reply.
  sluice::redis::ClientOptions options(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(1000)) const {
    sluice::redis::ClientOptions o;
    o.connection.unix_socket = redis.unix_socket();
    o.connection.connect_timeout = timeout;
    o.connection.command_timeout = timeout;
    o.key_prefix = "test:";
    o.key_seed = 42;
    return o;
  }

  // A new client (its own connection pool) with options(timeout).
  std::shared_ptr<sluice::redis::Client> client(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(1000)) const {
    auto c = sluice::redis::Client::create(options(timeout));
    INFO(c.status());
    REQUIRE(c.ok());
    return *std::move(c);
  }
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_REDIS_FIXTURE_HPP_
