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
#include <string_view>
#include <utility>

#include "catch.hpp"
#include "redis_server.hpp"
#include "sluice/redis/client.hpp"
#include "sluice/redis/options.hpp"

namespace sluice_test {

// Makes `client`'s scripts keep every key an hour longer than its windows need. The testing-time
// hooks move the scripts' clock but not the server's, which expires keys by real time: a key with
// a few ms of debt left at the hooked time could vanish before a step that, at the hooked time,
// still sees that debt. In production the two clocks are one, and an expired key equals a full
// bucket. Only the expiry changes; every decision is the bundled scripts'.
inline void hold_keys(sluice::redis::Client& client) {
  const auto longer = [](std::string script) {
    const std::string_view ttl = "local ttl = q - q % 1 + 1\n";
    const std::size_t at = script.find(ttl);
    REQUIRE(at != std::string::npos);
    script.insert(at + ttl.size() - 1, " + 3600000");
    return script;
  };
  client.replace_script_for_testing(longer(client.script_for_testing()));
  client.replace_booking_script_for_testing(longer(client.booking_script_for_testing()));
}

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
