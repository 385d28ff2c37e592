// sluice/redis/engine_backend.hpp — the policy engine with every rule's state in Redis.
//
// `RedisEngineBackend` models sluice::EngineBackend (sluice/engine.hpp): one `Limit` per
// compiled rule, state in Redis, so every replica running the same config shares each rule's
// budget. `RedisRateLimitEngine` is the engine over it.
//
//   auto client = sluice::redis::Client::create({.connection = {.unix_socket = "/run/redis.sock"},
//                                                 .key_prefix = "rl:gw:", .key_seed = kSeed});
//   if (!client.ok()) return client.status();
//   auto engine = sluice::redis::RedisRateLimitEngine::create(config, {.client = *client});
//   sluice::Evaluation e = engine->evaluate(request);  // one round trip for the live rules
//
// A request's live rules cost one round trip: kAllOrNothing is one `Client::check_all` (one
// script call, atomic on a single node: a denied request consumes nothing in any rule);
// kEveryRule is one pipelined write of one script call per rule, each deciding alone. Dry-run
// rules, when a request has any, are a second round trip. Errors come back as the client's
// absl::Status (Unavailable, DeadlineExceeded, Internal); the engine then fails open or closed.
// An error in kEveryRule may come after some rules consumed (their replies were lost).
//
// Keys: the engine's key for a rule starts with a hash of the rule's fingerprint, and the Redis
// key is the client's digest of it under the rule's windows (`Client::redis_key`). So an
// unchanged rule maps to the same Redis key across a reload (its state simply stays in Redis;
// nothing is transferred) and a changed rule to a fresh one; old keys expire by themselves.
//
// Stats: `rule_store_stats` is all zeros: Redis holds the keys (count them there); the engine's
// per-rule allowed/denied counters work as with the in-memory backend.
// Thread-safety: `check_rules` may be called concurrently (the client is thread-safe), provided
// Options::time_for_testing, if set, is too.
#ifndef SLUICE_REDIS_ENGINE_BACKEND_HPP_
#define SLUICE_REDIS_ENGINE_BACKEND_HPP_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/decision.hpp"
#include "sluice/engine.hpp"
#include "sluice/policy.hpp"
#include "sluice/redis/client.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/store.hpp"

namespace sluice::redis {

class RedisEngineBackend {
 public:
  struct Options {
    std::shared_ptr<Client> client{};  // required; shared by every generation of the engine
    // Testing hook: when set, every script call decides at the returned time (ns since the Unix
    // epoch) instead of the server's TIME. Production code leaves it empty.
    std::function<std::chrono::nanoseconds()> time_for_testing{};
  };

  // InvalidArgument naming the rule's label when its windows are outside the script's exact
  // range (kMaxRequests, kMaxRefill), or when `options.client` is null. Connects lazily.
  static absl::StatusOr<RedisEngineBackend> create(std::span<const CompiledRule> rules,
                                                   const RedisEngineBackend* /*previous*/,
                                                   const Options& options) {
    if (options.client == nullptr) {
      return absl::InvalidArgumentError("sluice::redis: RedisEngineBackend needs a client");
    }
    RedisEngineBackend backend(options);
    backend.limits_.reserve(rules.size());
    for (const CompiledRule& rule : rules) {
      absl::StatusOr<Limit> limit = Limit::create(limiter_windows(rule));
      if (!limit.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(rule.label, ": ", limit.status().message()));
      }
      backend.limits_.push_back(*std::move(limit));
      backend.labels_.push_back(rule.label);
    }
    return backend;
  }

  // Decides every key (one rule each, its own cost) into `out` (same size), in one round trip.
  absl::Status check_rules(std::span<const RuleKey> keys, ConsumptionMode mode,
                           std::span<Decision> out) {
    if (keys.empty()) {
      return absl::OkStatus();
    }
    absl::InlinedVector<CheckItem, 8> items;
    for (const RuleKey& k : keys) {
      const Limit& limit = limits_[k.rule];
      if (k.cost > limit.max_cost()) {  // before anything is sent: no rule consumes
        return absl::InvalidArgumentError(
            absl::StrCat(labels_[k.rule], ": cost exceeds the smallest burst and can never pass"));
      }
      items.push_back({.key = k.key, .limit = &limit, .cost = k.cost});
    }
    const std::optional<std::chrono::nanoseconds> time =
        options_.time_for_testing ? std::optional(options_.time_for_testing()) : std::nullopt;
    if (mode == ConsumptionMode::kEveryRule) {
      return check_each(items, time, out);
    }
    absl::StatusOr<std::vector<Decision>> decisions =
        time ? options_.client->check_all_at_for_testing(items, *time)
             : options_.client->check_all(items);
    if (!decisions.ok()) {
      return decisions.status();
    }
    std::copy(decisions->begin(), decisions->end(), out.begin());
    return absl::OkStatus();
  }

  // Zeros: the keys live in Redis (see the class comment).
  StoreStats rule_store_stats(std::size_t /*rule*/) const { return {}; }

  // Forgets rule `rule`'s state for `key` (BasicRateLimitEngine::reset): one round trip.
  absl::Status reset_key(std::size_t rule, std::string_view key) {
    const std::optional<std::chrono::nanoseconds> time =
        options_.time_for_testing ? std::optional(options_.time_for_testing()) : std::nullopt;
    return options_.client->reset(key, limits_[rule], time);
  }

  // Rule `rule`'s limit (its limiter_windows, shortest first).
  const Limit& limit(std::size_t rule) const { return limits_[rule]; }
  // The Redis key holding rule `rule`'s state for the engine key `key` (for operators and tests).
  std::string redis_key(std::size_t rule, std::string_view key) const {
    return options_.client->redis_key(key, limits_[rule]);
  }
  const std::shared_ptr<Client>& client() const noexcept { return options_.client; }

 private:
  explicit RedisEngineBackend(Options options) : options_(std::move(options)) {}

  // kEveryRule: one pipelined script call per item; the first error is the result.
  absl::Status check_each(std::span<const CheckItem> items,
                          std::optional<std::chrono::nanoseconds> time, std::span<Decision> out) {
    std::vector<absl::StatusOr<Decision>> decisions =
        time ? options_.client->check_pipelined_at_for_testing(items, *time)
             : options_.client->check_pipelined(items);
    for (std::size_t i = 0; i < decisions.size(); ++i) {
      if (!decisions[i].ok()) {
        return decisions[i].status();
      }
      out[i] = *decisions[i];
    }
    return absl::OkStatus();
  }

  Options options_;
  std::vector<Limit> limits_;        // per compiled rule
  std::vector<std::string> labels_;  // per compiled rule, for errors
};

static_assert(sluice::EngineBackend<RedisEngineBackend>);

// The policy engine with every rule's state in Redis (fleet-wide limits).
using RedisRateLimitEngine = sluice::BasicRateLimitEngine<RedisEngineBackend>;

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_ENGINE_BACKEND_HPP_
