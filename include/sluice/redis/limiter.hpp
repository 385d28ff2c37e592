// sluice/redis/limiter.hpp — fleet-wide GCRA limits with their state in Redis.
//
// `RedisGcraLimiter` gives exactly the decisions of the in-memory GCRA limiter (sluice/gcra.hpp:
// stacked windows, atomic across windows, a denial consumes nothing, cost 0 peeks) while keeping
// each key's state in one Redis key, so every replica of a service shares one budget. A check is
// one round trip: one EVALSHA of the bundled script (sluice/redis/script.hpp), which reads the
// server's clock (Redis `TIME`), decides for every window of the key and reserves the cost
// atomically.
//
//   auto limiter = sluice::redis::RedisGcraLimiter::create(
//       {{.requests = 10, .period = std::chrono::seconds(1)},
//        {.requests = 600, .period = std::chrono::minutes(1)}},
//       {.connection = {.unix_socket = "/run/redis/redis.sock"},
//        .key_prefix = "rl:login:", .key_seed = kFleetSecretSeed});
//   if (!limiter.ok()) return limiter.status();          // invalid windows or options
//   absl::StatusOr<sluice::Decision> d = limiter->check(client_ip);
//   if (!d.ok()) { /* Unavailable / DeadlineExceeded: the caller fails open or closed */ }
//   else if (!d->allowed()) { respond_429(d->retry_after); }
//
// Units, key scheme and errors: as the client's (sluice/redis/client.hpp).
// Thread-safety: thread-safe; copies share the client.
#ifndef SLUICE_REDIS_LIMITER_HPP_
#define SLUICE_REDIS_LIMITER_HPP_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/decision.hpp"
#include "sluice/rate_limiter.hpp"
#include "sluice/redis/client.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/redis/options.hpp"
#include "sluice/window.hpp"

namespace sluice::redis {

// Models sluice::RateLimiter.
class RedisGcraLimiter {
 public:
  // InvalidArgument for invalid windows (see Limit::create) or options. Connects lazily:
  // creation succeeds while Redis is down; checks then report Unavailable.
  static absl::StatusOr<RedisGcraLimiter> create(std::vector<GcraWindow> windows,
                                                 ClientOptions options = {}) {
    absl::StatusOr<std::shared_ptr<Client>> client = Client::create(std::move(options));
    if (!client.ok()) {
      return client.status();
    }
    return create(std::move(windows), *std::move(client));
  }
  static absl::StatusOr<RedisGcraLimiter> create(std::vector<GcraWindow> windows,
                                                 std::shared_ptr<Client> client) {
    if (client == nullptr) {
      return absl::InvalidArgumentError("sluice::redis: null client");
    }
    absl::StatusOr<Limit> limit = Limit::create(std::move(windows));
    if (!limit.ok()) {
      return limit.status();
    }
    return RedisGcraLimiter(*std::move(limit), std::move(client));
  }

  // cost 0 peeks (reports availability, changes nothing); a cost above the smallest burst is
  // InvalidArgument. One round trip, bounded by the client's timeouts.
  absl::StatusOr<Decision> check(std::string_view key, std::uint64_t cost = 1) {
    const CheckItem item{.key = key, .limit = &limit_, .cost = cost};
    absl::StatusOr<std::vector<Decision>> d = client_->check_all(std::span(&item, 1));
    if (!d.ok()) {
      return d.status();
    }
    return (*d)[0];
  }

  // The key's state without consuming anything: exactly what check(key, 0) reports (see
  // GcraLimiter::inspect), decided at the server's TIME. One round trip; creates no state.
  absl::StatusOr<Decision> inspect(std::string_view key) { return check(key, 0); }

  // Forgets the key (one DEL, one round trip): its next check sees every window full.
  absl::Status reset(std::string_view key) { return client_->reset(key, limit_); }

  // Testing hook: as inspect(), at `unix_time` (ns since the Unix epoch) instead of TIME.
  absl::StatusOr<Decision> inspect_at_for_testing(std::string_view key,
                                                  std::chrono::nanoseconds unix_time) {
    return check_at_for_testing(key, 0, unix_time);
  }

  // Testing hook: as check(), with the server's clock replaced by `unix_time` (ns since the
  // Unix epoch). Production code never calls it.
  absl::StatusOr<Decision> check_at_for_testing(std::string_view key, std::uint64_t cost,
                                                std::chrono::nanoseconds unix_time) {
    const CheckItem item{.key = key, .limit = &limit_, .cost = cost};
    absl::StatusOr<std::vector<Decision>> d =
        client_->check_all_at_for_testing(std::span(&item, 1), unix_time);
    if (!d.ok()) {
      return d.status();
    }
    return (*d)[0];
  }

  // Sorted shortest period first; Decision::binding_window indexes this.
  const std::vector<GcraWindow>& windows() const noexcept { return limit_.windows(); }
  const Limit& limit() const noexcept { return limit_; }
  const std::shared_ptr<Client>& client() const noexcept { return client_; }
  std::string redis_key(std::string_view key) const { return client_->redis_key(key, limit_); }

 private:
  RedisGcraLimiter(Limit limit, std::shared_ptr<Client> client)
      : limit_(std::move(limit)), client_(std::move(client)) {}

  Limit limit_;
  std::shared_ptr<Client> client_;
};

static_assert(sluice::RateLimiter<RedisGcraLimiter>);

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_LIMITER_HPP_
